"""Client authentication: the bus's ZAP handler against pyzmq peers in
other processes, over tcp (docs/security.md).

"Delivers nothing" is never shown by sleeping: each refused peer's own
socket monitor reports its failed handshake (and the authenticator counts
the refusal by cause, as do the upcall socket's connection events) before
an allowed peer sends a sentinel; once that has arrived, the refused peer
must have delivered nothing.
"""
import logging

import pytest

import upcall
import upcall._bus
from helpers import wait_for
from zap_helpers import SERVER, Inbox, failed_without_auth, refused_by

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

if not zmq.has("curve"):
    pytest.skip("libzmq without CURVE support", allow_module_level=True)

pytestmark = pytest.mark.threads

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
        pub = bus.publisher("tcp://127.0.0.1:*", curve_server=SERVER, allow=[good[0]], bind=True)
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
