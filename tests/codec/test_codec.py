"""upcall's msgpack codec: semantics, limits, and every error path."""
import collections
import datetime as dt
import enum
import math
import pickle
import struct
import sys
import threading
import tracemalloc

import pytest

import upcall
from upcall import DecodeError, Decoder, Encoder, ExtType, Timestamp, packb, unpackb

UTC = dt.timezone.utc


# ------------------------------------------------------------------ round trips

@pytest.mark.parametrize("value", [
    None, True, False, 0, 1, -1, 127, 128, -32, -33, 255, 256, 65535, 65536,
    2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), -(2**31) - 1,
    0.0, -0.0, 1.5, 1e300, -1e-300, math.inf, -math.inf,
    "", "a", "x" * 31, "x" * 32, "x" * 255, "x" * 256, "x" * 65536, "héllo wörld", "🍺" * 10,
    b"", b"\x00\xff", b"x" * 256, b"y" * 70000,
    [], [1, [2, [3, []]]], list(range(16)), list(range(70000)),
    {}, {"a": 1}, {i: i for i in range(16)}, {str(i): [i] for i in range(70000)},
    {1: "int key", b"k": "bytes key", None: 0, 1.5: "float key", True: "bool key"},
    Timestamp(0, 0), Timestamp(-1, 999999999), Timestamp(2**63 - 1, 5), Timestamp(-(2**63), 0),
    ExtType(5, b"abc"), ExtType(-128, b""), ExtType(127, b"x" * 300),
])
def test_round_trip(value):
    packed = packb(value)
    assert isinstance(packed, bytes)
    assert unpackb(packed) == value
    assert Decoder().decode(packed) == value
    assert Encoder().encode(value) == packed


def test_nan_round_trip():
    assert math.isnan(unpackb(packb(math.nan)))


def test_tuple_decodes_as_list():
    assert unpackb(packb((1, (2, 3)))) == [1, [2, 3]]


def test_buffers_pack_as_bin():
    assert packb(bytearray(b"ab")) == b"\xc4\x02ab"
    assert packb(memoryview(b"ab")) == b"\xc4\x02ab"
    assert unpackb(packb(bytearray(b"ab"))) == b"ab"


def test_smallest_encodings():
    assert packb(0) == b"\x00"
    assert packb(-1) == b"\xff"
    assert packb(200) == b"\xcc\xc8"
    assert packb(-200) == b"\xd1\xff\x38"
    assert packb("a" * 31)[:1] == b"\xbf"
    assert packb("a" * 32)[:2] == b"\xd9\x20"
    assert packb([0] * 15)[:1] == b"\x9f"
    assert packb([0] * 16)[:3] == b"\xdc\x00\x10"
    assert packb(1.0) == b"\xcb" + struct.pack(">d", 1.0)


def test_decoded_types():
    assert type(unpackb(b"\xcb" + struct.pack(">d", 2.0))) is float
    assert type(unpackb(b"\xca" + struct.pack(">f", 0.5))) is float
    assert unpackb(b"\xca" + struct.pack(">f", 0.5)) == 0.5
    assert unpackb(b"\xc3") is True
    assert unpackb(b"\xc0") is None
    assert type(unpackb(b"\xd0\x05")) is int


# ------------------------------------------------------------------ subclasses and types

class MyInt(int):
    pass


class MyStr(str):
    pass


class MyDict(dict):
    pass


class MyList(list):
    pass


class MyTuple(tuple):
    pass


class MyFloat(float):
    pass


class Color(enum.IntEnum):
    RED = 1


def test_subclasses_encode_as_base():
    assert packb(MyInt(5)) == packb(5)
    assert packb(MyInt(2**64 - 1)) == packb(2**64 - 1)
    assert packb(MyStr("é")) == packb("é")
    assert packb(MyDict(a=1)) == packb({"a": 1})
    assert packb(MyList([1, 2])) == packb([1, 2])
    assert packb(MyTuple((1, 2))) == packb([1, 2])
    assert packb(MyFloat(1.5)) == packb(1.5)
    assert packb(Color.RED) == packb(1)
    assert packb(collections.OrderedDict(b=1, a=2)) == packb({"b": 1, "a": 2})
    assert packb(collections.namedtuple("P", "x y")(1, 2)) == packb([1, 2])
    with pytest.raises(OverflowError):
        packb(MyInt(2**64))


@pytest.mark.parametrize("value", [object(), {1, 2}, frozenset(), 1j, dt.date(2020, 1, 1),
                                   dt.timedelta(1), type, len, range(3)])
