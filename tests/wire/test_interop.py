"""Wire compatibility with plain pyzmq + msgpack programs, both directions.

pyzmq is only the foreign peer here (its own zmq context): ipc and tcp.
"""
import struct
import time

import msgpack
import pytest
import zmq

import upcall
from helpers import DEADLINE, PROBE, Collector, make_pump, mode_kwargs, warm_up

# Objects that both msgpack-python and upcall round-trip to equal values.
OBJECTS = [
    None, True, False, 0, 1, -1, 127, 128, -33, 255, 256, 65535, 65536,
    2**31 - 1, 2**32, 2**63 - 1, -2**63, 2**64 - 1,
    0.0, -1.5, 3.141592653589793, 1e300, -2.5e-308, float("inf"),
    "", "ascii", "héllo wörld ✓", "日本語テキスト", "emoji 🚀🎉", "x" * 70_000,
    b"", b"\x00\x01\xff", bytes(range(256)) * 16,
    [], [1, [2, [3, [4, []]]]], [None, True, 1.5, "s", b"b"],
    {}, {"a": 1}, {"nested": {"map": {"deep": [1, {"k": "v"}]}}, "list": [1, 2.5, "три"]},
    {"px": 187.25, "qty": 100, "sym": "AAPL", "ids": [1, 2, 3], "venue": "XNAS"},
    {"bytes": b"\x00" * 3000, "big": 2**64 - 1, "neg": -2**63, "f": -0.25, "u": "ünï"},
    [{"i": i, "s": str(i)} for i in range(100)],
]
# Non-string map keys: upcall decodes any hashable key; msgpack-python's
# unpackb needs strict_map_key=False for them (only sent pyzmq -> upcall).
OBJECTS_IN = OBJECTS + [{1: "one", -2: "minus two", b"k": "bytes key", 2.5: "float key"}]


def _recv_probe_until_ready(zpub_send, col, pump=None):
    deadline = time.monotonic() + DEADLINE
    while col.probes == 0:
        assert time.monotonic() < deadline, "upcall SUB never got a probe from pyzmq PUB"
        zpub_send([b"probe", msgpack.packb(PROBE)])
        if pump is not None:
            pump()
        else:
            col.wait_probe(0.01)


@pytest.mark.parametrize("mode", ["native", "python", "caller"])
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
@pytest.mark.parametrize("kind", ["sub", "pull"])
def test_pyzmq_feeds_upcall(zctx, endpoints, kind, transport, mode):
    ep = endpoints(transport)
    zsock = zctx.socket(zmq.PUB if kind == "sub" else zmq.PUSH)
    zsock.setsockopt(zmq.SNDHWM, 0)
    zsock.setsockopt(zmq.LINGER, 0)
    zsock.bind(ep)
    col = Collector()
    try:
        with upcall.Bus() as bus:
            kw = mode_kwargs(mode)
            if kind == "sub":
                kw["rcvhwm"] = 0
            sub = bus.subscribe(ep, col, kind=kind, with_topic=True, **kw)
            pump = make_pump(sub) if mode == "caller" else None
            if kind == "sub":
                _recv_probe_until_ready(zsock.send_multipart, col, pump)
            expected = []
            for i, obj in enumerate(OBJECTS_IN):
                topic = b"topic.%d" % i
                zsock.send_multipart([topic, msgpack.packb(obj)])
                expected.append((topic, obj))
            col.wait(len(expected), pump=pump)
            assert len(col.items) == len(expected)
            for (t, got), (et, want) in zip(col.items, expected):
                assert t == et
                assert got == want and type(got) is type(want), (et, got, want)
            assert sub.stats["decode_errors"] == 0
            sub.close()
    finally:
        zsock.close(linger=0)


@pytest.mark.parametrize("with_topic", [True, False])
@pytest.mark.parametrize("mode", ["native", "caller"])
def test_pyzmq_single_frame_push_is_payload_with_empty_topic(zctx, endpoints, mode, with_topic):
    ep = endpoints("tcp")
    zsock = zctx.socket(zmq.PUSH)
    zsock.setsockopt(zmq.LINGER, 0)
    zsock.bind(ep)
    col = Collector()
    try:
        with upcall.Bus() as bus:
            sub = bus.subscribe(ep, col, kind="pull", with_topic=with_topic, **mode_kwargs(mode))
            objs = [{"single": i, "data": [i, "x"]} for i in range(20)] + ["solo", 7]
            for o in objs:
                zsock.send(msgpack.packb(o))
            col.wait(len(objs), pump=make_pump(sub) if mode == "caller" else None)
            if with_topic:
                assert col.items == [(b"", o) for o in objs]
            else:
                assert col.items == objs
            sub.close()
    finally:
        zsock.close(linger=0)


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
@pytest.mark.parametrize("kind", ["pub", "push"])
def test_upcall_feeds_pyzmq(zctx, endpoints, kind, transport):
    ep = endpoints(transport)
    with upcall.Bus() as bus:
        pub = bus.publisher(ep, kind=kind, sndhwm=0 if kind == "pub" else None, bind=True)
        zsock = _connected_reader(zctx, pub, kind, ep)
        try:
            expected = []
            for i, obj in enumerate(OBJECTS):
                topic = b"t.%d" % i
                pub.send(topic, obj)
                expected.append((topic, obj))
            pub.send_packed(b"packed", msgpack.packb({"via": "send_packed"}))
            expected.append((b"packed", {"via": "send_packed"}))
            got = []
            deadline = time.monotonic() + DEADLINE
            while len(got) < len(expected):
                assert time.monotonic() < deadline, "pyzmq got %d of %d" % (len(got), len(expected))
                if not zsock.poll(100):
                    continue
                frames = zsock.recv_multipart()
                assert len(frames) == 2, "expected [topic, payload], got %d frames" % len(frames)
                topic, payload = frames
                obj = msgpack.unpackb(payload, raw=False)
                if topic == b"probe":
                    assert obj == PROBE
                    continue
                got.append((topic, obj))
            for (t, g), (et, want) in zip(got, expected):
                assert t == et
                assert g == want and type(g) is type(want), (et, g, want)
            assert len(got) == len(expected)
        finally:
            zsock.close(linger=0)
            pub.close()


