"""Publisher.send() from several threads when packing runs Python code.

Packing a timezone-aware datetime calls its tzinfo's utcoffset(); a pure
Python tzinfo (as pytz's) runs Python code in the middle of packing, and
with it another thread may take the GIL and send on the same publisher.
Every message must still arrive whole, with its own content.
"""
import datetime as dt
import itertools
import threading
import time

import pytest

import upcall
from helpers import DEADLINE, Collector, Sender, wait_for, warm_up

pytestmark = pytest.mark.threads

N_THREADS = 3
PER_THREAD = 10_000
BASE = dt.datetime(2020, 1, 1)


class PythonTZ(dt.tzinfo):
    """A tzinfo written in Python: packing calls utcoffset(), which now and
    then gives the GIL away (time.sleep(0)), as a switch interval may at any
    moment of any Python code."""

    calls = itertools.count()

    def utcoffset(self, d):
        if next(self.calls) % 16 == 0:
            time.sleep(0)
        return dt.timedelta(hours=1)

    def dst(self, d):
        return dt.timedelta(0)

    def tzname(self, d):
        return "PY+1"


TZ = PythonTZ()
UTC_PLUS_1 = dt.timezone(dt.timedelta(hours=1))     # the same offset, in C


def message(k, i):
    """Thread k's i-th message: its length and every field depend on (k, i),
    so another thread's bytes in it cannot go unnoticed."""
    return {"thread": k, "seq": i, "at": (BASE + dt.timedelta(seconds=i)).replace(tzinfo=TZ),
            "pad": "%d:%d;" % (k, i) * (1 + (7 * k + i) % 13)}


def expected(k, i):
    """message(k, i) as it decodes: the datetime as a Timestamp."""
    m = message(k, i)
    m["at"] = upcall.Timestamp.from_datetime(m["at"].replace(tzinfo=UTC_PLUS_1))
    return m


@pytest.mark.parametrize("kind", ["pub", "push"])
def test_concurrent_sends_with_python_packing_arrive_intact(endpoints, kind):
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        # No high-water marks: PUB drops at its mark, and every message counts.
        pub = bus.publisher(ep, kind=kind, sndhwm=0, bind=True)
        sub = bus.subscribe(ep, col, kind="sub" if kind == "pub" else "pull", rcvhwm=0,
                            with_topic=True, on_error=lambda exc, msg: errors.append(exc))
        if kind == "pub":
            warm_up(pub, col)
        senders = [Sender(pub, [(b"t%d" % k, message(k, i)) for i in range(PER_THREAD)])
                   for k in range(N_THREADS)]
        for s in senders:
            s.start()
        for s in senders:
            s.finish()
        wait_for(lambda: len(col) + len(errors) >= N_THREADS * PER_THREAD,
                 what=lambda: "%d messages and %d errors" % (len(col), len(errors)))
        stats = sub.stats
    assert (len(errors), stats["decode_errors"]) == (0, 0), errors[:3]
    assert len(col.items) == N_THREADS * PER_THREAD
    for k in range(N_THREADS):
        want = [(b"t%d" % k, expected(k, i)) for i in range(PER_THREAD)]
        got = [(topic, msg) for topic, msg in col.items if topic == b"t%d" % k]
        wrong = sum(g != w for g, w in zip(got, want))
        assert (len(got), wrong) == (PER_THREAD, 0), "thread %d: %d wrong" % (k, wrong)


def test_close_while_packing_refuses_the_send(endpoints):
    # The publisher is closed by Python code that runs while its message is
    # being packed: the send must refuse cleanly, not reach a closed socket.
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), kind="pub", bind=True)

        class ClosingTZ(PythonTZ):
            def utcoffset(self, d):
                pub.close()
                return dt.timedelta(0)

        with pytest.raises(ValueError, match="closed"):
            pub.send(b"t", {"at": BASE.replace(tzinfo=ClosingTZ())})
        assert pub.closed is True


def test_send_while_another_send_is_blocked_at_the_high_water_mark(endpoints):
    # One thread waits at the mark with the shared encode buffer; another
    # packs its own message meanwhile.  Both arrive, each with its content.
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        pub = bus.publisher(ep, kind="push", sndhwm=1, bind=True)
        first = Sender(pub, [(b"a", {"n": i, "at": BASE.replace(tzinfo=TZ)}) for i in range(50)])
        first.start()
        second = Sender(pub, [(b"b", {"n": i, "at": BASE.replace(tzinfo=TZ)}) for i in range(50)])
        second.start()
        # Nobody receives yet: both senders end up blocked (PUSH has no peer).
        time.sleep(0.05)
        bus.subscribe(ep, col, kind="pull", with_topic=True,
                      on_error=lambda exc, msg: errors.append(exc))
        first.finish()
        second.finish()
        wait_for(lambda: len(col) + len(errors) >= 100)
    assert errors == []
    at = upcall.Timestamp.from_datetime(BASE.replace(tzinfo=UTC_PLUS_1))
    for topic in (b"a", b"b"):
        assert [m for t, m in col.items if t == topic] == [{"n": i, "at": at} for i in range(50)]


def test_threads_sending_and_closing(endpoints):
    # Close while other threads send (some blocked at the mark): every send
    # either completes or raises ValueError; nothing crashes or hangs.
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), kind="push", sndhwm=1, bind=True)
        outcomes = []

        def send_until_closed():
            try:
                while True:
                    pub.send(b"t", {"at": BASE.replace(tzinfo=TZ)})
            except ValueError as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=send_until_closed) for _ in range(N_THREADS)]
        for t in threads:
            t.start()
        time.sleep(0.05)
        pub.close()
        for t in threads:
            t.join(DEADLINE)
            assert not t.is_alive()
    assert len(outcomes) == N_THREADS
