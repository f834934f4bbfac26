"""Closing a coalescing publisher whose pending batch cannot go (a bound PUSH
that no peer ever connects to).

The close sends pending batches within the publisher's linger, and that wait
follows the rules of every other blocking call of the bus: it lets Ctrl-C in
(even with ``linger=None``, "wait for ever"), a bus closed with a timeout on
another thread cuts it, and so does interpreter exit (EXIT_TIMEOUT).  What is
still pending then is discarded, with a warning on the "upcall" logger.

Each case runs a real script in a fresh interpreter.  A signal is sent only
once the script's closing thread is known to wait inside the close: blocked
in poll(2), which nothing else in these scripts calls.  A close that does not
end is a hang, detected by the generous DEADLINE.
"""
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest

from helpers import DEADLINE, script_env

# poll(2) and ppoll(2), as /proc/<pid>/task/<tid>/syscall numbers them.
POLL_SYSCALLS = {"x86_64": ("7", "271"), "aarch64": ("73",)}.get(platform.machine())

pytestmark = [pytest.mark.threads,
              pytest.mark.skipif(POLL_SYSCALLS is None,
                                 reason="poll(2) syscall numbers unknown for this machine")]

PRELUDE = textwrap.dedent("""
    import logging, os, sys, threading, time, traceback, weakref
    import upcall

    how, linger = sys.argv[1], sys.argv[2]
    POLL = set(sys.argv[3].split(","))
    DEADLINE = float(sys.argv[4])
    logging.basicConfig(stream=sys.stdout, format="LOG %(message)s")

    def say(*what):
        print(*what, flush=True)

    def waits_in_poll(thread):
        with open(f"/proc/self/task/{thread.native_id}/syscall") as f:
            return f.read().split()[0] in POLL

    def when_waiting(thread, then):
        # Calls then() once `thread` waits inside the close.
        def watch():
            end = time.monotonic() + DEADLINE
            while not waits_in_poll(thread):
                if time.monotonic() > end:
                    say("never waited in the close")
                    os._exit(3)
                time.sleep(0.002)
            then()
        threading.Thread(target=watch, daemon=True).start()

    bus = upcall.Bus()
    # A bound PUSH nobody connects to: its batch can never go.
    kw = {} if linger == "default" else {"linger": None}
    pub = bus.publisher("inproc://nobody", kind="push", bind=True, coalesce=True, **kw)
    pub.send(b"t", "pending")
    assert pub.pending == 1
    ref = weakref.ref(pub)

    def close():
        # The three ways a publisher gets closed.
        global pub
        if how == "pub.close":
            pub.close()
        elif how == "bus.close":
            bus.close()
        else:
            del pub      # the last reference: closed by __del__
""")

# Ctrl-C (a real SIGINT, from the test) while the main thread waits in the close.
CTRL_C = PRELUDE + textwrap.dedent("""
    def unraisable(u):   # KeyboardInterrupt in __del__ cannot propagate
        say("unraisable", type(u.exc_value).__name__)
    sys.unraisablehook = unraisable

    when_waiting(threading.main_thread(), lambda: say("waiting in close"))
    try:
        close()
    except KeyboardInterrupt as exc:
        # Raised inside upcall's wait, not after the close returned.
        say("KeyboardInterrupt from", traceback.extract_tb(exc.__traceback__)[-1].filename)
    p = ref()
    say("closed:", p is None or p.closed)
    bus.close()    # after an interrupted bus.close: finishes it
    say("bus closed")
""")

# bus.close(timeout=1) on another thread while the main thread waits in the close.
BUS_CLOSE_TIMEOUT = PRELUDE + textwrap.dedent("""
    result = []
    def close_bus():
        try:
            bus.close(timeout=1)
            result.append("ok")
        except BaseException as exc:
            result.append(repr(exc))
    closer = threading.Thread(target=close_bus)
    when_waiting(threading.main_thread(), closer.start)
    close()
    say("close returned")
    closer.join()
    say("bus.close(timeout=1):", result[0])
""")

# Interpreter exit while a non-daemon thread waits in the close: the exit
# hook's bus close (EXIT_TIMEOUT) must end that wait, or Python waits for the
# thread for ever.
EXIT_WHILE_CLOSING = PRELUDE + textwrap.dedent("""
    upcall._bus.EXIT_TIMEOUT = 0.5
    closing = threading.Thread(target=pub.close, name="closing")
    closing.start()
    ready = threading.Event()
    when_waiting(closing, ready.set)
    ready.wait()
    say("ending")
""")

