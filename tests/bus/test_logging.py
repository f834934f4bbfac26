"""Errors without on_error are records on logging.getLogger("upcall").

A target's exception (with its traceback) and a decode error (without one)
become an ERROR record naming the subscription, the topic and the thread, on
every delivery thread and in caller mode; on_error, when given, takes them
all.  Records are rate-limited per subscription: at most LOG_BURST of each
kind per LOG_INTERVAL seconds, then one summary record counts the rest.  A
barrage of 20,000 malformed messages makes a bounded number of records, and
the records plus the summaries account for every error.  The at-exit report
of a loop that did not stop is a WARNING record on the same logger.
"""
import logging
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import zmq

import upcall
import upcall._bus
from helpers import (DEADLINE, MODE_PRELUDE, Collector, make_pump, mode_kwargs, script_env,
                     wait_for)
from bus_pair import pair
from helpers import MODES

pytestmark = pytest.mark.threads


class Records(logging.Handler):
    """Keeps the records of the "upcall" logger, formatted once as a user's
    handler would (threadName included)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []
        self.lines = []
        self.setFormatter(logging.Formatter("%(threadName)s %(levelname)s %(message)s"))
        self._lock2 = threading.Lock()

    def emit(self, record):
        if record.name == "upcall.events":
            return      # connection events (tests/bus/test_events.py), not errors
        line = self.format(record)
        with self._lock2:
            self.records.append(record)
            self.lines.append(line)

    def snapshot(self):
        with self._lock2:
            return list(self.records)


@pytest.fixture
def records(monkeypatch):
    """Every record of the "upcall" logger; sys.unraisablehook must stay silent."""
    handler = Records()
    logger = logging.getLogger("upcall")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: unraisable.append(args))
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert unraisable == [], [(u.exc_type, u.exc_value) for u in unraisable]


class Boom(Exception):
    pass


def open_pull(bus, ep, target, mode, **kw):
    sub = bus.subscribe(ep, target, kind="pull", bind=True, **mode_kwargs(mode), **kw)
    pub = bus.publisher(ep, kind="push", bind=False)
    return sub, pub, (make_pump(sub) if mode == "caller" else None)


def deliver_until(cond, pump, what):
    if pump is None:
        wait_for(cond, what=what)
        return
    deadline = time.monotonic() + DEADLINE
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for %s" % what
        pump()


def expected_thread(sub, mode):
    return threading.current_thread().name if mode == "caller" else sub.thread_name


@pytest.mark.parametrize("mode", ["native", "python", "executor", "caller"])
def test_target_error_is_a_record_with_topic_error_and_thread(endpoints, records, mode):
    def target(topic, msg):
        if msg == 2:
            raise Boom("boom 2")

    col = Collector(record=target)
    with upcall.Bus() as bus:
        sub, pub, pump = open_pull(bus, endpoints("inproc"), col, mode, with_topic=True)
        for i in range(4):
            pub.send(b"trades.x", i)
        deliver_until(lambda: len(col) == 3 and records.snapshot(), pump, "3 messages and a record")
        thread = expected_thread(sub, mode)
        sub.close()
    [rec] = records.snapshot()
    assert rec.name == "upcall" and rec.levelno == logging.ERROR
    assert rec.topic == b"trades.x" and rec.subscription is sub
    assert rec.exc_info[0] is Boom and str(rec.exc_info[1]) == "boom 2"
    assert rec.threadName == thread
    [line] = records.lines
    assert line.startswith(f"{thread} ERROR ")
    assert "b'trades.x'" in line and f"in thread {thread}" in line
    assert "Traceback" in line and "Boom: boom 2" in line     # the traceback is kept
    assert sub.stats["callback_errors"] == 1 and sub.stats["delivered"] == 3


@pytest.mark.parametrize("mode", ["native", "python", "caller"])
def test_decode_error_is_a_record_without_traceback(endpoints, records, mode):
    col = Collector()
    with upcall.Bus() as bus:
        sub, pub, pump = open_pull(bus, endpoints("inproc"), col, mode)
        pub.send(b"ok", 1)
        pub.send_packed(b"badtopic", b"\xc1")
        pub.send(b"ok", 2)
        deliver_until(lambda: len(col) == 2 and records.snapshot(), pump, "2 messages and a record")
        thread = expected_thread(sub, mode)
        sub.close()
    [rec] = records.snapshot()
    assert rec.levelno == logging.ERROR and rec.exc_info is None
    assert rec.topic == b"badtopic" and rec.threadName == thread
    msg = rec.getMessage()
    assert "decode error on topic b'badtopic'" in msg and f"in thread {thread}" in msg
    assert "at byte 0" in msg and "0xc1" in msg
    assert col.items == [1, 2]


def test_on_error_takes_every_error_and_nothing_is_logged(endpoints, records):
    errors = []
    col = Collector(record=lambda m: (_ for _ in ()).throw(Boom("x")) if m == 1 else None)
    with upcall.Bus() as bus:
        sub, pub, _ = open_pull(bus, endpoints("inproc"), col, "native",
                                on_error=lambda e, m: errors.append(type(e)))
        pub.send(b"t", 1)
        pub.send_packed(b"t", b"\xc1")
        pub.send(b"t", 2)
        wait_for(lambda: len(errors) == 2 and len(col) == 1, what=lambda: repr(errors))
        sub.close()
    assert sorted(e.__name__ for e in errors) == ["Boom", "DecodeError"]
    assert records.snapshot() == []


def barrage(endpoints, n, bad=b"\xc1"):
    """n malformed messages from a pyzmq PUSH into an upcall PULL; returns
    (the subscription's stats, seconds it took)."""
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    ep = endpoints("ipc")
    try:
        with upcall.Bus() as bus:
            sub = bus.subscribe(ep, lambda m: None, kind="pull", bind=True)
            push.connect(ep)
            t0 = time.monotonic()
            for i in range(n):
                push.send_multipart([b"flood.%d" % (i % 7), bad])
            wait_for(lambda: sub.stats["decode_errors"] == n, what=lambda: repr(sub.stats))
            seconds = time.monotonic() - t0
            sub.close()
            return sub.stats, seconds
    finally:
        push.close()
        ctx.term()


def summaries(recs):
    return [r for r in recs if getattr(r, "left_out", None) is not None]


def test_a_barrage_of_bad_messages_makes_a_bounded_number_of_records(endpoints, records,
                                                                      monkeypatch):
    monkeypatch.setattr(upcall._bus, "LOG_INTERVAL", 3600.0)   # one interval for the whole run
    n = 20_000
    stats, _ = barrage(endpoints, n)
    assert stats["decode_errors"] == n
    recs = records.snapshot()
    burst = upcall._bus.LOG_BURST
    # LOG_BURST records, then one summary at close for all the rest.
    assert len(recs) == burst + 1, [r.getMessage()[:100] for r in recs]
    assert all(r.exc_info is None and r.getMessage().count("decode error on topic") == 1
               for r in recs[:burst])
    [summary] = summaries(recs)
    assert summary is recs[-1] and summary.left_out == n - burst
    assert re.search(rf"{n - burst} more decode errors in the last [\d.]+ s", summary.getMessage())


def test_the_default_limit_bounds_and_accounts_for_every_error(endpoints, records):
    n = 20_000
    stats, seconds = barrage(endpoints, n)
    recs = records.snapshot()
    # At most LOG_BURST records and one summary per interval started.
    intervals = seconds / upcall._bus.LOG_INTERVAL + 2
    assert len(recs) <= (upcall._bus.LOG_BURST + 1) * intervals
    assert len(recs) < 100
    sums = summaries(recs)
    assert (len(recs) - len(sums)) + sum(r.left_out for r in sums) == stats["decode_errors"] == n


def test_a_summary_comes_with_the_first_error_after_the_interval(endpoints, records,
                                                                  monkeypatch):
    monkeypatch.setattr(upcall._bus, "LOG_BURST", 2)
    monkeypatch.setattr(upcall._bus, "LOG_INTERVAL", 0.2)

    def target(m):
        raise Boom(m)

    with upcall.Bus() as bus:
        sub, pub, pump = open_pull(bus, endpoints("inproc"), target, "caller")
        start = time.monotonic()
        for i in range(5):
            pub.send(b"t", i)
        deliver_until(lambda: sub.stats["callback_errors"] == 5, pump, "5 errors")
        assert len(records.snapshot()) == 2         # two logged, three left out
        # Even on a slow machine, the first interval is over once 0.2 s have
        # passed since before the first error.
        wait_for(lambda: time.monotonic() > start + 0.25, what="the interval to end")
        pub.send(b"t", 5)
        deliver_until(lambda: len(records.snapshot()) == 4, pump, "the summary and a record")
        sub.close()
    recs = records.snapshot()
    assert [str(r.exc_info[1]) for r in recs if r.exc_info] == ["0", "1", "5"]
    [summary] = summaries(recs)
    assert summary is recs[2] and summary.left_out == 3
    assert "3 more target errors" in summary.getMessage()
    assert len(records.snapshot()) == 4             # nothing left out: no summary at close


def test_a_failing_log_setup_falls_back_to_unraisablehook(endpoints, monkeypatch):
    class Refuse(logging.Filter):
        def filter(self, record):
            raise RuntimeError("filter broke")

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: seen.append(args.exc_value))
    logger = logging.getLogger("upcall")
    refuse = Refuse()
    logger.addFilter(refuse)
    col = Collector(record=lambda m: (_ for _ in ()).throw(Boom("b")) if m == 1 else None)
    try:
        with upcall.Bus() as bus:
            sub, pub, _ = open_pull(bus, endpoints("inproc"), col, "native")
            for i in range(3):
                pub.send(b"t", i)
            wait_for(lambda: len(col) == 2 and len(seen) == 2, what=lambda: repr(seen))
            sub.close()
    finally:
        logger.removeFilter(refuse)
    assert [type(e) for e in seen] == [RuntimeError, Boom]
    assert col.items == [0, 2]


