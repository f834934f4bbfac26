"""Faults in the subscription path: failing thread factories, interrupted targets, interrupted on_error.

* A thread factory that fails after arranging ``run()``, with ``run()``
  already running or coming later, or never: subscribe() raises the
  factory's error at once, a late run() returns at once, nothing is left
  running or held, the interpreter exits cleanly (each case in a fresh
  interpreter, so that a hang is a failed test, not a hung run).
* A KeyboardInterrupt, SystemExit or GeneratorExit raised by the target or
  by on_error: in caller mode poll() raises it and the messages after the
  interrupted one are delivered by the next poll() (PULL loses nothing); on
  a delivery thread the subscription ends and the rest of its batch is
  counted as dropped.
* poll() on a subscription that has ended raises instead of returning 0.

Every wait has a generous deadline (helpers.DEADLINE); nothing depends on
how long something takes.
"""
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

import upcall
from upcall._bus import _synthetic_subscribe
from upcall.handler import Handler
from upcall.native import FieldFilter
from helpers import DEADLINE, mode_kwargs, script_env, wait_for

pytestmark = pytest.mark.threads

# ---- a thread factory that fails after arranging run() ----------------------

FACTORY_SCRIPT = textwrap.dedent("""
    import concurrent.futures
    import sys
    import threading
    import time

    import upcall

    order = sys.argv[1]
    pool = concurrent.futures.ThreadPoolExecutor(1) if order == "executor" else None
    arranged = []          # threads, runs or futures, by order


    class FactoryError(Exception):
        pass


    def factory(run):
        if order == "running":       # run() is running already when the factory fails
            t = threading.Thread(target=run, name="early-run")
            t.start()
            arranged.append(t)
        elif order == "later":       # run() is called after subscribe() has failed
            arranged.append(run)
        elif order == "executor":    # queued on a pool, then the factory fails
            arranged.append(pool.submit(run))
        elif order == "never":       # run() is dropped: it never comes
            pass
        raise FactoryError("the factory failed after arranging run()")


    with upcall.Bus() as bus:
        ep = "inproc://failing-factory"
        for attempt in range(20):
            t0 = time.monotonic()
            try:
                bus.subscribe(ep, print, kind="pull", bind=True, thread_factory=factory)
            except FactoryError:
                pass
            else:
                raise AssertionError("subscribe() returned although the factory raised")
            print("raised after %.3f s" % (time.monotonic() - t0))
        if order == "later":
            late = [threading.Thread(target=run, name="late-run") for run in arranged]
            for t in late:
                t.start()
            arranged = late
        for a in arranged:
            if isinstance(a, threading.Thread):
                a.join(30)
                assert not a.is_alive(), "run() did not return"
            else:
                a.result(30)         # run() returned (or was refused: an exception)
        if pool is not None:
            pool.shutdown(wait=True)
        assert threading.active_count() == 1, threading.enumerate()
        # Every failed subscription released its socket: the endpoint binds
        # again, and a working factory delivers on it.
        got = []
        sub = bus.subscribe(ep, got.append, kind="pull", bind=True,
                            thread_factory=upcall.python_threads)
        pub = bus.publisher(ep, kind="push", bind=False)
        pub.send(b"", "after")
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == ["after"], got
    print("ok")
""")


@pytest.mark.parametrize("order", ["running", "later", "executor", "never"])
def test_factory_that_fails_after_arranging_run(order):
    # Before the fix: "running" froze the process (subscribe() destroyed the
    # condition variable the running loop waited on, with the GIL held);
    # "later" ran the loop on a freed subscription and hung at exit.
    try:
        # cwd elsewhere: `-c` puts the cwd first on sys.path, and the source
        # tree there may not hold this interpreter's build of upcall.
        proc = subprocess.run([sys.executable, "-c", FACTORY_SCRIPT, order], env=script_env(),
                              cwd=tempfile.gettempdir(), capture_output=True, text=True,
                              timeout=2 * DEADLINE)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("the script hung: %r" % (exc.stdout,)) from None
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("ok"), proc.stdout
    assert proc.stdout.count("raised after") == 20
    assert proc.stderr == "", proc.stderr   # exit clean: no report, no leak