def test_unsupported_types(value):
    with pytest.raises(TypeError, match=type(value).__qualname__):
        packb(value)
    with pytest.raises(TypeError):
        packb({"nested": [value]})


def test_int_range_errors():
    for v in (2**64, -(2**63) - 1):
        with pytest.raises(OverflowError, match=str(v)):
            packb(v)


def test_surrogate_str_is_an_error():
    with pytest.raises(UnicodeEncodeError):
        packb("\ud800")


# ------------------------------------------------------------------ Timestamp / datetime / ExtType

def test_timestamp_value_semantics():
    t = Timestamp(10, 5)
    assert (t.seconds, t.nanoseconds) == (10, 5)
    assert t == Timestamp(10, 5) and t != Timestamp(10, 6)
    assert hash(t) == hash(Timestamp(10, 5))
    assert Timestamp(1, 0) < Timestamp(1, 1) < Timestamp(2, 0)
    assert Timestamp(5) == Timestamp(5, 0)
    assert pickle.loads(pickle.dumps(t)) == t
    assert "seconds=10" in repr(t)
    with pytest.raises(AttributeError):
        t.seconds = 3
    assert t != (10, 5)


def test_timestamp_argument_errors():
    with pytest.raises(ValueError, match="nanoseconds"):
        Timestamp(0, 10**9)
    with pytest.raises(ValueError):
        Timestamp(0, -1)
    with pytest.raises(OverflowError):
        Timestamp(2**63, 0)
    with pytest.raises(TypeError):
        Timestamp(1.5, 0)
    with pytest.raises(TypeError):
        Timestamp("1")


def test_timestamp_datetime_conversions():
    d = dt.datetime(2018, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    t = Timestamp.from_datetime(d)
    assert t == Timestamp(1514862245, 678901000)
    assert t.to_datetime() == d
    assert Timestamp(-1, 500000000).to_datetime() == dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC)
    # nanoseconds are truncated to microseconds
    assert Timestamp(0, 1999).to_datetime().microsecond == 1
    other_tz = dt.timezone(dt.timedelta(hours=5))
    assert Timestamp.from_datetime(d.astimezone(other_tz)) == t
    with pytest.raises(TypeError, match="naive"):
        Timestamp.from_datetime(dt.datetime(2020, 1, 1))
    with pytest.raises(TypeError):
        Timestamp.from_datetime("2020")
    with pytest.raises(OverflowError):
        Timestamp(2**62, 0).to_datetime()


