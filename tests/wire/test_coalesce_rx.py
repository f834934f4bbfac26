"""Receiving coalesced messages (docs/wire.md, "Coalesced messages").

A coalesced payload (ext 127: ``c9 <u32 length> 7f 01 <msgpack>...``) is
split by the C core while it drains the socket: every kind of target sees
one message at a time, in order, in the usual batches (a payload may
straddle two), ``received`` counts messages and ``zmq_received`` zmq
messages.  A payload broken in the middle delivers the messages before the
fault, then one decode error with the fault's offset in the payload.

Payloads are built here with msgpack exactly as the wire doc describes and
sent from pyzmq (ipc, tcp) or, on inproc (one zmq context), with
``Publisher.send_packed``.  Real sockets; every wait is on a condition.
"""
import struct

import msgpack
import pytest
import zmq

import upcall
from upcall.handler import Handler
from upcall.native import Count, FieldFilter, NativeHandler
from helpers import (DEADLINE, MODES, PROBE, STATS_KEYS, Collector, make_pump, mode_kwargs,
                     pyzmq_push, wait_for)

ALL_MODES = MODES + ["executor"]


def coalesced(msgs=(), *, version=1, body=None):
    """The wire form: ext 32, code 127, the version byte, the messages packed
    back to back (or ``body``, raw bytes, in their place)."""
    if body is None:
        body = b"".join(msgpack.packb(m) for m in msgs)
    data = bytes([version]) + body
    return b"\xc9" + struct.pack(">I", len(data)) + b"\x7f" + data


class Peer:
    """Sends [topic, payload] into a bound PULL subscription: pyzmq over ipc
    and tcp, upcall's own PUSH on inproc (pyzmq's context cannot reach it)."""

    def __init__(self, bus, zctx, sub, transport):
        if transport == "inproc":
            pub = bus.publisher(sub.last_endpoint, kind="push", bind=False)
            self.send = lambda topic, payload: _send_marked(pub, topic, payload)
        else:
            push = pyzmq_push(zctx, sub.last_endpoint)
            # upcall's marker frame: the payloads here are upcall's own
            # coalesced batches (docs/wire.md, "The marker frame").
            self.send = lambda topic, payload: push.send_multipart(
                [topic, payload, upcall.WIRE_MARKER])


def _send_marked(pub, topic, payload):
    """On inproc (which pyzmq cannot reach) an upcall publisher sends the
    messages of a coalesced payload with send_many: the same batch, marked."""
    if payload[:1] == b"\xc9" and payload[5:7] == b"\x7f\x01":
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(payload[7:])
        pub.send_many(topic, list(unpacker))
    else:
        pub.send_packed(topic, payload)


def open_pair(bus, zctx, endpoints, transport, target, mode, **kw):
    kw.update(mode_kwargs(mode))
    sub = bus.subscribe(endpoints(transport), target, kind="pull", bind=True, **kw)
    pump = make_pump(sub) if mode == "caller" else None
    return sub, Peer(bus, zctx, sub, transport), pump


def settled(sub):
    """The counters once nothing is out: received is the sum of the rest."""
    s = sub.stats
    assert STATS_KEYS <= set(s)
    assert s["received"] == (s["delivered"] + s["filtered"] + s["decode_errors"]
                             + s["callback_errors"] + s["dropped"]), s
    return s


def wait_received(sub, n, pump=None):
    def done():
        if pump is not None:
            pump()
        s = sub.stats
        return s["received"] >= n and s["received"] == (
            s["delivered"] + s["filtered"] + s["decode_errors"] + s["callback_errors"] + s["dropped"])
    wait_for(done, what=lambda: "%d messages settled: %s" % (n, sub.stats))


# ---- splitting, in order, in batches ---------------------------------------

@pytest.mark.parametrize("transport", ["inproc", "ipc", "tcp"])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_split_in_order_in_batches(zctx, endpoints, transport, mode):
    """Three coalesced payloads of 10 and a plain message, batch=3: every
    message on its own, in order, with its topic; each payload straddles
    batches."""
    col = Collector()
    with upcall.Bus() as bus:
        sub, peer, pump = open_pair(bus, zctx, endpoints, transport, col, mode,
                                    batch=3, with_topic=True)
        sent = []
        for k in range(3):
            msgs = [{"k": k, "i": i, "s": "x" * i} for i in range(10)]
            peer.send(b"t%d" % k, coalesced(msgs))
            sent += [(b"t%d" % k, m) for m in msgs]
        peer.send(b"plain", msgpack.packb("last"))
        sent.append((b"plain", "last"))
        col.wait(len(sent), pump=pump)
        assert col.items == sent
        s = settled(sub)
        assert (s["received"], s["delivered"], s["zmq_received"]) == (31, 31, 4)
        assert s["batches"] >= 11          # at most 3 a batch


