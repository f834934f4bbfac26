"""Stamping section of bench_upcalls.py: what ``publisher(stamp=True)`` costs
per message, beside what libzmq alone charges for the stamp.

Every row is one process sending N 77-byte maps over tcp on 127.0.0.1 (a
PUSH, SNDHWM 0) to a PULL (RCVHWM 0) in the same process, so that its CPU
per message is the whole cost of a message: sender, receiver and libzmq's
I/O threads (getrusage, from the first send to the N-th delivery).

* ``c plain``, ``c +frame``, ``c topic-stamp``: bench/floor_stamp.c, a C
  PUSH thread and PULL sending [topic, payload], [topic, payload, stamped
  marker] (the stamp as one more frame) and [topic + stamp, payload] (the
  stamp at the end of the topic, as upcall sends a single stamped message:
  docs/wire.md, "Stamps");
* ``upcall``, ``upcall stamp``: a Publisher's ``send_packed`` per message to
  a subscription with a no-op target (decode and call included);
* ``upcall coalesced``, ``upcall coalesced stamp``: ``send_many`` in batches
  of 64 (one stamp per batch).

Rows run interleaved, each in a fresh process, after waiting for an idle
machine; medians.  Ratios: each stamped row to its unstamped row of the same
run (target: at most 1.03x CPU per message uncoalesced).
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

from bench import report
from bench.floors import c_program
from bench.measure import add_messages_argument, interleave, run_size, summarize, wait_for_idle

#: (row, what it is stamped against): the C rows compare with ``c plain``.
ROWS = (("c plain", None), ("c +frame", "c plain"), ("c topic-stamp", "c plain"),
        ("upcall", None), ("upcall stamp", "upcall"),
        ("upcall coalesced", None), ("upcall coalesced stamp", "upcall coalesced"))
C_SHAPES = {"c plain": "plain", "c +frame": "frame", "c topic-stamp": "topic"}
BATCH = 64
TIMEOUT = 300.0


def add_arguments(parser) -> None:
    add_messages_argument(parser, "stamping")


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def peer(row: str, n: int) -> dict:
    """One upcall row in this process: {"delivered", "seconds", "cpu"}."""
    import upcall
    from bench.workload import small_payload
    stamp = row.endswith(" stamp")
    payload = small_payload()
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", lambda msg: None, kind="pull", bind=True,
                            batch=1024, rcvhwm=0)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, sndhwm=0, stamp=stamp)
        t0, c0 = time.perf_counter(), _cpu()
        if row.startswith("upcall coalesced"):
            import msgpack
            batch = [msgpack.unpackb(payload)] * BATCH
            n -= n % BATCH
            send_many = pub.send_many
            for _ in range(n // BATCH):
                send_many(b"t", batch)
        else:
            send_packed = pub.send_packed
            for _ in range(n):
                send_packed(b"t", payload)
        deadline = time.monotonic() + TIMEOUT
        while sub.stats["delivered"] < n and time.monotonic() < deadline:
            time.sleep(0.0005)
        t1, c1 = time.perf_counter(), _cpu()
        stats = sub.stats
        if stamp and stats["lost"]:
            raise RuntimeError(f"{row}: {stats['lost']} lost over tcp with no high-water mark")
        return {"delivered": stats["delivered"], "seconds": t1 - t0, "cpu": c1 - c0, "n": n}


def run_one(row: str, n: int) -> dict:
    """One run of one row, in a process of its own: rate and CPU per message."""
    if row in C_SHAPES:
        path, why = c_program("floor_stamp")
        if path is None:
            raise RuntimeError(why)
        cmd = [path, C_SHAPES[row], str(n)]
    else:
        cmd = [sys.executable, "-m", "bench.stamping", "--peer", row, str(n)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    if r.returncode != 0:
        raise RuntimeError(f"stamping row {row!r}: {r.stderr.strip() or r.stdout.strip()}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    n = out.get("n", n)
    if out["delivered"] != n:
        raise RuntimeError(f"stamping row {row!r}: {out['delivered']} of {n} delivered")
    return {"rate": n / out["seconds"], "cpu_us": out["cpu"] / n * 1e6}


def run(opts) -> list[dict]:
    n, repeats = run_size(opts, "stamping")
    names = [r for r, _ in ROWS]
    results: dict[str, list[dict]] = {r: [] for r in names}
    for _, row in interleave(names, repeats, order="mirror"):
        wait_for_idle(timeout=0 if opts.quick else 30)
        results[row].append(run_one(row, n))
    rows = []
    for name, against in ROWS:
        rate = summarize(r["rate"] for r in results[name])
        cpu = summarize(r["cpu_us"] for r in results[name])
        rows.append({"row": name, "messages": n, "rate": rate.median, "rate_min": rate.min,
                     "rate_max": rate.max, "cpu_us": cpu.median, "cpu_us_min": cpu.min,
                     "cpu_us_max": cpu.max, "against": against})
    by = {r["row"]: r for r in rows}
    for row in rows:
        base = by.get(row["against"]) if row["against"] else None
        row["cpu_x"] = row["cpu_us"] / base["cpu_us"] if base and base["cpu_us"] else None
        row["rate_x"] = row["rate"] / base["rate"] if base and base["rate"] else None
    x3 = lambda v: "" if v is None else f"{v:.3f}x"   # noqa: E731
    report.print_table(rows, [
        report.Column("row"),
        report.Column("rate", "msgs/s", fmt=report.fmt_rate),
        report.Column("rate_min", "min", fmt=report.fmt_rate),
        report.Column("rate_max", "max", fmt=report.fmt_rate),
        report.Column("cpu_us", "CPU us/msg", fmt=lambda v: f"{v:.3f}"),
        report.Column("cpu_us_min", "CPU min", fmt=lambda v: f"{v:.3f}"),
        report.Column("cpu_us_max", "CPU max", fmt=lambda v: f"{v:.3f}"),
        report.Column("cpu_x", "CPU x unstamped", fmt=x3, align=">"),
        report.Column("rate_x", "rate x unstamped", fmt=x3, align=">"),
    ], title=f"stamping: {n:,} messages of 77 bytes per run, PUSH -> PULL over tcp loopback in "
             f"one process (sender, receiver and libzmq all counted), median of {repeats}",
       note=report.target_line("upcall stamp / upcall, CPU per message",
                               by["upcall stamp"]["cpu_x"], "<=", 1.03, fmt=x3))
    return rows


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--peer", nargs=2, metavar=("ROW", "N"))
    add_arguments(p)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--full", action="store_true")
    a = p.parse_args()
    if a.peer:
        print(json.dumps(peer(a.peer[0], int(a.peer[1]))), flush=True)
    else:
        run(a)
