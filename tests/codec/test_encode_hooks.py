"""Encoding hooks: packb/Encoder(default=...), other libraries' timestamp and
ext types, and the publisher's default= and encoder= (real sockets)."""
import dataclasses
import datetime as dt
import decimal
import enum
import uuid

import pytest

import upcall
from helpers import Collector, DEADLINE, warm_up

msgpack = pytest.importorskip("msgpack")


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Color(enum.Enum):
    RED = "red"


def to_builtin(o):
    """A default= hook for the usual suspects."""
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    if isinstance(o, (uuid.UUID, decimal.Decimal)):
        return str(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if isinstance(o, enum.Enum):
        return o.value
    if isinstance(o, dt.date):
        return o.isoformat()
    raise TypeError(f"cannot convert {type(o).__name__}")


UNKNOWN = {"p": Point(1, 2), "u": uuid.UUID(int=7), "d": decimal.Decimal("1.25"),
           "s": {3, 1, 2}, "c": Color.RED, "day": dt.date(2024, 2, 29)}
CONVERTED = {"p": {"x": 1, "y": 2}, "u": str(uuid.UUID(int=7)), "d": "1.25",
             "s": [1, 2, 3], "c": "red", "day": "2024-02-29"}


# ---- the codec -----------------------------------------------------------------

def test_default_converts_unknown_types():
    data = upcall.packb(UNKNOWN, default=to_builtin)
    assert data == upcall.packb(CONVERTED)
    assert msgpack.unpackb(data) == CONVERTED
    enc = upcall.Encoder(default=to_builtin)
    assert enc.default is to_builtin
    assert enc.encode(UNKNOWN) == data
    assert enc.encode([UNKNOWN, [UNKNOWN]]) == upcall.packb([CONVERTED, [CONVERTED]])


def test_default_is_only_called_for_unknown_types():
    seen = []

    def hook(o):
        seen.append(o)
        return "x"
    value = [1, "s", 1.5, None, True, b"b", {"k": (1, 2)}, upcall.Timestamp(1, 2),
             upcall.ExtType(5, b"e"), dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)]
    assert upcall.packb(value, default=hook) == upcall.packb(value)
    assert seen == []


def test_default_result_may_need_default_again():
    # Point -> dict holding a Decimal -> str: each result is packed like any value.
    def hook(o):
        if isinstance(o, Point):
            return {"x": decimal.Decimal(o.x)}
        return str(o)
    assert upcall.unpackb(upcall.packb([Point(3, 4)], default=hook)) == [{"x": "3"}]


def test_default_recursion_is_bounded():
    with pytest.raises(ValueError, match="max_depth"):
        upcall.packb(object(), default=lambda o: o)
    with pytest.raises(ValueError, match="max_depth=3"):
        upcall.Encoder(max_depth=3, default=lambda o: [o]).encode(object())


def test_default_exception_propagates_as_is():
    class Refused(Exception):
        pass
    err = Refused("no")

    def hook(o):
        raise err
    with pytest.raises(Refused) as info:
        upcall.packb({"a": [object()]}, default=hook)
    assert info.value is err
    # The encoder is still usable afterwards (its buffer was released).
    enc = upcall.Encoder(default=hook)
    with pytest.raises(Refused):
        enc.encode(object())
    assert enc.encode({"a": 1}) == upcall.packb({"a": 1})


def test_without_default_the_error_names_the_type_and_the_way_out():
    with pytest.raises(TypeError, match=r"'Point'.*default="):
        upcall.packb(Point(1, 2))


@pytest.mark.parametrize("bad", [1, "str", b"x"])
def test_default_must_be_callable(bad):
    with pytest.raises(TypeError, match="default"):
        upcall.packb(1, default=bad)
    with pytest.raises(TypeError, match="default"):
        upcall.Encoder(default=bad)


def test_msgpack_timestamp_and_ext_types():
    ts = msgpack.Timestamp(1700000000, 123456789)
    ext = msgpack.ExtType(7, b"\x01\x02")
    data = upcall.packb({"ts": ts, "ext": ext, "neg": msgpack.Timestamp(-5, 1)})
    # Byte for byte what msgpack writes, and read back as upcall's own types.
    assert data == msgpack.packb({"ts": ts, "ext": ext, "neg": msgpack.Timestamp(-5, 1)})
    assert upcall.unpackb(data) == {"ts": upcall.Timestamp(1700000000, 123456789),
                                    "ext": upcall.ExtType(7, b"\x01\x02"),
                                    "neg": upcall.Timestamp(-5, 1)}


def test_msgspec_ext_type():
    msgspec = pytest.importorskip("msgspec")
    data = upcall.packb([msgspec.msgpack.Ext(3, b"abc"), msgspec.msgpack.Ext(-9, bytearray(b"z"))])
    assert data == msgspec.msgpack.encode([msgspec.msgpack.Ext(3, b"abc"),
                                           msgspec.msgpack.Ext(-9, b"z")])
    assert upcall.unpackb(data) == [upcall.ExtType(3, b"abc"), upcall.ExtType(-9, b"z")]


