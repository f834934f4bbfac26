"""Contention section of bench_upcalls.py: delivery while the main thread is busy.

The main thread runs a pure-Python loop (counting) for ``--contention-seconds``
while messages are offered at a fixed rate (``--contention-rate``, default
100,000/s) to a delivery thread.  A thread waiting for the GIL gets it about
once per switch interval (``sys.getswitchinterval()``, 5 ms by default), so
what matters is how much one GIL crossing delivers.

Rows:

* ``synthetic``: the paced synthetic source (``bus.subscribe("bench://", ...,
  rate=R, backlog_max=R)``: a bounded one-second queue, the excess is lost) to
  a native delivery thread, the 80-byte map payload decoded and handed to a
  pure-Python target, for several batch sizes.  Latency is the C core's: from
  each message's due time to the end of the deliver call that carried it.
* ``tcp``: a publisher process (pyzmq if installed, else upcall) offers the
  same rate over tcp 127.0.0.1 to an upcall subscription on a native thread
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

import json
import math
import os
import socket
import struct
import subprocess
import sys
import threading
import time

from bench import measure, report

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


def _payload() -> bytes:
    from bench.upcalls import small_payload
    return small_payload()


# ---- synthetic rows -----------------------------------------------------------

def synthetic_row(bus, rate: float, seconds: float, batch: int, payload: bytes) -> dict:
    count = int(rate * seconds)

    def target(msg):
        pass

    sub = bus.subscribe("bench://", target, count=count, payload=payload, rate=rate,
                        batch=batch, backlog_max=int(rate), record_latency=True)
    busy = busy_loop(seconds)
    now = time.monotonic_ns()
    st, info = sub.stats, sub.synthetic
    offered = min(count, (now - info["start_ns"]) * rate / 1e9)
    delivered_window = st["delivered"]
    window = (now - info["start_ns"]) / 1e9
    sub.wait(60.0)
    info, st = sub.synthetic, sub.stats
    sub.close()
    p50, p99 = _pcts(info["latency_ns"])
    return {"offered_rate": offered / window, "rate": delivered_window / window,
            "backlog": max(0, int(offered - delivered_window - st["dropped"])),
            "max_backlog": info["max_backlog"], "lost": st["dropped"],
            "busy_rate": busy, "p50_ms": p50, "p99_ms": p99, "n": count}


# ---- tcp rows -------------------------------------------------------------------

def publish(endpoint: str, rate: float, seconds: float) -> int:
    """The publisher process: connect a PUSH, wait for "go", offer `rate` msgs/s."""
    from bench.codec import SMALL_MESSAGE
    msg = dict(SMALL_MESSAGE)
    msg["t"] = 2 ** 63                      # packs as uint64: 0xcf + 8 bytes
    try:
        import zmq
        import msgpack
        packed = bytearray(msgpack.packb(msg))
        ctx = zmq.Context(1)
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        again, nb, more = zmq.Again, zmq.NOBLOCK, zmq.SNDMORE

        def send(payload):
            try:
                sock.send(b"t", nb | more)
            except again:
                return False
            sock.send(payload)
            return True
    except ImportError:
        import upcall
        packed = bytearray(upcall.packb(msg))
        bus = upcall.Bus()
        pub = bus.publisher(endpoint, kind="push", bind=False, linger=0.0)

        def send(payload):
            try:
                pub.send_packed(b"t", bytes(payload), timeout=0)
            except BlockingIOError:
                return False
            return True
    off = bytes(packed).index(b"\xcf\x80\x00\x00\x00\x00\x00\x00\x00") + 1
    print("ready", flush=True)
    sys.stdin.readline()
    total = int(rate * seconds)
    sent = lost = 0
    t0 = time.monotonic()
    mono, pack_into = time.monotonic_ns, struct.pack_into
    while sent + lost < total:
        due = min(total, int((time.monotonic() - t0) * rate) + 1)
        while sent + lost < due:
            pack_into(">Q", packed, off, mono())
            if send(packed):
                sent += 1
            else:
                lost += 1
        time.sleep(0.0005)
    print(json.dumps({"sent": sent, "lost": lost, "seconds": time.monotonic() - t0}), flush=True)
    sys.stdin.readline()
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tcp_row(mode: str, rate: float, seconds: float, batch: int | None = None) -> dict:
    import upcall
    lat: list[int] = []
    mono = time.monotonic_ns
    append = lat.append

    def target(msg):
        append(mono() - msg["t"])

    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    bus = loop = None
    if mode == "upcall bus":
        bus = upcall.Bus()
        sub = bus.subscribe(endpoint, target, kind="pull", bind=True, batch=batch)
    else:
        import zmq
        from bench.bus import PyzmqLoop
        try:
            import msgspec
            decode = msgspec.msgpack.Decoder().decode
        except ImportError:
            import msgpack
            decode = msgpack.unpackb
        ctx = zmq.Context(1)
        loop = PyzmqLoop(ctx, endpoint, decode, target)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), env.get("PYTHONPATH", "")] if p)
    peer = subprocess.Popen([sys.executable, "-m", "bench.contention", "--publish",
                             endpoint, str(rate), str(seconds)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert peer.stdout.readline().strip() == "ready"
        time.sleep(0.3)                       # the tcp connection is up
        peer.stdin.write("go\n")
        peer.stdin.flush()
        busy = busy_loop(seconds)
        delivered_window = len(lat)
        res = json.loads(peer.stdout.readline())
        deadline = time.monotonic() + 2.0
        while len(lat) < res["sent"] and time.monotonic() < deadline:
            time.sleep(0.05)
        delivered = len(lat)
        peer.stdin.write("quit\n")
        peer.stdin.flush()
        peer.wait(10)
    finally:
        if peer.poll() is None:
            peer.kill()
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
    import upcall
    rate = opts.contention_rate
    seconds = opts.contention_seconds or (QUICK_SECONDS if opts.quick else DEFAULT_SECONDS)
    batches = [int(b) for b in opts.contention_batches.split(",") if b.strip()]
    if upcall.DEFAULT_BATCH not in batches:
        batches.append(upcall.DEFAULT_BATCH)
    switch_ms = sys.getswitchinterval() * 1e3
    payload = _payload()
    print(f"\n## contention: main thread busy in a pure-Python loop for {seconds:g} s while "
          f"{rate:,.0f} msgs/s are offered; switch interval {switch_ms:g} ms", flush=True)
    measure.wait_for_idle(timeout=10.0 if not opts.quick else 0.5)
    solo = [busy_loop(min(seconds, 1.0))]
    rows = []
    with upcall.Bus() as bus:
        for b in batches:
            measure.wait_for_idle(timeout=10.0 if not opts.quick else 0.5)
            r = synthetic_row(bus, rate, seconds, b, payload)
            r.update(case="synthetic", variant=f"synthetic -> native thread, batch {b}",
                     target="python", thread="native", gil="adopt", batch=b, payload="map")
            rows.append(r)
    if not opts.contention_no_tcp:
        tcp_batches = [int(b) for b in (opts.contention_tcp_batches or
                                        str(upcall.DEFAULT_BATCH)).split(",") if b.strip()]
        modes = [("upcall bus", b) for b in tcp_batches]
        try:
            import zmq  # noqa: F401
            modes.append(("pyzmq loop", 1))
        except ImportError:
            pass
        for mode, b in modes:
            measure.wait_for_idle(timeout=10.0 if not opts.quick else 0.5)
            r = tcp_row(mode, rate, seconds, b)
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


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--publish":
        return publish(argv[1], float(argv[2]), float(argv[3]))
    print("usage: python -m bench.contention --publish ENDPOINT RATE SECONDS",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