def test_aware_datetime_packs_as_timestamp():
    d = dt.datetime(2018, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert packb(d) == packb(Timestamp(1514862245, 678901000))
    assert unpackb(packb(d)) == Timestamp(1514862245, 678901000)
    assert unpackb(packb(d), timestamp="datetime") == d
    assert Decoder(timestamp="datetime").decode(packb([d])) == [d]
    with pytest.raises(TypeError, match="naive"):
        packb(dt.datetime(2020, 1, 1))


def test_timestamp_forms_are_smallest():
    assert len(packb(Timestamp(2**32 - 1, 0))) == 6
    assert len(packb(Timestamp(2**32, 0))) == 10
    assert len(packb(Timestamp(0, 1))) == 10
    assert len(packb(Timestamp(2**34, 0))) == 15
    assert len(packb(Timestamp(-1, 0))) == 15


def test_datetime_out_of_range_is_decode_error():
    data = packb(Timestamp(2**62, 0))
    assert unpackb(data) == Timestamp(2**62, 0)
    with pytest.raises(DecodeError) as ei:
        unpackb(data, timestamp="datetime")
    assert ei.value.reason == "timestamp_range" and ei.value.offset == 0


def test_exttype():
    e = ExtType(3, b"ab")
    assert (e.code, e.data) == (3, b"ab")
    assert e == ExtType(3, b"ab") and e != ExtType(4, b"ab") and e != ExtType(3, b"a")
    assert hash(e) == hash(ExtType(3, b"ab"))
    assert ExtType(3, bytearray(b"ab")) == e
    assert pickle.loads(pickle.dumps(e)) == e
    for n in (0, 1, 2, 3, 4, 8, 16, 17, 255, 256, 65536):
        x = ExtType(1, b"z" * n)
        assert unpackb(packb(x)) == x
    with pytest.raises(ValueError, match="-1"):
        ExtType(-1, b"")
    with pytest.raises(ValueError):
        ExtType(128, b"")
    with pytest.raises(TypeError):
        ExtType(1, "str")
    with pytest.raises(TypeError):
        ExtType("1", b"")


def test_unknown_ext_decodes_to_exttype_and_is_hashable_key():
    assert unpackb(b"\xd4\x07\x01") == ExtType(7, b"\x01")
    assert unpackb(b"\x81\xd4\x07\x01\x00") == {ExtType(7, b"\x01"): 0}


# ------------------------------------------------------------------ decode errors

def _err(data, **kw):
    with pytest.raises(DecodeError) as ei:
        unpackb(data, **kw)
    e = ei.value
    assert isinstance(e, ValueError)
    assert f"byte {e.offset}" in str(e)
    return e


@pytest.mark.parametrize("data, offset, reason", [
    (b"", 0, "truncated"),
    (b"\xc1", 0, "reserved"),
    (b"\x92\x01\xc1", 2, "reserved"),
    (b"\xcd\x00", 0, "truncated"),
    (b"\x91\xcf\x00", 1, "truncated"),
    (b"\xcb\x00\x00", 0, "truncated"),
    (b"\xa3ab", 0, "length"),
    (b"\xd9", 0, "truncated"),
    (b"\xdb\xff\xff\xff\xff", 0, "length"),
    (b"\xc6\x7f\xff\xff\xff\x00", 0, "length"),
    (b"\x93\x01\x02", 0, "length"),
    (b"\x81\x01", 0, "length"),
    (b"\x82\xa1a\x01\xa1", 4, "length"),
    (b"\x82\xa1a\x01", 0, "length"),
    (b"\xd4\x01", 0, "length"),
    (b"\xc7\x05\x01ab", 0, "length"),
    (b"\xd5\xff\x00\x00", 0, "timestamp"),       # timestamp of 2 bytes
    (b"\xc7\x03\xff\x00\x00\x00", 0, "timestamp"),
    (b"\xd7\xff\xff\xff\xff\xfc\x00\x00\x00\x00", 0, "timestamp"),   # nsec > 999999999
    (b"\xc7\x0c\xff\x3b\x9a\xca\x00" + b"\x00" * 8, 0, "timestamp"),
    (b"\x91\xa2\xff\xfe", 1, "utf8"),
    (b"\xa3\xed\xa0\x80", 0, "utf8"),            # a UTF-8-encoded surrogate
    (b"\x81\xa2\xc3\x28\x01", 1, "utf8"),       # invalid UTF-8 in a key
    (b"\x81\x90\x01", 1, "unhashable_key"),
    (b"\x81\x80\x01", 1, "unhashable_key"),
    (b"\x01\x02", 1, "trailing"),
    (b"\x90\xc0", 1, "trailing"),
    (b"\xc0\xc1", 1, "trailing"),
])
def test_decode_errors(data, offset, reason):
    e = _err(data)
    assert (e.offset, e.reason) == (offset, reason)
    # A Decoder and a memoryview give the same error.
    with pytest.raises(DecodeError) as ei:
        Decoder().decode(memoryview(data))
    assert (ei.value.offset, ei.value.reason) == (offset, reason)


def test_every_truncation_of_a_valid_message_is_an_error():
    msg = packb({"id": 123456, "sym": "AAPL", "px": [1.5, -2, None, True, b"x", "é" * 3],
                 "t": Timestamp(1, 2), "e": ExtType(1, b"abc"), "n": {"k": [[], {}]}})
    for i in range(len(msg)):
        with pytest.raises(DecodeError) as ei:
            unpackb(msg[:i])
        assert 0 <= ei.value.offset <= i
        assert ei.value.reason in ("truncated", "length")


def test_depth_limit():
    deep = b"\x91" * 600 + b"\xc0"
    e = _err(deep)
    assert (e.reason, e.offset) == ("depth", 512)
    assert "max_depth=512" in str(e)
    assert unpackb(b"\x91" * 512 + b"\xc0") is not None
    e = _err(b"\x91" * 5 + b"\xc0", max_depth=4)
    assert (e.reason, e.offset) == ("depth", 4)
    assert unpackb(b"\x91" * 4 + b"\xc0", max_depth=4) == [[[[None]]]]
    assert unpackb(b"\x05", max_depth=0) == 5
    assert _err(b"\x90", max_depth=0).reason == "depth"
    assert _err(b"\x81\xa1a" * 10 + b"\xc0", max_depth=9).reason == "depth"
    # The deepest allowed limit works without exhausting the C stack.
    n = upcall._codec.MAX_DEPTH_LIMIT
    assert unpackb(b"\x91" * n + b"\xc0", max_depth=n) is not None
    assert _err(b"\x91" * 100000 + b"\xc0", max_depth=n).offset == n


def test_max_len():
    assert unpackb(packb("abc"), max_len=3) == "abc"
    for v in ("abcd", b"abcd", [1, 2, 3, 4], {1: 1, 2: 2, 3: 3, 4: 4}, ExtType(1, b"abcd"), {"abcd": 1}):
        e = _err(packb(v), max_len=3)
        assert e.reason == "max_len" and "max_len=3" in str(e)
    assert Decoder(max_len=3).max_len == 3
    assert Decoder().max_len is None


def test_huge_length_prefix_does_not_allocate():
    tracemalloc.start()
    try:
        for data in (b"\xdd\xff\xff\xff\xff\x00\x00", b"\xdf\x7f\xff\xff\xff\x00\x00",
                     b"\xdb\x7f\xff\xff\xff\x00", b"\xc6\xff\xff\xff\xff\x00",
                     b"\xc9\xff\xff\xff\xff\x01\x00", b"\x91\xdd\x80\x00\x00\x00\x01"):
            e = _err(data)
            assert e.reason == "length"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_decode_error_pickles():
    e = _err(b"\xc1")
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.offset, e2.reason, str(e2)) == (e.offset, e.reason, str(e))


