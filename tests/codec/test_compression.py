"""LZ4 compression of out-of-band frames (docs/wire.md, ext 126 codec id 1)
and subscribe(copy=True); zstd's own tests are tests/codec/test_zstd.py.

Real libzmq sockets, pyzmq and the lz4 package on the other end where the
wire itself is checked; every wait is on a condition with a deadline."""
import gc
import os
import struct

import msgpack
import pytest
import zmq

lz4_block = pytest.importorskip("lz4.block")

import upcall
from upcall import _bus
from helpers import (DEADLINE, Collector, marked, marked_error_then_good, make_pump, mode_kwargs,
                     wait_for)

pytestmark = pytest.mark.skipif("lz4" not in upcall.COMPRESSION,
                               reason="this upcall was built without liblz4")

MODES = ["native", "python", "caller", "executor"]
THRESHOLD = 4096
ZEROS = bytes(1_000_000)
TEXT = b"the quick brown fox jumps over the lazy dog; " * 5000
RANDOM = os.urandom(300_000)


def _pair(bus, endpoints, transport, target, compression="lz4", **kw):
    """A bound PULL subscription and a PUSH publisher connected to it."""
    sub = bus.subscribe(endpoints(transport), target, kind="pull", bind=True, **kw)
    pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, oob_threshold=THRESHOLD,
                        compression=compression)
    return sub, pub


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
    refs = {}

    def ext_hook(code, data):
        assert code == 126
        version, flags, _, index, size = struct.unpack(">BBHIQ", data)
        assert version == 1
        return (flags, index, size)
    obj = msgpack.unpackb(frames[1], ext_hook=ext_hook)
    for k, v in obj.items():
        if isinstance(v, tuple):
            refs[k] = v
    return refs


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


# ---- round trips ------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", ["inproc", "ipc", "tcp"])
def test_round_trip_every_mode(endpoints, transport, mode):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, transport, col, **mode_kwargs(mode))
        pump = make_pump(sub) if mode == "caller" else None
        pub.send(b"t", {"zeros": ZEROS, "text": TEXT, "random": RANDOM, "small": b"s" * 5000,
                        "n": 7})
        col.wait(1, pump=pump)
        got = col.items[0]
        assert got["zeros"] == ZEROS and got["text"] == TEXT and got["random"] == RANDOM
        assert got["small"] == b"s" * 5000 and got["n"] == 7
        for k in ("zeros", "text", "random", "small"):
            assert isinstance(got[k], memoryview) and got[k].readonly, k
        assert sub.stats["decode_errors"] == 0
        del got
        col.items.clear()
    _wait_released()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_compressible_goes_lz4_incompressible_goes_raw(zctx, endpoints, transport):
    frames = _receive_with_pyzmq(zctx, endpoints, transport,
                                 {"zeros": ZEROS, "text": TEXT, "random": RANDOM},
                                 compression="lz4")
    refs = _refs(frames)
    flags, index, size = refs["zeros"]
    assert flags == 1 and size == len(ZEROS) and len(frames[index]) < len(ZEROS) // 100
    assert lz4_block.decompress(frames[index], uncompressed_size=size) == ZEROS
    flags, index, size = refs["text"]
    assert flags == 1 and size == len(TEXT) and len(frames[index]) < len(TEXT) // 2
    assert lz4_block.decompress(frames[index], uncompressed_size=size) == TEXT
    flags, index, size = refs["random"]
    assert flags == 0 and size == len(RANDOM) and frames[index] == RANDOM


def test_no_compression_is_the_default(zctx, endpoints):
    frames = _receive_with_pyzmq(zctx, endpoints, "ipc", {"zeros": ZEROS})
    flags, index, size = _refs(frames)["zeros"]
    assert flags == 0 and len(frames[index]) == size == len(ZEROS)


def test_frames_under_10_kb_are_never_compressed(zctx, endpoints):
    # Above the out-of-band threshold, below the compression minimum: raw,
    # however compressible; from 10 kB on, compressed.
    under, at = bytes(10 * 1024 - 1), bytes(10 * 1024)
    frames = _receive_with_pyzmq(zctx, endpoints, "ipc", {"under": under, "at": at},
                                 compression="lz4")
    refs = _refs(frames)
    flags, index, size = refs["under"]
    assert flags == 0 and len(frames[index]) == size == len(under)
    flags, index, size = refs["at"]
    assert flags == 1 and size == len(at) and len(frames[index]) < len(at)


