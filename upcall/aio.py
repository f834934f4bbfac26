"""asyncio: ``async for msg in bus.subscribe_async(endpoint, ...)`` and the
waiting behind ``await publisher.send_async(topic, obj)``.  docs/asyncio.md.

How a message reaches a coroutine:

    delivery thread, never the GIL for a plain message (a topic and a
    payload): zmq receive and batching, then the bytes copied into the C
    hand-over queue (upcall/_aiter.pxi), one lock per batch; if the consumer
    waits, ONE write to an eventfd
      -> event loop (add_reader on the eventfd): the waiting __anext__
         resumes, takes a block of records (one lock) and decodes one
         message per __anext__, with no further wake-up until it is empty.

So the event loop is woken at most once per batch, not at all while the
consumer keeps up with a queue that never runs dry, and there is no GIL
hand-off between the two threads.  A message that is not plain
(out-of-band frames, a coalesced payload's fault, with_sender) is decoded
on the delivery thread with the GIL, as for any Handler taking batches,
and queued in its place as a list (_Bridge.on_batch).

Per message the event loop pays the decode and the consumer: __anext__ is a
C method returning a _Next, which gives a queued message when awaited
without a coroutine frame; ``sub.batches()`` decodes one batch into a list
with the collector held off.  Nothing decoded waits in the queue, so the
collector has nothing queued to walk.

A plain message's decode error is found, and on_error called, on the event
loop when the consumer reaches it; when that ends delivery the queue is
ended there (_stop_on_loop in _aiter.pxi) and the delivery loop stops at
its next batch.

The end of the stream has one path, _Bridge.finish, whatever ended it:
close() calls it (dropping what is queued), and the subscription's end hook
calls it on the delivery thread once the delivery loop has ended for any
reason (close, the bus closing, StopDelivery from on_error, the event loop
closed, a KeyboardInterrupt or SystemExit from the decoder or on_error).
The consumer takes what was queued before the end, then gets that exception
(once), then StopAsyncIteration.

The queue holds at most ``queue_size`` messages (plus the block the loop
is taking from).  When it is full:
  kind="pull"  the delivery thread waits until the batch fits (or the queue is
               empty): zmq queues behind it up to rcvhwm, then the senders'
               high-water mark pushes back on them.  Nothing is lost.
  kind="sub"   the messages that do not fit are dropped and counted in
               stats["dropped"]: a PUB socket drops for a slow subscriber
               anyway, and waiting would only move the loss into zmq.
Either way a full queue looks every 0.2 s (with the GIL) whether the event
loop was closed.

This module imports asyncio; ``import upcall`` does not import it.  It is
an adapter over the bus's public API: it depends on upcall._bus, never the
reverse (the bus's subscribe_async and send_async import it at their first
call, and use nothing of it but AsyncSubscription and send_when_ready).  The
hooks it uses are there for any async adapter: Bus.subscribe(options=...),
Subscription.set_end_hook, Publisher.try_send_packed, watch_room and
unwatch_room.  Its hot path is C in the same extension (upcall/_aiter.pxi:
the hand-over queue, which the trampoline fills for an _AsyncTarget without
the GIL; the _Next awaitable), private to this module.
"""
from __future__ import annotations

import asyncio
import logging
import os
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable

from upcall._bus import (StopDelivery, SubscribeOptions, _AsyncBatches, _AsyncMessages,
                         _anext_message, _AsyncTarget, _cancel_later, _later, _nothing,
                         _Pending, _take_armed)
from upcall.handler import Handler

if TYPE_CHECKING:
    from upcall._bus import Bus, Publisher, Subscription

__all__ = ["AsyncSubscription", "DEFAULT_QUEUE_SIZE", "SEND_WAIT_WARNING"]

#: Messages an AsyncSubscription queues for its event loop when queue_size=None.
DEFAULT_QUEUE_SIZE = 16384

