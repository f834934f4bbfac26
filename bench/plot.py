"""Bar charts of benchmark records: ``plot(records, "out.png")``.

One figure per section, written beside ``out.png`` as ``out-<section>.png``
(``plot`` returns the paths).  Within a section's figure, one panel per
metric (the ones listed in :data:`METRICS` for that section, otherwise the
numeric fields common to its records), with one group of bars per
``transport`` (or other grouping field) and one bar per row name (``mode``,
``codec``, ``variant`` ...).  A row keeps its colour in every panel, the
colours are distinct, and one legend per figure, beside the panels, names
the rows.  Past :data:`MAX_COLOURED_ROWS` row names (the bus section's
modes), colours no longer tell rows apart: the names go on the axis, one
band each, and the colours tell the groups.  A section whose every row is in one group only (the
upcalls section: one row per variant) gets one horizontal bar per row
instead, named on the axis and coloured by its group, which the legend names.
A bar far above the rest is cut, its value written on it.  Records are the
dicts the sections return (with the ``section`` key the dispatcher adds).
matplotlib is imported only here, with the Agg backend, so the benchmark
itself never needs it.
"""
from __future__ import annotations

import math
import os
import re
from collections import OrderedDict
from typing import Any, Iterable, Sequence

from bench.report import fmt_scaled

__all__ = ["plot", "figures", "figure_path"]

#: Metrics drawn per section: (field, axis label, whether lower is better).
METRICS: dict[str, list[tuple[str, str, bool]]] = {
    "codec": [("ns_per_op", "small message: ns per call", True),
              ("mb_per_s", "large document: MB/s", False)],
    "upcalls": [("rate", "upcalls/s (log scale)", False)],
    "contention": [("delivered_ratio", "delivered / offered", False),
                   ("busy_ratio", "busy loop speed / alone", False),
                   ("p99_ms", "latency p99 ms", True)],
    "bus": [("rate", "delivered msgs/s", False),
            ("cpu_us_per_msg", "subscriber CPU us/msg", True),
            ("p50_us", "round trip p50 us", True),
            ("p99_us", "round trip p99 us", True)],
    "bus publishing": [("rate", "sent msgs/s", False),
                       ("cpu_us_per_msg", "sender CPU us/msg", True)],
}

#: Sections drawn on a log scale (rates spanning decades).
LOG_SECTIONS = {"upcalls", "contention"}
#: Per-section (label field, group field) when the guessed ones do not fit.
FIELDS_BY_SECTION = {"upcalls": ("variant", "case"), "contention": ("variant", "case"),
                     "codec": ("codec", "op")}
#: Legend names of a section's groups, where the field's values are terse.
GROUP_NAMES = {"upcalls": {"classic": "the classic table (adopt)",
                           "gil": "per-upcall Ensure",
                           "batch": "batch size (adopt)",
                           "native": "native nogil handlers",
                           "payload": "80-byte map payload",
                           "ceiling": "ceiling: C loop, GIL held"}}
#: Error bar fields of a metric whose names do not follow ``<field>_min``.
ERROR_FIELDS = {"ns_per_op": ("min_ns", "max_ns"), "mb_per_s": ("min_mb_per_s", "max_mb_per_s")}

#: Most row names told apart by colour alone: past this (the bus section's
#: 21 modes), the rows are named on the axis and the colours tell the groups.
MAX_COLOURED_ROWS = 10
#: A panel whose values span more than this factor is drawn on a log scale
#: (where a linear one would have to cut the tallest bars).
LOG_SPAN = 20.0

#: Fields that name the bar within a group, and the group, tried in order.
LABEL_FIELDS = ("mode", "variant", "codec", "impl", "label", "name", "target")
GROUP_FIELDS = ("transport", "thread", "group", "case", "op")
#: Fields never drawn when metrics are guessed.
SKIP_FIELDS = {"n", "repeats", "round_trips", "seconds", "disturbed_runs", "lost", "section"}


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (
        isinstance(v, float) and math.isnan(v))


def _first_field(recs: Sequence[dict], fields: Iterable[str]) -> str | None:
    for f in fields:
        if all(f in r for r in recs):
            return f
    return None


def _guess_metrics(recs: Sequence[dict]) -> list[tuple[str, str, bool]]:
    keys = [k for k in recs[0] if k not in SKIP_FIELDS
            and not k.endswith(("_min", "_max", "_ratio"))
            and any(_num(r.get(k)) for r in recs)]
    return [(k, k, False) for k in keys[:4]]


