"""Ext codes 126 and 127 from foreign producers.

126 and 127 are msgpack application codes that any producer may use for its
own values.  A subscription reads them as the wire format's out-of-band
reference and coalesced batch only in a message that ends with upcall's
marker frame (docs/wire.md, "The marker frame"): a plain [topic, payload]
message gets them as the plain ``upcall.ExtType`` values the codec returns
for any other code, with no option.  ``extensions=False`` turns the wire's
extensions off even in marked messages.  The producer here is pyzmq +
msgpack, sending the exact bytes.
"""
import asyncio

import msgpack
import pytest
import zmq

import upcall
from helpers import DEADLINE, Collector, pushed_pull, pyzmq_push

END = "end"
# A foreign ext 127 (fixext 1 would not do: the data is 2 bytes, fixext 2):
# shaped like a coalesced batch of version 1 holding the int 5.
FOREIGN_127 = b"\xd5\x7f\x01\x05"
# A foreign ext 126 of one byte: not an out-of-band reference (oob_length).
FOREIGN_126 = b"\xd4\x7e\x07"
# A foreign ext 126 of 16 bytes shaped like a reference to frame 2, in a
# message that has no frame 2 (oob_index).
FOREIGN_126_REF = b"\xd8\x7e" + bytes([1, 0, 0, 0, 0, 0, 0, 2]) + (4).to_bytes(8, "big")


def _exchange(zctx, endpoint, mode, messages, **subscribe_kw):
    """Send each multipart message of ``messages`` from a pyzmq PUSH, then an
    end marker, to a PULL subscription; return (delivered before the end
    marker, the reasons of the decode errors, stats)."""
    with pushed_pull(zctx, endpoint, mode, **subscribe_kw) as (col, errors, sub, pump, push):
        for frames in messages:
            push.send_multipart(frames)
        push.send_multipart([b"t", msgpack.packb(END)])
        ends = (END, msgpack.packb(END))     # decoded, or raw=True
        n = 1
        while not any(e in col.items for e in ends):
            col.wait(n, pump=pump)
            n = len(col.items) + 1
        stats = sub.stats
        push.close()
    items = col.items[:-1]
    return items, [getattr(e, "reason", type(e).__name__) for e in errors], stats


@pytest.mark.parametrize("mode", ["native", "python", "caller"])
def test_foreign_ext_127_default_is_delivered_unchanged(zctx, endpoints, mode):
    """A foreign ext 127 in a plain message, default subscription: the
    ExtType itself (it was read as a batch, the int 5, before the marker)."""
    items, errors, stats = _exchange(zctx, endpoints("ipc"), mode, [[b"t", FOREIGN_127]])
    assert items == [upcall.ExtType(127, b"\x01\x05")] and errors == []
    assert stats["zmq_received"] == stats["received"] == stats["unstamped"] == 2


@pytest.mark.parametrize("mode", ["native", "caller"])
def test_marked_ext_127_is_a_batch(zctx, endpoints, mode):
    """The same bytes with upcall's marker frame: upcall's coalesced batch."""
    items, errors, _ = _exchange(zctx, endpoints("ipc"), mode,
                                 [[b"t", FOREIGN_127, upcall.WIRE_MARKER]])
    assert items == [5] and errors == []


@pytest.mark.parametrize("mode", ["native", "caller"])
def test_foreign_ext_127_plain(zctx, endpoints, mode):
    items, errors, stats = _exchange(zctx, endpoints("ipc"), mode, [[b"t", FOREIGN_127]],
                                     extensions=False)
    assert items == [upcall.ExtType(127, b"\x01\x05")] and errors == []
    assert stats["zmq_received"] == stats["received"] == 2


