"""Receiving without a callback: a caller-mode subscription opened without a
target gives its messages to sub.recv(timeout) and to `for msg in sub`;
poll() on one with a target returns as soon as it delivered a batch.

Real sockets (inproc, ipc, tcp) and pyzmq peers for interop.  No timing
thresholds: a call that must return early is given no timeout at all (or
30 s) and must return before the test's own deadline.
"""
import _thread
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import msgpack
import pytest
import zmq

import upcall
from helpers import DEADLINE, free_tcp_port, script_env, wait_for
from bus_pair import STATE_ERRORS, pair
from helpers import Collector

pytestmark = pytest.mark.threads

TRANSPORTS = ["inproc", "ipc", "tcp"]


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def endpoint(transport, tmp_path):
    if transport == "inproc":
        return "inproc://recv-%d" % time.monotonic_ns()
    if transport == "ipc":
        return "ipc://%s" % (tmp_path / "recv.sock")
    return "tcp://127.0.0.1:%d" % free_tcp_port()


def pull(bus, ctx, transport, tmp_path, **kw):
    """A targetless caller-mode PULL bound at an endpoint, and a pyzmq PUSH
    connected to it (the zmq context is shared for inproc)."""
    ep = endpoint(transport, tmp_path)
    if transport == "inproc":
        sub = bus.subscribe(ep, kind="pull", bind=True, delivery="caller", **kw)
        return sub, None
    sub = bus.subscribe(ep, kind="pull", bind=True, delivery="caller", **kw)
    push = ctx.socket(zmq.PUSH)
    push.connect(sub.last_endpoint)
    return sub, push


def pusher(bus, sub, ctx, push):
    """send(frames) to sub: pyzmq's PUSH, or for inproc upcall's own."""
    if push is not None:
        return push.send_multipart
    pub = bus.publisher(sub.last_endpoint, kind="push", bind=False)
    return lambda frames: pub.send_packed(frames[0] if len(frames) > 1 else b"", frames[-1])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_recv_returns_a_flood_in_order_without_loss(transport, ctx, tmp_path):
    n = 20_000
    with upcall.Bus() as bus:
        sub, push = pull(bus, ctx, transport, tmp_path, rcvhwm=0)
        send = pusher(bus, sub, ctx, push)

        def flood():
            for i in range(n):
                send([msgpack.packb(i)])

        sender = threading.Thread(target=flood)
        sender.start()
        got = [sub.recv(timeout=DEADLINE) for _ in range(n)]
        sender.join(DEADLINE)
        assert got == list(range(n))
        with pytest.raises(TimeoutError):
            sub.recv(timeout=0)
        st = sub.stats
        assert (st["received"], st["delivered"], st["dropped"]) == (n, n, 0)
        assert not sub.closed
        sub.close()
    if push is not None:
        push.close(0)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_recv_timeout_keeps_the_subscription_and_the_next_message(transport, ctx, tmp_path):
    with upcall.Bus() as bus:
        sub, push = pull(bus, ctx, transport, tmp_path)
        send = pusher(bus, sub, ctx, push)
        with pytest.raises(TimeoutError, match="stays open"):
            sub.recv(timeout=0.05)
        with pytest.raises(TimeoutError):
            sub.recv(timeout=0)
        assert not sub.closed
        send([msgpack.packb("a")])
        send([msgpack.packb("b")])
        assert sub.recv(timeout=DEADLINE) == "a"
        assert sub.recv(timeout=DEADLINE) == "b"
        with pytest.raises(TimeoutError):
            sub.recv(timeout=0.05)
        send([msgpack.packb("c")])
        assert sub.recv(timeout=DEADLINE) == "c"
        sub.close()
    if push is not None:
        push.close(0)


def test_with_topic_decoder_and_raw(ctx):
    port = free_tcp_port()
    pub = ctx.socket(zmq.PUB)
    pub.bind("tcp://127.0.0.1:%d" % port)
    ep = "tcp://127.0.0.1:%d" % port
    with upcall.Bus() as bus:
        topical = bus.subscribe(ep, delivery="caller", with_topic=True, topics=[b"t."])
        decoded = bus.subscribe(ep, delivery="caller", topics=[b"d."],
                                decoder=lambda b: b.decode()[::-1])
        raw = bus.subscribe(ep, delivery="caller", topics=[b"r."], raw=True)
        cases = [(topical, [b"t.a", msgpack.packb({"x": 1})], (b"t.a", {"x": 1})),
                 (decoded, [b"d.a", b"olleh"], "hello"),
                 (raw, [b"r.a", b"\xc1raw"], b"\xc1raw")]
        for sub, frames, expected in cases:
            deadline = time.monotonic() + DEADLINE
            while True:                     # slow joiner: resend until one arrives
                assert time.monotonic() < deadline
                pub.send_multipart(frames)
                try:
                    assert sub.recv(timeout=0.05) == expected
                    break
                except TimeoutError:
                    pass
    pub.close(0)