AT_EXIT = """
    import logging
    logging.basicConfig(stream=sys.stdout, format="%(name)s|%(levelname)s|%(message)s")
    import threading
    upcall._bus.EXIT_TIMEOUT = 0.5
    entered = threading.Event()
    def target(msg):
        entered.set()
        threading.Event().wait()      # stuck for ever, without the GIL
    bus = upcall.Bus()
    sub = bus.subscribe("inproc://stuck", target, kind="pull", bind=True, **KW)
    pub = bus.publisher("inproc://stuck", kind="push", bind=False)
    pub.send(b"t", 1)
    entered.wait()
    print("stuck", flush=True)
"""


@pytest.mark.parametrize("mode", ["native", "python"])
def test_the_at_exit_report_is_a_warning_record(mode, tmp_path):
    # cwd: not the source tree, whose upcall/ would shadow an installed one.
    proc = subprocess.run([sys.executable, "-c", MODE_PRELUDE + textwrap.dedent(AT_EXIT), mode],
                          capture_output=True, text=True, env=script_env(), timeout=DEADLINE,
                          cwd=tmp_path)
    report = f"status {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert re.search(r"^upcall\|WARNING\|upcall: at exit: .*did not stop", proc.stdout, re.M), report
    assert proc.stderr == "", report    # a handler is configured: nothing printed elsewhere


def test_a_batch_handlers_error_is_one_record_for_the_batch(endpoints, records):
    class Batches(upcall.Handler):
        def __init__(self):
            self.batches = True
            self.got = []

        def on_batch(self, msgs):
            if 3 in msgs:
                raise Boom("batch with 3")
            self.got.extend(msgs)

    handler = Batches()
    with upcall.Bus() as bus:
        sub, pub, pump = open_pull(bus, endpoints("inproc"), handler, "caller", batch=8)
        for i in range(5):
            pub.send(b"t", i)
        deliver_until(lambda: sub.stats["callback_errors"] + sub.stats["delivered"] == 5,
                      pump, "5 messages")
        sub.close()
    [rec] = records.snapshot()
    assert rec.topic is None and str(rec.exc_info[1]) == "batch with 3"
    assert " raised on a batch in thread MainThread" in rec.getMessage()


# --- errors from the target ---------------------------------------------------



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
    # logger (tests/bus/test_logging.py has the details).
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


# A topic that must appear in the decode error's record.
BAD_TOPIC = b"badtopic"


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
