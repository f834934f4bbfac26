"""Large payloads: bandwidth and subscriber memory, one interleaved run.

Rows, per transport and payload size, all in the same run:

* ``upcall zero-copy``: out of band, opted in to explicitly: a publisher
  with ``oob_threshold=16384`` and ``send(..., copy=False)`` of
  ``{"blob": payload, "i": i}``, the payload a frame of its own (ext 126)
  over the sender's memory, delivered as a memoryview over the zmq frame,
  which the target takes as ``m["blob"]``;
* ``upcall inline``: the default publisher (``oob_threshold=None``,
  ``send()`` copying), the payload copied into the msgpack ``bin`` and
  decoded to ``bytes``: plain msgpack, what any msgpack reader gets;
* ``pyzmq copy=False``: raw bytes, ``send_multipart([topic, payload], copy=False)`` /
  ``recv_multipart(copy=False)``: the libzmq ceiling;
* ``pyzmq+msgpack``: ``msgpack.packb({"blob": payload})`` and ``unpackb``;
* ``memcpy touched`` / ``memcpy fresh``: one copy of the payload into a
  buffer already touched, and into freshly allocated memory (page faults).

The payload is a ``bytearray`` (what a user fills in place), the same object
for every row and every message.

Over ipc and tcp the subscriber is a process of its own (``python -m
bench.large --role sub``): it binds, the publisher (this process) connects
and sends ``count`` messages, one at a time: the next is sent once the
subscriber has said (a line on its stdout) that the target got the last
one, so that a queue of messages never decides the memory figure.  The
rate is count payloads over the time from the first send to the last
acknowledgement (for 100 MB the acknowledgement's own ~0.1 ms is noise);
the subscriber's peak RSS (``VmHWM``) above its RSS before the first
message is given over the payload size.  Over inproc publisher and
subscriber share this process, same measure, and ``ms/msg`` shows what
delivering one payload costs.

``--huge`` adds 1000 MB payloads when the machine has about MEMORY_FACTOR
(6) times that available, and otherwise prints why it skipped them.  The
compression rows (lz4 and zstd against raw, compressible and random data, over
loopback and over a 1 Gbit/s link between two network namespaces) follow
in a table of their own: :mod:`bench.compression`.

    python bench_upcalls.py --large [--large-sizes 1,100] [--huge] [--large-transports ipc]
    python bench_upcalls.py --large --large-compression only --large-sizes 1,100
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

import psutil

from bench.measure import QUICK_IDLE_TIMEOUT, interleave, summarize, wait_for_idle

IMPLS = ["upcall zero-copy", "upcall inline", "pyzmq copy=False", "pyzmq+msgpack"]
TRANSPORTS = ["inproc", "ipc", "tcp"]
MB = 1_000_000
#: The zero-copy row's oob_threshold: values above 16 KiB go out of band.
ZERO_COPY_THRESHOLD = 16384


def add_arguments(parser) -> None:
    g = parser.add_argument_group("large section")
    g.add_argument("--large-sizes", default="1,100", metavar="MB,...",
                   help="payload sizes in MB (default 1,100)")
    g.add_argument("--huge", action="store_true", help="add 1000 MB payloads")
    g.add_argument("--large-transports", default=",".join(TRANSPORTS), metavar="T,...")
    g.add_argument("--large-impls", default=",".join(IMPLS), metavar="I,...")
    g.add_argument("--large-repeats", type=int, default=None, metavar="N",
                   help="interleaved rounds (default 3, --quick 1)")
    g.add_argument("--large-threshold", action="store_true",
                   help="only the threshold sweep: inline vs out of band for 1 KB-1 MB values")
    g.add_argument("--large-compression", choices=["yes", "no", "only"], default="yes",
                   help="the compression rows (lz4 and zstd vs raw over loopback and a 1 Gbit/s link "
                        "between two network namespaces): with the rest (default), no, or only")


def _count(size: int, quick: bool) -> int:
    """Messages per row: about 600 MB, at least 3."""
    if quick:
        return 3
    return max(3, min(200, (600 * MB) // size))


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _peak_rss() -> int:
    """The process's peak RSS: VmHWM, not ru_maxrss, which a process started
    with fork + exec inherits from its parent (the benchmark, holding the
    payloads)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---- the subscriber side ----------------------------------------------------