@pytest.mark.parametrize("copy", [False, True])
def test_out_of_band_values_follow_copy(copy):
    ep = "inproc://recv-oob-%s" % copy
    big = bytes(range(256)) * 256
    with upcall.Bus() as bus:
        sub = bus.subscribe(ep, kind="pull", bind=True, delivery="caller", copy=copy)
        pub = bus.publisher(ep, kind="push", bind=False, oob_threshold=1024)
        pub.send(b"", {"blob": big})
        msg = sub.recv(timeout=DEADLINE)
        assert type(msg["blob"]) is (bytes if copy else memoryview)
        assert bytes(msg["blob"]) == big
        sub.close()


def test_a_message_that_does_not_decode_is_reported_and_skipped(ctx):
    errors = []
    with upcall.Bus() as bus:
        port = free_tcp_port()
        sub = bus.subscribe("tcp://127.0.0.1:%d" % port, kind="pull", bind=True,
                            delivery="caller", on_error=lambda exc, m: errors.append(m))
        push = ctx.socket(zmq.PUSH)
        push.connect(sub.last_endpoint)
        push.send(b"\xc1")                    # never valid msgpack
        push.send(msgpack.packb("good"))
        assert sub.recv(timeout=DEADLINE) == "good"
        assert errors == [b"\xc1"]
        assert sub.stats["decode_errors"] == 1
        sub.close()
    push.close(0)


@pytest.mark.parametrize("how", ["subscription", "bus"])
def test_iteration_ends_when_closed_from_another_thread(how, ctx):
    got = []
    ended = threading.Event()
    with upcall.Bus() as bus:
        port = free_tcp_port()
        sub = bus.subscribe("tcp://127.0.0.1:%d" % port, kind="pull", bind=True,
                            delivery="caller")
        push = ctx.socket(zmq.PUSH)
        push.connect(sub.last_endpoint)

        def consume():
            for msg in sub:
                got.append(msg)
            ended.set()

        t = threading.Thread(target=consume)
        t.start()
        for i in range(5):
            push.send(msgpack.packb(i))
        wait_for(lambda: len(got) == 5, what="5 messages iterated")
        assert not ended.is_set()
        (sub if how == "subscription" else bus).close()
        t.join(DEADLINE)
        assert not t.is_alive() and ended.is_set()
        assert got == list(range(5))
        assert sub.closed
        assert list(sub) == []              # a closed one iterates nothing
        with pytest.raises(ValueError, match="closed"):
            sub.recv(timeout=0)
    push.close(0)


def test_recv_waiting_when_closed_raises(ctx):
    with upcall.Bus() as bus:
        sub = bus.subscribe("inproc://recv-closing", kind="pull", bind=True, delivery="caller")
        out = []

        def receive():
            try:
                sub.recv()
            except BaseException as exc:
                out.append(exc)

        t = threading.Thread(target=receive)
        t.start()
        wait_for(lambda: t.is_alive())
        sub.close()
        t.join(DEADLINE)
        assert not t.is_alive()
        # Either closed before recv looked (ValueError at once) or while it waited.
        assert len(out) == 1 and isinstance(out[0], ValueError), out


@contextlib.contextmanager
def sigint_after(delay=0.3):
    main = threading.main_thread().ident
    timer = threading.Timer(delay, lambda: signal.pthread_kill(main, signal.SIGINT))
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            yield
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGINT, old)


def test_ctrl_c_in_recv_keeps_the_subscription():
    ep = "inproc://recv-sigint"
    with upcall.Bus() as bus:
        sub = bus.subscribe(ep, kind="pull", bind=True, delivery="caller")
        pub = bus.publisher(ep, kind="push", bind=False)
        with sigint_after():
            sub.recv()                      # no timeout: only Ctrl-C ends it
        pub.send(b"", 1)
        assert sub.recv(timeout=DEADLINE) == 1
        sub.close()


