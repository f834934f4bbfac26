"""Differential tests against msgpack-python on random nested objects."""
import math

import pytest
from hypothesis import given, settings, strategies as st

import upcall

msgpack = pytest.importorskip("msgpack")

ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)
floats = st.floats(allow_nan=False)
scalars = st.one_of(st.none(), st.booleans(), ints, floats, st.text(), st.binary())
keys = st.one_of(st.text(max_size=20), ints, st.binary(max_size=8), st.booleans(), st.none(),
                 floats)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=8),
        st.tuples(children, children),
        st.dictionaries(keys, children, max_size=8),
    ),
    max_leaves=40,
)


# Examples per property, sized for the per-test limit (pytest-timeout, 120 s)
# on a machine kept busy by the whole suite: a nested value of up to 40
# leaves costs hypothesis about 20 ms to make and shrink-track there (600
# examples took 11.6 s at load average 16 on 2 cores, and past the limit at
# load 14 under `make test`).  RECURSIVE keeps such a test near 3 s at that
# load, leaving the limit ten times over; flat values cost a tenth as much.
RECURSIVE = 150
FLAT = 200


def lists(x):
    """What a msgpack round trip gives back: tuples become lists."""
    if isinstance(x, (list, tuple)):
        return [lists(v) for v in x]
    if isinstance(x, dict):
        return {k: lists(v) for k, v in x.items()}
    return x


def same(a, b):
    """Deep equality that also tells bool from int and keeps float types."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


def mp_unpackb(data):
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


@settings(max_examples=RECURSIVE, deadline=None)
@given(values)
def test_upcall_decodes_msgpack(x):
    assert same(upcall.unpackb(msgpack.packb(x, use_bin_type=True)), lists(x))


@settings(max_examples=RECURSIVE, deadline=None)
@given(values)
def test_msgpack_decodes_upcall(x):
    assert same(mp_unpackb(upcall.packb(x)), lists(x))


@settings(max_examples=RECURSIVE, deadline=None)
@given(values)
def test_same_bytes_as_msgpack(x):
    # Both pick the smallest int/str/bin/array/map forms and float64 for
    # floats, so the encodings match byte for byte.
    assert upcall.packb(x) == msgpack.packb(x, use_bin_type=True)


@settings(max_examples=FLAT, deadline=None)
@given(st.integers(min_value=-(2**62), max_value=2**62), st.integers(0, 999_999_999))
def test_timestamps_against_msgpack(sec, nsec):
    ours = upcall.packb(upcall.Timestamp(sec, nsec))
    theirs = msgpack.packb(msgpack.Timestamp(sec, nsec))
    assert ours == theirs
    back = msgpack.unpackb(ours)
    assert (back.seconds, back.nanoseconds) == (sec, nsec)
    assert upcall.unpackb(theirs) == upcall.Timestamp(sec, nsec)


@settings(max_examples=FLAT, deadline=None)
@given(st.integers(0, 127), st.binary(max_size=300))   # msgpack-python: codes 0..127 only
def test_ext_against_msgpack(code, data):
    ours = upcall.packb(upcall.ExtType(code, data))
    assert ours == msgpack.packb(msgpack.ExtType(code, data))
    assert upcall.unpackb(msgpack.packb(msgpack.ExtType(code, data))) == upcall.ExtType(code, data)


@settings(max_examples=FLAT, deadline=None)
@given(st.one_of(st.integers(min_value=2**64), st.integers(max_value=-(2**63) - 1)))
def test_out_of_range_ints(x):
    with pytest.raises(OverflowError):
        upcall.packb(x)
