"""Interpreter exit with subscriptions still open: status 0, no hang, no crash.

Each case runs a real script in a fresh interpreter (subprocess, 30 s timeout).
"""
import subprocess
import sys
import textwrap

import pytest

from helpers import MODE_PRELUDE, free_tcp_port, script_env

pytestmark = pytest.mark.threads

EXIT_TIMEOUT = 30

PRELUDE = MODE_PRELUDE + textwrap.dedent("""
    import os, threading

    transport, ipc_dir = sys.argv[2], sys.argv[3]
    if transport == "inproc":
        EP, EP2 = "inproc://exit-test", "inproc://idle"
    elif transport == "ipc":
        EP, EP2 = "ipc://" + ipc_dir + "/exit.sock", "ipc://" + ipc_dir + "/idle.sock"
    else:
        EP, EP2 = ("tcp://127.0.0.1:" + port for port in os.environ["TEST_TCP_PORTS"].split())
""")

# Subscribe, make sure delivery works, then simply end: no close anywhere.
SIMPLE = PRELUDE + textwrap.dedent("""
    got = threading.Event()
    bus = upcall.Bus()
    pub = bus.publisher(EP, kind="push", bind=True)
    sub = bus.subscribe(EP, lambda msg: got.set(), kind="pull", **KW)
    pub.send(b"t", {"hello": 1})
    if mode == "caller":
        while not got.is_set():
            sub.poll(timeout=1.0, max_messages=1)
    if not got.wait(20):
        sys.exit("no message delivered")
    # a second, idle subscription that never receives anything
    sub2 = bus.subscribe(EP2, print, kind="sub", topics=[b"never"], **KW)
    print("ending without close", flush=True)
""")

# Exit while messages are still being delivered at full rate: a publisher
# thread floods, the target does a little work.
FLOOD = PRELUDE + textwrap.dedent("""
    kind = sys.argv[4]
    count = [0]
    enough = threading.Event()

    def target(msg):
        s = 0
        for i in range(100):
            s += i
        count[0] += 1
        if count[0] >= 3000:
            enough.set()

    bus = upcall.Bus()
    pub = bus.publisher(EP, kind="pub" if kind == "sub" else "push", bind=True)
    sub = bus.subscribe(EP, target, kind=kind, **KW)

    def flood():
        i = 0
        try:
            while True:
                pub.send(b"flood", {"i": i, "pad": "x" * 40})
                i += 1
        except Exception:
            pass  # the publisher was closed at exit

    threading.Thread(target=flood, daemon=True).start()
    if mode == "caller":
        while not enough.is_set():
            sub.poll(timeout=0.05)
    if not enough.wait(20):
        sys.exit("only %d messages delivered" % count[0])
    print("exiting while delivering", count[0], flush=True)
""")


def run_script(script, *args, ipc_dir):
    env = script_env(TEST_TCP_PORTS="%d %d" % (free_tcp_port(), free_tcp_port()))
    env.pop("PYTHONWARNINGS", None)
    try:
        proc = subprocess.run([sys.executable, "-c", script, *args, ],
                              cwd=ipc_dir, env=env, capture_output=True, text=True,
                              timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail("script hung (no exit within %d s); stdout=%r stderr=%r"
                    % (EXIT_TIMEOUT, e.stdout, e.stderr))
    report = "exit status %d\nstdout:\n%s\nstderr:\n%s" % (proc.returncode, proc.stdout, proc.stderr)
    assert proc.returncode == 0, report
    assert "Fatal Python error" not in proc.stderr, report
    assert "Traceback" not in proc.stderr, report
    assert "Segmentation" not in proc.stderr, report
    assert "upcall: at exit" not in proc.stderr, report  # a loop that did not stop
    return proc


@pytest.mark.parametrize("transport", ["inproc", "tcp"])
@pytest.mark.parametrize("mode", ["native", "python", "caller", "executor"])
def test_script_that_never_closes_exits_cleanly(ipc_dir, mode, transport):
    proc = run_script(SIMPLE, mode, transport, ipc_dir, ipc_dir=ipc_dir)
    assert "ending without close" in proc.stdout


@pytest.mark.parametrize("kind,transport", [("pull", "inproc"), ("sub", "tcp"), ("pull", "ipc")])
@pytest.mark.parametrize("mode", ["native", "python"])
def test_exit_while_delivering_at_full_rate(ipc_dir, mode, kind, transport):
    proc = run_script(FLOOD, mode, transport, ipc_dir, kind, ipc_dir=ipc_dir)
    assert "exiting while delivering" in proc.stdout


def test_exit_while_delivering_caller_mode(ipc_dir):
    proc = run_script(FLOOD, "caller", "inproc", ipc_dir, "pull", ipc_dir=ipc_dir)
    assert "exiting while delivering" in proc.stdout
