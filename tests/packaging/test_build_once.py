"""`make build` after `import upcall` builds nothing: the Makefile runs the
ninja that meson-python's editable loader runs.  Two ninja versions (.venv's
and the system's) log their commands differently, and each took the other's
build for stale: a fresh clone's `make test` built everything three times."""
import os
import subprocess
import sys

import pytest

import upcall._bus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build", "py")


def test_make_build_after_an_import_builds_nothing():
    if not upcall._bus.__file__.startswith(BUILD + os.sep):
        pytest.skip("upcall is not this tree's editable install")
    # Nothing from an enclosing make; -o: the environment and the system
    # packages count as made (only the build step is under test).
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKELEVEL")}
    p = subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", "-o", ".deps.stamp",
                        f"PY={sys.executable}", "build"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "no work to do" in p.stdout, p.stdout
