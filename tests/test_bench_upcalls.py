"""The upcalls and contention benchmark sections run in quick mode and produce
their records (no timing assertions)."""
import argparse
import json
import math
import subprocess
import sys

import pytest

import upcall

from bench_package import bench_module

upcalls = bench_module("upcalls")
contention = bench_module("contention")

FIELDS = {"target", "thread", "gil", "batch", "payload", "n", "rate", "seconds"}


def _opts(*argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    upcalls.add_arguments(parser)
    contention.add_arguments(parser)
    return parser.parse_args(["--quick", *argv])


def test_upcalls_quick():
    records = upcalls.run(_opts("--upcalls-n", "5000"))
    assert len(records) == len(upcalls.variants(5000, upcall.DEFAULT_BATCH))
    for r in records:
        assert FIELDS <= set(r), r
        assert r["rate"] > 0 and not math.isnan(r["rate"])
    cases = {r["case"] for r in records}
    assert cases == {"classic", "gil", "batch", "native", "payload", "ceiling"}
    classic = {(r["target"], r["thread"]) for r in records if r["case"] == "classic"}
    assert classic == {(t, th) for t in upcalls.TARGETS for th in upcalls.THREADS}


def test_contention_quick():
    records = contention.run(_opts("--contention-seconds", "0.2", "--contention-rate", "20000",
                                   "--contention-batches", "64,1024"))
    for r in records:
        assert FIELDS <= set(r), r
        for k in ("offered_rate", "backlog", "lost", "busy_ratio", "p50_ms", "p99_ms",
                  "switch_interval_ms"):
            assert k in r
    assert {r["case"] for r in records} >= {"synthetic", "tcp"}


# Past its subprocess's own limit (600 s).
@pytest.mark.timeout(600 + 60)
def test_dispatcher_json_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "u.json", tmp_path / "u.png"
    subprocess.run([sys.executable, "bench_upcalls.py", "--upcalls", "--quick", "--upcalls-n",
                    "3000", "--json", str(out), "--plot", str(png)],
                   check=True, capture_output=True, timeout=600,
                   cwd=__import__("os").path.dirname(__import__("os").path.dirname(__file__)))
    records = json.loads(out.read_text())
    assert records and all(r["section"] == "upcalls" and FIELDS <= set(r) for r in records)
    assert png.stat().st_size > 0
