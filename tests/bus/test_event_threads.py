"""A publisher's on_event runs on a thread of its own: one that blocks holds
up neither another publisher's events nor anyone's connection state."""
import threading

import pytest

import upcall
from helpers import wait_for

pytestmark = pytest.mark.threads


def test_a_blocking_on_event_does_not_stall_another_publisher(endpoints):
    release = threading.Event()
    blocked = threading.Event()
    seen_b = []

    def stuck(ev):
        blocked.set()
        release.wait(60)

    try:
        with upcall.Bus() as bus:
            a = bus.publisher(endpoints("tcp"), on_event=stuck, bind=True)
            b = bus.publisher(endpoints("tcp"), on_event=seen_b.append, bind=True)
            sub_a = bus.subscribe(a.last_endpoint, lambda m: None)
            wait_for(blocked.is_set, what="a's on_event called")
            sub_b = bus.subscribe(b.last_endpoint, lambda m: None)
            # b's events and both publishers' connection state go on while
            # a's on_event blocks.
            wait_for(lambda: any(e.kind == "handshake_succeeded" for e in seen_b),
                     what="b's on_event while a's blocks")
            wait_for(lambda: b.peers == 1 and a.peers == 1, what="peers of both")
            assert a.stats["handshakes"] == 1
            release.set()
            sub_a.close()
            sub_b.close()
            a.close()
            b.close()
    finally:
        release.set()


def test_events_queued_before_close_reach_on_event(endpoints):
    seen = []
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("tcp"), on_event=seen.append, bind=True)
        sub = bus.subscribe(pub.last_endpoint, lambda m: None)
        wait_for(lambda: pub.stats["handshakes"] == 1)
        pub.close()
        # close() waited for the on_event thread: what was counted was handed over.
        assert [e.kind for e in seen].count("handshake_succeeded") == 1
        sub.close()