@pytest.mark.parametrize("mode", ALL_MODES)
def test_batches_never_exceed_the_batch_size(zctx, endpoints, mode):
    """A batch Handler's lists: at most `batch` messages, payloads straddling."""
    class Lists(Handler):
        def __init__(self):
            self.batches = True
            self.lists = []

        def on_batch(self, msgs):
            self.lists.append(list(msgs))

    h = Lists()
    with upcall.Bus() as bus:
        sub, peer, pump = open_pair(bus, zctx, endpoints, "ipc", h, mode, batch=3)
        for k in range(4):
            peer.send(b"t", coalesced(range(10 * k, 10 * k + 10)))
        wait_received(sub, 40, pump)
        assert [m for lst in h.lists for m in lst] == list(range(40))
        assert all(1 <= len(lst) <= 3 for lst in h.lists), h.lists
        assert settled(sub)["zmq_received"] == 4


def test_caller_mode_max_messages_splits_across_polls(zctx, endpoints):
    """poll(max_messages=2) takes two messages of a coalesced payload at a
    time; the rest waits in the core for the next poll."""
    col = Collector()
    with upcall.Bus() as bus:
        sub, peer, _ = open_pair(bus, zctx, endpoints, "ipc", col, "caller", batch=3)
        peer.send(b"t", coalesced(range(7)))
        taken = []
        wait_for(lambda: taken.append(sub.poll(timeout=0.05, max_messages=2)) or sum(taken) >= 7)
        assert max(taken) <= 2
        assert col.items == list(range(7))
        s = settled(sub)
        assert (s["received"], s["zmq_received"]) == (7, 1)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_empty_coalesced_payload_delivers_and_counts_nothing(zctx, endpoints, mode):
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub, peer, pump = open_pair(bus, zctx, endpoints, "ipc", col, mode,
                                    on_error=lambda exc, raw: errors.append(exc))
        peer.send(b"t", coalesced([]))
        peer.send(b"t", b"\xd4\x7f\x01")               # fixext 1: the version alone
        peer.send(b"t", msgpack.packb("after"))
        col.wait(1, pump=pump)
        wait_for(lambda: sub.stats["zmq_received"] == 3)
        assert col.items == ["after"] and errors == []
        s = settled(sub)
        assert (s["received"], s["delivered"], s["decode_errors"]) == (1, 1, 0)


# ---- faults ----------------------------------------------------------------

GOOD3 = b"".join(msgpack.packb(m) for m in ({"a": 1}, "two", 3))   # 4 + 4 + 1 bytes
HDR = 7                                                            # c9 len 7f 01

