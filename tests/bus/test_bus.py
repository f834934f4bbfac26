"""The bus end to end: real libzmq sockets (inproc, ipc, tcp), real threads.

Every wait is on a condition with a generous deadline (helpers.DEADLINE); no
sleep-and-hope and no timing thresholds.  PUB/SUB tests first send probes
until one arrives (slow joiner), with unlimited high-water marks on both
sides so nothing is dropped afterwards.
"""
import _thread
import contextlib
import logging
import re
import sys
import threading

import pytest

import upcall
from upcall._bus import _synthetic_subscribe
from helpers import (
    DEADLINE, KINDS, MODES, PROBE_TOPIC, STATS_KEYS, TRANSPORTS, Collector, Sender,
    fd_count, make_msg, make_pump, mode_kwargs, thread_count, wait_for, warm_up,
)

# Assumption (the .pyi does not name the type): using a closed Subscription,
# Publisher or Bus, or polling a thread-mode subscription, is a misuse of the
# object's state and raises ValueError, like I/O on a closed file.
STATE_ERRORS = ValueError


def assert_same_sequence(got, expected):
    """got == expected, with a readable message for long sequences."""
    if got == expected:
        return
    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            raise AssertionError(
                "sequences differ first at index %d of %d (got %d items): got %r, expected %r"
                % (i, len(expected), len(got), g, e))
    raise AssertionError("got %d items, expected %d (common prefix equal); extra/last: %r"
                         % (len(got), len(expected), (got[len(expected):] or got[-3:])[:3]))


def wait_stats(sub, **expected):
    """Wait until sub.stats has the expected values; return the stats."""
    last = {}

    def check():
        last.update(sub.stats)
        return all(last[k] == v for k, v in expected.items())
    wait_for(check, what=lambda: "stats %r to reach %r" % (last, expected))
    return dict(last)


@contextlib.contextmanager
def pair(endpoints, transport, kind, mode, target, *, sub_bind=False, **sub_kw):
    """Open a publisher and a subscription connected over ``transport``.

    inproc uses one Bus for both (inproc needs one zmq context); ipc and tcp
    use two buses.  SUB gets rcvhwm=0 and PUB sndhwm=0 (unlimited).  Yields
    (pub, sub, pump) with pump None in thread mode.
    """
    ep = endpoints(transport)
    kw = dict(mode_kwargs(mode))
    kw.update(sub_kw)
    pub_kw = {}
    if kind == "sub":
        kw.setdefault("rcvhwm", 0)
        pub_kw["sndhwm"] = 0
    pub_kind = "pub" if kind == "sub" else "push"
    with contextlib.ExitStack() as stack:
        sbus = stack.enter_context(upcall.Bus())
        pbus = sbus if transport == "inproc" else stack.enter_context(upcall.Bus())
        if sub_bind:
            sub = stack.enter_context(sbus.subscribe(ep, target, kind=kind, bind=True, **kw))
            pub = stack.enter_context(pbus.publisher(ep, kind=pub_kind, bind=False, **pub_kw))
        else:
            pub = stack.enter_context(pbus.publisher(ep, kind=pub_kind, bind=True, **pub_kw))
            sub = stack.enter_context(sbus.subscribe(ep, target, kind=kind, **kw))
        pump = make_pump(sub) if mode == "caller" else None
        yield pub, sub, pump


def stream(endpoints, mode, kind, transport, n, *, sub_bind=False, **sub_kw):
    """Publish n messages and check each arrives once, in order, equal."""
    col = Collector()
    with pair(endpoints, transport, kind, mode, col, sub_bind=sub_bind, **sub_kw) as (pub, sub, pump):
        if kind == "sub":
            warm_up(pub, col, pump)
        expected = [make_msg(i) for i in range(n)]
        sender = Sender(pub, [(b"data", m) for m in expected])
        sender.start()
        col.wait(n, pump=pump)
        sender.finish()
        # The counters are updated around the target calls (per batch): wait
        # for them to account for every call made so far.
        stats = wait_stats(sub, received=col.calls, delivered=col.calls)
        assert_same_sequence(col.items, expected)
        assert stats["received"] == stats["delivered"] == n + col.probes
        assert stats["decode_errors"] == 0
        assert stats["callback_errors"] == 0
        assert stats["dropped"] == 0
        assert 1 <= stats["batches"] <= stats["delivered"]
    assert sub.closed


