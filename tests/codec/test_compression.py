"""Compression of out-of-band frames (publisher(compression=...),
docs/wire.md: ext 126, the codec id in its flags) and subscribe(copy=True):
one suite, every case run for every codec of ``upcall.COMPRESSION``.

Each codec is checked against an independent implementation of its wire
format (tests/codecs_reference.py: the Python package a foreign peer would use), so
that what upcall writes is readable without upcall and what a foreign peer
writes is read.  Real libzmq sockets, pyzmq on the other end where the wire
itself is checked; every wait is on a condition with a deadline."""
import gc
import os
import struct
import threading
import tracemalloc

import msgpack
import pytest
import zmq

import upcall
from upcall import _bus
from codecs_reference import REFERENCE, UNKNOWN_CODEC
from helpers import (DEADLINE, Collector, batch_handler, make_pump, marked,
                     marked_error_then_good, mode_kwargs, pyzmq_push, wait_for)

MODES = ["native", "python", "caller", "executor"]
THRESHOLD = 4096
ZEROS = bytes(1_000_000)
TEXT = b"the quick brown fox jumps over the lazy dog; " * 5000
RANDOM = os.urandom(300_000)
GOOD = msgpack.packb("ok")
DEFAULT_BOUND = 64 * 1024 * 1024
OVER_DEFAULT = DEFAULT_BOUND + 1


@pytest.fixture(params=upcall.COMPRESSION)
def codec(request):
    """Each codec this upcall was built with, by its reference."""
    name = request.param
    assert name in REFERENCE, (f"codec {name!r} has no reference implementation: add its row "
                               "to tests/codecs_reference.py")
    return REFERENCE[name].load()


def _pair(bus, endpoints, transport, target, compression, **kw):
    """A bound PULL subscription and a PUSH publisher connected to it."""
    sub = bus.subscribe(endpoints(transport), target, kind="pull", bind=True, **kw)
    pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, oob_threshold=THRESHOLD,
                        compression=compression)
    return sub, pub


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


# ---- round trips ------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", ["inproc", "ipc", "tcp"])
def test_round_trip_every_mode(codec, endpoints, transport, mode):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, transport, col, codec.name, **mode_kwargs(mode))
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


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_compressible_is_compressed_incompressible_goes_raw(codec, zctx, endpoints, transport):
    frames = _receive_with_pyzmq(zctx, endpoints, transport,
                                 {"zeros": ZEROS, "text": TEXT, "random": RANDOM},
                                 compression=codec.name)
    refs = _refs(frames)
    flags, index, size = refs["zeros"]
    assert flags == codec.wire_id and size == len(ZEROS) and len(frames[index]) < len(ZEROS) // 100
    assert codec.decompress(frames[index], size) == ZEROS
    flags, index, size = refs["text"]
    assert flags == codec.wire_id and size == len(TEXT) and len(frames[index]) < len(TEXT) // 2
    assert codec.decompress(frames[index], size) == TEXT
    flags, index, size = refs["random"]
    assert flags == 0 and size == len(RANDOM) and frames[index] == RANDOM


def test_no_compression_is_the_default(zctx, endpoints):
    frames = _receive_with_pyzmq(zctx, endpoints, "ipc", {"zeros": ZEROS})
    flags, index, size = _refs(frames)["zeros"]
    assert flags == 0 and len(frames[index]) == size == len(ZEROS)


def test_frames_under_10_kb_are_never_compressed(codec, zctx, endpoints):
    # Above the out-of-band threshold, below the compression minimum: raw,
    # however compressible; from 10 kB on, compressed.
    under, at = bytes(10 * 1024 - 1), bytes(10 * 1024)
    frames = _receive_with_pyzmq(zctx, endpoints, "ipc", {"under": under, "at": at},
                                 compression=codec.name)
    refs = _refs(frames)
    flags, index, size = refs["under"]
    assert flags == 0 and len(frames[index]) == size == len(under)
    flags, index, size = refs["at"]
    assert flags == codec.wire_id and size == len(at) and len(frames[index]) < len(at)