def test_ext_hook_values_are_bytes():
    x = unpackb(b"\xc7\x03\x05abc")
    assert type(x.data) is bytes and x.data == b"abc"


# ------------------------------------------------------------------ argument errors

def test_unpackb_argument_errors():
    for bad in ("str", 5, None, [1], object()):
        with pytest.raises(TypeError, match="data"):
            unpackb(bad)
    with pytest.raises(TypeError, match="buf"):
        Decoder().decode("str")
    with pytest.raises(ValueError, match="timestamp"):
        unpackb(b"\xc0", timestamp="iso")
    with pytest.raises(TypeError, match="timestamp"):
        unpackb(b"\xc0", timestamp=1)
    with pytest.raises(ValueError, match="max_depth"):
        unpackb(b"\xc0", max_depth=-1)
    with pytest.raises(ValueError, match="max_depth"):
        unpackb(b"\xc0", max_depth=10**6)
    with pytest.raises(TypeError, match="max_depth"):
        unpackb(b"\xc0", max_depth=1.5)
    with pytest.raises(TypeError, match="max_depth"):
        unpackb(b"\xc0", max_depth="5")
    with pytest.raises(ValueError, match="max_len"):
        unpackb(b"\xc0", max_len=-1)
    with pytest.raises(TypeError, match="max_len"):
        unpackb(b"\xc0", max_len="5")
    with pytest.raises(TypeError):
        unpackb(b"\xc0", max_lenn=5)
    with pytest.raises(TypeError):
        unpackb(b"\xc0", 5)
    with pytest.raises(TypeError):
        Decoder(5)
    with pytest.raises(TypeError, match="max_depth"):
        Encoder(max_depth=None)
    with pytest.raises(TypeError):
        packb()
    with pytest.raises(TypeError):
        packb(1, 2)


def test_decode_accepts_any_contiguous_buffer():
    data = packb({"a": [1, 2]})
    for buf in (data, bytearray(data), memoryview(data), memoryview(b"xx" + data)[2:]):
        assert unpackb(buf) == {"a": [1, 2]}
    strided = memoryview(bytes(b for c in data for b in (c, 0)))[::2]
    assert unpackb(strided) == {"a": [1, 2]}


def test_decoder_properties():
    d = Decoder(timestamp="datetime", max_depth=7, max_len=100)
    assert (d.timestamp, d.max_depth, d.max_len) == ("datetime", 7, 100)
    d = Decoder()
    assert (d.timestamp, d.max_depth, d.max_len) == ("timestamp", 512, None)
    assert Encoder().max_depth == 512


# ------------------------------------------------------------------ encoder limits

