"""A target of a subscription on a shared socket never runs before bus.subscribe() has
returned it: a target may use the handle its caller was given
(``sub = bus.subscribe(ep, lambda m: sub.close(), ...)``), even when messages
for its prefix flood the shared socket while it opens (the shared socket holds what
reached it until then)."""
import threading

import pytest

import upcall

from helpers import DEADLINE, wait_for

pytestmark = pytest.mark.threads

OPENS = 200


def _flood(pub, stop, started):
    # The publisher is used by this thread alone from now on.
    started.set()
    while not stop.is_set():
        for _ in range(50):
            pub.send(b"f", 1)


def test_target_runs_only_after_subscribe_returns():
    shared = True
    early = []
    with upcall.Bus() as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
        ep = pub.last_endpoint
        # Keeps the shared socket open between the opens, so that each open
        # joins it while the flood runs (its prefix new to the socket each time).
        bystander = bus.subscribe(ep, lambda m: None, topics=[b"zz"], shared=shared)
        stop, started = threading.Event(), threading.Event()
        flood = threading.Thread(target=_flood, args=(pub, stop, started))
        flood.start()
        try:
            assert started.wait(DEADLINE)

            def open_one():
                def target(msg):
                    sub.close()    # NameError if called before subscribe() returned

                sub = bus.subscribe(ep, target, topics=[b"f"], shared=shared,
                                    on_error=lambda exc, msg: early.append(exc))
                return sub

            for _ in range(OPENS):
                s = open_one()
                wait_for(lambda: s.closed or early, what="a delivery")
        finally:
            stop.set()
            flood.join(DEADLINE)
        bystander.close()
    assert early == []