def test_compressible_start_incompressible_rest_goes_raw(codec, zctx, endpoints):
    # The samples see part of the zeros, the whole does not shrink enough:
    # sent raw after all.
    value = bytes(20_000) + os.urandom(2_000_000)
    frames = _receive_with_pyzmq(zctx, endpoints, "ipc", {"v": value}, compression=codec.name)
    flags, index, size = _refs(frames)["v"]
    assert flags == 0 and frames[index] == value


def test_each_publisher_its_own_codec(endpoints):
    # Chosen per publisher: one subscriber reads every codec's frames and raw ones.
    col = Collector()
    codecs = (*upcall.COMPRESSION, None)
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True)
        pubs = [bus.publisher(sub.last_endpoint, kind="push", bind=False, compression=c)
                for c in codecs]
        for i, p in enumerate(pubs):
            p.send(b"t", {"i": i, "text": TEXT})
        col.wait(len(codecs))
        assert sorted(m["i"] for m in col.items) == list(range(len(codecs)))
        assert all(m["text"] == TEXT for m in col.items)
        col.items.clear()
    _wait_released()


def test_decompressed_views_are_counted_until_dropped(codec, endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "tcp", col, codec.name)
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


def test_mixed_values_keep_their_order(codec, endpoints):
    col = Collector()
    values = [ZEROS, RANDOM, TEXT, bytes(20_000), os.urandom(50_000), b"x" * 5000]
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "ipc", col, codec.name)
        pub.send(b"t", values)
        col.wait(1)
        assert [bytes(v) for v in col.items[0]] == values
        col.items.clear()
    _wait_released()


def test_compressing_threads_keep_their_own_contexts(codec, endpoints):
    # Publishers on several threads compress at once (each thread with the
    # codec's own state, where it keeps one): every message arrives whole.
    col = Collector()
    n_threads, per_thread = 4, 10
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, compression=codec.name)

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


# ---- the sender's buffers ---------------------------------------------------

@pytest.mark.parametrize("transport", ["inproc", "ipc", "tcp"])
def test_compressed_frames_release_the_buffer_at_once(codec, endpoints, transport):
    col = Collector()
    buf = bytearray(ZEROS)
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, transport, col, codec.name)
        sent = pub.send(b"t", {"z": buf, "t": TEXT}, copy=False)
        assert sent is not None and sent.done      # nothing of the sender's is held
        buf[:4] = b"XXXX"                          # free to change: the frame is a copy
        col.wait(1)
        assert col.items[0]["z"] == ZEROS and col.items[0]["t"] == TEXT
        col.items.clear()
    _wait_released()


def test_raw_frames_of_a_compressing_publisher_are_still_zero_copy(codec, endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "inproc", col, codec.name)
        sent = pub.send(b"t", {"z": ZEROS, "r": RANDOM}, copy=False)
        col.wait(1)
        # On inproc the random value's view is the sender's memory: held.
        assert not sent.done
        col.items.clear()
        gc.collect()
        assert sent.wait(DEADLINE)
    _wait_released()


@pytest.mark.parametrize("oob_threshold", [None, 4096])
def test_compression_turns_out_of_band_frames_on(codec, zctx, endpoints, oob_threshold):
    """Only out-of-band frames are compressed: compression= alone sends
    large values out of band at DEFAULT_OOB_THRESHOLD; an explicit
    oob_threshold still decides which."""
    ep = endpoints("tcp")
    pull = zctx.socket(zmq.PULL)
    pull.bind(ep)
    pull.rcvtimeo = int(DEADLINE * 1000)
    under = b"u" * (upcall.DEFAULT_OOB_THRESHOLD - 1)
    with upcall.Bus() as bus:
        pub = bus.publisher(ep, kind="push", bind=False, compression=codec.name,
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
    assert refs["z"][0] == codec.wire_id and codec.decompress(frames[2], len(ZEROS)) == ZEROS


def test_send_copy_true_with_compression(codec, endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "ipc", col, codec.name)
        assert pub.send(b"t", {"z": ZEROS, "r": RANDOM}, copy=True) is None
        col.wait(1)
        assert col.items[0]["z"] == ZEROS and col.items[0]["r"] == RANDOM
        col.items.clear()
    _wait_released()


# ---- subscribe(copy=True) ---------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compressed", [False, True])
def test_copy_true_delivers_bytes(codec, endpoints, mode, compressed):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "ipc", col, codec.name if compressed else None,
                         copy=True, **mode_kwargs(mode))
        pump = make_pump(sub) if mode == "caller" else None
        pub.send(b"t", {"z": ZEROS, "r": RANDOM, "nested": [TEXT]})
        col.wait(1, pump=pump)
        got = col.items[0]
        assert type(got["z"]) is bytes and got["z"] == ZEROS
        assert type(got["r"]) is bytes and got["r"] == RANDOM
        assert type(got["nested"][0]) is bytes and got["nested"][0] == TEXT
        assert _bus.oob_outstanding()[1] == 0     # no frame held by a view
    _wait_released()


