"""Measuring helpers shared by the benchmark sections.

The machines this runs on are small virtual machines whose speed swings by up
to 2x for seconds at a time, and whatever else runs there (a build, a test
suite) competes for the same two cores.  So every section measures the same
way:

* compare only within one run, as ratios;
* interleave the variants (A B C A B C ...) so a slow spell hits all of them
  (:func:`interleave`);
* before each timed run wait until the machine is idle (:func:`wait_for_idle`),
  watch the run for CPU used by anything but the processes taking part
  (:class:`LoadMonitor`) and redo a disturbed run (:func:`run_stable`);
* report the median of the repeats with their min-max (:class:`Summary`).

CPU cost is process CPU time (user + system, all threads, from
``resource.getrusage``), see :func:`process_cpu`; a section that wants CPU per
operation divides it by the operations done in the same span.

Machine and process CPU counters come from psutil (``/proc/stat`` and
``/proc/<pid>/stat`` on Linux); a process that has gone away or cannot be read
counts as using no CPU.
"""
from __future__ import annotations

import math
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import psutil

__all__ = [
    "process_cpu", "thread_cpu", "CpuSpan",
    "cpu_busy", "busy_fraction", "wait_for_idle", "set_idle_budget", "idle_budget_spent",
    "LoadMonitor", "RunInfo", "run_stable",
    "interleave", "percentile", "Summary", "summarize", "pinned",
    "add_messages_argument", "run_size",
]

#: A section sized by ``--<section>-messages``: messages per run under
#: --quick, by default and under --full, and runs of each variant likewise.
RUN_MESSAGES = (20_000, 200_000, 1_000_000)
RUN_REPEATS = (1, 3, 5)


def add_messages_argument(parser, section: str) -> None:
    """The ``--<section>-messages N`` option, whose default is :data:`RUN_MESSAGES`."""
    quick, default, full = RUN_MESSAGES
    parser.add_argument(f"--{section}-messages", type=int, default=None, metavar="N",
                        help=f"messages per {section} run (default {default:,}; "
                             f"--quick {quick:,}; --full {full:,})")


def run_size(opts, section: str) -> tuple[int, int]:
    """(messages per run, runs of each variant) for a section sized by
    :func:`add_messages_argument`: its option if given, else by --quick/--full."""
    size = 0 if opts.quick else 2 if opts.full else 1
    return getattr(opts, f"{section}_messages") or RUN_MESSAGES[size], RUN_REPEATS[size]


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
NCPU = os.cpu_count() or 1


# ---- process CPU time ---------------------------------------------------

def process_cpu() -> float:
    """CPU seconds (user + system) used so far by this process, all threads.

    This includes threads Python does not know about (libzmq's I/O threads,
    native delivery threads), which is why it is ``getrusage`` and not a
    per-thread clock.
    """
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def thread_cpu() -> float:
    """CPU seconds used so far by the calling thread only."""
    return time.thread_time()


@dataclass
class CpuSpan:
    """Wall and process-CPU time between two points.

    ``span = CpuSpan.start(); ...; span.stop()`` then ``span.wall`` and
    ``span.cpu`` (seconds).  ``start``/``stop`` are cheap enough (one
    ``getrusage``) to be called from inside a callback under test.
    """
    t0: float = 0.0
    c0: float = 0.0
    wall: float = math.nan
    cpu: float = math.nan

    @classmethod
    def start(cls) -> "CpuSpan":
        span = cls()
        span.mark()
        return span

    def mark(self) -> None:
        self.c0 = process_cpu()
        self.t0 = time.perf_counter()

    def stop(self) -> "CpuSpan":
        t1 = time.perf_counter()
        self.wall = t1 - self.t0
        self.cpu = process_cpu() - self.c0
        return self


# ---- machine load ----------------------------------------------------------

def cpu_busy() -> float:
    """Busy CPU seconds over all CPUs since boot: everything but idle and
    iowait (guest time is already counted in user and nice)."""
    t = psutil.cpu_times()
    return (sum(t) - t.idle - getattr(t, "iowait", 0.0)
            - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0))


