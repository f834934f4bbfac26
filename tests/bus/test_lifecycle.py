"""The bus life cycle: closing never waits for a send it could wake, an
interrupted close can be finished, a close with a timeout keeps it whatever
the linger, and what nobody references is collected.

Waits are on conditions with generous deadlines (helpers.DEADLINE); where a
close could hang, it runs on a helper thread that the test joins with that
deadline, so a regression fails instead of hanging the run.
"""
import concurrent.futures
import contextlib
import gc
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import weakref

import pytest

import upcall
from helpers import (DEADLINE, MODE_PRELUDE, Collector, fd_count, free_tcp_port, mode_kwargs,
                     script_env, thread_count, unreachable_tcp_endpoint, wait_for)
from bus_pair import STATE_ERRORS, pair

pytestmark = pytest.mark.threads

MODES = ["native", "python", "caller", "executor"]
THREAD_MODES = ["native", "python", "executor"]
LINGERS = [0, 0.5, 2.0, 60.0, None]


def in_thread(fn, *args, **kwargs):
    """Run fn on a daemon thread; return (thread, outcome list: [value] or [exc])."""
    outcome = []

    def run():
        try:
            outcome.append(fn(*args, **kwargs))
        except BaseException as exc:   # reported by finished()
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, outcome


def finished(t, outcome, what):
    """Join a thread of in_thread(); fail if it is still blocked."""
    t.join(DEADLINE)
    assert not t.is_alive(), f"{what} still blocked after {DEADLINE} s"
    return outcome[0] if outcome else None


class BlockedSender:
    """A target that sends on a PUSH publisher nobody receives from, until
    the send blocks at the high-water mark, and records how it ended.

    ``full`` is set once the pipe is full, just before the send that blocks.
    """

    def __init__(self, pub):
        self.pub = pub
        self.full = threading.Event()
        self.errors = []

    def __call__(self, msg):
        try:
            while True:
                self.pub.send(b"t", msg, timeout=0)
        except BlockingIOError:
            pass
        self.full.set()
        try:
            self.pub.send(b"t", msg)          # blocks: nobody receives
        except ValueError as exc:
            self.errors.append(exc)


class Stuck:
    """A target that blocks until released."""

    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, msg):
        self.entered.set()
        self.release.wait(DEADLINE)


@contextlib.contextmanager
def delivery(mode):
    """subscribe() keyword arguments for ``mode``; "executor": a pool of this
    block's own, shut down (its threads gone) when the block ends."""
    if mode == "executor":
        with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="pool") as pool:
            yield {"thread_factory": pool.submit}
    else:
        yield mode_kwargs(mode)


def start_delivery(bus, endpoints, target, mode, **kw):
    """A PULL subscription in ``mode`` (or with subscribe() keywords ``kw``)
    and a PUSH publisher into it; one message sent.  Caller mode: polled by a
    helper thread.  Returns (sub, pub, poller thread or None)."""
    ep = endpoints("inproc")
    sub = bus.subscribe(ep, target, kind="pull", bind=True, **(kw or mode_kwargs(mode)))
    pub = bus.publisher(ep, kind="push", bind=False)
    pub.send(b"t", 1)
    poller = None
    if mode == "caller":
        poller = threading.Thread(target=lambda: sub.poll(), daemon=True)
        poller.start()
    return sub, pub, poller


def nobody_receives(bus, endpoints):
    """A bound PUSH publisher with no peer: every send blocks at once."""
    return bus.publisher(endpoints("inproc"), kind="push", bind=True, sndhwm=1)


# ---- a target blocked in send never keeps a close waiting -----------------------

@pytest.mark.parametrize("mode", MODES)
def test_bus_close_wakes_a_send_blocked_in_a_target(endpoints, mode):
    threads0 = thread_count()
    with delivery(mode) as kw:
        bus = upcall.Bus()
        sender = BlockedSender(nobody_receives(bus, endpoints))
        sub, pub, poller = start_delivery(bus, endpoints, sender, mode, **kw)
        assert sender.full.wait(DEADLINE)
        t, outcome = in_thread(bus.close)          # no timeout: must not need one
        assert finished(t, outcome, "bus.close()") is None
        assert len(sender.errors) == 1, sender.errors
        assert "the bus was closed" in str(sender.errors[0])
        assert sub.closed and pub.closed and bus.closed
        if poller is not None:
            poller.join(DEADLINE)
            assert not poller.is_alive()
    wait_for(lambda: thread_count() <= threads0,
             what=lambda: f"threads back to {threads0} (now {thread_count()})")


