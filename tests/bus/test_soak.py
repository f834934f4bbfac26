"""Soak: 10 million messages through PUSH/PULL over ipc, a new subscription
every 100,000 messages; nothing lost, nothing left behind.

Run by `make soak` (pytest -m soak); `make test` deselects it.

The handover loses nothing by construction.  Messages still queued in a
PULL socket when it closes are gone, so each subscription gets exactly
SUB_MESSAGES messages and is closed only once its target has seen all of
them.  And a PUSH socket that outlives its PULL peer keeps routing messages
to that peer until its I/O thread notices the disconnection (round-robin over
pipes, one of them dead): those are lost too.  So each cycle has its own
endpoint, bound by the subscription, and its own publisher connected to it
(a PUSH with a small sndhwm: it blocks while the receiver is behind, it never
drops), closed with the subscription.  The cycles rotate through native threads, Python threads
and caller delivery.

Resources are sampled after the first cycles (the baseline: libzmq's and the
interpreter's one-time allocations are made by then) and after the last:
threads (/proc/self/task) and open fds (/proc/self/fd) must return to the
baseline exactly; RSS may differ by at most RSS_TOLERANCE (allocator
fragmentation and caches, not growth per cycle: a leak of one byte per
message would be 10 MB).
"""
import faulthandler
import os
import sys
import threading
import time

import pytest

import upcall
from helpers import DEADLINE, fd_count, mode_kwargs, thread_count, wait_for

TOTAL = int(os.environ.get("UPCALL_SOAK_MESSAGES", 10_000_000))
SUB_MESSAGES = 100_000
WARMUP_CYCLES = 3
RSS_TOLERANCE = 8 * 1024 * 1024
MODES = ("native", "python", "caller")


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def loop_threads():
    """Delivery threads still alive: native ones by their OS name, Python-made
    ones by their threading name (both upcall-<n>)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % tid) as f:
                comm = f.read().strip()
        except FileNotFoundError:
            continue
        if comm.startswith("upcall-"):
            names.append(comm)
    names += [t.name for t in threading.enumerate() if t.name.startswith(("upcall-", "soak-"))]
    return names


def fd_targets():
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink("/proc/self/fd/" + fd))
        except OSError:
            pass
    return sorted(out)


def resources():
    return {"rss": rss_bytes(), "threads": thread_count(), "fds": fd_count()}


class Counter:
    """Target: checks that messages arrive in sequence and counts them."""

    def __init__(self, first):
        self.next = first
        self.count = 0
        self.errors = []
        self.done = threading.Event()

    def __call__(self, msg):
        if msg != self.next:
            self.errors.append((self.next, msg))
        self.next = msg + 1
        self.count += 1
        if self.count == SUB_MESSAGES:
            self.done.set()


def _rearm_watchdog():
    """The suite's hang watchdog (conftest) allows one test HANG_TIMEOUT in
    all; the soak runs for minutes, so it re-arms it for every cycle: a hang
    in one cycle is still caught."""
    conftest = sys.modules.get("conftest")
    timeout = getattr(conftest, "HANG_TIMEOUT", 120)
    f = getattr(conftest, "_watchdog_file", None) or sys.stderr
    faulthandler.dump_traceback_later(timeout, exit=True, file=f)


def _sender(pub, start, stop, failures):
    try:
        for i in range(start, stop):
            pub.send(b"", i)
    except BaseException as exc:  # reported by the test
        failures.append(exc)


@pytest.mark.soak
# Minutes in all: no limit for the whole test (0), the hang watchdog re-armed per cycle.
@pytest.mark.timeout(0)
def test_soak_10m_messages_with_subscription_churn(ipc_dir):
    assert TOTAL % SUB_MESSAGES == 0
    cycles = TOTAL // SUB_MESSAGES
    sent = received = 0
    per_sub = []
    baseline = None
    t0 = time.monotonic()
    with upcall.Bus() as bus:
        for cycle in range(cycles):
            _rearm_watchdog()
            mode = MODES[cycle % len(MODES)]
            counter = Counter(sent)
            kwargs = mode_kwargs(mode)
            endpoint = "ipc://%s/soak-%d.sock" % (ipc_dir, cycle)
            sub = bus.subscribe(endpoint, counter, kind="pull", bind=True, rcvhwm=1000, **kwargs)
            pub = bus.publisher(endpoint, kind="push", bind=False, sndhwm=1000)
            failures = []
            sender = threading.Thread(target=_sender, name="soak-sender",
                                      args=(pub, sent, sent + SUB_MESSAGES, failures))
            sender.start()
            if mode == "caller":
                while not counter.done.is_set():
                    sub.poll(timeout=1.0, max_messages=SUB_MESSAGES - counter.count)
            else:
                assert counter.done.wait(DEADLINE * 10), (
                    "cycle %d: %d of %d messages after %d s; stats %s"
                    % (cycle, counter.count, SUB_MESSAGES, DEADLINE * 10, sub.stats))
            sender.join(DEADLINE)
            assert not sender.is_alive() and not failures, failures
            sent += SUB_MESSAGES
            # Every message this subscription will ever get is in: close it.
            pub.close()
            sub.close(timeout=DEADLINE)
            stats = sub.stats
            assert not counter.errors, ("out of order / lost", cycle, counter.errors[:5])
            assert counter.count == SUB_MESSAGES
            assert stats["received"] == stats["delivered"] == SUB_MESSAGES, stats
            assert stats["dropped"] == stats["decode_errors"] == stats["callback_errors"] == 0
            received += counter.count
            per_sub.append(counter.count)
            del sub, pub, counter, sender
            if cycle + 1 == WARMUP_CYCLES or cycle + 1 == cycles:
                # A loop's thread ends a moment after close() returns (its last
                # step comes after the latch): wait until none is left.
                wait_for(lambda: not loop_threads(), what=lambda: "loop threads %s" % loop_threads())
                if baseline is None:
                    baseline = resources()
                else:
                    # libzmq closes a socket's fds on its reaper thread, a
                    # moment after zmq_close: wait for them too.
                    wait_for(lambda: fd_count() <= baseline["fds"],
                             what=lambda: "fds back to %d: %s" % (baseline["fds"], fd_targets()))
                    wait_for(lambda: thread_count() <= baseline["threads"],
                             what=lambda: "threads back to %d (now %d)"
                             % (baseline["threads"], thread_count()))
                    end = resources()

    elapsed = time.monotonic() - t0
    report = ("soak: %d messages sent, %d received, loss %d, %d subscriptions, %.0f s; "
              "baseline rss %.1f MiB threads %d fds %d -> end rss %.1f MiB threads %d fds %d"
              % (sent, received, sent - received, len(per_sub), elapsed,
                 baseline["rss"] / 2**20, baseline["threads"], baseline["fds"],
                 end["rss"] / 2**20, end["threads"], end["fds"]))
    print("\n" + report)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "soak-report.txt"), "a") as f:
        f.write(report + "\n")
    assert sent == TOTAL and received == sent
    assert all(n == SUB_MESSAGES for n in per_sub)
    assert end["threads"] <= baseline["threads"], report
    assert end["fds"] <= baseline["fds"], report
    assert end["rss"] - baseline["rss"] <= RSS_TOLERANCE, report
