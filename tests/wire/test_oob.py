"""Out-of-band values (docs/wire.md, ext 126): large bytes-like values travel
as frames of their own, zero-copy on both sides.

Real libzmq sockets; every wait is on a condition with a deadline."""
import array
import gc
import mmap
import os
import struct
import sys

import msgpack
import pytest
import zmq

try:
    import numpy as np
except ImportError:            # the other CPythons' test venvs: the stdlib exporters only
    np = None
needs_numpy = pytest.mark.skipif(np is None, reason="numpy is not installed")

import upcall
from upcall import _bus
from helpers import (DEADLINE, Collector, batch_handler, decode_error_then_good, make_pump,
                     mode_kwargs, pyzmq_push, wait_for)

pytestmark = pytest.mark.threads

THRESHOLD = 4096
SMALL, LARGE = 100, 200_000


def _values(n):
    """One value of each kind, n bytes each, with distinct contents."""
    raw = bytes((i * 31 + 7) & 0xFF for i in range(n))
    values = {
        "bytes": raw,
        "bytearray": bytearray(raw),
        "memoryview": memoryview(raw),
        "array": array.array("B", raw),          # a buffer-protocol exporter of the stdlib
    }
    if np is not None:
        values["numpy"] = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 4)
    return values


def _pair(bus, endpoints, transport, target, threshold=THRESHOLD, **kw):
    """A bound PULL subscription and a PUSH publisher connected to it."""
    sub = bus.subscribe(endpoints(transport), target, kind="pull", bind=True, **kw)
    pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, oob_threshold=threshold)
    return sub, pub


def _outstanding_zero():
    return _bus.oob_outstanding() == (0, 0)


def _wait_released():
    gc.collect()
    wait_for(_outstanding_zero, what="every out-of-band buffer released")


@pytest.mark.parametrize("transport", ["inproc", "ipc", "tcp"])
@pytest.mark.parametrize("size", [SMALL, LARGE])
def test_round_trip_every_kind(endpoints, transport, size):
    col = Collector()
    values = _values(size)
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, transport, col)
        sent = pub.send(b"t", {"kind": "all", **values}, copy=False)
        col.wait(1)
        got = col.items[0]
        for name, v in values.items():
            assert bytes(got[name]) == bytes(memoryview(v).cast("B")), name
            if size >= THRESHOLD:
                assert isinstance(got[name], memoryview), name
                assert got[name].readonly
            else:
                assert isinstance(got[name], bytes), name
        del got
        col.items.clear()      # on inproc the views are the sender's memory: drop them first
        assert sent.wait(DEADLINE) if size >= THRESHOLD else sent is None
    _wait_released()


def test_threshold_is_inclusive(endpoints):
    col = Collector()
    t = upcall.DEFAULT_OOB_THRESHOLD
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, oob_threshold=t)
        pub.send(b"t", [bytes(t - 1), bytes(t)])
        col.wait(1)
        below, at = col.items[0]
        assert isinstance(below, bytes) and len(below) == t - 1
        assert isinstance(at, memoryview) and len(at) == t
        del below, at
        col.items.clear()
    _wait_released()


def test_threshold_none_sends_inline(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "ipc", col, threshold=None)
        pub.send(b"t", {"b": bytes(LARGE), "a": array.array("d", [1.0] * 1000)})
        col.wait(1)
        assert col.items[0]["b"] == bytes(LARGE)
        assert col.items[0]["a"] == array.array("d", [1.0] * 1000).tobytes()


