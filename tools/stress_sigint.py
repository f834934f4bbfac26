#!/usr/bin/env python3
"""Ctrl-C while delivery runs, many times in a row, under CPU load.

Each run starts a fresh interpreter that floods a PUSH publisher into a PULL
subscription delivering in one mode, waits for Ctrl-C the documented way
(``bus.wait()``; in caller mode a ``sub.poll()`` loop), and prints ``delivering``
once delivery is under way.  This script then sends SIGINT; the run passes if
the child raises KeyboardInterrupt and dies of SIGINT, as CPython ends an
uncaught KeyboardInterrupt, within the deadline.  Meanwhile two CPU-bound
processes (started and stopped here) keep both cores busy, which is what
widens the window in which a signal can be lost.

    tools/stress_sigint.py [--runs 200] [--python PY ...] [--mode M ...]
                           [--wait bus|event] [--load 2] [--deadline 10]

One summary line per Python and mode; the exit status is 1 if any run
misbehaved.  ``--wait event`` waits in ``threading.Event().wait()`` instead,
the way that can lose a signal (for comparison), and ``--mode plain`` is a
plain-CPython script of the same shape, with no upcall at all: the baseline.
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

MODES = ("native", "python", "executor", "caller")

# A hang detector, not a performance bound: a run ends well within 1 s.
DEADLINE = 10.0
# Interpreter start-up and the first 1000 deliveries, on a loaded machine.
READY_WITHIN = 60.0

CHILD = r"""
import sys, threading
mode, how = sys.argv[1], sys.argv[2]

def say(*a):
    print(*a, flush=True)

if mode == "plain":
    # No upcall: a busy Python thread, the main thread waiting.
    def busy():
        n = 0
        while True:
            n += 1
            if n == 100000:
                say("delivering")
    threading.Thread(target=busy, daemon=True).start()
    threading.Event().wait()
    raise SystemExit("the wait returned")

import concurrent.futures
import upcall

kw = {
    "native": {},
    "python": {"thread_factory": upcall.python_threads},
    "executor": {"thread_factory": concurrent.futures.ThreadPoolExecutor(
        2, thread_name_prefix="pool").submit},
    "caller": {"delivery": "caller"},
}[mode]
EP = "inproc://stress-sigint"
count = 0

def target(msg):
    global count
    count += 1
    if count == 1000:
        say("delivering")

def flood(pub):
    i = 0
    try:
        while True:
            pub.send(b"t", i)
            i += 1
    except Exception:
        pass    # the publisher was closed at exit

bus = upcall.Bus()
pub = bus.publisher(EP, kind="push", bind=True)
sub = bus.subscribe(EP, target, kind="pull", **kw)
threading.Thread(target=flood, args=(pub,), daemon=True).start()
if mode == "caller":
    while True:
        sub.poll()              # delivers here; only Ctrl-C ends the loop
elif how == "bus":
    bus.wait()                  # the documented way to wait for Ctrl-C
else:
    threading.Event().wait()    # the way that can miss it
raise SystemExit("the wait returned")
"""


def hog():
    """A CPU-bound process (pure Python loop) kept running until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            cwd=tempfile.gettempdir())


def one_run(python, mode, how, deadline=DEADLINE):
    """None if the run behaved, else what went wrong."""
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    # cwd outside the source tree: `-c` puts the cwd first on sys.path.
    proc = subprocess.Popen([python, "-c", CHILD, mode, how], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tempfile.gettempdir())
    ready = threading.Event()
    out = []

    def pump():
        for line in proc.stdout:
            out.append(line)
            if line.strip() == "delivering":
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        if not ready.wait(READY_WITHIN) or proc.poll() is not None and not out:
            return f"not ready: status {proc.poll()}"
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(deadline)
        except subprocess.TimeoutExpired:
            # faulthandler prints every thread's stack on SIGABRT.
            proc.send_signal(signal.SIGABRT)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            err = proc.stderr.read()
            return f"no exit within {deadline} s after SIGINT\n{err[-3000:]}"
        err = proc.stderr.read()
        if proc.returncode != -signal.SIGINT or "KeyboardInterrupt" not in err:
            return f"status {proc.returncode}\n{err[-3000:]}"
        return None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def version(python):
    return subprocess.run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                          capture_output=True, text=True, check=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200, help="runs per Python and mode")
    ap.add_argument("--python", action="append", help="interpreter(s) with upcall installed "
                    "(default: this one)")
    ap.add_argument("--mode", action="append", choices=MODES + ("plain",),
                    help="delivery mode(s) (default: all four)")
    ap.add_argument("--wait", choices=("bus", "event"), default="bus",
                    help="bus: bus.wait() (documented); event: threading.Event().wait()")
    ap.add_argument("--load", type=int, default=2, help="CPU-bound processes kept busy")
    ap.add_argument("--deadline", type=float, default=DEADLINE,
                    help="seconds from SIGINT to the end of the run")
    ap.add_argument("--show", type=int, default=3, help="failures printed in full per mode")
    args = ap.parse_args()
    pythons = args.python or [sys.executable]
    modes = args.mode or list(MODES)

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Started in the background by a shell: SIGINT is ignored, and an
        # ignored signal stays ignored across exec, in every child.  A
        # handler of our own is reset to the default in them instead.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    hogs = [hog() for _ in range(args.load)]
    bad_total = 0
    try:
        for python in pythons:
            v = version(python)
            for mode in modes:
                bad = 0
                t0 = time.monotonic()
                for i in range(args.runs):
                    problem = one_run(python, mode, args.wait, args.deadline)
                    if problem is not None:
                        bad += 1
                        if bad <= args.show:
                            print(f"-- CPython {v} {mode} run {i + 1}: {problem}", flush=True)
                bad_total += bad
                print(f"CPython {v:8} {mode:9} wait={args.wait}: "
                      f"{args.runs - bad}/{args.runs} raised KeyboardInterrupt and exited, "
                      f"{bad} misbehaved ({time.monotonic() - t0:.0f} s, load {args.load})",
                      flush=True)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main())
