"""The other side of the bus and contention benchmarks: the peer process.

:class:`PeerProcess` starts ``python -m bench.peer [--backend zmq|upcall]``
and drives it with one JSON command per line on its stdin, each answered by
one JSON line on its stdout (``"ok"``, and ``"error"`` when it failed):

``{"cmd": "flood", "endpoint": E, "n": N[, "payload_hex": P][, "curve_serverkey": K][, "coalesced": [ONE_HEX, K]]}``
    Open a PUSH socket (a CURVE client of the server key K, with a fresh
    key pair, when given) that *connects* to E with SNDHWM 0 (no limit) and
    send N messages ``[TOPIC, small payload]`` (or ``[TOPIC, P]``: the
    coalesced floods).  Connecting creates the pipe
    at once even though nobody listens yet, so all N messages are queued in
    this process when the answer comes back; the subscriber binds E
    afterwards and drains a flood that is already there.
``{"cmd": "connect", "endpoint": E}`` then ``{"cmd": "pace", "rate": R, "seconds": S}``
    Open a PUSH socket (default high-water mark) that connects to E; then
    offer R messages/s for S seconds, non-blocking: each message is the
    small map with its send time (``bench.workload.timestamped_payload``),
    and one refused at the high-water mark counts as lost.  Answers
    ``sent``, ``lost`` and ``seconds``.
``{"cmd": "close"}``
    Close the sockets opened by ``flood`` and ``connect`` (linger 0).
``{"cmd": "ping", "ping": E1, "pong": E2, "count": C, "warmup": W}``
    Connect a PUSH to E1 and a PULL to E2, then do W + C round trips, one
    message in flight at a time: send a ping, wait for the reply.  Answers
    the round-trip percentiles (µs) of the last C.
``{"cmd": "quit"}`` (or end of input)
    Exit.

The flood and ping functions also serve the in-process variants (inproc
needs one zmq context, so there they run on a thread of the benchmark
process with its context or bus).

Backends: ``zmq`` (pyzmq, the default when installed; the lightest client,
and identical for every row measured) or ``upcall`` (the library's own
Publisher and a caller-mode subscription, when pyzmq is missing).
"""
from __future__ import annotations

import argparse
import json
import os
import select
import struct
import subprocess
import sys
import time

import upcall

from bench.measure import percentile
from bench.workload import TOPIC, small_payload, timestamped_payload

#: Longest wait for one reply before a ping run gives up.
REPLY_TIMEOUT = 5.0


def have_pyzmq() -> bool:
    try:
        import zmq  # noqa: F401
    except ImportError:
        return False
    return True


# ---- flood -----------------------------------------------------------------

def flood_zmq(ctx, endpoint: str, n: int, payload: bytes, curve_serverkey: str | None = None,
              coalesced: tuple[bytes, int] | None = None):
    """Queue n messages on a new PUSH that connects to endpoint; return the
    socket.  coalesced (payload is a coalesced one): each ends with
    upcall's marker frame, as an upcall publisher's do."""
    import zmq
    sock = ctx.socket(zmq.PUSH)
    if curve_serverkey:
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        sock.curve_serverkey = curve_serverkey.encode()
    sock.setsockopt(zmq.SNDHWM, 0)           # no limit: everything queues here
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 10)   # tcp/ipc: find the late binder quickly
    sock.connect(endpoint)
    send = sock.send
    more = zmq.SNDMORE
    if coalesced is not None:
        marker = upcall.WIRE_MARKER
        for _ in range(n):
            send(TOPIC, more)
            send(payload, more)
            send(marker)
        return sock
    for _ in range(n):
        send(TOPIC, more)
        send(payload)
    return sock


def flood_upcall(bus, endpoint: str, n: int, payload: bytes, curve_serverkey: str | None = None,
                 coalesced: tuple[bytes, int] | None = None):
    """Same as :func:`flood_zmq` with an upcall Publisher; return the
    publisher.  coalesced (one message, k): each payload is k of them sent
    with send_many, coalesced and marked by the publisher."""
    curve = {"curve_serverkey": curve_serverkey} if curve_serverkey else {}
    pub = bus.publisher(endpoint, kind="push", bind=False, sndhwm=0, linger=0.0, **curve)
    if coalesced is not None:
        one, k = coalesced
        objs = [upcall.unpackb(one)] * k
        for _ in range(n):
            pub.send_many(TOPIC, objs)
        return pub
    send = pub.send_packed
    for _ in range(n):
        send(TOPIC, payload)
    return pub


# ---- paced, timestamped messages ------------------------------------------------

def paced_zmq(ctx, endpoint: str):
    """(socket, send): a PUSH connected to endpoint; send(payload) is
    non-blocking and False when the message was refused."""
    import zmq
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    again, nb, more = zmq.Again, zmq.NOBLOCK, zmq.SNDMORE

    def send(payload):
        try:
            sock.send(TOPIC, nb | more)
        except again:
            return False
        sock.send(payload)
        return True
    return sock, send


def paced_upcall(bus, endpoint: str):
    """:func:`paced_zmq` with an upcall Publisher."""
    pub = bus.publisher(endpoint, kind="push", bind=False, linger=0.0)

    def send(payload):
        try:
            pub.send_packed(TOPIC, bytes(payload), timeout=0)
        except BlockingIOError:
            return False
        return True
    return pub, send