@pytest.mark.parametrize("mode", ["native", "python", "caller", "executor"])
def test_every_delivery_mode(endpoints, mode):
    col = Collector()
    arr = array.array("B", bytes(range(256)) * (LARGE // 256))
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "ipc", col, with_topic=True, **mode_kwargs(mode))
        pump = make_pump(sub) if mode == "caller" else None
        pub.send(b"t", {"a": arr})
        col.wait(1, pump=pump)
        topic, msg = col.items[0]
        assert topic == b"t" and isinstance(msg["a"], memoryview) and msg["a"] == arr.tobytes()
        assert sub.stats["decode_errors"] == 0


class Last(upcall.Handler):
    def __init__(self):
        self.got = []

    def on_message(self, msg):
        self.got.append(msg)


@pytest.mark.parametrize("kind", ["handler", "batch_handler", "native_filter", "per_upcall"])
def test_handlers_get_views(endpoints, kind):
    with upcall.Bus() as bus:
        if kind == "handler":
            target = Last()
        elif kind == "batch_handler":
            target = batch_handler()
        elif kind == "native_filter":
            inner = Last()
            target = upcall.native.FieldFilter("n", gt=0, target=inner)
        if kind == "per_upcall":
            inner = Last()
            sub = _bus._subscribe_per_upcall(bus, endpoints("ipc"), inner, kind="pull", bind=True)
            pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, oob_threshold=THRESHOLD)
        else:
            sub, pub = _pair(bus, endpoints, "ipc", target)
        pub.send(b"t", {"n": 0, "v": bytes(LARGE)})
        pub.send(b"t", {"n": 1, "v": bytes(range(256)) * 100})
        got = (inner if kind in ("native_filter", "per_upcall") else target).got
        want = 1 if kind == "native_filter" else 2
        wait_for(lambda: len(got) >= want)
        last = got[-1]
        assert isinstance(last["v"], memoryview) and bytes(last["v"]) == bytes(range(256)) * 100


def test_view_outlives_target_subscription_and_bus(endpoints):
    kept = []
    arr = array.array("q", range(LARGE // 8))
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "tcp", lambda m: kept.append(m["a"]))
        pub.send(b"t", {"a": arr})
        wait_for(lambda: kept)
        sub.close()
    assert bus.closed
    view = kept[0]
    assert view.cast("q").tolist() == arr.tolist()
    assert _bus.oob_outstanding()[1] == 1
    with pytest.raises(TypeError):
        view[0] = 1            # read-only
    del view
    kept.clear()
    _wait_released()


@needs_numpy
def test_inproc_view_is_the_publishers_memory(endpoints):
    """No byte copied end to end: the delivered view is the sender's buffer,
    and the sender's Sent is done only once the subscriber drops it."""
    kept = []
    arr = np.arange(LARGE, dtype=np.uint8)
    refs = sys.getrefcount(arr)
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "inproc", lambda m: kept.append(m["a"]))
        sent = pub.send(b"t", {"a": arr}, copy=False)
        wait_for(lambda: kept)
        got = np.frombuffer(kept[0], dtype=np.uint8)
        assert got.__array_interface__["data"][0] == arr.__array_interface__["data"][0]
        assert not sent.wait(0.05)
        assert not sent.done
        del got
        kept.clear()
        assert sent.wait(DEADLINE)
    # The view of the exporter was released exactly once: its references
    # are back to what they were (a missing release keeps one, a second
    # one would have crashed or gone below).
    assert sys.getrefcount(arr) == refs


def test_buffer_held_until_released_then_exactly_once(endpoints):
    """A bytearray cannot be resized while exported: the send holds it until
    libzmq is done, then lets it go."""
    kept = []
    ba = bytearray(b"q" * LARGE)
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "inproc", lambda m: kept.append(m))
        sent = pub.send(b"t", [ba], copy=False)
        wait_for(lambda: kept)
        with pytest.raises(BufferError):
            ba.extend(b"x")
        kept.clear()
        assert sent.wait(DEADLINE)
        ba.extend(b"x")          # released
        assert sys.getrefcount(ba) == 2


def test_copy_true_frees_the_buffer_at_once(endpoints):
    kept = []
    ba = bytearray(b"a" * LARGE)
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "inproc", lambda m: kept.append(m))
        assert pub.send(b"t", {"v": ba}, copy=True) is None   # nothing held: nothing to wait for
        ba[:] = b"b" * LARGE     # allowed at once: libzmq has its own copy
        ba.extend(b"c")
        wait_for(lambda: kept)
        assert bytes(kept[0]["v"]) == b"a" * LARGE