# --- every message once, in order, equal -----------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_every_message_once_in_order(endpoints, mode, kind, transport):
    stream(endpoints, mode, kind, transport, 2000)


@pytest.mark.parametrize("mode,kind,transport,sub_bind", [
    ("native", "pull", "inproc", False),
    ("python", "pull", "ipc", True),
    ("caller", "pull", "tcp", False),
    ("native", "pull", "tcp", True),
    ("native", "sub", "tcp", False),
])
def test_100k_messages(endpoints, mode, kind, transport, sub_bind):
    stream(endpoints, mode, kind, transport, 100_000, sub_bind=sub_bind)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", KINDS)
def test_subscriber_binds_publisher_connects(endpoints, kind, transport):
    stream(endpoints, "native", kind, transport, 2000, sub_bind=True)


@pytest.mark.parametrize("batch", [1, 2, 7, 100_000])
def test_batch_sizes_deliver_everything(endpoints, batch):
    stream(endpoints, "native", "pull", "inproc", 3000, batch=batch)


def test_batch_1_gives_one_batch_per_message(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "pull", "native", col, batch=1) as (pub, sub, _):
        for i in range(500):
            pub.send(b"t", i)
        col.wait(500)
        wait_for(lambda: sub.stats["delivered"] == 500, what=lambda: repr(sub.stats))
        stats = sub.stats
        assert stats["batches"] == stats["delivered"] == 500
    assert col.items == list(range(500))


def test_fan_out_to_two_subscriptions(endpoints):
    ep = endpoints("inproc")
    a, b = Collector(), Collector()
    with upcall.Bus() as bus:
        pub = bus.publisher(ep, sndhwm=0)
        sa = bus.subscribe(ep, a, rcvhwm=0)
        sb = bus.subscribe(ep, b, rcvhwm=0, thread_factory=upcall.python_threads)
        warm_up(pub, a)
        warm_up(pub, b)
        for i in range(1000):
            pub.send(b"x", i)
        a.wait(1000)
        b.wait(1000)
        assert a.items == b.items == list(range(1000))
        sa.close()
        sb.close()
        pub.close()


# --- stats ------------------------------------------------------------------

def test_stats_keys_and_counts(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "pull", "native", col) as (pub, sub, _):
        stats = sub.stats
        assert isinstance(stats, dict)
        assert STATS_KEYS <= set(stats), "missing stats keys: %s" % (STATS_KEYS - set(stats))
        assert all(stats[k] == 0 for k in STATS_KEYS), stats
        for i in range(100):
            pub.send(b"t", i)
        col.wait(100)
        wait_for(lambda: sub.stats["delivered"] == 100, what=lambda: repr(sub.stats))
        stats = sub.stats
        assert stats["received"] == 100
        assert stats["decode_errors"] == stats["callback_errors"] == stats["dropped"] == 0
        assert 1 <= stats["batches"] <= 100
        assert all(isinstance(stats[k], int) for k in STATS_KEYS)


def test_stats_readable_after_close(endpoints):
    # Assumption: the final counters stay readable once closed (a user reads
    # them after shutdown).
    col = Collector()
    with pair(endpoints, "inproc", "pull", "native", col) as (pub, sub, _):
        for i in range(10):
            pub.send(b"t", i)
        col.wait(10)
        sub.close()
        assert sub.closed
        assert sub.stats["delivered"] == 10


# --- topics ------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_topic_prefix_filtering(endpoints, mode, transport):
    col = Collector()
    with pair(endpoints, transport, "sub", mode, col, topics=[b"a.", b"c."],
              with_topic=True) as (pub, sub, pump):
        warm_up(pub, col, pump, topic=b"a.probe")
        sent = []
        for i in range(300):
            for t in (b"a.x", b"b.x", b"c.y", b"a", b"ba.x", b"c.", b"cc.x"):
                pub.send(t, i)
                sent.append((t, i))
        pub.send(b"c.end", "end")
        expected = [(t, i) for t, i in sent if t.startswith((b"a.", b"c."))] + [(b"c.end", "end")]
        col.wait(len(expected), pump=pump)
        # "c.end" was sent last: everything the filter passes has arrived.
        assert_same_sequence(col.items, expected)


