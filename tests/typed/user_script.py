"""A typed program using upcall's public API: ``mypy --strict`` must find
nothing to report in it (tests/packaging/test_stubs.py).  Not run, only checked."""
from __future__ import annotations

import concurrent.futures
import logging
import pickle
from typing import Any

import upcall
from upcall.aio import AsyncSubscription


class Prices(upcall.Handler):
    def on_message(self, msg: Any) -> None:
        print(msg)


def on_trade(msg: dict[str, Any]) -> None:
    print(msg["px"])


def on_error(exc: BaseException, msg: Any) -> None:
    if isinstance(exc, upcall.DecodeError):
        topic: bytes | None = exc.topic
        offset: int | None = exc.offset
        print(topic, offset, exc.reason)


def main() -> int:
    logging.getLogger("upcall").setLevel(logging.WARNING)
    includes: list[str] = upcall.get_include()
    pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="feeds")
    with upcall.Bus(io_threads=1, thread_factory=upcall.python_threads) as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", kind="pub", linger=0.5, bind=True)
        sub = bus.subscribe(pub.last_endpoint, on_trade, topics=["trades.", b"fills."],
                            on_error=on_error, socket_options={"heartbeat_ivl": 1000})
        other = bus.subscribe([pub.last_endpoint], Prices(), thread_factory=pool.submit)
        caller = bus.subscribe(pub.last_endpoint, on_trade, delivery="caller")
        pub.send("trades.AAPL", {"px": 187.25, "qty": 100}, timeout=1.0)
        pub.send(b"trades.MSFT", {"px": 410.5})
        pub.send_packed("trades.raw", upcall.packb({"px": 1.0}))
        delivered: int = caller.poll(timeout=0.1, max_messages=10)
        stats: dict[str, int] = sub.stats
        name: str | None = sub.thread_name
        sub.subscribe("quotes.")
        sub.unsubscribe(b"quotes.")
        print(delivered, stats, name, other.last_endpoints, includes)
        asub: AsyncSubscription | None = None
        print(asub)
    try:
        upcall.unpackb(b"\xc1")
    except upcall.UpcallError as exc:
        err = pickle.loads(pickle.dumps(exc))
        print(type(err).__name__)
    try:
        upcall.Bus().publisher("tcp://127.0.0.1")
    except upcall.ZMQError as exc:
        print(exc.errno)
    except ValueError as exc:
        print(exc)
    ts = upcall.Timestamp(1_700_000_000, 5)
    dec = upcall.Decoder(timestamp="datetime", max_depth=64)
    print(dec.decode(upcall.packb([ts])), upcall.Encoder(default=str).encode(object()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
