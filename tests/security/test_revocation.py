"""Revocation across scopes (docs/security.md): a key may be allowed
bus-wide (``auth.allow(key)``), on one socket (``allow=[key]`` or
``auth.allow(key, socket=s)``), or both.  ``revoke(key)`` takes it out of
every scope; ``revoke(key, socket=s)`` takes it off that socket's list and,
for a key allowed bus-wide (which that socket would still admit), refuses
with a ValueError and changes nothing.

Every combination, with a real CURVE client (pyzmq, tcp on loopback)
admitted before the revocation and a new one connecting after it.  Each
case has a bus of its own, so that its authenticator's counters see that
case's handshakes only."""
import itertools

import pytest

import upcall
from helpers import wait_for
from zap_helpers import SERVER, Inbox

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

if not zmq.has("curve"):
    pytest.skip("libzmq without CURVE support", allow_module_level=True)

pytestmark = pytest.mark.threads

_tags = itertools.count()


class Clients:
    """pyzmq CURVE PUSH clients of one bus's sockets: each connection's
    verdict is read from the authenticator's counters (one client at a
    time), an admitted one's delivery from the inbox."""

    def __init__(self, auth, inbox):
        self.ctx = zmq.Context()
        self.auth, self.inbox = auth, inbox

    def verdicts(self):
        s = self.auth.stats
        return s["allowed"], s["refused_key"]

    def connect(self, sub, client):
        """'allowed' (and a message delivered) or 'refused'."""
        before = self.verdicts()
        s = self.ctx.socket(zmq.PUSH)
        s.linger = 0
        s.curve_serverkey = SERVER[0].encode()
        s.curve_publickey, s.curve_secretkey = client[0].encode(), client[1].encode()
        s.connect(sub.last_endpoint)
        try:
            allowed, refused = wait_for(
                lambda: [a - b for a, b in zip(self.verdicts(), before)] != [0, 0]
                and [a - b for a, b in zip(self.verdicts(), before)],
                what=lambda: f"a verdict: {self.auth.stats}")
            if allowed:
                tag = f"m{next(_tags)}"
                s.send_multipart([b"t", msgpack.packb({"tag": tag})])
                wait_for(lambda: tag in self.inbox.tags())
                return "allowed"
            return "refused"
        finally:
            s.close()

    def close(self):
        self.ctx.term()


def open_sub(bus, inbox, allow=None):
    return bus.subscribe("tcp://127.0.0.1:*", inbox, kind="pull", bind=True,
                         curve_server=SERVER, allow=allow)


@pytest.mark.parametrize("granted", ["socket", "bus", "both"])
@pytest.mark.parametrize("revoked", ["bus", "socket"])
def test_revocation_in_every_scope(granted, revoked):
    key = upcall.curve_keypair()
    other = upcall.curve_keypair()
    inbox = Inbox()
    with upcall.Bus() as bus:
        auth = bus.authenticator()
        socket_allow = [key[0], other[0]] if granted in ("socket", "both") else [other[0]]
        sub = open_sub(bus, inbox, allow=socket_allow)
        # A second socket holding the key on its own list too.
        sub2 = open_sub(bus, inbox, allow=[key[0]])
        if granted in ("bus", "both"):
            auth.allow(key[0])
        clients = Clients(auth, inbox)
        try:
            assert clients.connect(sub, key) == "allowed"
            entries = auth.entries
            if revoked == "socket" and granted in ("bus", "both"):
                with pytest.raises(ValueError, match=r"keys\[1\].*bus-wide.*nothing was revoked"):
                    auth.revoke([other[0], key[0]], socket=sub)
                # Refused whole: nothing changed, not even the first key.
                assert auth.entries == entries
                assert clients.connect(sub, key) == "allowed"
                assert clients.connect(sub, other) == "allowed"
                return
            if revoked == "bus":
                auth.revoke(key[0])
            else:
                auth.revoke(key[0], socket=sub)
            assert clients.connect(sub, key) == "refused"
            # Bus-wide: out of every socket's list as well; on one socket: the
            # other socket keeps it.
            assert clients.connect(sub2, key) == ("refused" if revoked == "bus" else "allowed")
            # Other keys are untouched.
            assert clients.connect(sub, other) == "allowed"
            # Allowed again, it is admitted again.
            auth.allow(key[0], socket=sub)
            assert clients.connect(sub, key) == "allowed"
        finally:
            clients.close()


def test_revoke_on_a_closed_socket_names_it():
    with upcall.Bus() as bus:
        auth = bus.authenticator()
        sub = open_sub(bus, Inbox(), allow=[upcall.curve_keypair()[0]])
        sub.close()
        with pytest.raises(ValueError, match="is closed"):
            auth.revoke(upcall.curve_keypair()[0], socket=sub)
