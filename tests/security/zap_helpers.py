"""What the ZAP tests share: a zap_peer.py process to talk to, a target
recording senders, the server's key pair and the waits on refusals."""
import os
import queue
import subprocess
import sys
import threading
import time

import upcall
from helpers import DEADLINE, script_env, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))


class ZapPeer:
    """A zap_peer.py process and its line conversation."""

    def __init__(self, *argv, cwd):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "zap_peer.py"), *argv],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1, env=script_env(PYTHONUNBUFFERED="1"), cwd=cwd)
        self.lines = queue.Queue()
        self.events = []
        self.stderr = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if line.startswith("event "):
                self.events.append(line.split()[1])
            else:
                self.lines.put(line)
        self.lines.put(None)

    def expect(self, word):
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {word!r} from the peer; stderr: {''.join(self.stderr)}")
            if line is None:
                raise AssertionError(f"peer ended before {word!r}: {''.join(self.stderr)}")
            head, _, rest = line.partition(" ")
            if head == word:
                return rest

    def ask(self, command, reply):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.expect(reply)

    def wait_event(self, *names):
        """Until the peer's socket monitor reported one of ``names``."""
        wait_for(lambda: any(n in self.events for n in names),
                 what=lambda: f"{names} in {self.events}")

    def count(self):
        n, tags = self.ask("count", "count").split()
        return int(n), [] if tags == "-" else tags.split(",")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.ask("quit", "bye")
            except (AssertionError, OSError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Inbox:
    """A target recording (msg, sender) pairs (with_sender=True)."""

    def __init__(self):
        self.items = []
        self.lock = threading.Lock()

    def __call__(self, msg, sender=None):
        with self.lock:
            self.items.append((msg["tag"], sender))

    def tags(self):
        with self.lock:
            return [t for t, _ in self.items]


SERVER = upcall.curve_keypair()


def failed_without_auth(sock):
    stats = sock.stats
    return stats["handshake_failed_protocol"] + stats["handshake_failed_no_detail"]


def refused_by(auth, cause, n):
    wait_for(lambda: auth.stats[cause] >= n, what=lambda: f"{cause} >= {n}: {auth.stats}")
