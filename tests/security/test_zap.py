"""Client authentication: the bus's ZAP handler against pyzmq peers in
other processes, over tcp (docs/security.md).

"Delivers nothing" is never shown by sleeping: each refused peer's own
socket monitor reports its failed handshake (and the authenticator counts
the refusal by cause, as do the upcall socket's connection events) before
an allowed peer sends a sentinel; once that has arrived, the refused peer
must have delivered nothing.
"""
import gc
import logging
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

import upcall
import upcall._bus
from helpers import DEADLINE, script_env, wait_for

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

if not zmq.has("curve"):
    pytest.skip("libzmq without CURVE support", allow_module_level=True)

pytestmark = pytest.mark.threads

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


@pytest.fixture
def peers(tmp_path):
    started = []

    def start(role, endpoint, *, server=None, client=None, plain=False, source=None):
        argv = [role, "--endpoint", endpoint]
        if not plain:
            # --opt=KEY: a Z85 key may start with "-", which argparse would
            # take for an option.
            argv += [f"--serverkey={server}"]
            if client:
                argv += [f"--public={client[0]}", f"--secret={client[1]}"]
        if source:
            argv += ["--source", source]
        p = ZapPeer(*argv, cwd=str(tmp_path))
        started.append(p)
        p.expect("ready")
        return p

    yield start
    for p in started:
        p.close()


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


# ---- a PULL collector refusing pushers ----------------------------------

def test_collector_admits_allowed_keys_only(peers):
    """Allowed key delivered (with its identity); unknown key, plain client
    and a revoked key deliver nothing; each refusal counted by cause."""
    good, stranger, later = upcall.curve_keypair(), upcall.curve_keypair(), upcall.curve_keypair()
    inbox = Inbox()
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", inbox, kind="pull", bind=True,
                            curve_server=SERVER, allow=[good[0], later[0]], with_sender=True)
        auth = bus.authenticator()
        ep = sub.last_endpoint
        ok = peers("push", ep, server=SERVER[0], client=good)
        ok.wait_event("HANDSHAKE_SUCCEEDED")
        bad = peers("push", ep, server=SERVER[0], client=stranger)
        bad.wait_event("HANDSHAKE_FAILED_AUTH")
        refused_by(auth, "refused_key", 1)
        plain = peers("push", ep, plain=True)
        # libzmq's cause is a protocol error, or "no detail" when the client
        # sees the server hang up first (seen on a busy machine): refused either way.
        plain.wait_event("HANDSHAKE_FAILED_PROTOCOL", "HANDSHAKE_FAILED_NO_DETAIL")
        # Revoked before it connects: refused like a stranger.
        auth.revoke(later[0], socket=sub)
        revoked = peers("push", ep, server=SERVER[0], client=later)
        revoked.wait_event("HANDSHAKE_FAILED_AUTH")
        refused_by(auth, "refused_key", 2)
        for p, tag in ((bad, "bad"), (plain, "plain"), (revoked, "revoked"), (ok, "ok")):
            p.ask(f"send 3 {tag}", "sent")
        wait_for(lambda: inbox.tags().count("ok") == 3)
        # The socket's own connection events count each refusal by cause.
        wait_for(lambda: sub.stats["handshake_failed_auth"] == 2, what=lambda: sub.stats)
        # The plain client: a mechanism mismatch, which libzmq reports to
        # the server with no detail (to the client as a protocol error).
        wait_for(lambda: failed_without_auth(sub) >= 1, what=lambda: sub.stats)
        assert sub.stats["handshakes"] == 1
    assert inbox.items == [("ok", good[0])] * 3
    stats = auth.stats
    assert stats["allowed"] == 1
    assert stats["refused_key"] == 2
    assert stats["refused_address"] == stats["refused_mechanism"] == stats["malformed"] == 0
    assert not auth.running