def busy_fraction(window: float = 0.2) -> float:
    """Fraction of all CPUs busy over the next ``window`` seconds (0..1)."""
    return psutil.cpu_percent(interval=window) / 100.0


#: Called while :func:`wait_for_idle` waits: ``listener(busy, waited, timeout)``
#: after each busy sample, ``listener(None, waited, timeout)`` once the wait is
#: over.  bench.progress registers one, so that the progress line says what
#: the benchmark is waiting for.
WAIT_LISTENERS: list[Callable[[float | None, float, float], None]] = []

#: Seconds all idle waits of this process may still take (None: no limit).
#: Once spent, each wait is one sample: the run starts on a busy machine and
#: its monitor (:class:`LoadMonitor`) says whether it was disturbed.
_idle_budget: float | None = None
#: Seconds waited, and waits that gave up, so far (for the closing summary).
idle_waited = 0.0
idle_gave_up = 0


def set_idle_budget(seconds: float | None) -> None:
    """Limit the total time every later :func:`wait_for_idle` may wait."""
    global _idle_budget
    _idle_budget = seconds


#: With no listener (a section without a progress line), a wait this long
#: (seconds) is announced on stderr, once.
PLAIN_WAIT_SHOWN_AFTER = 3.0
# --quick checks that every row runs and its figures mean little: it waits
# for no idle machine (one glance still marks a run started on a busy one).
QUICK_IDLE_TIMEOUT = 0.0


def idle_budget_spent() -> bool:
    """True once :func:`set_idle_budget`'s budget has run out."""
    return _idle_budget is not None and _idle_budget <= 0


def _tell(busy: float | None, waited: float, timeout: float, plain_told: list) -> None:
    if WAIT_LISTENERS:
        for listener in list(WAIT_LISTENERS):
            listener(busy, waited, timeout)
    elif busy is not None and waited >= PLAIN_WAIT_SHOWN_AFTER and not plain_told:
        plain_told.append(True)
        print(f"waiting for the machine to go idle: {busy:.0%} busy, up to {timeout:g} s",
              file=sys.stderr, flush=True)


def wait_for_idle(max_busy: float = 0.10, window: float = 0.2,
                  timeout: float = 60.0) -> tuple[bool, float]:
    """Wait until the machine's CPUs are at most ``max_busy`` busy.

    Samples ``busy_fraction(window)`` until one sample is quiet enough or
    ``timeout`` seconds pass (less if the budget of :func:`set_idle_budget`
    runs out).  Returns (idle reached, last busy fraction).
    ``max_busy`` is a fraction of *all* CPUs: 0.10 on 2 CPUs allows 20% of
    one core (the sampling itself, a terminal, a stray daemon).  While it
    waits, :data:`WAIT_LISTENERS` hear how busy the machine is.
    """
    global idle_waited, idle_gave_up, _idle_budget
    if _idle_budget is not None:
        timeout = max(0.0, min(timeout, _idle_budget))
    if timeout <= 0.0:
        window = min(window, 0.05)   # no wait asked for (or the budget is spent): a glance
    t0 = time.monotonic()
    deadline = t0 + timeout
    told = False
    plain_told: list = []
    try:
        while True:
            busy = busy_fraction(window)
            if busy <= max_busy:
                return True, busy
            if time.monotonic() >= deadline:
                idle_gave_up += 1
                return False, busy
            told = True
            _tell(busy, time.monotonic() - t0, timeout, plain_told)
    finally:
        waited = time.monotonic() - t0
        idle_waited += waited
        if _idle_budget is not None:
            _idle_budget = max(0.0, _idle_budget - waited)
        if told:
            _tell(None, waited, timeout, plain_told)


