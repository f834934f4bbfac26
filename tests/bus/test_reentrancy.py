"""Re-entrancy: what a target may do from inside a callback without deadlock.

From inside a target: publish on the same bus, subscribe a new subscription,
close its own subscription, close another, close the whole bus.  Each runs in
every delivery mode; every wait has a deadline, so a deadlock fails the test
(and the conftest watchdog dumps the stacks if the GIL itself is stuck).
"""
import threading

import pytest

import upcall
from helpers import DEADLINE, MODES, Collector, mode_kwargs, thread_count, wait_for

pytestmark = pytest.mark.threads


def deliver_until(sub, mode, done):
    """Wait until the event ``done`` is set; in caller mode, poll meanwhile."""
    if mode == "caller":
        wait_for(lambda: (sub.poll(timeout=0.05), done.is_set())[1],
                 what="the target to finish its work")
    assert done.wait(DEADLINE), "the target did not finish"


@pytest.mark.parametrize("mode", MODES)
def test_publish_on_the_same_bus_from_a_target(endpoints, mode):
    # A ping-pong chain inside one bus: each delivery publishes the next hop.
    hops = 200
    ep_in, ep_out = endpoints("inproc"), endpoints("inproc")
    seen = Collector()
    done = threading.Event()
    with upcall.Bus() as bus:
        back = bus.publisher(ep_in, kind="push", bind=True)
        out = bus.publisher(ep_out, kind="push", bind=True)

        def relay(msg):
            out.send(b"hop", msg + 1)       # publish from inside the target

        def count(msg):
            seen(msg)
            if msg < hops:
                back.send(b"hop", msg)
            else:
                done.set()

        relay_sub = bus.subscribe(ep_in, relay, kind="pull", **mode_kwargs("native"))
        count_sub = bus.subscribe(ep_out, count, kind="pull", **mode_kwargs(mode))
        back.send(b"hop", 0)
        deliver_until(count_sub, mode, done)
        assert seen.items == list(range(1, hops + 1))
        relay_sub.close(DEADLINE)
        count_sub.close(DEADLINE)


@pytest.mark.parametrize("mode", MODES)
def test_subscribe_from_a_target(endpoints, mode):
    ep_first, ep_second = endpoints("inproc"), endpoints("tcp")
    second = Collector()
    opened = []
    with upcall.Bus() as bus:
        pub1 = bus.publisher(ep_first, kind="push", bind=True)
        pub2 = bus.publisher(ep_second, kind="push", bind=True)

        def open_another(msg):
            if not opened:
                opened.append(bus.subscribe(ep_second, second, kind="pull"))

        first = bus.subscribe(ep_first, open_another, kind="pull", **mode_kwargs(mode))
        pub1.send(b"t", "go")
        if mode == "caller":
            wait_for(lambda: first.poll(timeout=0.05) or opened, what="the nested subscribe")
        wait_for(lambda: opened, what="the target to subscribe")
        for i in range(100):
            pub2.send(b"t", i)
        second.wait(100)
        assert second.items == list(range(100))


@pytest.mark.parametrize("mode", MODES)
def test_close_another_subscription_from_a_target(endpoints, mode):
    ep_a, ep_b = endpoints("inproc"), endpoints("inproc")
    b_items = Collector()
    closed_other = threading.Event()
    with upcall.Bus() as bus:
        pub_a = bus.publisher(ep_a, kind="push", bind=True)
        pub_b = bus.publisher(ep_b, kind="push", bind=True)
        sub_b = bus.subscribe(ep_b, b_items, kind="pull")   # busy, on its own thread

        def closer(msg):
            sub_b.close(DEADLINE)            # waits for b's loop, which needs the GIL
            closed_other.set()

        sub_a = bus.subscribe(ep_a, closer, kind="pull", **mode_kwargs(mode))
        def send_all():
            try:
                for i in range(2000):
                    pub_b.send(b"t", i, timeout=DEADLINE)
            except ValueError:
                pass    # b is closed: its queue fills, and then the bus closes
        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
        b_items.wait(100)                    # b is delivering while a closes it
        pub_a.send(b"t", "close b")
        if mode == "caller":
            wait_for(lambda: sub_a.poll(timeout=0.05) or closed_other.is_set(),
                     what="the target to close the other subscription")
        assert closed_other.wait(DEADLINE)
        assert sub_b.closed
        n = len(b_items)
        assert b_items.items == list(range(n))   # in order, none after close
        assert sub_b.stats["delivered"] == n
    sender.join(DEADLINE)   # the bus is closed: a send still blocked has returned
    assert not sender.is_alive()


@pytest.mark.parametrize("mode", MODES)
def test_close_the_whole_bus_from_a_target(endpoints, mode):
    ep, ep_other = endpoints("inproc"), endpoints("tcp")
    baseline = thread_count()
    returned = threading.Event()
    bus = upcall.Bus()
    pub = bus.publisher(ep, kind="push", bind=True)
    other = bus.subscribe(ep_other, print, kind="pull", bind=True)

    def close_everything(msg):
        bus.close(DEADLINE)
        returned.set()

    sub = bus.subscribe(ep, close_everything, kind="pull", **mode_kwargs(mode))
    pub.send(b"t", 1)
    if mode == "caller":
        wait_for(lambda: sub.poll(timeout=0.05) or returned.is_set(),
                 what="bus.close() inside the target to return")
    assert returned.wait(DEADLINE), "bus.close() inside a target did not return"
    assert bus.closed and other.closed and pub.closed
    wait_for(lambda: sub.closed, what="the closing loop to end")
    # The zmq context ended once the last loop let go of it: its I/O threads
    # and every delivery thread are gone.
    wait_for(lambda: thread_count() <= baseline,
             what=lambda: f"threads back to {baseline} (now {thread_count()})")