def test_copy_true_on_inproc_and_for_handlers(codec, endpoints):
    h = batch_handler()
    with upcall.Bus() as bus:
        sub, pub = _pair(bus, endpoints, "inproc", h, codec.name, copy=True)
        pub.send(b"t", {"r": RANDOM, "t": TEXT})
        wait_for(lambda: h.got, what="the batch")
        assert type(h.got[0]["r"]) is bytes and h.got[0]["r"] == RANDOM
        assert type(h.got[0]["t"]) is bytes and h.got[0]["t"] == TEXT
    _wait_released()


def test_copy_true_with_subscribe_async(codec, endpoints):
    import asyncio

    async def main():
        with upcall.Bus() as bus:
            asub = bus.subscribe_async(endpoints("ipc"), kind="pull", bind=True, copy=True)
            async with asub:
                pub = bus.publisher(asub.last_endpoint, kind="push", bind=False,
                                    oob_threshold=THRESHOLD, compression=codec.name)
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
@pytest.mark.parametrize("sized", [True, False])
@pytest.mark.parametrize("copy", [False, True])
def test_upcall_reads_a_foreign_frame(codec, zctx, endpoints, transport, sized, copy):
    # A pyzmq peer building the reference per docs/wire.md: the codec's id,
    # size the value's length, the frame the codec's package wrote (with its
    # content size in the header or not, where the format can carry one).
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints(transport), col, kind="pull", bind=True, copy=copy)
        push = pyzmq_push(zctx, sub.last_endpoint)
        push.send_multipart(marked([b"t", msgpack.packb({"blob": _ref(2, len(TEXT),
                                                                      flags=codec.wire_id),
                                                          "raw": _ref(3, 5)}),
                                    codec.compress(TEXT, sized), b"hello"]))
        col.wait(1)
        got = col.items[0]
        assert got["blob"] == TEXT and got["raw"] == b"hello"
        assert isinstance(got["blob"], bytes if copy else memoryview)
        assert sub.stats["decode_errors"] == 0
        del got
        col.items.clear()
    _wait_released()


def test_a_foreign_reader_reads_upcall_frames(codec, zctx, endpoints):
    # The reader of docs/wire.md: msgpack and the codec's package, nothing of upcall's.
    frames = _receive_with_pyzmq(zctx, endpoints, "tcp", {"a": TEXT, "b": ZEROS},
                                 compression=codec.name)

    def ext_hook(code, data):
        version, flags, _, index, size = struct.unpack(">BBHIQ", data)
        assert code == 126 and version == 1 and flags in (0, codec.wire_id)
        if flags == codec.wire_id:
            return codec.decompress(frames[index], size)
        return bytes(frames[index])
    assert msgpack.unpackb(frames[1], ext_hook=ext_hook) == {"a": TEXT, "b": ZEROS}


# ---- malformed references and frames ----------------------------------------