def test_str_topics_are_utf8(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "sub", "native", col,
              topics=["é.", "plain."], with_topic=True) as (pub, sub, _):
        warm_up(pub, col, topic="plain.probe".encode())
        pub.send("ü.x".encode(), 0)
        pub.send("é.x".encode(), 1)
        pub.send(b"plain.y", 2)
        pub.send(b"e.x", 3)
        pub.send("é.end".encode(), 4)
        col.wait(3)
        assert col.items == [("é.x".encode(), 1), (b"plain.y", 2), ("é.end".encode(), 4)]


def test_with_topic_pull_gets_topic_frame(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "pull", "native", col, with_topic=True) as (pub, sub, _):
        pub.send(b"some.topic", {"k": 1})
        pub.send(b"", [1, 2])
        col.wait(2)
    assert col.items == [(b"some.topic", {"k": 1}), (b"", [1, 2])]
    assert all(type(t) is bytes for t, _ in col.items)


@pytest.mark.parametrize("mode", MODES)
def test_with_topic(endpoints, mode):
    col = Collector()
    with pair(endpoints, "tcp", "sub", mode, col, with_topic=True) as (pub, sub, pump):
        warm_up(pub, col, pump)
        expected = [(b"t.%d" % (i % 3), make_msg(i)) for i in range(200)]
        for t, m in expected:
            pub.send(t, m)
        col.wait(200, pump=pump)
        assert col.items == expected
        assert all(type(t) is bytes for t, _ in col.items)


# --- errors from the target ---------------------------------------------------

class Boom(Exception):
    pass


def raise_on(values):
    def record(*args):
        if args[-1] in values:
            raise Boom("boom %r" % (args[-1],))
    return record


@pytest.mark.parametrize("mode", MODES)
def test_on_error_gets_target_exceptions_and_delivery_goes_on(endpoints, mode):
    errors = []
    col = Collector(record=raise_on({3, 7}))

    def on_error(exc, msg):
        errors.append((exc, msg, threading.get_ident()))

    with pair(endpoints, "inproc", "pull", mode, col, on_error=on_error) as (pub, sub, pump):
        for i in range(10):
            pub.send(b"t", i)
        col.wait(8, pump=pump)
        wait_for(lambda: sub.stats["callback_errors"] == 2, what=lambda: repr(sub.stats))
        assert col.items == [0, 1, 2, 4, 5, 6, 8, 9]
        assert [(type(e), str(e), m) for e, m, _ in errors] == [
            (Boom, "boom 3", 3), (Boom, "boom 7", 7)]
        # Documented by the C core: "delivered" counts messages handed to the
        # target without error.
        wait_for(lambda: sub.stats["delivered"] == 8, what=lambda: repr(sub.stats))
        assert sub.stats["decode_errors"] == 0
    if mode == "caller":
        assert {ident for _, _, ident in errors} == {threading.get_ident()}


def upcall_errors(caplog):
    return [r for r in caplog.records if r.name == "upcall" and r.levelno == logging.ERROR]


@pytest.mark.parametrize("mode", ["native", "python"])
def test_logged_without_on_error(endpoints, caplog, mode):
    # Without on_error, a target's exception is a record on the "upcall"
    # logger (tests/test_logging.py has the details).
    col = Collector(record=raise_on({2}))
    with pair(endpoints, "inproc", "pull", mode, col) as (pub, sub, _):
        for i in range(6):
            pub.send(b"t", i)
        col.wait(5)
        wait_for(lambda: upcall_errors(caplog), what="the exception to be logged")
        wait_for(lambda: sub.stats["callback_errors"] == 1, what=lambda: repr(sub.stats))
    assert col.items == [0, 1, 3, 4, 5]
    [rec] = upcall_errors(caplog)
    assert isinstance(rec.exc_info[1], Boom)
    assert str(rec.exc_info[1]) == "boom 2"


def test_logged_without_on_error_caller_mode(endpoints, caplog):
    col = Collector(record=raise_on({1}))
    with pair(endpoints, "inproc", "pull", "caller", col) as (pub, sub, pump):
        for i in range(3):
            pub.send(b"t", i)
        col.wait(2, pump=pump)
    assert col.items == [0, 2]
    [rec] = upcall_errors(caplog)
    assert isinstance(rec.exc_info[1], Boom)