@pytest.mark.parametrize("transport", ["inproc", "ipc"])
def test_no_leak_over_many_rounds(endpoints, transport):
    """Every zero-copy send is released through the queue, every received
    frame freed: the counters return to zero and RSS stays flat."""
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    col = Collector()
    blob = bytearray(b"\x01" * (1 << 20))
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, transport, col)

        def rounds(n):
            for i in range(n):
                pub.send(b"t", {"i": i, "blob": blob}, copy=False)
                col.wait(1)
                col.items.clear()
        rounds(20)
        _wait_released()
        before = rss()
        rounds(200)
        _wait_released()
        grown = rss() - before
    # 200 MB went through; a leak of either side would keep it.  (Under
    # AddressSanitizer freed memory waits in its quarantine, 256 MB: RSS
    # says nothing there, and ASan's own leak check takes over.)
    if "libasan" not in os.environ.get("LD_PRELOAD", ""):
        assert grown < 40 << 20, grown


def test_release_drained_without_further_sends(endpoints):
    """A release that libzmq makes off the main thread is drained by the
    main thread's pending call, with nothing sent, waited on or closed: the
    bytearray becomes resizable again by itself."""
    kept = []
    ba = bytearray(LARGE)
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "tcp", lambda m: kept.append(m))
        pub.send(b"t", [ba], copy=False)
        wait_for(lambda: kept)

        def resizable():
            try:
                ba.extend(b"x")      # BufferError while the send holds it
            except BufferError:
                return False
            return True
        wait_for(resizable, what="the release drained by the pending call")


def test_more_values_than_frames_go_inline(endpoints):
    col = Collector()
    values = [bytes([i]) * THRESHOLD for i in range(20)]
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "ipc", col)
        pub.send(b"t", values)
        col.wait(1)
        got = col.items[0]
        assert [bytes(v) for v in got] == values
        assert sum(isinstance(v, memoryview) for v in got) == upcall.MAX_OOB_FRAMES


def test_publisher_refuses_wire_ext_codes_and_strided_buffers(endpoints):
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "inproc", print)
        for code in (126, 127):
            with pytest.raises(ValueError, match="wire format"):
                pub.send(b"t", [upcall.ExtType(code, b"x" * 16)])
            with pytest.raises(ValueError, match="wire format"):
                pub.send(b"t", [msgpack.ExtType(code, b"x")])
        with pytest.raises(BufferError, match="contiguous"):
            pub.send(b"t", memoryview(bytes(100000))[::2])
        if np is not None:         # numpy says ValueError: the same BufferError
            with pytest.raises(BufferError, match="contiguous"):
                pub.send(b"t", np.arange(100000)[::2])
        pub.send(b"t", [upcall.ExtType(125, b"x")])        # others still go
    # the standalone codec has no frames: the codes are plain ExtTypes there
    assert upcall.unpackb(upcall.packb(upcall.ExtType(126, b"x"))) == upcall.ExtType(126, b"x")


# ---- interop with pyzmq + msgpack -----------------------------------------

