"""The C core's layering, checked by reading its sources as text.

csrc/ builds and tests without Python, and the synthetic benchmark source is
kept apart from the subscription life cycle and the zmq source: the core
reaches it only through the ops table (csrc/sub_impl.h).  That csrc/*.c
compiles with -Wall -Wextra -Werror is `make -C csrc test`'s job.  And one
rule of the tests themselves, read the same way.
"""
import ast
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
SYNTH_FILES = {"sub_synth.c", "synth.h"}


def core_sources():
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".c", ".h"))


def test_the_c_core_does_not_include_python():
    assert core_sources()
    offenders = [str(p.relative_to(CSRC)) for p in core_sources()
                 if re.search(r'Python\.h|#\s*include\s*[<"]Python', p.read_text())]
    assert offenders == []


def test_the_synthetic_source_stays_in_its_own_files():
    for name in ("sub.c", "sub_zmq.c", "bus.h", "pub.c"):
        assert (CSRC / name).is_file(), name
    offenders = [p.name for p in CSRC.glob("*.[ch]")
                 if p.name not in SYNTH_FILES and "synth" in p.read_text().lower()]
    assert offenders == []


def _runs_python_c(call: ast.Call) -> bool:
    """subprocess.run/Popen([sys.executable, "-c", ...], ...)"""
    if not call.args or not isinstance(call.args[0], ast.List):
        return False
    elts = call.args[0].elts
    return (len(elts) >= 2 and ast.unparse(elts[0]) == "sys.executable"
            and isinstance(elts[1], ast.Constant) and elts[1].value == "-c")


def test_child_interpreters_started_with_dash_c_run_outside_the_source_tree():
    # `python -c` puts the working directory first on sys.path: run from the
    # source tree, the child imports its upcall/ (built for one CPython
    # only) instead of the one under test, and fails on every other CPython
    # (test_coalesce_tx's exit test did, in `make test-threads-all`).
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and _runs_python_c(node)
                    and not any(k.arg == "cwd" for k in node.keywords)):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "python -c without cwd=: " + ", ".join(bad)


# A tracker's number ("issue" and a number after it) means nothing to a
# reader of this tree: no tracker comes with it.  Code, tests and docs name
# the feature instead.
TRACKER_NUMBER = re.compile(r"\bissues?[\s#_-]*[0-9]", re.IGNORECASE)


def tree_files():
    """Every file of the tree: git's list when this is a checkout (what is
    committed or about to be), else every file outside build products."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "build", "dist", "__pycache__"}
        return [p for p in ROOT.rglob("*") if p.is_file()
                and not any(part in skip or part.startswith(".venv") for part in p.relative_to(ROOT).parts)]
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_tracker_numbers_in_the_tree():
    found = []
    for path in tree_files():
        if TRACKER_NUMBER.search(path.name):
            found.append(f"{path.relative_to(ROOT)}: the file's name")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):     # binary (corpora, images) or gone
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if TRACKER_NUMBER.search(line):
                found.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()[:80]}")
    assert not found, "name the feature, not a tracker number:\n" + "\n".join(found)
