"""What the authenticator holds (docs/security.md): a socket's ``allow=``
keys go when it closes, whatever way it closes; the key table is a hash
set (its contract in csrc/zap.h), so many keys cost memory, not time per
key.  Structural checks of ``auth.entries``; no timing."""
import gc
import secrets

import pytest

import upcall
from zap_helpers import SERVER

zmq = pytest.importorskip("zmq")
import zmq.utils.z85 as z85  # noqa: E402

if not zmq.has("curve"):
    pytest.skip("libzmq without CURVE support", allow_module_level=True)


def keys(n):
    return [upcall.curve_keypair()[0] for _ in range(n)]


def open_sub(bus, allow, kind="sub"):
    if kind == "pub":
        return bus.publisher("tcp://127.0.0.1:*", bind=True, curve_server=SERVER, allow=allow)
    return bus.subscribe("tcp://127.0.0.1:*", lambda m: None, kind="pull", bind=True,
                         curve_server=SERVER, allow=allow)


@pytest.mark.parametrize("kind", ["sub", "pub"])
def test_socket_keys_go_when_it_closes(kind):
    shared, own = keys(3), keys(20)
    with upcall.Bus() as bus:
        auth = bus.authenticator()
        auth.allow(shared[0])
        for _ in range(30):
            s = open_sub(bus, own + shared, kind)
            assert auth.entries == 1 + len(own) + len(shared)
            s.close()
            assert auth.entries == 1          # the bus-wide key stays
        # One socket's close leaves another's keys (the same keys) alone.
        a, b = open_sub(bus, own, kind), open_sub(bus, own, kind)
        assert auth.entries == 1 + 2 * len(own)
        a.close()
        assert auth.entries == 1 + len(own)
        b.close()
        assert auth.entries == 1


def test_socket_keys_go_when_it_fails_to_open():
    with upcall.Bus() as bus:
        auth = bus.authenticator()
        taken = open_sub(bus, keys(1))
        with pytest.raises(upcall.ZMQError):
            bus.subscribe(taken.last_endpoint, lambda m: None, kind="pull", bind=True,
                          curve_server=SERVER, allow=keys(7))
        gc.collect()
        assert auth.entries == 1


def test_many_keys_and_their_removal():
    """100,000 keys in, each in two scopes, then out again in every order the
    table knows (bus-wide revoke, socket revoke, close)."""
    many = [z85.encode(secrets.token_bytes(32)).decode() for _ in range(100_000)]
    with upcall.Bus() as bus:
        auth = bus.authenticator()
        auth.allow(many)
        assert auth.entries == len(many)
        auth.allow(many)                      # twice: nothing added
        assert auth.entries == len(many)
        s = open_sub(bus, many[:50_000])
        assert auth.entries == len(many) + 50_000
        auth.revoke(many[50_000:])            # bus-wide: out of every scope
        assert auth.entries == 2 * 50_000
        with pytest.raises(ValueError, match="bus-wide"):
            auth.revoke(many[:10], socket=s)
        auth.revoke(many[:25_000])
        assert auth.entries == 2 * 25_000
        s.close()
        assert auth.entries == 25_000
        auth.revoke(many)
        assert auth.entries == 0
