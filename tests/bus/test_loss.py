"""Loss you can see: stamped streams (publisher(stamp=True)), what a
subscriber counts of them (lost, gaps, reordered, duplicates, streams), gap
events, and the bound on the streams a subscription tracks (docs/wire.md,
"Stamps").  Real sockets; foreign stamps are written by pyzmq to make the
cases a single TCP connection never produces (gaps in given places,
reordering, duplicates, invented stream ids)."""
import asyncio
import logging
import struct
import threading

import msgpack
import pytest
import zmq

import upcall
from helpers import DEADLINE, Collector, wait_for


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def stamp(stream, seq, count=1):
    """A stamped marker frame, as docs/wire.md spells it."""
    return b"\xc1ucw\x01\x01\x00\x00" + struct.pack(">QQI", stream, seq, count)


def _pull(bus, endpoints, target, **kw):
    return bus.subscribe(endpoints("tcp"), target, kind="pull", bind=True, **kw)


def _push(zctx, sub):
    push = zctx.socket(zmq.PUSH)
    push.linger = 0
    push.connect(sub.last_endpoint)
    return push


def test_stamped_stream_arrives_whole(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub = _pull(bus, endpoints, col)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, stamp=True)
        for i in range(50):
            pub.send(b"a", i)
        pub.send_many(b"a", list(range(50, 80)))        # one batch: one range
        pub.send(b"b", "other topic")
        col.wait(81)
        assert col.items[:80] == list(range(80))
        s = sub.stats
        assert (s["lost"], s["gaps"], s["streams"], s["unstamped"]) == (0, 0, 2, 0)
        assert (s["reordered"], s["duplicates"], s["streams_forgotten"]) == (0, 0, 0)
        streams = sub.streams()
        a, b = pub.stream_of(b"a"), pub.stream_of(b"b")
        assert a != b and pub.stream not in (None, a, b)
        assert streams == {a: {"received": 80, "lost": 0, "gaps": 0, "next_seq": 80},
                           b: {"received": 1, "lost": 0, "gaps": 0, "next_seq": 1}}
        assert pub.streams() == {a: {"topic": b"a", "numbered": 80},
                                 b: {"topic": b"b", "numbered": 1}}


def test_unstamped_messages_are_delivered_and_counted(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub = _pull(bus, endpoints, col)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False)
        for i in range(10):
            pub.send(b"t", i)
        col.wait(10)
        s = sub.stats
        assert (s["unstamped"], s["streams"], s["lost"]) == (10, 0, 0)
        assert sub.streams() == {}
        assert pub.stream is None and pub.stream_of(b"t") is None and pub.streams() == {}


def test_a_restarted_publisher_is_a_new_stream_not_a_gap(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub = _pull(bus, endpoints, col)
        for run in range(2):
            pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, stamp=True)
            for i in range(5):
                pub.send(b"t", i)
            col.wait(5 * (run + 1))
            pub.close()
        s = sub.stats
        assert (s["streams"], s["lost"], s["gaps"]) == (2, 0, 0)
        assert sorted(v["received"] for v in sub.streams().values()) == [5, 5]


def test_gap_late_and_duplicate_are_told_apart(zctx, endpoints):
    col = Collector()
    events = []
    with upcall.Bus() as bus:
        sub = _pull(bus, endpoints, col, on_event=events.append)
        push = _push(zctx, sub)
        for seq in (0, 1, 4, 2, 4, 5):            # 2 and 3 missing; 2 late; 4 twice
            push.send_multipart([b"t", msgpack.packb(seq), stamp(77, seq)])
        col.wait(6)
        assert col.items == [0, 1, 4, 2, 4, 5]     # delivered all the same
        s = sub.stats
        assert (s["lost"], s["gaps"], s["reordered"], s["duplicates"]) == (1, 1, 1, 1)
        assert sub.streams() == {77: {"received": 5, "lost": 1, "gaps": 1, "next_seq": 6}}
        gaps = [e for e in events if e.kind == "gap"]
        assert [(e.stream, e.first, e.count) for e in gaps] == [(77, 2, 2)]
        assert gaps[0].endpoint.startswith("tcp://")
        assert "stream 0x000000000000004d" in repr(gaps[0])
        assert s["connected"] + s["accepted"] >= 1     # gaps are not connection counts
        push.close()


