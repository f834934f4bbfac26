"""Address lists compare addresses, not strings (docs/security.md): an IPv4
peer of a dual-stack socket (``socket_options={"ipv6": 1}``), which libzmq
reports as ``::ffff:127.0.0.1``, is the IPv4 address a list names; every
spelling of an IPv6 address is that address; networks (CIDR) hold every
address in them.  Deny and allow sides, with real peers (pyzmq PUSH over
tcp on loopback) against a plain socket with ``authenticate=True``."""
import itertools

import pytest

import upcall
from helpers import wait_for
from zap_helpers import Inbox

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

pytestmark = pytest.mark.threads

_tags = itertools.count()


def verdict(bus, sub, inbox, host):
    """Connect a peer from ``host`` ("127.0.0.1" or "::1") to the dual-stack
    ``sub``: 'allowed' (its message delivered) or 'refused'."""
    auth = bus.authenticator()
    before = auth.stats
    port = sub.last_endpoint.rsplit(":", 1)[1]
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.PUSH)
    s.linger = 0
    s.ipv6 = 1
    s.connect(f"tcp://{'[::1]' if ':' in host else host}:{port}")
    try:
        def changed():
            now = auth.stats
            return {k: now[k] - before[k] for k in now if now[k] != before[k]}
        got = wait_for(changed, what=lambda: f"a verdict: {auth.stats}")
        if "allowed" in got:
            tag = f"m{next(_tags)}"
            s.send_multipart([b"t", msgpack.packb({"tag": tag})])
            wait_for(lambda: tag in inbox.tags())
            return "allowed"
        assert set(got) == {"refused_address"}, got
        return "refused"
    finally:
        s.close()


def dual_stack(bus, inbox):
    # Bound on the IPv6 wildcard with ipv6=1: IPv4 peers arrive as ::ffff:a.b.c.d.
    return bus.subscribe("tcp://*:*", inbox, kind="pull", bind=True, authenticate=True,
                         socket_options={"ipv6": 1})


@pytest.mark.parametrize("spelling", ["127.0.0.1", "::ffff:127.0.0.1", "::ffff:7f00:1",
                                      "127.0.0.0/8", "::ffff:127.0.0.0/104"])
def test_deny_an_ipv4_peer_of_a_dual_stack_socket(spelling):
    inbox = Inbox()
    with upcall.Bus() as bus:
        bus.authenticator().deny_address(spelling)
        sub = dual_stack(bus, inbox)
        assert verdict(bus, sub, inbox, "127.0.0.1") == "refused"
        assert verdict(bus, sub, inbox, "::1") == "allowed"
    assert len(inbox.items) == 1


@pytest.mark.parametrize("spelling", ["::1", "::0001", "0:0:0:0:0:0:0:1",
                                      "0000:0000:0000:0000:0000:0000:0000:0001", "::/127"])
def test_deny_ipv6_loopback_however_spelled(spelling):
    inbox = Inbox()
    with upcall.Bus() as bus:
        bus.authenticator().deny_address(spelling)
        sub = dual_stack(bus, inbox)
        assert verdict(bus, sub, inbox, "::1") == "refused"
        assert verdict(bus, sub, inbox, "127.0.0.1") == "allowed"


@pytest.mark.parametrize("spelling", ["127.0.0.1", "127.0.0.0/8", "::ffff:127.0.0.1"])
def test_allow_an_ipv4_peer_of_a_dual_stack_socket(spelling):
    inbox = Inbox()
    with upcall.Bus() as bus:
        bus.authenticator().allow_address(spelling)
        sub = dual_stack(bus, inbox)
        assert verdict(bus, sub, inbox, "127.0.0.1") == "allowed"
        assert verdict(bus, sub, inbox, "::1") == "refused"


def test_forget_takes_any_spelling_off():
    inbox = Inbox()
    with upcall.Bus() as bus:
        auth = bus.authenticator()
        auth.deny_address(["::1", "127.0.0.1", "10.0.0.0/8"])
        assert auth.entries == 3
        auth.deny_address(["0:0::1", "::ffff:127.0.0.1"])      # the same two: no entry added
        assert auth.entries == 3
        auth.forget_address(["::0001", "::ffff:7f00:1", "10.0.0.0/8"])
        assert auth.entries == 0
        sub = dual_stack(bus, inbox)
        assert verdict(bus, sub, inbox, "127.0.0.1") == "allowed"


@pytest.mark.parametrize("bad", ["localhost", "127.0.0.1/33", "10.0.0.1/8", "1::2::3",
                                 "::1/129", "127.0.0.1/", "", "fe80::1%eth0/64"])
def test_invalid_spellings_name_the_argument(bad):
    with upcall.Bus() as bus:
        auth = bus.authenticator()
        for call in (auth.allow_address, auth.deny_address, auth.forget_address):
            with pytest.raises(ValueError, match=r"addresses\[1\]"):
                call(["127.0.0.1", bad])
        assert auth.entries == 0          # nothing half-done
        with pytest.raises(TypeError, match=r"addresses\[0\]"):
            auth.deny_address([12])
        with pytest.raises(TypeError, match="addresses"):
            auth.deny_address(12)