def test_factory_that_fails_after_run_started_in_process():
    # The same in this process (ASan sees it under tools/sanitize-python.sh):
    # run() started on a Python thread, and one kept and called afterwards.
    kept = []

    def factory(run):
        if not kept:
            t = threading.Thread(target=run)
            t.start()
            kept.append(t)
        else:
            kept.append(run)
        raise RuntimeError("no thread for you")

    with upcall.Bus() as bus:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="no thread for you"):
                bus.subscribe("inproc://f-in-process", print, kind="pull", bind=True,
                              thread_factory=factory)
        late = threading.Thread(target=kept[1])
        late.start()
        for t in (kept[0], late):
            t.join(DEADLINE)
            assert not t.is_alive()


# ---- interrupted delivery in caller mode --------------------------------------

INTERRUPTS = [KeyboardInterrupt, SystemExit, GeneratorExit]
N = 100
BATCH = 10     # so that interrupting message 15 leaves 16..19 in the core


class Recording(Handler):
    """A Handler target that records, and calls `hook` first."""

    def __init__(self, hook, batches=False):
        self.items = []
        self.hook = hook
        self.batches = batches

    def on_message(self, msg):
        self.hook(msg)
        self.items.append(msg)

    def on_batch(self, msgs):
        for m in msgs:
            self.hook(m)
        self.items.extend(msgs)


def make_target(kind, hook):
    """(target, items): the subscribe() target of this kind, calling hook(msg)
    before recording msg; `items` is the list it records into."""
    if kind == "callable":
        items = []

        def target(msg):
            hook(msg)
            items.append(msg)
        return target, items
    if kind == "handler":
        h = Recording(hook)
        return h, h.items
    if kind == "native":
        # The filter passes even numbers on: its selection of an interrupted
        # batch must survive to the next poll() without select() seeing any
        # message twice.
        inner, items = make_target("callable", hook)
        return FieldFilter("even", eq=True, target=inner), items
    raise ValueError(kind)


def pull_caller(bus, target, **kw):
    """A caller-mode PULL subscription and a PUSH connected to it (inproc:
    what is sent is queued for the subscription when send returns)."""
    ep = "inproc://faults-%d" % next(_endpoint_numbers)
    sub = bus.subscribe(ep, target, kind="pull", bind=True, delivery="caller",
                        batch=BATCH, **kw)
    pub = bus.publisher(ep, kind="push", bind=False)
    return sub, pub


_endpoint_numbers = iter(range(10 ** 9))


def msg(i):
    return {"i": i, "even": i % 2 == 0}


def poll_until(sub, predicate):
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < deadline, "timed out polling"
        sub.poll(timeout=0.05)


def assert_counts_add_up(stats):
    assert stats["received"] == (stats["delivered"] + stats["filtered"] + stats["decode_errors"]
                                 + stats["callback_errors"] + stats["dropped"]), stats


