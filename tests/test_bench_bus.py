"""The bus benchmark section runs in quick mode and reports what it documents.

No timing assertions: only that every row is produced, with its fields, and
that nothing was lost.
"""
import argparse
import math

import pytest

from bench_package import bench_module

bus = bench_module("bus")
measure = bench_module("measure")
report = bench_module("report")

FIELDS = {"transport", "mode", "n", "rate", "cpu_us_per_msg", "lost", "p50_us", "p99_us",
          "seconds", "rate_ratio", "cpu_ratio", "p50_ratio"}


def _opts(**kw):
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    bus.add_arguments(parser)
    opts = parser.parse_args(["--quick"])
    for k, v in kw.items():
        setattr(opts, k, v)
    return opts


def _modes():
    modes, _ = bus.available_modes(bus.MODES)
    return modes


def test_quick_run_produces_records(capsys):
    modes = _modes()
    if not any(m in bus.UPCALL_MODES for m in modes):
        pytest.skip("upcall._bus is not built")
    records = bus.run(_opts())
    out = capsys.readouterr().out
    # The C floor needs a peer process: not over inproc.
    want = {(t, m) for t in bus.TRANSPORTS for m in modes
            if not (m == bus.FLOOR and t == "inproc")}
    assert len(records) == len(want)
    seen = {(r["transport"], r["mode"]) for r in records}
    assert seen == want
    for r in records:
        assert FIELDS <= r.keys(), FIELDS - r.keys()
        assert r["n"] == bus.QUICK_N
        assert r["lost"] == 0, r
        assert r["rate"] > 0 and r["cpu_us_per_msg"] > 0 and r["seconds"] > 0
        if r["mode"] in bus.NO_RTT_MODES:     # no round trips for the asyncio rows, the floor
            assert math.isnan(r["p50_us"])
        else:
            assert r["p50_us"] > 0 and r["p99_us"] >= r["p50_us"]
        if bus.REFERENCE in modes:
            assert not math.isnan(r["rate_ratio"])
    for t in bus.TRANSPORTS:
        assert f"bus over {t}" in out
    for a, b in bus.PAIRS:
        if a in modes and b in modes:
            assert f"{a} / {b}: rate " in out


def test_helpers():
    assert measure.percentile([1, 2, 3, 4, 5], 50) == 3
    assert measure.percentile([10], 99) == 10
    assert math.isnan(measure.percentile([], 50))
    assert measure.percentile(list(range(101)), 99) == 99
    s = measure.summarize([3.0, 1.0, 2.0, float("nan")])
    assert (s.median, s.min, s.max, s.n) == (2.0, 1.0, 3.0, 3)
    assert list(measure.interleave("AB", 2)) == [(0, "A"), (0, "B"), (1, "B"), (1, "A")]
    busy = measure.busy_fraction(0.05)
    assert 0.0 <= busy <= 1.0
    text = report.render([{"mode": "a", "rate": 1.5e6}, {"mode": "bb", "rate": None}],
                         [report.Column("mode"), report.Column("rate", fmt=report.fmt_rate)])
    lines = text.splitlines()
    assert lines[2].split() == ["a", "1.50M"] and lines[3].split() == ["bb", "-"]
    assert report.fmt_ratio(report.ratio(3, 1)) == "3.00x"


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    plot = bench_module("plot").plot
    recs = [{"section": "bus", "transport": t, "mode": m, "rate": 1e5 * (i + 1),
             "rate_min": 9e4, "rate_max": 2e6, "cpu_us_per_msg": 1.0, "p50_us": 20.0,
             "p99_us": 40.0}
            for t in ("ipc", "tcp") for i, m in enumerate(("native", "pyzmq+msgspec"))]
    out = tmp_path / "bus.png"
    plot(recs, str(out))
    assert out.stat().st_size > 1000