def test_a_gap_is_logged_on_upcall_events(zctx, endpoints, caplog):
    col = Collector()
    with caplog.at_level(logging.WARNING, logger="upcall.events"):
        with upcall.Bus() as bus:
            sub = _pull(bus, endpoints, col)
            push = _push(zctx, sub)
            push.send_multipart([b"t", msgpack.packb(0), stamp(5, 10)])
            push.send_multipart([b"t", msgpack.packb(1), stamp(5, 13, 2)])
            col.wait(2)
            push.close()
    lines = [r for r in caplog.records if getattr(r, "event", None) == "gap"]
    assert len(lines) == 1
    assert (lines[0].stream, lines[0].first, lines[0].count) == (5, 11, 2)
    assert "lost 2 message(s)" in lines[0].getMessage()


def test_streams_per_subscription_are_bounded(zctx, endpoints):
    """A peer inventing stream ids costs at most max_streams entries: the
    oldest are forgotten, and counted."""
    col = Collector()
    with upcall.Bus() as bus:
        with pytest.raises(ValueError, match="max_streams"):
            bus.subscribe("inproc://x", col, max_streams=0)
        sub = _pull(bus, endpoints, col, max_streams=4)
        push = _push(zctx, sub)
        for sid in range(1, 11):
            push.send_multipart([b"t", msgpack.packb(sid), stamp(sid, 1000)])
        col.wait(10)
        s = sub.stats
        assert (s["streams"], s["streams_forgotten"], s["lost"]) == (10, 6, 0)
        assert list(sub.streams()) == [7, 8, 9, 10]
        push.close()


def topic_stamp(stream, seq):
    """A single message's stamp at the end of its topic, as docs/wire.md
    spells it."""
    return struct.pack(">QQ", stream, seq) + b"\xc1ucs"


def test_plain_reader_of_a_stamped_stream(zctx, endpoints):
    """What a pyzmq + msgpack reader sees (docs/wire.md): a single message
    is [topic + stamp, payload], no frame more than unstamped; a coalesced
    batch [topic, payload, marker]; every payload plain msgpack."""
    pull = zctx.socket(zmq.PULL)
    pull.rcvtimeo = int(DEADLINE * 1000)
    ep = endpoints("tcp")
    pull.bind(ep)
    with upcall.Bus() as bus:
        pub = bus.publisher(pull.getsockopt(zmq.LAST_ENDPOINT).decode(), kind="push",
                            bind=False, stamp=True)
        pub.send(b"t", {"px": 1.5})
        pub.send(b"t", {"px": 2.5})
        pub.send_many(b"t", [3, 4])
        frames = [pull.recv_multipart() for _ in range(3)]
        sid = pub.stream_of(b"t")
    for i, (topic, payload) in enumerate(frames[:2]):
        assert msgpack.unpackb(payload) == {"px": 1.5 + i}
        assert topic[:1] == b"t" and topic[1:] == topic_stamp(sid, i)
        assert topic.startswith(b"t")            # SUB prefix filtering still matches
    topic, payload, marker = frames[2]
    assert topic == b"t"
    magic, version, flags, _, stream, seq, count = struct.unpack(">4sBBHQQI", marker)
    assert (magic, version, flags, stream, seq, count) == (b"\xc1ucw", 1, 1, sid, 2, 2)


def test_a_stamp_in_the_topic_is_counted_and_cut_off(zctx, endpoints):
    """A foreign sender's stamp at the end of the topic: counted per stream
    (a gap where numbers are missing) and gone from the topic targets,
    routing and SUB filtering see, on threads and with asyncio."""
    got = Collector()
    with upcall.Bus() as bus:
        sub = _pull(bus, endpoints, got, with_topic=True)
        push = _push(zctx, sub)
        push.send_multipart([b"a.x" + topic_stamp(3, 0), msgpack.packb(0)])
        push.send_multipart([b"a.x" + topic_stamp(3, 4), msgpack.packb(1)])
        push.send_multipart([topic_stamp(5, 0), msgpack.packb(2)])     # the empty topic
        got.wait(3)
        assert got.items == [(b"a.x", 0), (b"a.x", 1), (b"", 2)]
        assert sub.streams() == {3: {"received": 2, "lost": 3, "gaps": 1, "next_seq": 5},
                                 5: {"received": 1, "lost": 0, "gaps": 0, "next_seq": 1}}
        assert (sub.stats["unstamped"], sub.stats["lost"]) == (0, 3)
        push.close()

    async def main():
        with upcall.Bus() as bus:
            async with bus.subscribe_async(endpoints("tcp"), kind="pull", bind=True,
                                           with_topic=True) as asub:
                push = _push(zctx, asub)
                push.send_multipart([b"b" + topic_stamp(7, 0), msgpack.packb("x")])
                async for item in asub:
                    push.close()
                    return item, asub.streams()

    item, streams = asyncio.run(asyncio.wait_for(main(), DEADLINE))
    assert item == (b"b", "x")
    assert streams == {7: {"received": 1, "lost": 0, "gaps": 0, "next_seq": 1}}