def test_compressible_start_incompressible_rest_goes_raw(zctx, endpoints):
    # The samples see part of the zeros, the whole does not shrink enough:
    # sent raw after all.
    value = bytes(20_000) + os.urandom(2_000_000)
    frames = _receive_with_pyzmq(zctx, endpoints, "ipc", {"v": value}, compression="lz4")
    flags, index, size = _refs(frames)["v"]
    assert flags == 0 and frames[index] == value


def test_decompressed_views_are_counted_until_dropped(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "tcp", col)
        pub.send(b"t", {"z": ZEROS})
        col.wait(1)
        view = col.items.pop()["z"]
        assert _bus.oob_outstanding()[1] == 1
        again = view[10:20]                  # a view of the view keeps it too
        del view
        gc.collect()
        assert _bus.oob_outstanding()[1] == 1 and again == bytes(10)
        del again
    _wait_released()


def test_mixed_values_keep_their_order(endpoints):
    col = Collector()
    values = [ZEROS, RANDOM, TEXT, bytes(20_000), os.urandom(50_000), b"x" * 5000]
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "ipc", col)
        pub.send(b"t", values)
        col.wait(1)
        assert [bytes(v) for v in col.items[0]] == values
        col.items.clear()
    _wait_released()


# ---- the sender's buffers ---------------------------------------------------

@pytest.mark.parametrize("transport", ["inproc", "ipc", "tcp"])
def test_compressed_frames_release_the_buffer_at_once(endpoints, transport):
    col = Collector()
    buf = bytearray(ZEROS)
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, transport, col)
        sent = pub.send(b"t", {"z": buf, "t": TEXT}, copy=False)
        assert sent is not None and sent.done      # nothing of the sender's is held
        buf[:4] = b"XXXX"                          # free to change: the frame is a copy
        col.wait(1)
        assert col.items[0]["z"] == ZEROS and col.items[0]["t"] == TEXT
        col.items.clear()
    _wait_released()


def test_raw_frames_of_a_compressing_publisher_are_still_zero_copy(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "inproc", col)
        sent = pub.send(b"t", {"z": ZEROS, "r": RANDOM}, copy=False)
        col.wait(1)
        # On inproc the random value's view is the sender's memory: held.
        assert not sent.done
        col.items.clear()
        gc.collect()
        assert sent.wait(DEADLINE)
    _wait_released()


@pytest.mark.parametrize("oob_threshold", [None, 4096])
def test_compression_turns_out_of_band_frames_on(zctx, endpoints, oob_threshold):
    """Only out-of-band frames are compressed: compression="lz4" alone sends
    large values out of band at DEFAULT_OOB_THRESHOLD; an explicit
    oob_threshold still decides which."""
    ep = endpoints("tcp")
    pull = zctx.socket(zmq.PULL)
    pull.bind(ep)
    pull.rcvtimeo = int(DEADLINE * 1000)
    under = b"u" * (upcall.DEFAULT_OOB_THRESHOLD - 1)
    with upcall.Bus() as bus:
        pub = bus.publisher(ep, kind="push", bind=False, compression="lz4",
                            oob_threshold=oob_threshold)
        pub.send(b"t", {"z": ZEROS, "u": under})
        frames = pull.recv_multipart()
    pull.close()
    refs = _refs(frames)
    if oob_threshold is None:
        # [topic, payload, frame, marker]
        assert len(frames) == 4 and set(refs) == {"z"}
        assert msgpack.unpackb(frames[1])["u"] == under
    else:
        assert len(frames) == 5 and set(refs) == {"z", "u"}
    assert refs["z"][0] == 1 and lz4_block.decompress(frames[2], uncompressed_size=len(ZEROS)) == ZEROS


def test_send_copy_true_with_compression(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "ipc", col)
        assert pub.send(b"t", {"z": ZEROS, "r": RANDOM}, copy=True) is None
        col.wait(1)
        assert col.items[0]["z"] == ZEROS and col.items[0]["r"] == RANDOM
        col.items.clear()
    _wait_released()


