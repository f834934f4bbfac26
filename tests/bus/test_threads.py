"""Which thread runs the target, under each thread factory and delivery mode."""
import concurrent.futures
import itertools
import threading

import pytest

import upcall
from upcall._bus import _subscribe_per_upcall
from helpers import DEADLINE, Collector, make_msg, wait_for

pytestmark = pytest.mark.threads


def where():
    """What the target sees about the thread it runs on."""
    t = threading.current_thread()
    return {
        "thread": t,
        "ident": threading.get_ident(),
        "native_id": threading.get_native_id(),
        "name": t.name,
        "daemon": t.daemon,
        "main": t is threading.main_thread(),
        "dummy": isinstance(t, threading._DummyThread),
        "listed": any(x is t for x in threading.enumerate()),
        # native ids of the threads Python itself started
        "python_ids": {x.native_id for x in threading.enumerate()
                       if not isinstance(x, threading._DummyThread)},
    }


_endpoint_ids = itertools.count()


def deliver(n=50, *, bus=None, caller_thread=None, per_upcall=False, **sub_kw):
    """Send n messages over inproc PUSH/PULL with batch=1 (one upcall per
    message); return (per-message thread info, subscription thread_name).

    caller_thread: for delivery="caller", "main" polls on this thread,
    "worker" on a fresh threading.Thread (returned info includes its ident).
    per_upcall: PyGILState_Ensure per message instead of an adopted state.
    """
    infos = []
    col = Collector(record=lambda msg: infos.append(where()))
    own_bus = bus is None
    if own_bus:
        bus = upcall.Bus()
    try:
        ep = "inproc://threads-%d" % next(_endpoint_ids)
        pub = bus.publisher(ep, kind="push", bind=True)
        sub_kw.setdefault("batch", 1)
        if per_upcall:
            sub = _subscribe_per_upcall(bus, ep, col, kind="pull", **sub_kw)
        else:
            sub = bus.subscribe(ep, col, kind="pull", **sub_kw)
        try:
            name = sub.thread_name
            for i in range(n):
                pub.send(b"t", i)
            if caller_thread is None:
                col.wait(n)
            else:
                def poll_all():
                    while len(col) < n:
                        sub.poll(timeout=DEADLINE, max_messages=n - len(col))
                if caller_thread == "main":
                    poll_all()
                else:
                    t = threading.Thread(target=poll_all, name="poller")
                    t.start()
                    t.join(DEADLINE)
                    assert not t.is_alive()
                    name = t.ident  # the poller's ident, for the caller to compare
                col.wait(n)
            assert col.items == list(range(n))
        finally:
            sub.close()
            pub.close()
    finally:
        if own_bus:
            bus.close()
    return infos, name


def one_thread(infos):
    """All messages were delivered on one thread; return its info."""
    ids = {i["native_id"] for i in infos}
    assert len(ids) == 1, "delivered on %d different threads" % len(ids)
    assert len({i["ident"] for i in infos}) == 1
    return infos[0]


def test_python_threads():
    infos, name = deliver(thread_factory=upcall.python_threads)
    info = one_thread(infos)
    assert not info["dummy"]
    assert isinstance(info["thread"], threading.Thread)
    assert info["name"].startswith("upcall-"), info["name"]
    assert info["listed"], "the delivery thread is not in threading.enumerate()"
    assert info["daemon"]
    assert not info["main"]
    assert name == info["name"]
    # one thread object for the whole subscription
    assert all(i["thread"] is info["thread"] for i in infos)


def test_python_threads_have_distinct_names():
    a, name_a = deliver(5, thread_factory=upcall.python_threads)
    b, name_b = deliver(5, thread_factory=upcall.python_threads)
    assert name_a != name_b
    assert name_a.startswith("upcall-") and name_b.startswith("upcall-")