def _minmax_keys(field: str) -> tuple[str, str]:
    if field in ERROR_FIELDS:
        return ERROR_FIELDS[field]
    # rate -> rate_min; cpu_us_per_msg -> cpu_us_min (the bus section's short name)
    stem = field[:-len("_per_msg")] if field.endswith("_per_msg") else field
    return f"{stem}_min", f"{stem}_max"


def _import_pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib "
                           "(or `pip install --group bench` in a clone)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _colours(n: int) -> list:
    """``n`` distinct colours: tab10 up to 10, tab20 up to 20, then tab20b/c."""
    from matplotlib import colormaps
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        # tab20 pairs a dark and a light shade of each hue: the ten dark ones
        # first, so that neighbouring bars never share a hue.
        order = list(range(0, 20, 2)) + list(range(1, 20, 2))
        return [colormaps["tab20"](order[i]) for i in range(n)]
    pool = ([colormaps["tab20"](i) for i in range(20)] + [colormaps["tab20b"](i) for i in range(20)]
            + [colormaps["tab20c"](i) for i in range(20)])
    return [pool[i % len(pool)] for i in range(n)]


def _merged_order(lists: Sequence[Sequence[str]]) -> list[str]:
    """One order for the names of several lists, each list's order kept:
    a name first seen in a later list goes right after its predecessor there
    (so a row missing from the first group does not move to the end)."""
    out: list[str] = []
    for names in lists:
        prev = None
        for name in names:
            if name not in out:
                out.insert(out.index(prev) + 1 if prev is not None else 0, name)
            prev = name
    return out


def _axis_formatter():
    """Tick labels as the tables write them: 1.5M, 250k, 12.5, 0.25."""
    from matplotlib.ticker import FuncFormatter

    def fmt(v, _pos):
        return fmt_scaled(v, ((1e6, 1e6, "g", "M"), (1e4, 1e3, "g", "k")), "g")
    return FuncFormatter(fmt)


def _value_text(v: float) -> str:
    """A bar's value as the tables write it: 13.0M, 250k, 1090, 11.3."""
    return fmt_scaled(v, ((1e6, 1e6, ".1f", "M"), (1e4, 1e3, ".0f", "k"), (100, 1, ".0f", "")),
                      ".3g")


