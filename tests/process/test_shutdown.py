"""Shutdown and finalization: sys.exit in a callback, Ctrl-C, stuck targets.

Each scenario runs a real script in a fresh interpreter and must end with the
expected status within 10 s (the issue's bound), with no hang, no core dump
and no fatal error.  `make test` runs this file on every CPython 3.10-3.13
found, since thread-state and finalization behaviour differ between them.
"""
import queue
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest

from helpers import MODE_PRELUDE, script_env

pytestmark = pytest.mark.threads

# The bound for "ends with the expected status".  It is a hang
# detector, not a performance threshold: each script ends in well under 1 s.
END_WITHIN = 10.0
# Waiting for a script to get ready (interpreter start-up, first delivery).
READY_WITHIN = 30.0

PRELUDE = MODE_PRELUDE + textwrap.dedent("""
    import os, threading, time

    EP = "inproc://shutdown"

    def say(*a):
        print(*a, flush=True)

    def flood(pub):
        def run():
            i = 0
            try:
                while True:
                    pub.send(b"t", i)
                    i += 1
            except Exception:
                pass    # the publisher was closed at exit
        threading.Thread(target=run, daemon=True).start()
""")


class Script:
    """A script in a subprocess whose stdout lines can be awaited."""

    def __init__(self, body, *args):
        env = script_env(PYTHONFAULTHANDLER="1")   # a hang or crash shows its stacks
        # cwd elsewhere: `-c` puts the cwd first on sys.path, and the source
        # tree's upcall/ may hold extensions built for another CPython.
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PRELUDE + textwrap.dedent(body), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            cwd=tempfile.gettempdir())
        self.lines = queue.Queue()
        self.out = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.out.append(line)
            self.lines.put(line.strip())
        self.lines.put(None)

    def expect(self, text, timeout=READY_WITHIN):
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                self.dump_and_kill()
                pytest.fail(f"no {text!r} line within {timeout} s: {self.report()}")
            if line is None:
                pytest.fail(f"script ended before printing {text!r}: {self.report()}")
            if line == text:
                return

    def finish(self, timeout=END_WITHIN):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.dump_and_kill()
            pytest.fail(f"script did not end within {timeout} s: {self.report()}")
        self.stderr = self.proc.stderr.read()
        assert "Fatal Python error" not in self.stderr, self.report()
        assert "Segmentation fault" not in self.stderr, self.report()
        assert self.proc.returncode not in (-signal.SIGSEGV, -signal.SIGABRT), self.report()
        return self.proc.returncode

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def dump_and_kill(self):
        # A hung script: SIGABRT makes faulthandler (PYTHONFAULTHANDLER=1)
        # print every thread's stack to stderr, so the report shows where it
        # hangs; SIGKILL only if even that does not end it.
        self.proc.send_signal(signal.SIGABRT)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()

    def report(self):
        err = getattr(self, "stderr", None)
        if err is None and self.proc.poll() is not None:
            err = self.proc.stderr.read()
        return (f"status {self.proc.returncode}\nstdout:\n{''.join(self.out)}"
                f"\nstderr:\n{err}")


SYS_EXIT_IN_CALLBACK = """
    def target(msg):
        if msg == 5:
            sys.exit(3)

    bus = upcall.Bus()
    pub = bus.publisher(EP, kind="push", bind=True)
    sub = bus.subscribe(EP, target, kind="pull", **KW)
    flood(pub)
    say("ready")
    if mode == "caller":
        sub.poll()          # SystemExit(3) comes out of here
        say("poll returned")
    else:
        while not sub.closed:   # the loop ends, as a threading.Thread would
            time.sleep(0.01)
        say("subscription ended")
        say(sub.stats["delivered"])
"""


def test_sys_exit_in_callback_caller_mode_exits_with_its_status():
    s = Script(SYS_EXIT_IN_CALLBACK, "caller")
    s.expect("ready")
    assert s.finish() == 3, s.report()
    assert "poll returned" not in "".join(s.out)


@pytest.mark.parametrize("mode", ["native", "python", "executor"])
def test_sys_exit_in_callback_ends_only_that_delivery_thread(mode):
    # On a delivery thread SystemExit ends the subscription silently, exactly
    # as it ends a threading.Thread; the program goes on and exits normally.
    s = Script(SYS_EXIT_IN_CALLBACK, mode)
    s.expect("subscription ended")
    assert s.finish() == 0, s.report()
    assert "Traceback" not in s.stderr, s.report()
    assert int(s.out[-1]) == 6, s.report()   # messages 0..5 reached the target


