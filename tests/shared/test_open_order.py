"""A subscription's target never runs before bus.subscribe() has returned
it, on a shared socket or a socket of its own, whatever the target kind and
thread factory: a target may use the handle its caller was given
(``sub = bus.subscribe(ep, lambda m: sub.close(), ...)``), even when messages
for its prefix flood the endpoint while it opens (the shared socket, or the
subscription's own loop, holds what reached it until then, and the own
socket's first batch lets the statement that called subscribe() take the
handle first).
A switch interval of a microsecond makes an own socket's delivery thread
take the GIL at the first chance it gets."""
import sys
import threading

import pytest

import upcall
from upcall.native import FieldFilter

from helpers import DEADLINE, wait_for

pytestmark = pytest.mark.threads

OPENS = 200


def _flood(pub, stop, started):
    # The publisher is used by this thread alone from now on.
    started.set()
    while not stop.is_set():
        for _ in range(50):
            pub.send(b"f", {"px": 1})


def _target(kind, on_message):
    """A target of ``kind`` that calls ``on_message()`` for each message."""
    if kind == "handler":
        class Closer(upcall.Handler):
            def on_message(self, msg):
                on_message()
        return Closer()
    if kind == "native":
        return FieldFilter("px", gt=0, target=lambda msg: on_message())
    return lambda msg: on_message()


CASES = [
    # (shared, target kind, thread factory)
    (True, "callable", None),
    (True, "handler", None),
    (True, "native", None),
    (False, "callable", None),
    (False, "handler", None),
    (False, "native", None),
    (False, "callable", upcall.python_threads),
]


@pytest.fixture
def switch_interval(request):
    """A microsecond for a subscription on a socket of its own (its delivery
    thread then takes the GIL at the first chance it gets)."""
    before = sys.getswitchinterval()
    if not request.node.callspec.params["shared"]:
        sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.parametrize(
    "shared, kind, factory", CASES,
    ids=[f"{'shared' if s else 'own-socket'}-{k}{'-python_threads' if f else ''}"
         for s, k, f in CASES])
def test_target_runs_only_after_subscribe_returns(shared, kind, factory, switch_interval):
    early = []
    extra = {} if factory is None else {"thread_factory": factory}
    with upcall.Bus() as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
        ep = pub.last_endpoint
        # Keeps the shared socket open between the opens, so that each shared
        # open joins it while the flood runs (its prefix new to the socket
        # each time).
        bystander = bus.subscribe(ep, lambda m: None, topics=[b"zz"], shared=shared)
        stop, started = threading.Event(), threading.Event()
        flood = threading.Thread(target=_flood, args=(pub, stop, started))
        flood.start()
        try:
            assert started.wait(DEADLINE)

            def open_one():
                def on_message():
                    sub.close()    # NameError if called before subscribe() returned

                sub = bus.subscribe(ep, _target(kind, on_message), topics=[b"f"],
                                    shared=shared, on_error=lambda exc, msg: early.append(exc),
                                    **extra)
                return sub

            for _ in range(OPENS):
                s = open_one()
                wait_for(lambda: s.closed or early, what="a delivery")
                if early:
                    break
        finally:
            stop.set()
            flood.join(DEADLINE)
        bystander.close()
    assert early == []