class _Times:
    def __init__(self, count: int, ack=None):
        self.count = count
        self.times: list[float] = []
        self.sizes: list[int] = []
        self.done = threading.Event()
        self.ack = ack

    def __call__(self, n: int) -> None:
        self.times.append(time.perf_counter())
        self.sizes.append(n)
        if self.ack is not None:
            self.ack()
        if len(self.times) >= self.count:
            self.done.set()

    def result(self) -> dict:
        t = self.times
        size = self.sizes[-1] if self.sizes else 0
        rate = (len(t) - 1) * size / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else float("nan")
        return {"rate": rate, "received": len(t), "size": size}


# The payloads here (up to 1000 MB, compressed in the compression rows)
# are over what a subscription decompresses by default
# (upcall.DEFAULT_MAX_DECOMPRESSED): a subscriber expecting them says so.
MAX_MESSAGE_SIZE = 1 << 31


def _upcall_sub(bus, ep, times, bind=True):
    import upcall  # noqa: F401

    def on(msg):
        times(len(msg["blob"]))
    return bus.subscribe(ep, on, kind="pull", bind=bind, max_message_size=MAX_MESSAGE_SIZE)


def _pyzmq_sub(ctx, ep, times, impl, stop):
    import msgpack
    import zmq
    sock = ctx.socket(zmq.PULL)
    sock.bind(ep)

    def loop():
        sock.rcvtimeo = 200
        while not stop.is_set() and not times.done.is_set():
            try:
                if impl == "pyzmq copy=False":
                    frames = sock.recv_multipart(copy=False)
                    times(len(frames[1].buffer))
                else:
                    frames = sock.recv_multipart()
                    times(len(msgpack.unpackb(frames[1])["blob"]))
            except zmq.Again:
                continue
            del frames
        sock.close(0)
    th = threading.Thread(target=loop, daemon=True)
    return sock, th