# --- StopDelivery -----------------------------------------------------------------

def stop_on(value):
    def record(*args):
        if args[-1] == value:
            raise upcall.StopDelivery()
    return record


def test_stop_delivery_python_thread_ends(endpoints):
    # The loop's thread (Python-made) returns from run() by itself: proof
    # that the loop ended without anybody calling close().
    col = Collector(record=stop_on(3))
    with pair(endpoints, "inproc", "pull", "python", col) as (pub, sub, _):
        name = sub.thread_name
        thread = [t for t in threading.enumerate() if t.name == name]
        assert len(thread) == 1, "delivery thread %r not in threading.enumerate()" % name
        for i in range(10):
            pub.send(b"t", i)
        thread[0].join(DEADLINE)
        assert not thread[0].is_alive(), "StopDelivery did not end the loop"
        assert col.items == [0, 1, 2]
        assert col.calls == 4
        wait_for(lambda: sub.closed, what="sub.closed after StopDelivery")
        sub.close()  # still fine
        assert sub.stats["callback_errors"] == 0


def test_stop_delivery_custom_factory_run_returns(endpoints):
    runs = []

    def factory(run):
        t = threading.Thread(target=run, name="mine")
        runs.append(t)
        t.start()

    col = Collector(record=stop_on(0))
    with pair(endpoints, "ipc", "pull", "native", col, thread_factory=factory) as (pub, sub, _):
        for i in range(5):
            pub.send(b"t", i)
        assert len(runs) == 1
        runs[0].join(DEADLINE)
        assert not runs[0].is_alive(), "StopDelivery did not end the loop"
        assert col.items == [] and col.calls == 1
        sub.close()
        assert sub.closed


def test_stop_delivery_native(endpoints):
    col = Collector(record=stop_on(3))
    with pair(endpoints, "inproc", "pull", "native", col) as (pub, sub, _):
        for i in range(10):
            pub.send(b"t", i)
        wait_for(lambda: col.calls >= 4, what="message 3 to reach the target")
        wait_for(lambda: sub.closed, what="sub.closed after StopDelivery")
        sub.close(timeout=DEADLINE)
        assert col.items == [0, 1, 2]
        assert col.calls == 4


def test_stop_delivery_caller_mode(endpoints):
    col = Collector(record=stop_on(3))
    with pair(endpoints, "inproc", "pull", "caller", col) as (pub, sub, pump):
        for i in range(10):
            pub.send(b"t", i)
        while col.calls < 4:
            sub.poll(timeout=DEADLINE, max_messages=None)
        assert col.items == [0, 1, 2]
        # The subscription has ended: a later poll delivers nothing (it may
        # return 0 or refuse as on a closed subscription).
        try:
            n = sub.poll(timeout=0.05)
        except STATE_ERRORS:
            n = 0
        assert n == 0
        assert col.items == [0, 1, 2] and col.calls == 4
        assert sub.closed, "StopDelivery ended the subscription but sub.closed is False"
        sub.close()


# --- decode errors ----------------------------------------------------------------

# A 4-element array whose 4th element is the reserved byte 0xc1, at offset 19.
BAD_PAYLOAD = b"\x94" + b"\xa5hello" * 3 + b"\xc1"
BAD_OFFSET = 19
BAD_TOPIC = b"badtopic"


@pytest.mark.parametrize("mode", MODES)
def test_decode_error_between_good_messages_on_error(endpoints, mode):
    errors = []
    col = Collector()
    with pair(endpoints, "inproc", "pull", mode, col, on_error=lambda e, m: errors.append(e)) \
            as (pub, sub, pump):
        pub.send(b"ok", {"first": 1})
        pub.send_packed(BAD_TOPIC, BAD_PAYLOAD)
        pub.send(b"ok", {"second": 2})
        col.wait(2, pump=pump)
        wait_for(lambda: sub.stats["decode_errors"] == 1, what=lambda: repr(sub.stats))
        assert col.items == [{"first": 1}, {"second": 2}]
        assert len(errors) == 1
        exc = errors[0]
        assert isinstance(exc, upcall.DecodeError), repr(exc)
        text = str(exc)
        assert re.search(r"\b%d\b" % BAD_OFFSET, text), "no byte offset in %r" % text
        assert "badtopic" in text, "no topic in %r" % text
        wait_for(lambda: sub.stats["delivered"] == 2, what=lambda: repr(sub.stats))
        assert sub.stats["callback_errors"] == 0


