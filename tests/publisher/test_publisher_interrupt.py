"""Ctrl-C during a send() blocked at the high-water mark.

The send waits in signal slices: SIGINT raises KeyboardInterrupt in it, the
interrupted message is not sent at all (never its topic frame alone: a zmq
message's frames go out together or not at all), and the publisher keeps
working.
"""
import _thread
import os
import signal
import threading

import pytest

import upcall
from helpers import DEADLINE, Collector

pytestmark = pytest.mark.threads


def interrupter(how):
    """Deliver Ctrl-C to the main thread: a real SIGINT (which also makes
    blocking system calls return EINTR), or only Python's "signal arrived"
    flag (interrupt_main), which the wait must notice on its own."""
    if how == "sigint":
        return lambda: os.kill(os.getpid(), signal.SIGINT)
    return _thread.interrupt_main


def fill(pub, n_max=10_000):
    """Send until the high-water mark is reached; the messages sent."""
    sent = []
    for i in range(n_max):
        try:
            pub.send(b"fill", i, timeout=0)
        except BlockingIOError:
            return sent
        sent.append(i)
    raise AssertionError(f"no high-water mark reached after {n_max} messages")


@pytest.mark.parametrize("how", ["sigint", "interrupt_main"])
@pytest.mark.parametrize("method", ["send", "send_packed"])
def test_ctrl_c_interrupts_a_send_blocked_at_the_high_water_mark(endpoints, how, method):
    col = Collector()
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        # A peer that does not read (caller mode, not polled) with small marks:
        # the pipe fills after a few messages and the next send blocks.
        sub = bus.subscribe(ep, col, kind="pull", bind=True, delivery="caller", rcvhwm=1,
                            with_topic=True)
        pub = bus.publisher(ep, kind="push", bind=False, sndhwm=1)
        queued = fill(pub)
        send = pub.send if method == "send" else pub.send_packed
        lost = {"interrupted": True} if method == "send" else upcall.packb({"interrupted": True})
        timer = threading.Timer(0.2, interrupter(how))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                send(b"interrupted", lost, timeout=DEADLINE)
        finally:
            timer.cancel()
            timer.join()
        # Still usable: a send after the interrupt goes out (once the peer reads).
        assert not pub.closed
        after = threading.Thread(target=pub.send, args=(b"after", "after"))
        after.start()
        while len(col) < len(queued) + 1:
            sub.poll(timeout=0.05)
        after.join(DEADLINE)
        assert not after.is_alive()
        stats = sub.stats
    # Every message arrived whole; the interrupted one not at all.
    assert stats["decode_errors"] == 0
    assert col.items == [(b"fill", i) for i in queued] + [(b"after", "after")]


def test_a_send_timeout_at_the_mark_still_raises_timeout_error(endpoints):
    # Waiting in slices keeps the timeout: a send that cannot go out within
    # it raises TimeoutError, timeout=0 BlockingIOError.
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), kind="push", bind=True)   # no peer: never sendable
        with pytest.raises(TimeoutError):
            pub.send(b"t", 1, timeout=0.5)
        with pytest.raises(BlockingIOError):
            pub.send(b"t", 1, timeout=0)
        assert not pub.closed