LARGE_VALUE = 20_000


def _large_values():
    """Values over upcall.DEFAULT_OOB_THRESHOLD: bytes and buffer exporters."""
    raw = bytes((i * 7 + 3) & 0xFF for i in range(LARGE_VALUE))
    values = {"bytes": raw, "bytearray": bytearray(raw) * 50}
    try:
        import numpy as np
        values["numpy"] = np.arange(250_000, dtype=np.float64)
    except ImportError:     # the other CPythons' test venvs
        import array
        values["array"] = array.array("d", range(250_000))
    return values


def _connected_reader(zctx, pub, kind, ep):
    zsock = zctx.socket(zmq.SUB if kind == "pub" else zmq.PULL)
    zsock.setsockopt(zmq.RCVHWM, 0)
    if kind == "pub":
        zsock.setsockopt(zmq.SUBSCRIBE, b"")
    zsock.connect(ep)
    if kind == "pub":
        # slow joiner: probe until the subscription has propagated
        deadline = time.monotonic() + DEADLINE
        while True:
            assert time.monotonic() < deadline, "pyzmq SUB never got a probe"
            pub.send(b"probe", PROBE)
            if zsock.poll(10):
                break
    return zsock


def _recv_all(zsock, n):
    got = []
    deadline = time.monotonic() + DEADLINE
    while len(got) < n:
        assert time.monotonic() < deadline, "pyzmq got %d of %d" % (len(got), n)
        if zsock.poll(100):
            frames = zsock.recv_multipart()
            if frames[0] != b"probe":
                got.append(frames)
    return got


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
@pytest.mark.parametrize("kind", ["pub", "push"])
def test_default_publisher_sends_large_values_as_plain_msgpack(zctx, endpoints, kind, transport):
    """Any msgpack reader decodes what a default publisher sends, large
    values too: [topic, msgpack.packb(obj)], two frames, no ext code."""
    ep = endpoints(transport)
    values = _large_values()
    with upcall.Bus() as bus:
        pub = bus.publisher(ep, kind=kind, sndhwm=0 if kind == "pub" else None, bind=True)
        zsock = _connected_reader(zctx, pub, kind, ep)
        try:
            for name, value in values.items():
                pub.send(name.encode(), {"v": value})
            pub.send_many(b"many", [{"v": values["bytes"]}])
            got = _recv_all(zsock, len(values) + 1)
        finally:
            zsock.close(linger=0)
            pub.close()
    for frames, (name, value) in zip(got, list(values.items()) + [("many", values["bytes"])]):
        assert len(frames) == 2, "%s: expected [topic, payload], got %d frames" % (name, len(frames))
        assert frames[0] == name.encode()
        assert msgpack.unpackb(frames[1]) == {"v": bytes(memoryview(value).cast("B"))}, name


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_out_of_band_frames_when_asked_for(zctx, endpoints, transport):
    """publisher(oob_threshold=N) opts in: the value travels as a frame of
    its own after the payload, referenced by an ext 126 (docs/wire.md)."""
    ep = endpoints(transport)
    value = _large_values()["bytes"]
    with upcall.Bus() as bus:
        pub = bus.publisher(ep, kind="push", oob_threshold=upcall.DEFAULT_OOB_THRESHOLD, bind=True)
        zsock = _connected_reader(zctx, pub, "push", ep)
        try:
            pub.send(b"oob", {"v": value})
            (frames,) = _recv_all(zsock, 1)
        finally:
            zsock.close(linger=0)
            pub.close()
    # [topic, payload, value, marker] (docs/wire.md, "The marker frame")
    assert len(frames) == 4 and frames[2] == value and frames[3] == upcall.WIRE_MARKER
    ref = msgpack.unpackb(frames[1])["v"]
    assert isinstance(ref, msgpack.ExtType) and ref.code == 126
    assert struct.unpack(">BBHIQ", ref.data) == (1, 0, 0, 2, len(value))


def test_upcall_empty_topic_is_its_own_frame(zctx, endpoints):
    ep = endpoints("tcp")
    with upcall.Bus() as bus:
        pub = bus.publisher(ep, kind="push", bind=True)
        zsock = zctx.socket(zmq.PULL)
        try:
            zsock.connect(ep)
            pub.send(b"", [1, 2, 3])
            assert zsock.poll(DEADLINE * 1000)
            assert zsock.recv_multipart() == [b"", msgpack.packb([1, 2, 3])]
        finally:
            zsock.close(linger=0)
            pub.close()


def test_upcall_packb_matches_msgpack(zctx):
    # the standalone codec is the one on the wire: same bytes as msgpack for
    # values with one smallest encoding
    for obj in [0, -1, 2**64 - 1, "héllo", b"\x00", [1, "a"], {"a": [1, 2]}, None, True]:
        assert upcall.packb(obj) == msgpack.packb(obj)
        assert upcall.unpackb(msgpack.packb(obj)) == obj
