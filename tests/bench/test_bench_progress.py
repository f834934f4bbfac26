"""The benchmark's progress display (bench/progress.py): a bar rewritten in
place on a terminal, a plain line per tenth of the runs otherwise, always on
the stream given (stderr by default), never on stdout's tables."""
import io
import re
import time

import pytest

from bench_package import bench_module

progress = bench_module("progress")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    assert list(progress.track(range(25), "codec", 25, stream=out)) == list(range(25))
    lines = out.getvalue().splitlines()
    assert len(lines) == 10                       # one per tenth, not one per run
    assert lines[0].startswith("codec: 3/25 runs done")
    assert lines[-1] == "codec: 25/25 runs done"
    assert "\r" not in out.getvalue()


def test_a_bar_rewritten_in_place_on_a_terminal():
    out = Terminal()
    with progress.Progress("bus tcp", 4, stream=out) as p:
        for mode in "abcd":
            p.step(f"flood {mode}")
    text = out.getvalue()
    assert "\n" not in text
    assert text.count("\r") == 5                  # four updates, one clear at the end
    assert "bus tcp  [##########..........]  2/4  flood b" in text
    assert "4/4  flood d" in text and text.endswith("\r\x1b[2K")


def test_nothing_total():
    out = io.StringIO()
    with progress.Progress("empty", 0, stream=out):
        pass
    assert out.getvalue() == ""


measure = bench_module("measure")
report = bench_module("report")


def test_plain_lines_estimate_the_time_left():
    # Each run takes at least 0.2 s, so after k of 10 runs at least
    # 0.2 * (10 - k) s are left: an estimate of 1 s or more up to k = 5.
    out = io.StringIO()
    for _ in progress.track(range(10), "upcalls", 10, stream=out):
        time.sleep(0.2)
    lines = out.getvalue().splitlines()
    assert len(lines) == 10
    for k, line in enumerate(lines[:5], 1):
        assert line.startswith(f"upcalls: {k}/10 runs done, about ") and line.endswith(" left"), line
    assert lines[-1] == "upcalls: 10/10 runs done"    # nothing left to estimate


def test_a_plain_stream_hears_what_a_long_wait_waits_for(monkeypatch):
    # A wait shown at once (instead of after a few seconds), on a machine
    # that can never be idle enough (at most -1 busy): it waits its whole timeout.
    monkeypatch.setattr(progress, "WAIT_SHOWN_AFTER", 0.0)
    out = io.StringIO()
    with progress.Progress("bus tcp", 3, stream=out) as p:
        p.step("flood native")
        idle, busy = measure.wait_for_idle(max_busy=-1.0, timeout=0.5)
    assert not idle
    lines = out.getvalue().splitlines()
    waiting = [line for line in lines if "waiting" in line]
    assert len(waiting) == 1, lines                  # once per wait, not once per sample
    assert waiting[0].startswith("bus tcp: waiting for the machine to go idle: ")
    assert waiting[0].endswith("% busy, up to 0.5 s")
    assert lines[-1].startswith("bus tcp: waited ") and lines[-1].endswith(" s for an idle machine")
    assert measure.WAIT_LISTENERS == []              # closed: no longer listening


def test_the_bar_says_what_it_waits_for():
    out = Terminal()
    with progress.Progress("upcalls", 2, stream=out) as p:
        p.step("python / native")
        measure.wait_for_idle(max_busy=-1.0, timeout=0.3)
        p.step("Handler / native")
    text = out.getvalue()
    assert "upcalls  [##########..........]  1/2  waiting for the machine to go idle: " in text
    assert re.search(r"waiting for the machine to go idle: \d+% busy, \d+\.\d/0\.3 s", text), text
    # once the wait is over the bar says what runs again
    after = text[text.index("waiting for the machine"):]
    assert "\r\x1b[2Kupcalls  [##########..........]  1/2  python / native" in after


def test_an_idle_budget_bounds_every_wait():
    measure.set_idle_budget(0.0)
    try:
        waited = measure.idle_waited
        idle, _ = measure.wait_for_idle(max_busy=-1.0, timeout=600.0)   # one sample, no more
        assert not idle and measure.idle_waited - waited < 60
    finally:
        measure.set_idle_budget(None)


