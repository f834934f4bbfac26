"""asyncio: Publisher.send_async at the high-water mark waits on readiness
(the socket's fd and the publisher's wake-ups), never on a timer, and loses
nothing.  Real event loops (asyncio's, and uvloop's when installed), real
sockets and threads.

A timer would show as a call_later/call_at made by the sending task: the
event loops here count those.  No timing thresholds: every wait is for a
condition, with a generous deadline.
"""
import asyncio
import gc
import os
import threading

import pytest

import upcall
import upcall.aio
from helpers import DEADLINE, wait_for
from aio_helpers import LOOPS, take, until, uvloop


def counting_loop(kind):
    """An event loop of this kind that counts the timers (call_later,
    call_at) scheduled by the tasks in its ``watched`` set."""
    base = uvloop.Loop if kind == "uvloop" else asyncio.SelectorEventLoop

    class Counting(base):
        def __init__(self):
            super().__init__()
            self.watched = set()
            self.timers = 0

        def _count(self):
            if asyncio.current_task(self) in self.watched:
                self.timers += 1

        def call_later(self, *args, **kwargs):
            self._count()
            return super().call_later(*args, **kwargs)

        def call_at(self, *args, **kwargs):
            self._count()
            return super().call_at(*args, **kwargs)
    return Counting()


def eventfds():
    """This process's open eventfds (send_async's wait makes two)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]"
        except OSError:         # the listing's own fd, gone
            pass
    return n


def run_counting(kind, main):
    loop = counting_loop(kind)
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()


async def ticks(loop, n):
    """Let the event loop run n rounds of a 1 ms timer (the test's own task:
    not counted), so that a waiting send_async had every chance to retry."""
    for _ in range(n):
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("senders", [1, 4])
def test_send_async_waits_on_readiness_not_a_timer(endpoints, loop_kind, senders):
    # A bound PUSH with no peer: no room.  The waiting send_async tasks
    # schedule no timer and are not woken while nothing changes; a peer
    # connecting wakes every one of them, and each message arrives once.
    async def main(loop):
        with upcall.Bus() as bus:
            ep = endpoints("tcp")
            pub = bus.publisher(ep, kind="push", bind=True)
            woken = upcall.aio._send_wakeups
            tasks = [asyncio.ensure_future(pub.send_async(b"t", i)) for i in range(senders)]
            loop.watched.update(tasks)
            await ticks(loop, 100)
            assert not any(t.done() for t in tasks)
            assert loop.timers == 0
            # Nothing happened on the socket: no wake-up at all (one spare).
            assert upcall.aio._send_wakeups - woken <= 1
            sub = bus.subscribe_async(ep, kind="pull", bind=False)
            await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE)
            assert sorted(await take(sub, senders)) == list(range(senders))
            assert loop.timers == 0
            await sub.aclose()
    run_counting(loop_kind, main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_send_async_flood_at_the_mark_loses_nothing(endpoints, loop_kind):
    # High-water marks of 1 on both sides and a small queue: nearly every
    # send_async waits for the consumer (another task) to make room.  Every
    # message arrives, in order, and no sending task ever scheduled a timer.
    n = 3000

    async def main(loop):
        with upcall.Bus() as bus:
            ep = endpoints("tcp")
            sub = bus.subscribe_async(ep, kind="pull", bind=True, rcvhwm=1, queue_size=4,
                                      batch=2)
            pub = bus.publisher(ep, kind="push", bind=False, sndhwm=1)
            woken = upcall.aio._send_wakeups

            async def produce():
                for i in range(n):
                    await pub.send_async(b"t", {"i": i})
            producer = asyncio.ensure_future(produce())
            loop.watched.add(producer)
            got = await asyncio.wait_for(take(sub, n), DEADLINE)
            await asyncio.wait_for(producer, DEADLINE)
            assert [m["i"] for m in got] == list(range(n))
            assert loop.timers == 0
            assert upcall.aio._send_wakeups > woken     # it did wait at the mark
            st = sub.stats
            assert st["delivered"] == n and st["dropped"] == 0
            await sub.aclose()
    run_counting(loop_kind, main)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_send_async_woken_when_a_blocked_thread_lets_the_socket_go(endpoints, loop_kind):
    # Another thread's send blocked at the mark holds the socket; the
    # waiting send_async is woken when that send goes (the thread, not the
    # socket's fd, processed the room appearing), with no timer.
    async def main(loop):
        with upcall.Bus() as bus:
            ep = endpoints("inproc")
            pub = bus.publisher(ep, kind="push", bind=True)
            blocked = threading.Thread(target=pub.send, args=(b"t", "from the thread"),
                                       daemon=True)
            blocked.start()
            await ticks(loop, 20)
            task = asyncio.ensure_future(pub.send_async(b"t", "async"))
            loop.watched.add(task)
            await ticks(loop, 50)
            assert not task.done() and loop.timers == 0
            sub = bus.subscribe_async(ep, kind="pull", bind=False)
            await asyncio.wait_for(task, DEADLINE)
            assert sorted(await take(sub, 2)) == ["async", "from the thread"]
            blocked.join(DEADLINE)
            assert loop.timers == 0
            await sub.aclose()
    run_counting(loop_kind, main)


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("closer", ["publisher", "bus", "cancel"])
def test_a_waiting_send_async_ends_with_its_publisher(endpoints, loop_kind, closer):
    # Closing the publisher or the bus wakes the wait (ValueError: nothing
    # sent); cancelling ends it; the fds it watched are released either way.
    async def main(loop):
        bus = upcall.Bus()
        try:
            pub = bus.publisher(endpoints("inproc"), kind="push", bind=True)
            with pytest.raises(BlockingIOError):
                await pub.send_async(b"t", 0, timeout=0)
            gc.collect()
            base = eventfds()
            task = asyncio.ensure_future(pub.send_async(b"t", 1))
            await ticks(loop, 5)
            assert not task.done()
            assert eventfds() >= base + 2      # its own eventfd, and the socket's dup'ed
            if closer == "publisher":
                pub.close()
            elif closer == "bus":
                bus.close()
            else:
                task.cancel()
            with pytest.raises(asyncio.CancelledError if closer == "cancel" else ValueError):
                await asyncio.wait_for(task, DEADLINE)
            assert eventfds() <= base     # closing also released the publisher's own
        finally:
            bus.close()
    run_counting(loop_kind, main)


def test_send_async_woken_from_another_threads_event_loop(endpoints):
    # Two event loops on two threads wait on one publisher: each has its own
    # wake-up, so room for both wakes both.
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        pub = bus.publisher(ep, kind="push", bind=True)
        waiting = []
        done = []

        def other():
            async def main():
                task = asyncio.ensure_future(pub.send_async(b"t", "other"))
                waiting.append(task)
                await asyncio.wait_for(task, DEADLINE)
                done.append(True)
            asyncio.run(main())
        t = threading.Thread(target=other, daemon=True)
        t.start()
        wait_for(lambda: waiting, what="the other loop's send_async")

        async def main():
            task = asyncio.ensure_future(pub.send_async(b"t", "here"))
            await asyncio.sleep(0.01)
            sub = bus.subscribe_async(ep, kind="pull", bind=False)
            await asyncio.wait_for(task, DEADLINE)
            got = sorted(await asyncio.wait_for(take(sub, 2), DEADLINE))
            await sub.aclose()
            return got
        assert asyncio.run(main()) == ["here", "other"]
        t.join(DEADLINE)
        assert done == [True]