def sub_main(argv) -> int:
    """The subscriber process: bind, print "ready <endpoint>", receive,
    print one JSON line."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl")
    ap.add_argument("--endpoint")
    ap.add_argument("--count", type=int)
    o = ap.parse_args(argv)

    def ack():
        sys.stdout.write("ack\n")
        sys.stdout.flush()
    times = _Times(o.count, ack)
    stop = threading.Event()
    if o.impl.startswith("upcall"):
        import upcall
        bus = upcall.Bus()
        sub = _upcall_sub(bus, o.endpoint, times)
        ep = sub.last_endpoint
        th = None
    else:
        import zmq
        ctx = zmq.Context()
        sock, th = _pyzmq_sub(ctx, o.endpoint, times, o.impl, stop)
        ep = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    base = _rss()
    print("ready", ep, flush=True)
    if th is not None:
        th.start()
    ok = times.done.wait(300)
    stop.set()
    res = times.result()
    res["ok"] = ok
    res["rss_base"] = base
    res["rss_peak"] = _peak_rss()
    print(json.dumps(res), flush=True)
    if th is not None:
        th.join(5)
    else:
        bus.close()
    return 0


# ---- the publisher side (this process) ----------------------------------

def _send(impl, ep, payload, count, wait_ack, bus=None, zctx=None):
    """Send count messages one at a time (wait_ack() after each); returns
    (the sender, the seconds from the first send to the last ack)."""
    if impl.startswith("upcall"):
        # Each mode asked for by name: the zero-copy row opts in to
        # out-of-band frames and to sending them without a copy (payload is
        # bytes, never changed); the inline row is the default publisher.
        # The zero-copy row's threshold is the one a user of large values
        # sets (anything above 16 KiB out of band), and its message carries
        # a small field beside the blob, as such a message does.
        if impl == "upcall zero-copy":
            pub = bus.publisher(ep, kind="push", bind=False, oob_threshold=ZERO_COPY_THRESHOLD)
            copy = False
        else:
            pub = bus.publisher(ep, kind="push", bind=False, oob_threshold=None)
            copy = True
        pub.send(b"large", {"blob": payload, "i": 0}, copy=copy)   # warm-up: connected, thread started
        wait_ack()
        t0 = time.perf_counter()
        for i in range(count):
            pub.send(b"large", {"blob": payload, "i": i + 1}, copy=copy)
            wait_ack()
        return pub, time.perf_counter() - t0
    import msgpack
    import zmq
    sock = zctx.socket(zmq.PUSH)
    sock.connect(ep)
    for i in range(count + 1):       # the first is the warm-up, not timed
        if i == 1:
            t0 = time.perf_counter()
        if impl == "pyzmq copy=False":
            sock.send_multipart([b"large", payload], copy=False)
        else:
            sock.send_multipart([b"large", msgpack.packb({"blob": payload})])
        wait_ack()
    return sock, time.perf_counter() - t0


def _row_remote(impl, transport, size, payload, ipc_dir, bus, zctx, quick):
    count = _count(size, quick)
    ep = f"ipc://{ipc_dir}/large-{os.getpid()}-{time.monotonic_ns()}" if transport == "ipc" \
        else "tcp://127.0.0.1:*"
    proc = subprocess.Popen([sys.executable, "-m", "bench.large", "--role", "sub", "--impl", impl,
                             "--endpoint", ep, "--count", str(count + 1)],
                            stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        line = proc.stdout.readline().split()
        if not line or line[0] != "ready":
            raise RuntimeError(f"subscriber for {impl} did not start: {line}")
        def wait_ack():
            if proc.stdout.readline().strip() != "ack":
                raise RuntimeError(f"subscriber for {impl} ended early")
        sender, elapsed = _send(impl, line[1], payload, count, wait_ack, bus=bus, zctx=zctx)
        out = proc.stdout.readline()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    sender.close()
    res = json.loads(out)
    res["rate"] = count * size / elapsed
    res["rss_over_payload"] = (res["rss_peak"] - res["rss_base"]) / size
    return res


def _row_inproc(impl, size, payload, bus, zctx, quick):
    count = _count(size, quick)
    acked = threading.Semaphore(0)
    times = _Times(count + 1, acked.release)
    ep = f"inproc://large-{time.monotonic_ns()}"
    stop = threading.Event()

    def wait_ack():
        if not acked.acquire(timeout=300):
            raise RuntimeError(f"{impl} over inproc: no delivery")
    if impl.startswith("upcall"):
        sub = _upcall_sub(bus, ep, times)
        sender, elapsed = _send(impl, ep, payload, count, wait_ack, bus=bus)
        sub.close()
    else:
        sock, th = _pyzmq_sub(zctx, ep, times, impl, stop)
        th.start()
        sender, elapsed = _send(impl, ep, payload, count, wait_ack, zctx=zctx)
        stop.set()
        th.join(5)
    sender.close()
    res = {"rate": count * size / elapsed, "rss_over_payload": float("nan")}
    return res


def _memcpy(size, payload, touched, fresh):
    import numpy as np
    src = np.frombuffer(payload, dtype=np.uint8)
    if fresh:
        t0 = time.perf_counter()
        dst = np.empty(size, dtype=np.uint8)
        np.copyto(dst, src)
        t = time.perf_counter() - t0
        del dst
    else:
        t0 = time.perf_counter()
        np.copyto(touched, src)
        t = time.perf_counter() - t0
    return size / t


THRESHOLD_SIZES = [1024, 4096, 16384, 32768, 65536, 262144, 1048576]


def _threshold_row(bus, ipc_dir, size, oob, quick):
    """Messages {"blob": bytes(size)} over ipc, publisher and subscriber in
    this process: delivered msgs/s and process CPU per message."""
    from bench.measure import process_cpu
    n = 200 if quick else max(200, min(20000, (400 * MB) // size))
    got = _Times(n)
    ep = f"ipc://{ipc_dir}/thr-{time.monotonic_ns()}"
    sub = bus.subscribe(ep, lambda m: got(len(m["blob"])), kind="pull", bind=True)
    # Out of band as recorded: opted in, zero-copy (blob is bytes, never changed).
    pub = bus.publisher(ep, kind="push", bind=False, oob_threshold=1 if oob else None)
    copy = not oob
    blob = bytes(size)
    pub.send(b"t", {"blob": blob}, copy=copy)      # connected: the first one waits for it
    got.times.clear()
    got.sizes.clear()
    c0, t0 = process_cpu(), time.perf_counter()
    for _ in range(n):
        pub.send(b"t", {"blob": blob}, copy=copy)
    got.done.wait(300)
    t1, c1 = time.perf_counter(), process_cpu()
    sub.close()
    pub.close()
    return {"msgs_per_s": len(got.times) / (t1 - t0), "cpu_us": (c1 - c0) / max(1, len(got.times)) * 1e6}


def run_threshold(opts) -> list[dict]:
    import upcall
    repeats = opts.large_repeats or (1 if opts.quick else 3)
    ipc_dir = tempfile.mkdtemp(prefix="uc-thr-", dir="/tmp")
    res: dict[tuple, list] = {}
    with upcall.Bus() as bus:
        variants = [(size, oob) for size in THRESHOLD_SIZES for oob in (False, True)]
        for _, (size, oob) in interleave(variants, repeats):
            wait_for_idle(timeout=QUICK_IDLE_TIMEOUT if opts.quick else 10)
            res.setdefault((size, oob), []).append(_threshold_row(bus, ipc_dir, size, oob, opts.quick))
    print(f"\n## Out-of-band threshold: one value of `size` bytes per message, ipc, "
          f"publisher and subscriber in one process, inline (the default) vs out of band "
          f"zero-copy (oob_threshold=1, copy=False) (median of {repeats})")
    print(f"{'size':>8} {'inline msgs/s':>14} {'oob msgs/s':>11} {'oob/inline':>10} "
          f"{'inline CPU us':>13} {'oob CPU us':>10}")
    records = []
    for size in THRESHOLD_SIZES:
        a, b = res[(size, False)], res[(size, True)]
        ra, rb = summarize(r["msgs_per_s"] for r in a), summarize(r["msgs_per_s"] for r in b)
        ca, cb = summarize(r["cpu_us"] for r in a), summarize(r["cpu_us"] for r in b)
        rec = {"size": size, "inline_rate": ra.median, "oob_rate": rb.median,
               "inline_cpu_us": ca.median, "oob_cpu_us": cb.median}
        records.append(rec)
        print(f"{size:>8} {ra.median:>14.0f} {rb.median:>11.0f} {rb.ratio_to(ra):>10.2f} "
              f"{ca.median:>13.1f} {cb.median:>10.1f}")
    return records


def run(opts) -> list[dict]:
    if opts.large_threshold:
        return run_threshold(opts)
    sizes = [int(float(s) * MB) for s in opts.large_sizes.split(",") if s]
    if opts.huge:
        short = _memory_short(HUGE)
        if short:
            print(f"\n## Large payloads: skipped the 1000 MB rows (--huge): {short}")
        else:
            sizes.append(HUGE)
    repeats = opts.large_repeats or (1 if opts.quick else 3)
    records = [] if opts.large_compression == "only" else _run_transports(opts, sizes, repeats)
    if opts.large_compression != "no":
        from bench import compression
        records += compression.run(sizes, lambda size: _count(size, opts.quick), repeats,
                                   opts.quick)
    return records


#: The --huge payload.
HUGE = 1000 * MB
#: Memory a row of payload size S may need at once, in units of S: in this
#: process the payload, the touched buffer of the memcpy rows and one packed
#: copy (inline rows); in the subscriber two (the frame and a decoded copy);
#: in a compression row's publisher the data, its generator's scratch and the
#: compressed frame.
MEMORY_FACTOR = 6


def _memory_short(size: int) -> str | None:
    """Why payloads of size bytes do not fit in this machine's free memory."""
    need, free = MEMORY_FACTOR * size, psutil.virtual_memory().available
    if free < need:
        return (f"needs about {need / 1e9:.1f} GB of available memory "
                f"({MEMORY_FACTOR}x the payload), {free / 1e9:.1f} GB available")
    return None