# Interpreter exit with the batch pending and nothing closed.
EXIT_PENDING = PRELUDE + textwrap.dedent("""
    upcall._bus.EXIT_TIMEOUT = 0.5
    say("ending")
""")


class Script:
    """A script in a fresh interpreter, its stdout lines awaitable."""

    def __init__(self, body, how, linger="none"):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", body, how, linger, ",".join(POLL_SYSCALLS), str(DEADLINE)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=script_env(PYTHONFAULTHANDLER="1"), cwd=tempfile.gettempdir())
        self.lines = queue.Queue()
        self.out = []
        self.err = []
        self._pumps = [threading.Thread(target=self._pump, daemon=True),
                       threading.Thread(target=self._pump_err, daemon=True)]
        for t in self._pumps:
            t.start()

    def _pump(self):
        for line in self.proc.stdout:
            self.out.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _pump_err(self):
        for line in self.proc.stderr:
            self.err.append(line)

    def expect(self, text):
        while True:
            try:
                line = self.lines.get(timeout=DEADLINE)
            except queue.Empty:
                self.kill()
                raise AssertionError(f"no {text!r} within {DEADLINE} s\n{self.report()}")
            if line is None:
                raise AssertionError(f"ended before {text!r}\n{self.report()}")
            if line == text:
                return

    def finish(self):
        """The exit status; a script still running after DEADLINE hangs."""
        try:
            self.proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the close hangs: still running after {DEADLINE} s\n"
                                 f"{self.report()}") from None
        for t in self._pumps:
            t.join(DEADLINE)
        return self.proc.returncode

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        for t in self._pumps:
            t.join(DEADLINE)

    def report(self):
        return "stdout:\n%s\nstderr:\n%s" % ("\n".join(self.out), "".join(self.err))


HOWS = ["pub.close", "bus.close", "del"]


@pytest.mark.parametrize("linger", ["none", "default"])
@pytest.mark.parametrize("how", HOWS)
def test_ctrl_c_interrupts_the_close_and_discards_the_batch(how, linger):
    s = Script(CTRL_C, how, linger)
    s.expect("waiting in close")
    s.proc.send_signal(signal.SIGINT)
    assert s.finish() == 0, s.report()
    if how == "del":
        assert "unraisable KeyboardInterrupt" in s.out, s.report()
    else:
        # The path is the one the build gave Cython (meson: relative to its build dir).
        assert [line for line in s.out if line.startswith("KeyboardInterrupt from ")
                and line.endswith("upcall/_slices.pxi")], s.report()
    assert ("LOG upcall: publisher inproc://nobody closed with 1 coalesced message(s) "
            "not sent (the close was interrupted (KeyboardInterrupt)): discarded") in s.out, \
        s.report()
    assert s.out[-2:] == ["closed: True", "bus closed"], s.report()


@pytest.mark.parametrize("how", HOWS)
def test_bus_close_with_timeout_on_another_thread_ends_a_close_waiting_for_ever(how):
    s = Script(BUS_CLOSE_TIMEOUT, how)
    assert s.finish() == 0, s.report()
    assert s.out[-2:] == ["close returned", "bus.close(timeout=1): ok"], s.report()
    assert ("LOG upcall: publisher inproc://nobody closed with 1 coalesced message(s) "
            "not sent (the close of its bus by a deadline cut its linger): discarded") in s.out, \
        s.report()


def test_exit_ends_a_close_waiting_for_ever_on_another_thread():
    s = Script(EXIT_WHILE_CLOSING, "pub.close")
    assert s.finish() == 0, s.report()
    assert "ending" in s.out, s.report()
    assert ("LOG upcall: publisher inproc://nobody closed with 1 coalesced message(s) "
            "not sent (the close of its bus by a deadline cut its linger): discarded") in s.out, \
        s.report()


def test_exit_discards_a_batch_that_cannot_go_and_says_so():
    s = Script(EXIT_PENDING, "none")
    assert s.finish() == 0, s.report()
    assert s.out[-1] == ("LOG upcall: publisher inproc://nobody closed with 1 coalesced "
                         "message(s) not sent (the close of its bus by a deadline cut its "
                         "linger): discarded"), s.report()
