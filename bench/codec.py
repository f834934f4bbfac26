"""Benchmark section "codec": upcall's packb/unpackb against msgspec and msgpack.

Two workloads, each timed for every installed codec in the same run:
- SMALL_MESSAGE, a 5-field map of about 80 bytes (ns per call);
- a large document of nested maps, arrays, strings and floats generated
  with a seeded random (tens of MB packed; MB/s of packed bytes).
The variants are interleaved (A B C A B C ...), each figure is the median of
the repeats with their min-max, and the ratios compare medians of one run.
A repeat during which the machine was busy with something else (per
/proc/stat) is thrown away and redone.
"""
import gc
import os
import random
import statistics
import time

# The message other benchmark sections reuse: ~80 bytes packed.
SMALL_MESSAGE = {
    "id": 1700000000123456,
    "sym": "AAPL.OQ",
    "px": 187.25,
    "sizes": [100, 200, 300, 400, 500],
    "venue": "NASDAQ-GS/XNGS",
}


def add_arguments(parser):
    g = parser.add_argument_group("codec")
    g.add_argument("--codec-repeats", type=int, default=None, metavar="N",
                   help="timed repeats per variant (default 15, quick 3)")
    g.add_argument("--codec-doc-mb", type=float, default=None, metavar="MB",
                   help="size of the large document, packed (default 20, quick 0.2)")


# ---------------------------------------------------------------- workloads

_WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
          "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"]
_KEYS = ["id", "name", "price", "qty", "tags", "meta", "ts", "venue", "side", "book",
         "account", "status", "notes", "levels", "score", "owner"]


def _text(rng):
    n = rng.randint(3, 40)
    if rng.random() < 0.1:   # some non-ASCII text
        return "".join(rng.choice("àéîõüßñçøæ€中文かな") for _ in range(n // 2 + 1))
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ0123456789_-.") for _ in range(n))


def _record(rng, depth=0):
    """One realistic record: a map of scalars, a list of floats, nested maps."""
    rec = {
        "id": rng.randrange(1 << 40),
        "name": _text(rng),
        "price": round(rng.uniform(0, 5000), 4),
        "qty": rng.randint(-1000, 100000),
        "side": rng.choice(("buy", "sell")),
        "tags": [rng.choice(_WORDS) for _ in range(rng.randint(0, 6))],
        "levels": [rng.uniform(-1e6, 1e6) for _ in range(rng.randint(2, 12))],
        "status": rng.choice((None, True, False, "open", "filled")),
    }
    if depth < 2:
        rec["meta"] = {rng.choice(_KEYS): _text(rng) for _ in range(rng.randint(1, 5))}
        rec["book"] = [_record(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rec


def large_document(target_bytes, seed=20240601):
    """A deterministic document of about target_bytes packed bytes."""
    rng = random.Random(seed)
    import upcall
    # Size the record list by packing a sample of records.
    sample = [_record(rng) for _ in range(50)]
    per_record = len(upcall.packb(sample)) / len(sample)
    n = max(1, int(target_bytes / per_record))
    rng = random.Random(seed)
    return {"version": 3, "source": "upcall-bench", "records": [_record(rng) for _ in range(n)]}


# ---------------------------------------------------------------- measuring

def _cpu_busy_jiffies():
    """(busy, total) jiffies of the whole machine, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _timed(fn, arg, number):
    """Seconds per call of fn(arg) over `number` calls, and whether another
    process used a noticeable share of the CPU meanwhile."""
    j0 = _cpu_busy_jiffies()
    c0 = time.process_time()
    t0 = time.perf_counter()
    for _ in range(number):
        fn(arg)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    disturbed = False
    j1 = _cpu_busy_jiffies()
    if j0 and j1 and wall > 0.05:
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        busy_others = (j1[0] - j0[0]) / hz - cpu
        disturbed = busy_others > 0.3 * wall   # someone else ran a third of the time
    return wall / number, disturbed


def _interleaved(variants, arg, number, repeats, max_redo=3):
    """{name: [seconds per call] * repeats}, the variants run A B C A B C..."""
    results = {name: [] for name, _ in variants}
    for r in range(repeats):
        order = variants if r % 2 == 0 else variants[::-1]   # no fixed position bias
        for name, fn in order:
            for attempt in range(max_redo + 1):
                per_call, disturbed = _timed(fn, arg, number)
                if not disturbed:
                    break
            results[name].append(per_call)
    return results


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
    import upcall
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
    import upcall
    quick = getattr(opts, "quick", False)
    repeats = getattr(opts, "codec_repeats", None) or (3 if quick else 15)
    doc_mb = getattr(opts, "codec_doc_mb", None) or (0.2 if quick else 20)
    small_s = 0.002 if quick else 0.05      # seconds per timed run, small message
    codecs = _codecs()

    small = upcall.packb(SMALL_MESSAGE)
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
        _run_all(codecs, small, doc, doc_packed, repeats, small_s, rows)
    finally:
        gc.unfreeze()
    _print(rows)
    return rows


def _run_all(codecs, small, doc, doc_packed, repeats, small_s, rows):
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
        res = _interleaved(variants, arg, number, repeats)
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