@pytest.mark.parametrize("mode", MODES)
def test_leaving_with_bus_wakes_a_send_blocked_in_a_target(endpoints, mode):
    def scenario():
        with upcall.Bus() as bus:
            sender = BlockedSender(nobody_receives(bus, endpoints))
            start_delivery(bus, endpoints, sender, mode)
            assert sender.full.wait(DEADLINE)
        return sender

    t, outcome = in_thread(scenario)
    sender = finished(t, outcome, "leaving `with Bus()`")
    assert not isinstance(sender, BaseException), sender
    # The with block ends as soon as the pipe is full: the target's last send
    # is either blocked by then (woken: "the bus was closed") or, on a busy
    # machine, starts after the close ("send on a closed publisher").
    assert [("the bus was closed" in str(e) or "send on a closed publisher" in str(e))
            for e in sender.errors] == [True], sender.errors


@pytest.mark.parametrize("mode", MODES)
def test_sub_close_wakes_a_send_blocked_in_its_own_target(endpoints, mode):
    with upcall.Bus() as bus:
        sender = BlockedSender(nobody_receives(bus, endpoints))
        sub, pub, poller = start_delivery(bus, endpoints, sender, mode)
        assert sender.full.wait(DEADLINE)
        t, outcome = in_thread(sub.close)
        assert finished(t, outcome, "sub.close()") is None
        assert sub.closed
        assert len(sender.errors) == 1, sender.errors
        assert "being closed" in str(sender.errors[0]), sender.errors
        # The publisher itself is fine: only the closing target's send was cut.
        assert not pub.closed
        if poller is not None:
            poller.join(DEADLINE)
            assert not poller.is_alive()


def test_a_send_that_does_not_block_still_works_after_its_target_closed_its_subscription(
        endpoints):
    # Closing interrupts only a send that would wait: a target that closes
    # its own subscription and then sends a last message (room in the pipe)
    # still sends it.
    with upcall.Bus() as bus:
        out_ep = endpoints("inproc")
        got = Collector()
        bus.subscribe(out_ep, got, kind="pull", bind=True)
        out = bus.publisher(out_ep, kind="push", bind=False)
        box = {}

        def target(msg):
            box["sub"].close()
            out.send(b"t", "last words")

        in_ep = endpoints("inproc")
        box["sub"] = bus.subscribe(in_ep, target, kind="pull", bind=True)
        pub = bus.publisher(in_ep, kind="push", bind=False)
        pub.send(b"t", 1)
        got.wait(1)
        assert got.items == ["last words"]


# Interpreter exit while a target is blocked in a send: exit closes the bus,
# which wakes the send; nothing is reported as stuck.
BLOCKED_AT_EXIT = MODE_PRELUDE + textwrap.dedent("""
    import threading
    bus = upcall.Bus()
    stuck = bus.publisher("inproc://nobody", kind="push", sndhwm=1, bind=True)
    full = threading.Event()

    def target(msg):
        try:
            while True:
                stuck.send(b"t", msg, timeout=0)
        except BlockingIOError:
            pass
        full.set()
        stuck.send(b"t", msg)                 # blocks until exit closes the bus

    def on_error(exc, msg):
        print("target ended:", exc, flush=True)

    sub = bus.subscribe("inproc://in", target, kind="pull", bind=True, on_error=on_error, **KW)
    feed = bus.publisher("inproc://in", kind="push", bind=False)
    feed.send(b"t", 1)
    if not full.wait(20):
        sys.exit("the target never filled the pipe")
    print("exiting with the target blocked", flush=True)
""")