def _pid_cpu(pid: int, reaped_children: bool = False) -> float | None:
    """User + system CPU seconds of a process, all its threads; with
    ``reaped_children``, plus those of its children it has waited for."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    own = t.user + t.system
    return own + t.children_user + t.children_system if reaped_children else own


class LoadMonitor:
    """CPU used during a span by anything but the processes taking part.

    ``mon = LoadMonitor(pids=[peer.pid]); mon.start(); ...; mon.stop()``
    then ``mon.foreign`` is the CPU seconds used by other processes over the
    span and ``mon.foreign_fraction`` that as a fraction of one CPU over the
    span.  This process is always counted as taking part, and so are the
    children it ran and waited for during the span (a C floor program run
    by a benchmark row).  Resolution is one
    jiffy (usually 10 ms), so short spans get a tolerance of a few jiffies.
    """

    def __init__(self, pids: Iterable[int] = ()):
        self.pids = sorted({os.getpid(), *pids})
        self.foreign = 0.0
        self.wall = 0.0
        self.foreign_fraction = 0.0
        self._a = 0.0
        self._own: dict[int, float | None] = {}
        self._t0 = 0.0

    def start(self) -> "LoadMonitor":
        me = os.getpid()
        self._own = {p: _pid_cpu(p, p == me) for p in self.pids}
        self._a = cpu_busy()
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> "LoadMonitor":
        busy = cpu_busy() - self._a          # summed over all CPUs
        self.wall = time.perf_counter() - self._t0
        own = 0.0
        me = os.getpid()
        for p, before in self._own.items():
            after = _pid_cpu(p, p == me)
            if before is not None and after is not None:
                own += after - before
        self.foreign = max(0.0, busy - own)
        self.foreign_fraction = self.foreign / self.wall if self.wall > 0 else 0.0
        return self

    def disturbed(self, max_fraction: float = 0.15, slack_jiffies: int = 4) -> bool:
        """True if others used more than ``max_fraction`` of one CPU.

        ``slack_jiffies`` of foreign time are always tolerated (rounding of
        the counters, the kernel's own housekeeping).
        """
        allowed = max_fraction * self.wall + slack_jiffies / _CLK_TCK
        return self.foreign > allowed


@dataclass
class RunInfo:
    """How a :func:`run_stable` run went."""
    attempts: int = 0
    disturbed: bool = False        # the run kept was still disturbed
    idle_before: bool = True       # the idle check passed before the kept run
    busy_before: float = 0.0       # busy fraction seen by the last idle check
    foreign_fraction: float = 0.0  # others' CPU during the kept run (of one CPU)


def run_stable(fn: Callable[[], Any], *, pids: Iterable[int] = (), retries: int = 3,
               max_busy: float = 0.10, idle_timeout: float = 30.0,
               max_foreign: float = 0.15,
               prepare: Callable[[], Any] | None = None) -> tuple[Any, RunInfo]:
    """Run ``fn()`` on a quiet machine; redo it if something disturbed it.

    Before each attempt: ``prepare()`` if given (set-up that must not be
    timed, such as queueing a flood), then wait for the CPUs to be idle.
    During the attempt, :class:`LoadMonitor` watches for foreign CPU use
    (``pids`` are the other processes taking part, e.g. a peer).  A disturbed
    attempt is redone, up to ``retries`` extra attempts; the last attempt is
    kept either way and ``RunInfo.disturbed`` says whether it was clean.  Once
    the idle budget (:func:`set_idle_budget`) is spent, no run is redone.
    ``fn`` must therefore be repeatable (fresh sockets each time).
    """
    info = RunInfo()
    pids = list(pids)
    result = None
    for attempt in range(retries + 1):
        info.attempts = attempt + 1
        if prepare is not None:
            prepare()
        info.idle_before, info.busy_before = wait_for_idle(max_busy, timeout=idle_timeout)
        mon = LoadMonitor(pids).start()
        result = fn()
        mon.stop()
        info.foreign_fraction = mon.foreign_fraction
        info.disturbed = mon.disturbed(max_foreign)
        if not info.disturbed or idle_budget_spent():
            # (a machine busy for the whole idle budget stays busy: a redo
            # would take the time and be disturbed again)
            break
    return result, info


# ---- CPU affinity ------------------------------------------------------------

def _tids(pid: int) -> list[int]:
    try:
        return [t.id for t in psutil.Process(pid).threads()]
    except psutil.Error:
        return [pid]


class pinned:
    """Context manager: pin every thread of ``pids`` (and this process) to ``cpus``.

    Threads started later by a pinned thread inherit the pinning.  On exit
    each thread that still exists gets its previous affinity back.  Use it
    for latency runs on small virtual machines, where waking a thread on an
    idle vCPU costs tens of microseconds of hypervisor time that no library
    can save: on one CPU the run measures the software path instead.
    Does nothing where ``os.sched_setaffinity`` is missing.
    """

    def __init__(self, cpus: Iterable[int], pids: Iterable[int] = ()):
        self.cpus = set(cpus)
        self.pids = sorted({os.getpid(), *pids})
        self._saved: dict[int, set[int]] = {}

    def __enter__(self) -> "pinned":
        if not hasattr(os, "sched_setaffinity"):
            return self
        for pid in self.pids:
            for tid in _tids(pid):
                try:
                    self._saved[tid] = os.sched_getaffinity(tid)
                    os.sched_setaffinity(tid, self.cpus)
                except OSError:
                    pass
        return self

    def __exit__(self, *exc) -> None:
        for tid, cpus in self._saved.items():
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                pass
        # Threads born while pinned inherited the pinning: free them too.
        if hasattr(os, "sched_setaffinity"):
            everything = set(range(os.cpu_count() or 1))
            for pid in self.pids:
                for tid in _tids(pid):
                    if tid not in self._saved:
                        try:
                            os.sched_setaffinity(tid, everything)
                        except OSError:
                            pass
        self._saved.clear()


# ---- ordering ------------------------------------------------------------

def interleave(variants: Sequence[Any], repeats: int,
               order: str = "rotate") -> Iterator[tuple[int, Any]]:
    """Yield (repeat, variant), every variant once per repeat.

    So that no variant always runs first after a pause, each round starts
    one variant later with ``order="rotate"`` (A B C, B C A, C A B, ...), or
    every other round runs backwards with ``order="mirror"`` (A B C, C B A).
    """
    if order not in ("rotate", "mirror"):
        raise ValueError(f"order must be 'rotate' or 'mirror', not {order!r}")
    k = len(variants)
    for rep in range(repeats):
        if order == "mirror":
            round_ = variants if rep % 2 == 0 else variants[::-1]
        else:
            round_ = [variants[(i + rep) % k] for i in range(k)]
        for variant in round_:
            yield rep, variant


# ---- statistics ----------------------------------------------------------

def percentile(values: Sequence[float], p: float, *, presorted: bool = False) -> float:
    """The p-th percentile (0..100) with linear interpolation between ranks.

    NaN for an empty sequence.  Pass ``presorted=True`` to skip the sort.
    """
    if not values:
        return math.nan
    xs = values if presorted else sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * min(max(p, 0.0), 100.0) / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return float(xs[lo] + (xs[hi] - xs[lo]) * frac)


@dataclass
class Summary:
    """Median of the repeats, with min and max; NaN values are ignored."""
    median: float = math.nan
    min: float = math.nan
    max: float = math.nan
    values: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.values)

    def ratio_to(self, other: "Summary") -> float:
        """median / other.median (NaN when either is missing or zero)."""
        if not (self.median == self.median) or not (other.median == other.median) or other.median == 0:
            return math.nan
        return self.median / other.median


def summarize(values: Iterable[float]) -> Summary:
    """Summarise repeated measurements of one figure."""
    xs = [float(v) for v in values if v is not None and v == v]
    if not xs:
        return Summary()
    return Summary(statistics.median(xs), min(xs), max(xs), xs)