def test_python_thread_ends_after_close():
    with upcall.Bus() as bus:
        sub = bus.subscribe("inproc://pt-end", Collector(), kind="pull",
                            thread_factory=upcall.python_threads)
        name = sub.thread_name
        threads = [t for t in threading.enumerate() if t.name == name]
        assert len(threads) == 1
        sub.close()
        threads[0].join(DEADLINE)
        assert not threads[0].is_alive()


def test_executor_submit_as_factory():
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mypool") as ex:
        infos, _ = deliver(thread_factory=ex.submit)
        info = one_thread(infos)
        assert info["name"].startswith("mypool"), info["name"]
        assert not info["dummy"] and info["listed"]
        # the loop has returned: the executor's only worker is free again
        assert ex.submit(lambda: threading.current_thread().name).result(DEADLINE) == info["name"]


@pytest.mark.parametrize("factory", [None, upcall.native_threads])
def test_native_thread_default(factory):
    kw = {} if factory is None else {"thread_factory": factory}
    infos, name = deliver(**kw)
    info = one_thread(infos)
    assert not info["main"]
    assert info["ident"] != threading.get_ident()
    assert info["native_id"] not in info["python_ids"], \
        "delivered on a thread Python started"
    assert info["dummy"], "current_thread() is %r, not a _DummyThread" % info["thread"]
    assert isinstance(name, str)
    # "adopt": one thread state kept for the whole loop, so threading sees
    # the same (dummy) thread object for every message
    assert all(i["thread"] is info["thread"] for i in infos)


def test_native_thread_is_not_main_even_under_load():
    infos, _ = deliver(2000, batch=None)
    info = one_thread(infos)
    assert not info["main"] and info["dummy"]


def test_caller_mode_runs_on_callers_thread():
    infos, name = deliver(delivery="caller", caller_thread="main")
    info = one_thread(infos)
    assert info["ident"] == threading.get_ident()
    assert info["main"]
    assert name is None


def test_caller_mode_on_a_worker_thread():
    infos, poller_ident = deliver(delivery="caller", caller_thread="worker")
    info = one_thread(infos)
    assert info["ident"] == poller_ident
    assert info["name"] == "poller"


@pytest.mark.parametrize("factory", [None, upcall.python_threads])
def test_gil_per_upcall_delivers_correctly(factory):
    kw = {} if factory is None else {"thread_factory": factory}
    n = 2000
    col = Collector()
    with upcall.Bus() as bus:
        pub = bus.publisher("inproc://per-upcall", kind="push", bind=True)
        sub = _subscribe_per_upcall(bus, "inproc://per-upcall", col, kind="pull", **kw)
        expected = [make_msg(i) for i in range(n)]
        for m in expected:
            pub.send(b"t", m)
        col.wait(n)
        assert col.items == expected
        wait_for(lambda: sub.stats["delivered"] == n, what=lambda: repr(sub.stats))


def test_gil_per_upcall_on_native_thread():
    infos, _ = deliver(200, per_upcall=True)
    info = one_thread(infos)
    assert not info["main"] and info["dummy"]
    assert info["native_id"] not in info["python_ids"]


def test_bus_thread_factory_applies_and_is_overridden():
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mypool") as ex:
        with upcall.Bus(thread_factory=upcall.python_threads) as bus:
            info = one_thread(deliver(5, bus=bus)[0])
            assert info["name"].startswith("upcall-") and info["listed"]

            info = one_thread(deliver(5, bus=bus, thread_factory=ex.submit)[0])
            assert info["name"].startswith("mypool")

            info = one_thread(deliver(5, bus=bus, thread_factory=upcall.native_threads)[0])
            assert info["dummy"] and info["native_id"] not in info["python_ids"]

            info = one_thread(deliver(5, bus=bus, delivery="caller", caller_thread="main")[0])
            assert info["main"]