def test_denied_address_delivers_nothing(peers):
    """An address on the deny list is refused before its key is looked at;
    another loopback address with the same key is admitted."""
    good = upcall.curve_keypair()
    inbox = Inbox()
    with upcall.Bus() as bus:
        auth = bus.authenticator()
        auth.allow(good[0])
        auth.deny_address("127.0.0.3")
        sub = bus.subscribe("tcp://127.0.0.1:*", inbox, kind="pull", bind=True,
                            curve_server=SERVER)
        port = sub.last_endpoint.rsplit(":", 1)[1]
        ep = f"tcp://127.0.0.1:{port}"
        denied = peers("push", ep, server=SERVER[0], client=good, source="127.0.0.3")
        denied.wait_event("HANDSHAKE_FAILED_AUTH")
        refused_by(auth, "refused_address", 1)
        ok = peers("push", ep, server=SERVER[0], client=good, source="127.0.0.4")
        ok.wait_event("HANDSHAKE_SUCCEEDED")
        denied.ask("send 2 denied", "sent")
        ok.ask("send 2 ok", "sent")
        wait_for(lambda: inbox.tags().count("ok") == 2)
        assert inbox.tags() == ["ok", "ok"]
        assert auth.stats["refused_key"] == 0
        wait_for(lambda: sub.stats["handshake_failed_auth"] >= 1, what=lambda: sub.stats)


def test_plain_endpoint_address_lists(peers):
    """authenticate=True: libzmq asks the handler about plain (NULL) peers,
    and the address lists apply; an allow list admits only its addresses."""
    inbox = Inbox()
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", inbox, kind="pull", bind=True,
                            authenticate=True)
        auth = bus.authenticator()
        auth.allow_address("127.0.0.6")
        port = sub.last_endpoint.rsplit(":", 1)[1]
        ep = f"tcp://127.0.0.1:{port}"
        other = peers("push", ep, plain=True, source="127.0.0.7")
        other.wait_event("HANDSHAKE_FAILED_AUTH")
        refused_by(auth, "refused_address", 1)
        ok = peers("push", ep, plain=True, source="127.0.0.6")
        ok.wait_event("HANDSHAKE_SUCCEEDED")
        other.ask("send 2 other", "sent")
        ok.ask("send 2 ok", "sent")
        wait_for(lambda: inbox.tags().count("ok") == 2)
        assert inbox.items == [("ok", None), ("ok", None)]
        wait_for(lambda: sub.stats["handshake_failed_auth"] >= 1, what=lambda: sub.stats)


# ---- a PUB refusing subscribers ---------------------------------------------

def test_publisher_admits_allowed_subscribers_only(peers):
    good, stranger = upcall.curve_keypair(), upcall.curve_keypair()
    with upcall.Bus() as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", curve_server=SERVER, allow=[good[0]])
        auth = bus.authenticator()
        ep = pub.last_endpoint
        ok = peers("sub", ep, server=SERVER[0], client=good)
        ok.wait_event("HANDSHAKE_SUCCEEDED")
        bad = peers("sub", ep, server=SERVER[0], client=stranger)
        bad.wait_event("HANDSHAKE_FAILED_AUTH")
        plain = peers("sub", ep, plain=True)
        # libzmq's cause is a protocol error, or "no detail" when the client
        # sees the server hang up first (seen on a busy machine): refused either way.
        plain.wait_event("HANDSHAKE_FAILED_PROTOCOL", "HANDSHAKE_FAILED_NO_DETAIL")
        refused_by(auth, "refused_key", 1)
        # PUB/SUB joins late: publish until the allowed subscriber has some.
        wait_for(lambda: pub.send(b"t", {"tag": "x"}) or ok.count()[0] > 0)
        assert bad.count() == (0, [])
        assert plain.count() == (0, [])
        assert auth.stats["allowed"] == 1
        wait_for(lambda: pub.stats["handshake_failed_auth"] >= 1, what=lambda: pub.stats)
        wait_for(lambda: failed_without_auth(pub) >= 1, what=lambda: pub.stats)
        assert pub.stats["handshakes"] == 1


# ---- runtime revocation ---------------------------------------------------