# ---- subscribe(copy=True) ---------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compression", [None, "lz4"])
def test_copy_true_delivers_bytes(endpoints, mode, compression):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "ipc", col, compression=compression, copy=True,
                         **mode_kwargs(mode))
        pump = make_pump(sub) if mode == "caller" else None
        pub.send(b"t", {"z": ZEROS, "r": RANDOM, "nested": [TEXT]})
        col.wait(1, pump=pump)
        got = col.items[0]
        assert type(got["z"]) is bytes and got["z"] == ZEROS
        assert type(got["r"]) is bytes and got["r"] == RANDOM
        assert type(got["nested"][0]) is bytes and got["nested"][0] == TEXT
        assert _bus.oob_outstanding()[1] == 0     # no frame held by a view
    _wait_released()


def test_copy_true_on_inproc_and_for_handlers(endpoints):
    class Batches(upcall.Handler):
        def __init__(self):
            self.batches = True
            self.got = []

        def on_batch(self, msgs):
            self.got.extend(msgs)

    h = Batches()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "inproc", h, copy=True)
        pub.send(b"t", {"r": RANDOM})
        wait_for(lambda: h.got, what="the batch")
        assert type(h.got[0]["r"]) is bytes and h.got[0]["r"] == RANDOM
    _wait_released()


def test_copy_true_with_subscribe_async(endpoints):
    import asyncio

    async def main():
        with upcall.Bus() as bus:
            asub = bus.subscribe_async(endpoints("ipc"), kind="pull", bind=True, copy=True)
            async with asub:
                pub = bus.publisher(asub.last_endpoint, kind="push", bind=False,
                                    oob_threshold=THRESHOLD, compression="lz4")
                pub.send(b"t", {"z": ZEROS})
                async for msg in asub:
                    return msg
    msg = asyncio.run(asyncio.wait_for(main(), DEADLINE))
    assert type(msg["z"]) is bytes and msg["z"] == ZEROS

    async def bad():
        with upcall.Bus() as bus:
            with pytest.raises(TypeError, match="copy must be True or False, not int"):
                bus.subscribe_async(endpoints("inproc"), copy=1)
    asyncio.run(bad())


# ---- interoperability -------------------------------------------------------

@pytest.mark.parametrize("transport", ["ipc", "tcp"])
@pytest.mark.parametrize("copy", [False, True])
def test_upcall_reads_a_pyzmq_lz4_frame(zctx, endpoints, transport, copy):
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints(transport), col, kind="pull", bind=True, copy=copy)
        push = zctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(sub.last_endpoint)
        blob = TEXT
        frame = lz4_block.compress(blob, store_size=False)
        push.send_multipart(marked([b"t", msgpack.packb({"blob": _ref(2, len(blob), flags=1),
                                                   "raw": _ref(3, 5)}), frame, b"hello"]))
        col.wait(1)
        got = col.items[0]
        assert got["blob"] == blob and got["raw"] == b"hello"
        assert isinstance(got["blob"], bytes if copy else memoryview)
        del got
        col.items.clear()
    _wait_released()


# ---- malformed references ---------------------------------------------------