CHILD = r"""
import sys, upcall
with upcall.Bus() as bus:
    sub = bus.subscribe("tcp://127.0.0.1:%d", kind="pull", bind=True, delivery="caller")
    pub = bus.publisher(sub.last_endpoint, kind="push", bind=False)
    pub.send(b"", "first")
    try:
        for msg in sub:
            print(msg, flush=True)
    except KeyboardInterrupt:
        print("interrupted", sub.closed, flush=True)
        sys.exit(0)
    print("iteration ended", flush=True)
"""


def test_ctrl_c_during_iteration_in_a_child_process():
    proc = subprocess.Popen([sys.executable, "-c", CHILD % free_tcp_port()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=script_env(), cwd=tempfile.gettempdir())
    try:
        assert proc.stdout.readline() == "first\n"     # iterating now, blocked
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out == "interrupted False\n", (out, err)


# ---- poll() returns once it delivered something -----------------------------

def _poll_in_thread(sub, **kw):
    out = []
    t = threading.Thread(target=lambda: out.append(sub.poll(**kw)))
    t.start()
    return t, out


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_poll_returns_as_soon_as_it_delivered(transport, ctx, tmp_path):
    # Before: poll() filled its whole timeout; with none (or 30 s) it would
    # not have returned before this test's deadline.
    got = []
    ep = endpoint(transport, tmp_path)
    with upcall.Bus() as bus:
        sub = bus.subscribe(ep, got.append, kind="pull", bind=True, delivery="caller",
                            batch=4)
        if transport == "inproc":
            pub = bus.publisher(ep, kind="push", bind=False)
            send = lambda obj: pub.send(b"", obj)
        else:
            push = ctx.socket(zmq.PUSH)
            push.connect(sub.last_endpoint)
            send = lambda obj: push.send(msgpack.packb(obj))
        # Nothing queued: it waits, and returns with the first message.
        t, out = _poll_in_thread(sub, timeout=None)
        send(0)
        t.join(DEADLINE)
        alive = t.is_alive()
        if alive:
            sub.close()                     # ends the poll: the test fails below
            t.join(DEADLINE)
        assert not alive, "poll() did not return after delivering a message"
        assert out == [1] and got == [0]
        # Queued: one batch at a time (batch=4), then max_messages.
        for i in range(1, 11):
            send(i)
        deadline = time.monotonic() + DEADLINE
        while len(got) < 11:
            assert time.monotonic() < deadline
            assert 1 <= sub.poll(timeout=30.0, max_messages=3) <= 3
        assert got == list(range(11))
        sub.close()
        if transport != "inproc":
            push.close(0)


def test_poll_returns_one_batch_of_what_is_queued():
    ep = "inproc://recv-poll-batch"
    got = []
    with upcall.Bus() as bus:
        sub = bus.subscribe(ep, got.append, kind="pull", bind=True, delivery="caller", batch=4)
        pub = bus.publisher(ep, kind="push", bind=False)
        for i in range(10):
            pub.send(b"", i)                # inproc: queued once send returns
        assert sub.poll(timeout=30.0) == 4
        assert sub.poll(timeout=30.0) == 4
        assert sub.poll(timeout=30.0) == 2
        assert sub.poll(timeout=0) == 0
        assert got == list(range(10))
        sub.close()


def test_poll_with_a_pyzmq_pub_peer(ctx):
    got = []
    port = free_tcp_port()
    pub = ctx.socket(zmq.PUB)
    pub.bind("tcp://127.0.0.1:%d" % port)
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:%d" % port, got.append, delivery="caller",
                            topics=[b"t."])
        deadline = time.monotonic() + DEADLINE
        while not got:                      # slow joiner
            assert time.monotonic() < deadline
            pub.send_multipart([b"t.x", msgpack.packb("hi")])
            sub.poll(timeout=0.05)
        t, out = _poll_in_thread(sub, timeout=None)
        pub.send_multipart([b"t.x", msgpack.packb("again")])
        t.join(DEADLINE)
        alive = t.is_alive()
        if alive:
            sub.close()
            t.join(DEADLINE)
        assert not alive and out and out[0] >= 1
        assert got[-1] == "again"
        sub.close()
    pub.close(0)


# ---- bad arguments and the wrong kind of subscription ------------------------

