"""Every examples/*.py runs to completion in a fresh interpreter and prints
what it should; each example must have an entry in EXPECTED."""
import glob
import os
import subprocess
import sys

import pytest

from helpers import DEV_MODE, script_env, unexpected_stderr

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "examples")
TIMEOUT = 60


def _has(module):
    try:
        __import__(module)
    except ImportError:
        return False
    return True


# Lines each example must print (in this order, among others).
EXPECTED = {
    "asyncio_service.py": [
        "service: 3001 trades in ",
        "client: AAPL vwap 103.0073",
        "client: MSFT vwap 102.9957",
        "client: NVDA vwap 102.9913",
    ],
    "custom_encoder.py": [
        "default=: {'id': '00000000-0000-0000-0000-00000000002a', 'side': 'buy', "
        "'px': '187.25', 'qty': 100, 'tags': ['algo', 'dark'], 'day': '2024-05-17'}",
        "packb(default=) -> ",
        "hook refused: cannot publish 'object'",
        "encoder=: {'order_id': '00000000-0000-0000-0000-00000000002a', 'px': 187.25, 'qty': 40}"
        if _has("msgspec") else "encoder=: msgspec is not installed, skipped",
    ],
    "subscriber.py": [
        "tick 0",
        "tick 1",
        "tick 2",
        "the bus was closed",
    ],
    "typed_messages.py": [
        "typed: trades.AAPL Trade(sym='AAPL', px=187.25, qty=100)",
        "typed: trades.MSFT Trade(sym='MSFT', px=411.5, qty=20)",
        "typed: trades.NVDA Trade(sym='NVDA', px=122.0, qty=7)",
        "decode error: topic b'trades.BAD', ValidationError: Expected `float`, got `str`",
        "stats: delivered 3, decode_errors 1, callback_errors 0",
        "raw=True: b'\\x81\\xa1k\\x92\\x01\\x02' == packb: True",
    ] if _has("msgspec") else ["decoder=: msgspec is not installed, skipped"],
}

EXAMPLES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(EXAMPLES_DIR, "*.py")))


def test_every_example_is_checked():
    assert EXAMPLES and set(EXAMPLES) == set(EXPECTED)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name, tmp_path):
    try:
        proc = subprocess.run([sys.executable, *DEV_MODE, os.path.join(EXAMPLES_DIR, name)],
                              cwd=tmp_path, env=script_env(), capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{name} did not finish within {TIMEOUT} s; stdout={e.stdout!r} "
                    f"stderr={e.stderr!r}")
    report = f"{name}: status {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert unexpected_stderr(proc.stderr) == "", report
    lines = proc.stdout.splitlines()
    at = 0
    for want in EXPECTED[name]:
        found = [i for i in range(at, len(lines)) if lines[i].startswith(want)]
        assert found, f"missing line starting with {want!r}\n{report}"
        at = found[0] + 1


SLOW_CALLBACK_PROGRAM = """
import asyncio, sys, time

async def main():
    time.sleep(0.3)      # holds the loop as a busy machine's scheduler can
    sys.stderr.write(sys.argv[1])

asyncio.run(main())
"""


@pytest.mark.parametrize("extra", ["", "a real complaint\n"], ids=["quiet", "complaint"])
def test_asyncio_slow_callback_notes_are_not_a_failure(tmp_path, extra):
    # Under -X dev asyncio logs any callback that held the loop past 0.1 s;
    # a loaded machine makes them, so the stderr check ignores exactly
    # those lines and still sees anything else.
    script = tmp_path / "slow.py"
    script.write_text(SLOW_CALLBACK_PROGRAM)
    proc = subprocess.run([sys.executable, *DEV_MODE, str(script), extra], cwd=tmp_path,
                          env=script_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert "Executing <Task" in proc.stderr and " took " in proc.stderr, proc.stderr
    assert unexpected_stderr(proc.stderr) == extra.rstrip("\n"), proc.stderr
