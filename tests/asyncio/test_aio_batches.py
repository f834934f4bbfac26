"""asyncio: ``async for batch in sub.batches()`` (the messages of one wake-up
as a list) and the C ``__anext__`` behind ``async for msg`` (no coroutine
while messages are queued).  Real event loops (asyncio's, and uvloop's when
installed), real sockets.

No timing thresholds: every wait is for a condition, with a generous deadline.
"""
import asyncio
import inspect
import threading

import pytest

import upcall
from helpers import DEADLINE
from aio_helpers import (LOOPS, assert_all_delivered, flood, joined, pull_pair, run, run_on_bus,
                         take, timeouts_keep_it_open, until)

pytestmark = pytest.mark.threads


async def take_batches(sub, n):
    """Batches of sub.batches() until n messages came; the batches."""
    out, count = [], 0
    async for batch in sub.batches():
        assert isinstance(batch, list) and batch, batch
        out.append(batch)
        count += len(batch)
        if count >= n:
            break
    return out


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_batches_in_order_nothing_lost(endpoints, loop_kind, transport):
    # A queue far smaller than the flood: the delivery thread waits for room
    # again and again (backpressure), and the batches hold every message once,
    # in order, none larger than the queue.
    n = 20000

    async def main(bus, ep):
        sub, pub = pull_pair(bus, ep, pub_kw=dict(sndhwm=100), queue_size=64, batch=32)
        sender = flood(pub, ((b"t", {"i": i}) for i in range(n)))
        batches = await take_batches(sub, n)
        sender.join(DEADLINE)
        assert [m["i"] for b in batches for m in b] == list(range(n))
        assert max(len(b) for b in batches) <= 64
        assert_all_delivered(sub.stats, n)
        await sub.aclose()
    run_on_bus(loop_kind, endpoints(transport), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_batches_sub_overflow_drops_and_counts(endpoints, loop_kind):
    n = 1000

    async def main(bus, ep):
        sub = bus.subscribe_async(ep, bind=True, queue_size=10, rcvhwm=0, with_topic=True)
        pub = bus.publisher(ep, bind=False, sndhwm=0)
        await joined(sub, pub, b"probe", "probe")      # slow joiner, without consuming
        for i in range(n):
            pub.send(b"data", i)

        def settled():
            s = sub.stats
            return s["received"] == s["delivered"] + s["dropped"] and s["dropped"] >= n - 10
        await until(settled, lambda: f"the flood to be accounted for: {sub.stats}")
        assert sub.stats["queued"] == 10 == sub.stats["delivered"]
        kept = [m for b in await take_batches(sub, 10) for m in b]
        assert len(kept) == 10
        data = [msg for topic, msg in kept if topic == b"data"]
        assert data == list(range(len(data)))      # the oldest, in order
        pub.send(b"data", "after")
        assert await take_batches(sub, 1) == [[(b"data", "after")]]
        await sub.aclose()
    run_on_bus(loop_kind, endpoints("inproc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_batches_and_messages_mixed_keep_the_order(endpoints, loop_kind):
    # `async for msg` left in the middle of a batch: batches() hands out the
    # rest of it first, then whole batches; and back.
    n = 300

    async def main(bus, ep):
        sub, pub = pull_pair(bus, ep, pub_kw=dict(sndhwm=0), batch=100)
        flood(pub, ((b"t", i) for i in range(n))).join(DEADLINE)
        await until(lambda: sub.stats["queued"] == n, "the flood to be queued")
        got = await take(sub, 7)
        batches = await take_batches(sub, 1)
        got += batches[0]
        assert got[7] == 7 and len(batches[0]) >= 1
        got += await take(sub, n - len(got))
        assert got == list(range(n))
        assert sub.stats["queued"] == 0
        await sub.aclose()
    run_on_bus(loop_kind, endpoints("inproc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_batches_cancelled_wait_takes_nothing(endpoints, loop_kind):
    # wait_for's timeout cancels a waiting batches().__anext__: the
    # subscription stays open and the message sent afterwards comes once.
    async def main(bus, ep):
        sub, pub = pull_pair(bus, ep)
        batches = sub.batches()
        await timeouts_keep_it_open(sub, batches.__anext__)
        await pub.send_async(b"t", "one", timeout=DEADLINE)
        assert await asyncio.wait_for(batches.__anext__(), DEADLINE) == ["one"]
        await pub.send_async(b"t", "two", timeout=DEADLINE)
        assert await asyncio.wait_for(sub.__anext__(), DEADLINE) == "two"
        assert sub.stats["queued"] == 0 and sub.stats["delivered"] == 2
        await sub.aclose()
    run_on_bus(loop_kind, endpoints("inproc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_batches_end_with_the_subscription(endpoints, loop_kind):
    # A consumer waiting in batches() ends (StopAsyncIteration) when the
    # subscription is closed; so does a later one.
    async def main(bus, ep):
        sub = bus.subscribe_async(ep, kind="pull", bind=True)

        async def consume():
            return [b async for b in sub.batches()]
        consumer = asyncio.ensure_future(consume())
        await until(lambda: sub._bridge.waiter is not None, "the consumer to wait")
        await sub.aclose()
        assert await asyncio.wait_for(consumer, DEADLINE) == []
        assert [b async for b in sub.batches()] == []
    run_on_bus(loop_kind, endpoints("inproc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_queued_message_is_taken_without_a_coroutine(endpoints, loop_kind):
    # __anext__ returns an awaitable that is not a coroutine (no frame per
    # message): awaited while messages are queued it gives the next at once;
    # on an empty queue it waits.  It takes a message only when awaited: one
    # never awaited, or awaited after another, loses nothing.
    async def main(bus, ep):
        sub, pub = pull_pair(bus, ep, pub_kw=dict(sndhwm=0), batch=10)
        waiting = sub.__anext__()
        assert not inspect.iscoroutine(waiting) and inspect.isawaitable(waiting)
        flood(pub, ((b"t", i) for i in range(5))).join(DEADLINE)
        assert await asyncio.wait_for(waiting, DEADLINE) == 0
        await until(lambda: sub.stats["queued"] == 4, "the rest to be queued")
        for i in range(1, 3):
            ready = sub.__anext__()
            assert not inspect.iscoroutine(ready)
            assert await ready == i
        sub.__anext__()                 # never awaited: takes nothing
        first, second = sub.__anext__(), sub.__anext__()
        assert await second == 3 and await first == 4
        assert sub.stats["queued"] == 0
        it = sub.__aiter__()
        flood(pub, ((b"t", i) for i in range(5, 8))).join(DEADLINE)
        await until(lambda: sub.stats["queued"] == 3, "the next to be queued")
        assert await it.__anext__() == 5
        assert await anext(it) == 6
        assert await anext(sub) == 7
        assert sub.stats["delivered"] == 8 and sub.stats["queued"] == 0
        await sub.aclose()
        with pytest.raises(StopAsyncIteration):
            await sub.__anext__()
    run_on_bus(loop_kind, endpoints("inproc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_messages_under_a_trace_function(endpoints, loop_kind):
    # With a tracer set (coverage, debuggers) the interpreter awaits through
    # the Python-level protocol (__next__/send/throw) instead of am_send:
    # queued messages, a wait, a cancelled wait and the end behave the same.
    import sys

    def tracer(frame, event, arg):
        return tracer

    async def main():
        with upcall.Bus() as bus:
            ep = endpoints("inproc")
            sub, pub = pull_pair(bus, ep, pub_kw=dict(sndhwm=0))
            flood(pub, ((b"t", i) for i in range(3))).join(DEADLINE)
            await until(lambda: sub.stats["queued"] == 3, "the flood to be queued")
            assert await take(sub, 2) == [0, 1]
            assert [b async for b in _first(sub.batches())] == [[2]]
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(sub.__anext__(), 0.01)
            waiter = asyncio.ensure_future(sub.__anext__())
            await until(lambda: sub._bridge.waiter is not None, "the consumer to wait")
            await pub.send_async(b"t", 3, timeout=DEADLINE)
            assert await asyncio.wait_for(waiter, DEADLINE) == 3
            await sub.aclose()
            assert [m async for m in sub] == []
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        run(loop_kind, main())
    finally:
        sys.settrace(old)


async def _first(aiter):
    async for item in aiter:
        yield item
        return


# ---- messages decoded on the delivery thread, in order with the others --------

@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("how", ["messages", "batches"])
def test_out_of_band_messages_keep_their_place(endpoints, loop_kind, how):
    # A message with out-of-band frames is decoded on the delivery thread
    # (its frames are held there), a plain one on the event loop from its
    # bytes: mixed in one flood, each comes once, in order, whole.
    n = 400
    big = upcall.DEFAULT_OOB_THRESHOLD

    def message(i):
        return {"i": i, "blob": bytes([i % 256]) * big} if i % 3 == 0 else {"i": i}

    async def main(bus, ep):
        sub, pub = pull_pair(bus, ep, pub_kw=dict(oob_threshold=big), queue_size=64, batch=16)
        sender = flood(pub, ((b"t", message(i)) for i in range(n)))
        got = []
        if how == "batches":
            async for batch in sub.batches():
                assert batch
                got += batch
                if len(got) >= n:
                    break
        else:
            got = await take(sub, n)
        sender.join(DEADLINE)
        assert [m["i"] for m in got] == list(range(n))
        assert all(bytes(m["blob"]) == bytes([m["i"] % 256]) * big
                   for m in got if m["i"] % 3 == 0)
        stats = sub.stats
        assert stats["delivered"] == n and stats["dropped"] == 0
        await sub.aclose()
    run_on_bus(loop_kind, endpoints("inproc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_where_messages_are_decoded(endpoints, loop_kind):
    # A plain message is decoded on the event loop's thread, when it is
    # taken: the decoder and on_error run there, in order.  One larger than
    # 16 KiB is decoded on the delivery thread, from its frame, and keeps
    # its place.
    decode = upcall.Decoder().decode
    threads = []
    errors = []

    def decoder(payload):
        threads.append(threading.current_thread())
        return decode(payload)

    def on_error(exc, payload):
        errors.append((threading.current_thread(), payload))

    async def main(bus, ep):
        sub = bus.subscribe_async(ep, kind="pull", bind=True, decoder=decoder,
                                  on_error=on_error)
        pub = bus.publisher(ep, kind="push", bind=False)
        pub.send(b"t", 1)
        pub.send_packed(b"t", b"\xc1")
        pub.send(b"t", "x" * 20000)
        pub.send(b"t", 3)
        # "received" is counted before the batch is handed over: wait for
        # the large one's decoding too (a busy machine saw none yet).
        await until(lambda: sub.stats["received"] == 4 and threads,
                    "all four to be received, the large one decoded")
        loop_thread = threading.current_thread()
        # Only the large one was decoded so far, on the delivery thread.
        assert len(threads) == 1 and threads[0] is not loop_thread
        assert await take(sub, 3) == [1, "x" * 20000, 3]
        assert errors == [(loop_thread, b"\xc1")]
        assert threads[1:] == [loop_thread] * 3          # 1, the bad one, 3
        st = sub.stats
        assert st["delivered"] == 3 and st["decode_errors"] == 1 and st["dropped"] == 0
        await sub.aclose()
    run_on_bus(loop_kind, endpoints("inproc"), main)