@pytest.mark.parametrize("mode", ["native", "caller"])
def test_decode_error_is_logged_without_on_error(endpoints, caplog, mode):
    col = Collector()
    with pair(endpoints, "inproc", "pull", mode, col) as (pub, sub, pump):
        pub.send(b"ok", 1)
        pub.send_packed(BAD_TOPIC, b"\xc1")
        pub.send(b"ok", 2)
        col.wait(2, pump=pump)
        wait_for(lambda: upcall_errors(caplog), what="the DecodeError to be logged")
        wait_for(lambda: sub.stats["decode_errors"] == 1, what=lambda: repr(sub.stats))
    assert col.items == [1, 2]
    [rec] = upcall_errors(caplog)
    assert "badtopic" in rec.getMessage() and rec.topic == BAD_TOPIC


@pytest.mark.parametrize("payload", [b"", b"\x92\x01", b"\xdb\xff\xff\xff\xff",
                                     b"\x91" * 100_000, b"\x01\x02"])
def test_malformed_payloads_never_stop_delivery(endpoints, payload):
    # empty, truncated, length past the end, nesting too deep, trailing bytes
    errors = []
    col = Collector()
    with pair(endpoints, "inproc", "pull", "native", col,
              on_error=lambda e, m: errors.append(e)) as (pub, sub, _):
        pub.send(b"ok", 1)
        pub.send_packed(b"bad", payload)
        pub.send(b"ok", 2)
        col.wait(2)
        wait_for(lambda: sub.stats["decode_errors"] == 1, what=lambda: repr(sub.stats))
    assert col.items == [1, 2]
    assert len(errors) == 1 and isinstance(errors[0], upcall.DecodeError), errors


# --- close --------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_close_from_inside_the_target(endpoints, mode):
    holder = []
    returned = threading.Event()

    def record(msg):
        if msg == 2:
            holder[0].close()  # must not deadlock
            returned.set()

    col = Collector(record=record)
    with pair(endpoints, "inproc", "pull", mode, col) as (pub, sub, pump):
        holder.append(sub)
        for i in range(10):
            pub.send(b"t", i)
        if mode == "caller":
            # poll returns once the subscription is closed
            while not returned.is_set() and col.calls < 10:
                sub.poll(timeout=DEADLINE)
        assert returned.wait(DEADLINE), "close() called from the target did not return"
        sub.close(timeout=DEADLINE)  # from outside: waits for the loop's end
        assert sub.closed
        assert col.items == [0, 1, 2], "messages delivered after close(): %r" % col.items


def test_close_timeout_when_target_is_stuck(endpoints):
    release = threading.Event()
    entered = threading.Event()

    def target(msg):
        entered.set()
        release.wait(DEADLINE)

    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        pub = bus.publisher(ep, kind="push")
        sub = bus.subscribe(ep, target, kind="pull")
        pub.send(b"t", 1)
        assert entered.wait(DEADLINE)
        with pytest.raises(TimeoutError):
            sub.close(timeout=0.1)
        release.set()
        sub.close(timeout=DEADLINE)
        assert sub.closed


def test_close_is_idempotent(endpoints):
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        pub = bus.publisher(ep, kind="push")
        sub = bus.subscribe(ep, Collector(), kind="pull")
        sub.close()
        sub.close()
        pub.close()
        pub.close()
        assert sub.closed and pub.closed
        bus.close()
        bus.close()
        assert bus.closed


def test_bus_close_closes_everything(endpoints):
    bus = upcall.Bus()
    ep = endpoints("inproc")
    pub = bus.publisher(ep, kind="push")
    subs = [bus.subscribe(ep, Collector(), kind="pull", **mode_kwargs(m)) for m in MODES]
    pub.send(b"t", 1)
    assert not bus.closed
    bus.close()
    assert bus.closed
    assert pub.closed
    assert all(s.closed for s in subs)


