"""Plain-text tables for the benchmark sections.

A table is a list of :class:`Column` and a list of rows (dicts).  Each
column takes its value from the row by key (or with a function), formats it,
and aligns it: text left, numbers right.  Missing values print as ``-``.

    cols = [Column("mode", "mode"),
            Column("rate", "msgs/s", fmt=fmt_rate),
            Column("rate_ratio", "x pyzmq", fmt=fmt_ratio)]
    print(render(rows, cols, title="tcp"))

Formatting helpers: :func:`fmt_rate` (1.23M), :func:`fmt_num`,
:func:`fmt_ratio` (3.10x), :func:`fmt_range` (a median with its min-max from
:class:`bench.measure.Summary`), :func:`ratio`.

Tables fit :data:`WIDTH` (120) columns unless ``--wide`` set :data:`WIDE`:
a median's spread then shows as ``±4%`` (half of max-min, of the median)
instead of the whole ``(min-max)``, and long titles and notes wrap.

A target a row must meet prints through :func:`target_line`, with a mark
that says whether it was met::

       [met]    send / pyzmq+msgspec send: rate 1.72x (target >= 1.5x)
       [MISSED] coalesced / synthetic: rate 0.73x (target >= 0.8x)
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

__all__ = ["Column", "render", "print_table", "ratio", "fmt_rate", "fmt_num",
           "fmt_ratio", "fmt_range", "range_header", "fmt_us", "fmt_scaled", "target_line",
           "target_met", "WIDTH",
           "MET", "MISSED", "NO_FIGURE", "JUDGE", "NOT_JUDGED"]

MISSING = "-"
#: The width tables keep to unless :data:`WIDE` (``--wide``).
WIDTH = 120
#: Show whole (min-max) ranges and never wrap (bench_upcalls.py --wide).
WIDE = False

#: The marks of :func:`target_line`.
MET, MISSED, NO_FIGURE = "[met]", "[MISSED]", "[no figure]"
#: Whether target lines say met or missed: off for --quick, whose counts are
#: too small for a verdict (bench_upcalls.py sets it, as WIDE).
JUDGE = True
#: What a target line says in place of a verdict when JUDGE is off.
NOT_JUDGED = "[quick]"


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def ratio(a: Any, b: Any) -> float:
    """a / b, NaN if either is missing or b is zero."""
    if _missing(a) or _missing(b) or b == 0:
        return math.nan
    return a / b


def fmt_num(v: Any, digits: int = 2) -> str:
    """A number with ``digits`` decimals; integers as integers."""
    if _missing(v):
        return MISSING
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:.{digits}f}"


def fmt_scaled(v: Any, steps: Sequence[tuple[float, float, str, str]], rest: str) -> str:
    """``v`` written by the first ``(at_least, divisor, spec, suffix)`` of
    ``steps`` its size reaches (``v / divisor`` in ``spec``, then ``suffix``),
    else in the format ``rest``: the one rule behind the tables' and the
    plots' numbers."""
    a = abs(v)
    for at_least, divisor, spec, suffix in steps:
        if a >= at_least:
            return f"{v / divisor if divisor != 1 else v:{spec}}{suffix}"
    return f"{v:{rest}}"


#: Events per second: 1.23M, 456k, 1.2k, 12.3.
RATE_STEPS = ((1e6, 1e6, ".2f", "M"), (1e4, 1e3, ".0f", "k"), (1e3, 1e3, ".1f", "k"))
#: Microseconds: 153, 12.4, 0.83.
US_STEPS = ((100, 1, ".0f", ""), (10, 1, ".1f", ""))


def fmt_rate(v: Any) -> str:
    """An events-per-second figure with a k/M suffix: 1.23M, 456k, 12.3."""
    if _missing(v):
        return MISSING
    return fmt_scaled(v, RATE_STEPS, ".1f")


def fmt_us(v: Any) -> str:
    """Microseconds with sensible precision: 0.83, 12.4, 153."""
    if _missing(v):
        return MISSING
    return fmt_scaled(v, US_STEPS, ".2f")


def fmt_ratio(v: Any) -> str:
    """A ratio as 3.10x (two decimals), ``-`` when missing."""
    if _missing(v):
        return MISSING
    return f"{v:.2f}x"


def fmt_range(summary: Any, fmt: Callable[[Any], str] = fmt_num, *, spread: bool = True,
              wide: bool | None = None) -> str:
    """``median (min-max)`` of a Summary, or ``median ±half-spread%`` unless
    ``wide`` (default: :data:`WIDE`); only the median if one value or
    ``spread`` off."""
    med = getattr(summary, "median", summary)
    text = fmt(med)
    lo, hi = getattr(summary, "min", None), getattr(summary, "max", None)
    n = getattr(summary, "n", 1)
    if spread and n > 1 and not _missing(lo) and not _missing(hi):
        if WIDE if wide is None else wide:
            text += f" ({fmt(lo)}-{fmt(hi)})"
        elif not _missing(med) and med:
            text += f" ±{abs(hi - lo) / 2 / abs(med):.0%}"
    return text


