"""zstd compression of out-of-band frames (publisher(compression="zstd"),
docs/wire.md: ext 126 codec id 2): end to end, interoperability both ways
with pyzmq and the zstandard package, and the decompression-bomb limits.

Real libzmq sockets, pyzmq and zstandard on the other end where the wire
itself is checked; every wait is on a condition with a deadline."""
import gc
import os
import struct
import threading
import tracemalloc

import msgpack
import pytest
import zmq

zstandard = pytest.importorskip("zstandard")

import upcall
from upcall import _bus
from helpers import (DEADLINE, Collector, marked, marked_error_then_good, make_pump, mode_kwargs,
                     wait_for)

pytestmark = pytest.mark.skipif("zstd" not in upcall.COMPRESSION,
                               reason="this upcall was built without libzstd")

ZSTD = 2                      # the codec id of a zstd frame (docs/wire.md)
MODES = ["native", "python", "caller", "executor"]
THRESHOLD = 4096
ZEROS = bytes(1_000_000)
TEXT = b"the quick brown fox jumps over the lazy dog; " * 5000
RANDOM = os.urandom(300_000)
GOOD = msgpack.packb("ok")


def zstd(data, content_size=True):
    """One zstd frame, as any zstd producer writes it (with its content size
    in the header unless told otherwise)."""
    return zstandard.ZstdCompressor(write_content_size=content_size).compress(data)


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def _wait_released():
    gc.collect()
    wait_for(lambda: _bus.oob_outstanding() == (0, 0), what="every out-of-band buffer released")


def _ref(index, size, flags=0, version=1):
    return msgpack.ExtType(126, struct.pack(">BBHIQ", version, flags, 0, index, size))


def _refs(frames):
    """The references of an upcall message read by pyzmq: {key: (flags, index, size)}."""
    def ext_hook(code, data):
        assert code == 126
        version, flags, _, index, size = struct.unpack(">BBHIQ", data)
        assert version == 1
        return (flags, index, size)
    obj = msgpack.unpackb(frames[1], ext_hook=ext_hook)
    return {k: v for k, v in obj.items() if isinstance(v, tuple)}


def _receive_with_pyzmq(zctx, endpoints, transport, obj, **pub_kw):
    """Send obj from an upcall publisher; return the frames pyzmq received."""
    ep = endpoints(transport)
    pull = zctx.socket(zmq.PULL)
    pull.bind(ep)
    pull.rcvtimeo = int(DEADLINE * 1000)
    with upcall.Bus() as bus:
        pub = bus.publisher(ep, kind="push", bind=False, oob_threshold=THRESHOLD, **pub_kw)
        pub.send(b"t", obj)
        frames = pull.recv_multipart()
    pull.close()
    return frames


# ---- end to end --------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_round_trip_every_mode(endpoints, transport, mode):
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints(transport), col, kind="pull", bind=True,
                            **mode_kwargs(mode))
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, oob_threshold=THRESHOLD,
                            compression="zstd")
        pump = make_pump(sub) if mode == "caller" else None
        value = {"zeros": ZEROS, "text": TEXT, "random": RANDOM, "small": b"s" * 5000, "n": 7}
        pub.send(b"t", value)
        pub.send(b"t", value, copy=False)     # the raw values: views until delivered
        col.wait(2, pump=pump)
        for got in col.items:
            assert got["zeros"] == ZEROS and got["text"] == TEXT and got["random"] == RANDOM
            assert got["small"] == b"s" * 5000 and got["n"] == 7
            for k in ("zeros", "text", "random", "small"):
                assert isinstance(got[k], memoryview) and got[k].readonly, k
        assert sub.stats["decode_errors"] == 0
        del got
        col.items.clear()
    _wait_released()