def run_script(script, *args, timeout=DEADLINE):
    env = script_env()
    env.pop("PYTHONWARNINGS", None)
    try:
        proc = subprocess.run([sys.executable, "-c", script, *args], env=env, cwd="/tmp",
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"script hung: stdout={e.stdout!r} stderr={e.stderr!r}")
    return proc


@pytest.mark.parametrize("mode", THREAD_MODES)
def test_exit_wakes_a_send_blocked_in_a_target(mode):
    proc = run_script(BLOCKED_AT_EXIT, mode)
    report = f"status {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert "exiting with the target blocked" in proc.stdout, report
    assert "target ended: send: the bus was closed" in proc.stdout, report
    assert proc.stderr == "", report


# ---- a close with a timeout keeps it whatever the linger -----------------------------

def unsent_message(bus, linger):
    """A PUSH connected to a tcp port nobody listens on, holding one message
    that can never go."""
    pub = bus.publisher(unreachable_tcp_endpoint(), kind="push", bind=False, linger=linger)
    pub.send(b"t", "never delivered")
    return pub


@pytest.mark.parametrize("linger", LINGERS)
def test_close_with_timeout_cuts_the_linger(linger):
    bus = upcall.Bus()
    pub = unsent_message(bus, linger)
    t, outcome = in_thread(bus.close, timeout=1)
    assert finished(t, outcome, "bus.close(timeout=1)") is None   # returns, no TimeoutError
    assert bus.closed and pub.closed


def test_close_without_timeout_honours_a_short_linger():
    bus = upcall.Bus()
    unsent_message(bus, 0.2)
    t, outcome = in_thread(bus.close)
    assert finished(t, outcome, "bus.close()") is None


def test_two_threads_closing_at_once_both_return():
    # Both wait for the same lingering context; neither frees what the other
    # still waits on (the C bus goes with the Bus object).
    bus = upcall.Bus()
    unsent_message(bus, 0.3)
    closers = [in_thread(bus.close) for _ in range(2)]
    for t, outcome in closers:
        assert finished(t, outcome, "bus.close()") is None
    assert bus.closed and repr(bus) == "<upcall.Bus closed>"


def test_a_publisher_closed_before_keeps_its_linger_and_the_close_says_so():
    # bus.close(timeout) can only cut the linger of what it closes itself:
    # a publisher closed earlier lingers as configured (here: forever), and
    # the close reports that it could not end the context in time.
    bus = upcall.Bus()
    pub = unsent_message(bus, None)
    pub.close()
    t, outcome = in_thread(bus.close, timeout=0.3)
    err = finished(t, outcome, "bus.close(timeout=0.3)")
    assert isinstance(err, TimeoutError), err
    assert "linger" in str(err)
    assert bus.closed


LINGER_AT_EXIT = textwrap.dedent("""
    import sys, socket
    import upcall
    upcall._bus.EXIT_TIMEOUT = 1.0
    port = sys.argv[1]
    linger = None if sys.argv[2] == "None" else float(sys.argv[2])
    bus = upcall.Bus()
    pub = bus.publisher("tcp://127.0.0.1:" + port, kind="push", bind=False, linger=linger)
    pub.send(b"t", "never delivered")
    print("exiting with an unsent message", flush=True)
""")


@pytest.mark.parametrize("linger", [60.0, None])
def test_exit_never_waits_longer_than_exit_timeout_for_a_linger(linger):
    proc = run_script(LINGER_AT_EXIT, str(free_tcp_port()), str(linger))
    report = f"status {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert "exiting with an unsent message" in proc.stdout, report
    # Nothing but the refused connect, said once at the default log level.
    assert all(" failed: connection refused " in line
               for line in proc.stderr.splitlines()), report


# ---- an interrupted close can be finished --------------------------------------------

