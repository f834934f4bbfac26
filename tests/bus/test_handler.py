"""upcall.Handler targets: vtable dispatch, Python subclasses, batches, topics,
errors, every thread kind; over the synthetic source and over real sockets."""
import threading
import time

import pytest

import upcall
from upcall._bus import _synthetic_info, _synthetic_subscribe
from upcall.handler import Counter, Handler, _call_loop

from helpers import DEADLINE, mode_kwargs, run_to_end, wait_for

MODES = ["native", "python", "caller"]


def _subscribe(bus, endpoint, target, mode, **kw):
    """endpoint None: the synthetic source."""
    kw.update(mode_kwargs(mode))
    if endpoint is None:
        return _synthetic_subscribe(bus, target, **kw)
    return bus.subscribe(endpoint, target, **kw)


@pytest.mark.parametrize("mode", MODES)
def test_counter_over_synthetic_source(mode):
    c = Counter()
    with upcall.Bus() as bus:
        sub = _subscribe(bus, None, c, mode, count=10_000, batch=64)
        run_to_end(sub, mode)
        assert c.count == 10_000
        assert c.last is None                       # the default payload is nil
        assert sub.stats["delivered"] == 10_000
        assert sub.stats["batches"] == (10_000 + 63) // 64
        assert sub.closed


@pytest.mark.parametrize("mode", MODES)
def test_python_subclass_override(mode):
    class Collect(Handler):
        def __init__(self):
            self.got = []

        def on_message(self, msg):
            self.got.append(msg)

    h = Collect()
    with upcall.Bus() as bus:
        sub = _subscribe(bus, None, h, mode, count=100, payload=upcall.packb({"a": 1}))
        run_to_end(sub, mode)
    assert h.got == [{"a": 1}] * 100


def test_base_handler_without_override_reports_errors():
    errors = []
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, Handler(), count=5, on_error=lambda e, m: errors.append(e))
        assert sub.wait(DEADLINE)
        assert sub.stats["callback_errors"] == 5
    assert len(errors) == 5 and all(isinstance(e, NotImplementedError) for e in errors)


@pytest.mark.parametrize("mode", MODES)
def test_batches(mode):
    class Batches(Handler):
        def __init__(self):
            self.batches = True
            self.sizes = []

        def on_batch(self, msgs):
            self.sizes.append(len(msgs))

    h = Batches()
    with upcall.Bus() as bus:
        sub = _subscribe(bus, None, h, mode, count=1000, batch=100)
        run_to_end(sub, mode)
        assert sum(h.sizes) == 1000 and max(h.sizes) == 100
        assert sub.stats["delivered"] == 1000


def test_counter_batches_flag():
    c = Counter(batches=True)
    assert c.batches
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, c, count=1000, batch=256)
        assert sub.wait(DEADLINE)
    assert c.count == 1000
    assert sub.stats["batches"] == 4


def test_batch_errors_and_stop():
    class Boom(Handler):
        def __init__(self):
            self.batches = True
            self.calls = 0

        def on_batch(self, msgs):
            self.calls += 1
            if self.calls == 1:
                raise ValueError("boom")
            if self.calls == 3:
                raise upcall.StopDelivery

    h = Boom()
    errors = []
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, h, count=1000, batch=10,
                            on_error=lambda e, m: errors.append((e, len(m))))
        assert sub.wait(DEADLINE)
        st = sub.stats
    assert h.calls == 3
    assert len(errors) == 1 and isinstance(errors[0][0], ValueError) and errors[0][1] == 10
    assert st["callback_errors"] == 10
    assert sub.closed


def test_stop_delivery_from_on_message():
    class StopAt(Handler):
        def __init__(self):
            self.n = 0

        def on_message(self, msg):
            self.n += 1
            if self.n == 50:
                raise upcall.StopDelivery

    h = StopAt()
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, h, count=10_000, batch=16)
        assert sub.wait(DEADLINE)
    assert h.n == 50