CTRL_C_DURING_POLL = """
    # The target says "ready" from inside poll(), which then blocks: the
    # signal is sure to arrive while poll() runs.
    bus = upcall.Bus()
    pub = bus.publisher(EP, kind="push", bind=True)
    sub = bus.subscribe(EP, lambda msg: say("ready"), kind="pull", delivery="caller")
    pub.send(b"t", 1)
    try:
        while True:
            sub.poll()       # returns with the message; then only Ctrl-C ends this
    except KeyboardInterrupt:
        say("interrupted")
        if sys.argv[2] == "reraise":
            raise
"""


def test_ctrl_c_interrupts_a_blocking_poll():
    s = Script(CTRL_C_DURING_POLL, "caller", "catch")
    s.expect("ready")
    s.proc.send_signal(signal.SIGINT)
    s.expect("interrupted", timeout=END_WITHIN)
    assert s.finish() == 0, s.report()


def test_uncaught_ctrl_c_in_poll_exits_like_python_does():
    s = Script(CTRL_C_DURING_POLL, "caller", "reraise")
    s.expect("ready")
    s.proc.send_signal(signal.SIGINT)
    # CPython ends an uncaught KeyboardInterrupt by dying of SIGINT.
    assert s.finish() == -signal.SIGINT, s.report()
    assert "KeyboardInterrupt" in s.stderr


CTRL_C_DURING_DELIVERY = """
    count = [0]
    def target(msg):
        count[0] += 1
        if count[0] == 1000:
            say("delivering")

    bus = upcall.Bus()
    pub = bus.publisher(EP, kind="push", bind=True)
    sub = bus.subscribe(EP, target, kind="pull", **KW)
    flood(pub)
    # The main thread idles, waiting the documented way: Ctrl-C lands here.
    # The signal may come before the wait begins (the test cannot know when
    # the main thread is asleep); bus.wait() still sees it, where
    # threading.Event().wait() can sleep through it for ever.
    if mode == "caller":
        while True:
            sub.poll()   # returns with each batch
    else:
        bus.wait()
    say("the wait returned")
"""


@pytest.mark.parametrize("mode", ["native", "python", "executor", "caller"])
def test_ctrl_c_while_delivery_runs_exits_promptly(mode):
    s = Script(CTRL_C_DURING_DELIVERY, mode)
    s.expect("delivering")
    s.proc.send_signal(signal.SIGINT)
    assert s.finish() == -signal.SIGINT, s.report()
    assert "KeyboardInterrupt" in s.stderr, s.report()
    assert "upcall: at exit" not in s.stderr, s.report()


STUCK_TARGET_AT_EXIT = """
    upcall._bus.EXIT_TIMEOUT = 1.0
    entered = threading.Event()
    def target(msg):
        entered.set()
        threading.Event().wait()      # stuck for ever, without the GIL

    bus = upcall.Bus()
    pub = bus.publisher(EP, kind="push", bind=True)
    sub = bus.subscribe(EP, target, kind="pull", **KW)
    pub.send(b"t", 1)
    entered.wait()
    say("stuck")
"""


@pytest.mark.parametrize("mode", ["native", "python"])
def test_exit_with_a_stuck_target_does_not_hang(mode):
    # Closing at exit waits EXIT_TIMEOUT for the stuck target, says so, and
    # the interpreter then finalizes without that loop ever re-entering it.
    s = Script(STUCK_TARGET_AT_EXIT, mode)
    s.expect("stuck")
    assert s.finish() == 0, s.report()
    assert "upcall: at exit" in s.stderr and "did not stop" in s.stderr, s.report()


BUSY_TARGET_AT_EXIT = """
    # Targets that hold the GIL in long pure-Python work at exit: closing
    # waits for the one in flight, then no further batch starts.
    def target(msg):
        s = 0
        for i in range(20000):
            s += i

    bus = upcall.Bus()
    pub = bus.publisher(EP, kind="push", bind=True)
    subs = [bus.subscribe(EP, target, kind="pull", batch=1, **KW) for _ in range(3)]
    flood(pub)
    while subs[0].stats["delivered"] < 50:
        time.sleep(0.001)
    say("busy")
"""


@pytest.mark.parametrize("mode", ["native", "python"])
def test_exit_while_targets_hold_the_gil(mode):
    s = Script(BUSY_TARGET_AT_EXIT, mode)
    s.expect("busy")
    assert s.finish() == 0, s.report()
    assert "Traceback" not in s.stderr, s.report()