def test_revocation_refuses_the_next_handshake(peers):
    """Revoking a key refuses that client's next connection; the connection
    already accepted lives on (libzmq cannot close one peer of a socket):
    the documented limit."""
    client = upcall.curve_keypair()
    inbox = Inbox()
    with upcall.Bus() as bus:
        auth = bus.authenticator()
        auth.allow(client[0])
        sub = bus.subscribe("tcp://127.0.0.1:*", inbox, kind="pull", bind=True,
                            curve_server=SERVER, with_sender=True)
        p = peers("push", sub.last_endpoint, server=SERVER[0], client=client)
        p.wait_event("HANDSHAKE_SUCCEEDED")
        p.ask("send 1 before", "sent")
        wait_for(lambda: inbox.tags() == ["before"])
        auth.revoke(client[0])
        p.ask("send 1 kept", "sent")            # the accepted connection: still delivers
        wait_for(lambda: inbox.tags() == ["before", "kept"])
        p.ask("reconnect", "reconnected")
        p.wait_event("HANDSHAKE_FAILED_AUTH")
        refused_by(auth, "refused_key", 1)
        auth.allow(client[0])                   # let it back: its next connection is admitted
        p.ask("reconnect", "reconnected")
        wait_for(lambda: p.events.count("HANDSHAKE_SUCCEEDED") == 2)
        p.ask("send 1 after", "sent")
        wait_for(lambda: "after" in inbox.tags())
        assert inbox.tags() == ["before", "kept", "after"]
        assert {s for _, s in inbox.items} == {client[0]}


# ---- sender identity ----------------------------------------------------------

def test_sender_identity_per_message(peers):
    a, b = upcall.curve_keypair(), upcall.curve_keypair()
    inbox = Inbox()
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", inbox, kind="pull", bind=True,
                            curve_server=SERVER, allow=[a[0], b[0]], with_sender=True)
        pa = peers("push", sub.last_endpoint, server=SERVER[0], client=a)
        pb = peers("push", sub.last_endpoint, server=SERVER[0], client=b)
        pa.ask("send 50 a", "sent")
        pb.ask("send 50 b", "sent")
        wait_for(lambda: len(inbox.items) == 100)
    keys = {"a": a[0], "b": b[0]}
    assert all(sender == keys[tag] for tag, sender in inbox.items)
    assert sorted(t for t, _ in inbox.items) == ["a"] * 50 + ["b"] * 50


def test_with_sender_and_topic(peers):
    a = upcall.curve_keypair()
    got = []
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", lambda *args: got.append(args), kind="pull",
                            bind=True, curve_server=SERVER, allow=[a[0]], with_sender=True,
                            with_topic=True)
        p = peers("push", sub.last_endpoint, server=SERVER[0], client=a)
        p.ask("send 1 a", "sent")
        wait_for(lambda: got)
    assert got == [(b"t", {"tag": "a", "i": 0}, a[0])]


def test_without_sender_nothing_is_added(peers):
    a = upcall.curve_keypair()
    got = []
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", lambda *args: got.append(args), kind="pull",
                            bind=True, curve_server=SERVER, allow=[a[0]])
        p = peers("push", sub.last_endpoint, server=SERVER[0], client=a)
        p.ask("send 1 a", "sent")
        wait_for(lambda: got)
    assert got == [({"tag": "a", "i": 0},)]


# ---- logging --------------------------------------------------------------

def test_refusals_logged_once_per_window(peers, caplog, monkeypatch):
    monkeypatch.setattr(upcall._bus, "AUTH_LOG_INTERVAL", 3600.0)
    caplog.set_level(logging.WARNING, logger="upcall")
    good = upcall.curve_keypair()
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", Inbox(), kind="pull", bind=True,
                            curve_server=SERVER, allow=[good[0]])
        auth = bus.authenticator()
        strangers = [upcall.curve_keypair() for _ in range(3)]
        for kp in strangers:
            p = peers("push", sub.last_endpoint, server=SERVER[0], client=kp)
            p.wait_event("HANDSHAKE_FAILED_AUTH")
        refused_by(auth, "refused_key", 3)
        auth.deny_address("127.0.0.8")
        port = sub.last_endpoint.rsplit(":", 1)[1]
        p = peers("push", f"tcp://127.0.0.1:{port}", server=SERVER[0], client=good,
                  source="127.0.0.8")
        p.wait_event("HANDSHAKE_FAILED_AUTH")
        refused_by(auth, "refused_address", 1)
        wait_for(lambda: len([r for r in caplog.records if hasattr(r, "auth_cause")]) >= 2)
    records = [r for r in caplog.records if hasattr(r, "auth_cause")]
    assert [r.auth_cause for r in records] == ["refused_key", "refused_address"]
    assert records[0].public_key == strangers[0][0]
    assert records[1].address == "127.0.0.8"


