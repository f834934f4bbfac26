"""Contention section of bench_upcalls.py: delivery while the main thread is busy.

The main thread runs a pure-Python loop (counting) for ``--contention-seconds``
while messages are offered at a fixed rate (``--contention-rate``, default
100,000/s) to a delivery thread.  A thread waiting for the GIL gets it about
once per switch interval (``sys.getswitchinterval()``, 5 ms by default), so
what matters is how much one GIL crossing delivers.

Rows:

* ``synthetic``: the paced synthetic source (``_synthetic_subscribe(bus, ...,
  rate=R, backlog_max=R)``: a bounded one-second queue, the excess is lost) to
  a native delivery thread, the 80-byte map payload decoded and handed to a
  pure-Python target, for several batch sizes.  Latency is the C core's: from
  each message's due time to the end of the deliver call that carried it.
* ``tcp``: the peer process (:mod:`bench.peer`: pyzmq if installed, else
  upcall) offers the same rate over tcp 127.0.0.1 to an upcall subscription on a native thread
  (default batch), then to the usual pyzmq loop (a Python thread: poll, then
  ``recv(NOBLOCK)`` twice per message, msgspec/msgpack decode, call).  The
  message carries its send time (CLOCK_MONOTONIC ns, shared by processes);
  latency is receive-side ``time.monotonic_ns()`` minus that.  Lost: refused
  by the publisher at its high-water mark (non-blocking sends) plus sent but
  never delivered.

Reported: offered and delivered rate during the busy window (delivered /
offered), the backlog when the window ended and the largest seen, lost, the
busy loop's speed relative to running alone (measured before and after, the
mean), and latency p50/p99.
"""
from __future__ import annotations

import math
import sys
import time

import upcall
from upcall._bus import _synthetic_info, _synthetic_subscribe

from bench import measure, report
from bench.harness import Endpoints, PyzmqLoop
from bench.peer import PeerProcess, have_pyzmq
from bench.workload import small_payload

DEFAULT_RATE = 100_000
DEFAULT_SECONDS = 3.0
QUICK_SECONDS = 0.3
SYNTH_BATCHES = [64, 256, 1024, 4096]


def add_arguments(parser) -> None:
    g = parser.add_argument_group("contention section")
    g.add_argument("--contention-rate", type=float, default=DEFAULT_RATE,
                   help=f"offered messages/s (default {DEFAULT_RATE:,})")
    g.add_argument("--contention-seconds", type=float, default=None,
                   help=f"busy window (default {DEFAULT_SECONDS}; quick {QUICK_SECONDS})")
    g.add_argument("--contention-batches", default=",".join(map(str, SYNTH_BATCHES)),
                   help="batch sizes of the synthetic rows")
    g.add_argument("--contention-no-tcp", action="store_true", help="skip the tcp rows")
    g.add_argument("--contention-tcp-batches", default=None,
                   help="batch sizes of the tcp upcall rows (default: DEFAULT_BATCH)")


def busy_loop(seconds: float) -> float:
    """A pure-Python loop for ``seconds``; returns its iterations per second."""
    i = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    pc = time.perf_counter
    while True:
        i += 1
        if not i & 1023 and pc() >= end:
            break
    return i / (pc() - t0)


def _pcts(lat_ns) -> tuple[float, float]:
    xs = sorted(v for v in lat_ns if v < 2 ** 63)
    if not xs:
        return math.nan, math.nan
    return (measure.percentile(xs, 50, presorted=True) / 1e6,
            measure.percentile(xs, 99, presorted=True) / 1e6)


# ---- synthetic rows -----------------------------------------------------------

def synthetic_row(bus, rate: float, seconds: float, batch: int, payload: bytes) -> dict:
    count = int(rate * seconds)

    def target(msg):
        pass

    sub = _synthetic_subscribe(bus, target, count=count, payload=payload, rate=rate,
                               backlog_max=int(rate), record_latency=True, batch=batch)
    busy = busy_loop(seconds)
    now = time.monotonic_ns()
    st, info = sub.stats, _synthetic_info(sub)
    offered = min(count, (now - info["start_ns"]) * rate / 1e9)
    delivered_window = st["delivered"]
    window = (now - info["start_ns"]) / 1e9
    sub.wait(60.0)
    info, st = _synthetic_info(sub), sub.stats
    sub.close()
    p50, p99 = _pcts(info["latency_ns"])
    return {"offered_rate": offered / window, "rate": delivered_window / window,
            "backlog": max(0, int(offered - delivered_window - st["dropped"])),
            "max_backlog": info["max_backlog"], "lost": st["dropped"],
            "busy_rate": busy, "p50_ms": p50, "p99_ms": p99, "n": count}


# ---- tcp rows -------------------------------------------------------------------