@pytest.mark.parametrize("payload", [FOREIGN_126, FOREIGN_126_REF])
def test_foreign_ext_126_default_is_delivered_unchanged(zctx, endpoints, payload):
    """A foreign ext 126 in a plain message: the ExtType (before the marker,
    a decode error: oob_length, oob_index)."""
    items, errors, _ = _exchange(zctx, endpoints("ipc"), "native", [[b"t", payload]])
    assert items == [upcall.ExtType(126, payload[2:])] and errors == []


@pytest.mark.parametrize("payload, reason", [(FOREIGN_126, "oob_length"),
                                             (FOREIGN_126_REF, "oob_index")])
def test_marked_ext_126_is_a_reference(zctx, endpoints, payload, reason):
    """With the marker, ext 126 is upcall's reference: these are broken ones."""
    items, errors, _ = _exchange(zctx, endpoints("ipc"), "native",
                                 [[b"t", payload, upcall.WIRE_MARKER]])
    assert items == [] and errors == [reason]


def test_foreign_frames_without_the_marker_are_refused(zctx, endpoints):
    """A foreign message of more frames, no marker: nothing references them
    (oob_unused), however its payload looks; the next is delivered."""
    items, errors, _ = _exchange(zctx, endpoints("ipc"), "native",
                                 [[b"t", FOREIGN_126_REF, b"abcd"], [b"t", b"\x01", b"x"]])
    assert items == [] and errors == ["oob_unused", "oob_unused"]


def test_foreign_values_default_asyncio(zctx, endpoints):
    ep = endpoints("ipc")

    async def main():
        got = []
        with upcall.Bus() as bus:
            async with bus.subscribe_async(ep, kind="pull", bind=True) as asub:
                push = zctx.socket(zmq.PUSH)
                push.linger = 0
                push.connect(asub.last_endpoint)
                push.send_multipart([b"t", FOREIGN_127])
                push.send_multipart([b"t", FOREIGN_126])
                push.send_multipart([b"t", FOREIGN_127, upcall.WIRE_MARKER])
                async for msg in asub:
                    got.append(msg)
                    if len(got) == 3:
                        break
                push.close()
        return got

    got = asyncio.run(asyncio.wait_for(main(), DEADLINE))
    assert got == [upcall.ExtType(127, b"\x01\x05"), upcall.ExtType(126, b"\x07"), 5]


@pytest.mark.parametrize("mode", ["native", "caller"])
def test_foreign_ext_126_plain(zctx, endpoints, mode):
    items, errors, _ = _exchange(
        zctx, endpoints("ipc"), mode,
        [[b"t", FOREIGN_126], [b"t", FOREIGN_126_REF],
         [b"t", msgpack.packb({"a": msgpack.ExtType(126, b"xyz"), "b": [FOREIGN_127]})]],
        extensions=False)
    assert errors == []
    assert items == [upcall.ExtType(126, b"\x07"),
                     upcall.ExtType(126, FOREIGN_126_REF[2:]),
                     {"a": upcall.ExtType(126, b"xyz"), "b": [FOREIGN_127]}]


def test_plain_keeps_the_decoders_options(zctx, endpoints):
    """An upcall.Decoder given with extensions=False decodes with its own
    options (max_len here)."""
    dec = upcall.Decoder(max_len=3)
    items, errors, _ = _exchange(zctx, endpoints("ipc"), "native",
                                 [[b"t", msgpack.packb([1, 2, 3, 4])], [b"t", FOREIGN_126]],
                                 decoder=dec, extensions=False)
    assert items == [upcall.ExtType(126, b"\x07")] and errors == ["max_len"]


def test_plain_refuses_frames_after_the_payload(zctx, endpoints):
    """With the extensions off, nothing can reference a frame after the
    payload: such a message is a decode error (and the next is delivered)."""
    items, errors, _ = _exchange(zctx, endpoints("ipc"), "native",
                                 [[b"t", FOREIGN_126_REF, b"abcd"], [b"t", FOREIGN_127, b"x"]],
                                 extensions=False)
    assert items == [] and errors == ["oob_unused", "oob_unused"]


