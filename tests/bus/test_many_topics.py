"""A SUB with many topic prefixes: every prefix reaches every publisher, on
the first connection and on every reconnection, or the prefix is refused.

libzmq sends a SUB socket's subscriptions through its send queue, bounded by
ZMQ_SNDHWM (1000 by default), and silently drops what does not fit: on
connect and on every reconnect it queues all the prefixes at once.  upcall
makes that queue unbounded, so any number of prefixes goes out; past
``max_topics`` (``upcall.DEFAULT_MAX_TOPICS`` by default) a prefix is refused
with ValueError.

Real sockets over tcp and ipc, an upcall publisher and a pyzmq XPUB; the
publisher side counts the subscriptions it was sent (an XPUB sees each
distinct prefix once), then sends one message per prefix, and every one must
arrive.  Every wait is on a condition with a deadline.
"""
import time

import msgpack
import pytest
import zmq

import upcall
from helpers import DEADLINE, MODES, Collector, make_pump, mode_kwargs, wait_for
from bus_pair import assert_same_sequence, pair
from helpers import make_msg, warm_up

N = 3000                          # three times libzmq's default ZMQ_SNDHWM
PREFIXES = [b"k%05d." % i for i in range(N)]
NET = ["tcp", "ipc"]


def send_one_per_prefix(send):
    """Send one message per prefix (topic prefix + b"m", payload its index)."""
    for i, p in enumerate(PREFIXES):
        send(p + b"m", i)


def assert_each_prefix_delivered(col, pump=None):
    col.wait(N, pump=pump)
    assert sorted(col.items) == sorted((p + b"m", i) for i, p in enumerate(PREFIXES))


def wait_subscriptions(pub, n, pump=None):
    """pub.wait_subscriptions(n), pumping a caller-mode subscription meanwhile
    (its socket takes in a reconnection only when it is polled)."""
    if pump is None:
        return pub.wait_subscriptions(n, timeout=DEADLINE)
    held = []

    def enough():
        pump()
        held.append(pub.wait_subscriptions(0, timeout=0))
        return held[-1] >= n
    wait_for(enough, what=lambda: "the publisher to hold %d subscriptions (it holds %s)"
             % (n, held[-1:] or "none"))
    return held[-1]


# ---- topics= on open ----------------------------------------------------------

@pytest.mark.parametrize("transport", NET)
@pytest.mark.parametrize("sub_bind", [False, True], ids=["sub-connects", "sub-binds"])
def test_every_prefix_in_topics_reaches_an_upcall_publisher(endpoints, transport, sub_bind):
    ep = endpoints(transport)
    col = Collector()
    with upcall.Bus() as sbus, upcall.Bus() as pbus:
        if sub_bind:
            sub = sbus.subscribe(ep, col, topics=PREFIXES, bind=True, with_topic=True, rcvhwm=0)
            pub = pbus.publisher(ep, bind=False, sndhwm=0)
        else:
            pub = pbus.publisher(ep, sndhwm=0, bind=True)
            sub = sbus.subscribe(ep, col, topics=PREFIXES, with_topic=True, rcvhwm=0)
        assert sub.topics == tuple(PREFIXES)
        assert pub.wait_subscriptions(N, timeout=DEADLINE) == N
        send_one_per_prefix(pub.send)
        assert_each_prefix_delivered(col)


