"""Progress of a long benchmark section, on stderr (stdout keeps the tables).

On a terminal, one line rewritten in place::

    upcalls  [##########..........]  18/36  python/native

otherwise (a log, a pipe, CI) a plain line each time another tenth of the
runs is done, so that a long run shows it is alive without flooding a log.
"""
from __future__ import annotations

import sys
from typing import IO, Iterable, Iterator, Optional, TypeVar

__all__ = ["Progress", "track"]

T = TypeVar("T")
WIDTH = 20


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

    def step(self, what: str = "") -> None:
        self.done += 1
        if self.tty:
            filled = WIDTH * self.done // self.total if self.total else WIDTH
            bar = "#" * filled + "." * (WIDTH - filled)
            self.stream.write(f"\r\x1b[2K{self.label}  [{bar}]  {self.done}/{self.total}"
                              f"{'  ' + what if what else ''}")
            self.stream.flush()
            self._shown = True
            return
        tenth = 10 * self.done // self.total if self.total else 10
        if tenth > self._last_tenth:
            self._last_tenth = tenth
            self.stream.write(f"{self.label}: {self.done}/{self.total} runs done\n")
            self.stream.flush()

    def close(self) -> None:
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
