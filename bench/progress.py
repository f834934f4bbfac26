"""Progress of a long benchmark section, on stderr (stdout keeps the tables).

On a terminal, one line rewritten in place, with an estimate of the time left
(from the runs done so far) and, while the benchmark waits for a quiet
machine before a run, what it waits for::

    upcalls  [##########..........]  18/36  python/native  ~1m20s left
    upcalls  [##########..........]  18/36  waiting for the machine to go idle: 85% busy, 4/30 s

otherwise (a log, a pipe, CI) a plain line each time another tenth of the
runs is done, and one when a wait for an idle machine lasts more than
:data:`WAIT_SHOWN_AFTER` seconds, so that a long run shows it is alive
without flooding a log::

    upcalls: 18/36 runs done, about 1m20s left; 12 s so far spent waiting for an idle machine
    upcalls: waiting for the machine to go idle: 85% busy, up to 30 s

The waits are reported by :func:`bench.measure.wait_for_idle` to every
:class:`Progress` open at the time.
"""
from __future__ import annotations

import sys
import time
from typing import IO, Iterable, Iterator, Optional, TypeVar

from bench import measure

__all__ = ["Progress", "track", "fmt_duration", "WAIT_SHOWN_AFTER"]

T = TypeVar("T")
WIDTH = 20
#: A plain (non-terminal) stream hears of a wait for an idle machine once it
#: has lasted this long (seconds).
WAIT_SHOWN_AFTER = 3.0


def fmt_duration(seconds: float) -> str:
    """45s, 3m05s, 1h02m."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def waiting_text(busy: float, waited: float, timeout: float) -> str:
    """What a wait for an idle machine is waiting for, in words."""
    shown = f"{waited:.0f}" if timeout >= 5 else f"{waited:.1f}"
    return f"waiting for the machine to go idle: {busy:.0%} busy, {shown}/{timeout:g} s"


class Progress:
    """``p = Progress("bus tcp", total)``; ``p.step(what)`` after each run;
    ``p.close()`` at the end (a context manager does it)."""

    def __init__(self, label: str, total: int, stream: Optional[IO[str]] = None):
        self.label, self.total, self.done = label, max(int(total), 0), 0
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self._last_tenth = 0
        self._shown = False
        self._what = ""
        self._t0 = self._t_step = time.monotonic()
        self._waited0 = measure.idle_waited
        self._wait_told = False
        measure.WAIT_LISTENERS.append(self._on_wait)

    def left(self) -> float | None:
        """Seconds left at the pace of the runs done so far (None before the
        first), less the time the run under way has already taken."""
        if not self.done or not self.total:
            return None
        per_run = (self._t_step - self._t0) / self.done
        return max(0.0, per_run * (self.total - self.done) - (time.monotonic() - self._t_step))

    def _eta(self, words: str) -> str:
        """``words`` with the estimate in it, or "" before the first run and after the last."""
        left = self.left()
        if left is None or self.done >= self.total or left < 1:
            return ""
        return words.format(fmt_duration(left))

    def _bar(self, what: str) -> None:
        filled = WIDTH * self.done // self.total if self.total else WIDTH
        bar = "#" * filled + "." * (WIDTH - filled)
        self.stream.write(f"\r\x1b[2K{self.label}  [{bar}]  {self.done}/{self.total}"
                          f"{'  ' + what if what else ''}{self._eta('  ~{} left')}")
        self.stream.flush()
        self._shown = True

    def step(self, what: str = "") -> None:
        self.done += 1
        self._t_step = time.monotonic()
        self._what = what
        self._wait_told = False
        if self.tty:
            self._bar(what)
            return
        tenth = 10 * self.done // self.total if self.total else 10
        if tenth > self._last_tenth:
            self._last_tenth = tenth
            waited = measure.idle_waited - self._waited0
            self.stream.write(f"{self.label}: {self.done}/{self.total} runs done"
                              f"{self._eta(', about {} left')}"
                              + (f"; {waited:.0f} s so far spent waiting for an idle machine"
                                 if waited >= 1 else "") + "\n")
            self.stream.flush()

    def _on_wait(self, busy: float | None, waited: float, timeout: float) -> None:
        if self.tty:
            self._bar(self._what if busy is None else waiting_text(busy, waited, timeout))
            return
        if busy is None:
            if self._wait_told:
                self.stream.write(f"{self.label}: waited {waited:.0f} s for an idle machine\n")
                self.stream.flush()
            self._wait_told = False
        elif waited >= WAIT_SHOWN_AFTER and not self._wait_told:
            self._wait_told = True
            self.stream.write(f"{self.label}: waiting for the machine to go idle: "
                              f"{busy:.0%} busy, up to {timeout:g} s\n")
            self.stream.flush()

    def close(self) -> None:
        if self._on_wait in measure.WAIT_LISTENERS:
            measure.WAIT_LISTENERS.remove(self._on_wait)
        if self.tty and self._shown:
            self.stream.write("\r\x1b[2K")   # the table that follows replaces it
            self.stream.flush()
            self._shown = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def track(items: Iterable[T], label: str, total: int,
          stream: Optional[IO[str]] = None) -> Iterator[T]:
    """Yield ``items``, counting each as one run once the caller comes back
    for the next."""
    with Progress(label, total, stream) as p:
        for item in items:
            yield item
            p.step()