def _ref(index, size, version=1, flags=0):
    return msgpack.ExtType(126, struct.pack(">BBHIQ", version, flags, 0, index, size))


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_pyzmq_reads_upcalls_oob_message(zctx, endpoints, transport):
    ep = endpoints(transport)
    pull = zctx.socket(zmq.PULL)
    pull.bind(ep)
    pull.rcvtimeo = int(DEADLINE * 1000)
    arr = array.array("B", bytes(range(256)) * (LARGE // 256))
    with upcall.Bus() as bus:
        pub = bus.publisher(ep, kind="push", bind=False, oob_threshold=THRESHOLD)
        pub.send(b"t", {"a": arr, "small": b"s"})
        frames = pull.recv_multipart(copy=False)
    # [topic, payload, value, marker]: the marker frame says the payload uses
    # upcall's extensions (docs/wire.md, "The marker frame").
    assert len(frames) == 4 and frames[0].bytes == b"t"
    assert frames[3].bytes == upcall.WIRE_MARKER

    def ext_hook(code, data):
        assert code == 126
        version, flags, _, index, size = struct.unpack(">BBHIQ", data)
        assert (version, flags, index, size) == (1, 0, 2, len(arr))
        return frames[index].buffer
    obj = msgpack.unpackb(frames[1].buffer, ext_hook=ext_hook)
    assert obj["small"] == b"s" and bytes(obj["a"]) == arr.tobytes()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_upcall_receives_pyzmq_oob_message(zctx, endpoints, transport):
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints(transport), col, kind="pull", bind=True)
        push = pyzmq_push(zctx, sub.last_endpoint)
        a, b = b"A" * 50_000, b"B" * 10
        # references out of frame order, one nested, a tiny frame too
        push.send_multipart([b"t", msgpack.packb({"b": _ref(3, len(b)), "x": [_ref(2, len(a))]}), a, b,
                             upcall.WIRE_MARKER])
        col.wait(1)
        got = col.items[0]
        assert bytes(got["x"][0]) == a and bytes(got["b"]) == b
        assert isinstance(got["b"], memoryview)


GOOD = msgpack.packb("ok")
MALFORMED = [
    ("index_past_end", [b"t", msgpack.packb([_ref(3, 4)]), b"abcd"], "oob_index"),
    ("index_topic", [b"t", msgpack.packb([_ref(0, 1)]), b"a"], "oob_index"),
    ("index_payload", [b"t", msgpack.packb([_ref(1, 1)]), b"a"], "oob_index"),
    ("missing_frame", [b"t", msgpack.packb([_ref(2, 4)])], "oob_index"),
    ("wrong_size", [b"t", msgpack.packb([_ref(2, 5)]), b"abcd"], "oob_size"),
    ("twice", [b"t", msgpack.packb([_ref(2, 4), _ref(2, 4)]), b"abcd"], "oob_twice"),
    ("unreferenced", [b"t", msgpack.packb([_ref(2, 4)]), b"abcd", b"more"], "oob_unused"),
    ("no_reference", [b"t", msgpack.packb(1), b"abcd"], "oob_unused"),
    ("no_marker", [b"t", msgpack.packb([_ref(2, 4)]), b"abcd", "unmarked"], "oob_unused"),
    ("version", [b"t", msgpack.packb([_ref(2, 4, version=2)]), b"abcd"], "oob_version"),
    ("flags_unknown", [b"t", msgpack.packb([_ref(2, 4, flags=0x20)]), b"abcd"], "oob_flags"),
    ("short_ref", [b"t", msgpack.packb([msgpack.ExtType(126, b"\x01" * 8)]), b"abcd"], "oob_length"),
    # coalesced payloads (ext 127) are split (tests/wire/test_coalesce_rx.py), but
    # not with frames after them, and one level only
    ("coalesced_with_frame", [b"t", b"\xc9\x00\x00\x00\x02\x7f\x01\xc0", b"abcd"], "batch_oob"),
    ("coalesced_nested", [b"t", b"\xc9\x00\x00\x00\x04\x7f\x01\xd4\x7f\x01"], "coalesced"),
    ("too_many_frames", [b"t", GOOD] + [b"f"] * 20, "frames"),
]


@pytest.mark.parametrize("mode", ["native", "caller"])
@pytest.mark.parametrize("name,frames,reason", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_references_are_counted_decode_errors(zctx, endpoints, mode, name, frames, reason):
    # upcall's marker frame last (docs/wire.md): these are upcall's own
    # extensions, broken; "unmarked" sends the message without it.
    if frames[-1] == "unmarked":
        frames = frames[:-1]
    elif name != "too_many_frames":
        frames = frames + [upcall.WIRE_MARKER]
    items, errors, stats = decode_error_then_good(zctx, endpoints("ipc"), mode, frames,
                                                  [b"t", GOOD])
    assert items == ["ok"]
    assert len(errors) == 1
    exc = errors[0]
    assert isinstance(exc, upcall.DecodeError)
    assert exc.reason == reason, exc
    assert exc.topic == b"t"
    assert stats["decode_errors"] == 1
    if reason == "oob_unused":
        assert exc.offset == len(frames[1])
    _wait_released()


@pytest.mark.huge
def test_value_over_4_gib(endpoints):
    """msgpack's bin 32 stops at 4 GiB; an out-of-band frame does not.
    Over inproc the view is the sender's memory, an anonymous mapping whose
    4.5 GiB of zeros are never touched but two pages (make test-huge)."""
    size = (1 << 32) + (1 << 29)
    big = mmap.mmap(-1, size)
    big[-1] = 7
    kept = []
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "inproc", lambda m: kept.append(m))
        sent = pub.send(b"t", {"big": big}, copy=False)
        wait_for(lambda: kept)
        view = kept[0]["big"]
        assert len(view) == size and view[-1] == 7 and view[0] == 0
        del view
        kept.clear()
        assert sent.wait(DEADLINE)
        big.close()             # possible only once every export is released
        big = mmap.mmap(-1, size)
        with pytest.raises(ValueError, match="inline"):
            bus.publisher(sub.last_endpoint, kind="push", bind=False, oob_threshold=None).send(b"t", big)


def test_send_returns_none_unless_a_buffer_is_held(endpoints):
    """send() returned None before out-of-band frames; code that waits with
    `pub.send(...) or arrived()` (tests/bus/test_curve.py does) must keep
    working: only a message holding buffers returns a Sent (truthy)."""
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "ipc", col)
        assert pub.send(b"t", {"small": b"x" * 10}) is None
        assert pub.send(b"t", {"big": bytes(LARGE)}) is None      # copied: the default
        assert pub.send(b"t", {"big": bytes(LARGE)}, copy=True) is None
        sent = pub.send(b"t", {"big": bytes(LARGE)}, copy=False)
        assert isinstance(sent, upcall.Sent)
        col.wait(4)
        assert sent.wait(DEADLINE) and sent.done
        assert repr(sent) == "<upcall.Sent done>"