def test_target_lines_say_met_or_missed():
    met = report.target_line("coalesced / synthetic: rate", 0.93, ">=", 0.8)
    missed = report.target_line("coalesced / synthetic: rate", 0.73, ">=", 0.8)
    none = report.target_line("native / c-pingpong: p50", float("nan"), "<=", 1.1)
    assert met == "   [met]    coalesced / synthetic: rate 0.93x (target >= 0.80x)"
    assert missed == "   [MISSED] coalesced / synthetic: rate 0.73x (target >= 0.80x)"
    assert none.startswith("   [no figure] native / c-pingpong: p50 -")
    assert report.target_met(1.2, "<=", 1.1) is False and report.target_met(1.0, "<=", 1.1)
    # A figure that rounds onto its target shows the digits that decide it.
    assert report.target_line("native / c-pingpong: p50", 1.1004, "<=", 1.1) == (
        "   [MISSED] native / c-pingpong: p50 1.1004x (target <= 1.10x)")


def test_a_narrow_table_fits_120_columns(monkeypatch):
    monkeypatch.setattr(report, "WIDE", False)
    summary = measure.summarize([1.0e6, 1.1e6, 1.2e6])
    rows = [{"mode": "zmq.asyncio-await", "s": summary}] * 3
    cols = [report.Column("mode")] + [
        report.Column(f"s{i}", report.range_header(f"{i}msgs/s"), get=lambda r: r["s"],
                      fmt=lambda s: report.fmt_range(s, report.fmt_rate), align=">")
        for i in range(8)]
    text = report.render(rows, cols, title="a title " * 40, note="   a note " * 30)
    assert max(len(line) for line in text.splitlines()) <= report.WIDTH
    assert "1.10M ±9%" in text and "(1.00M-1.20M)" not in text
    monkeypatch.setattr(report, "WIDE", True)
    assert "1.10M (1.00M-1.20M)" in report.render(rows, cols)
    # A column a narrow table can lose shows only with --wide.
    extra = cols + [report.Column("lost", "lost", wide_only=True)]
    assert report.render(rows, extra).splitlines()[0].endswith("lost")
    monkeypatch.setattr(report, "WIDE", False)
    assert "lost" not in report.render(rows, extra)


def test_a_wait_outside_any_progress_line_is_announced_on_stderr(monkeypatch, capsys):
    # contention and large have no progress line: the wait still says what it waits for.
    monkeypatch.setattr(measure, "PLAIN_WAIT_SHOWN_AFTER", 0.0)
    assert measure.WAIT_LISTENERS == []
    idle, _ = measure.wait_for_idle(max_busy=-1.0, timeout=0.5)
    captured = capsys.readouterr()
    assert not idle and captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, lines                      # once, not per sample
    assert lines[0].startswith("waiting for the machine to go idle: ")
    assert lines[0].endswith("% busy, up to 0.5 s")


def test_no_redo_once_the_idle_budget_is_spent():
    # A run that always looks disturbed (a busy loop in another process
    # would do; here the monitor's limit is below zero) is redone while there
    # is budget for waiting, and kept at once when there is none.
    # (0.2 s per run: the tolerance, 4 jiffies, is below 1.0 x 0.2 s.)
    calls = []

    def run():
        calls.append(1)
        time.sleep(0.2)
        return len(calls)

    result, info = measure.run_stable(run, retries=1, max_busy=1.0, max_foreign=-1.0)
    assert result == 2 and info.attempts == 2 and info.disturbed     # budget: redone
    calls.clear()
    measure.set_idle_budget(0.0)
    try:
        assert measure.idle_budget_spent()
        result, info = measure.run_stable(run, retries=3, max_busy=1.0, max_foreign=-1.0)
    finally:
        measure.set_idle_budget(None)
    assert result == 1 and info.attempts == 1 and info.disturbed
    assert not measure.idle_budget_spent()


def test_plain_lines_count_the_time_spent_waiting():
    out = io.StringIO()
    with progress.Progress("bus tcp", 2, stream=out) as p:
        p.step("flood native")
        measure.wait_for_idle(max_busy=-1.0, timeout=1.2)     # never idle: waits it all
        p.step("flood caller")
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("bus tcp: 2/2 runs done; ") and last.endswith(
        " s so far spent waiting for an idle machine"), last


def test_quick_target_lines_give_no_verdict(monkeypatch):
    # --quick's counts are too small for its figures to mean much: the line
    # shows the figure and its target, and says met or missed only otherwise.
    monkeypatch.setattr(report, "JUDGE", False)
    line = report.target_line("coalesced / synthetic: rate", 0.73, ">=", 0.8)
    assert line == ("   [quick]  coalesced / synthetic: rate 0.73x (target >= 0.80x; "
                    "not judged: --quick)")
    assert report.MET not in line and report.MISSED not in line


def test_a_table_never_repeats_a_header():
    # Two columns called "x pyzmq" in one row cannot be told apart without the docs.
    cols = [report.Column("rate", "x pyzmq"), report.Column("cpu", "x pyzmq")]
    with pytest.raises(ValueError, match="x pyzmq"):
        report.render([{"rate": 1.0, "cpu": 2.0}], cols)
