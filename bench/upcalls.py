"""Upcalls section of bench_upcalls.py: how fast the trampolines call a target.

Everything here runs through the real delivery path (the C loop, its thread
or the caller's, batches, the trampolines, stats) fed by the synthetic source
``_synthetic_subscribe(bus, target, count=N, payload=...)``: no zmq, so the
figures are the upcall mechanics themselves.  ``rate`` is upcalls per second
from the start of the first deliver call to the end of the last (the C
core's clock), so thread start-up is not in it.

Rows:

* the classic table: target (a pure-Python no-op function; ``upcall.Counter``,
  an extension type reached through its vtable) x thread (``python_threads``,
  a native thread, the caller's thread), nil payload, the default batch and
  the adopted thread state, with the 2009 Pyrex figures beside;
* ``gil="per-upcall"``: the classic PyGILState_Ensure/Release around every
  upcall on a native thread, as a ratio to the adopted thread state at
  batch 1 and at batch 256;
* batch 1 / 64 / 256 on a native thread;
* native nogil handlers: ``upcall.native.Count`` (nil payload) and
  ``upcall.native.FieldFilter`` over the 80-byte map (selects nothing), no GIL;
* the 80-byte map payload (``bench.workload.SMALL_MESSAGE``) instead of nil;
* the ceiling: a C loop on the calling thread, GIL held, calling the same
  target (``upcall.handler._call_loop``).

Variants are interleaved (A B C ..., rotated each repeat), each run waits for
an idle machine and is redone if disturbed (bench.measure), figures
are median (min-max) of the repeats, ratios are within this run.
"""
from __future__ import annotations

import gc
import math
import sys
import time

import upcall
from upcall._bus import _synthetic_info, _synthetic_subscribe
from upcall.handler import _call_loop

from bench import measure, progress, report
from bench.workload import NIL, small_payload

#: --full (what PERF.md's figures come from).
FULL_N = 5_000_000
FULL_REPEATS = 3
#: The default profile: ``make bench`` in a few minutes.
DEFAULT_N = 1_000_000
DEFAULT_REPEATS = 2
QUICK_N = 20_000
# per-upcall Ensure on a native thread costs microseconds: fewer messages.
PER_UPCALL_DIVISOR = 50

#: The classic table (Pyrex, 2009, Athlon 64 X2), upcalls/s.
CLASSIC_2009 = {
    ("python", "python_threads"): 1.83e6, ("python", "native"): 0.95e6,
    ("python", "caller"): 2.02e6,
    ("Handler", "python_threads"): 3.53e6, ("Handler", "native"): 1.33e6,
    ("Handler", "caller"): 3.33e6,
}
THREADS = ["python_threads", "native", "caller"]
TARGETS = ["python", "Handler"]


#: Printed under the tables: the words they use.
TERMS = """\
Terms:
  adopt             a native delivery thread takes one Python thread state when it starts and
                    keeps it; each batch takes the GIL once (PyEval_RestoreThread)
  per-upcall Ensure the classic way: PyGILState_Ensure/Release around every single upcall
  batch N           up to N messages delivered per GIL acquisition
  ceiling           a C loop calling the same target on the calling thread with the GIL held:
                    no thread, no queue, no GIL hand-off, the most any delivery path can reach
  native handlers   targets written in C (upcall.native) that run without the GIL
  Pyrex 2009        the same test in 2009, written with Pyrex and run on an AMD Athlon 64 X2,
                    one upcall per GIL acquisition: another machine, another method; compare
                    as a shape, not a figure"""


def add_arguments(parser) -> None:
    g = parser.add_argument_group("upcalls section")
    g.add_argument("--upcalls-n", type=int, default=None,
                   help=f"upcalls per run (default {DEFAULT_N:,}; full {FULL_N:,}; "
                        f"quick {QUICK_N:,})")
    g.add_argument("--upcalls-repeats", type=int, default=None,
                   help=f"runs of each variant (default {DEFAULT_REPEATS}; full {FULL_REPEATS}; "
                        "quick 1)")
    g.add_argument("--upcalls-idle-timeout", type=float, default=None, metavar="S",
                   help="longest wait for an idle machine before each run (default 2; full 10; "
                        "quick 0)")


def _noop(msg):
    pass


