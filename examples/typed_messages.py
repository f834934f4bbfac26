"""Typed messages: subscribe(decoder=...) and raw=True.

    bus.subscribe(endpoint, on_trade, decoder=msgspec.msgpack.Decoder(Trade).decode)
    bus.subscribe(endpoint, on_payload, raw=True)

The decoder validates each payload into a Trade; one that does not fit is a
decode error (counted, handed to on_error with its topic and the raw
payload), and delivery goes on.
"""
import threading

import upcall

try:
    import msgspec
except ImportError:
    msgspec = None

N_GOOD = 3


def main():
    if msgspec is None:
        print("decoder=: msgspec is not installed, skipped")
        return

    class Trade(msgspec.Struct, frozen=True):
        sym: str
        px: float
        qty: int

    trades, payloads, errors = [], [], []
    done = threading.Event()

    def on_trade(topic, trade):          # with_topic=True: (topic, Trade)
        trades.append((topic, trade))
        if len(trades) == N_GOOD:
            done.set()

    def on_error(exc, payload):          # a DecodeError, and the payload as sent
        errors.append((exc, payload))

    with upcall.Bus() as bus:
        sub = bus.subscribe("inproc://trades", on_trade, kind="pull", bind=True,
                            with_topic=True, on_error=on_error,
                            decoder=msgspec.msgpack.Decoder(Trade).decode)
        raw = bus.subscribe("inproc://raw", payloads.append, kind="pull", bind=True, raw=True)

        with bus.publisher("inproc://trades", kind="push", bind=False,
                           encoder=msgspec.msgpack.Encoder().encode) as pub:
            pub.send(b"trades.AAPL", Trade("AAPL", 187.25, 100))
            pub.send(b"trades.BAD", {"sym": "BAD", "px": "n/a", "qty": 1})   # fails validation
            pub.send(b"trades.MSFT", Trade("MSFT", 411.5, 20))
            pub.send(b"trades.NVDA", Trade("NVDA", 122.0, 7))
        with bus.publisher("inproc://raw", kind="push", bind=False) as pub:
            pub.send(b"raw", {"k": [1, 2]})

        if not done.wait(10):
            raise SystemExit("the trades did not arrive")
        for topic, trade in trades:
            print(f"typed: {topic.decode()} {trade!r}")
        exc, payload = errors[0]
        print(f"decode error: topic {exc.topic!r}, {type(exc.__cause__).__name__}: "
              f"{exc.__cause__}; payload {len(payload)} bytes")
        stats = sub.stats
        while stats["delivered"] + stats["decode_errors"] < N_GOOD + 1:   # counted after the batch
            threading.Event().wait(0.01)
            stats = sub.stats
        print(f"stats: delivered {stats['delivered']}, decode_errors {stats['decode_errors']}, "
              f"callback_errors {stats['callback_errors']}")
        while not payloads:
            threading.Event().wait(0.01)
        print(f"raw=True: {payloads[0]!r} == packb: {payloads[0] == upcall.packb({'k': [1, 2]})}")
        raw.close()


main()