def test_namedtuples_still_pack_as_arrays():
    # msgpack's ExtType is recognised by its module and name, not as "a namedtuple".
    import collections
    ExtType = collections.namedtuple("ExtType", "code data")
    assert upcall.packb(ExtType(1, b"x")) == upcall.packb([1, b"x"])


# ---- the publisher -------------------------------------------------------------

def _pull_pair(bus, endpoints, **pub_kwargs):
    ep = endpoints("inproc")
    got = Collector()
    sub = bus.subscribe(ep, got, kind="pull", bind=True)
    pub = bus.publisher(ep, kind="push", bind=False, **pub_kwargs)
    return sub, pub, got


def test_publisher_default(endpoints):
    with upcall.Bus() as bus:
        sub, pub, got = _pull_pair(bus, endpoints, default=to_builtin)
        pub.send(b"t", UNKNOWN)
        pub.send(b"t", [Point(5, 6)])
        got.wait(2)
        assert got.items == [CONVERTED, [{"x": 5, "y": 6}]]
        with pytest.raises(TypeError, match="cannot convert object"):
            pub.send(b"t", object())   # the hook's own exception
        assert sub.stats["decode_errors"] == 0


def test_publisher_encoder_replaces_the_codec(endpoints):
    calls = []

    def encoder(obj):
        calls.append(obj)
        return msgpack.packb({"wrapped": obj})
    with upcall.Bus() as bus:
        sub, pub, got = _pull_pair(bus, endpoints, encoder=encoder)
        pub.send(b"t", 1)
        pub.send("t", [1, 2])
        got.wait(2)
        assert got.items == [{"wrapped": 1}, {"wrapped": [1, 2]}]
        assert calls == [1, [1, 2]]


def test_publisher_encoder_msgspec(endpoints):
    msgspec = pytest.importorskip("msgspec")

    class Trade(msgspec.Struct):
        sym: str
        px: float
    with upcall.Bus() as bus:
        sub, pub, got = _pull_pair(bus, endpoints, encoder=msgspec.msgpack.Encoder().encode)
        pub.send(b"trades", Trade("AAPL", 187.25))
        got.wait(1)
        assert got.items == [{"sym": "AAPL", "px": 187.25}]


@pytest.mark.parametrize("result", [None, 17, "text", [b"x"]])
def test_publisher_encoder_must_return_bytes(endpoints, result):
    with upcall.Bus() as bus:
        sub, pub, got = _pull_pair(bus, endpoints, encoder=lambda obj: result)
        with pytest.raises(TypeError, match=f"encoder returned {type(result).__name__}.*bytes-like"):
            pub.send(b"t", 1)
        assert sub.stats["received"] == 0


def test_publisher_encoder_exception_propagates(endpoints):
    class Boom(Exception):
        pass

    def encoder(obj):
        raise Boom(obj)
    with upcall.Bus() as bus:
        sub, pub, got = _pull_pair(bus, endpoints, encoder=encoder)
        with pytest.raises(Boom):
            pub.send(b"t", 1)


def test_publisher_encoder_bytes_like_results(endpoints):
    results = iter([bytearray(upcall.packb(1)), memoryview(upcall.packb(2))])
    with upcall.Bus() as bus:
        sub, pub, got = _pull_pair(bus, endpoints, encoder=lambda obj: next(results))
        pub.send(b"t", None)
        pub.send(b"t", None)
        got.wait(2)
        assert got.items == [1, 2]


def test_publisher_hook_arguments(endpoints):
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        with pytest.raises(TypeError, match="default"):
            bus.publisher(ep, default=3, bind=True)
        with pytest.raises(TypeError, match="encoder"):
            bus.publisher(ep, encoder=b"x", bind=True)
        with pytest.raises(TypeError, match="not both"):
            bus.publisher(ep, default=str, encoder=upcall.packb, bind=True)


def test_pyzmq_subscriber_reads_default_and_encoder_output(endpoints):
    zmq = pytest.importorskip("zmq")
    ep = endpoints("tcp")
    ctx = zmq.Context()
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.RCVTIMEO, int(DEADLINE * 1000))
    try:
        with upcall.Bus() as bus:
            pub = bus.publisher(ep, default=to_builtin, bind=True)
            s.connect(ep)
            # Slow joiner: send until something arrives.
            frames = None
            while frames is None:
                pub.send(b"x", UNKNOWN)
                if s.poll(10):
                    frames = s.recv_multipart()
            assert frames[0] == b"x"
            assert msgpack.unpackb(frames[1]) == CONVERTED
    finally:
        s.close(0)
        ctx.term()


def test_sub_with_warm_up_and_default(endpoints):
    # PUB/SUB as well: the hook runs on the sending thread, the subscriber
    # sees plain msgpack.
    with upcall.Bus() as bus:
        ep = endpoints("ipc")
        got = Collector()
        bus.subscribe(ep, got, bind=True)
        pub = bus.publisher(ep, bind=False, default=to_builtin)
        warm_up(pub, got)
        pub.send(b"data", {"when": dt.date(2000, 1, 1)})
        got.wait(1)
        assert got.items == [{"when": "2000-01-01"}]
