"""A bus with a thread factory still shares one socket among its per-topic
subscriptions: the shared socket's delivery thread is made by the bus's
factory (a thread of Python's own), and a bus's socket limit is reached only
by subscriptions with sockets of their own, which the error says cost three."""
import threading

import pytest

import upcall

from helpers import DEADLINE, wait_for

pytestmark = pytest.mark.threads


class RecordingFactory:
    """A thread factory that counts its calls and starts a threading.Thread."""

    def __init__(self):
        self.calls = 0
        self.threads = []

    def __call__(self, run):
        self.calls += 1
        t = threading.Thread(target=run, name=f"factory-{self.calls}", daemon=True)
        self.threads.append(t)
        t.start()


def test_bus_factory_makes_the_shared_socket_thread():
    S = 1500      # more than a bus's default max_sockets allows sockets of their own
    factory = RecordingFactory()
    with upcall.Bus(thread_factory=factory) as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", sndhwm=0, bind=True)
        ep = pub.last_endpoint
        seen = [[] for _ in range(S)]
        threads = set()

        def target_for(i):
            def target(msg):
                threads.add(threading.current_thread())
                seen[i].append(msg)
            return target
        subs = [bus.subscribe(ep, target_for(i), topics=[b"t%05d." % i], rcvhwm=0)
                for i in range(S)]
        assert factory.calls == 1                 # one shared socket, one thread
        assert len({s.thread_name for s in subs}) == 1
        pub.wait_subscriptions(S, timeout=DEADLINE)
        for i in range(S):
            pub.send(b"t%05d.x" % i, i)
        wait_for(lambda: all(seen[i] == [i] for i in range(S)), what="every subscription")
        # Delivered on the factory's own threading.Thread, which keeps its name.
        assert threads == set(factory.threads)
        assert threads.pop().name == "factory-1"
        for s in subs:
            s.close()


def test_bus_python_threads_shares_one_socket():
    with upcall.Bus(thread_factory=upcall.python_threads) as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
        ep = pub.last_endpoint
        got, where = [], []

        def target(msg):
            where.append(threading.current_thread())
            got.append(msg)
        subs = [bus.subscribe(ep, target, topics=[b"a%d" % i]) for i in range(3)]
        assert len({s.thread_name for s in subs}) == 1
        pub.wait_subscriptions(3, timeout=DEADLINE)
        pub.send(b"a1", "x")
        wait_for(lambda: got == ["x"])
        assert isinstance(where[0], threading.Thread)
        assert where[0].name == subs[0].thread_name
        assert not isinstance(where[0], threading._DummyThread)
        for s in subs:
            s.close()


def test_bus_factory_error_raised_by_subscribe():
    class Refused(Exception):
        pass

    def factory(run):
        raise Refused("no thread today")

    with upcall.Bus(thread_factory=factory) as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
        with pytest.raises(Refused, match="no thread today"):
            bus.subscribe(pub.last_endpoint, lambda m: None, topics=[b"a"])


def test_socket_limit_error_says_what_a_subscription_costs():
    with upcall.Bus(max_sockets=16) as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
        subs = []
        with pytest.raises(upcall.ZMQError) as info:
            for i in range(16):
                subs.append(bus.subscribe(pub.last_endpoint, lambda m: None,
                                          topics=[b"a%d" % i], shared=False))
        assert "socket of its own" in str(info.value) and "three" in str(info.value)
        for s in subs:
            s.close()