def _clip_outliers(ax, values: Sequence[float], bars: Sequence[tuple[float, float]]) -> None:
    """A bar far above the others (more than 4x the median) would flatten
    them: cut the axis above the rest and write the cut bars' values on them
    (``13.0M ^``)."""
    vals = sorted(v for v in values if v > 0)
    if len(vals) < 3:
        return
    med = vals[len(vals) // 2]
    rest = [v for v in vals if v <= 4 * med]
    if len(rest) == len(vals):
        return
    cap = max(rest) * 1.3
    ax.set_ylim(0, cap)
    for x, v in bars:
        if v > cap:
            ax.text(x, cap * 0.98, _value_text(v) + " ^", rotation=90, ha="center", va="top",
                    fontsize=6, bbox={"facecolor": "white", "alpha": 0.8, "pad": 1,
                                      "linewidth": 0})


def figure_path(path: str, section: str) -> str:
    """``out.png`` + section ``bus publishing`` -> ``out-bus-publishing.png``."""
    stem, ext = os.path.splitext(path)
    return f"{stem}-{re.sub(r'[^A-Za-z0-9]+', '-', section).strip('-')}{ext or '.png'}"


def _sections(records: Sequence[dict]) -> "OrderedDict[str, list[dict]]":
    sections: "OrderedDict[str, list[dict]]" = OrderedDict()
    for r in records:
        sections.setdefault(r.get("section", "results"), []).append(r)
    return sections


def _fields(name: str, recs: Sequence[dict]) -> tuple[str | None, str | None]:
    if name in FIELDS_BY_SECTION and all(f in r for f in FIELDS_BY_SECTION[name] for r in recs):
        return FIELDS_BY_SECTION[name]
    return _first_field(recs, LABEL_FIELDS), _first_field(recs, GROUP_FIELDS)


def figures(records: Sequence[dict]) -> list[tuple[str, Any]]:
    """[(section, matplotlib figure)]: one figure per section with something to draw."""
    plt = _import_pyplot()
    out = []
    for name, recs in _sections(records).items():
        metrics = METRICS.get(name) or _guess_metrics(recs)
        metrics = [m for m in metrics if any(_num(r.get(m[0])) for r in recs)]
        if metrics:
            out.append((name, _figure(plt, name, recs, metrics)))
    if not out:
        raise ValueError("nothing numeric to plot")
    return out


def _figure(plt, name: str, recs: Sequence[dict], metrics):
    label_f, group_f = _fields(name, recs)

    def label_of(i: int, r: dict) -> str:
        return str(r.get(label_f)) if label_f else f"row {i + 1}"

    labels = _merged_order([[label_of(i, r) for i, r in enumerate(recs)
                             if not group_f or r[group_f] == g]
                            for g in OrderedDict.fromkeys(r[group_f] for r in recs)]
                           if group_f else [[label_of(i, r) for i, r in enumerate(recs)]])
    if group_f and len(labels) == len(recs):
        return _rows_figure(plt, name, recs, metrics, label_f, group_f)
    if group_f and len(labels) > MAX_COLOURED_ROWS:
        return _by_label_figure(plt, name, recs, metrics, labels, label_of, label_f, group_f)
    colour = dict(zip(labels, _colours(len(labels))))
    groups = list(OrderedDict.fromkeys(str(r[group_f]) for r in recs)) if group_f else [""]
    # The legend gets a column of its own on the right, as wide as its longest name.
    legend_w = 0.9 + 0.065 * max([len(lab) for lab in labels] + [len(label_f or "row")])
    ncols = min(2, len(metrics))
    nrows = -(-len(metrics) // ncols)
    # Wide enough for the bars.
    panel_w = max(4.5, min(9.0, 0.9 + 0.22 * len(recs) / max(1, nrows)))
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_w * ncols + legend_w, 3.4 * nrows + 0.6),
                             squeeze=False)
    handles: dict[str, Any] = {}
    for k, (field, axis_label, lower_better) in enumerate(metrics):
        ax = axes[k // ncols][k % ncols]
        lo_k, hi_k = _minmax_keys(field)
        centres, drawn = [], []
        for g_i, g in enumerate(groups):
            # Only the rows this group has, side by side, in the legend's order.
            rows = [(label_of(i, r), r) for i, r in enumerate(recs)
                    if (not group_f or str(r[group_f]) == g) and _num(r.get(field))]
            rows.sort(key=lambda lr: labels.index(lr[0]))
            width = 0.8 / max(1, len(rows))
            for j, (lab, r) in enumerate(rows):
                v = r[field]
                lo, hi = r.get(lo_k), r.get(hi_k)
                err = [[v - lo if _num(lo) else 0], [hi - v if _num(hi) else 0]]
                x = g_i + (j - (len(rows) - 1) / 2) * width
                bars = ax.bar([x], [v], width, color=colour[lab], yerr=err, capsize=2,
                              error_kw={"elinewidth": 0.8})
                handles.setdefault(lab, bars[0])
                drawn.append((x, v))
            centres.append(g_i)
        ax.set_xticks(centres)
        ax.set_xticklabels(groups, fontsize=8)
        ax.set_title(axis_label + (" (lower is better)" if lower_better else
                                   " (higher is better)"), fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        if name in LOG_SECTIONS:
            ax.set_yscale("log")
        else:
            ax.yaxis.set_major_formatter(_axis_formatter())
            _clip_outliers(ax, [v for _, v in drawn], drawn)
    for k in range(len(metrics), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    fig.suptitle(f"{name}" + (f": bars grouped by {group_f}" if group_f else "")
                 + "; whiskers: min-max of the repeats", fontsize=10)
    ordered = [lab for lab in labels if lab in handles]
    fig.legend([handles[lab] for lab in ordered], ordered, loc="center left",
               bbox_to_anchor=(1.0 - (legend_w - 0.1) / fig.get_figwidth(), 0.5), fontsize=7,
               title=label_f or "row", title_fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1.0 - legend_w / fig.get_figwidth(), 0.95))
    return fig


def _rows_figure(plt, name: str, recs: Sequence[dict], metrics, label_f: str, group_f: str):
    """Every row its own bar (no row in two groups, as in the upcalls section):
    horizontal bars named on the axis, coloured by group, top to bottom in
    the tables' order; the legend names the groups."""
    groups = list(OrderedDict.fromkeys(str(r[group_f]) for r in recs))
    recs = sorted(recs, key=lambda r: groups.index(str(r[group_f])))   # a group's rows together
    colour = dict(zip(groups, _colours(len(groups))))
    names = [str(r[label_f]) for r in recs]
    shown = GROUP_NAMES.get(name, {})
    name_w = 0.9 + 0.065 * max(len(n) for n in names)
    legend_w = 0.9 + 0.065 * max(len(shown.get(g, g)) for g in groups + [group_f])
    fig, axes = plt.subplots(1, len(metrics), squeeze=False, sharey=True,
                             figsize=(name_w + 4.2 * len(metrics) + legend_w,
                                      1.2 + 0.24 * len(recs)))
    ys = list(range(len(recs)))[::-1]
    handles: dict[str, Any] = {}
    for k, (field, axis_label, lower_better) in enumerate(metrics):
        ax = axes[0][k]
        lo_k, hi_k = _minmax_keys(field)
        for y, r in zip(ys, recs):
            v = r.get(field)
            if not _num(v):
                continue
            lo, hi = r.get(lo_k), r.get(hi_k)
            err = [[v - lo if _num(lo) else 0], [hi - v if _num(hi) else 0]]
            g = str(r[group_f])
            bars = ax.barh([y], [v], 0.75, color=colour[g], xerr=err, capsize=2,
                           error_kw={"elinewidth": 0.8})
            handles.setdefault(g, bars[0])
        ax.set_yticks(ys)
        ax.set_yticklabels(names, fontsize=8)
        ax.set_title(axis_label + (" (lower is better)" if lower_better else
                                   " (higher is better)"), fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
        if name in LOG_SECTIONS:
            ax.set_xscale("log")
    fig.suptitle(f"{name}: one bar per row, coloured by {group_f}; whiskers: min-max of the "
                 "repeats", fontsize=10)
    fig.legend([handles[g] for g in groups if g in handles],
               [shown.get(g, g) for g in groups if g in handles],
               loc="center left", bbox_to_anchor=(1.0 - (legend_w - 0.1) / fig.get_figwidth(), 0.5),
               fontsize=7, title=group_f, title_fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1.0 - legend_w / fig.get_figwidth(), 0.95))
    return fig


def _by_label_figure(plt, name: str, recs: Sequence[dict], metrics, labels: list[str],
                     label_of, label_f: str, group_f: str):
    """Many row names, each in several groups (the bus section's modes over
    each transport): one horizontal band per name, named on the axis, with
    one bar per group in it, coloured by group (a few colours, which the
    legend names).  A panel whose values span decades is on a log scale,
    so that no bar is cut."""
    groups = list(OrderedDict.fromkeys(str(r[group_f]) for r in recs))
    colour = dict(zip(groups, _colours(len(groups))))
    name_w = 0.9 + 0.065 * max(len(n) for n in labels)
    legend_w = 0.9 + 0.065 * max(len(g) for g in groups + [group_f])
    ncols = min(2, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig, axes = plt.subplots(nrows, ncols, squeeze=False,
                             figsize=((name_w + 4.2) * ncols + legend_w,
                                      (1.0 + 0.22 * len(labels) * max(1, len(groups)) ** 0.5)
                                      * nrows))
    height = 0.8 / max(1, len(groups))
    ys = {lab: len(labels) - 1 - i for i, lab in enumerate(labels)}
    handles: dict[str, Any] = {}
    for k, (field, axis_label, lower_better) in enumerate(metrics):
        ax = axes[k // ncols][k % ncols]
        lo_k, hi_k = _minmax_keys(field)
        values = []
        for i, r in enumerate(recs):
            v = r.get(field)
            if not _num(v):
                continue
            g = str(r[group_f])
            y = ys[label_of(i, r)] + ((len(groups) - 1) / 2 - groups.index(g)) * height
            lo, hi = r.get(lo_k), r.get(hi_k)
            err = [[v - lo if _num(lo) else 0], [hi - v if _num(hi) else 0]]
            bars = ax.barh([y], [v], height, color=colour[g], xerr=err, capsize=1.5,
                           error_kw={"elinewidth": 0.6})
            handles.setdefault(g, bars[0])
            values.append(v)
        ax.set_yticks(list(ys.values()))
        ax.set_yticklabels(list(ys), fontsize=7)
        ax.set_title(axis_label + (" (lower is better)" if lower_better else
                                   " (higher is better)"), fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
        positive = [v for v in values if v > 0]
        if name in LOG_SECTIONS or (positive and max(positive) > LOG_SPAN * min(positive)):
            ax.set_xscale("log")
        else:
            ax.xaxis.set_major_formatter(_axis_formatter())
    for k in range(len(metrics), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    fig.suptitle(f"{name}: one band per {label_f}, one bar per {group_f}; whiskers: min-max "
                 "of the repeats", fontsize=10)
    fig.legend([handles[g] for g in groups if g in handles], [g for g in groups if g in handles],
               loc="center left", bbox_to_anchor=(1.0 - (legend_w - 0.1) / fig.get_figwidth(), 0.5),
               fontsize=8, title=group_f, title_fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1.0 - legend_w / fig.get_figwidth(), 0.95))
    return fig


def plot(records: Sequence[dict], path: str) -> list[str]:
    """One PNG per section beside ``path`` (see :func:`figure_path`); the paths."""
    plt = _import_pyplot()
    written = []
    for name, fig in figures(records):
        out = figure_path(path, name)
        fig.savefig(out, dpi=110)
        plt.close(fig)
        written.append(out)
    return written
