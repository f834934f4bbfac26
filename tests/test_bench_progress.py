"""The benchmark's progress display (bench/progress.py): a bar rewritten in
place on a terminal, a plain line per tenth of the runs otherwise, always on
the stream given (stderr by default), never on stdout's tables."""
import io

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
    assert lines[0] == "codec: 3/25 runs done" and lines[-1] == "codec: 25/25 runs done"
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