@pytest.mark.parametrize("mode", ["native", "python"])
def test_subscribe_close_cycles_leak_nothing(endpoints, mode):
    with upcall.Bus() as bus:
        ep = endpoints("tcp")
        pub = bus.publisher(ep, kind="pub")

        def cycle():
            sub = bus.subscribe(ep, Collector(), **mode_kwargs(mode))
            sub.close()
            assert sub.closed

        threads0 = thread_count()  # the bus's libzmq I/O thread is running
        cycle()  # warm-up: first-use allocations
        wait_for(lambda: thread_count() <= threads0,
                 what="the warm-up cycle's delivery thread to exit")
        base_threads = thread_count()
        base_fds = fd_count()
        for _ in range(200):
            cycle()
        wait_for(lambda: thread_count() <= base_threads,
                 what=lambda: "threads back to %d (now %d)" % (base_threads, thread_count()))
        wait_for(lambda: fd_count() <= base_fds,
                 what=lambda: "open fds back to %d (now %d)" % (base_fds, fd_count()))
        pub.close()


def test_subscribe_close_cycles_with_traffic(endpoints):
    # Each cycle: a PULL binds a fresh inproc endpoint, a PUSH connects, one
    # message goes through, both close.
    with upcall.Bus() as bus:
        def cycle():
            ep = endpoints("inproc")
            col = Collector()
            sub = bus.subscribe(ep, col, kind="pull", bind=True)
            pub = bus.publisher(ep, kind="push", bind=False)
            pub.send(b"t", 1)
            col.wait(1)
            sub.close()
            pub.close()

        cycle()
        base_threads = thread_count()
        base_fds = fd_count()
        for _ in range(100):
            cycle()
        wait_for(lambda: thread_count() <= base_threads,
                 what=lambda: "threads back to %d (now %d)" % (base_threads, thread_count()))
        wait_for(lambda: fd_count() <= base_fds,
                 what=lambda: "open fds back to %d (now %d)" % (base_fds, fd_count()))


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


# --- publishers ---------------------------------------------------------------------

def test_publisher_send_from_several_threads(endpoints):
    col = Collector()
    n_threads, per_thread = 4, 5000
    with pair(endpoints, "tcp", "pull", "native", col) as (pub, sub, _):
        senders = [Sender(pub, [(b"t", [k, i]) for i in range(per_thread)]) for k in range(n_threads)]
        for s in senders:
            s.start()
        col.wait(n_threads * per_thread)
        for s in senders:
            s.finish()
    for k in range(n_threads):
        assert [i for kk, i in col.items if kk == k] == list(range(per_thread))
    assert len(col.items) == n_threads * per_thread


def test_send_packed_accepts_bytes_like(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "pull", "native", col) as (pub, sub, _):
        obj = {"a": [1, 2.5, "x"], "b": b"\x00\x01"}
        data = upcall.packb(obj)
        pub.send_packed(b"t", data)
        pub.send_packed(b"t", bytearray(data))
        pub.send_packed(b"t", memoryview(data))
        pub.send_packed(b"t", memoryview(b"xx" + data)[2:])
        col.wait(4)
    assert col.items == [obj] * 4


def test_send_unsupported_object_raises_and_publisher_survives(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "pull", "native", col) as (pub, sub, _):
        with pytest.raises(TypeError):
            pub.send(b"t", object())
        pub.send(b"t", "fine")
        col.wait(1)
    assert col.items == ["fine"]


def test_send_timeout_when_nobody_receives(endpoints):
    # Assumption: a send that cannot complete within `timeout` seconds (PUSH
    # with no peer) raises TimeoutError, like close(timeout=...); timeout=0
    # means "never block" and raises BlockingIOError (EAGAIN) or TimeoutError.
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), kind="push")
        with pytest.raises(TimeoutError):
            pub.send(b"t", 1, timeout=0.05)
        with pytest.raises((BlockingIOError, TimeoutError)):
            pub.send_packed(b"t", b"\x01", timeout=0)


def test_bound_port_zero_is_resolved(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:0", col, kind="pull", bind=True)
        m = re.fullmatch(r"tcp://127\.0\.0\.1:(\d+)", sub.last_endpoint)
        assert m and int(m.group(1)) != 0, sub.last_endpoint
        assert sub.endpoint == "tcp://127.0.0.1:0"
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False)
        assert pub.endpoint == pub.last_endpoint == sub.last_endpoint
        pub.send(b"t", "hello")
        col.wait(1)
        assert col.items == ["hello"]

        pub2 = bus.publisher("tcp://127.0.0.1:0", kind="push")
        m = re.fullmatch(r"tcp://127\.0\.0\.1:(\d+)", pub2.last_endpoint)
        assert m and int(m.group(1)) != 0, pub2.last_endpoint


