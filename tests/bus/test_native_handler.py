"""Native (nogil) handlers: Count, FieldFilter, the pass-through base, checked
by counts over the synthetic source and over real sockets."""
import subprocess
import sys

import pytest

import upcall
from upcall._bus import _synthetic_subscribe
from upcall.handler import Counter
from upcall.native import Count, FieldFilter, NativeHandler

from helpers import DEADLINE, mode_kwargs, run_to_end, script_env, wait_for

MODES = ["native", "python", "caller"]


def _run(bus, target, mode, **kw):
    sub = _synthetic_subscribe(bus, target, **kw, **mode_kwargs(mode))
    run_to_end(sub, mode)
    return sub


@pytest.mark.parametrize("mode", MODES)
def test_count(mode):
    n = Count()
    payload = upcall.packb({"px": 1.5})
    with upcall.Bus() as bus:
        sub = _run(bus, n, mode, count=100_000, payload=payload)
        # Count examines every message and passes none on:
        # delivered counts what reached a target, filtered what was passed over).
        assert (sub.stats["delivered"], sub.stats["filtered"]) == (0, 100_000)
    assert n.messages == 100_000
    assert n.bytes == 100_000 * len(payload)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("target_kind", ["callable", "handler", "batch-handler"])
def test_field_filter_forwards_selected(mode, target_kind):
    got = []
    if target_kind == "callable":
        target = got.append
    elif target_kind == "handler":
        target = Counter()
    else:
        target = Counter(batches=True)
    f = FieldFilter("px", gt=100, target=target)
    with upcall.Bus() as bus:
        _run(bus, f, mode, count=1000, payload=upcall.packb({"sym": "A", "px": 187.25}))
    assert (f.seen, f.matched, f.missing, f.errors) == (1000, 1000, 0, 0)
    if target_kind == "callable":
        assert got == [{"sym": "A", "px": 187.25}] * 1000
    else:
        assert target.count == 1000


def test_field_filter_selects_none_no_upcall():
    calls = []
    f = FieldFilter("px", lt=100, target=calls.append)
    with upcall.Bus() as bus:
        sub = _run(bus, f, "native", count=10_000, payload=upcall.packb({"px": 187.25}))
        assert (sub.stats["delivered"], sub.stats["filtered"]) == (0, 10_000)
    assert f.matched == 0 and f.seen == 10_000 and calls == []


@pytest.mark.parametrize("cond,value,expected", [
    ({"eq": 5}, 5, True), ({"eq": 5}, 5.0, True), ({"eq": 5}, 6, False),
    ({"ne": 5}, 6, True), ({"gt": 5}, 6, True), ({"gt": 5}, 5, False),
    ({"ge": 5}, 5, True), ({"lt": -1}, -2, True), ({"lt": -1}, 2 ** 64 - 1, False),
    ({"le": 2 ** 63 - 1}, 2 ** 64 - 1, False), ({"gt": 0.5}, 1, True),
    ({"eq": "AAPL"}, "AAPL", True), ({"eq": "AAPL"}, "AAP", False), ({"eq": "AAPL"}, b"AAPL", False),
    ({"eq": b"\x00"}, b"\x00", True), ({"eq": None}, None, True), ({"eq": None}, 0, False),
    ({"eq": True}, True, True), ({"eq": True}, 1, False), ({"ne": "x"}, "y", True),
    ({"gt": 1}, "2", False), ({"gt": 1, "lt": 3}, 2, True), ({"gt": 1, "lt": 3}, 3, False),
    ({"gt": 0.0}, float("nan"), False),
])
def test_field_filter_conditions(cond, value, expected):
    f = FieldFilter("k", **cond)
    with upcall.Bus() as bus:
        _run(bus, f, "native", count=3, payload=upcall.packb({"other": [1, {"k": 0}], "k": value}))
    assert f.seen == 3
    assert f.matched == (3 if expected else 0)


def test_field_filter_missing_and_malformed():
    errors = []
    with upcall.Bus() as bus:
        f = FieldFilter("px", gt=0)
        _run(bus, f, "native", count=10, payload=upcall.packb([1, 2]))
        assert (f.missing, f.seen) == (10, 0)
        f = FieldFilter("px", gt=0)
        _run(bus, f, "native", count=10, payload=upcall.packb({"qty": 1}))
        assert (f.missing, f.seen) == (10, 0)
        f = FieldFilter("px", gt=0, target=errors.append)
        _run(bus, f, "native", count=10, payload=b"\x82\xa2px")      # truncated map
        assert f.errors == 10 and errors == []


def test_field_filter_argument_errors():
    with pytest.raises(TypeError):
        FieldFilter("px")
    with pytest.raises(TypeError):
        FieldFilter(b"px", gt=1)
    with pytest.raises(TypeError):
        FieldFilter("px", gt="a")
    with pytest.raises(TypeError):
        FieldFilter("px", between=1)


def test_pass_through_base_and_target_errors():
    errors = []

    def bad(msg):
        raise ValueError(msg)

    base = NativeHandler(target=bad)
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, base, count=50, payload=upcall.packb(1),
                            on_error=lambda e, m: errors.append(e))
        assert sub.wait(DEADLINE)
        st = sub.stats
    # each message counted once: as a callback error, not also as delivered
    assert st["delivered"] == 0 and st["callback_errors"] == 50 and len(errors) == 50


def test_native_handler_is_not_a_callable_target_but_accepted():
    assert not callable(Count())
    with upcall.Bus() as bus:
        sub = _synthetic_subscribe(bus, Count(), count=1)
        assert sub.wait(DEADLINE)


def test_per_upcall_gil_forwarding():
    got = []
    f = FieldFilter("px", ge=0, target=got.append)
    with upcall.Bus() as bus:
        _run(bus, f, "native", count=100, payload=upcall.packb({"px": 0}), gil="per-upcall")
    assert len(got) == 100


@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_filter_over_a_socket(endpoints, transport):
    picked = Counter()
    f = FieldFilter("px", ge=500, target=picked)
    ep = endpoints(transport)
    with upcall.Bus() as bus:
        sub = bus.subscribe(ep, f, kind="pull", bind=True, batch=64)
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False)
        for i in range(1000):
            pub.send(b"t", {"px": i, "sym": "X"})
        wait_for(lambda: f.seen == 1000)
        wait_for(lambda: picked.count == 500)
        wait_for(lambda: sub.stats["delivered"] == 500)
        assert sub.stats["filtered"] == 500
    assert picked.last == {"px": 999, "sym": "X"}


@pytest.mark.parametrize("conditions", ["eq=1", "eq='s'", "gt=1.5, ne=b'x'"])
def test_a_field_filter_does_not_pickle(conditions, tmp_path):
    # A TypeError, in a child: Cython's automatic pickling of it segfaulted.
    code = (
        "import pickle\n"
        "from upcall.native import FieldFilter\n"
        f"f = FieldFilter('px', {conditions})\n"
        "try:\n"
        "    pickle.dumps(f)\n"
        "except TypeError as e:\n"
        "    print('TypeError:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=script_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("TypeError: cannot pickle an upcall.native.FieldFilter"), \
        proc.stdout