def test_cyclic_and_deep_objects():
    a = []
    a.append(a)
    with pytest.raises(ValueError, match="max_depth"):
        packb(a)
    d = {}
    d["self"] = d
    with pytest.raises(ValueError, match="max_depth"):
        packb(d)
    deep = None
    for _ in range(600):
        deep = [deep]
    with pytest.raises(ValueError):
        packb(deep)
    assert Encoder(max_depth=600).encode(deep)[:1] == b"\x91"
    assert Encoder(max_depth=0).encode(5) == b"\x05"
    with pytest.raises(ValueError):
        Encoder(max_depth=0).encode([])
    # the encoder still works after the errors
    assert packb([1]) == b"\x91\x01"


class _PackingTZ(dt.tzinfo):
    """A tzinfo whose utcoffset packs: re-enters the encoder."""

    def utcoffset(self, d):
        packb({"inner": [1, 2, 3]})
        return dt.timedelta(0)

    def dst(self, d):
        return None


class _MutatingTZ(dt.tzinfo):
    def __init__(self, target):
        self.target = target

    def utcoffset(self, d):
        self.target.append(1)
        self.target.clear() if isinstance(self.target, dict) else None
        return dt.timedelta(0)

    def dst(self, d):
        return None


def test_reentrant_pack():
    d = dt.datetime(2020, 1, 1, tzinfo=_PackingTZ())
    value = {"a": [1, d, "x" * 100], "b": 2}
    assert unpackb(packb(value)) == {"a": [1, Timestamp.from_datetime(d.replace(tzinfo=UTC)), "x" * 100], "b": 2}


def test_container_mutated_while_packing():
    lst = []
    lst.extend([1, dt.datetime(2020, 1, 1, tzinfo=_MutatingTZ(lst)), 3])
    with pytest.raises(RuntimeError, match="changed size"):
        packb(lst)


def test_large_buffer_not_pinned_and_reused():
    big = b"x" * (4 << 20)
    assert len(packb(big)) == len(big) + 5
    assert packb(1) == b"\x01"


def test_threads_share_default_codec():
    msg = {"id": 1, "sym": "AAPL", "px": [1.5] * 50}
    errors = []

    def work():
        try:
            for _ in range(2000):
                assert unpackb(packb(msg)) == msg
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# ------------------------------------------------------------------ key cache

def test_key_cache_hits_share_objects_and_collisions_are_correct():
    dec = Decoder()
    a = dec.decode(packb({"symbol": 1}))
    b = dec.decode(packb({"symbol": 2}))
    assert next(iter(a)) is next(iter(b))
    # Many distinct short keys (cache collisions and evictions), long keys,
    # non-ASCII keys, keys that differ only in their middle bytes.
    keys = [f"k{i}" for i in range(3000)] + ["x" * 17, "é", "ab" * 8, "abcdefghijklmnop",
                                              "abcdefgXijklmnop", "", "a\x00b"]
    m = {k: i for i, k in enumerate(keys)}
    for _ in range(3):
        assert dec.decode(packb(m)) == m
    for n in range(0, 18):
        k1 = "".join(chr(97 + (i % 26)) for i in range(n))
        for pos in range(n):
            k2 = k1[:pos] + "Z" + k1[pos + 1:]
            assert dec.decode(packb({k1: 1, k2: 2})) == {k1: 1, k2: 2}


def test_memory_is_stable_over_many_decodes():
    msg = packb({"id": 1, "sym": "AAPL", "sizes": [100, 200, 300], "e": ExtType(1, b"x"),
                 "t": Timestamp(1, 2), "b": b"bin", "u": "é"})
    bad = [b"\x92\x01\xc1", b"\x81\xa1a", b"\x81\x90\x01", b"\xa2\xff\xfe"]
    for _ in range(1000):
        unpackb(msg)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(20000):
            unpackb(msg)
            packb({"k": [1, 2, "x"]})
            for b in bad:
                try:
                    unpackb(b)
                except DecodeError:
                    pass
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert after - before < 200_000


def test_public_names():
    assert upcall.DecodeError is DecodeError and issubclass(DecodeError, ValueError)
    for name in ("packb", "unpackb", "Encoder", "Decoder", "Timestamp", "ExtType"):
        assert getattr(upcall, name) is getattr(upcall._codec, name)


def test_value_cache_is_transparent():
    dec = Decoder()
    vals = [f"v{i}" for i in range(2000)] + ["abcdefghijklmnop", "abcdefgXijklmnop", "é", "",
                                             "x" * 16, "x" * 17, "AAPL.OQ", "AAPL.OR"]
    for _ in range(3):
        assert dec.decode(packb(vals)) == vals
    a, b = dec.decode(packb(["AAPL.OQ", "AAPL.OQ"]))
    assert a == b == "AAPL.OQ"