@pytest.mark.parametrize("exc", INTERRUPTS)
@pytest.mark.parametrize("kind", ["callable", "handler", "native"])
def test_interrupted_target_keeps_the_rest_for_the_next_poll(kind, exc):
    # The bug this guards: 90 of 100 PULL messages were lost, dropped still 0,
    # and the next poll() silently returned 0.
    raised = []

    def hook(m):
        if m["i"] == 16 and not raised:
            raised.append(m["i"])
            raise exc("interrupt at 16")

    target, items = make_target(kind, hook)
    with upcall.Bus() as bus:
        sub, pub = pull_caller(bus, target)
        for i in range(N):
            pub.send(b"", msg(i))
        with pytest.raises(exc):
            poll_until(sub, lambda: False)    # poll() returns after each batch
        assert not sub.closed
        expected = [msg(i) for i in range(N) if i != 16]
        if kind == "native":
            expected = [m for m in expected if m["even"]]
        poll_until(sub, lambda: len(items) >= len(expected))
        assert items == expected            # each once, in order: none lost
        assert sub.poll(timeout=0.05) == 0
        st = sub.stats
        assert st["received"] == N
        assert st["callback_errors"] == 1 and st["dropped"] == 0
        assert st["delivered"] == len(expected)
        assert st["filtered"] == (N // 2 if kind == "native" else 0)
        assert_counts_add_up(st)
        if kind == "native":
            assert target.seen == N         # select() saw every message once
        sub.close()


def test_interrupted_batch_handler():
    # A Handler that takes batches: on_batch had the whole list, which counts
    # as callback errors; the batches after it come with the next polls.
    def hook(m):
        if m["i"] == 15 and not raised:
            raised.append(True)
            raise KeyboardInterrupt

    raised = []
    h = Recording(hook, batches=True)
    with upcall.Bus() as bus:
        sub, pub = pull_caller(bus, h)
        for i in range(N):
            pub.send(b"", msg(i))
        with pytest.raises(KeyboardInterrupt):
            poll_until(sub, lambda: False)    # poll() returns after each batch
        assert sub.stats["callback_errors"] == BATCH     # the list of 10..19
        poll_until(sub, lambda: len(h.items) >= N - BATCH)
        assert [m["i"] for m in h.items] == [i for i in range(N) if not 10 <= i < 20]
        st = sub.stats
        assert st["delivered"] == N - BATCH and st["dropped"] == 0
        assert_counts_add_up(st)
        sub.close()


@pytest.mark.parametrize("kind,source", [
    ("callable", "target"), ("callable", "decode"), ("handler", "target"),
    ("handler", "decode"), ("batch-handler", "decode"),
])
def test_interrupted_on_error_keeps_the_rest(kind, source):
    # The bug this guards: a KeyboardInterrupt raised in on_error was swallowed
    # and poll() carried on.  The message whose report was interrupted is
    # counted (callback or decode error), the ones after it wait.
    reports = []

    def hook(m):
        if m["i"] == 16:
            raise ValueError("bad 16")

    def on_error(exc, m):
        reports.append(exc)
        if len(reports) == 1:
            raise KeyboardInterrupt

    if kind == "batch-handler":
        target = Recording(lambda m: None, batches=True)
        items = target.items
    else:
        target, items = make_target(kind, hook)
    with upcall.Bus() as bus:
        sub, pub = pull_caller(bus, target, on_error=on_error)
        for i in range(N):
            if i == 16 and source == "decode":
                pub.send_packed(b"", b"\xc1")           # never valid msgpack
            else:
                pub.send(b"", msg(i))
        with pytest.raises(KeyboardInterrupt):
            poll_until(sub, lambda: False)    # poll() returns after each batch
        # A batch handler got the messages before the bad one first.
        assert [m["i"] for m in items] == list(range(16))
        poll_until(sub, lambda: len(items) >= N - 1)
        assert [m["i"] for m in items] == [i for i in range(N) if i != 16]
        assert len(reports) == 1
        st = sub.stats
        errors = st["decode_errors"] + st["callback_errors"]
        assert errors == 1 and st["dropped"] == 0 and st["delivered"] == N - 1
        assert_counts_add_up(st)
        sub.close()


def test_real_sigint_inside_the_target():
    # Ctrl-C (a real SIGINT to the main thread) while the target runs Python
    # code: the KeyboardInterrupt is raised inside the target, poll() raises
    # it, and nothing is lost.
    main = threading.main_thread().ident
    hit = []

    def target(m):
        items.append(m)
        if m["i"] == 16 and not hit:
            hit.append(True)
            signal.pthread_kill(main, signal.SIGINT)
            deadline = time.monotonic() + DEADLINE
            while time.monotonic() < deadline:   # Python code: the handler runs here
                pass
            raise AssertionError("no KeyboardInterrupt within the deadline")

    items = []
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with upcall.Bus() as bus:
            sub, pub = pull_caller(bus, target)
            for i in range(N):
                pub.send(b"", msg(i))
            with pytest.raises(KeyboardInterrupt):
                poll_until(sub, lambda: False)    # poll() returns after each batch
            poll_until(sub, lambda: len(items) >= N)
            assert [m["i"] for m in items] == list(range(N))
            st = sub.stats
            assert st["callback_errors"] == 1 and st["delivered"] == N - 1
            assert_counts_add_up(st)
            sub.close()
    finally:
        signal.signal(signal.SIGINT, old)


def test_interrupted_then_closed_counts_the_rest_as_dropped():
    def target(m):
        if m["i"] == 3:
            raise KeyboardInterrupt

    with upcall.Bus() as bus:
        sub, pub = pull_caller(bus, target)
        for i in range(BATCH):
            pub.send(b"", msg(i))
        with pytest.raises(KeyboardInterrupt):
            poll_until(sub, lambda: False)    # poll() returns after each batch
        sub.close()
        st = sub.stats
        assert (st["received"], st["delivered"], st["callback_errors"], st["dropped"]) \
            == (BATCH, 3, 1, BATCH - 4)
        assert_counts_add_up(st)


# ---- on a delivery thread: the subscription ends, the rest is dropped ----------

@pytest.mark.parametrize("exc", INTERRUPTS)
@pytest.mark.parametrize("mode", ["native", "python"])
def test_interrupt_on_a_delivery_thread_ends_and_counts(mode, exc, monkeypatch):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: reported.append(args.exc_type))
    seen = []
    queued = threading.Event()

    def target(m):
        if m["i"] == 0:
            queued.wait(DEADLINE)     # the rest queue up: later batches are full
        seen.append(m["i"])
        if m["i"] == 16:
            raise exc("interrupt at 16")

    with upcall.Bus() as bus:
        ep = "inproc://faults-thread-%d" % next(_endpoint_numbers)
        sub = bus.subscribe(ep, target, kind="pull", bind=True, batch=BATCH, **mode_kwargs(mode))
        pub = bus.publisher(ep, kind="push", bind=False)
        for i in range(N):
            pub.send(b"", msg(i))
        queued.set()
        assert sub.wait(DEADLINE), "the loop did not end"
        assert seen == list(range(17))
        st = sub.stats
        assert st["received"] >= 17
        assert st["callback_errors"] + st["delivered"] == 17
        assert st["dropped"] == st["received"] - 17      # the rest of 16's batch
        assert_counts_add_up(st)
    if exc is SystemExit:
        assert reported == []               # ends the thread's work silently
    else:
        assert reported == [exc]


# ---- poll() on a subscription that has ended -------------------------------------

def test_poll_after_stop_delivery_raises():
    def target(m):
        if m["i"] == 2:
            raise upcall.StopDelivery

    with upcall.Bus() as bus:
        sub, pub = pull_caller(bus, target)
        for i in range(BATCH):
            pub.send(b"", msg(i))
        assert sub.poll(timeout=DEADLINE) == 3
        with pytest.raises(ValueError, match="closed"):
            sub.poll(timeout=0)
        st = sub.stats
        assert (st["delivered"], st["dropped"]) == (3, BATCH - 3)
        assert_counts_add_up(st)


def test_poll_after_the_source_ended_raises():
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, lambda m: None, count=50, delivery="caller")
        assert sub.poll(timeout=DEADLINE) == 50
        assert sub.closed
        with pytest.raises(ValueError, match="closed"):
            sub.poll(timeout=0)


def test_poll_after_close_from_another_thread_raises():
    with upcall.Bus() as bus:
        sub, pub = pull_caller(bus, lambda m: None)
        t = threading.Thread(target=sub.close)
        t.start()
        t.join(DEADLINE)
        with pytest.raises(ValueError, match="closed"):
            sub.poll(timeout=0)
        wait_for(lambda: sub.closed)