# ---- send() copies unless asked not to ----------------------------------------

REUSED = 4 * 1024 * 1024
REUSE_ROUNDS = 20


def _reused_buffer():
    if np is not None:
        return np.zeros(REUSED, dtype=np.uint8)
    return bytearray(REUSED)


def _fill(buf, value):
    if np is not None and isinstance(buf, np.ndarray):
        buf.fill(value)
    else:
        buf[:] = bytes([value]) * len(buf)


@pytest.mark.parametrize("publisher_kw", [
    {},                                                    # the default publisher
    {"oob_threshold": upcall.DEFAULT_OOB_THRESHOLD},       # out of band, send() copying
    {"oob_threshold": upcall.DEFAULT_OOB_THRESHOLD, "coalesce": True},
], ids=["default", "oob", "oob-coalesce"])
def test_buffer_reused_right_after_send_arrives_as_sent(endpoints, publisher_kw):
    """pyzmq's rule: a buffer may be written again as soon as send() returns,
    unless copy=False was asked for.  Over tcp libzmq's I/O thread still
    writes a 4 MiB frame to the socket long after send() returns: a frame
    over the caller's memory would carry the bytes written next."""
    got = []

    def on_msg(msg):
        v = msg["v"]
        expected = bytes([msg["i"] & 0xFF]) * REUSED
        got.append((msg["i"], len(v) == REUSED and bytes(v) == expected))
    buf = _reused_buffer()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("tcp"), on_msg, kind="pull", bind=True, copy=True)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, **publisher_kw)
        for i in range(REUSE_ROUNDS):
            _fill(buf, i & 0xFF)
            pub.send(b"t", {"i": i, "v": buf})
            _fill(buf, 0xEE)              # the caller's next use of its buffer
        pub.flush()
        wait_for(lambda: len(got) == REUSE_ROUNDS, what=f"{REUSE_ROUNDS} messages")
        pub.close()
    assert [i for i, _ in got] == list(range(REUSE_ROUNDS))
    assert [i for i, ok in got if not ok] == [], "messages that arrived with the later bytes"
    _wait_released()