class _Bridge(_AsyncTarget):
    """The subscription's target, between its delivery thread and the event loop.

    The hand-over queue is C (upcall/_aiter.pxi): the delivery thread fills
    it without the GIL and writes ``efd`` when the loop waits; ``readable``
    runs on the event loop when it was written.  ``on_batch`` (the
    delivery thread, with the GIL) queues what the trampoline decoded there
    (messages that are not plain); ``finish`` runs on any thread.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, queue_size: int,
                 wait_for_room: bool, efd: int, with_topic: bool,
                 max_inflated: int) -> None:
        self.batches = True
        self.loop = loop
        self.queue_size = queue_size
        self.wait_for_room = wait_for_room
        self.efd = efd
        self.waiter: asyncio.Future[None] | None = None   # what the consumer awaits
        self.error: BaseException | None = None   # what ended delivery, raised after the queue
        self._open_queue(queue_size, wait_for_room, efd, with_topic, max_inflated)

    def on_batch(self, msgs: list[Any]) -> None:
        # Messages decoded on the delivery thread (out-of-band frames, a
        # coalesced payload's fault, with_sender): queued in order with the
        # plain ones.
        if self.loop.is_closed():
            self.finish()
            raise StopDelivery
        self._queue_list(msgs)

    def _loop_open(self) -> bool:
        """The delivery thread, with the GIL, every 0.2 s of a full queue:
        False (and the end) once the event loop is closed."""
        if self.loop.is_closed():
            self.finish()
            return False
        return True

    def readable(self) -> None:
        """The eventfd was written: wake the waiting consumer."""
        try:
            os.read(self.efd, 8)
        except (BlockingIOError, OSError):
            pass
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def finish(self, exc: BaseException | None = None, discard: bool = False) -> None:
        """The end of the stream, whatever ended it: queue nothing more;
        wake a delivery thread waiting for room and the consumer waiting for
        messages (the eventfd).  ``exc``: the KeyboardInterrupt, SystemExit...
        that ended delivery, raised in the consumer once it has taken what is
        queued.  ``discard`` (close): drop what is queued."""
        if exc is not None and self.error is None:
            self.error = exc
        self._end(discard)

    def release_fd(self) -> None:
        """Stop watching the eventfd and close it, on the loop's thread (a
        selector's registration is not thread-safe)."""
        efd = self.efd
        if efd < 0:
            return
        loop = self.loop
        if not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                try:
                    loop.call_soon_threadsafe(self.release_fd)
                    return
                except RuntimeError:        # closed just now
                    pass
            else:
                loop.remove_reader(efd)
                # The end's write to the eventfd is not read any more: wake
                # the waiting consumer here, to find the end.
                waiter, self.waiter = self.waiter, None
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
        self.efd = -1
        self._forget_fd()
        os.close(efd)