@pytest.mark.parametrize("transport", NET)
@pytest.mark.parametrize("sub_bind", [False, True], ids=["sub-connects", "sub-binds"])
def test_every_prefix_in_topics_reaches_a_pyzmq_xpub(endpoints, transport, sub_bind):
    ep = endpoints(transport)
    col = Collector()
    zctx = zmq.Context()
    xpub = zctx.socket(zmq.XPUB)
    try:
        xpub.setsockopt(zmq.SNDHWM, 0)
        xpub.setsockopt(zmq.LINGER, 0)
        with upcall.Bus() as bus:
            if sub_bind:
                sub = bus.subscribe(ep, col, topics=PREFIXES, bind=True, with_topic=True,
                                    rcvhwm=0)
                xpub.connect(sub.last_endpoint)
            else:
                xpub.bind(ep)
                sub = bus.subscribe(ep, col, topics=PREFIXES, with_topic=True, rcvhwm=0)
            seen = set()
            deadline = time.monotonic() + DEADLINE
            while len(seen) < N:
                left = deadline - time.monotonic()
                assert left > 0, "the XPUB saw %d subscriptions of %d" % (len(seen), N)
                if xpub.poll(int(min(left, 1.0) * 1000)):
                    m = xpub.recv()
                    assert m[:1] == b"\x01", m
                    seen.add(m[1:])
            assert seen == set(PREFIXES)
            send_one_per_prefix(lambda t, i: xpub.send_multipart([t, msgpack.packb(i)]))
            assert_each_prefix_delivered(col)
    finally:
        xpub.close(0)
        zctx.term()


# ---- added at run time, then the publisher restarts ----------------------------

@pytest.mark.parametrize("transport", NET)
@pytest.mark.parametrize("mode", MODES)
def test_prefixes_added_one_by_one_come_back_after_a_publisher_restart(endpoints, transport,
                                                                       mode):
    ep = endpoints(transport)
    col = Collector()
    with upcall.Bus() as sbus:
        pbus = upcall.Bus()
        try:
            pub = pbus.publisher(ep, sndhwm=0, bind=True)
            sub = sbus.subscribe(ep, col, topics=(), with_topic=True, rcvhwm=0,
                                 socket_options={"reconnect_ivl": 20}, **mode_kwargs(mode))
            pump = make_pump(sub) if mode == "caller" else None
            for p in PREFIXES:
                sub.subscribe(p)
            assert sub.topics == tuple(PREFIXES)
            assert wait_subscriptions(pub, N, pump) == N
            # The publisher restarts on the same endpoint, as a process
            # would: its bus (zmq context) closes, which returns once its
            # listener is gone, then a new one binds.  The SUB reconnects
            # and sends its prefixes again, all of them at once.
            pbus.close()
            pbus = upcall.Bus()
            pub = pbus.publisher(ep, sndhwm=0, bind=True)
            assert wait_subscriptions(pub, N, pump) == N
            send_one_per_prefix(pub.send)
            assert_each_prefix_delivered(col, pump)
        finally:
            pbus.close()


# ---- the limit ------------------------------------------------------------------

def test_default_limit_refuses_one_prefix_more_in_topics(endpoints):
    limit = upcall.DEFAULT_MAX_TOPICS
    assert limit == 100_000
    with upcall.Bus() as bus:
        too_many = [b"%d" % i for i in range(limit + 1)]
        with pytest.raises(ValueError) as err:
            bus.subscribe(endpoints("inproc"), print, topics=too_many)
        msg = str(err.value)
        assert "topics" in msg and "100001" in msg and "max_topics=100000" in msg, msg
        # Exactly the limit is accepted, and every prefix is there.
        sub = bus.subscribe(endpoints("inproc"), print, topics=too_many[:limit])
        assert len(sub.topics) == limit
        sub.close()


@pytest.mark.parametrize("mode", MODES)
def test_max_topics_bounds_topics_and_subscribe(endpoints, mode):
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        with pytest.raises(ValueError, match=r"topics: 4 prefixes.*max_topics=3"):
            bus.subscribe(ep, print, topics=[b"a", b"b", b"c", b"d"], max_topics=3)
        # A prefix given twice is one prefix.
        sub = bus.subscribe(ep, print, topics=[b"a", b"b", b"a"], max_topics=3,
                            **mode_kwargs(mode))
        sub.subscribe(b"c")
        sub.subscribe(b"a")            # already there: nothing added, nothing refused
        with pytest.raises(ValueError, match=r"subscribe\(b'd'\).*max_topics=3"):
            sub.subscribe(b"d")
        assert sub.topics == (b"a", b"b", b"c")
        sub.unsubscribe(b"b")
        sub.subscribe(b"d")            # room again
        assert sub.topics == (b"a", b"c", b"d")
        sub.close()


