"""The soak, huge and portable tests run only when -m names them, whatever
else -m says: `pytest -m "not build"` must not start the 10-million-message
soak (an `-m` in addopts would be replaced by the user's own)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = ["tests/bus/test_soak.py", "tests/wire/test_oob.py", "tests/packaging/test_portable_wheels.py"]


def collected(*args):
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        *args, *FILES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 5), p.stdout + p.stderr
    return {line for line in p.stdout.splitlines() if "::" in line}


def test_run_only_when_named():
    named = collected("-m", "soak or huge or portable")
    assert {i.split("::")[0] for i in named} == set(FILES)
    plain = collected()
    assert plain and not plain & named
    assert not collected("-m", "not build") & named
