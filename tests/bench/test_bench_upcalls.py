"""The upcalls and contention benchmark sections run in quick mode and produce
their records (no timing assertions)."""
import argparse
import json
import math
import os
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
    run = subprocess.run([sys.executable, "bench_upcalls.py", "--upcalls", "--codec", "--quick",
                          "--upcalls-n", "3000", "--json", str(out), "--plot", str(png)],
                         check=True, capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    records = json.loads(out.read_text())
    ups = [r for r in records if r["section"] == "upcalls"]
    assert ups and all(FIELDS <= set(r) for r in ups)
    assert {r["section"] for r in records} == {"codec", "upcalls"}
    # One figure per section, named after it, and nothing else.
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["u-codec.png", "u-upcalls.png"]
    for name in ("u-codec.png", "u-upcalls.png"):
        assert (tmp_path / name).stat().st_size > 1000
        assert f"wrote {tmp_path / name}" in run.stdout
    # Narrow tables: every line of the report fits 120 columns.
    too_wide = [line for line in run.stdout.splitlines() if len(line) > 120]
    assert not too_wide, too_wide
    # The jargon of the tables is explained under them.
    terms = run.stdout[run.stdout.index("Terms:"):]
    for word in ("adopt ", "per-upcall Ensure ", "ceiling "):
        assert "\n  " + word in terms, word
    # The progress went to stderr, with the section's name, never to stdout.
    assert "upcalls: " in run.stderr and "runs done" in run.stderr
    assert "runs done" not in run.stdout
    assert "profile=quick" in run.stdout and " in all; waited " in run.stdout


def test_wide_tables_show_whole_ranges(capsys):
    report = bench_module("report")
    try:
        report.WIDE = True
        records = upcalls.run(_opts("--upcalls-n", "5000", "--upcalls-repeats", "2"))
    finally:
        report.WIDE = False
    out = capsys.readouterr().out
    assert len(records) == len(upcalls.variants(5000, upcall.DEFAULT_BATCH))
    assert "upcalls/s (min-max)" in out and "upcalls/s ±" not in out
    row = next(line for line in out.splitlines() if line.startswith("python / native "))
    assert "M-" in row or "k-" in row, row          # a median with its (min-max)


def test_plot_names_every_row():
    """One figure per section; the names a reader sees are the rows' names:
    the codecs in the codec figure's legend, every variant on the upcalls
    figure's axis (one bar per row), the groups in its legend."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    plot = bench_module("plot")
    codec = bench_module("codec")
    opts = _opts("--upcalls-n", "5000")
    opts.codec_repeats, opts.codec_doc_mb = 1, 0.05
    records = ([{"section": "codec", **r} for r in codec.run(opts)]
               + [{"section": "upcalls", **r} for r in upcalls.run(opts)])
    figs = dict(plot.figures(records))
    assert list(figs) == ["codec", "upcalls"]
    (legend,) = figs["codec"].legends
    names = [t.get_text() for t in legend.get_texts()]
    assert names == [r["codec"] for r in records if r["section"] == "codec"][:len(names)]
    assert names[0] == "upcall" and len(names) == len({r["codec"] for r in records
                                                       if "codec" in r})
    (ax,) = figs["upcalls"].axes
    shown = {t.get_text() for t in ax.get_yticklabels()}
    assert shown == {r["variant"] for r in records if r["section"] == "upcalls"}
    (legend,) = figs["upcalls"].legends
    groups = [t.get_text() for t in legend.get_texts()]
    assert "per-upcall Ensure" in groups and "ceiling: C loop, GIL held" in groups
    assert not any(g.isdigit() for g in groups + names)
    for fig in figs.values():
        plt.close(fig)


@pytest.mark.timeout(600 + 60)
def test_plots_are_drawn_by_default(tmp_path):
    # A newcomer's `make bench` gets its figures without asking for them:
    # build/bench/bench-<section>.png under the current directory.
    pytest.importorskip("matplotlib")
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "bench_upcalls.py")
    run = subprocess.run([sys.executable, script, "--codec", "--quick"], check=True,
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    png = tmp_path / "build" / "bench" / "bench-codec.png"
    assert png.stat().st_size > 1000
    assert f"wrote {os.path.join('build', 'bench', 'bench-codec.png')}" in run.stdout
    none = subprocess.run([sys.executable, script, "--codec", "--quick", "--no-plot",
                           "--codec-repeats", "1"], check=True, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path / "build")
    assert "wrote " not in none.stdout and not (tmp_path / "build" / "build").exists()


def test_full_and_quick_exclude_each_other():
    run = subprocess.run([sys.executable, "bench_upcalls.py", "--quick", "--full"],
                         capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert run.returncode == 2 and "--full and --quick exclude each other" in run.stderr


def test_full_profile_keeps_the_counts_of_the_figures_in_perf_md():
    assert (upcalls.FULL_N, upcalls.FULL_REPEATS) == (5_000_000, 3)
    assert upcalls.DEFAULT_N < upcalls.FULL_N and upcalls.DEFAULT_REPEATS < upcalls.FULL_REPEATS