def test_copy_false_is_zero_copy_until_released(endpoints):
    """copy=False keeps the zero-copy send: the frame is the caller's memory
    (inproc: the subscriber's view is it) and the Sent says when it is free."""
    kept = []
    ba = bytearray(b"z" * LARGE)
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "inproc", lambda m: kept.append(m))
        sent = pub.send(b"t", {"v": ba}, copy=False)
        assert isinstance(sent, upcall.Sent)
        wait_for(lambda: kept)
        ba[0] = ord("y")                  # the subscriber sees the sender's own memory
        assert bytes(kept[0]["v"][:2]) == b"yz"
        assert not sent.done
        kept.clear()
        assert sent.wait(DEADLINE)
    _wait_released()


def test_copy_false_without_out_of_band_frames_holds_nothing(endpoints):
    """copy=False allows a zero-copy send; a publisher that sends no
    out-of-band frames packs everything into the payload, so nothing is held."""
    col = Collector()
    ba = bytearray(b"n" * LARGE)
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False)
        assert pub.send(b"t", {"v": ba}, copy=False) is None
        ba[:] = b"m" * LARGE
        col.wait(1)
        assert col.items[0]["v"] == b"n" * LARGE

# ---- limits -----------------------------------------------------------------

@pytest.mark.parametrize("mode", ["native", "python", "caller", "executor"])
@pytest.mark.parametrize("copy", [False, True])
def test_decoder_max_len_applies_to_out_of_band_values(endpoints, mode, copy):
    """Decoder(max_len=N) bounds a value sent out of band as it bounds the
    same value inline: a decode error (reason max_len, the reference's
    offset), counted; the next message arrives."""
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "ipc", col, decoder=upcall.Decoder(max_len=1000),
                         copy=copy, on_error=lambda exc, raw: errors.append(exc),
                         **mode_kwargs(mode))
        pump = make_pump(sub) if mode == "caller" else None
        inline = bus.publisher(sub.last_endpoint, kind="push", bind=False, oob_threshold=None)
        inline.send(b"t", [bytes(LARGE)])        # inline: refused
        pub.send(b"t", [bytes(LARGE)])           # out of band: refused the same way
        pub.send(b"t", [bytes(1000)])            # at the limit: inline (< threshold)
        pub.send(b"t", "next")
        col.wait(2, pump=pump)
        # The inline message came from another socket: in any order.
        wait_for(lambda: (pump() if pump else None) or len(errors) == 2, what="both errors")
        assert [bytes(x[0]) if isinstance(x, list) else x for x in col.items] == [bytes(1000),
                                                                                 "next"]
        assert [e.reason for e in errors] == ["max_len", "max_len"]
        assert [e.offset for e in errors] == [1, 1]
        assert all("max_len=1000" in str(e) for e in errors)
        assert sub.stats["decode_errors"] == 2
        col.items.clear()
    _wait_released()


def test_decoder_max_len_at_the_limit_out_of_band(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "ipc", col, decoder=upcall.Decoder(max_len=THRESHOLD))
        pub.send(b"t", [bytes(THRESHOLD)])       # exactly the threshold: out of band
        col.wait(1)
        assert isinstance(col.items[0][0], memoryview) and len(col.items[0][0]) == THRESHOLD
        col.items.clear()
    _wait_released()