class AsyncSubscription:
    """Messages of one subscription, for ``async for`` on the event loop that
    made it.  Made by :meth:`upcall.Bus.subscribe_async`.

    ``async for msg in sub`` yields each message (``(topic, msg)`` with
    ``with_topic=True``) in the order received.  Iteration ends when the
    subscription is closed: by :meth:`aclose`/:meth:`close`, by leaving
    ``async with``, by closing the bus, or when its event loop is closed.
    Closing discards what is still queued.  Cancelling the task waiting in
    it (e.g. ``asyncio.wait_for``'s timeout) does not: nothing was taken,
    and the next ``__anext__`` gets the next message.

    It also ends when the delivery loop ends by itself, after the messages
    queued before that end: with ``StopAsyncIteration`` when ``on_error``
    raised :class:`upcall.StopDelivery`; by raising, once, the
    ``KeyboardInterrupt`` or ``SystemExit`` that ``on_error`` or the
    ``decoder`` raised on the delivery thread (it is not also printed as
    unraisable).
    """

    def __init__(self, bus: Bus, endpoint: str | list[str] | tuple[str, ...],
                 queue_size: int | None, options: SubscribeOptions,
                 _open: Callable[[Handler], Subscription] | None = None) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("subscribe_async() must be called from a coroutine: it "
                               "delivers to the running event loop") from None
        if queue_size is None:
            queue_size = DEFAULT_QUEUE_SIZE
        elif not isinstance(queue_size, int) or isinstance(queue_size, bool):
            raise TypeError(f"queue_size must be an int or None, not {type(queue_size).__name__}")
        elif queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, not {queue_size!r}")
        efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            self._bridge = _Bridge(loop, queue_size, options.kind == "pull", efd,
                                   options.with_topic, options.max_batch_decompressed)
        except BaseException:
            os.close(efd)
            raise
        loop.add_reader(efd, self._bridge.readable)
        try:
            self._sub: Subscription = (bus.subscribe(endpoint, self._bridge, options=options)
                                       if _open is None else _open(self._bridge))
        except BaseException:
            self._bridge.finish()
            self._bridge.release_fd()
            raise
        # The block being decoded and the C __anext__ (upcall/_aiter.pxi).
        self._pending = _Pending()
        self._pending.bind(self._bridge, self._sub)
        # Every end of the delivery loop ends the iteration, through finish.
        self._sub.set_end_hook(self._bridge.finish)

    def __repr__(self) -> str:
        return f"<upcall.aio.AsyncSubscription of {self._sub!r}>"

    # ---- iteration (on the event loop's thread) ----

    def __aiter__(self) -> Any:
        # A C iterator: its __anext__ makes no coroutine while messages are
        # queued.  It holds this subscription while the loop runs.
        return _AsyncMessages(self._pending, self)

    def __anext__(self) -> Any:
        return _anext_message(self._pending, self)

    def batches(self) -> Any:
        """``async for batch in sub.batches()``: the messages queued at each
        wake-up as one list (in order, never empty), for consumers that
        want the floor.  Backpressure, drops, cancellation and the end are
        those of ``async for msg in sub``, which it may be mixed with."""
        return _AsyncBatches(self._pending, self)

    def _ended(self) -> None:
        """The queue has ended and is empty: what ended delivery (once),
        then StopAsyncIteration.  Called by the C iterator."""
        bridge = self._bridge
        exc, bridge.error = bridge.error, None
        if exc is not None:
            raise exc
        raise StopAsyncIteration

    async def _wait(self, whole: bool) -> Any:
        """Wait for a message (nothing queued now): the next message, or with
        ``whole`` the next list."""
        bridge = self._bridge
        while True:
            # With nothing queued, the next message queued writes the eventfd.
            got = _take_armed(self._pending, self, whole)
            if got is not _nothing:
                return got
            if bridge.waiter is not None:
                raise RuntimeError("another task is already waiting for this "
                                   "subscription's next message")
            if asyncio.get_running_loop() is not bridge.loop:
                raise RuntimeError("an AsyncSubscription belongs to the event loop "
                                   "that made it")
            waiter = bridge.waiter = bridge.loop.create_future()
            try:
                await waiter
            except asyncio.CancelledError:
                # Nothing was taken (messages are taken above, never across
                # an await): the subscription stays open and the next
                # __anext__ gets what would have come now (wait_for's
                # timeout is a cancellation).  A wake-up still pending
                # finds no waiter, or the next one, which looks again.
                if bridge.waiter is waiter:
                    bridge.waiter = None
                raise

    # ---- closing ----

    def close(self, timeout: float | None = None) -> None:
        """Stop delivery, end the iteration and wait for the delivery loop to
        end (usually well under a millisecond: at most one batch being
        decoded).  TimeoutError after ``timeout`` seconds, as Subscription.close."""
        self._bridge.finish(discard=True)
        self._pending.clear()
        try:
            self._sub.close(timeout)
        finally:
            self._bridge.release_fd()

    async def aclose(self) -> None:
        """close(), from a coroutine."""
        self.close()

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, t: type[BaseException] | None, v: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        # Dropped without being closed (e.g. `async for` over a temporary that
        # was left with break): close, so its thread and socket go too.
        sub = getattr(self, "_sub", None)      # None: __init__ failed
        if sub is not None and not sub.closed:
            try:
                self.close()
            except Exception:
                pass

    # ---- what it is ----

    @property
    def closed(self) -> bool:
        """True once closed, or once delivery has ended (e.g. its event loop closed)."""
        return self._bridge._counts()[5] or self._sub.closed

    @property
    def stats(self) -> dict[str, int]:
        """The subscription's counters (see Subscription.stats), where
        ``delivered`` counts the messages queued for the event loop (less
        those the loop found undecodable, and those discarded at the end)
        and ``dropped`` includes those the full queue dropped (kind="sub")
        and those discarded; and ``queued`` (waiting for the consumer now),
        ``queued_bytes`` (the bytes the queue holds for them now: the
        records of the plain messages, one copy of a topic per zmq message
        and none without with_topic) and ``wakeups`` (event-loop wake-ups
        so far, at most one per batch)."""
        stats = self._sub.stats
        bridge = self._bridge
        accepted, dropped, wakeups, queued, queued_bytes, _ = bridge._counts()
        discarded = bridge.discarded
        stats["delivered"] = accepted - bridge.loop_errors - discarded
        stats["dropped"] += dropped + discarded
        stats["queued"] = queued + self._pending.count
        stats["wakeups"] = wakeups
        stats["queued_bytes"] = queued_bytes
        return stats

    def streams(self) -> dict[int, dict[str, int]]:
        """What arrived of each stamped stream (see Subscription.streams)."""
        return self._sub.streams()

    @property
    def queue_size(self) -> int:
        return self._bridge.queue_size

    @property
    def endpoint(self) -> str:
        return self._sub.endpoint

    @property
    def last_endpoint(self) -> str:
        """The endpoint as bound or connected (a tcp port 0 or * resolved)."""
        return self._sub.last_endpoint

    @property
    def thread_name(self) -> str | None:
        """Name of the delivery thread."""
        return self._sub.thread_name

    @property
    def peers(self) -> int | None:
        """Connections up now (Subscription.peers; docs/events.md)."""
        return self._sub.peers

    @property
    def connected(self) -> bool | None:
        """True while at least one connection is up (Subscription.connected)."""
        return self._sub.connected


