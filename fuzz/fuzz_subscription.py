#!/usr/bin/env python3
"""atheris harness for the subscription path: zmq frames -> C core ->
trampoline -> decoder -> target / on_error.

A pyzmq PUSH peer sends each fuzzed input as one multipart message (1 to 5
frames carved out of the input) to a caller-mode upcall PULL subscription
over ipc, and the harness polls until the core has handed that message over.
Properties, for every input:

* the message reaches either the target (as what unpackb makes of the
  payload, its out-of-band references (ext 126) replaced by the frames they
  name, decompressed for an lz4 one, with its topic) or on_error with an upcall.DecodeError whose .topic
  is the message's topic, .offset lies within the payload (or is None for a
  frame-count error) and .reason is set; never both, never neither;
* the stats agree: received, delivered and decode_errors each move by the
  right amount, nothing is dropped;
* no crash and no sanitizer report (fuzz/run.sh builds with ASan+UBSan).
"""
import shutil
import sys
import tempfile

import atheris
import lz4.block

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


def resolved(obj, frames):
    """unpackb's result with each out-of-band reference replaced by its frame
    (a delivered message had only valid ones), decompressed when its flags
    say lz4 (bit 0)."""
    if isinstance(obj, upcall.ExtType) and obj.code == 126:
        frame = frames[int.from_bytes(obj.data[4:8], "big")]
        if obj.data[1] & 1:
            return lz4.block.decompress(frame, uncompressed_size=int.from_bytes(obj.data[8:16], "big"))
        return frame
    if isinstance(obj, list):
        return [resolved(x, frames) for x in obj]
    if isinstance(obj, dict):
        return {resolved(k, frames): resolved(v, frames) for k, v in obj.items()}
    return obj


def test_one_input(raw):
    frames = frames_of(raw)
    push.send_multipart(frames)
    n = 0
    while n == 0:
        n = sub.poll(timeout=30, max_messages=1)
        if n == 0:
            raise AssertionError("message not delivered within 30 s")
    topic = frames[0] if len(frames) > 1 else b""
    payload = frames[1] if len(frames) > 1 else frames[0]
    expected["received"] += 1
    if got:
        assert not errors and len(got) == 1, (got, errors)
        t, msg = got.pop()
        assert t == topic, (t, topic)
        assert upcall.packb(msg) == upcall.packb(resolved(upcall.unpackb(payload), frames))
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
    stats = sub.stats
    for key in ("received", "delivered", "decode_errors", "callback_errors", "dropped"):
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