def test_copy_true_delivers_bytes(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True, copy=True)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, compression="zstd")
        pub.send(b"t", {"text": TEXT})
        col.wait(1)
        assert col.items[0]["text"] == TEXT and type(col.items[0]["text"]) is bytes
        col.items.clear()
    _wait_released()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_compressible_goes_zstd_incompressible_goes_raw(zctx, endpoints, transport):
    frames = _receive_with_pyzmq(zctx, endpoints, transport,
                                 {"zeros": ZEROS, "text": TEXT, "random": RANDOM},
                                 compression="zstd")
    refs = _refs(frames)
    d = zstandard.ZstdDecompressor()
    flags, index, size = refs["zeros"]
    assert flags == ZSTD and size == len(ZEROS) and len(frames[index]) < len(ZEROS) // 100
    assert d.decompress(frames[index]) == ZEROS
    flags, index, size = refs["text"]
    assert flags == ZSTD and size == len(TEXT) and len(frames[index]) < len(TEXT) // 2
    assert d.decompress(frames[index]) == TEXT
    flags, index, size = refs["random"]
    assert flags == 0 and size == len(RANDOM) and frames[index] == RANDOM


def test_frames_under_10_kb_are_never_compressed(zctx, endpoints):
    # Above the out-of-band threshold, below the compression minimum: raw,
    # however compressible; from 10 kB on, compressed.
    under, at = bytes(10 * 1024 - 1), bytes(10 * 1024)
    frames = _receive_with_pyzmq(zctx, endpoints, "ipc", {"under": under, "at": at},
                                 compression="zstd")
    refs = _refs(frames)
    flags, index, size = refs["under"]
    assert flags == 0 and len(frames[index]) == size == len(under)
    flags, index, size = refs["at"]
    assert flags == ZSTD and size == len(at) and len(frames[index]) < len(at)


def test_compressible_start_incompressible_rest_goes_raw(zctx, endpoints):
    value = bytes(20_000) + os.urandom(2_000_000)
    frames = _receive_with_pyzmq(zctx, endpoints, "ipc", {"v": value}, compression="zstd")
    flags, index, size = _refs(frames)["v"]
    assert flags == 0 and frames[index] == value


def test_each_publisher_its_own_codec(zctx, endpoints):
    # Chosen per publisher: one subscriber reads lz4, zstd and raw frames.
    if "lz4" not in upcall.COMPRESSION:
        pytest.skip("this upcall was built without liblz4")
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True)
        pubs = [bus.publisher(sub.last_endpoint, kind="push", bind=False, compression=c)
                for c in ("lz4", "zstd", None)]
        for i, p in enumerate(pubs):
            p.send(b"t", {"i": i, "text": TEXT})
        col.wait(3)
        assert sorted(m["i"] for m in col.items) == [0, 1, 2]
        assert all(m["text"] == TEXT for m in col.items)
        col.items.clear()
    _wait_released()


# ---- interoperability ---------------------------------------------------------

@pytest.mark.parametrize("content_size", [True, False])
@pytest.mark.parametrize("copy", [False, True])
def test_upcall_reads_a_pyzmq_zstd_frame(zctx, endpoints, content_size, copy):
    # A pyzmq peer building the reference per docs/wire.md: codec 2, size
    # the value's length, the frame one zstd frame of it.
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("tcp"), col, kind="pull", bind=True, copy=copy)
        push = zctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(sub.last_endpoint)
        push.send_multipart(marked([b"t", msgpack.packb({"blob": _ref(2, len(TEXT), flags=ZSTD),
                                                   "raw": _ref(3, 5)}),
                             zstd(TEXT, content_size), b"hello"]))
        col.wait(1)
        got = col.items[0]
        assert got["blob"] == TEXT and got["raw"] == b"hello"
        assert isinstance(got["blob"], bytes if copy else memoryview)
        assert sub.stats["decode_errors"] == 0
        del got
        col.items.clear()
    _wait_released()


def test_pyzmq_reads_upcall_zstd_frames(zctx, endpoints):
    # The reader of docs/wire.md: msgpack + zstandard, nothing of upcall's.
    frames = _receive_with_pyzmq(zctx, endpoints, "tcp", {"a": TEXT, "b": ZEROS},
                                 compression="zstd")

    def ext_hook(code, data):
        version, flags, _, index, size = struct.unpack(">BBHIQ", data)
        assert code == 126 and version == 1 and flags in (0, ZSTD)
        if flags == ZSTD:
            return zstandard.ZstdDecompressor().decompress(frames[index], max_output_size=size)
        return bytes(frames[index])
    assert msgpack.unpackb(frames[1], ext_hook=ext_hook) == {"a": TEXT, "b": ZEROS}