FAULTS = [
    # name, payload, delivered before the fault, reason, offset
    ("truncated", coalesced(body=GOOD3 + b"\xcd\x01"), [{"a": 1}, "two", 3], "truncated", HDR + 9),
    ("cut_str", coalesced(body=GOOD3 + b"\xa5ab"), [{"a": 1}, "two", 3], "length", HDR + 9),
    ("reserved", coalesced(body=GOOD3[:8] + b"\xc1" + GOOD3[8:]), [{"a": 1}, "two"], "reserved", HDR + 8),
    ("version", coalesced(body=GOOD3, version=2), [], "batch_version", 6),
    ("no_version", b"\xc9\x00\x00\x00\x00\x7f", [], "batch_length", 6),
    ("trailing", coalesced(body=GOOD3) + b"\xc0", [{"a": 1}, "two", 3], "batch_length", HDR + 9),
    ("frame_short", coalesced(body=GOOD3 + b"\x04")[:-1], [{"a": 1}, "two", 3], "batch_length", HDR + 9),
]


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("name,payload,before,reason,offset", FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_mid_payload(zctx, endpoints, mode, name, payload, before, reason, offset):
    """The messages before the fault, then one decode error naming the
    fault's offset in the zmq payload (on_error gets the whole payload),
    then the next zmq message."""
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub, peer, pump = open_pair(bus, zctx, endpoints, "ipc", col, mode, batch=2,
                                    on_error=lambda exc, raw: errors.append((exc, raw)))
        peer.send(b"t", payload)
        peer.send(b"t", coalesced(["next", "one"]))
        col.wait(len(before) + 2, pump=pump)
        wait_received(sub, len(before) + 3, pump)
        assert col.items == before + ["next", "one"]
        assert len(errors) == 1
        exc, raw = errors[0]
        assert isinstance(exc, upcall.DecodeError)
        assert (exc.reason, exc.offset, exc.topic) == (reason, offset, b"t"), exc
        assert raw == payload
        s = settled(sub)
        assert (s["received"], s["decode_errors"], s["zmq_received"]) == (len(before) + 3, 1, 2)


UNDECODABLE = [
    ("utf8", b"\xa2\xff\xfe"),                               # str 2, not UTF-8
    ("depth", b"\x91" * 2000 + b"\xc0"),                      # deeper than max_depth
    ("timestamp", b"\xd7\xff" + b"\xff" * 8),                 # nanoseconds > 999999999
]


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("reason,bad", UNDECODABLE, ids=[u[0] for u in UNDECODABLE])
def test_message_that_skips_but_does_not_decode(zctx, endpoints, mode, reason, bad):
    """One message whose structure is whole but that does not decode: an
    ordinary decode error for that one (offset and raw payload its own), the
    others delivered."""
    col = Collector()
    errors = []
    body = msgpack.packb(1) + bad + msgpack.packb(3)
    with upcall.Bus() as bus:
        sub, peer, pump = open_pair(bus, zctx, endpoints, "ipc", col, mode,
                                    on_error=lambda exc, raw: errors.append((exc, raw)))
        peer.send(b"t", coalesced(body=body))
        col.wait(2, pump=pump)
        wait_received(sub, 3, pump)
        assert col.items == [1, 3]
        (exc, raw), = errors
        assert exc.reason == reason and raw == bad
        assert 0 <= exc.offset < len(bad)
        s = settled(sub)
        assert (s["delivered"], s["decode_errors"]) == (2, 1)


def test_frames_after_a_coalesced_payload_are_refused(zctx, endpoints):
    """Out-of-band frames with a coalesced payload: not supported by this
    version, one decode error (batch_oob, no offset), nothing delivered."""
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub, peer, _ = open_pair(bus, zctx, endpoints, "ipc", col, "native",
                                 on_error=lambda exc, raw: errors.append(exc))
        push = pyzmq_push(zctx, sub.last_endpoint)
        ref = msgpack.ExtType(126, struct.pack(">BBHIQ", 1, 0, 0, 2, 4))
        push.send_multipart([b"t", coalesced([{"v": ref}, 2]), b"abcd", upcall.WIRE_MARKER])
        push.send_multipart([b"t", msgpack.packb("ok")])
        col.wait(1)
        wait_received(sub, 2)
        assert col.items == ["ok"]
        (exc,) = errors
        assert (exc.reason, exc.offset) == ("batch_oob", None)


def test_ext127_nested_stays_an_exttype(zctx, endpoints):
    """Only the whole payload is split: an ext 127 inside a message is an
    ordinary ExtType, in a plain payload and in a coalesced one."""
    col = Collector()
    inner = msgpack.ExtType(127, b"\x01\xc0")
    with upcall.Bus() as bus:
        sub, peer, _ = open_pair(bus, zctx, endpoints, "ipc", col, "native")
        peer.send(b"t", msgpack.packb({"x": inner}))
        peer.send(b"t", coalesced([[inner], 2]))
        col.wait(3)
        assert col.items == [{"x": upcall.ExtType(127, b"\x01\xc0")},
                             [upcall.ExtType(127, b"\x01\xc0")], 2]


# ---- every kind of target --------------------------------------------------

@pytest.mark.parametrize("mode", ALL_MODES)
def test_handler_sees_each_message(zctx, endpoints, mode):
    class Rec(Handler):
        def __init__(self):
            self.got = []

        def on_message(self, m):
            self.got.append(m)

    h = Rec()
    with upcall.Bus() as bus:
        sub, peer, pump = open_pair(bus, zctx, endpoints, "tcp", h, mode, batch=3)
        peer.send(b"t", coalesced(range(10)))
        peer.send(b"t", coalesced(range(10, 12)))
        wait_received(sub, 12, pump)
        assert h.got == list(range(12))


@pytest.mark.parametrize("mode", ALL_MODES)
def test_native_handlers_see_each_message(zctx, endpoints, mode):
    """Count counts messages (a fault counts as one: it is examined, never
    selected); FieldFilter selects among the messages of a payload."""
    count = Count()
    col = Collector()
    ff = FieldFilter("i", ge=5, target=col)
    maps = [{"i": i} for i in range(10)]
    with upcall.Bus() as bus:
        sub1, peer1, pump1 = open_pair(bus, zctx, endpoints, "ipc", count, mode, batch=3)
        sub2, peer2, pump2 = open_pair(bus, zctx, endpoints, "ipc", ff, mode, batch=3)
        for peer in (peer1, peer2):
            peer.send(b"t", coalesced(maps))
            peer.send(b"t", coalesced(maps[:2], version=9))     # a fault: batch_version
        wait_received(sub1, 11, pump1)
        wait_received(sub2, 11, pump2)
        assert count.messages == 11
        assert count.bytes == sum(len(msgpack.packb(m)) for m in maps)   # a fault's payload is empty
        assert col.items == maps[5:]
        assert (ff.matched, ff.errors) == (5, 1)
        s1, s2 = settled(sub1), settled(sub2)
        assert (s1["filtered"], s1["zmq_received"]) == (11, 2)
        assert (s2["delivered"], s2["filtered"]) == (5, 6)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_raw_payloads_are_the_messages(zctx, endpoints, mode):
    col = Collector()
    with upcall.Bus() as bus:
        sub, peer, pump = open_pair(bus, zctx, endpoints, "ipc", col, mode, raw=True)
        peer.send(b"t", coalesced([1, "two", {"t": 3}]))
        col.wait(3, pump=pump)
        assert col.items == [msgpack.packb(1), msgpack.packb("two"), msgpack.packb({"t": 3})]


# ---- the counters ----------------------------------------------------------

@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("kind", ["callable", "handler", "batch-handler", "native"])
def test_stats_invariant_with_coalesced_input(zctx, endpoints, mode, kind):
    """Good messages, target errors, a malformed message and a payload cut in
    the middle, then a StopDelivery in the middle of a split payload: every
    message received ends in exactly one counter."""
    def consume(m):
        if m == "boom":
            raise ValueError("boom")
        if m == "stop":
            raise upcall.StopDelivery

    class H(Handler):
        def on_message(self, m):
            consume(m)

    class B(Handler):
        def __init__(self):
            self.batches = True

        def on_batch(self, msgs):
            if "stop" in msgs:
                raise upcall.StopDelivery
            for m in msgs:
                consume(m)

    target = {"callable": consume, "handler": H(), "batch-handler": B(),
              "native": NativeHandler(consume)}[kind]
    errors = []
    with upcall.Bus() as bus:
        sub, peer, pump = open_pair(bus, zctx, endpoints, "ipc", target, mode, batch=3,
                                    on_error=lambda exc, raw: errors.append(exc))
        peer.send(b"t", coalesced([1, "boom", 2, 3, "boom"]))
        peer.send(b"t", coalesced(body=msgpack.packb(4) + b"\xa2\xff\xfe" + msgpack.packb(5)))
        peer.send(b"t", coalesced(body=msgpack.packb(6) + b"\xcd\x01"))
        wait_received(sub, 5 + 3 + 2, pump)
        s = settled(sub)
        assert s["zmq_received"] == 3
        assert s["decode_errors"] == 2
        if kind == "batch-handler":     # an on_batch error counts its whole list
            assert s["callback_errors"] >= 2
        else:
            assert s["callback_errors"] == 2
        before = s["received"]
        peer.send(b"t", coalesced([7, 8, "stop", 9, 10, 11, 12]))
        wait_for(lambda: sub.closed or (pump is not None and pump()))
        s = settled(sub)
        assert s["zmq_received"] == 4
        assert before < s["received"] <= before + 7


# ---- unchanged: the uncoalesced path with pyzmq, both ways -----------------

@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_uncoalesced_interop_both_directions(zctx, endpoints, transport):
    """Plain [topic, msgpack] from pyzmq is one message per zmq message, and
    what upcall publishes is plain msgpack a pyzmq reader decodes."""
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints(transport), col, kind="pull", bind=True, with_topic=True)
        push = pyzmq_push(zctx, sub.last_endpoint)
        for i in range(5):
            push.send_multipart([b"t", msgpack.packb({"i": i})])
        col.wait(5)
        assert col.items == [(b"t", {"i": i}) for i in range(5)]
        s = settled(sub)
        assert s["received"] == s["zmq_received"] == 5

        pull = zctx.socket(zmq.PULL)
        pull.rcvtimeo = int(DEADLINE * 1000)
        ep = endpoints(transport)
        pull.bind(ep)
        pub = bus.publisher(ep, kind="push", bind=False)
        pub.send(b"u", {"px": 1.5})
        topic, payload = pull.recv_multipart()
        assert topic == b"u" and msgpack.unpackb(payload) == {"px": 1.5}
        pull.close(linger=0)


