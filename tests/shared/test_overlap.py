"""Shared sockets holding overlapping prefixes (b"a" and b"ab"): a
message matching several of one subscription's prefixes is that
subscription's once, as on a SUB socket of its own, whatever the target kind
and whenever the prefixes were added."""
import asyncio

import pytest

import upcall
from upcall.handler import Counter
from upcall.native import Count

from helpers import DEADLINE, wait_for

pytestmark = pytest.mark.threads


class Inbox:
    def __init__(self):
        self.items = []

    def __call__(self, msg):
        self.items.append(msg)


class Recorder(upcall.Handler):
    def __init__(self):
        self.got = []

    def on_message(self, msg):
        self.got.append(msg)


# Topics sent, and which of them b"a" + b"ab" match (b"abc" matches both).
SENT = [b"abc", b"ax", b"b", b"ab", b"abd"]
MATCHED = [t for t in SENT if t.startswith(b"a")]


def _flood(pub, rounds):
    """Send every topic of SENT ``rounds`` times, each message numbered; the
    caller then sends a marker, which arrives after all of them (one
    connection)."""
    for r in range(rounds):
        for t in SENT:
            pub.send(t, [t.decode(), r])


def _expected(rounds, matched=MATCHED):
    return [[t.decode(), r] for r in range(rounds) for t in SENT if t in matched]


def test_overlapping_prefixes_deliver_once_every_target_kind():
    with upcall.Bus() as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", sndhwm=0, bind=True)
        ep = pub.last_endpoint
        cb, rec, counter, count = Inbox(), Recorder(), Counter(), Count()
        topics = [b"a", b"ab"]
        subs = [bus.subscribe(ep, t, topics=topics, rcvhwm=0)
                for t in (cb, rec, counter, count)]
        assert len({s.thread_name for s in subs}) == 1      # one shared socket
        pub.wait_subscriptions(2, timeout=DEADLINE)
        rounds = 50
        _flood(pub, rounds)
        want = _expected(rounds)
        pub.send(b"a-end", "end")     # behind the flood
        wait_for(lambda: cb.items[-1:] == ["end"] and rec.got[-1:] == ["end"]
                 and counter.count >= len(want) + 1 and count.messages >= len(want) + 1)
        assert cb.items == rec.got == want + ["end"]
        assert counter.count == count.messages == len(want) + 1
        for s in subs:
            assert s.stats["received"] == len(want) + 1
        for s in subs:
            s.close()


@pytest.mark.parametrize("added", [b"abc", b""], ids=["longer", "shorter"])
def test_overlap_added_later_delivers_once(added):
    with upcall.Bus() as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", sndhwm=0, bind=True)
        ep = pub.last_endpoint
        cb, count = Inbox(), Count()
        subs = [bus.subscribe(ep, t, topics=[b"ab"], rcvhwm=0) for t in (cb, count)]
        for s in subs:
            s.subscribe(b"a")
            s.subscribe(added)     # a longer or a shorter prefix of what it holds
        pub.wait_subscriptions(3, timeout=DEADLINE)   # b"ab", b"a" and the added one
        _flood(pub, 20)
        matched = SENT if added == b"" else MATCHED
        want = _expected(20, matched)
        pub.send(b"a-end", "end")
        wait_for(lambda: cb.items[-1:] == ["end"] and count.messages >= len(want) + 1)
        assert cb.items == want + ["end"]
        assert count.messages == len(want) + 1
        # Taking one of the overlapping prefixes away leaves the others whole.
        for s in subs:
            s.unsubscribe(b"ab")
        cb.items.clear()
        _flood(pub, 5)
        pub.send(b"a-end", "end2")
        wait_for(lambda: cb.items[-1:] == ["end2"])
        assert cb.items == _expected(5, matched) + ["end2"]
        for s in subs:
            s.close()


def test_overlapping_prefixes_asyncio_once():
    async def main(bus, pub, ep):
        asub = bus.subscribe_async(ep, topics=[b"a", b"ab"])
        pub.wait_subscriptions(2, timeout=DEADLINE)
        _flood(pub, 20)
        pub.send(b"a-end", "end")
        got = []

        async def consume():
            async for m in asub:
                got.append(m)
                if m == "end":
                    return
        await asyncio.wait_for(consume(), DEADLINE)
        assert got == _expected(20) + ["end"]
        await asub.aclose()

    with upcall.Bus() as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", sndhwm=0, bind=True)
        asyncio.run(main(bus, pub, pub.last_endpoint))