# ---- malformed frames and decompression bombs -------------------------------

_FRAME = zstd(TEXT)
_FRAME_NO_SIZE = zstd(TEXT, content_size=False)
MALFORMED = [
    ("garbage", [b"t", msgpack.packb([_ref(2, 100_000, flags=ZSTD)]), b"\xff" * 64],
     "oob_decompress"),
    ("claim_smaller", [b"t", msgpack.packb([_ref(2, len(TEXT) - 1, flags=ZSTD)]), _FRAME],
     "oob_decompress"),
    ("claim_larger", [b"t", msgpack.packb([_ref(2, len(TEXT) + 1, flags=ZSTD)]), _FRAME],
     "oob_decompress"),
    # Without the size in its header: the frame expands past the claim
    # (zstd stops at the buffer's end), or falls short of it.
    ("expands_past_claim", [b"t", msgpack.packb([_ref(2, 1000, flags=ZSTD)]), _FRAME_NO_SIZE],
     "oob_decompress"),
    ("falls_short_of_claim", [b"t", msgpack.packb([_ref(2, len(TEXT) + 1, flags=ZSTD)]),
                              _FRAME_NO_SIZE], "oob_decompress"),
    ("truncated", [b"t", msgpack.packb([_ref(2, len(TEXT), flags=ZSTD)]), _FRAME[:-10]],
     "oob_decompress"),
    ("trailing_bytes", [b"t", msgpack.packb([_ref(2, len(TEXT), flags=ZSTD)]), _FRAME + b"x"],
     "oob_decompress"),
    ("two_frames", [b"t", msgpack.packb([_ref(2, 2 * len(TEXT), flags=ZSTD)]),
                    _FRAME_NO_SIZE + _FRAME_NO_SIZE], "oob_decompress"),
    ("corrupt_body", [b"t", msgpack.packb([_ref(2, len(TEXT), flags=ZSTD)]),
                      _FRAME[:20] + bytes(b ^ 0x5a for b in _FRAME[20:])], "oob_decompress"),
    ("empty_frame", [b"t", msgpack.packb([_ref(2, 10, flags=ZSTD)]), b""], "oob_decompress"),
    # More than a 4-byte frame can hold: refused before allocating.
    ("absurd_size", [b"t", msgpack.packb([_ref(2, 2 ** 40, flags=ZSTD)]), b"abcd"],
     "oob_decompress"),
]


