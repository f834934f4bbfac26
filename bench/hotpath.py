"""Instructions per delivered message on the delivery hot path, for callgrind.

Instruction counts are stable where seconds are not (a shared 2-vCPU
machine): run this twice with different N under callgrind and divide the
difference by the difference in N, so start-up and teardown cancel out.

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/hotpath.py {synth-map|synth-nil|zmq-map} {func|counter|typed|typed-raw} N
        python bench/hotpath.py {zmq-map|synth-map} {asyncio|asyncio-batches} N
        python bench/hotpath.py shared:S func N
        python bench/hotpath.py {tcp-map|tcp-map-stamped|tcp-coalesced|tcp-coalesced-stamped} func N
        python bench/hotpath.py {sub-map|sub-map-own} func N

tcp-map: the zmq-map flood over tcp on 127.0.0.1; -stamped: the publisher
made with stamp=True (each message's stamp at the end of its topic, read
and cut off by the subscriber: docs/wire.md, "Stamps"); tcp-coalesced: the
flood sent with send_many in batches of 64 (one marker per batch when
stamped).

shared:S: S subscriptions on one shared SUB socket (bus.subscribe(),
csrc/sub_shared.c), prefixes r00000. .. on one inproc endpoint, each with its own
no-op target; the bus's publisher floods N uncoalesced messages round-robin
over the S topics, queued whole before the first is delivered (the first
target waits for the flood), so batches are full and at S = 10,000 each
subscription gets about 0.1 message of a batch.  The sender is counted too.

sub-map: one subscription (SUB, topics=[b"t"]) on the bus's publisher's
inproc endpoint, flooded as zmq-map is: the default, a
shared socket with this one subscription; sub-map-own: the same with
shared=False, a socket of its own.  The sender is counted too.

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


def _shared(bus, s, n):
    """shared:S (module docstring)."""
    import threading
    payload = small_payload()
    n -= n % s
    sent, ended = threading.Event(), threading.Event()
    ep = "inproc://hotpath-shared"
    pub = bus.publisher(ep, sndhwm=0, bind=True)
    # The gate holds the shared socket's thread until the flood is queued; the end
    # message comes after the flood, on the same thread (in order), so when
    # it arrives every message before it has been delivered.
    gate = bus.subscribe(ep, lambda msg: sent.wait(), topics=[b"gate"], rcvhwm=0)
    end = bus.subscribe(ep, lambda msg: ended.set(), topics=[b"end"], rcvhwm=0)
    subs = [bus.subscribe(ep, _noop, topics=[b"r%05d." % i], rcvhwm=0, batch=1024)
            for i in range(s)]
    pub.wait_subscriptions(s + 2, timeout=600)
    pub.send(b"gate", None)
    topics = [b"r%05d.x" % i for i in range(s)]
    send = pub.send_packed
    for k in range(n):
        send(topics[k % s], payload)
    pub.send(b"end", None)
    sent.set()
    assert ended.wait(600)
    assert all(x.stats["delivered"] == n // s for x in subs)
    assert gate.stats["delivered"] == end.stats["delivered"] == 1


def _tcp(bus, case, target, kw, n):
    """tcp-map[-stamped], tcp-coalesced[-stamped] (module docstring)."""
    stamped = case.endswith("-stamped")
    sub = bus.subscribe("tcp://127.0.0.1:0", target, kind="pull", bind=True,
                        batch=1024, rcvhwm=0, **kw)
    pub = bus.publisher(sub.last_endpoint, kind="push", bind=False, sndhwm=0,
                        **({"stamp": True} if stamped else {}))
    payload = small_payload()
    if case.startswith("tcp-coalesced"):
        import msgpack
        obj = msgpack.unpackb(payload)
        batch = [obj] * 64
        for _ in range(n // 64):
            pub.send_many(b"t", batch)
    else:
        for _ in range(n):
            pub.send_packed(b"t", payload)
    want = n - n % 64 if case.startswith("tcp-coalesced") else n
    while sub.stats["delivered"] < want:
        time.sleep(0.001)
    assert sub.stats["delivered"] == want, sub.stats
    assert not stamped or sub.stats["lost"] == 0, sub.stats


def _single_sub(bus, case, target, kw, n):
    """sub-map, sub-map-own (module docstring)."""
    ep = "inproc://hotpath-sub"
    pub = bus.publisher(ep, sndhwm=0, bind=True)
    sub = bus.subscribe(ep, target, topics=[b"t"], rcvhwm=0, batch=1024,
                        shared=case == "sub-map", **kw)
    pub.wait_subscriptions(1, timeout=600)
    payload = small_payload()
    send = pub.send_packed
    for _ in range(n):
        send(b"t", payload)
    while sub.stats["delivered"] < n:
        time.sleep(0.001)
    assert sub.stats["delivered"] == n, sub.stats


def main(case, kind, n):
    if case.startswith("shared:"):
        with upcall.Bus(max_sockets=64) as bus:
            return _shared(bus, int(case.split(":")[1]), n)
    if kind in ("asyncio", "asyncio-batches"):
        if case not in ("zmq-map", "synth-map"):
            raise SystemExit(f"the {kind} kind needs the zmq-map or synth-map case")
        with upcall.Bus() as bus:
            return _consume_async(bus, case, kind, n)
    target, kw = _target(kind)
    if case in ("sub-map", "sub-map-own"):
        with upcall.Bus() as bus:
            return _single_sub(bus, case, target, kw, n)
    if case.startswith("tcp-"):
        with upcall.Bus() as bus:
            return _tcp(bus, case, target, kw, n)
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