def test_raw_with_extensions_off_gets_the_payload_unsplit(zctx, endpoints):
    items, errors, _ = _exchange(zctx, endpoints("ipc"), "native", [[b"t", FOREIGN_127]],
                                 raw=True, extensions=False)
    assert items == [FOREIGN_127] and errors == []


def test_extensions_must_be_a_bool():
    with upcall.Bus() as bus:
        with pytest.raises(TypeError, match="extensions must be True or False"):
            bus.subscribe("inproc://x", lambda m: None, extensions=0)


def test_subscribe_async_plain(zctx, endpoints):
    ep = endpoints("ipc")

    async def main():
        got = []
        with upcall.Bus() as bus:
            async with bus.subscribe_async(ep, kind="pull", bind=True,
                                           extensions=False) as asub:
                push = pyzmq_push(zctx, asub.last_endpoint)
                push.send_multipart([b"t", FOREIGN_127])
                push.send_multipart([b"t", FOREIGN_126])
                async for msg in asub:
                    got.append(msg)
                    if len(got) == 2:
                        break
                push.close()
        return got

    got = asyncio.run(asyncio.wait_for(main(), DEADLINE))
    assert got == [upcall.ExtType(127, b"\x01\x05"), upcall.ExtType(126, b"\x07")]


@pytest.mark.parametrize("extensions, expect", [(True, "ext"), (False, "ext")])
def test_synthetic_subscription(extensions, expect):
    """The synthetic source's payloads come with no marker: plain values."""
    from upcall._bus import _synthetic_subscribe
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, col, count=1, payload=FOREIGN_126,
                                   on_error=lambda exc, raw: errors.append(exc.reason),
                                   extensions=extensions)
        sub.wait(DEADLINE)
        sub.close()
    if expect == "ext":
        assert col.items == [upcall.ExtType(126, b"\x07")] and errors == []
    else:
        assert col.items == [] and errors == ["oob_length"]


# Foreign ext 126/127 values in every msgpack ext form, as producers in other
# languages write their own types with these codes (fixext 1/2/4/8/16, ext 8,
# ext 16, ext 32, nested in a map and an array): a default subscription
# delivers each as the ExtType it is (before the marker frame, 6 of these were
# decode errors and the fixext 2 a misread int).
FOREIGN_VALUES = [
    msgpack.ExtType(127, b"\x01"),
    msgpack.ExtType(127, b"\x01\x05"),
    msgpack.ExtType(126, b"\x01\x00\x00\x02"),
    msgpack.ExtType(127, b"\x01\x93\x01\x02\x03\xc0\xc0\xc0"),
    msgpack.ExtType(126, bytes([1, 0, 0, 0, 0, 0, 0, 2]) + (4).to_bytes(8, "big")),
    msgpack.ExtType(127, b"\x01" + b"\x05" * 20),
    msgpack.ExtType(126, b"x" * 300),
    msgpack.ExtType(127, b"\x02" * 70_000),
    {"k": msgpack.ExtType(126, b"\x01" * 16)},
    [1, msgpack.ExtType(127, b"\x01\xc0")],
]


def _as_upcall(value):
    if isinstance(value, msgpack.ExtType):
        return upcall.ExtType(value.code, value.data)
    if isinstance(value, dict):
        return {k: _as_upcall(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_upcall(v) for v in value]
    return value


@pytest.mark.parametrize("mode", ["native", "caller"])
def test_foreign_values_in_every_form_arrive_unchanged(zctx, endpoints, mode):
    items, errors, stats = _exchange(zctx, endpoints("tcp"), mode,
                                     [[b"t", msgpack.packb(v)] for v in FOREIGN_VALUES])
    assert errors == []
    assert items == [_as_upcall(v) for v in FOREIGN_VALUES]
    assert stats["unstamped"] == len(FOREIGN_VALUES) + 1 and stats["lost"] == 0
