"""Publishing types the msgpack codec does not know: default= and encoder=.

    bus.publisher(endpoint, default=to_builtin)     # a hook of upcall's encoder
    bus.publisher(endpoint, encoder=enc.encode)     # a complete replacement (msgspec)

Subscribers see plain msgpack either way.
"""
import dataclasses
import datetime
import decimal
import enum
import threading
import uuid

import upcall


class Side(enum.Enum):
    BUY = "buy"
    SELL = "sell"


@dataclasses.dataclass
class Order:
    id: uuid.UUID
    side: Side
    px: decimal.Decimal
    qty: int
    tags: set
    day: datetime.date


def to_builtin(obj):
    """default=: called for each object upcall cannot pack; returns one it can."""
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)         # its fields come back here if needed
    if isinstance(obj, (uuid.UUID, decimal.Decimal)):
        return str(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, datetime.date):
        return obj.isoformat()
    raise TypeError(f"cannot publish {type(obj).__name__!r}")


ORDER = Order(uuid.UUID(int=42), Side.BUY, decimal.Decimal("187.25"), 100,
              {"algo", "dark"}, datetime.date(2024, 5, 17))


def receive_one(bus, endpoint, publisher_kwargs, obj):
    """Send obj through a PUSH publisher made with publisher_kwargs; return
    what a PULL subscriber decoded."""
    got = []
    arrived = threading.Event()
    bus.subscribe(endpoint, lambda msg: (got.append(msg), arrived.set()), kind="pull", bind=True)
    with bus.publisher(endpoint, kind="push", bind=False, **publisher_kwargs) as pub:
        pub.send(b"orders", obj)
    if not arrived.wait(10):
        raise SystemExit("nothing arrived")
    return got[0]


with upcall.Bus() as bus:
    # 1. default=: upcall's own encoder, with a hook for what it does not know.
    print("default=:", receive_one(bus, "inproc://orders-1", {"default": to_builtin}, ORDER))

    # The codec alone takes the same hook; an exception from it propagates.
    data = upcall.packb({"order": ORDER}, default=to_builtin)
    print("packb(default=) ->", len(data), "bytes")
    try:
        upcall.packb(object(), default=to_builtin)
    except TypeError as exc:
        print("hook refused:", exc)

    # 2. encoder=: a complete replacement, e.g. msgspec's encoder with its enc_hook.
    try:
        import msgspec
    except ImportError:
        print("encoder=: msgspec is not installed, skipped")
    else:
        class Fill(msgspec.Struct):
            order_id: uuid.UUID
            px: decimal.Decimal
            qty: int

        enc = msgspec.msgpack.Encoder(decimal_format="number")
        fill = Fill(uuid.UUID(int=42), decimal.Decimal("187.25"), 40)
        print("encoder=:", receive_one(bus, "inproc://orders-2", {"encoder": enc.encode}, fill))
