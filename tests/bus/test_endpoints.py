"""One subscription on several endpoints (one socket bound or connected to
each, served by one loop on one thread), and its SUB prefixes changed while
it runs (sub.subscribe / sub.unsubscribe), in every delivery mode.

Real sockets mixing inproc, ipc and tcp on one subscription; every wait is on
a condition with a deadline (helpers.DEADLINE), nothing depends on timing.
"""
import threading
import time

import pytest

import upcall
from upcall._bus import _synthetic_subscribe
from helpers import DEADLINE, MODES, Collector, Sender, make_pump, mode_kwargs, warm_up


def endpoint_set(endpoints):
    """An inproc, an ipc and a tcp endpoint (tcp with a port picked at bind)."""
    return [endpoints("inproc"), endpoints("ipc"), "tcp://127.0.0.1:*"]


class ThreadRecorder(Collector):
    """A Collector that also records which threads delivered."""

    def __init__(self):
        super().__init__()
        self.threads = set()

    def __call__(self, *args):
        self.threads.add(threading.get_ident())
        super().__call__(*args)


# ---- bound to several ---------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_pull_bound_to_inproc_ipc_and_tcp(endpoints, mode):
    n = 300
    col = ThreadRecorder()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoint_set(endpoints), col, kind="pull", bind=True,
                            with_topic=True, **mode_kwargs(mode))
        pump = make_pump(sub) if mode == "caller" else None
        resolved = sub.last_endpoints
        assert len(resolved) == 3
        assert resolved[:2] == sub.endpoints[:2]
        assert resolved[2].startswith("tcp://127.0.0.1:") and not resolved[2].endswith("*")
        senders = []
        for k, ep in enumerate(resolved):
            pub = bus.publisher(ep, kind="push", bind=False)
            senders.append(Sender(pub, [(b"p%d" % k, i) for i in range(n)]))
        for s in senders:
            s.start()
        col.wait(3 * n, pump=pump)
        for s in senders:
            s.finish()
        # Fair-queued between the peers; each peer's messages in its order.
        for k in range(3):
            assert [i for t, i in col.items if t == b"p%d" % k] == list(range(n))
        assert len(col.items) == 3 * n
        assert len(col.threads) == 1            # one loop serves them all
        assert sub.stats["received"] == 3 * n


@pytest.mark.parametrize("mode", MODES)
def test_sub_connected_to_three_publishers(endpoints, mode):
    col = Collector()
    with upcall.Bus() as bus:
        pubs = [bus.publisher(ep, sndhwm=0, bind=True) for ep in endpoint_set(endpoints)]
        eps = [p.last_endpoint for p in pubs]
        sub = bus.subscribe(tuple(eps), col, with_topic=True, rcvhwm=0, **mode_kwargs(mode))
        assert sub.endpoints == tuple(eps)
        assert sub.last_endpoints == tuple(eps)
        pump = make_pump(sub) if mode == "caller" else None
        for p in pubs:            # each connection joins on its own: probe each
            col.probes = 0
            warm_up(p, col, pump)
        for k, p in enumerate(pubs):
            for i in range(100):
                p.send(b"p%d" % k, i)
            p.send(b"end%d" % k, "end")
        col.wait(303, pump=pump)
        for k in range(3):
            assert [i for t, i in col.items if t == b"p%d" % k] == list(range(100))


def test_endpoint_and_last_endpoint_are_the_first(endpoints):
    with upcall.Bus() as bus:
        eps = endpoint_set(endpoints)
        sub = bus.subscribe(eps, print, kind="pull", bind=True)
        assert sub.endpoint == eps[0]
        assert sub.last_endpoint == sub.last_endpoints[0] == eps[0]
        assert sub.endpoints == tuple(eps)
        for ep in sub.last_endpoints:      # as bound: a port picked at bind, resolved
            assert ep in repr(sub)
        # A port picked at bind is a new port each time: not a repetition.
        two = bus.subscribe(["tcp://127.0.0.1:*"] * 2, print, kind="pull", bind=True)
        assert len(set(two.last_endpoints)) == 2
        # One endpoint as a str or as a one-item list: the same thing.
        one = bus.subscribe([endpoints("inproc")], print, kind="pull", bind=True)
        assert one.endpoints == (one.endpoint,) and one.last_endpoints == (one.last_endpoint,)


# ---- arguments and failures -------------------------------------------------------

@pytest.mark.parametrize("endpoint, exc, words", [
    ([], ValueError, ["endpoint", "empty"]),
    (("inproc://x", "inproc://x"), ValueError, ["endpoint[1]", "inproc://x", "twice"]),
    (["inproc://x", 5], TypeError, ["endpoint[1]", "int"]),
    (["inproc://x", "udp://1.2.3.4:5"], ValueError, ["endpoint[1]", "udp://"]),
    ({"inproc://x"}, TypeError, ["endpoint", "list or tuple", "set"]),
    (b"inproc://x", TypeError, ["endpoint", "bytes"]),
])
def test_bad_endpoint_lists(endpoint, exc, words):
    with upcall.Bus() as bus:
        with pytest.raises(exc) as info:
            bus.subscribe(endpoint, print)
    for w in words:
        assert w in str(info.value)