@pytest.mark.parametrize("value, exc, words", [
    (0, ValueError, r"max_topics must be between 1 and 2147483647 \(None: 100000\), not 0"),
    (-1, ValueError, r"max_topics must be between 1 and 2147483647 .*not -1"),
    (2 ** 31, ValueError, r"max_topics must be between 1 and 2147483647 .*not 2147483648"),
    (1.5, TypeError, r"max_topics must be an int or None .*not float"),
    ("10", TypeError, r"max_topics must be an int or None .*not str"),
    (True, TypeError, r"max_topics must be an int or None .*not bool"),
])
def test_bad_max_topics(endpoints, value, exc, words):
    with upcall.Bus() as bus:
        with pytest.raises(exc, match=words):
            bus.subscribe(endpoints("inproc"), print, max_topics=value)


def test_sndhwm_in_socket_options_is_refused_with_the_reason(endpoints):
    with upcall.Bus() as bus:
        with pytest.raises(ValueError) as err:
            bus.subscribe(endpoints("inproc"), print, socket_options={"sndhwm": 0})
        msg = str(err.value)
        assert "'sndhwm'" in msg and "no limit" in msg and "max_topics" in msg, msg


def test_subscribe_async_takes_max_topics(endpoints):
    import asyncio

    async def main():
        with upcall.Bus() as bus:
            with pytest.raises(ValueError, match=r"topics: 2 prefixes.*max_topics=1"):
                async with bus.subscribe_async(endpoints("inproc"), topics=[b"a", b"b"],
                                               max_topics=1):
                    pass
            async with bus.subscribe_async(endpoints("inproc"), topics=[b"a"],
                                           max_topics=1) as sub:
                assert not sub.closed
    asyncio.run(main())


# --- topics ------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_topic_prefix_filtering(endpoints, mode, transport):
    col = Collector()
    with pair(endpoints, transport, "sub", mode, col, topics=[b"a.", b"c."],
              with_topic=True) as (pub, sub, pump):
        warm_up(pub, col, pump, topic=b"a.probe")
        sent = []
        for i in range(300):
            for t in (b"a.x", b"b.x", b"c.y", b"a", b"ba.x", b"c.", b"cc.x"):
                pub.send(t, i)
                sent.append((t, i))
        pub.send(b"c.end", "end")
        expected = [(t, i) for t, i in sent if t.startswith((b"a.", b"c."))] + [(b"c.end", "end")]
        col.wait(len(expected), pump=pump)
        # "c.end" was sent last: everything the filter passes has arrived.
        assert_same_sequence(col.items, expected)


def test_str_topics_are_utf8(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "sub", "native", col,
              topics=["é.", "plain."], with_topic=True) as (pub, sub, _):
        warm_up(pub, col, topic="plain.probe".encode())
        pub.send("ü.x".encode(), 0)
        pub.send("é.x".encode(), 1)
        pub.send(b"plain.y", 2)
        pub.send(b"e.x", 3)
        pub.send("é.end".encode(), 4)
        col.wait(3)
        assert col.items == [("é.x".encode(), 1), (b"plain.y", 2), ("é.end".encode(), 4)]


def test_with_topic_pull_gets_topic_frame(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "pull", "native", col, with_topic=True) as (pub, sub, _):
        pub.send(b"some.topic", {"k": 1})
        pub.send(b"", [1, 2])
        col.wait(2)
    assert col.items == [(b"some.topic", {"k": 1}), (b"", [1, 2])]
    assert all(type(t) is bytes for t, _ in col.items)


@pytest.mark.parametrize("mode", MODES)
def test_with_topic(endpoints, mode):
    col = Collector()
    with pair(endpoints, "tcp", "sub", mode, col, with_topic=True) as (pub, sub, pump):
        warm_up(pub, col, pump)
        expected = [(b"t.%d" % (i % 3), make_msg(i)) for i in range(200)]
        for t, m in expected:
            pub.send(t, m)
        col.wait(200, pump=pump)
        assert col.items == expected
        assert all(type(t) is bytes for t, _ in col.items)
