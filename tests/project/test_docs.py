"""Docs that run: every code block in README.md and docs/*.md is a complete
program that runs here, or is marked as a fragment.

The markers (write them so; this test enforces them):

* **fragment**: the line before its opening fence is ``<!-- fragment: <what
  it lacks or is> -->`` (any block: code that needs context, shell commands,
  diagrams, byte layouts).  Rendered markdown hides the marker; a block may
  tell its readers what it lacks in a comment of its own.  Not run.
* **output**: a block whose opening fence follows ``<!-- output -->`` shows
  what the program just before it prints, all of it: the program's standard
  output must equal the block, line for line.
* any other ``python`` block is a **program**: it runs in a fresh
  interpreter from an empty temporary directory and must exit with status 0
  and print nothing on stderr.  Loopback tcp ports in it
  (``127.0.0.1:5556``, ``localhost:...``, ``0.0.0.0:...``) are replaced by
  free ones, the same number by the same port, so that concurrent test runs
  do not collide.
* any other block (not python, not marked) fails the test.
"""
import glob
import os
import re
import subprocess
import sys

import pytest

from helpers import DEV_MODE, free_tcp_port, script_env, unexpected_stderr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 60

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
MARKER_IN_BLOCK = re.compile(r"^\s*#\s*fragment\b")
FRAGMENT_HTML = re.compile(r"^\s*<!--\s*fragment\b.*-->\s*$")
OUTPUT_HTML = re.compile(r"^\s*<!--\s*output\s*-->\s*$")
LOOPBACK_PORT = re.compile(r"\b(127\.0\.0\.1|localhost|0\.0\.0\.0):(\d{2,5})\b")


class Block:
    def __init__(self, path, line, lang, text, before):
        self.path, self.line, self.lang, self.text = path, line, lang, text
        self.id = f"{os.path.relpath(path, ROOT)}:{line}"
        self.fragment = bool(FRAGMENT_HTML.match(before))
        self.output = bool(OUTPUT_HTML.match(before))
        self.program = self.lang == "python" and not self.fragment and not self.output
        self.expected = None      # the output block after a program


def blocks_of(path):
    """The fenced code blocks of a markdown file, in order."""
    lines = open(path, encoding="utf-8").read().splitlines()
    found = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.groups()
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        body = "\n".join(line[len(indent):] if line.startswith(indent) else line
                         for line in lines[i + 1:j])
        found.append(Block(path, i + 1, lang, body + "\n", before))
        i = j + 1
    return found


def all_blocks():
    paths = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs",
                                                                               "*.md")))
    out = []
    for path in paths:
        blocks = blocks_of(path)
        for prev, block in zip([None] + blocks, blocks):
            if block.output and prev is not None and prev.program:
                prev.expected = block.text.splitlines()
        out.extend(blocks)
    return out


BLOCKS = all_blocks()
PROGRAMS = [b for b in BLOCKS if b.program]


def test_every_block_is_a_program_or_marked():
    unmarked = [f"{b.id} ({b.lang or 'no language'})" for b in BLOCKS
                if not (b.program or b.fragment or b.output)]
    assert not unmarked, ("code blocks that are neither a python program nor marked as a "
                          "fragment (see tests/project/test_docs.py): " + ", ".join(unmarked))
    orphans = [b.id for b in BLOCKS if b.output
               and not any(p.expected is not None and p.expected == b.text.splitlines()
                           for p in PROGRAMS)]
    assert not orphans, f"output blocks that do not follow a program: {orphans}"


def test_markers_are_hidden_from_readers():
    """A test marker inside a block shows in the rendered page: it goes before the fence."""
    visible = [b.id for b in BLOCKS if b.text.strip() and MARKER_IN_BLOCK.match(b.text.splitlines()[0])]
    assert not visible, f"blocks whose first line is a '# fragment' marker: {visible}"


def test_the_quick_start_prints_the_trade():
    readme = [b for b in PROGRAMS if b.path.endswith("README.md")]
    assert readme, "README.md has no complete program"
    quick = readme[0]
    assert quick.expected and quick.expected[0] == "187.25 100", quick.id


def with_free_ports(source):
    ports = {}

    def sub(m):
        if m.group(2) not in ports:
            ports[m.group(2)] = str(free_tcp_port())
        return f"{m.group(1)}:{ports[m.group(2)]}"

    return LOOPBACK_PORT.sub(sub, source)


@pytest.mark.parametrize("block", PROGRAMS, ids=[b.id for b in PROGRAMS])
def test_program_runs(block, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(with_free_ports(block.text), encoding="utf-8")
    try:
        proc = subprocess.run([sys.executable, *DEV_MODE, str(script)], cwd=tmp_path, env=script_env(),
                              capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{block.id} did not finish within {TIMEOUT} s; stdout={e.stdout!r} "
                    f"stderr={e.stderr!r}")
    report = (f"{block.id}: status {proc.returncode}\nstdout:\n{proc.stdout}\n"
              f"stderr:\n{proc.stderr}")
    assert proc.returncode == 0, report
    assert unexpected_stderr(proc.stderr) == "", report
    if block.expected is not None:
        assert proc.stdout.splitlines() == block.expected, (
            f"{block.id} printed other than the output block after it shows\n{report}")


def test_the_marker_rules_themselves(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("\n".join([
        "```python", "print(1)", "```",
        "<!-- output -->", "```", "1", "```",
        "<!-- fragment: needs bus -->", "```python", "bus.close()", "```",
        "<!-- fragment: shell -->", "```sh", "make", "```",
        "```sh", "make", "```",
        "  ```python", "  print(2)", "  ```",
    ]) + "\n")
    blocks = blocks_of(str(md))
    assert [(b.lang, b.program, b.fragment, b.output) for b in blocks] == [
        ("python", True, False, False), ("", False, False, True),
        ("python", False, True, False), ("sh", False, True, False),
        ("sh", False, False, False), ("python", True, False, False)]
    assert blocks[5].text == "print(2)\n"
    assert with_free_ports("a tcp://127.0.0.1:5556 b localhost:5556 c 0.0.0.0:7") \
        .split()[1].split(":")[-1] != "5556"