def test_io_threads(endpoints):
    col = Collector()
    with upcall.Bus(io_threads=2) as bus:
        ep = endpoints("tcp")
        pub = bus.publisher(ep, kind="push")
        bus.subscribe(ep, col, kind="pull")
        for i in range(100):
            pub.send(b"t", i)
        col.wait(100)
    assert col.items == list(range(100))


# --- argument validation -------------------------------------------------------------

def _raises_naming(exc_types, word, fn, *args, **kwargs):
    with pytest.raises(exc_types) as info:
        fn(*args, **kwargs)
    assert word in str(info.value), "%r does not name %r" % (info.value, word)


@pytest.mark.parametrize("kwargs,exc,word", [
    ({"kind": "nope"}, ValueError, "kind"),
    ({"kind": "pub"}, ValueError, "kind"),
    ({"batch": 0}, ValueError, "batch"),
    ({"batch": -5}, ValueError, "batch"),
    ({"batch": "10"}, TypeError, "batch"),
    ({"delivery": "x"}, ValueError, "delivery"),
    ({"topics": [1]}, TypeError, "topics"),
    ({"thread_factory": 42}, TypeError, "thread_factory"),
    ({"on_error": "print"}, TypeError, "on_error"),
    ({"rcvhwm": "big"}, TypeError, "rcvhwm"),
])
def test_subscribe_rejects_bad_arguments(endpoints, kwargs, exc, word):
    with upcall.Bus() as bus:
        base_threads = thread_count()
        _raises_naming(exc, word, bus.subscribe, endpoints("inproc"), print, **kwargs)
        wait_for(lambda: thread_count() <= base_threads, what="no thread left behind")


def test_private_gil_mode_rejects_bad_values():
    with upcall.Bus() as bus:
        _raises_naming(ValueError, "gil", _synthetic_subscribe, bus, print, gil="x")


def test_subscribe_rejects_non_callable_target(endpoints):
    with upcall.Bus() as bus:
        _raises_naming(TypeError, "target", bus.subscribe, endpoints("inproc"), 42)


@pytest.mark.parametrize("endpoint", ["foo://x", "tcp://", "not an endpoint", ""])
def test_subscribe_rejects_bad_endpoint(endpoint):
    with upcall.Bus() as bus:
        with pytest.raises((ValueError, OSError)) as info:
            bus.subscribe(endpoint, print)
        text = str(info.value)
        assert text and (endpoint in text or "endpoint" in text.lower()), text
        with pytest.raises((ValueError, OSError)):
            bus.publisher(endpoint)


def test_subscribe_rejects_non_str_endpoint():
    with upcall.Bus() as bus:
        _raises_naming(TypeError, "endpoint", bus.subscribe, 5, print)


def test_bind_conflict_raises_oserror(endpoints):
    ep = endpoints("tcp")
    with upcall.Bus() as bus:
        pub = bus.publisher(ep, kind="push")   # referenced: a dropped publisher is closed
        with pytest.raises(OSError):
            bus.publisher(ep, kind="push")
        with pytest.raises(OSError):
            bus.subscribe(ep, print, kind="pull", bind=True)
        pub.close()


@pytest.mark.parametrize("kwargs,exc,word", [
    ({"kind": "sub"}, ValueError, "kind"),
    ({"kind": "nope"}, ValueError, "kind"),
    ({"sndhwm": "x"}, TypeError, "sndhwm"),
    ({"linger": "x"}, TypeError, "linger"),
])
def test_publisher_rejects_bad_arguments(endpoints, kwargs, exc, word):
    with upcall.Bus() as bus:
        _raises_naming(exc, word, bus.publisher, endpoints("inproc"), **kwargs)


def test_send_rejects_bad_topic(endpoints):
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"))
        _raises_naming(TypeError, "topic", pub.send, 1, {})
        _raises_naming(TypeError, "topic", pub.send_packed, None, b"\x01")
        with pytest.raises(TypeError):
            pub.send_packed(b"t", 12)


def test_bus_rejects_bad_arguments():
    _raises_naming(TypeError, "thread_factory", upcall.Bus, thread_factory=1)
    _raises_naming(ValueError, "io_threads", upcall.Bus, io_threads=-1)