@contextlib.contextmanager
def ctrl_c_once_blocked(blocked):
    """Ctrl-C for the call made inside the block, once ``blocked()`` says it waits.

    A timer thread sends SIGINT to the main thread every 50 ms (one sent a
    moment too early lands before the wait begins) until one has landed.
    Only the first raises KeyboardInterrupt: one already on its way when the
    first landed is ignored, instead of raising in whatever runs next (a
    later assertion, another test)."""
    landed = threading.Event()

    def on_sigint(signum, frame):
        if not landed.is_set():
            landed.set()
            raise KeyboardInterrupt

    main = threading.main_thread().ident
    deadline = time.monotonic() + DEADLINE

    def run():
        while not landed.wait(0.05) and time.monotonic() < deadline:
            if blocked():
                signal.pthread_kill(main, signal.SIGINT)

    old = signal.signal(signal.SIGINT, on_sigint)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield
    finally:
        landed.set()
        t.join(DEADLINE)
        signal.signal(signal.SIGINT, old)


@pytest.mark.parametrize("mode", ["native", "python", "caller"])
def test_ctrl_c_during_close_leaves_a_bus_that_close_finishes(endpoints, mode):
    fds0, threads0 = baseline()
    bus = upcall.Bus()
    stuck = Stuck()
    sub, pub, poller = start_delivery(bus, endpoints, stuck, mode)
    assert stuck.entered.wait(DEADLINE)
    # sub.closed: bus.close() has asked the loop to stop and waits for it
    with ctrl_c_once_blocked(lambda: sub.closed):
        with pytest.raises(KeyboardInterrupt):
            bus.close()               # waits for the stuck target: Ctrl-C gets in
    assert bus.closed
    assert bus in upcall._bus._open_buses     # still closing: exit would finish it
    stuck.release.set()
    bus.close()                                # finishes what the first one began
    assert sub.closed and pub.closed
    assert bus not in upcall._bus._open_buses
    if poller is not None:
        poller.join(DEADLINE)
    del sub, pub, bus
    back_to((fds0, threads0))


def test_ctrl_c_while_close_waits_for_a_linger():
    bus = upcall.Bus()
    pub = unsent_message(bus, None)            # the context can never end by itself
    # pub.closed: bus.close() closed it and waits for the context
    with ctrl_c_once_blocked(lambda: pub.closed):
        with pytest.raises(KeyboardInterrupt):
            bus.close()
    assert bus.closed
    with pytest.raises(TimeoutError):
        bus.close(timeout=0.1)                 # still lingering: said, not hung


# Ctrl-C during close, then the script just ends: exit finishes the close.
# (Python's atexit hooks run after threading's, where upcall's closes.)
INTERRUPTED_CLOSE_AT_EXIT = MODE_PRELUDE + textwrap.dedent("""
    import atexit, os, signal, threading
    release = threading.Event()
    entered = threading.Event()

    def target(msg):
        entered.set()
        release.wait(20)

    bus = upcall.Bus()
    sub = bus.subscribe("inproc://in", target, kind="pull", bind=True, **KW)
    pub = bus.publisher("inproc://in", kind="push", bind=False)
    pub.send(b"t", 1)
    entered.wait(20)
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        bus.close()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    release.set()
    atexit.register(lambda: print("at exit: closed", sub.closed, pub.closed, flush=True))
""")


@pytest.mark.parametrize("mode", THREAD_MODES)
def test_exit_finishes_an_interrupted_close(mode):
    proc = run_script(INTERRUPTED_CLOSE_AT_EXIT, mode)
    report = f"status {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert "interrupted" in proc.stdout, report
    assert "at exit: closed True True" in proc.stdout, report
    assert proc.stderr == "", report


# ---- what nobody references is collected ---------------------------------------------

def baseline():
    """Descriptors and threads with nothing of upcall's open (after a bus has
    been used once, so that one-time allocations are made)."""
    with upcall.Bus() as bus:
        bus.publisher("inproc://warm-up", kind="push", bind=True)
    gc.collect()
    wait_for(lambda: _settled(), what="the warm-up bus to end")
    return fd_count(), thread_count()


def _settled():
    a = (fd_count(), thread_count())
    time.sleep(0.01)
    return a == (fd_count(), thread_count())


def back_to(base):
    fds0, threads0 = base
    gc.collect()
    wait_for(lambda: fd_count() <= fds0 and thread_count() <= threads0,
             what=lambda: f"fds {fd_count()} -> {fds0}, threads {thread_count()} -> {threads0}")


