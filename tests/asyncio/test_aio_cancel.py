"""asyncio: a cancelled ``__anext__`` takes nothing and leaves the
subscription open (``asyncio.wait_for`` polling), while every real end
(aclose, async with, the bus, the delivery loop ending) still ends the
iteration.  Real event loops (asyncio's, and uvloop's when installed), real
sockets.

No timing thresholds: every wait is for a condition, with a generous deadline.
"""
import asyncio
import random

import pytest

import upcall
from helpers import DEADLINE, wait_for
from aio_helpers import (LOOPS, flood, pull_pair, raiser_of as _raise, run,
                         run_on_bus, timeouts_keep_it_open, until)


async def waiting(sub):
    """Wait until a task waits in sub's __anext__ (its future is set)."""
    await until(lambda: sub._bridge.waiter is not None, "the consumer to wait")


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_wait_for_timeouts_keep_the_subscription(endpoints, loop_kind):
    # Polling with a timeout: each timeout leaves the subscription open, and
    # the message sent after them is the next one taken, once.
    async def main(bus, ep):
        sub, pub = pull_pair(bus, ep)
        await timeouts_keep_it_open(sub, sub.__anext__)
        for i in range(3):
            await pub.send_async(b"t", i, timeout=DEADLINE)
            assert await asyncio.wait_for(sub.__anext__(), DEADLINE) == i
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(sub.__anext__(), 0.001)
        st = sub.stats
        assert st["delivered"] == 3 and st["queued"] == 0
        await sub.aclose()
    run_on_bus(loop_kind, endpoints("inproc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_cancelled_wait_takes_nothing(endpoints, loop_kind):
    # Cancelled while waiting in the future (nothing queued yet), and
    # cancelled after the wake-up was scheduled but before the task resumed:
    # in both cases the message goes to the next __anext__.
    async def main(bus, ep):
        sub, pub = pull_pair(bus, ep)
        # 1. Waiting, nothing queued.
        task = asyncio.ensure_future(sub.__anext__())
        await waiting(sub)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sub._bridge.waiter is None and not sub.closed
        await pub.send_async(b"t", "first", timeout=DEADLINE)
        assert await asyncio.wait_for(sub.__anext__(), DEADLINE) == "first"
        # 2. The wake-up written (message queued for the waiter), the
        # task cancelled before it runs: the event loop's thread is held
        # (a blocking wait, no await) until the delivery thread has
        # written the loop's eventfd, so the cancellation comes first.
        task = asyncio.ensure_future(sub.__anext__())
        await waiting(sub)
        wakeups = sub.stats["wakeups"]
        await pub.send_async(b"t", "second", timeout=DEADLINE)
        wait_for(lambda: sub.stats["wakeups"] == wakeups + 1,
                 what="the wake-up to be written")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not sub.closed
        assert await asyncio.wait_for(sub.__anext__(), DEADLINE) == "second"
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(sub.__anext__(), 0.01)   # taken once
        await pub.send_async(b"t", "third", timeout=DEADLINE)
        assert await asyncio.wait_for(sub.__anext__(), DEADLINE) == "third"
        await sub.aclose()
    run_on_bus(loop_kind, endpoints("inproc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("seed", [1, 2])
def test_random_cancellations_lose_and_duplicate_nothing(endpoints, loop_kind, seed):
    # A flood consumed through a mix of plain waits, wait_for with tiny
    # timeouts (0 included: cancelled before it ever ran) and tasks cancelled
    # after a random number of loop iterations: each message exactly once,
    # in order.  A small queue keeps the consumer often waiting (the delivery
    # thread pushes back, kind="pull": nothing dropped).
    n = 4000
    rng = random.Random(seed)

    async def main(bus, ep):
        sub, pub = pull_pair(bus, ep, pub_kw=dict(sndhwm=50), queue_size=16, batch=8)
        sender = flood(pub, ((b"t", i) for i in range(n)))
        got = []
        cancelled = 0
        while len(got) < n:
            how = rng.random()
            try:
                if how < 0.4:
                    timeout = rng.choice([0, 1e-6, 1e-5, 1e-4, 1e-3])
                    got.append(await asyncio.wait_for(sub.__anext__(), timeout))
                elif how < 0.8:
                    task = asyncio.ensure_future(sub.__anext__())
                    for _ in range(rng.randrange(3)):
                        await asyncio.sleep(0)
                    task.cancel()
                    got.append(await task)
                else:
                    got.append(await asyncio.wait_for(sub.__anext__(), DEADLINE))
            except (asyncio.CancelledError, asyncio.TimeoutError):
                cancelled += 1
            assert not sub.closed
        sender.join(DEADLINE)
        assert got == list(range(n))
        assert cancelled > 0
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(sub.__anext__(), 0.01)   # nothing more, nothing twice
        st = sub.stats
        assert st["delivered"] == n and st["dropped"] == 0 and st["queued"] == 0
        await sub.aclose()
    run_on_bus(loop_kind, endpoints("inproc"), main)


# After a cancelled wait, each end still ends a consumer waiting then.
ENDS = ["aclose", "async_with", "bus_close", "on_error_StopDelivery"]


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("end", ENDS)
def test_every_end_still_ends_the_iteration_after_a_cancelled_wait(endpoints, loop_kind, end):
    async def main():
        bus = upcall.Bus()
        try:
            ep = endpoints("inproc")
            kwargs = {"on_error": _raise(upcall.StopDelivery)} if end.startswith("on_error") else {}
            sub, pub = pull_pair(bus, ep, **kwargs)
            async with sub:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(sub.__anext__(), 0.001)
                await pub.send_async(b"t", 1, timeout=DEADLINE)
                assert await asyncio.wait_for(sub.__anext__(), DEADLINE) == 1

                async def rest():
                    return [msg async for msg in sub]
                consumer = asyncio.ensure_future(rest())
                await waiting(sub)
                if end == "aclose":
                    await sub.aclose()
                elif end == "bus_close":
                    bus.close()
                elif end == "on_error_StopDelivery":
                    pub.send_packed(b"t", b"\xc1")     # undecodable: on_error stops delivery
                if end != "async_with":
                    assert await asyncio.wait_for(consumer, DEADLINE) == []
                    assert sub.closed
            # Leaving async with (the consumer still waiting for "async_with").
            assert await asyncio.wait_for(consumer, DEADLINE) == []
            assert sub.closed
            with pytest.raises(StopAsyncIteration):
                await sub.__anext__()
        finally:
            bus.close()
    run(loop_kind, main())
