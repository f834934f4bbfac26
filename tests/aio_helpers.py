"""What the asyncio tests share (tests/asyncio/, tests/bus/test_gc_tracking.py):
the event loops to run on, and waits and floods that keep to the loop."""
import asyncio
import threading

import pytest

import upcall
from helpers import DEADLINE

try:
    import uvloop
except ImportError:
    uvloop = None

LOOPS = ["asyncio", pytest.param("uvloop", marks=pytest.mark.skipif(
    uvloop is None, reason="uvloop is not installed"))]


def new_loop(kind):
    return uvloop.new_event_loop() if kind == "uvloop" else asyncio.new_event_loop()


def run(kind, coro):
    """asyncio.run(coro) on a loop of this kind (asyncio.Runner is 3.11+)."""
    loop = new_loop(kind)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def run_on_bus(kind, endpoint, body):
    """run(kind, body(bus, endpoint)) with a new Bus, closed once body ends."""
    async def main():
        with upcall.Bus() as bus:
            return await body(bus, endpoint)
    return run(kind, main())


async def until(predicate, what, timeout=DEADLINE):
    """Wait on the event loop until predicate() is truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for "
                                 f"{what() if callable(what) else what}")
        await asyncio.sleep(0.002)


async def take(sub, n):
    """The next n messages of an AsyncSubscription."""
    out = []
    async for msg in sub:
        out.append(msg)
        if len(out) == n:
            break
    return out


def pull_pair(bus, ep, pub_kw=None, **sub_kw):
    """An async PULL subscription bound to ep and a PUSH publisher connected
    to it (pub_kw: the publisher's arguments): (sub, pub)."""
    sub = bus.subscribe_async(ep, kind="pull", bind=True, **sub_kw)
    pub = bus.publisher(ep, kind="push", bind=False, **(pub_kw or {}))
    return sub, pub


def assert_all_delivered(stats, n):
    """Every one of n messages delivered once: none dropped, none left queued."""
    assert stats["delivered"] == stats["received"] == n, stats
    assert stats["dropped"] == stats["decode_errors"] == 0, stats
    assert stats["queued"] == 0, stats


async def timeouts_keep_it_open(sub, anext):
    """wait_for's timeouts (0, 1 ms, 10 ms) cancel a waiting anext() and leave
    the subscription open."""
    for timeout in (0, 0.001, 0.01):
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(anext(), timeout)
        assert not sub.closed


async def joined(sub, pub, topic, msg):
    """PUB/SUB slow joiner, without consuming: send (topic, msg) until the
    subscription has received one."""
    while sub.stats["received"] == 0:
        pub.send(topic, msg)
        await asyncio.sleep(0.005)


def flood(pub, messages, stop=None):
    """Send messages from a thread (blocking sends: PUSH backpressure)."""
    def body():
        for topic, obj in messages:
            if stop is not None and stop.is_set():
                return
            pub.send(topic, obj)
    t = threading.Thread(target=body, name="test-flood", daemon=True)
    t.start()
    return t


def raiser_of(exc_type):
    """A callable raising exc_type, whatever it is called with."""
    def raiser(*args):
        raise exc_type("from the test")
    return raiser
