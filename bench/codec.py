"""Benchmark section "codec": upcall's packb/unpackb against msgspec and msgpack.

Two workloads, each timed for every installed codec in the same run:
- SMALL_MESSAGE, a 5-field map of 77 bytes packed (ns per call);
- a large document of nested maps, arrays, strings and floats generated
  with a seeded random (tens of MB packed; MB/s of packed bytes);
both from bench.workload.
The variants are interleaved (A B C, C B A, ...), each figure is the median
of the repeats with their min-max, and the ratios compare medians of one run.
A repeat during which the machine was busy with something else (per
/proc/stat, see bench.measure.LoadMonitor) is thrown away and redone.
"""
import gc
import statistics
import time

import upcall

from bench import measure, progress
from bench.workload import SMALL_MESSAGE, large_document, small_payload

#: Extra attempts of a timed run that another process disturbed.
MAX_REDO = 3


def add_arguments(parser):
    g = parser.add_argument_group("codec")
    g.add_argument("--codec-repeats", type=int, default=None, metavar="N",
                   help="timed repeats per variant (default 7, full 15, quick 3)")
    g.add_argument("--codec-doc-mb", type=float, default=None, metavar="MB",
                   help="size of the large document, packed (default 5, full 20, quick 0.2)")


# ---------------------------------------------------------------- measuring

def _per_call(fn, arg, number):
    """Seconds per call of fn(arg) over `number` calls.

    A run during which other processes used more than 30% of one CPU is
    redone, up to MAX_REDO times; runs of 50 ms or less are never judged
    (below the resolution of the CPU counters).
    """
    for _ in range(MAX_REDO + 1):
        mon = measure.LoadMonitor().start()
        t0 = time.perf_counter()
        for _ in range(number):
            fn(arg)
        wall = time.perf_counter() - t0
        mon.stop()
        if wall <= 0.05 or not mon.disturbed(0.3, slack_jiffies=0):
            break
    return wall / number


def _calibrate(fn, arg, target_s):
    """Calls per timed run so that one run takes about target_s."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn(arg)
        dt = time.perf_counter() - t0
        if dt > target_s / 10 or n >= 1 << 24:
            return max(1, int(n * target_s / max(dt, 1e-9)))
        n *= 4


def _codecs():
    """[(name, pack, unpack)] for every codec installed; upcall first."""
    out = [("upcall", upcall.packb, upcall.unpackb)]
    try:
        import msgspec
        enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
        out.append(("msgspec", enc.encode, dec.decode))
    except ImportError:
        pass
    try:
        import msgpack
        # Called plainly: its defaults decode these str-keyed workloads as is.
        out.append(("msgpack", msgpack.packb, msgpack.unpackb))
    except ImportError:
        pass
    return out


# ---------------------------------------------------------------- the section

def run(opts):
    quick = getattr(opts, "quick", False)
    full = getattr(opts, "full", False) and not quick
    repeats = getattr(opts, "codec_repeats", None) or (3 if quick else 15 if full else 7)
    doc_mb = getattr(opts, "codec_doc_mb", None) or (0.2 if quick else 20 if full else 5)
    small_s = 0.002 if quick else 0.05      # seconds per timed run, small message
    codecs = _codecs()

    small = small_payload()
    doc = large_document(doc_mb * 1e6)
    doc_packed = upcall.packb(doc)
    for name, pack, unpack in codecs:   # every codec agrees on both workloads
        assert upcall.unpackb(pack(SMALL_MESSAGE)) == SMALL_MESSAGE, name
        assert unpack(small) == SMALL_MESSAGE, name

    print(f"\n## codec: small message ({len(small)} bytes) and a {len(doc_packed) / 1e6:.1f} MB "
          f"document; median of {repeats} interleaved repeats [min-max]")
    rows = []
    # The workloads themselves (millions of objects) are frozen out of the
    # collector, so that no codec's figure depends on how often a collection
    # happens to walk the benchmark's own data.  The collector stays on.
    gc.collect()
    gc.freeze()
    try:
        with progress.Progress("codec", 4 * len(codecs) * repeats) as shown:
            _run_all(codecs, small, doc, doc_packed, repeats, small_s, rows, shown)
    finally:
        gc.unfreeze()
    _print(rows)
    return rows


def _run_all(codecs, small, doc, doc_packed, repeats, small_s, rows, shown):
    for op, workload in (("unpackb", "small"), ("packb", "small"),
                         ("unpackb", "large"), ("packb", "large")):
        if workload == "small":
            arg = small if op == "unpackb" else SMALL_MESSAGE
        else:
            arg = doc_packed if op == "unpackb" else doc
        variants = [(name, unpack if op == "unpackb" else pack) for name, pack, unpack in codecs]
        if workload == "small":
            number = _calibrate(variants[0][1], arg, small_s)
        else:
            number = 1
        res = {name: [] for name, _ in variants}
        runs = measure.interleave(variants, repeats, order="mirror")
        for _, (name, fn) in runs:
            res[name].append(_per_call(fn, arg, number))
            shown.step(f"{op} {workload} {name}")
        med = {n: statistics.median(v) for n, v in res.items()}
        for name, times in res.items():
            rec = {"op": op, "workload": workload, "codec": name, "repeats": repeats,
                   "calls_per_repeat": number}
            if workload == "small":
                rec.update(ns_per_op=med[name] * 1e9, min_ns=min(times) * 1e9,
                           max_ns=max(times) * 1e9, bytes=len(small))
            else:
                mbs = [len(doc_packed) / t / 1e6 for t in times]
                rec.update(mb_per_s=len(doc_packed) / med[name] / 1e6, min_mb_per_s=min(mbs),
                           max_mb_per_s=max(mbs), bytes=len(doc_packed))
            for other in ("msgspec", "msgpack"):
                if other in med:
                    rec[f"time_vs_{other}"] = med[name] / med[other]
            rows.append(rec)


def _print(rows):
    print(f"{'op':<8} {'workload':<8} {'codec':<8} {'median':>14} {'[min - max]':>24} "
          f"{'time/msgspec':>13} {'time/msgpack':>13}")
    for r in rows:
        if "ns_per_op" in r:
            val = f"{r['ns_per_op']:.0f} ns/op"
            rng = f"[{r['min_ns']:.0f} - {r['max_ns']:.0f}]"
        else:
            val = f"{r['mb_per_s']:.0f} MB/s"
            rng = f"[{r['min_mb_per_s']:.0f} - {r['max_mb_per_s']:.0f}]"
        vs = [f"{r[k]:.2f}x" if k in r else "-" for k in ("time_vs_msgspec", "time_vs_msgpack")]
        print(f"{r['op']:<8} {r['workload']:<8} {r['codec']:<8} {val:>14} {rng:>24} "
              f"{vs[0]:>13} {vs[1]:>13}")