# ---- SUB filtering and asyncio ---------------------------------------------

def test_sub_prefix_filtering_applies_to_the_whole_payload(zctx, endpoints):
    """One topic per coalesced message: a SUB socket filters it whole."""
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("ipc"), col, kind="sub", bind=True, topics=[b"a."],
                            with_topic=True)
        pub = zctx.socket(zmq.PUB)
        pub.linger = 0
        pub.connect(sub.last_endpoint)
        wait_for(lambda: pub.send_multipart([b"a.probe", msgpack.packb(PROBE)]) or col.probes,
                 what="the SUB socket subscribed")
        pub.send_multipart([b"b.x", coalesced(["no"] * 5), upcall.WIRE_MARKER])
        pub.send_multipart([b"a.x", coalesced(["yes", 1, 2]), upcall.WIRE_MARKER])
        col.wait(3)
        wait_received(sub, 3)
        assert col.items == [(b"a.x", "yes"), (b"a.x", 1), (b"a.x", 2)]
        # every zmq message one message (the probes) but a.x's three; b.x
        # never reached the core
        s = settled(sub)
        assert s["received"] - s["zmq_received"] == 2, s


def test_asyncio_iteration_sees_each_message(zctx, endpoints):
    import asyncio

    async def main():
        with upcall.Bus() as bus:
            sub = bus.subscribe_async(endpoints("ipc"), kind="pull", bind=True, batch=3)
            push = pyzmq_push(zctx, sub.last_endpoint)
            push.send_multipart([b"t", coalesced(range(10)), upcall.WIRE_MARKER])
            push.send_multipart([b"t", msgpack.packb(10)])
            got = []
            async for m in sub:
                got.append(m)
                if len(got) == 11:
                    break
            assert got == list(range(11))
            s = sub.stats
            assert (s["received"], s["zmq_received"]) == (11, 2)
            await sub.aclose()
    asyncio.run(asyncio.wait_for(main(), DEADLINE))


