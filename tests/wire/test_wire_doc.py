"""The pyzmq + msgpack fragments of docs/wire.md, extracted and run as they
are written there (a fragment's block follows a ``<!-- fragment: <title> -->``
line, which rendered markdown hides)."""
import pathlib
import re
import struct

import msgpack
import pytest
import zmq

WIRE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "wire.md"


def fragment(title):
    """The code block of docs/wire.md after the line `<!-- fragment: <title> -->`."""
    for marker, block in re.findall(r"<!-- fragment: ([^\n]*?) -->\n```python\n(.*?)```",
                                    WIRE.read_text(), re.S):
        if marker == title:
            return block
    raise AssertionError(f"docs/wire.md has no fragment {title!r}")


@pytest.fixture
def pair():
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    pull.bind("inproc://wire-doc")
    push.connect("inproc://wire-doc")
    pull.rcvtimeo = 5000
    yield push, pull
    push.close(0)
    pull.close(0)
    ctx.term()


def test_oob_fragments_send_and_receive(pair):
    push, pull = pair
    sent = {"msgpack": msgpack, "sock": push}
    exec(fragment("send side of an out-of-band reference with pyzmq + msgpack"), sent)
    got = {"msgpack": msgpack, "sock": pull}
    exec(fragment("receive side of an out-of-band reference with pyzmq + msgpack"), got)
    assert isinstance(got["obj"]["blob"], memoryview)
    assert got["obj"]["blob"] == sent["blob"]


@pytest.mark.parametrize("title", [
    "send side of a compressed out-of-band reference with pyzmq + msgpack",
    "send side of a zstd-compressed out-of-band reference with pyzmq + msgpack"])
def test_compressed_oob_fragments_send_and_receive(pair, title):
    push, pull = pair
    sent = {"msgpack": msgpack, "sock": push}
    exec(fragment(title), sent)
    assert len(sent["frame"]) < len(sent["blob"]) // 100
    got = {"msgpack": msgpack, "sock": pull}
    exec(fragment("receive side of an out-of-band reference with pyzmq + msgpack"), got)
    assert got["obj"]["blob"] == sent["blob"]


def test_oob_reader_fragment_keeps_other_ext_codes(pair):
    push, pull = pair
    push.send_multipart([b"t", msgpack.packb([msgpack.ExtType(5, b"x")])])
    got = {"msgpack": msgpack, "sock": pull}
    exec(fragment("receive side of an out-of-band reference with pyzmq + msgpack"), got)
    assert got["obj"] == [msgpack.ExtType(5, b"x")]


def test_coalesced_fragment():
    msgs = [{"i": i} for i in range(5)] + ["x", None]
    body = b"\x01" + b"".join(msgpack.packb(m) for m in msgs)
    payload = b"\xc9" + struct.pack(">I", len(body)) + b"\x7f" + body   # ext 32, code 127
    ns = {"msgpack": msgpack, "payload": payload}
    exec(fragment("receive side of a coalesced message with pyzmq + msgpack"), ns)
    assert ns["msgs"] == msgs