# ---- bad arguments ------------------------------------------------------------

def test_allow_needs_a_curve_server():
    with upcall.Bus() as bus:
        with pytest.raises(ValueError, match="allow=.*curve_server"):
            bus.subscribe("tcp://127.0.0.1:*", print, kind="pull", bind=True,
                          allow=[SERVER[0]])
        with pytest.raises(ValueError, match="allow=.*curve_server"):
            bus.publisher("tcp://127.0.0.1:*", curve_serverkey=SERVER[0], bind=False,
                          allow=[SERVER[0]])
        with pytest.raises(TypeError, match="allow"):
            bus.subscribe("tcp://127.0.0.1:*", print, curve_server=SERVER, allow=5)
        with pytest.raises(ValueError, match=r"allow\[0\]"):
            bus.subscribe("tcp://127.0.0.1:*", print, curve_server=SERVER, allow=["x" * 39])
        with pytest.raises(TypeError, match="authenticate"):
            bus.subscribe("tcp://127.0.0.1:*", print, authenticate=1)
        with pytest.raises(ValueError, match="with_sender.*callable"):
            bus.subscribe("tcp://127.0.0.1:*", upcall.Counter(), with_sender=True)
        auth = bus.authenticator()
        with pytest.raises(ValueError, match="not an IPv4"):
            auth.deny_address("localhost")
        with pytest.raises(TypeError, match="str"):
            auth.allow_address([5])
        with pytest.raises(ValueError, match="socket="):
            auth.allow(SERVER[0], socket=object())
        assert bus.authenticator() is auth
    with pytest.raises(ValueError, match="stopped"):
        auth.allow(SERVER[0])


# ---- a flood of handshakes --------------------------------------------------

def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.timeout(600)
def test_flood_of_random_keys(tmp_path, peers):
    """10,000 handshakes with random keys: every one refused and counted,
    the handler's memory flat (nothing kept per refusal), and an allowed
    client delivers throughout."""
    good = upcall.curve_keypair()
    inbox = Inbox()
    batch, total = 250, 10_000
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", inbox, kind="pull", bind=True,
                            curve_server=SERVER, allow=[good[0]])
        auth = bus.authenticator()
        entries = auth.entries
        ok = peers("push", sub.last_endpoint, server=SERVER[0], client=good)
        flood = ZapPeer("flood", "--endpoint", sub.last_endpoint, f"--serverkey={SERVER[0]}",
                        "--batch", str(batch), cwd=str(tmp_path))
        try:
            rss = {}
            for k in range(1, total // batch + 1):
                flood.ask("next", "opened")
                refused_by(auth, "refused_key", k * batch)
                if k * batch in (2000, total):
                    # Measured once libzmq has let go of every refused
                    # connection (on a busy machine its I/O thread lags):
                    # only the allowed client is left.
                    wait_for(lambda: sub.peers == 1)
                    gc.collect()
                    rss[k * batch] = _rss_kib()
                if k % 10 == 0:
                    ok.ask(f"send 1 ok{k}", "sent")
                    wait_for(lambda: f"ok{k}" in inbox.tags())
        finally:
            flood.close()
        assert auth.stats["refused_key"] == total
        assert auth.stats["allowed"] == 1
        assert auth.entries == entries
        ok.ask("send 1 last", "sent")
        wait_for(lambda: "last" in inbox.tags())
    # Flat: 8,000 refusals after the first 2,000 grew the process by less
    # than 6 MiB, under 800 bytes a refusal (quiet: about 0.6 MiB in all; a
    # busy test process's own allocations moved it by up to 2.4 MiB).
    print("flood RSS (KiB) after 2,000 and 10,000 refusals:", rss)
    assert rss[total] - rss[2000] < 6144, rss
