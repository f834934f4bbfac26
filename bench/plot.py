"""Bar charts of benchmark records: ``plot(records, "out.png")``.

One row of panels per section; within a section, one panel per metric
(the ones listed in :data:`METRICS` for that section, otherwise the numeric
fields common to its records) with one group of bars per ``transport`` (or
other grouping field) and one bar per ``mode`` (or label field).  Records
are the dicts the sections return (with the ``section`` key the dispatcher
adds).  matplotlib is imported only here, with the Agg backend, so the
benchmark itself never needs it.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Iterable, Sequence

#: Metrics drawn per section: (field, axis label, whether lower is better).
METRICS: dict[str, list[tuple[str, str, bool]]] = {
    "upcalls": [("rate", "upcalls/s", False)],
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
FIELDS_BY_SECTION = {"upcalls": ("variant", "case"), "contention": ("variant", "case")}

#: Fields that name the bar within a group, and the group, tried in order.
LABEL_FIELDS = ("mode", "variant", "label", "name", "target")
GROUP_FIELDS = ("transport", "thread", "group", "case")
#: Fields never drawn when metrics are guessed.
SKIP_FIELDS = {"n", "repeats", "round_trips", "seconds", "disturbed_runs", "lost", "section"}

#: Error bars come from ``<field>_min``/``<field>_max`` when present.


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
    # rate -> rate_min; cpu_us_per_msg -> cpu_us_min (the bus section's short name)
    stem = field[:-len("_per_msg")] if field.endswith("_per_msg") else field
    return f"{stem}_min", f"{stem}_max"


def _import_pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib "
                           "(or the package's [plot] extra)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot(records: Sequence[dict], path: str) -> None:
    """Draw one panel per (section, metric) into the PNG at ``path``."""
    plt = _import_pyplot()
    sections: "OrderedDict[str, list[dict]]" = OrderedDict()
    for r in records:
        sections.setdefault(r.get("section", "results"), []).append(r)
    panels = []
    for name, recs in sections.items():
        metrics = METRICS.get(name) or _guess_metrics(recs)
        metrics = [m for m in metrics if any(_num(r.get(m[0])) for r in recs)]
        if metrics:
            panels.append((name, recs, metrics))
    if not panels:
        raise ValueError("nothing numeric to plot")
    ncols = max(len(m) for _, _, m in panels)
    fig, axes = plt.subplots(len(panels), ncols, figsize=(4.6 * ncols, 3.6 * len(panels)),
                             squeeze=False)
    for row, (name, recs, metrics) in enumerate(panels):
        label_f = _first_field(recs, LABEL_FIELDS)
        group_f = _first_field(recs, GROUP_FIELDS)
        if name in FIELDS_BY_SECTION:
            label_f, group_f = FIELDS_BY_SECTION[name]
        labels = list(OrderedDict.fromkeys(str(r.get(label_f, i)) if label_f else str(i)
                                           for i, r in enumerate(recs)))
        groups = list(OrderedDict.fromkeys(str(r[group_f]) for r in recs)) if group_f else [""]
        for col in range(ncols):
            ax = axes[row][col]
            if col >= len(metrics):
                ax.axis("off")
                continue
            field, axis_label, lower_better = metrics[col]
            lo_k, hi_k = _minmax_keys(field)
            width = 0.8 / max(1, len(labels))
            for j, lab in enumerate(labels):
                xs, ys, err_lo, err_hi = [], [], [], []
                for g_i, g in enumerate(groups):
                    for i, r in enumerate(recs):
                        rl = str(r.get(label_f, i)) if label_f else str(i)
                        if rl != lab or (group_f and str(r[group_f]) != g):
                            continue
                        v = r.get(field)
                        if not _num(v):
                            continue
                        xs.append(g_i + (j - (len(labels) - 1) / 2) * width)
                        ys.append(v)
                        lo, hi = r.get(lo_k), r.get(hi_k)
                        err_lo.append(v - lo if _num(lo) else 0)
                        err_hi.append(hi - v if _num(hi) else 0)
                if xs:
                    ax.bar(xs, ys, width, label=lab, yerr=[err_lo, err_hi], capsize=2)
            ax.set_xticks(range(len(groups)))
            ax.set_xticklabels(groups)
            ax.set_title(f"{name}: {axis_label}" + (" (lower is better)" if lower_better else ""),
                         fontsize=9)
            ax.tick_params(labelsize=8)
            if name in LOG_SECTIONS:
                ax.set_yscale("log")
            if col == 0:
                ax.legend(fontsize=6 if len(labels) > 8 else 7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