def range_header(what: str) -> str:
    """The header of a :func:`fmt_range` column: ``msgs/s (min-max)`` or ``msgs/s ±``."""
    return f"{what} (min-max)" if WIDE else f"{what} ±"


_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b, "<": lambda a, b: a < b}


def target_met(value: Any, op: str, want: float) -> bool | None:
    """Whether ``value op want`` holds; None when there is no figure."""
    if op not in _OPS:
        raise ValueError(f"op must be one of {sorted(_OPS)}, not {op!r}")
    if _missing(value):
        return None
    return bool(_OPS[op](value, want))


def target_line(what: str, value: Any, op: str, want: float,
                fmt: Callable[[Any], str] = fmt_ratio, indent: str = "   ") -> str:
    """One target check as a line: the mark (:data:`MET`, :data:`MISSED` or
    :data:`NO_FIGURE`), what is compared, the figure and the target."""
    met = target_met(value, op, want)
    mark = NO_FIGURE if met is None else MET if met else MISSED
    text, goal = fmt(value), fmt(want)
    if not JUDGE:
        return f"{indent}{NOT_JUDGED:<8} {what} {text} (target {op} {goal}; not judged: --quick)"
    if met is not None and text == goal and value != want:
        # rounded onto the target: show the digits that decide it (1.1004x)
        text = f"{value:.4f}x" if fmt is fmt_ratio else f"{value:.6g}"
    return f"{indent}{mark:<8} {what} {text} (target {op} {goal})"


@dataclass
class Column:
    """One column: where its value comes from and how it is shown.

    ``key`` is looked up in each row unless ``get`` is given (``get(row)``).
    ``fmt`` turns the value into text (default: str, or :func:`fmt_num` for
    numbers).  ``align`` is ``"<"`` or ``">"``; by default numbers and
    formatted numbers are right-aligned, text left-aligned.
    """
    key: str
    header: str | None = None
    fmt: Callable[[Any], str] | None = None
    align: str | None = None
    get: Callable[[dict], Any] | None = None
    #: Shown only in wide tables (``--wide``): a column a narrow table can lose.
    wide_only: bool = False

    def value(self, row: dict) -> Any:
        return self.get(row) if self.get is not None else row.get(self.key)

    def text(self, row: dict) -> str:
        v = self.value(row)
        if self.fmt is not None:
            return self.fmt(v)
        if _missing(v):
            return MISSING
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return fmt_num(v)
        return str(v)

    def alignment(self, rows: Sequence[dict]) -> str:
        if self.align:
            return self.align
        for row in rows:
            v = self.value(row)
            if not _missing(v):
                return ">" if isinstance(v, (int, float)) or not isinstance(v, str) else "<"
        return ">"


def render(rows: Iterable[dict], columns: Sequence[Column], title: str | None = None,
           note: str | None = None) -> str:
    """The table as text: optional title, header, rule, one line per row, note."""
    rows = list(rows)
    columns = [c for c in columns if WIDE or not c.wide_only]
    headers = [c.header if c.header is not None else c.key for c in columns]
    twice = sorted({h for h in headers if headers.count(h) > 1})
    if twice:
        # A reader cannot tell two columns of one name apart without the docs.
        raise ValueError(f"columns of the same header in one table: {twice}")
    cells = [[c.text(r) for c in columns] for r in rows]
    widths = [max([len(h)] + [len(line[i]) for line in cells]) for i, h in enumerate(headers)]
    aligns = [c.alignment(rows) for c in columns]
    out = []
    if title:
        out.extend(_wrap(title))
    out.append("  ".join(f"{h:{a}{w}}" for h, a, w in zip(headers, aligns, widths)).rstrip())
    out.append("  ".join("-" * w for w in widths))
    for line in cells:
        out.append("  ".join(f"{t:{a}{w}}" for t, a, w in zip(line, aligns, widths)).rstrip())
    if note:
        for line in note.split("\n"):
            out.extend(_wrap(line))
    return "\n".join(out)


def _wrap(text: str) -> list[str]:
    """A title or note line, wrapped to :data:`WIDTH` unless :data:`WIDE`."""
    if WIDE or len(text) <= WIDTH:
        return [text]
    indent = text[:len(text) - len(text.lstrip())]
    return textwrap.wrap(text, WIDTH, subsequent_indent=indent + "  ")


def print_table(rows: Iterable[dict], columns: Sequence[Column], title: str | None = None,
                note: str | None = None) -> None:
    """Print :func:`render` with a blank line before it, flushed at once."""
    print()
    print(render(rows, columns, title, note), flush=True)
