#!/usr/bin/env python3
"""atheris harness for the subscription path: zmq frames -> C core ->
trampoline -> decoder -> target / on_error.

A pyzmq PUSH peer sends each fuzzed input as one multipart message (1 to 5
frames carved out of the input) to a caller-mode upcall PULL subscription
over ipc, and the harness polls until the core has handed that message over.
Properties, for every input:

* the message reaches either the target (as what unpackb makes of the
  payload, with its topic; in a message that ends with upcall's marker frame,
  its out-of-band references (ext 126) replaced by the frames they name,
  decompressed for an lz4 or zstd one) or on_error with an upcall.DecodeError whose .topic
  is the message's topic, .offset lies within the payload (or is None for a
  frame-count error) and .reason is set; never both, never neither;
* a coalesced payload (ext 127, docs/wire.md) in a marked message instead reaches the target
  as its messages and on_error for each one that does not decode and for
  its fault, if broken: each with the message's topic, each error's offset
  within what on_error gets;
* the stats agree: received, delivered and decode_errors each move by the
  right amount, zmq_received by one, nothing is dropped;
* no crash and no sanitizer report (fuzz/run.sh builds with ASan+UBSan).
"""
import shutil
import sys
import tempfile

import atheris
import lz4.block
import zstandard

with atheris.instrument_imports():
    import upcall
    from upcall import DecodeError
import zmq

_dir = tempfile.mkdtemp(prefix="uc-fuzz-")
ENDPOINT = f"ipc://{_dir}/sub.sock"

got = []
errors = []


def target(topic, msg):
    got.append((topic, msg))


def on_error(exc, raw):
    errors.append((exc, raw))


bus = upcall.Bus()
sub = bus.subscribe(ENDPOINT, target, kind="pull", bind=True, delivery="caller",
                    with_topic=True, on_error=on_error)
zctx = zmq.Context()
push = zctx.socket(zmq.PUSH)
push.setsockopt(zmq.LINGER, 0)
push.connect(ENDPOINT)
expected = dict(sub.stats)


def frames_of(raw):
    fdp = atheris.FuzzedDataProvider(raw)
    n = fdp.ConsumeIntInRange(1, 5)
    frames = [fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 48)) for _ in range(n - 1)]
    frames.append(fdp.ConsumeBytes(fdp.remaining_bytes()))
    return frames


# A marker frame (docs/wire.md, "The marker frame"): exactly WIRE_MARKER, or
# the stamped layout (flags bit 0 set, then stream, sequence and count).
_STAMPED_HEAD = upcall.WIRE_MARKER[:5] + b"\x01" + upcall.WIRE_MARKER[6:]
_STAMPED_SIZE = len(upcall.WIRE_MARKER) + 8 + 8 + 4


# A stamp at the end of a topic frame (docs/wire.md, "Stamps"): cut off
# before the target sees the topic, whoever sent it.
_TOPIC_STAMP_MAGIC = b"\xc1ucs"
_TOPIC_STAMP_SIZE = 8 + 8 + len(_TOPIC_STAMP_MAGIC)


def delivered_topic(topic):
    """The topic a target is given for this topic frame."""
    if len(topic) >= _TOPIC_STAMP_SIZE and topic.endswith(_TOPIC_STAMP_MAGIC):
        return topic[:-_TOPIC_STAMP_SIZE]
    return topic


def is_marked(frames):
    """Whether upcall reads the message's ext 126/127 as its own: only when
    its last frame, after topic and payload, is a marker."""
    if len(frames) < 3:
        return False
    last = frames[-1]
    return last == upcall.WIRE_MARKER or (
        len(last) == _STAMPED_SIZE and last.startswith(_STAMPED_HEAD))


def resolved(obj, frames):
    """unpackb's result with each out-of-band reference replaced by its frame
    (a delivered message had only valid ones), decompressed when its flags
    name a codec (1 lz4, 2 zstd: docs/wire.md)."""
    if isinstance(obj, upcall.ExtType) and obj.code == 126:
        frame = frames[int.from_bytes(obj.data[4:8], "big")]
        size = int.from_bytes(obj.data[8:16], "big")
        if obj.data[1] == 1:
            return lz4.block.decompress(frame, uncompressed_size=size)
        if obj.data[1] == 2:
            return zstandard.ZstdDecompressor().decompress(frame, max_output_size=size)
        return frame
    if isinstance(obj, list):
        return [resolved(x, frames) for x in obj]
    if isinstance(obj, dict):
        return {resolved(k, frames): resolved(v, frames) for k, v in obj.items()}
    return obj


def is_coalesced(payload):
    """The payload is an ext 127 header (the C core splits it)."""
    hdr = {0xc7: 3, 0xc8: 4, 0xc9: 6}.get(payload[0], 2) if payload else 0
    return (bool(payload) and (0xc7 <= payload[0] <= 0xc9 or 0xd4 <= payload[0] <= 0xd8)
            and len(payload) >= hdr and payload[hdr - 1] == 0x7f)


def check_split(topic):
    """A coalesced payload: its messages and its errors, any number of each."""
    for t, _ in got:
        assert t == topic, (t, topic)
    for exc, data in errors:
        assert isinstance(exc, DecodeError) and exc.topic == topic and exc.reason, repr(exc)
        assert exc.offset is None or 0 <= exc.offset <= len(data), (exc.offset, len(data))
        assert str(exc)
    expected["received"] += len(got) + len(errors)
    expected["delivered"] += len(got)
    expected["decode_errors"] += len(errors)
    got.clear()
    errors.clear()


def check_one(topic, payload, frames):
    """Any other payload: exactly one message or one decode error."""
    expected["received"] += 1
    if got:
        assert not errors and len(got) == 1, (got, errors)
        t, msg = got.pop()
        assert t == topic, (t, topic)
        want = upcall.unpackb(payload)
        if is_marked(frames):
            want = resolved(want, frames)
        assert upcall.packb(msg) == upcall.packb(want)
        expected["delivered"] += 1
    else:
        assert len(errors) == 1, errors
        exc, data = errors.pop()
        assert isinstance(exc, DecodeError), repr(exc)
        assert exc.topic == topic, (exc.topic, topic)
        assert exc.reason, repr(exc)
        if exc.reason == "frames":
            assert len(frames) > 16 and exc.offset is None, repr(exc)
        else:
            assert 0 <= exc.offset <= len(payload), (exc.offset, len(payload))
        assert data == payload
        assert str(exc)
        expected["decode_errors"] += 1


def test_one_input(raw):
    frames = frames_of(raw)
    push.send_multipart(frames)
    zmq_messages = expected["zmq_received"] + 1
    for _ in range(3000):
        sub.poll(timeout=0.01, max_messages=1)
        if sub.stats["zmq_received"] == zmq_messages:
            break
    else:
        raise AssertionError("message not received within 30 s")
    while sub.poll(timeout=0):      # the rest of a coalesced payload, batch by batch
        pass
    expected["zmq_received"] = zmq_messages
    topic = delivered_topic(frames[0]) if len(frames) > 1 else b""
    payload = frames[1] if len(frames) > 1 else frames[0]
    if is_marked(frames) and is_coalesced(payload):
        check_split(topic)
    else:
        check_one(topic, payload, frames)
    stats = sub.stats
    for key in ("received", "delivered", "decode_errors", "callback_errors", "dropped",
                "zmq_received"):
        assert stats[key] == expected[key], (key, stats, expected)


def main():
    atheris.Setup(sys.argv, test_one_input)
    try:
        atheris.Fuzz()
    finally:
        push.close()
        zctx.term()
        bus.close()
        shutil.rmtree(_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