def tcp_row(peer: PeerProcess, endpoint: str, mode: str, rate: float, seconds: float,
            batch: int | None = None) -> dict:
    lat: list[int] = []
    mono = time.monotonic_ns
    append = lat.append

    def target(msg):
        append(mono() - msg["t"])

    bus = loop = None
    if mode == "upcall bus":
        bus = upcall.Bus()
        bus.subscribe(endpoint, target, kind="pull", bind=True, batch=batch)
    else:
        import zmq
        try:
            import msgspec
            decode = msgspec.msgpack.Decoder().decode
        except ImportError:
            import msgpack
            decode = msgpack.unpackb
        ctx = zmq.Context(1)
        loop = PyzmqLoop(ctx, endpoint, decode, target)
    try:
        peer.request(cmd="connect", endpoint=endpoint)
        time.sleep(0.3)                       # the tcp connection is up
        peer.send(cmd="pace", rate=rate, seconds=seconds)
        busy = busy_loop(seconds)
        delivered_window = len(lat)
        res = peer.answer()
        deadline = time.monotonic() + 2.0
        while len(lat) < res["sent"] and time.monotonic() < deadline:
            time.sleep(0.05)
        delivered = len(lat)
        peer.request(cmd="close")
    finally:
        if bus is not None:
            bus.close()
        if loop is not None:
            loop.close()
            ctx.term()
    p50, p99 = _pcts(list(lat))
    offered = res["sent"] + res["lost"]
    return {"offered_rate": offered / seconds, "rate": delivered_window / seconds,
            "backlog": max(0, res["sent"] - delivered_window), "max_backlog": None,
            "lost": res["lost"] + max(0, res["sent"] - delivered),
            "busy_rate": busy, "p50_ms": p50, "p99_ms": p99, "n": offered}


# ---- the section ---------------------------------------------------------------

def run(opts) -> list[dict]:
    rate = opts.contention_rate
    seconds = opts.contention_seconds or (QUICK_SECONDS if opts.quick else DEFAULT_SECONDS)
    batches = [int(b) for b in opts.contention_batches.split(",") if b.strip()]
    if upcall.DEFAULT_BATCH not in batches:
        batches.append(upcall.DEFAULT_BATCH)
    switch_ms = sys.getswitchinterval() * 1e3
    payload = small_payload()
    print(f"\n## contention: main thread busy in a pure-Python loop for {seconds:g} s while "
          f"{rate:,.0f} msgs/s are offered; switch interval {switch_ms:g} ms", flush=True)
    measure.wait_for_idle(timeout=10.0 if not opts.quick else measure.QUICK_IDLE_TIMEOUT)
    solo = [busy_loop(min(seconds, 1.0))]
    rows = []
    with upcall.Bus() as bus:
        for b in batches:
            measure.wait_for_idle(timeout=10.0 if not opts.quick else measure.QUICK_IDLE_TIMEOUT)
            r = synthetic_row(bus, rate, seconds, b, payload)
            r.update(case="synthetic", variant=f"synthetic -> native thread, batch {b}",
                     target="python", thread="native", gil="adopt", batch=b, payload="map")
            rows.append(r)
    if not opts.contention_no_tcp:
        tcp_batches = [int(b) for b in (opts.contention_tcp_batches or
                                        str(upcall.DEFAULT_BATCH)).split(",") if b.strip()]
        modes = [("upcall bus", b) for b in tcp_batches]
        if have_pyzmq():
            modes.append(("pyzmq loop", 1))
        endpoints = Endpoints()
        with PeerProcess() as peer:
            for mode, b in modes:
                measure.wait_for_idle(timeout=10.0 if not opts.quick else measure.QUICK_IDLE_TIMEOUT)
                r = tcp_row(peer, endpoints.new("tcp"), mode, rate, seconds, b)
                name = mode if len(tcp_batches) == 1 or mode != "upcall bus" else f"{mode}, batch {b}"
                r.update(case="tcp", variant=f"tcp: {name}", mode=mode, target="python",
                         thread="native" if mode == "upcall bus" else "python (pyzmq)",
                         gil="adopt" if mode == "upcall bus" else "-",
                         batch=b, payload="map+t")
                rows.append(r)
    solo.append(busy_loop(min(seconds, 1.0)))
    solo_rate = sum(solo) / len(solo)
    zmq_rate = next((r["rate"] for r in rows if r["variant"] == "tcp: pyzmq loop"), math.nan)
    for r in rows:
        r["busy_ratio"] = report.ratio(r["busy_rate"], solo_rate)
        r["delivered_ratio"] = report.ratio(r["rate"], rate)
        r["seconds"] = seconds
        r["switch_interval_ms"] = switch_ms
        r["busy_solo_rate"] = solo_rate
        if r["case"] == "tcp":
            r["ratio_to_pyzmq"] = report.ratio(r["rate"], zmq_rate)
    cols = [report.Column("variant", "variant"),
            report.Column("offered_rate", "offered/s", fmt=report.fmt_rate),
            report.Column("rate", "delivered/s", fmt=report.fmt_rate),
            report.Column("delivered_ratio", "x offered", fmt=report.fmt_ratio),
            report.Column("backlog", "backlog at end", fmt=report.fmt_num),
            report.Column("max_backlog", "max backlog", fmt=report.fmt_num),
            report.Column("lost", "lost", fmt=report.fmt_num),
            report.Column("busy_ratio", "busy loop x alone", fmt=report.fmt_ratio),
            report.Column("p50_ms", "p50 ms", fmt=lambda v: report.fmt_num(v, 2)),
            report.Column("p99_ms", "p99 ms", fmt=lambda v: report.fmt_num(v, 2)),
            report.Column("ratio_to_pyzmq", "x pyzmq", fmt=report.fmt_ratio)]
    report.print_table(rows, cols, title=(
        f"contention: {rate:,.0f} msgs/s offered for {seconds:g} s, main thread busy "
        f"(alone: {solo_rate / 1e6:.1f}M loop iterations/s), switch interval {switch_ms:g} ms"))
    return rows