@pytest.mark.parametrize("mode", ["native", "python"])
@pytest.mark.parametrize("copy", [False, True])
@pytest.mark.parametrize("name,frames,reason", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_zstd_frames_are_counted_decode_errors(zctx, endpoints, mode, copy, name,
                                                         frames, reason):
    items, errors, stats = marked_error_then_good(zctx, endpoints("ipc"), mode, frames,
                                                  [b"t", GOOD], copy=copy)
    assert items == ["ok"]
    assert len(errors) == 1
    exc = errors[0]
    assert isinstance(exc, upcall.DecodeError)
    assert exc.reason == reason, exc
    assert exc.topic == b"t"
    assert exc.offset == 1            # the reference, inside the one-element array
    assert stats["decode_errors"] == 1
    _wait_released()


DEFAULT_BOUND = 64 * 1024 * 1024
OVER_DEFAULT = DEFAULT_BOUND + 1


@pytest.mark.parametrize("mode", MODES)
def test_default_settings_refuse_a_frame_that_expands_past_the_bound(zctx, endpoints, mode):
    # No max_message_size: a few kB on the wire may not make the subscriber
    # allocate more than DEFAULT_MAX_DECOMPRESSED.
    frame = zstd(bytes(OVER_DEFAULT))
    assert len(frame) < 10_000
    bad = [b"t", msgpack.packb([_ref(2, OVER_DEFAULT, flags=ZSTD)]), frame]
    items, errors, stats = marked_error_then_good(zctx, endpoints("ipc"), mode, bad,
                                                  [b"t", GOOD])
    assert items == ["ok"]
    assert [e.reason for e in errors] == ["message_size"], errors
    assert f"at least {OVER_DEFAULT} bytes" in str(errors[0])
    assert stats["decode_errors"] == 1
    _wait_released()


@pytest.mark.parametrize("copy", [False, True])
def test_max_message_size_bounds_the_sum_of_the_frames(zctx, endpoints, copy):
    # max_message_size=1 MB: each frame decompresses to 100 kB; 13 of them
    # are 1.3 MB once decompressed, 9 are within.
    limit = 1_000_000
    part = TEXT[:100_000]
    frame = zstd(part)
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True, copy=copy,
                            max_message_size=limit, on_error=lambda exc, raw: errors.append(exc))
        push = zctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(sub.last_endpoint)
        for n in (13, 9):
            refs = [_ref(2 + i, len(part), flags=ZSTD) for i in range(n)]
            push.send_multipart(marked([b"t", msgpack.packb(refs)] + [frame] * n))
        col.wait(1)
        assert len(col.items[0]) == 9 and all(bytes(v) == part for v in col.items[0])
        assert [e.reason for e in errors] == ["message_size"]
        assert f"max_message_size={limit}" in str(errors[0])
        assert sub.stats["decode_errors"] == 1
        del col.items[:]
    _wait_released()


CLAIM = 100_000_000           # within the subscription's limit below


@pytest.mark.parametrize("content_size", [True, False])
def test_a_claim_the_frame_cannot_reach_allocates_nothing(zctx, endpoints, content_size):
    # A subscription that allows large messages, a 1 MB frame (declaring its
    # size, or small enough that zstd's block format bounds it) claiming
    # 100 MB: refused before the 100 MB are allocated.  With copy=True the
    # allocation would be a bytes object, which tracemalloc sees on any
    # thread; the peak stays far under the claim.
    frame = zstd(bytes(1_000_000), content_size)
    assert content_size or (len(frame) // 4 + 1) * 128 * 1024 < CLAIM // 10
    errors = []
    col = Collector()
    tracemalloc.start()
    try:
        with upcall.Bus() as bus:
            sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True, copy=True,
                                max_message_size=2 * CLAIM,
                                on_error=lambda exc, raw: errors.append(exc))
            push = zctx.socket(zmq.PUSH)
            push.linger = 0
            push.connect(sub.last_endpoint)
            tracemalloc.reset_peak()
            push.send_multipart(marked([b"t", msgpack.packb([_ref(2, CLAIM, flags=ZSTD)]), frame]))
            push.send_multipart(marked([b"t", GOOD]))
            col.wait(1)
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert col.items == ["ok"]
    assert [e.reason for e in errors] == ["oob_decompress"], errors
    assert peak < CLAIM // 10, peak
    _wait_released()


def test_arguments_name_the_option(endpoints):
    with upcall.Bus() as bus:
        with pytest.raises(ValueError, match=r"compression must be None or a codec name"):
            bus.publisher(endpoints("inproc"), compression="zstandard")
        pub = bus.publisher(endpoints("inproc"), compression="zstd")
        pub.close()
    assert "zstd" in upcall.COMPRESSION


def test_compressing_threads_keep_their_own_contexts(endpoints):
    # Publishers on several threads compress at once (each thread its own
    # zstd context): every message arrives whole.
    col = Collector()
    n_threads, per_thread = 4, 10
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, compression="zstd")

        def send(t):
            for i in range(per_thread):
                pub.send(b"t", {"t": t, "i": i, "text": TEXT[: 50_000 + t * 1000 + i]})
        threads = [threading.Thread(target=send, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(DEADLINE)
        col.wait(n_threads * per_thread)
        for m in col.items:
            assert m["text"] == TEXT[: 50_000 + m["t"] * 1000 + m["i"]]
        del m
        assert sub.stats["decode_errors"] == 0
        col.items.clear()
    _wait_released()