def resource_warnings(record):
    """The ResourceWarning texts of a warnings.catch_warnings(record=True)
    list, which is emptied: each warning holds its source (the object, kept
    alive by the record until then)."""
    texts = [str(w.message) for w in record if issubclass(w.category, ResourceWarning)]
    record.clear()
    return texts


def test_an_unreferenced_empty_bus_is_closed_with_a_resource_warning():
    base = baseline()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        bus = upcall.Bus()
        ref = weakref.ref(bus)
        del bus
        gc.collect()
    assert any("unclosed <upcall.Bus" in w for w in resource_warnings(record))
    gc.collect()
    assert ref() is None
    back_to(base)


def test_an_unreferenced_bus_with_caller_mode_subscription_and_publisher_is_collected(
        endpoints):
    base = baseline()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        bus = upcall.Bus()
        ep = endpoints("inproc")
        col = Collector()
        sub = bus.subscribe(ep, col, kind="pull", bind=True, delivery="caller")
        pub = bus.publisher(ep, kind="push", bind=False)
        pub.send(b"t", 1)
        sub.poll(timeout=DEADLINE, max_messages=1)
        assert col.items == [1]
        refs = [weakref.ref(o) for o in (bus, sub, pub)]
        del bus, sub, pub
        texts = []
        for _ in refs:       # the subscription and publisher go first: they hold the bus
            gc.collect()
            texts += resource_warnings(record)
    for kind in ("Bus", "Subscription", "Publisher"):
        assert any(f"unclosed <upcall.{kind}" in w for w in texts), (kind, texts)
    assert [r() for r in refs] == [None, None, None]
    back_to(base)


def test_a_dropped_publisher_is_closed_and_its_endpoint_freed(endpoints):
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        with pytest.warns(ResourceWarning, match="unclosed <upcall.Publisher"):
            pub = bus.publisher(ep, kind="push", bind=True)
            del pub
            gc.collect()
        bus.publisher(ep, kind="push", bind=True).close()      # the name is free again
        assert "0 publishers" in repr(bus)


def test_a_dropped_caller_mode_subscription_is_closed(endpoints):
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        with pytest.warns(ResourceWarning, match="unclosed <upcall.Subscription"):
            sub = bus.subscribe(ep, print, kind="pull", bind=True, delivery="caller")
            del sub
            gc.collect()
        bus.subscribe(ep, print, kind="pull", bind=True, delivery="caller").close()
        assert "0 subscriptions" in repr(bus)


@pytest.mark.parametrize("mode", THREAD_MODES)
def test_a_delivering_subscription_keeps_its_bus_alive_until_it_ends(endpoints, mode):
    # The rule: a subscription delivering on a thread keeps its bus alive, as
    # a running thread keeps itself alive; once it ends, the bus is collected.
    base = baseline()
    ep = endpoints("ipc")          # between two buses: inproc is per context
    col = Collector()
    stop_after = 3

    def target(msg):
        col(msg)
        if msg == stop_after:
            raise upcall.StopDelivery

    with upcall.Bus() as sender, delivery(mode) as kw:
        out = sender.publisher(ep, kind="push", bind=True)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            bus = upcall.Bus()
            bus.subscribe(ep, target, kind="pull", **kw)
            ref = weakref.ref(bus)
            del bus
            gc.collect()
            assert ref() is not None                 # alive: its loop runs
            for i in (1, 2):
                out.send(b"t", i)
            col.wait(2)                              # and still delivers
            gc.collect()
            assert ref() is not None
            out.send(b"t", stop_after)               # the loop ends ...
            col.wait(3)
            wait_for(lambda: any("unclosed <upcall.Bus" in str(w.message) for w in record),
                     what="the bus to be collected once its loop ended")
        resource_warnings(record)
        gc.collect()
        assert ref() is None
        out.close()
    back_to(base)


