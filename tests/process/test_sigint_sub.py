"""Ctrl-C in the subscription's blocking calls (the
subscription part): a real SIGINT, sent to the main thread by a timer thread
with signal.pthread_kill, raises KeyboardInterrupt out of poll(), close() and
wait() while they block, in every delivery mode where the call applies, and
a later close() completes.

The calls wait in slices of at most 200 ms with signal handlers run in
between; how long the KeyboardInterrupt took is recorded (`latencies`) but
not asserted: the call would otherwise block for DEADLINE seconds.
"""
import contextlib
import signal
import threading
import time

import pytest

import upcall
from helpers import DEADLINE, mode_kwargs

pytestmark = pytest.mark.threads

latencies = []


@pytest.fixture(autouse=True)
def default_sigint_handler():
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def sigint_after(delay=0.3):
    """Send SIGINT to the main thread `delay` seconds from now; the block must
    raise KeyboardInterrupt (started inside it, so that even a late timer
    cannot land outside)."""
    main = threading.main_thread().ident
    sent = []

    def fire():
        sent.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)

    timer = threading.Timer(delay, fire)
    try:
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            yield
        latencies.append(time.monotonic() - sent[0])
    finally:
        timer.cancel()
        timer.join()


def pull(bus, target, mode, **kw):
    ep = "inproc://sigint-%d-%s" % (time.monotonic_ns(), mode)
    sub = bus.subscribe(ep, target, kind="pull", bind=True, **mode_kwargs(mode), **kw)
    pub = bus.publisher(ep, kind="push", bind=False)
    return sub, pub


def test_sigint_in_an_idle_poll():
    got = []
    with upcall.Bus() as bus:
        sub, pub = pull(bus, got.append, "caller")
        with sigint_after():
            sub.poll(timeout=DEADLINE)
        pub.send(b"", 1)                 # still usable
        assert sub.poll(timeout=DEADLINE, max_messages=1) == 1
        assert got == [1]
        sub.close()
        assert sub.closed


@pytest.mark.parametrize("mode", ["native", "python", "executor", "caller"])
def test_sigint_in_close_waiting_for_a_stuck_target(mode):
    entered = threading.Event()
    release = threading.Event()

    def stuck(msg):
        entered.set()
        release.wait(DEADLINE)

    with upcall.Bus() as bus:
        sub, pub = pull(bus, stuck, mode)
        poller = None
        if mode == "caller":
            # the poll runs on another thread; close() on this one waits for it
            poller = threading.Thread(target=lambda: sub.poll(timeout=DEADLINE), daemon=True)
            poller.start()
        pub.send(b"", 1)
        assert entered.wait(DEADLINE)
        with sigint_after():
            sub.close()
        release.set()
        sub.close(timeout=DEADLINE)      # completes once the target returns
        assert sub.closed
        if poller is not None:
            poller.join(DEADLINE)
            assert not poller.is_alive()


@pytest.mark.parametrize("mode", ["native", "python", "executor"])
def test_sigint_in_wait(mode):
    with upcall.Bus() as bus:
        sub, pub = pull(bus, lambda m: None, mode)
        with sigint_after():
            sub.wait()
        sub.close(timeout=DEADLINE)
        assert sub.closed


def test_sigint_in_close_then_close_again_many_times():
    # Interrupting close() repeatedly leaves a subscription that a later
    # close() still finishes; nothing is left half closed.
    release = threading.Event()
    entered = threading.Event()

    def stuck(msg):
        entered.set()
        release.wait(DEADLINE)

    with upcall.Bus() as bus:
        sub, pub = pull(bus, stuck, "native")
        pub.send(b"", 1)
        assert entered.wait(DEADLINE)
        for _ in range(3):
            with sigint_after(0.05):
                sub.close()
        release.set()
        sub.close(timeout=DEADLINE)
        assert sub.closed