def test_with_topic_over_a_socket(endpoints):
    class Topics(Handler):
        def __init__(self):
            self.got = []

        def on_message(self, msg):
            raise AssertionError("with_topic calls on_topic_message")

        def on_topic_message(self, topic, msg):
            self.got.append((topic, msg))

    h = Topics()
    c = Counter()
    ep = endpoints("inproc")
    with upcall.Bus() as bus:
        bus.subscribe(ep, h, kind="pull", bind=True, with_topic=True)
        pub = bus.publisher(ep, kind="push", bind=False)
        for i in range(20):
            pub.send(b"t.%d" % i, {"i": i})
        wait_for(lambda: len(h.got) == 20)
    assert h.got == [(b"t.%d" % i, {"i": i}) for i in range(20)]
    assert c.count == 0


def test_default_on_topic_message_calls_on_message():
    class Plain(Handler):
        def __init__(self):
            self.got = []

        def on_message(self, msg):
            self.got.append(msg)

    h = Plain()
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, h, count=3, payload=upcall.packb(7), with_topic=True)
        assert sub.wait(DEADLINE)
    assert h.got == [7, 7, 7]


def test_counter_with_topic_and_batches():
    c = Counter(batches=True)
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, c, count=10, payload=upcall.packb(1), with_topic=True)
        assert sub.wait(DEADLINE)
    assert c.count == 10 and c.last == (b"", 1)


@pytest.mark.parametrize("mode", MODES)
def test_counter_over_tcp(endpoints, mode):
    c = Counter()
    ep = endpoints("tcp")
    with upcall.Bus() as bus:
        sub = _subscribe(bus, ep, c, mode, kind="pull", bind=True)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False)
        for i in range(500):
            pub.send(b"", i)
        if mode == "caller":
            while c.count < 500:
                sub.poll(timeout=1.0)
        else:
            wait_for(lambda: c.count == 500)
    assert c.last == 499


def test_per_upcall_gil_with_a_handler():
    c = Counter()
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, c, count=2000, gil="per-upcall")
        assert sub.wait(DEADLINE)
    assert c.count == 2000


def test_handler_is_callable_and_call_loop():
    c = Counter()
    c(5)
    assert c.count == 1 and c.last == 5
    assert _call_loop(c, 1000, "x") == 1000
    assert c.count == 1001 and c.last == "x"
    seen = []
    assert _call_loop(seen.append, 3) == 3
    assert seen == [None, None, None]


def test_exported():
    assert upcall.Handler is Handler
    assert upcall.Counter is Counter


def test_target_type_errors():
    with upcall.Bus() as bus:
        with pytest.raises(TypeError):
            _synthetic_subscribe(bus, 42, count=1)
        with pytest.raises(TypeError):
            bus.subscribe("inproc://x", Counter(), count=1)     # count: synthetic only
        with pytest.raises(TypeError):
            _synthetic_subscribe(bus, Counter(), kind="pull")   # kind: sockets only
        with pytest.raises(ValueError):
            _synthetic_subscribe(bus, Counter(), record_latency=True)
        with pytest.raises(TypeError):
            _synthetic_subscribe(bus, Counter(), payload="nil")


def test_synthetic_paced_latency_and_backlog():
    c = Counter()
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, c, count=2000, rate=50_000.0, record_latency=True)
        assert sub.wait(DEADLINE)
        info = _synthetic_info(sub)
    assert c.count == 2000
    assert info["produced"] == 2000 and info["dropped"] == 0
    assert info["last_ns"] - info["start_ns"] >= 39_000_000     # 2000 at 50k/s: 40 ms
    lat = info["latency_ns"]
    assert len(lat) == 2000 and max(lat) < 2 ** 63


def test_synthetic_unlimited_until_closed():
    c = Counter()
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, c)
        wait_for(lambda: c.count > 10_000)
        assert not sub.wait(0.01)
        sub.close()
        assert sub.closed


def test_synthetic_slow_target_drops_beyond_backlog():
    import time

    def slow(msg):
        time.sleep(0.01)

    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, slow, count=2000, rate=20_000.0, batch=4,
                            backlog_max=50)
        assert sub.wait(DEADLINE)
        st = sub.stats
    assert st["dropped"] > 0
    assert st["delivered"] + st["dropped"] == 2000