def _malformed(codec, name):
    """The frames of one malformed case, built for codec: [topic, payload, *frames]."""
    c = codec.wire_id
    frame = codec.compress(TEXT)
    unsized = codec.compress(TEXT, sized=False)

    def one(size, *frames, flags=c, index=2):
        return [b"t", msgpack.packb([_ref(index, size, flags=flags)]), *frames]
    return {
        "garbage": one(100_000, b"\xff" * 64),
        "claim_smaller": one(len(TEXT) - 1, frame),
        "claim_larger": one(len(TEXT) + 1, frame),
        # Without a size in the frame: it expands past the claim (the codec
        # stops at the buffer's end), or falls short of it.
        "expands_past_claim": one(1000, unsized),
        "falls_short_of_claim": one(len(TEXT) + 1, unsized),
        "truncated": one(len(TEXT), frame[:-10]),
        "trailing_bytes": one(len(TEXT), frame + b"x"),
        "two_frames": one(2 * len(TEXT), unsized + unsized),
        "corrupt_body": one(len(TEXT), frame[:20] + bytes(b ^ 0x5a for b in frame[20:])),
        "empty_frame": one(10, b""),
        # More than a 4-byte frame can hold: refused before allocating.
        "absurd_size": one(2 ** 40, b"abcd"),
        # A bit outside the codec field, and a codec id past the last one known.
        "bad_flags": one(4, b"abcd", flags=0x10),
        "unknown_codec": one(4, b"abcd", flags=UNKNOWN_CODEC),
        "missing_frame": one(len(TEXT)),
        "bad_index": one(len(TEXT), frame, index=5),
    }[name]


MALFORMED = {
    "garbage": "oob_decompress", "claim_smaller": "oob_decompress",
    "claim_larger": "oob_decompress", "expands_past_claim": "oob_decompress",
    "falls_short_of_claim": "oob_decompress", "truncated": "oob_decompress",
    "trailing_bytes": "oob_decompress", "two_frames": "oob_decompress",
    "corrupt_body": "oob_decompress", "empty_frame": "oob_decompress",
    "absurd_size": "oob_decompress", "bad_flags": "oob_flags", "unknown_codec": "oob_flags",
    "missing_frame": "oob_index", "bad_index": "oob_index",
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("copy", [False, True])
@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_compressed_references_are_decode_errors(codec, zctx, endpoints, mode, copy,
                                                          name):
    items, errors, stats = marked_error_then_good(zctx, endpoints("ipc"), mode,
                                                  _malformed(codec, name), [b"t", GOOD],
                                                  copy=copy)
    assert items == ["ok"]
    assert len(errors) == 1
    exc = errors[0]
    assert isinstance(exc, upcall.DecodeError)
    assert exc.reason == MALFORMED[name], exc
    assert exc.topic == b"t"
    assert exc.offset == 1            # the reference, inside the one-element array
    assert stats["decode_errors"] == 1
    _wait_released()


def test_max_message_size_bounds_the_decompressed_size(codec, zctx, endpoints):
    # The frame is small (TEXT shrinks 200x) but would decompress past the
    # subscription's limit: refused before allocating.
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True,
                            max_message_size=len(TEXT) - 1,
                            on_error=lambda exc, raw: errors.append(exc))
        push = pyzmq_push(zctx, sub.last_endpoint)
        small = TEXT[:50_000]
        push.send_multipart(marked([b"t",
                                    msgpack.packb([_ref(2, len(TEXT), flags=codec.wire_id)]),
                                    codec.compress(TEXT)]))
        push.send_multipart(marked([b"t",
                                    msgpack.packb([_ref(2, len(small), flags=codec.wire_id)]),
                                    codec.compress(small)]))
        col.wait(1)
        assert [bytes(v) for v in col.items[0]] == [small]
        assert [e.reason for e in errors] == ["message_size"]
        assert f"max_message_size={len(TEXT) - 1}" in str(errors[0])
        del col.items[:]
    _wait_released()


# ---- the decompressed size of a whole message --------------------------------