GOOD = msgpack.packb("ok")
_BLOCK = lz4_block.compress(TEXT, store_size=False)
MALFORMED = [
    ("garbage_data", [b"t", msgpack.packb([_ref(2, 100_000, flags=1)]), b"\xff" * 64],
     "oob_decompress"),
    ("wrong_size_small", [b"t", msgpack.packb([_ref(2, len(TEXT) - 1, flags=1)]), _BLOCK],
     "oob_decompress"),
    ("wrong_size_large", [b"t", msgpack.packb([_ref(2, len(TEXT) + 1, flags=1)]), _BLOCK],
     "oob_decompress"),
    # More than LZ4 can expand a 4-byte block to: refused before allocating.
    ("absurd_size", [b"t", msgpack.packb([_ref(2, 2 ** 40, flags=1)]), b"abcd"],
     "oob_decompress"),
    ("truncated_block", [b"t", msgpack.packb([_ref(2, len(TEXT), flags=1)]), _BLOCK[:-10]],
     "oob_decompress"),
    ("empty_frame", [b"t", msgpack.packb([_ref(2, 10, flags=1)]), b""], "oob_decompress"),
    # A bit outside the codec field, and a codec id past the last one known.
    ("bad_flags", [b"t", msgpack.packb([_ref(2, 4, flags=0x10)]), b"abcd"], "oob_flags"),
    ("unknown_codec", [b"t", msgpack.packb([_ref(2, 4, flags=3)]), b"abcd"], "oob_flags"),
    ("missing_frame", [b"t", msgpack.packb([_ref(2, len(TEXT), flags=1)])], "oob_index"),
    ("bad_index", [b"t", msgpack.packb([_ref(5, len(TEXT), flags=1)]), _BLOCK], "oob_index"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("copy", [False, True])
@pytest.mark.parametrize("name,frames,reason", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_compressed_references_are_decode_errors(zctx, endpoints, mode, copy, name,
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


def test_max_message_size_bounds_the_decompressed_size(zctx, endpoints):
    # The frame is small (LZ4 shrank TEXT 200x) but would decompress past
    # the subscription's limit: refused before allocating.
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True,
                            max_message_size=len(TEXT) - 1,
                            on_error=lambda exc, raw: errors.append(exc))
        push = zctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(sub.last_endpoint)
        small = TEXT[:50_000]
        push.send_multipart(marked([b"t", msgpack.packb([_ref(2, len(TEXT), flags=1)]), _BLOCK]))
        push.send_multipart(marked([b"t", msgpack.packb([_ref(2, len(small), flags=1)]),
                             lz4_block.compress(small, store_size=False)]))
        col.wait(1)
        assert [bytes(v) for v in col.items[0]] == [small]
        assert [e.reason for e in errors] == ["message_size"]
        assert f"max_message_size={len(TEXT) - 1}" in str(errors[0])
        del col.items[:]
    _wait_released()


# ---- the decompressed size of a whole message --------------------------------

# A real LZ4 block a little over the default bound: 64 MiB of zeros shrink
# to about 260 kB (LZ4 stores at most 255 bytes of a run per byte).
DEFAULT_BOUND = 64 * 1024 * 1024
OVER_DEFAULT = DEFAULT_BOUND + 1
_ZERO_BLOCK = lz4_block.compress(bytes(OVER_DEFAULT), store_size=False)


def test_default_bound_is_64_mib():
    assert upcall.DEFAULT_MAX_DECOMPRESSED == DEFAULT_BOUND


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("copy", [False, True])
def test_default_settings_refuse_a_frame_that_expands_past_the_bound(zctx, endpoints, mode,
                                                                      copy):
    # No max_message_size: a quarter of a megabyte on the wire may not make
    # the subscriber allocate more than DEFAULT_MAX_DECOMPRESSED.
    assert len(_ZERO_BLOCK) < OVER_DEFAULT // 200
    bad = [b"t", msgpack.packb([_ref(2, OVER_DEFAULT, flags=1)]), _ZERO_BLOCK]
    items, errors, stats = marked_error_then_good(zctx, endpoints("ipc"), mode, bad,
                                                  [b"t", GOOD], copy=copy)
    assert items == ["ok"]
    assert [e.reason for e in errors] == ["message_size"], errors
    assert f"at least {OVER_DEFAULT} bytes" in str(errors[0])
    assert f"{DEFAULT_BOUND} bytes" in str(errors[0])
    assert "max_message_size" in str(errors[0])
    assert errors[0].topic == b"t"
    assert errors[0].offset == 1          # the reference, inside the one-element array
    assert stats["decode_errors"] == 1
    _wait_released()


@pytest.mark.parametrize("mode", MODES)
def test_default_bound_is_for_the_sum_of_the_frames(zctx, endpoints, mode):
    # 13 frames (as many as a message carries), each well under the bound,
    # together over it: refused, whatever each frame is.
    n = upcall.MAX_OOB_FRAMES
    part = DEFAULT_BOUND // (n - 1)
    block = lz4_block.compress(bytes(part), store_size=False)
    refs = [_ref(2 + i, part, flags=1) for i in range(n)]
    bad = [b"t", msgpack.packb(refs)] + [block] * n
    assert part * (n - 1) <= DEFAULT_BOUND < part * n
    items, errors, stats = marked_error_then_good(zctx, endpoints("ipc"), mode, bad,
                                                  [b"t", GOOD])
    assert items == ["ok"]
    assert [e.reason for e in errors] == ["message_size"], errors
    # The last reference (each 18 bytes, after the array's 1-byte header).
    assert errors[0].offset == 1 + (n - 1) * 18
    assert f"at least {part * n} bytes" in str(errors[0])
    assert stats["decode_errors"] == 1
    _wait_released()


@pytest.mark.parametrize("copy", [False, True])
def test_max_message_size_bounds_the_sum_of_the_frames(zctx, endpoints, copy):
    # max_message_size=1 MB: each frame passes libzmq's per-frame check and
    # decompresses to 100 kB; 13 of them are 1.3 MB once decompressed.
    limit = 1_000_000
    part = TEXT[:100_000]
    block = lz4_block.compress(part, store_size=False)
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True, copy=copy,
                            max_message_size=limit, on_error=lambda exc, raw: errors.append(exc))
        push = zctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(sub.last_endpoint)
        for n in (13, 9):
            refs = [_ref(2 + i, len(part), flags=1) for i in range(n)]
            push.send_multipart(marked([b"t", msgpack.packb(refs)] + [block] * n))
        col.wait(1)
        assert len(col.items[0]) == 9 and all(bytes(v) == part for v in col.items[0])
        assert [e.reason for e in errors] == ["message_size"]
        assert f"max_message_size={limit}" in str(errors[0])
        assert sub.stats["decode_errors"] == 1
        del col.items[:]
    _wait_released()


def test_max_message_size_counts_raw_frames_and_the_payload_too(zctx, endpoints):
    # With max_message_size, the whole message once decompressed: payload,
    # raw frames and decompressed frames together (each within the limit,
    # which libzmq checks frame by frame).
    limit = 300_000
    raw = b"r" * 150_000
    block = lz4_block.compress(TEXT[:100_000], store_size=False)
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True,
                            max_message_size=limit, on_error=lambda exc, raw: errors.append(exc))
        push = zctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(sub.last_endpoint)
        # 150 kB raw + 100 kB decompressed + a 60 kB payload: over.
        push.send_multipart(marked([b"t", msgpack.packb([_ref(2, len(raw)), _ref(3, 100_000, flags=1),
                                                  "p" * 60_000]), raw, block]))
        # Two raw frames of 150 kB: over, no decompression involved.
        push.send_multipart(marked([b"t", msgpack.packb([_ref(2, len(raw)), _ref(3, len(raw))]),
                             raw, raw]))
        # 150 kB raw + 100 kB decompressed + a small payload: within.
        push.send_multipart(marked([b"t", msgpack.packb([_ref(2, len(raw)), _ref(3, 100_000, flags=1)]),
                             raw, block]))
        col.wait(1)
        assert [bytes(v) for v in col.items[0]] == [raw, TEXT[:100_000]]
        assert [e.reason for e in errors] == ["message_size", "message_size"]
        del col.items[:]
    _wait_released()


@pytest.mark.parametrize("copy", [False, True])
def test_decoder_max_len_applies_to_decompressed_values(zctx, endpoints, copy):
    # Decoder(max_len=...) bounds a value out of band as one inline: by its
    # size as delivered, refused before decompressing.
    bad = [b"t", msgpack.packb([_ref(2, len(TEXT), flags=1)]), _BLOCK]
    items, errors, stats = marked_error_then_good(
        zctx, endpoints("ipc"), "python", bad, [b"t", GOOD], copy=copy,
        decoder=upcall.Decoder(max_len=1000))
    assert items == ["ok"]
    assert [e.reason for e in errors] == ["max_len"]
    assert "max_len=1000" in str(errors[0])
    assert errors[0].offset == 1
    assert stats["decode_errors"] == 1
    # At the limit, delivered.
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True, copy=copy,
                            decoder=upcall.Decoder(max_len=len(TEXT)))
        push = zctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(sub.last_endpoint)
        push.send_multipart(marked(bad))
        col.wait(1)
        assert bytes(col.items[0][0]) == TEXT
        del col.items[:]
    _wait_released()