def test_a_thousand_unclosed_buses_leak_nothing(endpoints):
    # Every other cycle the bus has a caller-mode subscription that received
    # a message and a publisher; nothing is closed, only dropped.
    base = baseline()
    got = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for i in range(1000):
            bus = upcall.Bus()
            if i % 2:
                ep = endpoints("inproc")
                sub = bus.subscribe(ep, got.append, kind="pull", bind=True, delivery="caller")
                pub = bus.publisher(ep, kind="push", bind=False)
                pub.send(b"t", i)
                sub.poll(timeout=DEADLINE, max_messages=1)
                del sub, pub
            del bus
    assert got == list(range(1, 1000, 2))
    back_to(base)


# --- close --------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_close_from_inside_the_target(endpoints, mode):
    holder = []
    returned = threading.Event()

    def record(msg):
        if msg == 2:
            holder[0].close()  # must not deadlock
            returned.set()

    col = Collector(record=record)
    with pair(endpoints, "inproc", "pull", mode, col) as (pub, sub, pump):
        holder.append(sub)
        for i in range(10):
            pub.send(b"t", i)
        if mode == "caller":
            # poll returns once the subscription is closed
            while not returned.is_set() and col.calls < 10:
                sub.poll(timeout=DEADLINE)
        assert returned.wait(DEADLINE), "close() called from the target did not return"
        sub.close(timeout=DEADLINE)  # from outside: waits for the loop's end
        assert sub.closed
        assert col.items == [0, 1, 2], "messages delivered after close(): %r" % col.items


def test_close_timeout_when_target_is_stuck(endpoints):
    release = threading.Event()
    entered = threading.Event()

    def target(msg):
        entered.set()
        release.wait(DEADLINE)

    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        pub = bus.publisher(ep, kind="push", bind=True)
        sub = bus.subscribe(ep, target, kind="pull")
        pub.send(b"t", 1)
        assert entered.wait(DEADLINE)
        with pytest.raises(TimeoutError):
            sub.close(timeout=0.1)
        release.set()
        sub.close(timeout=DEADLINE)
        assert sub.closed


def test_close_is_idempotent(endpoints):
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        pub = bus.publisher(ep, kind="push", bind=True)
        sub = bus.subscribe(ep, Collector(), kind="pull")
        sub.close()
        sub.close()
        pub.close()
        pub.close()
        assert sub.closed and pub.closed
        bus.close()
        bus.close()
        assert bus.closed


def test_bus_close_closes_everything(endpoints):
    bus = upcall.Bus()
    ep = endpoints("inproc")
    pub = bus.publisher(ep, kind="push", bind=True)
    subs = [bus.subscribe(ep, Collector(), kind="pull", **mode_kwargs(m)) for m in MODES]
    pub.send(b"t", 1)
    assert not bus.closed
    bus.close()
    assert bus.closed
    assert pub.closed
    assert all(s.closed for s in subs)


@pytest.mark.parametrize("mode", ["native", "python"])
def test_subscribe_close_cycles_leak_nothing(endpoints, mode):
    with upcall.Bus() as bus:
        ep = endpoints("tcp")
        pub = bus.publisher(ep, kind="pub", bind=True)

        def cycle():
            sub = bus.subscribe(ep, Collector(), **mode_kwargs(mode))
            sub.close()
            assert sub.closed

        threads0 = thread_count()  # the bus's libzmq I/O thread is running
        cycle()  # warm-up: first-use allocations
        wait_for(lambda: thread_count() <= threads0,
                 what="the warm-up cycle's delivery thread to exit")
        base_threads = thread_count()
        base_fds = fd_count()
        for _ in range(200):
            cycle()
        wait_for(lambda: thread_count() <= base_threads,
                 what=lambda: "threads back to %d (now %d)" % (base_threads, thread_count()))
        wait_for(lambda: fd_count() <= base_fds,
                 what=lambda: "open fds back to %d (now %d)" % (base_fds, fd_count()))
        pub.close()


def test_subscribe_close_cycles_with_traffic(endpoints):
    # Each cycle: a PULL binds a fresh inproc endpoint, a PUSH connects, one
    # message goes through, both close.
    with upcall.Bus() as bus:
        def cycle():
            ep = endpoints("inproc")
            col = Collector()
            sub = bus.subscribe(ep, col, kind="pull", bind=True)
            pub = bus.publisher(ep, kind="push", bind=False)
            pub.send(b"t", 1)
            col.wait(1)
            sub.close()
            pub.close()

        cycle()
        base_threads = thread_count()
        base_fds = fd_count()
        for _ in range(100):
            cycle()
        wait_for(lambda: thread_count() <= base_threads,
                 what=lambda: "threads back to %d (now %d)" % (base_threads, thread_count()))
        wait_for(lambda: fd_count() <= base_fds,
                 what=lambda: "open fds back to %d (now %d)" % (base_fds, fd_count()))


