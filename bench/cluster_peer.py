"""One host of the cluster (bench/cluster.py), in its own process inside its
network namespace, driven line by line over stdin/stdout.

    cluster_peer.py pub --endpoint EP --topic T [--rate R] [--pad B] [--sndhwm N]
    cluster_peer.py proxy --frontend EP --backend EP [--hwm N]
    cluster_peer.py sub --endpoint EP --topic T [--topic T ...] [--asyncio]

Messages are ``[T, {"sid": stream, "seq": n, "pad": bytes}]``: ``sid`` is
the publisher's stream (``pub.stream`` of a stamped publisher; a random id
of this process otherwise) and n = 0, 1, 2, ... its sequence number, so the
subscriber keeps its own exact account per stream beside upcall's.

Commands (one per line) and their one-line replies:
    pub:    subscribed -> "subscribed N" (waits for --subscriptions prefixes);
            start -> "started SID"; stop -> "stopped {json}" (the flood ends,
            a trickle goes on; published so far, sid); end -> "ended {json}"
            (published, sid, stamped, stats); quit -> "bye"
    proxy:  stats -> "stats {json}"; quit -> "bye"
    sub:    report -> "report {json}" (per stream: received, first, last,
            lost, gaps, duplicates, reordered; upcall's streams() and
            stats); quit -> "bye"
Each prints "ready ..." once its sockets are open.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

_out = threading.Lock()
#: Seconds between two messages of a publisher's trickle (see run_pub).
TRICKLE_S = 0.01


def say(*words) -> None:
    with _out:
        sys.stdout.write(" ".join(str(w) for w in words) + "\n")
        sys.stdout.flush()


def commands():
    for line in sys.stdin:
        words = line.split()
        if words:
            yield words[0]


# ---- publisher ----------------------------------------------------------------

def run_pub(args, bus) -> None:
    kwargs = dict(bind=args.bind, sndhwm=args.sndhwm, linger=1.0)
    try:
        pub = bus.publisher(args.endpoint, stamp=True, **kwargs)
        sid, stamped = pub.stream_of(args.topic.encode()), True
    except TypeError:          # an upcall without stamps: our own stream id
        pub = bus.publisher(args.endpoint, **kwargs)
        sid, stamped = int.from_bytes(os.urandom(8), "little"), False
    topic = args.topic.encode()
    pad = b"x" * args.pad
    say("ready", sid)
    state = {"seq": 0}
    stop = threading.Event()
    trickle = threading.Event()
    worker = None

    def send_one() -> None:
        pub.send(topic, {"sid": sid, "seq": state["seq"], "pad": pad})
        state["seq"] += 1

    def stream() -> None:
        # At most `rate` messages a second, in bursts of 50; then, once
        # told to stop, one every TRICKLE_S until the end: a gap is seen
        # only when a later message arrives, so the stream's last messages
        # are sent where no fault and no full queue can drop them.
        burst = 50
        t0 = time.monotonic()
        while not stop.is_set() and not trickle.is_set():
            for _ in range(burst):
                send_one()
            ahead = t0 + state["seq"] / args.rate - time.monotonic()
            if ahead > 0:
                stop.wait(ahead)
        while not stop.is_set():
            send_one()
            stop.wait(TRICKLE_S)

    for cmd in commands():
        if cmd == "subscribed":
            # The subscribers' topics, come through the proxy: a publisher
            # that connects after them gets the proxy's set of prefixes, each
            # once, however many subscribers hold it.
            say("subscribed", pub.wait_subscriptions(args.subscriptions, timeout=30.0))
        elif cmd == "start":
            worker = threading.Thread(target=stream, daemon=True)
            worker.start()
            say("started", sid)
        elif cmd == "stop":
            trickle.set()
            say("stopped", json.dumps({"published": state["seq"], "sid": sid}))
        elif cmd == "end":
            stop.set()
            if worker is not None:
                worker.join()
            say("ended", json.dumps({"published": state["seq"], "sid": sid,
                                     "stamped": stamped, "stats": dict(pub.stats)}))
        elif cmd == "quit":
            break
    say("bye")


# ---- proxy --------------------------------------------------------------------

def run_proxy(args, bus) -> None:
    hwm = dict(frontend_hwm=args.hwm, backend_hwm=args.hwm) if args.hwm is not None else {}
    proxy = bus.proxy(args.frontend, args.backend, **hwm)
    say("ready", proxy.frontend, proxy.backend)
    for cmd in commands():
        if cmd == "stats":
            say("stats", json.dumps({"stats": proxy.stats, "peers": proxy.peers}))
        elif cmd == "quit":
            break
    proxy.close()
    say("bye")


# ---- subscriber ---------------------------------------------------------------

class Account:
    """What arrived of each stream, from the payloads alone."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.streams: dict[int, dict] = {}

    def add(self, msg: dict) -> None:
        sid, seq = msg["sid"], msg["seq"]
        with self.lock:
            s = self.streams.get(sid)
            if s is None:
                s = self.streams[sid] = {"received": 0, "first": seq, "next": seq, "lost": 0,
                                         "gaps": 0, "duplicates": 0, "reordered": 0}
            if seq == s["next"]:
                pass
            elif seq > s["next"]:
                s["lost"] += seq - s["next"]
                s["gaps"] += 1
            else:
                # Below the next expected: a duplicate or a late one; TCP
                # under ZeroMQ should never produce either.
                s["reordered"] += 1
                s["duplicates"] += 1
                s["received"] += 1
                return
            s["received"] += 1
            s["next"] = seq + 1

    def report(self) -> dict:
        with self.lock:
            return {str(sid): {**s, "last": s["next"] - 1} for sid, s in self.streams.items()}