def test_a_failed_bind_names_its_endpoint_and_releases_the_others(endpoints):
    free, taken = endpoints("inproc"), endpoints("inproc")
    with upcall.Bus() as bus:
        pub = bus.publisher(taken, kind="push", bind=True)   # referenced: a dropped publisher is closed
        with pytest.raises(OSError) as info:
            bus.subscribe([free, taken], print, kind="pull", bind=True)
        assert "endpoint[1]" in str(info.value) and taken in str(info.value)
        assert "in use" in str(info.value)
        # The endpoint bound before the failure is free again at once.
        bus.subscribe(free, print, kind="pull", bind=True).close()


# ---- CURVE: one role and one key set for the socket's endpoints -------------------

def require_curve():
    try:
        return upcall.curve_keypair()
    except RuntimeError as exc:   # libzmq built without CURVE
        pytest.skip(str(exc))


def test_curve_server_bound_to_tcp_and_ipc(endpoints):
    server = require_curve()
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe([endpoints("ipc"), "tcp://127.0.0.1:*"], col, kind="pull",
                            bind=True, curve_server=server)
        for k, ep in enumerate(sub.last_endpoints):
            pub = bus.publisher(ep, kind="push", bind=False, curve_serverkey=server[0])
            pub.send(b"", k)
        col.wait(2)
    assert sorted(col.items) == [0, 1]


def test_curve_client_connected_to_two_servers_sharing_a_key(endpoints):
    server = require_curve()
    col = Collector()
    with upcall.Bus() as bus:
        pubs = [bus.publisher(ep, curve_server=server, sndhwm=0, bind=True)
                for ep in (endpoints("ipc"), endpoints("tcp"))]
        bus.subscribe([p.last_endpoint for p in pubs], col, curve_serverkey=server[0])
        for p in pubs:
            col.probes = 0
            warm_up(p, col)
        for k, p in enumerate(pubs):
            p.send(b"data", k)
        col.wait(2)
    assert sorted(col.items) == [0, 1]


def test_curve_refuses_an_inproc_endpoint_among_several(endpoints):
    inproc = endpoints("inproc")
    with upcall.Bus() as bus:
        with pytest.raises(ValueError) as info:
            bus.subscribe([endpoints("tcp"), inproc], print,
                          curve_serverkey=require_curve()[0])
    assert inproc in str(info.value) and "inproc" in str(info.value)


# ---- topics at run time -------------------------------------------------------------

def publish_until_seen(pub, col, topic, pump=None, timeout=DEADLINE):
    """Send ``topic`` until a message of it arrives: a new prefix reaches the
    publisher asynchronously.  Returns how many were sent."""
    deadline = time.monotonic() + timeout
    start, sent = len(col), 0
    while not any(t == topic for t, _ in col.items[start:]):
        assert time.monotonic() < deadline, "%r never arrived (%d sent)" % (topic, sent)
        pub.send(topic, "sync")
        sent += 1
        if pump is not None:
            pump()
        else:
            time.sleep(0.002)
    return sent


def topics_of(col, start=0):
    return {t for t, _ in col.items[start:]}


@pytest.mark.parametrize("mode", MODES)
def test_subscribe_and_unsubscribe_at_run_time(endpoints, mode):
    col = Collector()
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), sndhwm=0, bind=True)
        sub = bus.subscribe(pub.endpoint, col, topics=(), with_topic=True, rcvhwm=0,
                            **mode_kwargs(mode))
        pump = make_pump(sub) if mode == "caller" else None
        assert sub.topics == ()
        sub.subscribe(b"a.")
        assert sub.topics == (b"a.",)
        publish_until_seen(pub, col, b"a.sync", pump)
        sub.subscribe("b.")                          # str: UTF-8
        assert sub.topics == (b"a.", b"b.")
        publish_until_seen(pub, col, b"b.sync", pump)
        sub.unsubscribe(b"a.")
        assert sub.topics == (b"b.",)
        # From here on the socket drops "a." itself, whatever is in flight.
        start = len(col)
        for i in range(50):
            pub.send(b"a.x", i)
        publish_until_seen(pub, col, b"b.end", pump)
        assert topics_of(col, start) <= {b"b.sync", b"b.end"}


