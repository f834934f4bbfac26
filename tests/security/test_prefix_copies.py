"""stats["prefix_copies"] and stats["prefix_copy_bytes"]: how many full
copies of a SUB's prefixes its send queues may hold (one per peer connected,
which keeps it while it reads nothing; two per connecting endpoint down) and
an upper bound of their memory (docs/security.md, "Where prefixes are
copied")."""
import socket

import pytest

import upcall

from helpers import wait_for

pytestmark = pytest.mark.threads

PREFIXES = [b"p%049d" % i for i in range(100)]      # 100 prefixes of 50 bytes
ONE_COPY = sum(map(len, PREFIXES)) + 128 * len(PREFIXES)


def _free_tcp_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _copies(sub):
    st = sub.stats
    return st["prefix_copies"], st["prefix_copy_bytes"]


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "own-socket"])
def test_connecting_sub_counts_peers_and_endpoints_down(shared):
    with upcall.Bus() as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
        down = _free_tcp_endpoint()
        sub = bus.subscribe([pub.last_endpoint, down], lambda m: None, topics=PREFIXES,
                            shared=shared)
        # The endpoint up: one copy; the one down: two.
        wait_for(lambda: _copies(sub) == (3, 3 * ONE_COPY), what="one peer up, one endpoint down")
        sub.subscribe(b"x" * 10)
        wait_for(lambda: _copies(sub) == (3, 3 * (ONE_COPY + 10 + 128)))
        sub.unsubscribe(b"x" * 10)
        wait_for(lambda: _copies(sub) == (3, 3 * ONE_COPY))
        # The endpoint down comes up: one copy each.
        pub2 = bus.publisher(down, bind=True)
        wait_for(lambda: _copies(sub) == (2, 2 * ONE_COPY), what="both peers up")
        pub2.close()
        wait_for(lambda: _copies(sub) == (3, 3 * ONE_COPY), what="the second peer gone")
        sub.close()
        assert _copies(sub) == (0, 0)


def test_bound_sub_counts_one_copy_per_connection():
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", lambda m: None, topics=PREFIXES, bind=True)
        assert _copies(sub) == (0, 0)
        pubs = [bus.publisher(sub.last_endpoint) for _ in range(3)]
        wait_for(lambda: _copies(sub) == (3, 3 * ONE_COPY), what="three connections")
        for p in pubs:
            p.close()
        wait_for(lambda: _copies(sub) == (0, 0), what="no connection")


def test_pull_holds_no_prefix():
    with upcall.Bus() as bus:
        pull = bus.subscribe("tcp://127.0.0.1:*", lambda m: None, kind="pull", bind=True)
        push = bus.publisher(pull.last_endpoint, kind="push")
        wait_for(lambda: pull.peers == 1)
        assert _copies(pull) == (0, 0)
        push.close()


def test_a_closed_subscription_holds_no_copy_while_its_shared_socket_stays_open():
    with upcall.Bus() as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
        bystander = bus.subscribe(pub.last_endpoint, lambda m: None, topics=[b"b"])
        sub = bus.subscribe(pub.last_endpoint, lambda m: None, topics=PREFIXES)
        wait_for(lambda: _copies(sub)[0] == 1, what="the shared socket connected")
        sub.close()
        assert _copies(sub) == (0, 0)
        assert _copies(bystander)[0] == 1          # the socket's own copy remains
        bystander.close()