# ---- arguments --------------------------------------------------------------

def test_arguments_are_checked(endpoints):
    with upcall.Bus() as bus:
        for bad in ("gzip", "LZ4", "lz4\0", "", "zst\u00e9"):
            with pytest.raises(ValueError, match=r"compression must be None or a codec name "
                                                 r"\('lz4' or 'zstd'\), not "):
                bus.publisher(endpoints("inproc"), compression=bad)
        with pytest.raises(TypeError, match=r"compression must be None or a codec name "
                                            r"\('lz4' or 'zstd'\), not int"):
            bus.publisher(endpoints("inproc"), compression=1)
        with pytest.raises(TypeError, match="copy must be True or False, not str"):
            bus.subscribe(endpoints("inproc"), print, copy="yes")
    # This build has both libraries (make deps installs them).
    assert upcall.COMPRESSION == ("lz4", "zstd")


# ---- the garbage collector, seen from other threads --------------------------

@pytest.mark.parametrize("mode", MODES)
def test_decoding_leaves_the_collector_to_the_application(zctx, endpoints, mode):
    """The decoder may hold the collector off while it builds a large
    payload's objects, but never across a GIL release: a thread that runs
    while a frame is decompressed (without the GIL) sees the collector as
    the application left it (on, then off once it called gc.disable())."""
    import threading
    count = 6
    size = 16 << 20
    block = lz4_block.compress(bytes(size), store_size=False)
    # A payload over 16 KiB (the size from which the decoder defers the
    # collector) and a frame that takes a while to decompress.
    payload = msgpack.packb(["x" * 20_000, _ref(2, size, flags=1)])
    got = []
    changed = []
    stop = threading.Event()
    disable = threading.Event()
    disabled = threading.Event()
    spins = [0, 0]

    def watch():
        expected = True
        while not stop.is_set():
            spins[expected] += 1
            if gc.isenabled() != expected:
                changed.append((len(got), expected))
                # The race the collector's state must not lose: an
                # application that disables it now keeps it disabled.
                gc.disable()
                return
            if expected and disable.is_set():
                gc.disable()        # the application's own decision, mid-stream
                expected = False
                disabled.set()

    assert gc.isenabled()
    watcher = threading.Thread(target=watch)
    try:
        with upcall.Bus() as bus:
            sub = bus.subscribe(endpoints("ipc"), lambda m: got.append(len(m[1])), kind="pull",
                                bind=True, **mode_kwargs(mode))
            pump = make_pump(sub) if mode == "caller" else None
            push = zctx.socket(zmq.PUSH)
            push.linger = 0
            push.connect(sub.last_endpoint)
            watcher.start()
            for phase in (1, 2):
                for _ in range(count):
                    push.send_multipart(marked([b"t", payload, block]))
                wait_for(lambda: (pump() if pump else None) or len(got) == phase * count
                         or changed, what=f"phase {phase}'s messages")
                assert not changed, changed
                if phase == 1:
                    disable.set()
                    assert disabled.wait(DEADLINE)
            stop.set()
            watcher.join(DEADLINE)
            assert not changed, changed
            assert got == [size] * 2 * count
            assert not gc.isenabled()       # the application's gc.disable() held
            assert spins[0] > 0 and spins[1] > 0    # the watcher ran in both phases
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(DEADLINE)
        gc.enable()


