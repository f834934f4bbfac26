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

ROOT = pathlib.Path(__file__).resolve().parent.parent
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
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and _runs_python_c(node)
                    and not any(k.arg == "cwd" for k in node.keywords)):
                bad.append(f"{path.name}:{node.lineno}")
    assert not bad, "python -c without cwd=: " + ", ".join(bad)
