"""The suite's time limits (tests/conftest.py, pyproject.toml): a test past
its limit fails alone and the run goes on; a test marked with a larger limit
gets it, from the per-test timer and from the hang watchdog alike; a hang no
signal can end (the GIL held in C) is ended by the watchdog, with every
thread's stack, the test's limit plus the grace after it started.

Each case runs pytest in a subprocess, with this suite's conftest and
configuration, and limits of a second.
"""
import os
import shutil
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # tests/
CONFIG = os.path.join(os.path.dirname(HERE), "pyproject.toml")
# The inner runs' limits: 1 s per test, the watchdog 1 s after that.
LIMITS = ["-o", "timeout=1", "-o", "hang_watchdog_grace=1"]


def run_pytest(tmp_path, source):
    for name in ("conftest.py", "helpers.py"):
        shutil.copy(os.path.join(HERE, name), tmp_path)
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_TIMEOUT")}
    return subprocess.run([sys.executable, "-m", "pytest", "-c", CONFIG, "--rootdir", str(tmp_path),
                           "-p", "no:cacheprovider", "-rA", *LIMITS, "test_inner.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_a_test_past_its_limit_fails_alone_and_a_marked_test_gets_its_own(tmp_path):
    p = run_pytest(tmp_path, """
        import time

        import pytest

        def test_hangs_past_the_limit():
            while True:
                time.sleep(0.01)

        def test_runs_after_the_hang():
            pass

        # Longer than the default limit and the watchdog's deadline for it (1 + 1 s).
        @pytest.mark.timeout(60)
        def test_marked_slow_gets_its_budget():
            time.sleep(3)
    """)
    out = p.stdout + p.stderr
    assert "FAILED test_inner.py::test_hangs_past_the_limit - Failed: Timeout (>1.0s)" in p.stdout, out
    assert "PASSED test_inner.py::test_runs_after_the_hang" in p.stdout, out
    assert "PASSED test_inner.py::test_marked_slow_gets_its_budget" in p.stdout, out
    assert "1 failed, 2 passed" in p.stdout, out
    assert "Timeout (0:" not in p.stderr, out  # faulthandler's watchdog did not fire
    assert p.returncode == 1, out


def test_a_hang_with_the_gil_held_is_ended_by_the_watchdog_with_its_stack(tmp_path):
    p = run_pytest(tmp_path, """
        import ctypes

        def test_deadlocks_holding_the_gil():
            # PyDLL keeps the GIL across the call; a zeroed glibc mutex is a
            # default one, and locking it twice never returns: SIGALRM's
            # Python handler never gets to run.
            libc = ctypes.PyDLL(None)
            mutex = ctypes.create_string_buffer(64)
            libc.pthread_mutex_lock(mutex)
            libc.pthread_mutex_lock(mutex)

        def test_not_reached():
            pass
    """)
    out = p.stdout + p.stderr
    assert "Timeout (0:00:02)!" in p.stderr, out
    assert "in test_deadlocks_holding_the_gil" in p.stderr, out
    assert "test_not_reached" not in p.stdout, out
    assert p.returncode == 1, out
