"""asyncio: bus.subscribe_async and Publisher.send_async on real event loops
(asyncio's, and uvloop's when it is installed) and real sockets; async
callables refused by subscribe().

No timing thresholds: every wait is for a condition, with a generous deadline.
"""
import asyncio
import functools
import gc
import subprocess
import sys
import textwrap
import threading

import pytest

import upcall
from aio_helpers import (LOOPS, assert_all_delivered, flood, joined, pull_pair,
                         raiser_of as _raise, run, run_on_bus, take, until)
from helpers import DEADLINE, fd_count, script_env, thread_count, wait_for

pytestmark = pytest.mark.threads

async def warm_up_async(pub, sub, topic=b"probe"):
    """PUB/SUB slow joiner: send probes until one comes out of the subscription."""
    async def probes():
        while True:
            await pub.send_async(topic, "probe")
            await asyncio.sleep(0.005)
    task = asyncio.ensure_future(probes())
    try:
        first = await asyncio.wait_for(sub.__anext__(), DEADLINE)
    finally:
        task.cancel()
    return first


# ---- delivery ----------------------------------------------------------------

@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_pull_in_order_nothing_lost(endpoints, loop_kind, transport):
    # A queue far smaller than the flood: the delivery thread waits for room
    # again and again, and still nothing is lost or reordered.
    n = 20000

    async def main(bus, ep):
        sub, pub = pull_pair(bus, ep, pub_kw=dict(sndhwm=100), queue_size=64, batch=32)
        sender = flood(pub, ((b"t", {"i": i}) for i in range(n)))
        got = await take(sub, n)
        sender.join(DEADLINE)
        assert [m["i"] for m in got] == list(range(n))
        assert_all_delivered(sub.stats, n)
        await sub.aclose()
    run_on_bus(loop_kind, endpoints(transport), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_sub_with_topic_in_order(endpoints, loop_kind):
    n = 3000

    async def main(bus, ep):
        async with bus.subscribe_async(ep, bind=True, with_topic=True, rcvhwm=0,
                                       topics=[b"probe", "data."]) as sub:
            pub = bus.publisher(ep, bind=False, sndhwm=0)
            pub.send(b"other", "filtered out")
            assert await warm_up_async(pub, sub) == (b"probe", "probe")
            flood(pub, ((b"data.%d" % (i % 3), i) for i in range(n))).join(DEADLINE)
            got = []
            async for topic, msg in sub:
                if topic != b"probe":
                    got.append((topic, msg))
                    if len(got) == n:
                        break
            assert got == [(b"data.%d" % (i % 3), i) for i in range(n)]
    run_on_bus(loop_kind, endpoints("ipc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_pull_backpressure_reaches_the_sender(endpoints, loop_kind):
    # Nobody consumes: the queue fills up to queue_size, the delivery thread
    # waits with the next batch, zmq's queues fill, and the sender meets its
    # high-water mark.
    # Then everything that was accepted arrives, in order.
    async def main(bus, ep):
        sub = bus.subscribe_async(ep, kind="pull", bind=True, queue_size=10, batch=5,
                                  rcvhwm=10)
        pub = bus.publisher(ep, kind="push", bind=False, sndhwm=10)
        sent = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE
        while True:
            try:
                await pub.send_async(b"t", sent, timeout=0)
                sent += 1
                continue
            except BlockingIOError:
                pass
            stats = sub.stats
            held = stats["received"] - stats["delivered"]   # the batch waiting for room
            if stats["queued"] + held > 10:
                break
            assert loop.time() < deadline, f"queue never filled: {stats}"
            await asyncio.sleep(0.005)
        assert stats["queued"] <= 10 and stats["dropped"] == 0
        assert sent > 10          # the rest waits in zmq, up to the marks
        assert await take(sub, sent) == list(range(sent))
        await pub.send_async(b"t", "after", timeout=DEADLINE)
        assert await take(sub, 1) == ["after"]
        assert sub.stats["dropped"] == 0
        await sub.aclose()
    run_on_bus(loop_kind, endpoints("inproc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_sub_overflow_drops_and_counts(endpoints, loop_kind):
    n = 1000

    async def main(bus, ep):
        sub = bus.subscribe_async(ep, bind=True, queue_size=10, rcvhwm=0, with_topic=True)
        pub = bus.publisher(ep, bind=False, sndhwm=0)
        # Slow joiner, without consuming: probes until one was received.
        await joined(sub, pub, b"probe", "probe")
        for i in range(n):
            pub.send(b"data", i)

        def settled():
            s = sub.stats
            return s["received"] == s["delivered"] + s["dropped"] and s["dropped"] >= n - 10
        await until(settled, lambda: f"the flood to be accounted for: {sub.stats}")
        stats = sub.stats
        assert stats["queued"] == 10 == stats["delivered"]
        # What was kept is the oldest, in order: probes, then data from 0.
        kept = await take(sub, 10)
        data = [msg for topic, msg in kept if topic == b"data"]
        assert data == list(range(len(data)))
        # After the overflow the subscription goes on.
        pub.send(b"data", "after")
        assert await take(sub, 1) == [(b"data", "after")]
        await sub.aclose()
    run_on_bus(loop_kind, endpoints("inproc"), main)


class CountingLoop(asyncio.SelectorEventLoop):
    """asyncio's loop, counting the wake-ups other threads ask for and the
    calls of its readers' callbacks."""
    threadsafe_calls = 0
    reader_calls = 0

    def call_soon_threadsafe(self, *args, **kwargs):
        self.threadsafe_calls += 1
        return super().call_soon_threadsafe(*args, **kwargs)

    def add_reader(self, fd, callback, *args):
        def counted(*a):
            self.reader_calls += 1
            return callback(*a)
        return super().add_reader(fd, counted, *args)


def test_one_wakeup_per_batch_at_most(endpoints):
    n = 20000
    loop = CountingLoop()

    async def main():
        with upcall.Bus() as bus:
            ep = endpoints("inproc")
            sub, pub = pull_pair(bus, ep, pub_kw=dict(sndhwm=0), queue_size=n)
            # 1. The consumer waits, a flood comes.
            consumer = asyncio.ensure_future(take(sub, n))
            await asyncio.sleep(0.01)
            sender = flood(pub, ((b"t", i) for i in range(n)))
            assert await consumer == list(range(n))
            sender.join(DEADLINE)
            stats = sub.stats
            # The delivery thread wakes the loop through its eventfd (one
            # write per wake-up), never with call_soon_threadsafe.
            assert loop.threadsafe_calls == 0
            assert 1 <= stats["wakeups"] <= stats["batches"]
            assert 1 <= loop.reader_calls <= stats["wakeups"]
            # 2. Messages queued while the consumer is busy elsewhere: taking
            # them needs no wake-up at all.
            before, calls = stats["wakeups"], loop.reader_calls
            flood(pub, ((b"t", i) for i in range(n))).join(DEADLINE)
            await until(lambda: sub.stats["queued"] == n, "the flood to be queued")
            assert await take(sub, n) == list(range(n))
            assert sub.stats["wakeups"] == before and loop.reader_calls == calls
            assert loop.threadsafe_calls == 0
            await sub.aclose()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


# ---- the end of a subscription -------------------------------------------------

FACTORIES = [pytest.param(None, id="native"),
             pytest.param(upcall.python_threads, id="python")]


async def baseline():
    """Threads and fds of this process, once the event loop has made its own."""
    await asyncio.sleep(0)
    return thread_count(), fd_count()


async def released(base, what):
    """Wait until the threads and fds are back to base.  A closed
    subscription keeps one eventfd until the object is freed, and zmq frees
    a closed socket once its peer has noticed: tests drop their references
    and close the peer first."""
    threads, fds = base

    def back():
        gc.collect()     # e.g. a traceback that kept a frame holding the subscription
        return thread_count() <= threads and fd_count() <= fds
    await until(back,
                lambda: f"{what}: threads {thread_count()} (base {threads}), "
                        f"fds {fd_count()} (base {fds})")


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("factory", FACTORIES)
def test_cancelling_the_consumer_keeps_the_subscription(endpoints, loop_kind, factory):
    # A cancelled wait took nothing: the subscription stays open, the next
    # consumer gets the next message, and aclose() is what ends it.
    async def main(bus, ep):
        pub = bus.publisher(ep, kind="push", bind=True)
        base = await baseline()
        sub = bus.subscribe_async(ep, kind="pull", thread_factory=factory)
        got = []

        async def consume():
            async for msg in sub:
                got.append(msg)
        task = asyncio.ensure_future(consume())
        await pub.send_async(b"t", 1)
        await until(lambda: got == [1], "the first message")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not sub.closed
        await pub.send_async(b"t", 2)
        assert await asyncio.wait_for(sub.__anext__(), DEADLINE) == 2
        await sub.aclose()
        assert sub.closed
        with pytest.raises(StopAsyncIteration):
            await sub.__anext__()
        del sub, task
        pub.close()       # zmq frees a socket once its peer has seen it go
        await released(base, "after cancelling, then aclose")
    run_on_bus(loop_kind, endpoints("inproc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_aclose_ends_a_waiting_consumer(endpoints, loop_kind):
    async def main(bus, ep):
        bus.publisher(endpoints("inproc"), bind=True)   # libzmq's threads start with a first socket
        base = await baseline()
        sub = bus.subscribe_async(ep, bind=True)
        done = []

        async def consume():
            async for msg in sub:
                done.append(msg)
            done.append("ended")
        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.01)       # let it wait for a message
        await sub.aclose()
        await asyncio.wait_for(task, DEADLINE)
        assert done == ["ended"]
        await sub.aclose()              # again: nothing happens
        del sub, task
        await released(base, "after aclose")
    run_on_bus(loop_kind, endpoints("inproc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_async_with_closes_and_discards_the_queue(endpoints, loop_kind):
    async def main(bus, ep):
        pub = bus.publisher(ep, kind="push", bind=True)
        base = await baseline()
        async with bus.subscribe_async(ep, kind="pull") as sub:
            for i in range(5):
                await pub.send_async(b"t", i)
            assert await take(sub, 1) == [0]
            await until(lambda: sub.stats["queued"] == 4, "the rest to be queued")
        assert sub.closed and sub.stats["queued"] == 0
        assert [m async for m in sub] == []
        del sub
        pub.close()
        await released(base, "after async with")
    run_on_bus(loop_kind, endpoints("inproc"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_bus_close_ends_the_iteration(endpoints, loop_kind):
    async def main():
        bus = upcall.Bus()
        sub = bus.subscribe_async(endpoints("inproc"), bind=True)
        task = asyncio.ensure_future(take(sub, 1))
        await asyncio.sleep(0.01)
        # From another thread, as the exit hook would.
        closer = threading.Thread(target=bus.close)
        closer.start()
        assert await asyncio.wait_for(task, DEADLINE) == []
        closer.join(DEADLINE)
        assert sub.closed
    run(loop_kind, main())


# Every way the delivery loop can end by itself, and how the iteration ends
# then: StopAsyncIteration (None) or that exception, raised in the consumer.
def _decoder_raising(exc_type):
    decode = upcall.Decoder().decode

    def decoder(payload):
        if payload == b"\xc1":
            raise exc_type("from the test")
        return decode(payload)
    return decoder


LOOP_ENDS = {
    "on_error-StopDelivery": (dict(on_error=_raise(upcall.StopDelivery)), None),
    "on_error-KeyboardInterrupt": (dict(on_error=_raise(KeyboardInterrupt)), KeyboardInterrupt),
    "on_error-SystemExit": (dict(on_error=_raise(SystemExit)), SystemExit),
    "decoder-KeyboardInterrupt": (dict(decoder=_decoder_raising(KeyboardInterrupt)),
                                  KeyboardInterrupt),
    "decoder-SystemExit": (dict(decoder=_decoder_raising(SystemExit)), SystemExit),
}


async def consume_to_the_end(sub):
    """Every message until the iteration ends, and the exception that ended
    it (None: StopAsyncIteration).  Only the exceptions a loop end may carry
    are caught: a cancellation (wait_for's timeout) stays one."""
    got = []
    try:
        async for msg in sub:
            got.append(msg)
    except (KeyboardInterrupt, SystemExit) as exc:
        return got, exc
    return got, None


# Where the message that ends delivery is decoded: a plain message (a
# topic and a payload) on the event loop, when the consumer reaches it; one
# of more frames than are kept (UC_WIRE_MAX_FRAMES) on the delivery thread,
# as it arrives.  The decoder's causes need a payload it is called with.
ENDS_WHERE = [(cause, where) for cause in LOOP_ENDS for where in ("loop", "thread")
              if where == "loop" or cause.startswith("on_error")]


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize("consumer", ["waiting", "after_the_end"])
@pytest.mark.parametrize("cause,where", ENDS_WHERE)
def test_the_delivery_loop_ending_by_itself_ends_the_iteration(
        endpoints, loop_kind, factory, consumer, cause, where):
    # The messages queued before the end come first, in order, once each;
    # then the iteration ends, with the exception that ended delivery (once),
    # whether the consumer was already waiting or comes after the end.
    import zmq
    kwargs, expected = LOOP_ENDS[cause]
    n = 50
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append

    async def main():
        with upcall.Bus() as bus:
            ep = endpoints("ipc")    # pyzmq's context: not the bus's inproc
            sub = bus.subscribe_async(ep, kind="pull", bind=True, thread_factory=factory,
                                      **kwargs)
            # One sender for all of them (a PULL fair-queues between senders).
            push = zmq.Context.instance().socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(ep)
            try:
                if consumer == "waiting":
                    task = asyncio.ensure_future(consume_to_the_end(sub))
                    await asyncio.sleep(0.01)          # let it wait for a message
                for i in range(n):
                    push.send_multipart([b"t", upcall.packb(i)])
                # The message that ends delivery.
                push.send_multipart([b"t", b"\xc1"] if where == "loop"
                                    else [b"t", upcall.packb("many")] + [b"x"] * 20)
                for i in range(n, n + 5):
                    push.send_multipart([b"t", upcall.packb(i)])   # never delivered
                if consumer == "after_the_end":
                    if where == "thread":
                        # Decoded on the delivery thread: the end comes without a consumer.
                        await until(lambda: sub.closed, "delivery to end")
                    else:
                        await until(lambda: sub.stats["received"] >= n + 1,
                                    "the message that ends delivery to be received")
                    task = asyncio.ensure_future(consume_to_the_end(sub))
                # Before the end reached the iteration, this waited until the bus closed.
                got, exc = await asyncio.wait_for(task, DEADLINE)
            finally:
                push.close()
            assert got == list(range(n))
            if expected is None:
                assert exc is None
            else:
                assert type(exc) is expected and exc.args == ("from the test",)
            assert sub.closed
            # Ended for good: the exception is raised once.
            assert await consume_to_the_end(sub) == ([], None)
            st = sub.stats
            assert st["delivered"] == n and st["decode_errors"] == 1 and st["queued"] == 0
    try:
        run(loop_kind, main())
    finally:
        sys.unraisablehook = hook
    # Raised in the consumer, so not also reported as unraisable.
    assert unraisable == []


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_closing_after_the_loop_ended_discards_the_queue(endpoints, loop_kind):
    # The loop's end keeps what is queued; a close after it still discards it.
    # The end: a message of more frames than are kept, which the delivery
    # thread decodes (a plain one would be decoded on the event loop).
    import zmq

    async def main(bus, ep):
        sub = bus.subscribe_async(ep, kind="pull", bind=True,
                                  on_error=_raise(upcall.StopDelivery))
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(ep)
        try:
            for i in range(3):
                push.send_multipart([b"t", upcall.packb(i)])
            push.send_multipart([b"t", upcall.packb("many")] + [b"x"] * 20)
            await until(lambda: sub.closed, "delivery to end")
        finally:
            push.close()
        assert await take(sub, 1) == [0]
        await sub.aclose()
        assert await asyncio.wait_for(consume_to_the_end(sub), DEADLINE) == ([], None)
        assert sub.stats["delivered"] == 1 and sub.stats["dropped"] == 2
    run_on_bus(loop_kind, endpoints("ipc"), main)


@pytest.mark.parametrize("cause", ["on_error-StopDelivery", "on_error-KeyboardInterrupt"])
def test_an_end_hook_set_after_the_end_runs_at_once(endpoints, cause):
    # subscribe_async sets its hook just after subscribe() returns: a loop
    # that ended in between still ends the iteration, with its exception.
    kwargs, expected = LOOP_ENDS[cause]
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with upcall.Bus() as bus:
            ep = endpoints("inproc")
            sub = bus.subscribe(ep, lambda msg: None, kind="pull", bind=True, **kwargs)
            pub = bus.publisher(ep, kind="push", bind=False)
            pub.send_packed(b"t", b"\xc1")
            assert sub.wait(DEADLINE)
            ends = []
            sub.set_end_hook(ends.append)
            assert len(ends) == 1
            if expected is None:
                assert ends == [None]
            else:
                assert type(ends[0]) is expected
            sub.set_end_hook(ends.append)       # the end was handed over once
            assert ends[1:] == [None]
    finally:
        sys.unraisablehook = hook
    # Without a hook when it ended, the interrupt also went to sys.unraisablehook.
    assert len(unraisable) == (0 if expected is None else 1)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_an_abandoned_iterator_closes_itself(endpoints, loop_kind):
    async def main(bus, ep):
        pub = bus.publisher(ep, kind="push", bind=True)
        base = await baseline()
        send = asyncio.ensure_future(pub.send_async(b"t", 1))   # goes once a peer connects
        async for msg in bus.subscribe_async(ep, kind="pull"):
            assert msg == 1
            break
        await send
        pub.close()
        await released(base, "after leaving the loop with break")
    run_on_bus(loop_kind, endpoints("inproc"), main)


LOOP_CLOSED_SCRIPT = textwrap.dedent("""
    import asyncio, sys, threading, time
    import upcall
    from helpers import thread_count, wait_for

    loop_kind, ipc_dir = sys.argv[1], sys.argv[2]
    if loop_kind == "uvloop":
        import uvloop
        new_loop = uvloop.new_event_loop
    else:
        new_loop = asyncio.new_event_loop

    bus = upcall.Bus()
    ep_pull, ep_sub = "ipc://" + ipc_dir + "/pull.sock", "ipc://" + ipc_dir + "/sub.sock"
    push = bus.publisher(ep_pull, kind="push", sndhwm=100, bind=True)
    pub = bus.publisher(ep_sub, kind="pub", bind=True)
    stop = threading.Event()

    def flood():
        i = 0
        while not stop.is_set():
            for p in (push, pub):
                try:
                    p.send(b"f", {"i": i, "pad": "x" * 40}, timeout=0.01)
                except (TimeoutError, BlockingIOError):
                    pass
            i += 1

    base = thread_count()
    kept = []
    flooder = threading.Thread(target=flood)

    async def main():
        # One subscription the coroutine drops, one that outlives the loop.
        sub = bus.subscribe_async(ep_pull, kind="pull", queue_size=100)
        kept.append(bus.subscribe_async(ep_sub, queue_size=100))
        flooder.start()
        n = 0
        async for msg in sub:
            n += 1
            if n == 2000:
                break
        print("consumed", n, flush=True)
        # The loop closes right after, while messages flow.

    loop = new_loop()
    loop.run_until_complete(main())
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
    # The dropped one closed with its coroutine; the kept one ends at its
    # next batch: both delivery threads go.
    wait_for(lambda: kept[0].closed, what="the kept subscription to end")
    wait_for(lambda: thread_count() <= base + 1, what="delivery threads to end")  # + flood
    stop.set()
    flooder.join()
    print("threads released", flush=True)
    bus.close()
    print("done", flush=True)
""")


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_loop_closed_while_messages_flow(ipc_dir, loop_kind):
    # cwd: not the source tree, whose upcall/ `-c` would import first.
    proc = subprocess.run([sys.executable, "-c", LOOP_CLOSED_SCRIPT, loop_kind, ipc_dir],
                          cwd=ipc_dir, env=script_env(), capture_output=True, text=True,
                          timeout=60)
    report = f"status {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert proc.stdout.split("\n")[:3] == ["consumed 2000", "threads released", "done"], report
    assert proc.stderr == "", report


# ---- arguments -----------------------------------------------------------------

def test_subscribe_async_needs_a_running_loop(endpoints):
    with upcall.Bus() as bus:
        with pytest.raises(RuntimeError, match="from a coroutine"):
            bus.subscribe_async(endpoints("inproc"))
        assert bus.closed is False


@pytest.mark.parametrize("kwargs,error,match", [
    ({"queue_size": 0}, ValueError, "queue_size"),
    ({"queue_size": 1.5}, TypeError, "queue_size"),
    ({"queue_size": True}, TypeError, "queue_size"),
    ({"delivery": "caller"}, TypeError, "delivery"),
    ({"kind": "push"}, ValueError, "kind"),
    ({"batch": 0}, ValueError, "batch"),
])
def test_subscribe_async_arguments(endpoints, kwargs, error, match):
    async def main():
        with upcall.Bus() as bus:
            base = await baseline()
            with pytest.raises(error, match=match):
                bus.subscribe_async(endpoints("inproc"), **kwargs)
            await released(base, "after a refused subscription")
    run("asyncio", main())


def test_an_async_subscription_belongs_to_its_loop(endpoints):
    with upcall.Bus() as bus:
        async def make():
            return bus.subscribe_async(endpoints("inproc"), bind=True)
        sub = run("asyncio", make())

        async def consume():
            return await sub.__anext__()
        with pytest.raises(RuntimeError, match="event loop that made it"):
            run("asyncio", consume())
        sub.close()


def test_one_waiting_consumer_at_a_time(endpoints):
    async def main():
        with upcall.Bus() as bus:
            sub = bus.subscribe_async(endpoints("inproc"), bind=True)
            first = asyncio.ensure_future(sub.__anext__())
            await asyncio.sleep(0.01)
            with pytest.raises(RuntimeError, match="already waiting"):
                await sub.__anext__()
            first.cancel()
    run("asyncio", main())


# ---- async callables given to subscribe() ----------------------------------------

async def async_target(msg):
    pass


async def async_gen_target(msg):
    yield msg


class AsyncCallable:
    async def __call__(self, msg):
        pass


class Service:
    async def on_msg(self, msg):
        pass


class AsyncHandler(upcall.Handler):
    async def on_message(self, msg):
        pass


@pytest.mark.parametrize("target", [
    async_target, async_gen_target, AsyncCallable(), Service().on_msg,
    functools.partial(async_target), AsyncHandler(),
    upcall.native.FieldFilter("px", gt=1, target=async_target),
], ids=["async-def", "async-generator", "async-call", "async-method", "partial",
        "handler", "native-handler-target"])
def test_subscribe_refuses_async_callables(endpoints, target):
    with upcall.Bus() as bus:
        base = thread_count(), fd_count()
        with pytest.raises(TypeError, match=r"async callable.*subscribe_async"):
            bus.subscribe(endpoints("inproc"), target)
        wait_for(lambda: thread_count() <= base[0] and fd_count() <= base[1],
                 what="nothing left open")


def test_subscribe_still_takes_plain_callables(endpoints):
    class Plain:
        def __call__(self, msg):
            pass
    with upcall.Bus() as bus:
        for target in (print, Plain(), functools.partial(print), lambda m: None,
                       upcall.Counter()):
            bus.subscribe(endpoints("inproc"), target).close()


# ---- send_async ----------------------------------------------------------------

@pytest.mark.parametrize("loop_kind", LOOPS)
def test_send_async_waits_without_blocking_the_loop(endpoints, loop_kind):
    # A bound PUSH with no peer has nowhere to queue: send_async waits while
    # other coroutines run, and completes once a peer connects.
    async def main(bus, ep):
        pub = bus.publisher(ep, kind="push", bind=True)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)
        tick_task = asyncio.ensure_future(ticker())
        send = asyncio.ensure_future(pub.send_async(b"t", {"hello": 1}))
        await until(lambda: ticks >= 20, "the loop to go on while send_async waits")
        assert not send.done()
        sub = bus.subscribe_async(ep, kind="pull", bind=False)
        await asyncio.wait_for(send, DEADLINE)
        assert await take(sub, 1) == [{"hello": 1}]
        tick_task.cancel()
        await sub.aclose()
    run_on_bus(loop_kind, endpoints("tcp"), main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_send_async_timeouts_and_cancellation(endpoints, loop_kind):
    async def main(bus, ep):
        pub = bus.publisher(ep, kind="push", bind=True)
        with pytest.raises(BlockingIOError):
            await pub.send_async(b"t", "zero", timeout=0)
        with pytest.raises(TimeoutError, match="high-water mark"):
            await pub.send_async(b"t", "short", timeout=0.02)
        cancelled = asyncio.ensure_future(pub.send_async(b"t", "cancelled"))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        # None of those went out.
        sub = bus.subscribe_async(ep, kind="pull", bind=False)
        await pub.send_async(b"t", "sent", timeout=DEADLINE)
        assert await take(sub, 1) == ["sent"]
        await sub.aclose()
    run_on_bus(loop_kind, endpoints("inproc"), main)


def test_send_async_not_blocked_by_a_blocked_thread(endpoints):
    # Another thread's send is blocked at the high-water mark, holding the
    # socket: send_async must not wait for it on the event loop.
    async def main():
        with upcall.Bus() as bus:
            ep = endpoints("inproc")
            pub = bus.publisher(ep, kind="push", bind=True)
            blocked = threading.Thread(target=pub.send, args=(b"t", "from the thread"))
            blocked.start()
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.001)
            tick_task = asyncio.ensure_future(ticker())
            with pytest.raises(TimeoutError):
                await pub.send_async(b"t", "async", timeout=0.1)
            assert ticks > 0
            sub = bus.subscribe_async(ep, kind="pull", bind=False)
            assert await take(sub, 1) == ["from the thread"]
            blocked.join(DEADLINE)
            await pub.send_async(b"t", "async", timeout=DEADLINE)
            assert await take(sub, 1) == ["async"]
            tick_task.cancel()
            await sub.aclose()
    run("asyncio", main())


def test_send_async_arguments_and_closed_publisher(endpoints):
    async def main():
        with upcall.Bus() as bus:
            pub = bus.publisher(endpoints("inproc"), kind="push", bind=True)
            with pytest.raises(TypeError, match="timeout"):
                pub.send_async(b"t", 1, timeout="soon")
            with pytest.raises(ValueError, match="timeout"):
                pub.send_async(b"t", 1, timeout=-1)
            with pytest.raises(TypeError, match="topic"):
                pub.send_async(3, 1)
            with pytest.raises(TypeError, match="cannot pack"):
                pub.send_async(b"t", object())
            pending = asyncio.ensure_future(pub.send_async(b"t", 1))
            await asyncio.sleep(0.01)
            pub.close()
            with pytest.raises(ValueError, match="closed"):
                await pending
            with pytest.raises(ValueError, match="closed"):
                pub.send_async(b"t", 1)
    run("asyncio", main())


def test_send_async_uses_the_publishers_encoder(endpoints):
    async def main():
        with upcall.Bus() as bus:
            ep = endpoints("inproc")
            sub, pub = pull_pair(bus, ep, pub_kw=dict(default=lambda o: sorted(o)))
            raw = bus.publisher(ep, kind="push", bind=False,
                                encoder=lambda o: upcall.packb({"raw": o}))
            await pub.send_async(b"t", {3, 1, 2})
            assert await take(sub, 1) == [[1, 2, 3]]
            await raw.send_async(b"t", 5)
            assert await take(sub, 1) == [{"raw": 5}]
            await sub.aclose()
    run("asyncio", main())


# ---- interoperability with pyzmq -------------------------------------------------

@pytest.mark.parametrize("loop_kind", LOOPS)
def test_pyzmq_publisher_to_subscribe_async(endpoints, loop_kind):
    zmq = pytest.importorskip("zmq")
    msgpack = pytest.importorskip("msgpack")
    n = 500

    async def main():
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        try:
            with upcall.Bus() as bus:
                ep = endpoints("tcp")
                sub = bus.subscribe_async(ep, kind="pull", bind=True, with_topic=True)
                s.connect(ep)
                for i in range(n):
                    s.send_multipart([b"px", msgpack.packb({"i": i, "s": "x" * (i % 7)})])
                got = await take(sub, n)
                assert got == [(b"px", {"i": i, "s": "x" * (i % 7)}) for i in range(n)]
                await sub.aclose()
        finally:
            s.close(0)
            ctx.term()
    run(loop_kind, main())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_send_async_to_pyzmq_subscriber(endpoints, loop_kind):
    zmq = pytest.importorskip("zmq")
    msgpack = pytest.importorskip("msgpack")

    async def main():
        ctx = zmq.Context()
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            with upcall.Bus() as bus:
                ep = endpoints("tcp")
                pub = bus.publisher(ep, bind=True)
                s.connect(ep)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + DEADLINE
                while not s.poll(0):       # slow joiner
                    assert loop.time() < deadline, "pyzmq never received a probe"
                    await pub.send_async(b"probe", None)
                    await asyncio.sleep(0.005)
                for i in range(100):
                    await pub.send_async(b"data", {"i": i})
                got = []
                while len(got) < 100:
                    assert loop.time() < deadline
                    if not s.poll(0):
                        await asyncio.sleep(0.002)
                        continue
                    topic, payload = s.recv_multipart()
                    if topic == b"data":
                        got.append(msgpack.unpackb(payload))
                assert got == [{"i": i} for i in range(100)]
        finally:
            s.close(0)
            ctx.term()
    run(loop_kind, main())
