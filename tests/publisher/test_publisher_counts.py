"""What a publisher counts (pub.stats: sent, sent_bytes, dropped,
dropped_bytes) and its policy at a full subscriber pipe (on_full="drop",
the default, "block", or "skip").  Before these, an XPUB dropped at its high-water
mark silently and no counter on either side moved."""
import threading

import pytest

import upcall
from helpers import DEADLINE, Collector, wait_for


def test_sent_counts_messages_and_payload_bytes(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("tcp"), col, kind="pull", bind=True)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False)
        assert {k: pub.stats[k] for k in ("sent", "sent_bytes", "dropped", "dropped_bytes")} \
            == {"sent": 0, "sent_bytes": 0, "dropped": 0, "dropped_bytes": 0}
        pub.send_packed(b"t", b"\x01")
        pub.send_packed(b"t", b"\xa3abc")
        pub.send_many(b"t", [1, 2, 3])            # one zmq message, three messages
        col.wait(5)
        s = pub.stats
        assert s["sent"] == 5 and s["dropped"] == 0
        assert s["sent_bytes"] == 1 + 4 + (7 + 3)   # the batch's payload: header + 3 bytes


def _stalled(bus, endpoints, release, **pub_kw):
    col = Collector()

    def target(msg):
        if msg == "first":
            release.wait(DEADLINE)
        col(msg)
    sub = bus.subscribe(endpoints("tcp"), target, bind=True, rcvhwm=10, batch=1)
    pub = bus.publisher(sub.last_endpoint, bind=False, sndhwm=10, **pub_kw)
    pub.wait_subscriptions(1, timeout=DEADLINE)
    pub.send(b"t", "first")
    wait_for(lambda: sub.stats["received"] >= 1)
    return sub, pub, col


def test_a_burst_at_a_stalled_subscriber_is_counted_dropped(endpoints):
    release = threading.Event()
    with upcall.Bus() as bus:
        sub, pub, col = _stalled(bus, endpoints, release)
        for i in range(3000):
            pub.send(b"t", i)                    # never waits, never raises
        s = pub.stats
        assert s["dropped"] > 0 and s["sent"] + s["dropped"] == 3001
        assert s["dropped_bytes"] >= s["dropped"]
        release.set()
        wait_for(lambda: sub.stats["received"] == s["sent"])


def test_on_full_block_waits_then_raises(endpoints):
    release = threading.Event()
    with upcall.Bus() as bus:
        sub, pub, col = _stalled(bus, endpoints, release, on_full="block")
        # 10 kB messages: the kernel's socket buffers fill before the loop ends.
        big = b"x" * 10_000
        with pytest.raises(TimeoutError):
            for i in range(10_000):
                pub.send(b"t", big, timeout=0.05)
        s = pub.stats
        assert s["dropped"] == 0 and s["sent"] > 1
        release.set()
        wait_for(lambda: sub.stats["received"] == s["sent"])
        pub.send(b"t", "after", timeout=DEADLINE)     # room again: sent
        wait_for(lambda: "after" in col.items)


def test_on_full_is_checked():
    with upcall.Bus() as bus:
        with pytest.raises(ValueError, match="on_full must be 'drop' or 'block' or 'skip'"):
            bus.publisher("inproc://x", on_full="wait")
        with pytest.raises(TypeError, match="stamp must be True or False"):
            bus.publisher("inproc://x", stamp=1)



def test_on_full_skip_costs_only_the_full_subscriber(endpoints):
    # Fan-out to a stalled and a live subscriber: with "skip" (libzmq's own
    # PUB) the live one gets every message while the stalled one misses
    # some; "drop" (NODROP) refuses a message for both once one pipe is full.
    release = threading.Event()
    stalled_got, live = Collector(), Collector()

    def stalled_target(msg):
        if msg == "stall":
            release.wait(DEADLINE)
        stalled_got(msg)
    big = b"x" * 10_000           # the kernel's socket buffers fill too
    n = 3000
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("tcp"), bind=True, sndhwm=10, on_full="skip")
        stalled = bus.subscribe(pub.last_endpoint, stalled_target, rcvhwm=10, batch=1)
        fast = bus.subscribe(pub.last_endpoint, live)
        wait_for(lambda: pub.send(b"t", "probe") or (stalled_got.items and live.items))
        pub.send(b"t", "stall")
        wait_for(lambda: "stall" in live.items)
        base = fast.stats["received"]
        for i in range(n):
            pub.send(b"t", [i, big])
            # The live subscriber keeps up: its own pipe is never full.
            wait_for(lambda: fast.stats["received"] > base + i, what=lambda: f"message {i}")
        numbered = [m[0] for m in live.items if isinstance(m, list)]
        assert numbered == list(range(n))
        assert pub.stats["dropped"] == 0
        release.set()
        wait_for(lambda: pub.send(b"t", "end") or "end" in stalled_got.items)
        missed = n - len([m for m in stalled_got.items if isinstance(m, list)])
        # What the stalled pipe could hold is far less than n messages of 10 kB.
        assert missed > 0
