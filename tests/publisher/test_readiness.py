"""Publisher.wait_subscriptions: the slow joiner solved.

A PUB socket drops what it sends before a SUB has subscribed.  A kind="pub"
publisher reads its peers' subscriptions (an XPUB socket), so it can wait
until they are in place: the first message sent after the wait arrives.
"""
import _thread
import os
import signal
import threading

import msgpack
import pytest
import zmq

import upcall
from helpers import DEADLINE, TRANSPORTS, Collector, wait_for

pytestmark = pytest.mark.threads


def count(pub):
    return pub.wait_subscriptions(0, timeout=0)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("order", ["pub-binds", "sub-connects-first", "sub-binds"])
def test_the_first_message_sent_after_the_wait_arrives(endpoints, transport, order):
    col = Collector()
    ep = endpoints(transport)
    with upcall.Bus() as bus:
        if order == "pub-binds":
            pub = bus.publisher(ep, bind=True)
            sub = bus.subscribe(pub.last_endpoint, col, topics=[b"trades."], with_topic=True)
        elif order == "sub-connects-first":
            # The README's quick start, where a send without the wait is
            # lost: the connect is retried after libzmq's reconnect interval.
            sub = bus.subscribe(ep, col, topics=[b"trades."], with_topic=True)
            pub = bus.publisher(ep, bind=True)
        else:
            sub = bus.subscribe(ep, col, topics=[b"trades."], bind=True, with_topic=True)
            pub = bus.publisher(sub.last_endpoint, bind=False)
        assert pub.wait_subscriptions(1, timeout=DEADLINE) == 1
        pub.send(b"trades.AAPL", {"px": 187.25, "qty": 100})
        col.wait(1)
        sub.close()
        assert col.items == [(b"trades.AAPL", {"px": 187.25, "qty": 100})]


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_pyzmq_subscriber_gets_the_first_message(endpoints, transport):
    ctx = zmq.Context()
    s = ctx.socket(zmq.SUB)
    s.linger = 0
    s.rcvtimeo = int(DEADLINE * 1000)
    try:
        with upcall.Bus() as bus:
            pub = bus.publisher(endpoints(transport), bind=True)
            s.setsockopt(zmq.SUBSCRIBE, b"t")
            s.connect(pub.last_endpoint)
            pub.wait_subscriptions(timeout=DEADLINE)
            pub.send(b"t1", [1, 2, 3])
            topic, payload = s.recv_multipart()
        assert (topic, msgpack.unpackb(payload)) == (b"t1", [1, 2, 3])
    finally:
        s.close()
        ctx.term()


def test_subscriptions_are_counted_as_they_come_and_go(endpoints):
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), bind=True)
        assert count(pub) == 0
        # Two subscriber sockets (shared=False: subscriptions sharing one
        # socket hold each distinct prefix once).
        a = bus.subscribe(pub.endpoint, Collector(), topics=[b"a", b"b"], shared=False)
        b = bus.subscribe(pub.endpoint, Collector(), topics=[b"a"], shared=False)
        # The same prefix from two subscribers counts twice.
        assert pub.wait_subscriptions(3, timeout=DEADLINE) == 3
        b.unsubscribe(b"a")
        wait_for(lambda: count(pub) == 2, what="an unsubscribe counted")
        a.close()   # a subscriber that goes away takes its prefixes along
        wait_for(lambda: count(pub) == 0, what="a closed subscriber's prefixes gone")
        b.subscribe(b"z")
        assert pub.wait_subscriptions(1, timeout=DEADLINE) == 1


def test_timeout_raises_timeout_error(endpoints):
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), bind=True)
        with pytest.raises(TimeoutError, match="0 of 1 subscriptions"):
            pub.wait_subscriptions(1, timeout=0.05)
        with pytest.raises(TimeoutError):
            pub.wait_subscriptions(1, timeout=0)
        assert pub.wait_subscriptions(0, timeout=0) == 0


def test_arguments_and_kinds(endpoints):
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), bind=True)
        with pytest.raises(ValueError, match="n must be"):
            pub.wait_subscriptions(-1)
        with pytest.raises(TypeError, match="n must be an int"):
            pub.wait_subscriptions(1.5)
        with pytest.raises(ValueError, match="timeout"):
            pub.wait_subscriptions(1, timeout=-1)
        push = bus.publisher(endpoints("inproc"), kind="push", bind=True)
        with pytest.raises(ValueError, match="push publisher has no subscriptions"):
            push.wait_subscriptions(timeout=0)
        pub.close()
        with pytest.raises(ValueError, match="closed publisher"):
            pub.wait_subscriptions(timeout=0)


@pytest.mark.parametrize("closing", ["publisher", "bus"])
def test_closing_wakes_a_wait(endpoints, closing):
    bus = upcall.Bus()
    pub = bus.publisher(endpoints("inproc"), bind=True)
    errors = []

    def wait():
        try:
            pub.wait_subscriptions(1, timeout=None)
        except BaseException as e:   # reported below
            errors.append(e)

    t = threading.Thread(target=wait)
    t.start()
    try:
        (pub if closing == "publisher" else bus).close()
        t.join(DEADLINE)
        assert not t.is_alive()
    finally:
        bus.close()
    assert len(errors) == 1 and isinstance(errors[0], ValueError), errors


def test_sends_go_on_while_another_thread_waits(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), bind=True)
        waiter = threading.Thread(target=lambda: pub.wait_subscriptions(2, timeout=DEADLINE))
        waiter.start()
        sub = bus.subscribe(pub.endpoint, col)
        # The waiter holds no lock the sender needs: probes go out until one
        # arrives, while it still waits for a second subscription.
        wait_for(lambda: (pub.send(b"", "x"), len(col))[1] > 0, what="a message while waiting")
        bus.subscribe(pub.endpoint, Collector(), shared=False)   # a second subscriber socket
        waiter.join(DEADLINE)
        assert not waiter.is_alive()
        sub.close()


@pytest.mark.parametrize("how", ["sigint", "interrupt_main"])
def test_ctrl_c_interrupts_the_wait(endpoints, how):
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), bind=True)
        interrupt = (lambda: os.kill(os.getpid(), signal.SIGINT)) if how == "sigint" \
            else _thread.interrupt_main
        timer = threading.Timer(0.2, interrupt)
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                pub.wait_subscriptions(1, timeout=DEADLINE)
        finally:
            timer.cancel()
            timer.join()
        # Still usable afterwards.
        assert count(pub) == 0