#: Seconds a send_async may wait before a WARNING on the "upcall" logger says
#: why (no peer connected, or a full queue): a send with no timeout to a
#: publisher that nothing ever connects to would otherwise wait in silence.
#: Said once per publisher, from a thread of upcall's (no timer on the event
#: loop: its wait is readiness only); None: never.
SEND_WAIT_WARNING: float | None = 5.0

_log = logging.getLogger("upcall")
# The publishers whose waiting send_async was already reported.
_warned_waits: weakref.WeakSet[Publisher] = weakref.WeakSet()


def _warn_waiting(pub: Publisher, waited: float) -> None:
    """A send_async has waited ``waited`` seconds: say so, once per publisher."""
    if pub.closed or pub in _warned_waits:
        return
    _warned_waits.add(pub)
    _log.warning("publisher %s: send_async has waited %g s and goes on waiting (%s); "
                 "pass timeout= to give up", pub.last_endpoint, waited, _why_blocked(pub))


# How often send_async's wait was woken before the message went (all
# publishers): the test of the readiness wait reads it.
_send_wakeups = 0


def _drain(efd: int) -> None:
    try:
        os.read(efd, 8)
    except BlockingIOError:         # not signalled (woken by the socket's fd)
        pass


def _why_blocked(pub: Publisher) -> str:
    """Why a send cannot go now: nobody to send to, or a full queue."""
    if not pub.closed and pub.peers == 0:
        return "no peer connected: nothing has connected to or accepted this publisher"
    return "high-water mark reached"


async def send_when_ready(pub: Publisher, topic: Any, payload: bytes,
                          timeout: float | None) -> None:
    """Publisher.send_async's awaitable: send now if the socket takes it,
    else wait on the event loop (other coroutines run meanwhile) until the
    socket may have room, and try again; until sent, or until ``timeout``
    seconds have passed.

    The wait is readiness, not a timer: the loop watches the socket's
    ZMQ_FD (room appearing is a command for the socket) and an eventfd the
    C core signals after another sender used the socket (it may have taken
    that wake-up, or left room).  A try that finds the mark processes the
    socket's commands, so ZMQ_FD fires again only when something changes.
    csrc/bus.h, uc_pub_watch."""
    global _send_wakeups
    if pub.try_send_packed(topic, payload):
        return
    if timeout == 0:
        raise BlockingIOError(f"send_async would block ({_why_blocked(pub)})")
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] | None = None
    expired = False

    def ready() -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def expire() -> None:
        nonlocal expired
        expired = True
        ready()

    efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    zfd = -1
    timer = warning = None
    try:
        zfd = pub.watch_room(efd)
        loop.add_reader(efd, ready)
        loop.add_reader(zfd, ready)
        if timeout is not None:
            timer = loop.call_later(timeout, expire)
        warn_after = SEND_WAIT_WARNING
        if warn_after is not None and (timeout is None or timeout > warn_after) \
                and pub not in _warned_waits:
            warning = _later(warn_after, _warn_waiting, pub, warn_after)
        while True:
            waiter = loop.create_future()
            # Watched before this try: room made after it wakes the waiter.
            if pub.try_send_packed(topic, payload):
                return
            if expired:
                raise TimeoutError(f"send_async did not complete within {timeout} s "
                                   f"({_why_blocked(pub)})")
            await waiter
            _send_wakeups += 1
            _drain(efd)
    finally:
        if timer is not None:
            timer.cancel()
        if warning is not None:
            _cancel_later(warning)
        if zfd >= 0:
            loop.remove_reader(zfd)
            loop.remove_reader(efd)
            os.close(zfd)
        pub.unwatch_room(efd)
        os.close(efd)
