"""Proxy section of bench_upcalls.py: forwarding through `upcall proxy`
against libzmq's zmq_proxy in a plain C program.

Two forwarders, each in a process of its own, run in turn (interleaved,
A B, B A, ...) between the same ends: a C publisher and a C subscriber
(bench/proxy_ends.c) over tcp loopback, so that the forwarder is what
limits the rate:

* ``upcall proxy``: ``python -m upcall proxy FRONT BACK --hwm 0``
  (Bus.proxy: libzmq's zmq_proxy_steerable on a thread of the bus);
* ``c-zmq_proxy``: bench/floor_proxy.c, ``zmq_proxy`` between an XSUB and
  an XPUB set as upcall sets them (the floor).

High-water marks are 0 everywhere: nothing is dropped, every message sent
is received, and the rate is N over the time from the first send to the
N-th receipt.  Reported: msgs/s and the forwarder process's CPU per message
(its threads, over the run), and the ratio upcall / C (target >= 0.9x).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from bench import report
from bench.floors import c_program
from bench.measure import (_pid_cpu, add_messages_argument, interleave, run_size, summarize,
                           wait_for_idle)

VARIANTS = ("upcall proxy", "c-zmq_proxy")
PAYLOAD = 64
TIMEOUT = 120.0


def add_arguments(parser) -> None:
    add_messages_argument(parser, "proxy")


def _start_forwarder(variant: str) -> tuple[subprocess.Popen, str, str]:
    if variant == "upcall proxy":
        proc = subprocess.Popen([sys.executable, "-m", "upcall", "proxy", "tcp://127.0.0.1:*",
                                 "tcp://127.0.0.1:*", "--hwm", "0"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = proc.stderr.readline().strip()
        prefix = "upcall proxy: frontend "
        if not line.startswith(prefix):
            proc.kill()
            raise RuntimeError(f"upcall proxy did not start: {line!r}")
        front, back = line[len(prefix):].split(", backend ")
        return proc, front, back
    path, why = c_program("floor_proxy")
    if path is None:
        raise RuntimeError(why)
    proc = subprocess.Popen([path, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "0"],
                            stdout=subprocess.PIPE, text=True)
    ends = json.loads(proc.stdout.readline())
    return proc, ends["frontend"], ends["backend"]


def run_one(variant: str, n: int) -> dict:
    """One run through one forwarder: rate and the forwarder's CPU per message."""
    ends, why = c_program("proxy_ends")
    if ends is None:
        raise RuntimeError(why)
    proc, front, back = _start_forwarder(variant)
    try:
        cpu0 = _pid_cpu(proc.pid)
        r = subprocess.run([ends, front, back, str(n), str(PAYLOAD)], capture_output=True,
                           text=True, timeout=TIMEOUT)
        cpu1 = _pid_cpu(proc.pid)
        if r.returncode != 0:
            raise RuntimeError(f"proxy_ends through {variant}: {r.stderr.strip()}")
        out = json.loads(r.stdout)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    rate = out["received"] / out["seconds"]
    cpu = (cpu1 - cpu0) / n if cpu0 is not None and cpu1 is not None else float("nan")
    return {"rate": rate, "cpu_us": cpu * 1e6}


def run(opts) -> list[dict]:
    n, repeats = run_size(opts, "proxy")
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for _, variant in interleave(VARIANTS, repeats, order="mirror"):
        wait_for_idle(timeout=0 if opts.quick else 30)
        results[variant].append(run_one(variant, n))
    rows = []
    for variant in VARIANTS:
        rate = summarize(r["rate"] for r in results[variant])
        cpu = summarize(r["cpu_us"] for r in results[variant])
        rows.append({"row": variant, "messages": n, "rate": rate.median, "rate_min": rate.min,
                     "rate_max": rate.max, "cpu_us": cpu.median})
    floor = rows[1]["rate"]
    for row in rows:
        row["vs_c"] = row["rate"] / floor if floor else float("nan")
    report.print_table(rows, [
        report.Column("row"),
        report.Column("rate", "msgs/s", fmt=report.fmt_rate),
        report.Column("rate_min", "min", fmt=report.fmt_rate),
        report.Column("rate_max", "max", fmt=report.fmt_rate),
        report.Column("cpu_us", "fwd CPU us/msg", fmt=lambda v: f"{v:.3f}"),
        report.Column("vs_c", "x c-zmq_proxy", fmt=report.fmt_ratio),
    ], title=f"proxy: {n:,} messages of {PAYLOAD} bytes, C publisher -> forwarder -> C "
             f"subscriber over tcp loopback, median of {repeats}",
       note=report.target_line("upcall proxy / c-zmq_proxy", rows[0]["vs_c"], ">=", 0.9))
    return rows


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser()
    add_arguments(p)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--full", action="store_true")
    run(p.parse_args())