def test_wrong_subscriptions_and_arguments():
    with upcall.Bus() as bus:
        with pytest.raises(TypeError, match="delivery='caller'"):
            bus.subscribe("inproc://recv-bad-0")
        threaded = bus.subscribe("inproc://recv-bad-1", lambda m: None, kind="pull", bind=True)
        with pytest.raises(ValueError, match="own thread"):
            threaded.recv(timeout=0)
        with pytest.raises(ValueError, match="own thread"):
            iter(threaded)
        with_target = bus.subscribe("inproc://recv-bad-2", lambda m: None, kind="pull",
                                    bind=True, delivery="caller")
        with pytest.raises(ValueError, match="poll()"):
            with_target.recv(timeout=0)
        with pytest.raises(ValueError, match="poll()"):
            next(with_target)
        sub = bus.subscribe("inproc://recv-bad-3", kind="pull", bind=True, delivery="caller")
        with pytest.raises(ValueError, match="recv()"):
            sub.poll(timeout=0)
        with pytest.raises(ValueError, match="timeout"):
            sub.recv(timeout=-1)
        with pytest.raises(TypeError, match="timeout"):
            sub.recv(timeout="1")
        assert iter(sub) is sub
        sub.close()
        with pytest.raises(ValueError, match="closed"):
            sub.recv()
        with pytest.raises(StopIteration):
            next(sub)


# --- caller mode: poll --------------------------------------------------------------

def test_poll_counts_malformed_messages_as_taken_in(endpoints):
    # poll() returns (and max_messages bounds) the messages taken in: those
    # handed to the target and those counted as decode errors, as documented.
    import zmq
    ep = endpoints("ipc")
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.bind(ep)
    got, errors = [], []
    try:
        with upcall.Bus() as bus:
            sub = bus.subscribe(ep, got.append, kind="pull", delivery="caller",
                                on_error=lambda exc, raw: errors.append(exc))
            for payload in (b"\xc1", b"\x01", b"\xc1", b"\x02"):   # 0xc1: never valid
                push.send_multipart([b"t", payload])
            n = 0
            while n < 4:
                k = sub.poll(timeout=DEADLINE, max_messages=4 - n)
                assert k > 0
                n += k
            assert n == 4 and got == [1, 2] and len(errors) == 2
            assert sub.stats["decode_errors"] == 2 and sub.stats["delivered"] == 2
    finally:
        push.close(0)
        ctx.term()


def test_poll_counts_and_max_messages(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "pull", "caller", col) as (pub, sub, _):
        assert sub.thread_name is None
        assert sub.poll(timeout=0) == 0
        for i in range(10):
            pub.send(b"t", i)
        assert sub.poll(timeout=DEADLINE, max_messages=3) == 3
        assert col.items == [0, 1, 2]
        assert sub.poll(timeout=DEADLINE, max_messages=7) == 7
        assert col.items == list(range(10))
        assert sub.poll(timeout=0.01) == 0
        assert sub.stats["delivered"] == 10


def test_poll_from_another_thread(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "pull", "caller", col) as (pub, sub, _):
        for i in range(5):
            pub.send(b"t", i)
        out = []
        t = threading.Thread(target=lambda: out.append(sub.poll(timeout=DEADLINE, max_messages=5)))
        t.start()
        t.join(DEADLINE)
        assert out == [5]
        assert col.items == list(range(5))


def test_long_poll_lets_keyboard_interrupt_through(endpoints):
    # interrupt_main() only sets the "signal arrived" flag (no real signal, no
    # EINTR): poll must notice it on its own periodic wake-ups.
    with pair(endpoints, "inproc", "pull", "caller", Collector()) as (pub, sub, _):
        timer = threading.Timer(0.3, _thread.interrupt_main)
        try:
            with pytest.raises(KeyboardInterrupt):
                timer.start()     # inside: even a late timer cannot land outside
                sub.poll(timeout=DEADLINE)
        finally:
            timer.cancel()
            timer.join()
        # still usable afterwards
        pub.send(b"t", 7)
        assert sub.poll(timeout=DEADLINE, max_messages=1) == 1


@pytest.mark.parametrize("mode", ["native", "python"])
def test_poll_on_thread_mode_subscription_raises(endpoints, mode):
    with pair(endpoints, "inproc", "pull", mode, Collector()) as (pub, sub, _):
        with pytest.raises(STATE_ERRORS):
            sub.poll(timeout=0)