class Variant:
    """One row: how to run it once and what it is."""

    def __init__(self, case, label, target, thread, gil, batch, payload, n, kind="bus"):
        self.case, self.label = case, label
        self.target, self.thread, self.gil = target, thread, gil
        self.batch, self.payload, self.n, self.kind = batch, payload, n, kind
        self.rates: list[float] = []
        self.disturbed = 0

    def make_target(self):
        from upcall.handler import Counter
        from upcall.native import Count, FieldFilter
        if self.target == "python":
            return _noop
        if self.target == "Handler":
            return Counter()
        if self.target == "native Count":
            return Count()
        if self.target == "native FieldFilter":
            return FieldFilter("px", gt=1e12)       # reads every message, selects none
        raise ValueError(self.target)

    def once(self, bus, payloads) -> float:
        target = self.make_target()
        if self.kind == "ceiling":
            t0 = time.perf_counter()
            _call_loop(target, self.n, None)
            return self.n / (time.perf_counter() - t0)
        kw = dict(count=self.n, payload=payloads[self.payload], batch=self.batch, gil=self.gil)
        if self.thread == "caller":
            kw["delivery"] = "caller"
        elif self.thread == "python_threads":
            kw["thread_factory"] = upcall.python_threads
        sub = _synthetic_subscribe(bus, target, **kw)
        if self.thread == "caller":
            while not sub.closed:
                sub.poll(timeout=60.0)
        elif not sub.wait(600.0):
            sub.close()
            raise RuntimeError(f"{self.label}: did not finish")
        info, stats = _synthetic_info(sub), sub.stats
        sub.close()
        # A native handler's unselected messages are filtered, not delivered.
        handled = stats["delivered"] + stats["filtered"]
        if handled != self.n:
            raise RuntimeError(f"{self.label}: delivered or filtered {handled} of {self.n}")
        return self.n / info["seconds"] if info["seconds"] > 0 else math.nan