def pace(send, rate: float, seconds: float) -> dict:
    """Offer rate msgs/s for seconds through send(payload), each stamped
    with CLOCK_MONOTONIC ns just before it goes."""
    packed, off = timestamped_payload()
    total = int(rate * seconds)
    sent = lost = 0
    t0 = time.monotonic()
    mono, pack_into = time.monotonic_ns, struct.pack_into
    while sent + lost < total:
        due = min(total, int((time.monotonic() - t0) * rate) + 1)
        while sent + lost < due:
            pack_into(">Q", packed, off, mono())
            if send(packed):
                sent += 1
            else:
                lost += 1
        time.sleep(0.0005)
    return {"sent": sent, "lost": lost, "seconds": time.monotonic() - t0}


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


def ping_zmq(ctx, ping_ep: str, pong_ep: str, count: int, warmup: int, payload: bytes) -> dict:
    """Round trips through a responder that answers each ping with one 2-frame reply."""
    import zmq
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
            send(TOPIC, more)
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


def ping_upcall(bus, ping_ep: str, pong_ep: str, count: int, warmup: int,
                payload: bytes) -> dict:
    """:func:`ping_zmq` with an upcall Publisher and a caller-mode subscription."""
    pub = bus.publisher(ping_ep, kind="push", bind=False, linger=0.0)
    sub = bus.subscribe(pong_ep, lambda msg: None, kind="pull", bind=False, delivery="caller")
    send, poll = pub.send_packed, sub.poll
    clock = time.perf_counter_ns
    samples = [0] * count
    try:
        for i in range(warmup + count):
            t0 = clock()
            send(TOPIC, payload)
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
    """State of the peer process: one context or bus, the sockets it keeps open."""

    def __init__(self, backend: str):
        self.zmq = backend == "zmq"
        self.payload = small_payload()
        self.sockets: list = []
        self.paced_send = None
        if self.zmq:
            import zmq
            self.ctx = zmq.Context(1)
        else:
            self.ctx = upcall.Bus()

    def flood(self, endpoint: str, n: int, payload: bytes | None = None,
              curve_serverkey: str | None = None,
              coalesced: tuple[bytes, int] | None = None) -> dict:
        t0 = time.perf_counter()
        fn = flood_zmq if self.zmq else flood_upcall
        self.sockets.append(fn(self.ctx, endpoint, n, self.payload if payload is None else payload,
                               curve_serverkey, coalesced))
        return {"queued": n, "seconds": time.perf_counter() - t0}

    def connect(self, endpoint: str) -> dict:
        sock, self.paced_send = (paced_zmq if self.zmq else paced_upcall)(self.ctx, endpoint)
        self.sockets.append(sock)
        return {}

    def pace(self, rate: float, seconds: float) -> dict:
        if self.paced_send is None:
            return {"error": "pace before connect"}
        return pace(self.paced_send, rate, seconds)

    def close_sockets(self) -> dict:
        for s in self.sockets:
            s.close()
        self.sockets.clear()
        self.paced_send = None
        return {}

    def ping(self, ping: str, pong: str, count: int, warmup: int) -> dict:
        fn = ping_zmq if self.zmq else ping_upcall
        return fn(self.ctx, ping, pong, count, warmup, self.payload)

    def close(self) -> None:
        self.close_sockets()
        if self.zmq:
            self.ctx.term()
        else:
            self.ctx.close()


def _execute(peer: Peer, cmd: str, req: dict) -> dict:
    if cmd == "flood":
        hexed = req.get("payload_hex")
        co = req.get("coalesced")
        return peer.flood(req["endpoint"], int(req["n"]),
                          bytes.fromhex(hexed) if hexed is not None else None,
                          req.get("curve_serverkey"),
                          (bytes.fromhex(co[0]), int(co[1])) if co is not None else None)
    if cmd == "connect":
        return peer.connect(req["endpoint"])
    if cmd == "pace":
        return peer.pace(float(req["rate"]), float(req["seconds"]))
    if cmd == "close":
        return peer.close_sockets()
    if cmd == "ping":
        return peer.ping(req["ping"], req["pong"], int(req["count"]), int(req["warmup"]))
    return {"error": f"unknown command {cmd!r}"}


def serve(backend: str, inp=sys.stdin, out=sys.stdout) -> int:
    peer = Peer(backend)

    def answer(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    answer({"ok": True, "backend": backend})
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
                res = _execute(peer, cmd, req)
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


# ---- driving it from the benchmark ----------------------------------------------

class PeerProcess:
    """``python -m bench.peer`` in a child process, driven by JSON lines.

    The child imports the same upcall as this process and this bench/
    folder, from any working directory.
    """

    def __init__(self, backend: str | None = None):
        cmd = [sys.executable, "-m", "bench.peer"]
        if backend:
            cmd += ["--backend", backend]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.dirname(os.path.dirname(os.path.abspath(upcall.__file__))),
             os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1, env=env)
        self.backend = self._answer(60.0).get("backend")

    def __enter__(self) -> "PeerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def readable(self, timeout: float = 0.0) -> bool:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return bool(r)

    def _answer(self, timeout: float) -> dict:
        if not self.readable(timeout):
            raise TimeoutError(f"bench peer gave no answer within {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench peer exited (status {self.proc.poll()})")
        return json.loads(line)

    def send(self, **req) -> None:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = 120.0) -> dict:
        res = self._answer(timeout)
        if not res.get("ok"):
            raise RuntimeError(f"bench peer: {res.get('error')}")
        return res

    def request(self, timeout: float = 120.0, **req) -> dict:
        self.send(**req)
        return self.answer(timeout)

    def close(self) -> None:
        try:
            self.request(timeout=10.0, cmd="quit")
        except Exception:
            pass
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(main())