def _run_transports(opts, sizes: list[int], repeats: int) -> list[dict]:
    """The bandwidth rows: every implementation over every transport."""
    import upcall
    import zmq
    transports = [t for t in opts.large_transports.split(",") if t]
    impls = [i for i in opts.large_impls.split(",") if i]
    ipc_dir = tempfile.mkdtemp(prefix="uc-large-", dir="/tmp")
    results: dict[tuple, list] = {}
    import numpy as np
    with upcall.Bus() as bus:
        zctx = zmq.Context()
        try:
            for size in sizes:
                payload = bytearray(np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8).tobytes())
                touched = np.ones(size, dtype=np.uint8)
                variants = [(t, i) for t in transports for i in impls] + [("-", "memcpy touched"),
                                                                           ("-", "memcpy fresh")]
                for _, (transport, impl) in interleave(variants, repeats):
                    wait_for_idle(timeout=QUICK_IDLE_TIMEOUT if opts.quick else 10)
                    if impl.startswith("memcpy"):
                        res = {"rate": _memcpy(size, payload, touched, impl.endswith("fresh")),
                               "rss_over_payload": float("nan")}
                    elif transport == "inproc":
                        res = _row_inproc(impl, size, payload, bus, zctx, opts.quick)
                    else:
                        res = _row_remote(impl, transport, size, payload, ipc_dir, bus, zctx,
                                          opts.quick)
                    results.setdefault((size, transport, impl), []).append(res)
                del touched
        finally:
            zctx.destroy(linger=0)
    records = []
    print("\n## Large payloads: GB/s at the subscriber (median, min-max of "
          f"{repeats} interleaved rounds), subscriber peak RSS over payload")
    print(f"{'size':>7} {'transport':<9} {'implementation':<18} {'GB/s':>8} {'min-max':>15} "
          f"{'ms/msg':>7} {'x pyzmq raw':>11} {'x msgpack':>9} {'RSS/payload':>11}")
    for size in sizes:
        for transport in transports + ["-"]:
            floor = results.get((size, transport, "pyzmq copy=False"))
            mp = results.get((size, transport, "pyzmq+msgpack"))
            fs = summarize(r["rate"] for r in floor) if floor else None
            ms = summarize(r["rate"] for r in mp) if mp else None
            for impl in impls + ["memcpy touched", "memcpy fresh"]:
                rs = results.get((size, transport, impl))
                if not rs:
                    continue
                s = summarize(r["rate"] for r in rs)
                rss = summarize(r["rss_over_payload"] for r in rs)
                rec = {"size": size, "transport": transport, "impl": impl,
                       "gbps": s.median / 1e9, "gbps_min": s.min / 1e9, "gbps_max": s.max / 1e9,
                       "x_pyzmq_raw": s.ratio_to(fs) if fs else float("nan"),
                       "x_msgpack": s.ratio_to(ms) if ms else float("nan"),
                       "rss_over_payload": rss.median}
                records.append(rec)
                print(f"{size / MB:>5.0f}MB {transport:<9} {impl:<18} {rec['gbps']:>8.2f} "
                      f"{rec['gbps_min']:>7.2f}-{rec['gbps_max']:<7.2f} {size / s.median * 1e3:>7.2f} "
                      f"{rec['x_pyzmq_raw']:>11.2f} {rec['x_msgpack']:>9.2f} "
                      f"{rec['rss_over_payload']:>11.2f}")
    return records


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["sub", "pub"], required=True)
    known, rest = ap.parse_known_args()
    if known.role == "pub":
        from bench.compression import pub_main
        sys.exit(pub_main(rest))
    sys.exit(sub_main(rest))
