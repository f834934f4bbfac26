"""The bus end to end: real libzmq sockets (inproc, ipc, tcp), real threads.

Every wait is on a condition with a generous deadline (helpers.DEADLINE); no
sleep-and-hope and no timing thresholds.  PUB/SUB tests first send probes
until one arrives (slow joiner), with unlimited high-water marks on both
sides so nothing is dropped afterwards.
"""
import threading

import pytest

import upcall
from helpers import DEADLINE, KINDS, MODES, TRANSPORTS, Collector, wait_for, warm_up
from bus_pair import STATE_ERRORS, pair, stream

pytestmark = pytest.mark.threads


# --- every message once, in order, equal -----------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_every_message_once_in_order(endpoints, mode, kind, transport):
    stream(endpoints, mode, kind, transport, 2000)


@pytest.mark.parametrize("mode,kind,transport,sub_bind", [
    ("native", "pull", "inproc", False),
    ("python", "pull", "ipc", True),
    ("caller", "pull", "tcp", False),
    ("native", "pull", "tcp", True),
    ("native", "sub", "tcp", False),
])
def test_100k_messages(endpoints, mode, kind, transport, sub_bind):
    stream(endpoints, mode, kind, transport, 100_000, sub_bind=sub_bind)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", KINDS)
def test_subscriber_binds_publisher_connects(endpoints, kind, transport):
    stream(endpoints, "native", kind, transport, 2000, sub_bind=True)


@pytest.mark.parametrize("batch", [1, 2, 7, 100_000])
def test_batch_sizes_deliver_everything(endpoints, batch):
    stream(endpoints, "native", "pull", "inproc", 3000, batch=batch)


def test_batch_1_gives_one_batch_per_message(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "pull", "native", col, batch=1) as (pub, sub, _):
        for i in range(500):
            pub.send(b"t", i)
        col.wait(500)
        wait_for(lambda: sub.stats["delivered"] == 500, what=lambda: repr(sub.stats))
        stats = sub.stats
        assert stats["batches"] == stats["delivered"] == 500
    assert col.items == list(range(500))


def test_fan_out_to_two_subscriptions(endpoints):
    ep = endpoints("inproc")
    a, b = Collector(), Collector()
    with upcall.Bus() as bus:
        pub = bus.publisher(ep, sndhwm=0, bind=True)
        sa = bus.subscribe(ep, a, rcvhwm=0)
        sb = bus.subscribe(ep, b, rcvhwm=0, thread_factory=upcall.python_threads)
        warm_up(pub, a)
        warm_up(pub, b)
        for i in range(1000):
            pub.send(b"x", i)
        a.wait(1000)
        b.wait(1000)
        assert a.items == b.items == list(range(1000))
        sa.close()
        sb.close()
        pub.close()


# --- StopDelivery -----------------------------------------------------------------

def stop_on(value):
    def record(*args):
        if args[-1] == value:
            raise upcall.StopDelivery()
    return record


def test_stop_delivery_python_thread_ends(endpoints):
    # The loop's thread (Python-made) returns from run() by itself: proof
    # that the loop ended without anybody calling close().
    col = Collector(record=stop_on(3))
    with pair(endpoints, "inproc", "pull", "python", col) as (pub, sub, _):
        name = sub.thread_name
        thread = [t for t in threading.enumerate() if t.name == name]
        assert len(thread) == 1, "delivery thread %r not in threading.enumerate()" % name
        for i in range(10):
            pub.send(b"t", i)
        thread[0].join(DEADLINE)
        assert not thread[0].is_alive(), "StopDelivery did not end the loop"
        assert col.items == [0, 1, 2]
        assert col.calls == 4
        wait_for(lambda: sub.closed, what="sub.closed after StopDelivery")
        sub.close()  # still fine
        assert sub.stats["callback_errors"] == 0


def test_stop_delivery_custom_factory_run_returns(endpoints):
    runs = []

    def factory(run):
        t = threading.Thread(target=run, name="mine")
        runs.append(t)
        t.start()

    col = Collector(record=stop_on(0))
    with pair(endpoints, "ipc", "pull", "native", col, thread_factory=factory) as (pub, sub, _):
        for i in range(5):
            pub.send(b"t", i)
        assert len(runs) == 1
        runs[0].join(DEADLINE)
        assert not runs[0].is_alive(), "StopDelivery did not end the loop"
        assert col.items == [] and col.calls == 1
        sub.close()
        assert sub.closed


def test_stop_delivery_native(endpoints):
    col = Collector(record=stop_on(3))
    with pair(endpoints, "inproc", "pull", "native", col) as (pub, sub, _):
        for i in range(10):
            pub.send(b"t", i)
        wait_for(lambda: col.calls >= 4, what="message 3 to reach the target")
        wait_for(lambda: sub.closed, what="sub.closed after StopDelivery")
        sub.close(timeout=DEADLINE)
        assert col.items == [0, 1, 2]
        assert col.calls == 4


def test_stop_delivery_caller_mode(endpoints):
    col = Collector(record=stop_on(3))
    with pair(endpoints, "inproc", "pull", "caller", col) as (pub, sub, pump):
        for i in range(10):
            pub.send(b"t", i)
        while col.calls < 4:
            sub.poll(timeout=DEADLINE, max_messages=None)
        assert col.items == [0, 1, 2]
        # The subscription has ended: a later poll delivers nothing (it may
        # return 0 or refuse as on a closed subscription).
        try:
            n = sub.poll(timeout=0.05)
        except STATE_ERRORS:
            n = 0
        assert n == 0
        assert col.items == [0, 1, 2] and col.calls == 4
        assert sub.closed, "StopDelivery ended the subscription but sub.closed is False"
        sub.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_large_payloads(endpoints, transport):
    col = Collector()
    big = [b"\x00\x01" * 500_000, "ü" * 300_000, list(range(100_000)),
           {"blob": bytes(range(256)) * 20_000, "n": 1}, b"z" * (8 << 20)]
    with pair(endpoints, transport, "pull", "native", col) as (pub, sub, _):
        for obj in big:
            pub.send(b"big", obj)
        col.wait(len(big))
    assert len(col.items) == len(big)
    for got, want in zip(col.items, big):
        # A default publisher packs large values inline (plain msgpack):
        # they arrive as what was sent, bytes as bytes.
        assert type(got) is type(want) and got == want