def test_stamped_topics_route_and_filter_as_unstamped(endpoints):
    """A publisher's stamped single messages reach exactly the subscriptions
    whose prefixes match the topic (SUB filtering, routing, a prefix as long
    as the topic itself), with the topic as sent."""
    with upcall.Bus() as bus:
        ep = endpoints("tcp")
        pub = bus.publisher(ep, bind=True, stamp=True)
        whole, part, other = Collector(), Collector(), Collector()
        subs = [bus.subscribe(ep, c, topics=[prefix], with_topic=True)
                for c, prefix in ((whole, b"trades.AAPL"), (part, b"trades."),
                                  (other, b"quotes."))]
        pub.wait_subscriptions(3, timeout=DEADLINE)
        for i in range(20):
            pub.send(b"trades.AAPL", i)
        pub.send(b"quotes.X", "q")
        whole.wait(20)
        part.wait(20)
        other.wait(1)
        assert whole.items == part.items == [(b"trades.AAPL", i) for i in range(20)]
        assert other.items == [(b"quotes.X", "q")]
        sid = pub.stream_of(b"trades.AAPL")
        assert subs[0].streams()[sid] == {"received": 20, "lost": 0, "gaps": 0, "next_seq": 20}


def test_gap_events_with_asyncio(zctx, endpoints):
    ep = endpoints("tcp")

    async def main():
        events = []
        got = []
        with upcall.Bus() as bus:
            async with bus.subscribe_async(ep, kind="pull", bind=True,
                                           on_event=events.append) as asub:
                push = _push(zctx, asub)
                push.send_multipart([b"t", msgpack.packb(0), stamp(9, 0)])
                push.send_multipart([b"t", msgpack.packb(1), stamp(9, 3)])
                async for msg in asub:
                    got.append(msg)
                    if len(got) == 2:
                        break
                stats = asub.stats
                streams = asub.streams()
                push.close()
        return got, events, stats, streams

    got, events, stats, streams = asyncio.run(asyncio.wait_for(main(), DEADLINE))
    assert got == [0, 1]
    assert [(e.kind, e.stream, e.first, e.count) for e in events if e.kind == "gap"] == \
        [("gap", 9, 1, 2)]
    assert (stats["lost"], stats["gaps"]) == (2, 1)
    assert streams == {9: {"received": 2, "lost": 2, "gaps": 1, "next_seq": 4}}


def test_dropped_at_a_full_pipe_is_lost_exactly(endpoints):
    """A publisher flooding a stalled subscriber: what the full pipe refused
    is counted by the publisher (dropped) and seen by the subscriber as lost,
    and per stream received + lost == numbered."""
    release = threading.Event()
    col = Collector()
    events = []

    def target(msg):
        if msg == "first":
            release.wait(DEADLINE)
        col(msg)

    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("tcp"), target, bind=True, rcvhwm=10, batch=1,
                            on_event=events.append)
        pub = bus.publisher(sub.last_endpoint, bind=False, stamp=True, sndhwm=10)
        pub.wait_subscriptions(1, timeout=DEADLINE)
        pub.send(b"t", "first")
        wait_for(lambda: sub.stats["received"] >= 1)
        for i in range(5000):
            pub.send(b"t", i)
        ps = pub.stats
        assert ps["dropped"] > 0 and ps["sent"] + ps["dropped"] == 5001
        assert ps["dropped_bytes"] > 0
        release.set()
        # Until one more message gets through, the subscriber cannot know the
        # last ones were lost: send an end marker until it arrives.
        wait_for(lambda: pub.send(b"t", "end") or "end" in col.items)
        sid = pub.stream_of(b"t")
        numbered = pub.streams()[sid]["numbered"]
        wait_for(lambda: sub.streams()[sid]["next_seq"] == numbered)
        st = sub.streams()[sid]
        ps = pub.stats
        assert st["received"] + st["lost"] == numbered
        assert st["lost"] == ps["dropped"] and st["received"] == ps["sent"]
        assert sub.stats["lost"] == ps["dropped"] >= st["gaps"] >= 1
        assert any(e.kind == "gap" for e in events)