# --- operations after close -----------------------------------------------------------
# Assumption (not spelled out in the .pyi): close() is idempotent; poll() on a
# closed subscription, send() on a closed publisher, subscribe()/publisher()
# on a closed bus raise STATE_ERRORS; properties (closed, stats, endpoint)
# stay readable.

def test_operations_after_close_raise(endpoints):
    bus = upcall.Bus()
    ep = endpoints("inproc")
    pub = bus.publisher(ep, kind="push", bind=True)
    sub = bus.subscribe(ep, Collector(), kind="pull", delivery="caller")
    sub.close()
    with pytest.raises(STATE_ERRORS):
        sub.poll(timeout=0)
    assert sub.endpoint == ep and isinstance(sub.stats, dict)
    pub.close()
    with pytest.raises(STATE_ERRORS):
        pub.send(b"t", 1)
    with pytest.raises(STATE_ERRORS):
        pub.send_packed(b"t", b"\x01")
    bus.close()
    with pytest.raises(STATE_ERRORS):
        bus.subscribe(endpoints("inproc"), print)
    with pytest.raises(STATE_ERRORS):
        bus.publisher(endpoints("inproc"), bind=True)


def test_context_managers_close(endpoints):
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        with bus.publisher(ep, kind="push", bind=True) as pub:
            with bus.subscribe(ep, Collector(), kind="pull") as sub:
                assert not sub.closed and not pub.closed
            assert sub.closed
        assert pub.closed
    assert bus.closed


# --- more lifetimes ------------------------------------------------------------------

def test_bus_close_from_inside_a_target(endpoints):
    bus = upcall.Bus()
    done = threading.Event()
    holder = []

    def target(msg):
        bus.close()  # must not deadlock on this very loop
        holder.append(msg)
        done.set()

    ep = endpoints("inproc")
    pub = bus.publisher(ep, kind="push", bind=True)
    sub = bus.subscribe(ep, target, kind="pull")
    pub.send(b"t", "x")
    assert done.wait(DEADLINE), "bus.close() inside a target did not return"
    assert holder == ["x"]
    assert bus.closed and pub.closed
    wait_for(lambda: sub.closed, what="the subscription to end after bus.close()")


def test_publisher_close_wakes_a_blocked_send(endpoints):
    # PUSH with no peer: send(timeout=None) blocks.  Closing the publisher
    # from another thread must end that send with an error (the message can
    # never go), not leave the thread blocked forever.
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), kind="push", bind=True)
        outcome = []
        started = threading.Event()

        def blocked():
            started.set()
            try:
                pub.send(b"t", 1)
                outcome.append("returned")
            except Exception as exc:
                outcome.append(exc)

        t = threading.Thread(target=blocked, daemon=True)
        t.start()
        assert started.wait(DEADLINE)
        # the send is in progress (or about to be): close must stop it either way
        pub.close()
        t.join(10)  # a correct close wakes it at once; 10 s only bounds a failure
        assert not t.is_alive(), "send() still blocked after its publisher was closed"
        assert len(outcome) == 1 and isinstance(outcome[0], ValueError), outcome


def test_concurrent_subscribe_close_from_threads(endpoints):
    errors = []
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        pub = bus.publisher(ep, kind="pub", bind=True)
        base_threads = thread_count()

        def worker(k):
            try:
                for i in range(40):
                    kw = mode_kwargs("python" if (i + k) % 2 else "native")
                    with bus.subscribe(ep, Collector(), **kw) as sub:
                        assert not sub.closed
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        wait_for(lambda: thread_count() <= base_threads,
                 what=lambda: "threads back to %d (now %d)" % (base_threads, thread_count()))
        pub.close()