def test_default_bound_is_64_mib():
    assert upcall.DEFAULT_MAX_DECOMPRESSED == DEFAULT_BOUND


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("copy", [False, True])
def test_default_settings_refuse_a_frame_that_expands_past_the_bound(codec, zctx, endpoints, mode,
                                                                      copy):
    # No max_message_size: a real frame a little over the default bound,
    # small on the wire (64 MiB of zeros), may not make the subscriber
    # allocate more than DEFAULT_MAX_DECOMPRESSED.
    frame = codec.compress(bytes(OVER_DEFAULT))
    assert len(frame) < OVER_DEFAULT // 200
    bad = [b"t", msgpack.packb([_ref(2, OVER_DEFAULT, flags=codec.wire_id)]), frame]
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
def test_default_bound_is_for_the_sum_of_the_frames(codec, zctx, endpoints, mode):
    # 13 frames (as many as a message carries), each well under the bound,
    # together over it: refused, whatever each frame is.
    n = upcall.MAX_OOB_FRAMES
    part = DEFAULT_BOUND // (n - 1)
    frame = codec.compress(bytes(part))
    refs = [_ref(2 + i, part, flags=codec.wire_id) for i in range(n)]
    bad = [b"t", msgpack.packb(refs)] + [frame] * n
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
def test_max_message_size_bounds_the_sum_of_the_frames(codec, zctx, endpoints, copy):
    # max_message_size=1 MB: each frame passes libzmq's per-frame check and
    # decompresses to 100 kB; 13 of them are 1.3 MB once decompressed, 9 are
    # within.
    limit = 1_000_000
    part = TEXT[:100_000]
    frame = codec.compress(part)
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True, copy=copy,
                            max_message_size=limit, on_error=lambda exc, raw: errors.append(exc))
        push = pyzmq_push(zctx, sub.last_endpoint)
        for n in (13, 9):
            refs = [_ref(2 + i, len(part), flags=codec.wire_id) for i in range(n)]
            push.send_multipart(marked([b"t", msgpack.packb(refs)] + [frame] * n))
        col.wait(1)
        assert len(col.items[0]) == 9 and all(bytes(v) == part for v in col.items[0])
        assert [e.reason for e in errors] == ["message_size"]
        assert f"max_message_size={limit}" in str(errors[0])
        assert sub.stats["decode_errors"] == 1
        del col.items[:]
    _wait_released()


def test_max_message_size_counts_raw_frames_and_the_payload_too(codec, zctx, endpoints):
    # With max_message_size, the whole message once decompressed: payload,
    # raw frames and decompressed frames together (each within the limit,
    # which libzmq checks frame by frame).
    limit = 300_000
    raw = b"r" * 150_000
    frame = codec.compress(TEXT[:100_000])
    c = codec.wire_id
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True,
                            max_message_size=limit, on_error=lambda exc, raw: errors.append(exc))
        push = pyzmq_push(zctx, sub.last_endpoint)
        # 150 kB raw + 100 kB decompressed + a 60 kB payload: over.
        push.send_multipart(marked([b"t", msgpack.packb([_ref(2, len(raw)),
                                                         _ref(3, 100_000, flags=c),
                                                         "p" * 60_000]), raw, frame]))
        # Two raw frames of 150 kB: over, no decompression involved.
        push.send_multipart(marked([b"t", msgpack.packb([_ref(2, len(raw)), _ref(3, len(raw))]),
                                    raw, raw]))
        # 150 kB raw + 100 kB decompressed + a small payload: within.
        push.send_multipart(marked([b"t", msgpack.packb([_ref(2, len(raw)),
                                                         _ref(3, 100_000, flags=c)]),
                                    raw, frame]))
        col.wait(1)
        assert [bytes(v) for v in col.items[0]] == [raw, TEXT[:100_000]]
        assert [e.reason for e in errors] == ["message_size", "message_size"]
        del col.items[:]
    _wait_released()


CLAIM = 100_000_000           # within the subscription's limit below


@pytest.mark.parametrize("sized", [True, False])
def test_a_claim_the_frame_cannot_reach_allocates_nothing(codec, zctx, endpoints, sized):
    # A subscription that allows large messages, a 1 MB frame (declaring its
    # size, or small enough that the codec's format bounds it) claiming
    # 100 MB: refused before the 100 MB are allocated.  With copy=True the
    # allocation would be a bytes object, which tracemalloc sees on any
    # thread; the peak stays far under the claim.
    frame = codec.compress(bytes(1_000_000), sized)
    assert codec.most_from(frame, sized) < CLAIM // 10
    errors = []
    col = Collector()
    tracemalloc.start()
    try:
        with upcall.Bus() as bus:
            sub = bus.subscribe(endpoints("ipc"), col, kind="pull", bind=True, copy=True,
                                max_message_size=2 * CLAIM,
                                on_error=lambda exc, raw: errors.append(exc))
            push = pyzmq_push(zctx, sub.last_endpoint)
            tracemalloc.reset_peak()
            push.send_multipart(marked([b"t",
                                        msgpack.packb([_ref(2, CLAIM, flags=codec.wire_id)]),
                                        frame]))
            push.send_multipart([b"t", GOOD])
            col.wait(1)
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert col.items == ["ok"]
    assert [e.reason for e in errors] == ["oob_decompress"], errors
    assert peak < CLAIM // 10, peak
    _wait_released()