# ---- the command line ---------------------------------------------------------

@pytest.mark.parametrize("limit", [None, 200_000])
def test_upcall_listen_bounds_what_a_message_decompresses_to(zctx, endpoints, tmp_path, limit):
    """`upcall listen` has the default bound, and --max-message-size sets
    another: a message over it is skipped with one line naming the reason,
    and the next one is printed."""
    import json
    import subprocess
    import sys
    from helpers import script_env
    ep = endpoints("ipc")
    args = ["--max-message-size", str(limit)] if limit else []
    proc = subprocess.Popen([sys.executable, "-m", "upcall", "listen", ep, "--bind", "--kind",
                             "pull", "--count", "1", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=script_env(), cwd=tmp_path)
    try:
        push = zctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(ep)
        if limit:
            # Each frame is small on the wire and within the limit once
            # decompressed; the two together are not.
            block = lz4_block.compress(TEXT[:150_000], store_size=False)
            push.send_multipart(marked([b"big", msgpack.packb([_ref(2, 150_000, flags=1),
                                                        _ref(3, 150_000, flags=1)]),
                                 block, block]))
        else:
            push.send_multipart(marked([b"big", msgpack.packb([_ref(2, OVER_DEFAULT, flags=1)]),
                                 _ZERO_BLOCK]))
        push.send_multipart(marked([b"next", msgpack.packb(1)]))
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert json.loads(out) == {"topic": "next", "payload": 1}
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("upcall listen: message skipped: "), err
    assert "b'big'" in lines[0] and "Traceback" not in err
    assert (f"max_message_size={limit}" if limit else f"{DEFAULT_BOUND} bytes") in lines[0]


def test_upcall_listen_refuses_a_bad_max_message_size(tmp_path):
    import subprocess
    import sys
    from helpers import script_env
    proc = subprocess.run([sys.executable, "-m", "upcall", "listen", "ipc:///nowhere",
                           "--max-message-size", "0"], capture_output=True, text=True,
                          env=script_env(), cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert "--max-message-size: must be at least 1" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