# ---- with_topic: one topic object per zmq message ---------------------------

# A large topic over many one-byte messages: a copy of the topic per message
# would take 100 kB each.
BIG_TOPIC = b"T" * 100_000
OTHER_TOPIC = b"U" * 100_000


class _TopicHandler(Handler):
    def __init__(self, batches):
        self.batches = batches
        self.items = []

    def on_topic_message(self, topic, msg):
        self.items.append((topic, msg))

    def on_batch(self, msgs):
        self.items.extend(msgs)


def _check_shared_topics(items, n):
    assert [m for _, m in items] == list(range(n)) * 2 + ["plain"]
    first, second = items[:n], items[n:2 * n]
    assert all(t == BIG_TOPIC for t, _ in first) and all(t == OTHER_TOPIC for t, _ in second)
    # Every message split from one zmq message has the same topic object,
    # across the batches the payload straddles.
    assert len({id(t) for t, _ in first}) == 1
    assert len({id(t) for t, _ in second}) == 1
    assert items[-1][0] == BIG_TOPIC


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("target", ["callable", "handler", "batch_handler"])
def test_split_messages_share_one_topic_object(zctx, endpoints, mode, target):
    n = 50
    col = Collector() if target == "callable" else _TopicHandler(target == "batch_handler")
    with upcall.Bus() as bus:
        sub, peer, pump = open_pair(bus, zctx, endpoints, "ipc", col, mode, batch=7,
                                    with_topic=True)
        peer.send(BIG_TOPIC, coalesced(range(n)))
        peer.send(OTHER_TOPIC, coalesced(range(n)))
        peer.send(BIG_TOPIC, msgpack.packb("plain"))
        wait_received(sub, 2 * n + 1, pump)
        _check_shared_topics(col.items, n)


def test_split_messages_share_one_topic_object_asyncio(zctx, endpoints):
    import asyncio
    n = 50

    async def main():
        with upcall.Bus() as bus:
            sub = bus.subscribe_async(endpoints("ipc"), kind="pull", bind=True, batch=7,
                                      with_topic=True)
            push = pyzmq_push(zctx, sub.last_endpoint)
            push.send_multipart([BIG_TOPIC, coalesced(range(n)), upcall.WIRE_MARKER])
            push.send_multipart([OTHER_TOPIC, coalesced(range(n)), upcall.WIRE_MARKER])
            push.send_multipart([BIG_TOPIC, msgpack.packb("plain")])
            got = []
            async for item in sub:
                got.append(item)
                if len(got) == 2 * n + 1:
                    break
            _check_shared_topics(got, n)
            await sub.aclose()
    asyncio.run(asyncio.wait_for(main(), DEADLINE))
