"""Instructions per delivered message on the delivery hot path, for callgrind.

Instruction counts are stable where seconds are not (a shared 2-vCPU
machine): run this twice with different N under callgrind and divide the
difference by the difference in N, so start-up and teardown cancel out.

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/hotpath.py {synth-map|synth-nil|zmq-map} {func|counter|typed|typed-raw} N
        python bench/hotpath.py {zmq-map|synth-map} {asyncio|asyncio-batches} N

typed: decoder=msgspec.msgpack.Decoder(Small).decode (the map as a Struct)
and a no-op target; typed-raw: raw=True and a target calling that decoder;
asyncio: ``async for`` over subscribe_async, built-in decoder, no-op body;
asyncio-batches: ``async for batch in sub.batches()``; with synth-map the
same adapter fed by the synthetic source (no zmq: the event loop's share).

PYTHONHASHSEED=0: str hashes decide how many probes a dict insert takes, so a
random seed moves the count of the map cases by about 1%.  The zmq case also
varies by about 1% with thread interleaving (the sender is in the count too).
"""
import os
import sys
import time

import upcall
from upcall._bus import _synthetic_subscribe
from upcall.handler import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.workload import NIL, small_payload  # noqa: E402


def _noop(msg):
    pass


def _target(kind):
    """(target, subscribe() keywords) for a target kind."""
    if kind == "counter":
        return Counter(), {}
    if kind in ("typed", "typed-raw"):
        import msgspec

        class Small(msgspec.Struct):
            id: int
            sym: str
            px: float
            sizes: list[int]
            venue: str
        decode = msgspec.msgpack.Decoder(Small).decode
        if kind == "typed":
            return _noop, {"decoder": decode}

        def raw_target(payload):
            decode(payload)
        return raw_target, {"raw": True}
    return _noop, {}


def _consume_async(bus, case, kind, n):
    """The asyncio kinds: the flood taken with ``async for`` over
    ``bus.subscribe_async`` (or ``sub.batches()``) on an event loop; zmq-map
    queues it on an inproc PULL first, synth-map feeds the same adapter from
    the synthetic source."""
    import asyncio

    async def consume():
        payload = small_payload()
        if case == "synth-map":
            from upcall import aio
            from upcall._bus import SubscribeOptions

            def open_synthetic(bridge):
                return _synthetic_subscribe(bus, bridge, count=n, payload=payload, batch=1024)
            sub = aio.AsyncSubscription(bus, "synthetic", None,
                                        SubscribeOptions(kind="pull", batch=1024),
                                        _open=open_synthetic)
        else:
            sub = bus.subscribe_async("inproc://hotpath", kind="pull", bind=True, batch=1024,
                                      rcvhwm=0)
            pub = bus.publisher("inproc://hotpath", kind="push", bind=False, sndhwm=0)
            for _ in range(n):
                pub.send_packed(b"t", payload)
        i = 0
        if kind == "asyncio-batches":
            async for msgs in sub.batches():
                for msg in msgs:
                    _noop(msg)
                i += len(msgs)
                if i >= n:
                    break
        else:
            async for msg in sub:
                _noop(msg)
                i += 1
                if i == n:
                    break
        assert sub.stats["delivered"] == n, sub.stats
        await sub.aclose()
    asyncio.run(consume())


def main(case, kind, n):
    if kind in ("asyncio", "asyncio-batches"):
        if case not in ("zmq-map", "synth-map"):
            raise SystemExit(f"the {kind} kind needs the zmq-map or synth-map case")
        with upcall.Bus() as bus:
            return _consume_async(bus, case, kind, n)
    target, kw = _target(kind)
    with upcall.Bus() as bus:
        if case.startswith("synth"):
            payload = small_payload() if case == "synth-map" else NIL
            sub = _synthetic_subscribe(bus, target, count=n, payload=payload, batch=1024, **kw)
            assert sub.wait(timeout=600)
        else:
            sub = bus.subscribe("inproc://hotpath", target, kind="pull", bind=True,
                                batch=1024, rcvhwm=0, **kw)
            pub = bus.publisher("inproc://hotpath", kind="push", bind=False, sndhwm=0)
            payload = small_payload()
            for _ in range(n):
                pub.send_packed(b"t", payload)
            while sub.stats["delivered"] < n:
                time.sleep(0.001)
        assert sub.stats["delivered"] == n, sub.stats


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