@pytest.mark.parametrize("copy", [False, True])
def test_decoder_max_len_applies_to_decompressed_values(codec, zctx, endpoints, copy):
    # Decoder(max_len=...) bounds a value out of band as one inline: by its
    # size as delivered, refused before decompressing.
    bad = [b"t", msgpack.packb([_ref(2, len(TEXT), flags=codec.wire_id)]), codec.compress(TEXT)]
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
        push = pyzmq_push(zctx, sub.last_endpoint)
        push.send_multipart(marked(bad))
        col.wait(1)
        assert bytes(col.items[0][0]) == TEXT
        del col.items[:]
    _wait_released()


# ---- arguments --------------------------------------------------------------

def test_arguments_are_checked(endpoints):
    names = r" or ".join(repr(n) for n in REFERENCE)
    with upcall.Bus() as bus:
        for bad in ("gzip", "LZ4", "lz4\0", "", "zst\u00e9", "zstandard"):
            with pytest.raises(ValueError, match=r"compression must be None or a codec name "
                                                 r"\(%s\), not " % names):
                bus.publisher(endpoints("inproc"), compression=bad, bind=True)
        with pytest.raises(TypeError, match=r"compression must be None or a codec name "
                                            r"\(%s\), not int" % names):
            bus.publisher(endpoints("inproc"), compression=1, bind=True)
        with pytest.raises(TypeError, match="copy must be True or False, not str"):
            bus.subscribe(endpoints("inproc"), print, copy="yes")
        for name in upcall.COMPRESSION:
            bus.publisher(endpoints("inproc"), compression=name, bind=True).close()
    # This build has every codec's library (make deps installs them).
    assert upcall.COMPRESSION == tuple(REFERENCE)


# ---- the garbage collector, seen from other threads --------------------------

@pytest.mark.parametrize("mode", MODES)
def test_decoding_leaves_the_collector_to_the_application(codec, zctx, endpoints, mode):
    """The decoder may hold the collector off while it builds a large
    payload's objects, but never across a GIL release: a thread that runs
    while a frame is decompressed (without the GIL) sees the collector as
    the application left it (on, then off once it called gc.disable())."""
    count = 6
    size = 16 << 20
    frame = codec.compress(bytes(size))
    # A payload over 16 KiB (the size from which the decoder defers the
    # collector) and a frame that takes a while to decompress.
    payload = msgpack.packb(["x" * 20_000, _ref(2, size, flags=codec.wire_id)])
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
            push = pyzmq_push(zctx, sub.last_endpoint)
            watcher.start()
            for phase in (1, 2):
                for _ in range(count):
                    push.send_multipart(marked([b"t", payload, frame]))
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
def test_upcall_listen_bounds_what_a_message_decompresses_to(codec, zctx, endpoints, tmp_path,
                                                             limit):
    """`upcall listen` has the default bound, and --max-message-size sets
    another: a message over it is skipped with one line naming the reason,
    and the next one is printed."""
    import json
    import subprocess
    import sys
    from helpers import script_env
    ep = endpoints("ipc")
    c = codec.wire_id
    args = ["--max-message-size", str(limit)] if limit else []
    proc = subprocess.Popen([sys.executable, "-m", "upcall", "listen", ep, "--bind", "--kind",
                             "pull", "--count", "1", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=script_env(), cwd=tmp_path)
    try:
        push = pyzmq_push(zctx, ep)
        if limit:
            # Each frame is small on the wire and within the limit once
            # decompressed; the two together are not.
            frame = codec.compress(TEXT[:150_000])
            push.send_multipart(marked([b"big", msgpack.packb([_ref(2, 150_000, flags=c),
                                                               _ref(3, 150_000, flags=c)]),
                                        frame, frame]))
        else:
            push.send_multipart(marked([b"big", msgpack.packb([_ref(2, OVER_DEFAULT, flags=c)]),
                                        codec.compress(bytes(OVER_DEFAULT))]))
        push.send_multipart([b"next", msgpack.packb(1)])
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
