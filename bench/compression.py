"""Compression rows of the --large section: where each codec (lz4, zstd) has
something to win.

For each payload size, link and kind of data, in one interleaved run:

* ``upcall raw``: out of band, opted in to explicitly: a publisher with
  ``oob_threshold=upcall.DEFAULT_OOB_THRESHOLD`` and ``send(...,
  copy=False)``, the payload a frame of its own (ext 126), zero-copy;
* ``upcall lz4``, ``upcall zstd``: the same with ``compression="lz4"`` or
  ``compression="zstd"`` (a frame that does not shrink enough goes raw,
  zero-copy; the subscriber decompresses into one allocation).

Links: ``loopback`` (tcp 127.0.0.1, where bandwidth is memory bandwidth and
compression can only cost) and ``1gbit``: tcp between two network
namespaces joined by a veth pair shaped to 1 Gbit/s each way
(:mod:`bench.netns`; needs root and iproute2, skipped with the reason
otherwise), where a byte not sent is time saved.

Data (made in the publisher process, the same bytes every time):

* ``compressible``: a sparse float64 array, 90% zeros and 10% values drawn
  from a normal distribution (a sensor or feature array where most entries
  are empty): lz4 takes it to about 0.14 of its size, zstd (level 1) further;
* ``random``: ``os.urandom``: incompressible, so the publisher must send it
  raw after sampling it, at no more than a sample's cost.

Publisher and subscriber are processes of their own on both links (``python
-m bench.large --role pub`` / ``--role sub``, under ``ip netns exec`` for the
shaped link); this process relays: it tells the publisher to send one
message, waits for the subscriber's acknowledgement that the target got it,
and so on, one message in flight.  GB/s = payload bytes delivered over the
time from the first timed send to the last acknowledgement (compression and
decompression included), after a warm-up message; ``x raw`` is the ratio to
``upcall raw`` of the same size, link and data.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.measure import QUICK_IDLE_TIMEOUT, interleave, summarize, wait_for_idle
from bench import netns, report

#: The codecs with rows of their own: every codec of the C core's table
#: (csrc/codec.h), in this build or not (those it lacks are rows marked n/a).
from upcall._bus import _CODECS  # noqa: E402
CODECS = list(_CODECS)
IMPLS = ["upcall raw"] + [f"upcall {c}" for c in CODECS]
LINKS = ["loopback", "1gbit"]
DATA = ["compressible", "random"]
MB = 1_000_000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_data(kind: str, size: int) -> bytes:
    """size bytes of the named kind (see the module's docstring)."""
    if kind == "random":
        return os.urandom(size)
    if kind != "compressible":
        raise ValueError(f"data must be one of {DATA}, not {kind!r}")
    import numpy as np
    rng = np.random.default_rng(12)
    a = np.zeros(-(-size // 8))
    hit = rng.random(a.size) < 0.1
    a[hit] = rng.normal(size=int(hit.sum()))
    return a.tobytes()[:size]


def unavailable(codec: str) -> str | None:
    """Why this build cannot publish with compression=codec, or None."""
    import upcall
    with upcall.Bus() as bus:
        try:
            bus.publisher(f"inproc://upcall-bench-{codec}-{os.getpid()}", kind="push",
                          bind=True, compression=codec).close()
        except (ValueError, RuntimeError) as exc:
            return f"n/a: {exc}"
    return None


# ---- the publisher process ---------------------------------------------------

def pub_main(argv) -> int:
    """Connect, say "ready", then send one message per "go" line until "quit"."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=IMPLS, required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--data", choices=DATA, required=True)
    o = ap.parse_args(argv)
    import upcall
    payload = make_data(o.data, o.size)
    # Both rows out of band and zero-copy, asked for by name (payload is
    # bytes, never changed): only compression differs.
    kw = {"compression": o.impl.split()[1]} if o.impl != "upcall raw" else {}
    with upcall.Bus() as bus:
        pub = bus.publisher(o.endpoint, kind="push", bind=False,
                            oob_threshold=upcall.DEFAULT_OOB_THRESHOLD, **kw)
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "go":
                break
            pub.send(b"large", {"blob": payload}, copy=False)
        pub.close()
    return 0


# ---- one row ------------------------------------------------------------------

def _row(impl: str, link: str, size: int, data: str, count: int,
         shaped: netns.RateLimitedLink | None) -> dict:
    """count timed messages (after one warm-up) from a publisher process to a
    subscriber process over the link; GB/s and the subscriber's peak RSS."""
    if link == "loopback":
        pre_pub = pre_sub = []
        ep = "tcp://127.0.0.1:*"
    else:
        pre_pub, pre_sub = shaped.exec_in(shaped.a), shaped.exec_in(shaped.b)
        ep = f"tcp://{shaped.addr_b}:*"
    py = [sys.executable, "-m", "bench.large", "--role"]
    sub = subprocess.Popen(pre_sub + py + ["sub", "--impl", "upcall", "--endpoint", ep,
                                           "--count", str(count + 1)],
                           stdout=subprocess.PIPE, text=True, cwd=ROOT)
    pub = None
    try:
        line = sub.stdout.readline().split()
        if not line or line[0] != "ready":
            raise RuntimeError(f"subscriber over {link} did not start: {line}")
        pub = subprocess.Popen(pre_pub + py + ["pub", "--impl", impl, "--endpoint", line[1],
                                               "--size", str(size), "--data", data],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        if pub.stdout.readline().strip() != "ready":
            raise RuntimeError(f"publisher {impl} over {link} did not start")

        def one():
            pub.stdin.write("go\n")
            pub.stdin.flush()
            if sub.stdout.readline().strip() != "ack":
                raise RuntimeError(f"subscriber over {link} ended early")
        one()                                   # warm-up: connected, threads started
        t0 = time.perf_counter()
        for _ in range(count):
            one()
        elapsed = time.perf_counter() - t0
        pub.stdin.write("quit\n")
        pub.stdin.close()
        pub.wait(60)
        res = json.loads(sub.stdout.readline())
        sub.wait(60)
    finally:
        for p in (pub, sub):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    return {"rate": count * size / elapsed, "lost": count + 1 - res["received"],
            "rss_over_payload": (res["rss_peak"] - res["rss_base"]) / size}


# ---- the table ------------------------------------------------------------------

def run(sizes: list[int], count_for, repeats: int, quick: bool) -> list[dict]:
    """The compression rows for these payload sizes (count_for(size): timed
    messages per row)."""
    print("\n## Compression: upcall raw vs compression=" + " and ".join(
          f'"{c}"' for c in CODECS) + ", publisher and subscriber in processes of their own, "
          "one message in flight")
    whys = {f"upcall {c}": unavailable(c) for c in CODECS}
    for impl, why in whys.items():
        if why:
            print(f"   every {impl.split()[1]} row: {why}")
    links = list(LINKS)
    no_link = netns.unavailable()
    if no_link:
        print(f"   skipped the 1gbit link: {no_link}")
        links.remove("1gbit")
    impls = [i for i in IMPLS if not whys.get(i)]
    variants = [(s, lk, d, i) for s in sizes for lk in links for d in DATA for i in impls]
    results: dict[tuple, list] = {}
    shaped = netns.RateLimitedLink("1gbit") if "1gbit" in links else None
    if shaped is not None:
        shaped.__enter__()
    try:
        for _, (size, link, data, impl) in interleave(variants, repeats):
            wait_for_idle(timeout=QUICK_IDLE_TIMEOUT if quick else 10)
            results.setdefault((size, link, data, impl), []).append(
                _row(impl, link, size, data, count_for(size), shaped))
    finally:
        if shaped is not None:
            shaped.__exit__(None, None, None)
    print(f"{'size':>7} {'link':<8} {'data':<12} {'implementation':<14} {'GB/s':>8} "
          f"{'min-max':>15} {'ms/msg':>8} {'x raw':>6} {'lost':>4} {'RSS/payload':>11}")
    records = []
    for size in sizes:
        for link in links:
            for data in DATA:
                raw = results.get((size, link, data, "upcall raw"))
                rs_raw = summarize(r["rate"] for r in raw) if raw else None
                for impl in IMPLS:
                    rs = results.get((size, link, data, impl))
                    if not rs:
                        why = whys.get(impl)
                        print(f"{size / MB:>5.0f}MB {link:<8} {data:<12} {impl:<14} {why}")
                        records.append({"part": "compression", "size": size, "link": link,
                                        "data": data, "impl": impl, "na": why})
                        continue
                    s = summarize(r["rate"] for r in rs)
                    rec = {"part": "compression", "size": size, "link": link, "data": data,
                           "impl": impl, "gbps": s.median / 1e9, "gbps_min": s.min / 1e9,
                           "gbps_max": s.max / 1e9,
                           "x_raw": s.ratio_to(rs_raw) if rs_raw else float("nan"),
                           "lost": sum(r["lost"] for r in rs),
                           "rss_over_payload": summarize(r["rss_over_payload"] for r in rs).median}
                    records.append(rec)
                    print(f"{size / MB:>5.0f}MB {link:<8} {data:<12} {impl:<14} {rec['gbps']:>8.3f} "
                          f"{rec['gbps_min']:>7.3f}-{rec['gbps_max']:<7.3f} "
                          f"{size / s.median * 1e3:>8.2f} {rec['x_raw']:>6.2f} {rec['lost']:>4} "
                          f"{rec['rss_over_payload']:>11.2f}")
    for r in records:
        if r["impl"] != "upcall raw" and r["link"] == "1gbit" and "x_raw" in r:
            want = 2.0 if r["data"] == "compressible" else 0.95
            codec = r["impl"].split()[1]
            print(report.target_line(
                f"{r['size'] / MB:.0f}MB over 1gbit, {r['data']}: {codec} / raw",
                r["x_raw"], ">=", want))
    return records