def upcall_view(sub) -> dict:
    view = {"stats": dict(sub.stats)}
    streams = getattr(sub, "streams", None)
    if callable(streams):
        view["streams"] = {str(k): dict(v) for k, v in streams().items()}
    return view


def run_sub(args, bus) -> None:
    account = Account()
    topics = [t.encode() for t in args.topic]
    if not args.asyncio:
        sub = bus.subscribe(args.endpoint, account.add, topics=topics)
        say("ready", sub.last_endpoint)
        for cmd in commands():
            if cmd == "report":
                say("report", json.dumps({"account": account.report(), **upcall_view(sub)}))
            elif cmd == "quit":
                break
        sub.close()
        say("bye")
        return

    import asyncio

    async def main() -> None:
        loop = asyncio.get_running_loop()
        asub = bus.subscribe_async(args.endpoint, topics=topics)
        lines: asyncio.Queue = asyncio.Queue()

        def read_stdin() -> None:
            for cmd in commands():
                loop.call_soon_threadsafe(lines.put_nowait, cmd)
            loop.call_soon_threadsafe(lines.put_nowait, "quit")

        async def consume() -> None:
            async for msg in asub:
                account.add(msg)

        consumer = asyncio.ensure_future(consume())
        threading.Thread(target=read_stdin, daemon=True).start()
        say("ready", args.endpoint)
        while True:
            cmd = await lines.get()
            if cmd == "report":
                say("report", json.dumps({"account": account.report(),
                                          **upcall_view(asub)}))
            elif cmd == "quit":
                break
        await asub.aclose()
        consumer.cancel()

    asyncio.run(main())
    say("bye")


def main() -> int:
    p = argparse.ArgumentParser()
    sp = p.add_subparsers(dest="role", required=True)
    pp = sp.add_parser("pub")
    pp.add_argument("--endpoint", required=True)
    pp.add_argument("--topic", required=True)
    pp.add_argument("--rate", type=float, default=2000.0)
    pp.add_argument("--pad", type=int, default=256)
    pp.add_argument("--sndhwm", type=int, default=1000)
    pp.add_argument("--subscriptions", type=int, default=2)
    pp.add_argument("--bind", action="store_true")
    xp = sp.add_parser("proxy")
    xp.add_argument("--frontend", required=True)
    xp.add_argument("--backend", required=True)
    xp.add_argument("--hwm", type=int, default=None)
    sp_ = sp.add_parser("sub")
    sp_.add_argument("--endpoint", required=True)
    sp_.add_argument("--topic", action="append", required=True)
    sp_.add_argument("--asyncio", action="store_true")
    args = p.parse_args()
    import upcall
    with upcall.Bus() as bus:
        {"pub": run_pub, "proxy": run_proxy, "sub": run_sub}[args.role](args, bus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
