"""The command line and connection state (upcall/cli.py over the socket
monitor, upcall/_events.pxi): ``listen --verbose`` says what happens to its
connection as it happens, ``publish --kind push`` says it waits for a peer
instead of hanging silently, and the ENDPOINT help offers only what the
command accepts.

The commands run in subprocesses (cwd outside the source tree); their
stderr is read line by line by a thread, each expected line waited for
with the test's deadline.
"""
import queue
import signal
import subprocess
import sys
import threading
import time

import msgpack
import pytest

from helpers import DEADLINE, free_tcp_port, script_env, unreachable_tcp_endpoint

zmq = pytest.importorskip("zmq")

TIMEOUT = 60


class Command:
    """``python -m upcall ARGS`` with its stderr read line by line."""

    def __init__(self, *args, cwd):
        self.proc = subprocess.Popen([sys.executable, "-m", "upcall", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True,
                                     env=script_env(), cwd=cwd)
        self.lines = queue.Queue()
        self.seen = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, text):
        """The first stderr line (from here on) containing text."""
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"no stderr line with {text!r}; saw {self.seen!r}")
            self.seen.append(line)
            if text in line:
                return line

    def interrupt(self):
        self.proc.send_signal(signal.SIGINT)
        return self.finish()

    def finish(self):
        try:
            self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.reader.join(TIMEOUT)
        while True:
            line = self.lines.get_nowait() if not self.lines.empty() else None
            if line is None:
                break
            self.seen.append(line)
        return self.proc.returncode

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def command(tmp_path):
    made = []

    def start(*args):
        made.append(Command(*args, cwd=tmp_path))
        return made[-1]
    yield start
    for c in made:
        c.close()


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.mark.parametrize("name", ["listen", "publish"])
def test_endpoint_help_offers_only_what_the_command_takes(tmp_path, name):
    proc = subprocess.run([sys.executable, "-m", "upcall", name, "--help"],
                          capture_output=True, text=True, env=script_env(), cwd=tmp_path,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert "tcp://host:port" in proc.stdout and "ipc://path" in proc.stdout
    assert "inproc" not in proc.stdout


def test_listen_verbose_on_a_host_that_does_not_resolve(command):
    c = command("listen", "-v", "tcp://nosuchhost.invalid:5556")
    assert c.expect("upcall listen:") == \
        "upcall listen: connecting to tcp://nosuchhost.invalid:5556"
    line = c.expect("connect retried")
    assert "cannot resolve nosuchhost.invalid" in line
    assert c.interrupt() == 130
    assert not [s for s in c.seen if "connected" in s], c.seen
    # Said once, not once per retry (libzmq retries every 100 ms).
    assert len([s for s in c.seen if "connect retried" in s]) == 1, c.seen


def test_listen_verbose_shows_the_connection_come_and_go(command, ctx):
    pub = ctx.socket(zmq.PUB)
    pub.linger = 0
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    ep = f"tcp://127.0.0.1:{port}"
    c = command("listen", "-v", ep)
    assert c.expect("upcall listen:") == f"upcall listen: connecting to {ep}"
    assert c.expect("connected") == f"upcall listen: connected ({ep})"
    c.expect(f"handshake succeeded ({ep})")
    pub.close()
    c.expect(f"disconnected ({ep})")
    assert c.interrupt() == 130


def test_listen_verbose_on_a_refused_connect(command):
    ep = unreachable_tcp_endpoint()
    c = command("listen", "-v", ep)
    line = c.expect("connect retried")
    assert "cannot resolve" not in line and ep in line
    assert c.interrupt() == 130


def test_listen_says_a_host_that_does_not_resolve_without_verbose(command):
    c = command("listen", "tcp://nosuchhost.invalid:5556")
    line = c.expect("connect retried")
    assert "cannot resolve nosuchhost.invalid" in line, line
    assert c.interrupt() == 130
    assert len([s for s in c.seen if "connect retried" in s]) == 1, c.seen


def test_listen_says_a_refused_connect_without_verbose(command):
    ep = unreachable_tcp_endpoint()
    c = command("listen", ep)
    line = c.expect("connect retried")
    assert "connection refused" in line and ep in line, line
    assert c.interrupt() == 130


def test_publish_push_without_a_peer_says_so_and_honours_wait_timeout(command):
    ep = unreachable_tcp_endpoint()
    c = command("publish", ep, "--kind", "push", "--wait-timeout", "1.5", '{"a": 1}')
    assert c.expect("waiting for a peer") == \
        f"upcall publish: waiting for a peer at {ep} (--wait 0: do not wait; Ctrl-C ends it)"
    assert c.finish() == 1
    assert c.seen[-1] == f"upcall publish: no peer on {ep} within 1.5 s (--wait-timeout)"


def test_publish_push_waits_for_a_late_peer_then_sends(command, ctx):
    port = free_tcp_port()
    ep = f"tcp://127.0.0.1:{port}"
    c = command("publish", ep, "--kind", "push", '{"a": 1}')
    c.expect("waiting for a peer")
    pull = ctx.socket(zmq.PULL)
    pull.linger = 0
    pull.rcvtimeo = int(DEADLINE * 1000)
    pull.bind(ep)
    assert pull.recv_multipart() == [b"", msgpack.packb({"a": 1})]
    assert c.finish() == 0


def test_ctrl_c_while_publish_push_waits_for_a_peer(command):
    c = command("publish", unreachable_tcp_endpoint(), "--kind", "push", "1")
    c.expect("waiting for a peer")
    assert c.interrupt() == 130
