"""Slow consumers and backpressure, per socket kind (docs/wire.md).

* PUSH/PULL never drops: when the high-water marks fill, send() blocks, or
  with timeout=0 raises BlockingIOError; everything sent arrives.
* PUB/SUB drops at the high-water mark, as ZeroMQ does: the publisher never
  blocks, and what arrives is an in-order subsequence of what was sent.
* A target that blocks for a long time stops only its own subscription.
* close(timeout) returns or raises TimeoutError within its timeout even while
  a target is stuck.
"""
import threading
import time

import pytest

import upcall
from helpers import DEADLINE, Collector, wait_for

pytestmark = pytest.mark.threads


def blocked_target(gate, into):
    def target(msg):
        into.append(msg)
        gate.wait(DEADLINE)
    return target


def test_pull_never_drops_the_sender_is_told_it_would_block(endpoints):
    # inproc: the queues between the sockets are exactly the high-water marks
    # (over tcp the kernel's buffers add to them and drain on their own).
    ep = endpoints("inproc")
    gate = threading.Event()
    got = []
    with upcall.Bus() as bus:
        sub = bus.subscribe(ep, blocked_target(gate, got), kind="pull", bind=True,
                            rcvhwm=10, batch=1)
        pub = bus.publisher(ep, kind="push", bind=False, sndhwm=10)
        sent = 0
        # Fill every queue between the two sockets while the target is stuck:
        # a non-blocking send is refused once they are full, never dropped.
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                pub.send(b"t", sent, timeout=0)
                sent += 1
            except BlockingIOError:
                break
            assert time.monotonic() < deadline, f"{sent} sends never hit the high-water mark"
        with pytest.raises(TimeoutError):
            pub.send(b"t", sent, timeout=0.05)      # a bounded blocking send too
        gate.set()
        wait_for(lambda: len(got) >= sent, what=lambda: f"{sent} messages, got {len(got)}")
        assert got == list(range(sent))
        assert sub.stats["dropped"] == 0 and sub.stats["delivered"] == sent


@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_blocking_send_waits_for_a_slow_consumer(endpoints, transport):
    ep = endpoints(transport)
    got = Collector(record=lambda msg: time.sleep(0.0005) if msg % 100 == 0 else None)
    with upcall.Bus() as bus:
        bus.subscribe(ep, got, kind="pull", bind=True, rcvhwm=5)
        pub = bus.publisher(ep, kind="push", bind=False, sndhwm=5)
        for i in range(3000):
            pub.send(b"t", i)               # timeout=None: blocks, never drops
        got.wait(3000)
        assert got.items == list(range(3000))


def test_sub_drops_at_the_high_water_mark_and_the_publisher_never_blocks(endpoints):
    ep = endpoints("inproc")
    gate = threading.Event()
    got = []
    with upcall.Bus() as bus:
        sub = bus.subscribe(ep, blocked_target(gate, got), kind="sub", bind=True,
                            rcvhwm=10, batch=1)
        pub = bus.publisher(ep, kind="pub", bind=False, sndhwm=10)
        # Slow joiner: probe until the subscription is live.
        wait_for(lambda: pub.send(b"t", -1) or got, what="the subscription to connect")
        n = 5000
        for i in range(n):
            pub.send(b"t", i, timeout=0)    # never BlockingIOError on PUB
        gate.set()
        # The last message sent is in the queue unless dropped; send a final
        # marker, after the queues drain, to know delivery has caught up.
        wait_for(lambda: pub.send(b"t", n) or (got and got[-1] == n),
                 what="delivery to catch up")
        data = [m for m in got if 0 <= m < n]
        assert data == sorted(set(data)), "SUB delivered out of order or twice"
        assert len(data) < n, "nothing was dropped: the high-water mark was not reached"
        assert sub.stats["decode_errors"] == 0 and sub.stats["callback_errors"] == 0


@pytest.mark.parametrize("mode", ["native", "python"])
def test_a_stuck_target_does_not_stop_other_subscriptions(endpoints, mode):
    factory = upcall.python_threads if mode == "python" else None
    ep_slow, ep_fast = endpoints("inproc"), endpoints("inproc")
    gate = threading.Event()
    slow_got = []
    fast = Collector()
    with upcall.Bus() as bus:
        slow = bus.subscribe(ep_slow, blocked_target(gate, slow_got), kind="pull",
                             bind=True, thread_factory=factory)
        bus.subscribe(ep_fast, fast, kind="pull", bind=True, thread_factory=factory)
        pub_slow = bus.publisher(ep_slow, kind="push", bind=False)
        pub_fast = bus.publisher(ep_fast, kind="push", bind=False)
        pub_slow.send(b"t", "stuck")
        wait_for(lambda: slow_got, what="the slow target to be entered")
        for i in range(10000):
            pub_fast.send(b"t", i)
        fast.wait(10000)                    # flows while the other is stuck
        assert fast.items == list(range(10000))
        gate.set()
        slow.close(DEADLINE)


def test_close_with_timeout_while_a_target_is_stuck(endpoints):
    ep = endpoints("inproc")
    gate = threading.Event()
    got = []
    with upcall.Bus() as bus:
        sub = bus.subscribe(ep, blocked_target(gate, got), kind="pull", bind=True)
        pub = bus.publisher(ep, kind="push", bind=False)
        pub.send(b"t", 1)
        pub.send(b"t", 2)
        wait_for(lambda: got, what="the target to be entered")
        with pytest.raises(TimeoutError, match="still running"):
            sub.close(timeout=0.2)
        assert not sub.stats["delivered"]   # the stuck message is in flight
        gate.set()
        sub.close(timeout=DEADLINE)         # now the loop ends
        assert got == [1]                   # nothing delivered after close()