def test_custom_factory_gets_a_named_run_called_once():
    calls = []
    threads = []

    def factory(run):
        calls.append(run)
        assert isinstance(run.name, str) and run.name
        t = threading.Thread(target=run, name="custom-" + run.name)
        threads.append(t)
        t.start()
        return "ignored"

    infos, _ = deliver(20, thread_factory=factory)
    assert len(calls) == 1
    info = one_thread(infos)
    assert info["thread"] is threads[0]
    # close() returned: run() has returned, so the thread ends
    threads[0].join(DEADLINE)
    assert not threads[0].is_alive()


def test_close_before_the_factory_ran_run():
    # A factory may run run() late (a saturated executor) or, here, only
    # after the subscription was closed.  Assumption: close() does not wait
    # for a loop that never started (nothing can be delivered), and a run()
    # called afterwards returns at once.
    runs = []
    with upcall.Bus() as bus:
        sub = bus.subscribe("inproc://never-run", print, kind="pull", thread_factory=runs.append)
        assert len(runs) == 1
        try:
            try:
                # a correct close returns at once; 5 s only bounds a failure
                sub.close(timeout=5)
                outcome = None
            except TimeoutError as exc:
                outcome = exc
        finally:
            # run it late in any case, so that the bus can close afterwards
            t = threading.Thread(target=runs[0])
            t.start()
            t.join(DEADLINE)
        assert outcome is None, "close() waited for a loop that never started: %r" % outcome
        assert sub.closed
        assert not t.is_alive(), "run() called after close() did not return"


def test_saturated_executor_subscriptions_close():
    # One worker, two subscriptions: the second loop waits for the worker
    # until the first ends.  Closing the waiting one must not block on it.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="busy") as ex:
        bus = upcall.Bus(thread_factory=ex.submit)
        first = bus.subscribe("inproc://sat-1", print, kind="pull")
        second = bus.subscribe("inproc://sat-2", print, kind="pull")
        try:
            try:
                # a correct close returns at once; 5 s only bounds a failure
                second.close(timeout=5)
                outcome = None
            except TimeoutError as exc:
                outcome = exc
        finally:
            # free the worker first, so that everything can close in any case
            first.close(timeout=DEADLINE)
            second.close(timeout=DEADLINE)
            bus.close(timeout=DEADLINE)
        assert outcome is None, "close() waited for a loop that never started: %r" % outcome
        assert first.closed and second.closed


def test_factory_that_raises_fails_subscribe():
    def factory(run):
        raise RuntimeError("no threads today")

    with upcall.Bus() as bus:
        with pytest.raises(Exception) as info:
            bus.subscribe("inproc://f-raises", print, kind="pull", thread_factory=factory)
        e = info.value
        texts = [str(e), str(e.__cause__), str(e.__context__)]
        assert any("no threads today" in t for t in texts), texts
        # the bus is still usable
        col = Collector()
        pub = bus.publisher("inproc://after", kind="push", bind=True)
        bus.subscribe("inproc://after", col, kind="pull")
        pub.send(b"t", 1)
        col.wait(1)


@pytest.mark.parametrize("factory", ["native", "python"])
def test_many_subscriptions_each_on_its_own_thread(factory):
    kw = {} if factory == "native" else {"thread_factory": upcall.python_threads}
    n_subs = 8
    infos = [[] for _ in range(n_subs)]
    cols = [Collector(record=lambda msg, k=k: infos[k].append(where())) for k in range(n_subs)]
    with upcall.Bus() as bus:
        pubs = []
        for k in range(n_subs):
            ep = "inproc://many-%d" % k
            pubs.append(bus.publisher(ep, kind="push", bind=True))
            bus.subscribe(ep, cols[k], kind="pull", **kw)
        for i in range(100):
            for p in pubs:
                p.send(b"t", i)
        for c in cols:
            c.wait(100)
    ids = [one_thread(i)["native_id"] for i in infos]
    assert len(set(ids)) == n_subs
    assert all(c.items == list(range(100)) for c in cols)