@pytest.mark.parametrize("mode", MODES)
def test_subscribe_from_inside_the_target(endpoints, mode):
    """The target is on the socket's own thread: the change is made at once
    and subscribe() returns at once (waiting would wait for itself)."""
    done = []

    def on_msg(topic, msg):
        if topic == b"a.switch" and not done:
            sub.subscribe(b"b.")
            sub.unsubscribe(b"a.")
            done.append(sub.topics)

    col = Collector(record=on_msg)
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), sndhwm=0, bind=True)
        sub = bus.subscribe(pub.endpoint, col, topics=[b"a."], with_topic=True, rcvhwm=0,
                            **mode_kwargs(mode))
        pump = make_pump(sub) if mode == "caller" else None
        publish_until_seen(pub, col, b"a.switch", pump)
        assert done == [(b"b.",)]
        start = len(col)
        for i in range(50):
            pub.send(b"a.x", i)
        publish_until_seen(pub, col, b"b.x", pump)
        assert b"a.x" not in topics_of(col, start)


def test_no_topics_receive_nothing_until_subscribed(endpoints):
    """topics=() is a SUB socket with no prefix, as in pyzmq: nothing arrives.
    Each round sends a.x then b.x; prefixes reach the publisher in order, so
    had the socket any prefix matching a.x before b., an a.x would arrive no
    later than the first b.x."""
    col = Collector()
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), sndhwm=0, bind=True)
        sub = bus.subscribe(pub.endpoint, col, topics=(), with_topic=True, rcvhwm=0)
        sub.subscribe(b"b.")
        deadline = time.monotonic() + DEADLINE
        while not len(col):
            assert time.monotonic() < deadline
            pub.send(b"a.x", 0)
            pub.send(b"b.x", 0)
            time.sleep(0.002)
        assert topics_of(col) == {b"b.x"}


def test_subscribe_from_another_thread_while_polling(endpoints):
    """Caller mode: a change made while poll() runs is made by that poll."""
    col = Collector()
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), sndhwm=0, bind=True)
        sub = bus.subscribe(pub.endpoint, col, topics=[b"a."], with_topic=True,
                            delivery="caller")
        changed = threading.Event()
        errors = []

        def change():
            try:
                sub.subscribe(b"b.")
            except BaseException as exc:      # reported below
                errors.append(exc)
            changed.set()

        polling = threading.Thread(target=change)
        # Long polls: the change lands while one runs (or between two, where
        # it is made at once); either way subscribe() returns once it is made.
        polling.start()
        deadline = time.monotonic() + DEADLINE
        while not changed.is_set():
            assert time.monotonic() < deadline
            sub.poll(timeout=0.05)
        polling.join()
        assert errors == [] and sub.topics == (b"a.", b"b.")
        publish_until_seen(pub, col, b"b.x", make_pump(sub))


def test_a_busy_target_delays_the_change_and_timeout_says_so(endpoints):
    release = threading.Event()
    entered = threading.Event()

    def stuck(topic, msg):
        if topic == b"a.block":
            entered.set()
            release.wait(DEADLINE)

    col = Collector(record=stuck)
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), sndhwm=0, bind=True)
        sub = bus.subscribe(pub.endpoint, col, topics=[b"a."], with_topic=True)
        while not entered.is_set():
            pub.send(b"a.block", 0)
            entered.wait(0.01)
        with pytest.raises(TimeoutError) as info:
            sub.subscribe(b"b.", timeout=0.05)
        assert "b." in str(info.value) and "queued" in str(info.value)
        assert sub.topics == (b"a.", b"b.")     # queued: shown already
        release.set()
        sub.subscribe(b"b.")                    # nothing new: waits until made
        publish_until_seen(pub, col, b"b.x")


def test_topics_are_a_set_of_prefixes(endpoints):
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("inproc"), print, topics=[b"a", "a", b"b", "é"])
        assert sub.topics == (b"a", b"b", "é".encode())
        sub.subscribe(b"a")                     # there already: no change
        sub.unsubscribe(b"zz")                  # not there: no change
        assert sub.topics == (b"a", b"b", "é".encode())
        sub.unsubscribe(b"a")                   # one removal is enough
        assert sub.topics == (b"b", "é".encode())
        sub.subscribe(bytearray(b"c"))
        assert sub.topics[-1] == b"c" and type(sub.topics[-1]) is bytes
        pull = bus.subscribe(endpoints("inproc"), print, kind="pull")
        assert pull.topics == ()


def test_topic_change_errors(endpoints):
    with upcall.Bus() as bus:
        pull = bus.subscribe(endpoints("inproc"), print, kind="pull")
        for change in (pull.subscribe, pull.unsubscribe):
            with pytest.raises(ValueError) as info:
                change(b"a")
            assert "pull" in str(info.value) and change.__name__ in str(info.value)
        synthetic = _synthetic_subscribe(bus, print, count=1)
        with pytest.raises(ValueError):
            synthetic.subscribe(b"a")
        sub = bus.subscribe(endpoints("inproc"), print)
        with pytest.raises(TypeError) as info:
            sub.subscribe(5)
        assert "topic" in str(info.value)
        with pytest.raises(ValueError):
            sub.subscribe(b"a", timeout=-1)
        sub.close()
        with pytest.raises(ValueError) as info:
            sub.unsubscribe(b"")
        assert "closed" in str(info.value)
