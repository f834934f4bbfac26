"""What a publisher counts (pub.stats: sent, sent_bytes, dropped,
dropped_bytes) and its policy at a full subscriber pipe (on_full="drop",
the default, or "block").  Before these, an XPUB dropped at its high-water
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
        with pytest.raises(ValueError, match="on_full must be 'drop' or 'block'"):
            bus.publisher("inproc://x", on_full="wait")
        with pytest.raises(TypeError, match="stamp must be True or False"):
            bus.publisher("inproc://x", stamp=1)
