"""Signals: the core's threads leave them to the application's, and
Bus.wait() lets Ctrl-C in whenever it comes.

Threads the C core makes block asynchronous signals, as libzmq's do.

A signal sent to the process (Ctrl-C, SIGTERM) must be taken by one of the
application's threads: Python runs its handlers on the main thread, and only
a signal the main thread takes wakes it from a blocking wait.  The core's
threads (native delivery threads ``upcall-<n>``, the coalescing flusher
``upcall-coalesce``) are born with every asynchronous signal blocked, the
synchronous ones a fault raises left open (faulthandler still reports a
crash there); the thread that made them keeps its own mask.

A signal can still be taken by a thread that is not the main one (a Python
thread, or any thread while the main one blocks it), or land just before the
main thread goes to sleep: CPython then runs the handler only when the main
thread next runs.  bus.wait() wakes every 200 ms to run it, so it raises
KeyboardInterrupt however the signal came.
"""
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest

import upcall
from helpers import script_env, wait_for

pytestmark = pytest.mark.threads

ASYNCHRONOUS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGCHLD,
                signal.SIGPIPE)
SYNCHRONOUS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)


def blocked(tid):
    """The set of signal numbers the thread ``tid`` of this process blocks."""
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("SigBlk:"):
                mask = int(line.split()[1], 16)
                return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    raise AssertionError(f"no SigBlk line for thread {tid}")


def threads_named(prefix):
    """{tid: name} of this process's threads whose kernel name starts with prefix."""
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except FileNotFoundError:     # the thread ended meanwhile
            continue
        if name.startswith(prefix):
            found[int(tid)] = name
    return found


def assert_blocks_asynchronous_signals(tid, what):
    mask = blocked(tid)
    assert set(ASYNCHRONOUS) <= mask, (
        f"{what} leaves {sorted(signal.Signals(n).name for n in set(ASYNCHRONOUS) - mask)} open")
    assert not set(SYNCHRONOUS) & mask, (
        f"{what} blocks {sorted(signal.Signals(n).name for n in set(SYNCHRONOUS) & mask)}")


def test_native_delivery_thread_blocks_asynchronous_signals():
    before = blocked(threading.get_native_id())
    tids = queue.Queue()
    with upcall.Bus() as bus:
        pub = bus.publisher("inproc://mask-native", kind="push", bind=True)
        sub = bus.subscribe("inproc://mask-native", lambda msg: tids.put(threading.get_native_id()),
                            kind="pull")
        pub.send(b"t", 1)
        tid = tids.get(timeout=30)
        assert tid != threading.get_native_id()
        assert tid in threads_named("upcall-"), "the delivery thread is the core's own"
        # Back in the core, waiting for the next batch, it blocks them again.
        wait_for(lambda: set(ASYNCHRONOUS) <= blocked(tid),
                 what="the delivery thread blocking signals between batches")
        assert_blocks_asynchronous_signals(tid, f"delivery thread {sub.thread_name}")
    # Making it left the subscribing thread's own mask as it was.
    assert blocked(threading.get_native_id()) == before


def test_a_native_target_runs_with_the_subscribers_mask_and_its_children_can_be_stopped():
    # The core's mask is for the core's own code: a target is application
    # code, and what it starts (a process, a thread) inherits the mask it runs
    # with.  A child born with SIGTERM and SIGINT blocked would ignore
    # terminate() and Ctrl-C.
    before = blocked(threading.get_native_id())
    seen = queue.Queue()

    def target(msg):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 cwd=tempfile.gettempdir())
        seen.put((blocked(threading.get_native_id()), child))

    with upcall.Bus() as bus:
        pub = bus.publisher("inproc://mask-target", kind="push", bind=True)
        bus.subscribe("inproc://mask-target", target, kind="pull")
        pub.send(b"t", 1)
        mask, child = seen.get(timeout=30)
    try:
        assert mask == before, "the target runs with the mask of the thread that subscribed"
        child.terminate()
        assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_coalescing_flusher_thread_blocks_asynchronous_signals():
    before = blocked(threading.get_native_id())
    with upcall.Bus() as bus:
        pub = bus.publisher("inproc://mask-coalesce", kind="push", coalesce=True,
                            max_delay=0.001, bind=True)
        flushers = wait_for(lambda: threads_named("upcall-coalesce"),
                            what="a thread named upcall-coalesce")
        for tid, name in flushers.items():
            assert_blocks_asynchronous_signals(tid, name)
        pub.close()
    assert blocked(threading.get_native_id()) == before


# ---- Bus.wait: how a program that only subscribes waits for Ctrl-C -----------

def test_wait_returns_true_once_the_bus_is_closed_from_another_thread():
    bus = upcall.Bus()
    result = []
    waiter = threading.Thread(target=lambda: result.append(bus.wait()))
    waiter.start()
    bus.close()
    waiter.join(30)
    assert not waiter.is_alive() and result == [True]
    assert bus.wait() is True and bus.wait(timeout=0) is True    # closed stays closed


def test_wait_returns_true_when_a_target_closes_the_bus():
    bus = upcall.Bus()
    pub = bus.publisher("inproc://wait-close", kind="push", bind=True)
    bus.subscribe("inproc://wait-close", lambda msg: bus.close(), kind="pull")
    pub.send(b"t", 1)
    assert bus.wait(timeout=30) is True
    assert bus.closed
    bus.close()


def test_wait_returns_false_after_its_timeout():
    with upcall.Bus() as bus:
        assert bus.wait(timeout=0) is False
        assert bus.wait(timeout=0.05) is False
        assert not bus.closed


@pytest.mark.parametrize("timeout, error", [(-1, ValueError), ("1", TypeError),
                                            (math.nan, ValueError)])
def test_wait_refuses_a_bad_timeout_naming_it(timeout, error):
    with upcall.Bus() as bus:
        with pytest.raises(error, match="timeout"):
            bus.wait(timeout=timeout)


SIGNAL_TAKEN_BY_ANOTHER_THREAD = """
    import signal, threading, upcall

    # The main thread blocks SIGINT, so another thread takes it: CPython's C
    # handler runs there and leaves the Python handler for the main thread,
    # which nothing wakes.  The same as a signal whose handler ran just
    # before the main thread went to sleep, made certain.
    bus = upcall.Bus()
    other = threading.Thread(target=threading.Event().wait, daemon=True)
    other.start()
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    try:
        # Inside the try: the other thread may take the signal at once, and
        # the main thread then raises at its next bytecode, the print's end.
        print("waiting", flush=True)
        bus.wait()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
"""


def test_wait_raises_keyboard_interrupt_for_a_signal_the_main_thread_did_not_take():
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SIGNAL_TAKEN_BY_ANOTHER_THREAD)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=script_env(PYTHONFAULTHANDLER="1"), cwd=tempfile.gettempdir())
    try:
        assert proc.stdout.readline().strip() == "waiting"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGABRT)     # faulthandler shows where it waits
            out, err = proc.communicate()
    assert out.strip() == "interrupted", f"status {proc.returncode}\n{out}\n{err}"
    assert proc.returncode == 0, err


def test_the_subscriber_example_ends_on_ctrl_c():
    example = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "examples", "subscriber.py")
    proc = subprocess.Popen([sys.executable, example, "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=script_env(PYTHONFAULTHANDLER="1"), cwd=tempfile.gettempdir())
    try:
        assert proc.stdout.readline().strip() == "tick 0"     # delivery runs
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGABRT)
            out, err = proc.communicate()
    assert out.splitlines()[-1:] == ["interrupted"], f"status {proc.returncode}\n{out}\n{err}"
    assert proc.returncode == 0 and err == "", err
