"""The counters add up (docs/wire.md, "What is counted where").

Every message received ends in exactly one of delivered, filtered,
decode_errors, callback_errors and dropped, for every kind of target: a
callable, a Handler, a Handler taking batches, a native handler with a
callable or Handler target, with no target, and one that selects nothing.
A native handler's delivered counts what reached its target (or, with no
target, what it selected), filtered what it examined and passed over.
Checked over a real PULL socket in every delivery mode, with decode errors,
target errors, and a StopDelivery that leaves the rest of its batch dropped.
"""
import threading
import time

import pytest

import upcall
from upcall.handler import Handler
from upcall.native import Count, FieldFilter
from helpers import DEADLINE, MODES, mode_kwargs, wait_for
from bus_pair import pair
from helpers import Collector, STATS_KEYS

pytestmark = pytest.mark.threads

N = 60                         # 12 of each kind of message below
BAD = b"\x81\xa2px\xc1"        # a map whose value is the reserved byte 0xc1


def payload(i):
    """Message i: by i % 5, a negative px (a FieldFilter passes it over),
    malformed msgpack, a target error, or two good ones."""
    r = i % 5
    if r == 0:
        return {"i": i, "px": -1 - i}
    if r == 1:
        return BAD
    if r == 2:
        return {"i": i, "px": i, "boom": True}
    return {"i": i, "px": i}


def consume(m):
    if m.get("boom"):
        raise ValueError("boom %d" % m["i"])
    if m.get("stop"):
        raise upcall.StopDelivery


class Consumer(Handler):
    def on_message(self, m):
        consume(m)


class BatchConsumer(Handler):
    def __init__(self):
        self.batches = True

    def on_batch(self, msgs):
        if any(m.get("stop") for m in msgs):
            raise upcall.StopDelivery      # the whole list counts as delivered
        for m in msgs:
            consume(m)


def make_target(kind):
    if kind == "callable":
        return consume
    if kind == "handler":
        return Consumer()
    if kind == "batch-handler":
        return BatchConsumer()
    if kind == "native-callable":
        return FieldFilter("px", ge=0, target=consume)
    if kind == "native-handler":
        return FieldFilter("px", ge=0, target=Consumer())
    if kind == "native-no-target":
        return FieldFilter("px", ge=0)
    if kind == "native-count":
        return Count()
    raise ValueError(kind)


# Expected counters after the N messages, per target kind (batch-handler: an
# error in on_batch counts its whole list, so only the sums are known).
EXPECTED = {
    "callable": dict(delivered=36, filtered=0, decode_errors=12, callback_errors=12),
    "handler": dict(delivered=36, filtered=0, decode_errors=12, callback_errors=12),
    "native-callable": dict(delivered=24, filtered=24, decode_errors=0, callback_errors=12),
    "native-handler": dict(delivered=24, filtered=24, decode_errors=0, callback_errors=12),
    "native-no-target": dict(delivered=36, filtered=24, decode_errors=0, callback_errors=0),
    "native-count": dict(delivered=0, filtered=60, decode_errors=0, callback_errors=0),
}
KINDS = ["callable", "handler", "batch-handler", "native-callable", "native-handler",
         "native-no-target", "native-count"]

_numbers = iter(range(10 ** 9))


def assert_adds_up(st):
    accounted = (st["delivered"] + st["filtered"] + st["decode_errors"]
                 + st["callback_errors"] + st["dropped"])
    assert st["received"] == accounted, st


def run(kind, mode, extra=()):
    """Subscribe (PULL, batch 8), send the N messages and then `extra`
    payloads; return the subscription's stats once it has accounted for
    everything it received (and, if it ends by itself, once it has ended)."""
    target = make_target(kind)
    ep = "inproc://invariant-%d" % next(_numbers)
    with upcall.Bus() as bus:
        sub = bus.subscribe(ep, target, kind="pull", bind=True, batch=8,
                            on_error=lambda exc, m: None, **mode_kwargs(mode))
        pub = bus.publisher(ep, kind="push", bind=False)
        for i in range(N):
            p = payload(i)
            if isinstance(p, bytes):
                pub.send_packed(b"", p)
            else:
                pub.send(b"", p)
        for p in extra:
            pub.send(b"", p, timeout=DEADLINE)
        total = N + len(extra)
        ends = any(p.get("stop") for p in extra)
        stats = {}

        def done():
            if mode == "caller" and not sub.closed:
                sub.poll(timeout=0.01)
            stats.update(sub.stats)
            accounted = (stats["delivered"] + stats["filtered"] + stats["decode_errors"]
                         + stats["callback_errors"] + stats["dropped"])
            if ends:
                return sub.closed and stats["received"] == accounted
            return stats["received"] == total and accounted == total
        wait_for(done, what=lambda: "the counters to account for everything: %r" % stats)
        if ends and mode != "caller":
            assert sub.wait(DEADLINE)
        st = sub.stats
    assert_adds_up(st)
    return st


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_counters_add_up(kind, mode):
    st = run(kind, mode)
    assert st["received"] == N and st["dropped"] == 0
    if kind == "batch-handler":
        assert st["decode_errors"] == 12
        assert st["delivered"] + st["callback_errors"] == 48
    else:
        assert {k: st[k] for k in EXPECTED[kind]} == EXPECTED[kind]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["callable", "handler", "batch-handler", "native-callable"])
def test_counters_add_up_when_a_target_stops(kind, mode):
    # StopDelivery ends the subscription: the message that raised it counts
    # as delivered, the rest of its batch as dropped.
    extra = [{"i": N, "px": 0, "stop": True}] + [{"i": N + 1 + k, "px": 1} for k in range(20)]
    st = run(kind, mode, extra)
    assert st["received"] >= N + 1
    if kind != "batch-handler":
        exp = EXPECTED[kind]
        assert st["delivered"] == exp["delivered"] + 1
        assert st["decode_errors"] == exp["decode_errors"]
        assert st["callback_errors"] == exp["callback_errors"]
        assert st["dropped"] == st["received"] - (N + 1)


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
