"""The type stubs describe the runtime, and a typed user program checks clean.

``mypy --strict`` on tests/typed/user_script.py (a program using the public
API as a user would: str topics, DecodeError.topic, get_include(), the
exception classes) reports nothing, and ``mypy.stubtest`` finds every stub
matching the compiled modules (what it cannot model is listed, with reasons,
in stubtest-allowlist.txt).
"""
import os
import subprocess
import sys

import pytest

from helpers import UPCALL_PATH, TESTS_DIR

pytest.importorskip("mypy", reason="mypy is in the test dependency group: pip install --group test")

# The source tree's allowlist, whichever upcall is imported (editable or installed).
ALLOWLIST = os.path.join(os.path.dirname(TESTS_DIR), "stubtest-allowlist.txt")


def run(args, tmp_path):
    # cwd elsewhere: `-m` puts the cwd first on sys.path, and the source
    # tree's upcall/ may hold extensions built for another CPython.  mypy
    # finds an installed upcall's stubs in site-packages by itself, but not
    # through an editable install's import hook: then MYPYPATH points at the
    # tree.  The cache goes to a temporary folder.
    env = {**os.environ, "MYPY_CACHE_DIR": str(tmp_path / "cache")}
    if os.path.basename(UPCALL_PATH) not in ("site-packages", "dist-packages"):
        env["MYPYPATH"] = UPCALL_PATH
    proc = subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, capture_output=True,
                          text=True, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def test_mypy_strict_on_a_typed_user_script(tmp_path):
    code, out = run(["mypy", "--strict", "--no-error-summary",
                     os.path.join(TESTS_DIR, "typed", "user_script.py")], tmp_path)
    assert code == 0 and out.strip() == "", out


@pytest.mark.skipif(not os.path.exists(ALLOWLIST), reason="needs the source tree's allowlist")
def test_stubtest(tmp_path):
    code, out = run(["mypy.stubtest", "upcall", "--allowlist", ALLOWLIST], tmp_path)
    assert code == 0, out