# --- operations after close -----------------------------------------------------------
# Assumption (not spelled out in the .pyi): close() is idempotent; poll() on a
# closed subscription, send() on a closed publisher, subscribe()/publisher()
# on a closed bus raise STATE_ERRORS; properties (closed, stats, endpoint)
# stay readable.

def test_operations_after_close_raise(endpoints):
    bus = upcall.Bus()
    ep = endpoints("inproc")
    pub = bus.publisher(ep, kind="push")
    sub = bus.subscribe(ep, Collector(), kind="pull", delivery="caller")
    sub.close()
    with pytest.raises(STATE_ERRORS):
        sub.poll(timeout=0)
    assert sub.endpoint == ep and isinstance(sub.stats, dict)
    pub.close()
    with pytest.raises(STATE_ERRORS):
        pub.send(b"t", 1)
    with pytest.raises(STATE_ERRORS):
        pub.send_packed(b"t", b"\x01")
    bus.close()
    with pytest.raises(STATE_ERRORS):
        bus.subscribe(endpoints("inproc"), print)
    with pytest.raises(STATE_ERRORS):
        bus.publisher(endpoints("inproc"))


def test_context_managers_close(endpoints):
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        with bus.publisher(ep, kind="push") as pub:
            with bus.subscribe(ep, Collector(), kind="pull") as sub:
                assert not sub.closed and not pub.closed
            assert sub.closed
        assert pub.closed
    assert bus.closed


# --- more lifetimes ------------------------------------------------------------------

def test_bus_close_from_inside_a_target(endpoints):
    bus = upcall.Bus()
    done = threading.Event()
    holder = []

    def target(msg):
        bus.close()  # must not deadlock on this very loop
        holder.append(msg)
        done.set()

    ep = endpoints("inproc")
    pub = bus.publisher(ep, kind="push")
    sub = bus.subscribe(ep, target, kind="pull")
    pub.send(b"t", "x")
    assert done.wait(DEADLINE), "bus.close() inside a target did not return"
    assert holder == ["x"]
    assert bus.closed and pub.closed
    wait_for(lambda: sub.closed, what="the subscription to end after bus.close()")


def test_publisher_close_wakes_a_blocked_send(endpoints):
    # PUSH with no peer: send(timeout=None) blocks.  Closing the publisher
    # from another thread must end that send with an error (the message can
    # never go), not leave the thread blocked forever.
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), kind="push")
        outcome = []
        started = threading.Event()

        def blocked():
            started.set()
            try:
                pub.send(b"t", 1)
                outcome.append("returned")
            except Exception as exc:
                outcome.append(exc)

        t = threading.Thread(target=blocked, daemon=True)
        t.start()
        assert started.wait(DEADLINE)
        # the send is in progress (or about to be): close must stop it either way
        pub.close()
        t.join(10)  # a correct close wakes it at once; 10 s only bounds a failure
        assert not t.is_alive(), "send() still blocked after its publisher was closed"
        assert len(outcome) == 1 and isinstance(outcome[0], ValueError), outcome


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_large_payloads(endpoints, transport):
    col = Collector()
    big = [b"\x00\x01" * 500_000, "ü" * 300_000, list(range(100_000)),
           {"blob": bytes(range(256)) * 20_000, "n": 1}, b"z" * (8 << 20)]
    with pair(endpoints, transport, "pull", "native", col) as (pub, sub, _):
        for obj in big:
            pub.send(b"big", obj)
        col.wait(len(big))
    assert len(col.items) == len(big)
    for got, want in zip(col.items, big):
        # A default publisher packs large values inline (plain msgpack):
        # they arrive as what was sent, bytes as bytes.
        assert type(got) is type(want) and got == want


def test_concurrent_subscribe_close_from_threads(endpoints):
    errors = []
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        pub = bus.publisher(ep, kind="pub")
        base_threads = thread_count()

        def worker(k):
            try:
                for i in range(40):
                    kw = mode_kwargs("python" if (i + k) % 2 else "native")
                    with bus.subscribe(ep, Collector(), **kw) as sub:
                        assert not sub.closed
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        wait_for(lambda: thread_count() <= base_threads,
                 what=lambda: "threads back to %d (now %d)" % (base_threads, thread_count()))
        pub.close()
