"""The msgpack-test-suite conformance data, both ways.

Each listed encoding must decode to the value; packb(value) must be one of
the listed encodings and, except for floats (always packed as float64), the
smallest one.
"""
import json
import math
from pathlib import Path

import pytest

import upcall

SUITE = Path(__file__).resolve().parents[2].parent / "shared/conformance/msgpack-test-suite.json"


def _load():
    if not SUITE.exists():
        pytest.skip(f"conformance data not found at {SUITE}", allow_module_level=True)
    data = json.loads(SUITE.read_text())
    cases = []
    for group, entries in data.items():
        for i, entry in enumerate(entries):
            cases.append(pytest.param(group, entry, id=f"{group}[{i}]"))
    return cases


CASES = _load()


def _hexbytes(s):
    return bytes.fromhex(s.replace("-", ""))


def _value(entry):
    """The Python value of a suite entry, and whether it is a float."""
    if "nil" in entry:
        return None, False
    if "bool" in entry:
        return entry["bool"], False
    if "binary" in entry:
        return _hexbytes(entry["binary"]), False
    if "bignum" in entry:
        return int(entry["bignum"]), False
    if "number" in entry:
        n = entry["number"]
        return n, isinstance(n, float)
    if "string" in entry:
        return entry["string"], False
    if "array" in entry:
        return entry["array"], False
    if "map" in entry:
        return entry["map"], False
    if "timestamp" in entry:
        sec, nsec = entry["timestamp"]
        return upcall.Timestamp(sec, nsec), False
    if "ext" in entry:
        code, data = entry["ext"]
        return upcall.ExtType(code, _hexbytes(data)), False
    raise AssertionError(f"unknown entry kind: {entry}")


def _same(a, b):
    """Equal, and ints stay ints (1 != True for our purpose)."""
    if isinstance(b, bool) or isinstance(a, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


@pytest.mark.parametrize("group, entry", CASES)
def test_decode_every_encoding(group, entry):
    value, _ = _value(entry)
    for enc in entry["msgpack"]:
        got = upcall.unpackb(_hexbytes(enc))
        assert _same(got, value), (enc, got, value)
        # The same through a Decoder and a non-bytes buffer.
        assert _same(upcall.Decoder().decode(bytearray(_hexbytes(enc))), value)


@pytest.mark.parametrize("group, entry", CASES)
def test_encode_is_smallest_listed(group, entry):
    value, is_float = _value(entry)
    encodings = [_hexbytes(e) for e in entry["msgpack"]]
    packed = upcall.packb(value)
    if is_float:
        # Floats are always packed as float64 (0xcb), which must be listed.
        assert packed[0] == 0xCB
        assert packed in encodings
        return
    assert packed in encodings
    # Integers listed with float encodings too (4294967296 as float32 is 5
    # bytes): the canonical encoding is the smallest *integer* one.
    same_kind = [e for e in encodings if e[0] not in (0xCA, 0xCB)] or encodings
    assert len(packed) == min(len(e) for e in same_kind)
    assert _same(upcall.unpackb(packed), value)


def test_suite_is_complete():
    # Guards against a silently empty or partial parametrisation.
    groups = {p.values[0].split(".")[1] for p in CASES}
    assert groups >= {"nil", "bool", "binary", "number-positive", "number-negative",
                      "number-float", "number-bignum", "string-ascii", "string-utf8",
                      "string-emoji", "array", "map", "nested", "timestamp", "ext"}
    assert len(CASES) >= 80


@pytest.mark.parametrize("value", [2**64, 2**64 + 1, -(2**63) - 1, -(2**64), 10**30, -(10**30)])
def test_bignum_outside_range_overflows(value):
    with pytest.raises(OverflowError):
        upcall.packb(value)
    with pytest.raises(OverflowError):
        upcall.packb({"nested": [value]})


@pytest.mark.parametrize("value, hexenc", [
    (2**64 - 1, "cf-ff-ff-ff-ff-ff-ff-ff-ff"),
    (2**63, "cf-80-00-00-00-00-00-00-00"),
    (2**63 - 1, "cf-7f-ff-ff-ff-ff-ff-ff-ff"),
    (-(2**63), "d3-80-00-00-00-00-00-00-00"),
])
def test_range_edges_pack(value, hexenc):
    assert upcall.packb(value) == _hexbytes(hexenc)
    assert upcall.unpackb(_hexbytes(hexenc)) == value
