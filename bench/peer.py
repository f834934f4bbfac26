"""The other side of the bus benchmark: a flood publisher and a pinger.

Run as ``python -m bench.peer [--backend zmq|upcall]``; the bus
section starts one such process and drives it with one JSON command per line
on stdin, answered by one JSON line on stdout:

``{"cmd": "flood", "endpoint": E, "n": N}``
    Open a PUSH socket that *connects* to E with SNDHWM 0 (no limit) and
    send N messages ``[TOPIC, packed SMALL_MESSAGE]``.  Connecting creates
    the pipe at once even though nobody listens yet, so all N messages are
    queued in this process when the answer ``{"ok": true, ...}`` comes back;
    the subscriber binds E afterwards and drains a flood that is already
    there.  The socket stays open until ``close_flood``.
``{"cmd": "close_flood"}``
    Close the flood sockets (linger 0).
``{"cmd": "ping", "ping": E1, "pong": E2, "count": C, "warmup": W}``
    Connect a PUSH to E1 and a PULL to E2, then do W + C round trips, one
    message in flight at a time: send a ping, wait for the reply.  Answers
    the round-trip percentiles (µs) of the last C.
``{"cmd": "quit"}`` (or end of input)
    Exit.

The same functions serve the in-process variants (inproc needs one zmq
context, so there the flood and the pinger run on a thread of the
benchmark process with its context or bus).

Backends: ``zmq`` (pyzmq, the default when installed; the lightest client,
and identical for every row measured) or ``upcall`` (the library's own
Publisher and a caller-mode subscription, when pyzmq is missing).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench.measure import percentile

TOPIC = b"bench.small"

#: The codec benchmark's small map, when that module does not provide it.
FALLBACK_MESSAGE = {"id": 123456, "sym": "AAPL.OQ", "px": 187.25,
                    "sizes": [100, 200, 300, 400, 500], "venue": "NASDAQ-GS"}

#: Longest wait for one reply before a ping run gives up.
REPLY_TIMEOUT = 5.0


def small_message() -> dict:
    """The codec benchmark's small message (``bench.codec.SMALL_MESSAGE``)."""
    try:
        from bench.codec import SMALL_MESSAGE
    except ImportError:
        return dict(FALLBACK_MESSAGE)
    return SMALL_MESSAGE


def pack(obj: Any) -> bytes:
    """msgpack bytes of obj, with upcall's codec if built, else msgpack."""
    try:
        from upcall import packb
    except ImportError:
        from msgpack import packb
    return bytes(packb(obj))


def small_payload() -> bytes:
    return pack(small_message())


def have_pyzmq() -> bool:
    try:
        import zmq  # noqa: F401
    except ImportError:
        return False
    return True


# ---- flood -----------------------------------------------------------------

def flood_zmq(ctx, endpoint: str, n: int, topic: bytes = TOPIC, payload: bytes | None = None):
    """Queue n messages on a new PUSH that connects to endpoint; return the socket."""
    import zmq
    payload = small_payload() if payload is None else payload
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 0)           # no limit: everything queues here
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 10)   # tcp/ipc: find the late binder quickly
    sock.connect(endpoint)
    send = sock.send
    more = zmq.SNDMORE
    for _ in range(n):
        send(topic, more)
        send(payload)
    return sock


def flood_upcall(bus, endpoint: str, n: int, topic: bytes = TOPIC, payload: bytes | None = None):
    """Same as :func:`flood_zmq` with an upcall Publisher; return the publisher."""
    payload = small_payload() if payload is None else payload
    pub = bus.publisher(endpoint, kind="push", bind=False, sndhwm=0, linger=0.0)
    send = pub.send_packed
    for _ in range(n):
        send(topic, payload)
    return pub


# ---- ping-pong ---------------------------------------------------------------

def latency_summary(samples_ns: list[int]) -> dict:
    """Percentiles in µs of round-trip times in ns."""
    xs = sorted(samples_ns)
    us = [x / 1000.0 for x in xs]
    return {
        "count": len(us),
        "p50_us": percentile(us, 50, presorted=True),
        "p90_us": percentile(us, 90, presorted=True),
        "p99_us": percentile(us, 99, presorted=True),
        "min_us": us[0] if us else None,
        "max_us": us[-1] if us else None,
    }