def variants(n: int, default_batch: int) -> list[Variant]:
    v = []
    for target in TARGETS:
        for thread in THREADS:
            v.append(Variant("classic", f"{target} / {thread}", target, thread, "adopt",
                             default_batch, "nil", n))
    n_pu = max(1000, n // PER_UPCALL_DIVISOR)
    for target in TARGETS:
        v.append(Variant("gil", f"{target} / native / per-upcall", target, "native",
                         "per-upcall", 1, "nil", n_pu))
        for batch in (1, 64, 256):
            if batch == default_batch:
                continue   # the classic row
            nb = n // 5 if batch == 1 else n
            v.append(Variant("batch", f"{target} / native / batch {batch}", target, "native",
                             "adopt", batch, "nil", nb))
    v.append(Variant("native", "native Count / nil", "native Count", "native", "adopt",
                     256, "nil", n * 4))
    v.append(Variant("native", "native FieldFilter / map", "native FieldFilter", "native",
                     "adopt", 256, "map", n))
    for target in TARGETS:
        v.append(Variant("payload", f"{target} / native / map", target, "native", "adopt",
                         default_batch, "map", n // 2))
    for target in TARGETS:
        v.append(Variant("ceiling", f"{target} / ceiling (C loop, GIL held)", target, "caller",
                         "held", 0, "nil", n, kind="ceiling"))
    return v


def _find(vs, target, thread, gil="adopt", batch=None, payload="nil", kind="bus"):
    for x in vs:
        if (x.target == target and x.thread == thread and x.gil == gil and x.payload == payload
                and x.kind == kind and (batch is None or x.batch == batch)):
            return x
    return None


def run(opts) -> list[dict]:
    full = getattr(opts, "full", False) and not opts.quick
    n = opts.upcalls_n or (QUICK_N if opts.quick else FULL_N if full else DEFAULT_N)
    repeats = opts.upcalls_repeats or (1 if opts.quick else FULL_REPEATS if full
                                       else DEFAULT_REPEATS)
    default_batch = upcall.DEFAULT_BATCH
    payloads = {"nil": NIL, "map": small_payload()}
    idle = opts.upcalls_idle_timeout
    if idle is None:
        idle = measure.QUICK_IDLE_TIMEOUT if opts.quick else 10.0 if full else 2.0
    vs = variants(n, default_batch)
    print(f"\n## upcalls: {n:,} upcalls per run (per-upcall Ensure: "
          f"{max(1000, n // PER_UPCALL_DIVISOR):,}), {repeats} repeat(s) interleaved,\n"
          f"   DEFAULT_BATCH={default_batch}, switch interval {sys.getswitchinterval() * 1e3:g} ms",
          flush=True)
    with upcall.Bus() as bus:
        # warm-up: thread states, caches, the codec's key cache
        for x in vs[:len(TARGETS) * len(THREADS)]:
            Variant(x.case, x.label, x.target, x.thread, x.gil, x.batch, x.payload,
                    min(x.n, 20_000), x.kind).once(bus, payloads)
        gc_was = gc.isenabled()
        gc.disable()
        try:
            for _, x in progress.track(measure.interleave(vs, repeats), "upcalls",
                                       len(vs) * repeats):
                rate, info = measure.run_stable(lambda: x.once(bus, payloads),
                                                retries=0 if opts.quick else 2 if full else 1,
                                                idle_timeout=idle)
                x.rates.append(rate)
                x.disturbed += info.disturbed
        finally:
            if gc_was:
                gc.enable()

    records = []
    for x in vs:
        s = measure.summarize(x.rates)
        records.append({
            "case": x.case, "variant": x.label, "target": x.target, "thread": x.thread,
            "gil": x.gil, "batch": x.batch, "payload": x.payload, "n": x.n,
            "rate": s.median, "rate_min": s.min, "rate_max": s.max,
            "seconds": x.n / s.median if s.median else math.nan,
            "repeats": len(x.rates), "disturbed_runs": x.disturbed,
        })
    _ratios(vs, records, default_batch)
    _print(records, n, default_batch)
    return records


def _rate(vs, records, **kw):
    x = _find(vs, **kw)
    return records[vs.index(x)]["rate"] if x is not None else math.nan


def _ratios(vs, records, b):
    r = lambda **kw: _rate(vs, records, **kw)  # noqa: E731
    for rec in records:
        t = rec["target"]
        ref = None
        if rec["case"] == "classic":
            ref = r(target=t, thread="python_threads", batch=b)
            rec["ratio_to"] = "python_threads"
        elif rec["case"] == "gil":
            ref = r(target=t, thread="native", batch=1)
            rec["ratio_to"] = "adopt, batch 1"
            rec["ratio_batch256"] = report.ratio(rec["rate"], r(target=t, thread="native", batch=256))
        elif rec["case"] in ("batch", "payload"):
            ref = r(target=t, thread="native", batch=256)
            rec["ratio_to"] = "batch 256, nil"
        elif rec["case"] == "native":
            # like for like: the batched pure-Python target, same payload
            ref = r(target="python", thread="native", batch=b, payload=rec["payload"])
            rec["ratio_to"] = f"python, batch {b}, {rec['payload']}"
        elif rec["case"] == "ceiling":
            rec["ratio_to"] = "ceiling"
        if ref is not None:
            rec["ratio"] = report.ratio(rec["rate"], ref)
        rec["vs_2009"] = report.ratio(rec["rate"], CLASSIC_2009.get((t, rec["thread"])))\
            if rec["case"] == "classic" else math.nan
    # the ceiling ratios: batched delivery / the C loop
    for rec in records:
        if rec["case"] == "ceiling":
            rec["ratio"] = 1.0
        if rec["case"] in ("classic", "batch") and rec["thread"] == "native":
            rec["ratio_ceiling"] = report.ratio(rec["rate"], r(target=rec["target"], thread="caller",
                                                               gil="held", kind="ceiling"))


def _print(records, n, b):
    by = {(r["target"], r["thread"]): r for r in records if r["case"] == "classic"}
    names = {"python": "pure-Python function", "Handler": "extension type (Handler)"}
    rows = []
    for t in TARGETS:
        row = {"target": names[t]}
        then = {"target": "  Pyrex 2009"}
        for th in THREADS:
            rec = by.get((t, th))
            row[th] = rec["rate"] if rec else math.nan
            then[th] = CLASSIC_2009[(t, th)]
        rows += [row, then]
    cols = [report.Column("target", "target")]
    for th, head in zip(THREADS, ["python_threads", "native thread", "caller's thread"]):
        cols.append(report.Column(th, head, fmt=report.fmt_rate))
    report.print_table(rows, cols, title=(
        f"The classic table: upcalls/s, {n:,} upcalls into a no-op, nil payload, "
        f"batch {b}, adopted thread state"), note=(
        "Pyrex 2009: the figure of the 2009 experiment this table repeats (Pyrex, an AMD "
        "Athlon 64 X2, one upcall per GIL acquisition), for its shape; not measured in this run"))
    cols = [report.Column("variant", "variant"),
            report.Column("gil", "gil"), report.Column("batch", "batch"),
            report.Column("payload", "payload"),
            report.Column("n", "n", fmt=report.fmt_num),
            report.Column("rate", report.range_header("upcalls/s"),
                          get=lambda r: measure.Summary(r["rate"], r["rate_min"], r["rate_max"],
                                                        [0] * r["repeats"]),
                          fmt=lambda s: report.fmt_range(s, report.fmt_rate)),
            report.Column("ns", "ns/upcall", get=lambda r: 1e9 / r["rate"] if r["rate"] else None,
                          fmt=lambda v: report.fmt_num(v, 1)),
            report.Column("ratio", "ratio", fmt=report.fmt_ratio),
            report.Column("ratio_to", "to")]
    for case, title in [("classic", "classic rows (ratio to python_threads)"),
                        ("gil", "per-upcall PyGILState_Ensure on a native thread"),
                        ("batch", "batch size (native thread, adopted)"),
                        ("payload", "80-byte map payload instead of nil"),
                        ("native", "native nogil handlers (ratio to the batched Python target, same payload)"),
                        ("ceiling", "the ceiling: C loop on the calling thread, GIL held")]:
        rows = [r for r in records if r["case"] == case]
        if rows:
            report.print_table(rows, cols, title=title)
    notes = []
    for r in records:
        if "ratio_ceiling" in r and r["batch"] in (256, b) and r["gil"] == "adopt":
            notes.append(f"{r['target']} native batch {r['batch']}: "
                         f"{report.fmt_ratio(r['ratio_ceiling'])} of the ceiling")
    gil = [r for r in records if r["case"] == "gil"]
    for r in gil:
        notes.append(f"{r['target']} per-upcall Ensure: {report.fmt_ratio(r['ratio'])} of adopt at "
                     f"batch 1, {report.fmt_ratio(r.get('ratio_batch256'))} of batch 256")
    if notes:
        print("\n" + "\n".join(notes), flush=True)
    print("\n" + TERMS, flush=True)