def ping_zmq(ctx, ping_ep: str, pong_ep: str, count: int, warmup: int = 200,
             topic: bytes = TOPIC, payload: bytes | None = None) -> dict:
    """Round trips through a responder that answers each ping with one 2-frame reply."""
    import zmq
    payload = small_payload() if payload is None else payload
    push = ctx.socket(zmq.PUSH)
    pull = ctx.socket(zmq.PULL)
    for s in (push, pull):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RECONNECT_IVL, 10)
    pull.setsockopt(zmq.RCVTIMEO, int(REPLY_TIMEOUT * 1000))
    push.connect(ping_ep)
    pull.connect(pong_ep)
    send, recv, more = push.send, pull.recv, zmq.SNDMORE
    clock = time.perf_counter_ns
    samples = [0] * count
    try:
        for i in range(warmup + count):
            t0 = clock()
            send(topic, more)
            send(payload)
            recv()          # topic frame
            recv()          # payload frame
            t1 = clock()
            if i >= warmup:
                samples[i - warmup] = t1 - t0
    except zmq.Again:
        return {"error": f"no reply within {REPLY_TIMEOUT}s after {i} round trips"}
    finally:
        push.close()
        pull.close()
    return latency_summary(samples)


def ping_upcall(bus, ping_ep: str, pong_ep: str, count: int, warmup: int = 200,
                topic: bytes = TOPIC, payload: bytes | None = None) -> dict:
    """:func:`ping_zmq` with an upcall Publisher and a caller-mode subscription."""
    payload = small_payload() if payload is None else payload
    pub = bus.publisher(ping_ep, kind="push", bind=False, linger=0.0)
    sub = bus.subscribe(pong_ep, lambda msg: None, kind="pull", bind=False, delivery="caller")
    send, poll = pub.send_packed, sub.poll
    clock = time.perf_counter_ns
    samples = [0] * count
    try:
        for i in range(warmup + count):
            t0 = clock()
            send(topic, payload)
            if not poll(timeout=REPLY_TIMEOUT, max_messages=1):
                return {"error": f"no reply within {REPLY_TIMEOUT}s after {i} round trips"}
            t1 = clock()
            if i >= warmup:
                samples[i - warmup] = t1 - t0
    finally:
        sub.close()
        pub.close()
    return latency_summary(samples)


# ---- the process -----------------------------------------------------------------

class Peer:
    """State of the peer process: one context or bus, the open flood sockets."""

    def __init__(self, backend: str):
        self.backend = backend
        self.payload = small_payload()
        self.floods: list = []
        if backend == "zmq":
            import zmq
            self.ctx = zmq.Context(1)
        else:
            import upcall
            self.ctx = upcall.Bus()

    def flood(self, endpoint: str, n: int) -> dict:
        t0 = time.perf_counter()
        fn = flood_zmq if self.backend == "zmq" else flood_upcall
        self.floods.append(fn(self.ctx, endpoint, n, TOPIC, self.payload))
        return {"queued": n, "seconds": time.perf_counter() - t0}

    def close_flood(self) -> dict:
        for s in self.floods:
            s.close()
        self.floods.clear()
        return {}

    def ping(self, ping: str, pong: str, count: int, warmup: int = 200) -> dict:
        fn = ping_zmq if self.backend == "zmq" else ping_upcall
        return fn(self.ctx, ping, pong, count, warmup, TOPIC, self.payload)

    def close(self) -> None:
        self.close_flood()
        if self.backend == "zmq":
            self.ctx.term()
        else:
            self.ctx.close()


def serve(backend: str, inp=sys.stdin, out=sys.stdout) -> int:
    peer = Peer(backend)

    def answer(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    answer({"ok": True, "backend": backend, "payload_bytes": len(peer.payload)})
    try:
        for line in inp:
            if not line.strip():
                continue
            req = json.loads(line)
            cmd = req.pop("cmd")
            if cmd == "quit":
                answer({"ok": True})
                break
            try:
                if cmd == "flood":
                    res = peer.flood(req["endpoint"], int(req["n"]))
                elif cmd == "close_flood":
                    res = peer.close_flood()
                elif cmd == "ping":
                    res = peer.ping(req["ping"], req["pong"], int(req["count"]),
                                    int(req.get("warmup", 200)))
                else:
                    res = {"error": f"unknown command {cmd!r}"}
            except Exception as exc:   # report, keep serving
                res = {"error": f"{type(exc).__name__}: {exc}"}
            res.setdefault("ok", "error" not in res)
            answer(res)
    finally:
        peer.close()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["zmq", "upcall"],
                    default="zmq" if have_pyzmq() else "upcall")
    opts = ap.parse_args(argv)
    return serve(opts.backend)


if __name__ == "__main__":
    sys.exit(main())
