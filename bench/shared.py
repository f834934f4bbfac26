"""Shared-socket section of bench_upcalls.py: many per-topic subscriptions on one endpoint.

S subscriptions (1, 10, 100, 1,000, 10,000), each with its own topic prefix
``r%05d.`` and its own target, on one tcp endpoint; one publisher (a pyzmq
XPUB in its own process, started once every prefix has reached it) floods N
uncoalesced messages round-robin over the S topics.  The flood is queued
whole first (SNDHWM and RCVHWM 0): the first delivery holds its target until
the publisher has sent everything, so the figure is the receiving side's
drain rate from a full queue, not the publisher's speed (the publisher
reports "sent" once its context has terminated: every message has left it).  Rows, each in a
fresh process so that threads, descriptors and memory are its own:

* ``shared``: ``bus.subscribe(ep, target_i, topics=[prefix_i])`` S times:
  one shared SUB socket and loop, handed out in C (csrc/sub_shared.c);
* ``sockets``: the same with ``shared=False``: a socket, a connection and a
  thread each (up to the socket limit: S <= 1,000);
* ``pyzmq+dict``: one pyzmq SUB socket with the S prefixes, a Python thread
  (poll, then ``recv(NOBLOCK)`` per frame), msgspec decode and a dict
  lookup of the topic to the target (exact topics: a prefix match in Python
  would cost more).

Reported per row: msgs/s, process CPU per message (all threads, over the
drain), threads and descriptors with the subscriptions open, and RSS added
per subscription (after opening them, before the flood; beyond the first).
Every target counts its messages; a row checks each got exactly N/S.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time

from bench import report

DEFAULT_S = [1, 10, 100, 1000, 10000]
SOCKET_LIMIT_S = 1000
# What one subscription with a socket of its own holds: its SUB socket and
# its connection monitor's pair (libzmq sockets); those, the connection and
# libzmq's mailboxes (file descriptors; 5 were counted at S = 100).
SOCKETS_PER_SUB = 3
FDS_PER_SUB = 6
PREFIX = b"r%05d."

# The flooder ends when the row that started it does (it would otherwise
# wait for subscriptions for ever, holding the row's stdout open, and the
# benchmark with it).
FLOODER = r"""
import os, sys, zmq
n, s, payload = int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3])
row = os.getppid()
ctx = zmq.Context()
x = ctx.socket(zmq.XPUB)
x.sndhwm = 0
port = x.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
seen = set()
while len(seen) < s:
    if not x.poll(1000):
        if os.getppid() != row:
            sys.exit("the row ended before subscribing")
        continue
    m = x.recv()
    if m[:1] == b"\x01":
        seen.add(m[1:])
print("subscribed", flush=True)
if not sys.stdin.readline():
    sys.exit("the row ended before the flood")
topics = [b"r%05d." % i for i in range(s)]
send = x.send
MORE = zmq.SNDMORE
for k in range(n):
    send(topics[k % s], MORE)
    send(payload)
x.close(linger=-1)
ctx.term()                       # returns once every message has left for the receiver
print("sent", flush=True)
sys.stdin.read()
"""


def add_arguments(parser) -> None:
    g = parser.add_argument_group("shared section")
    g.add_argument("--shared-s", default=",".join(map(str, DEFAULT_S)),
                   help="numbers of subscriptions (default %(default)s)")
    g.add_argument("--shared-n", type=int, default=None,
                   help="messages per row (default 400,000; quick 40,000; full 2,000,000)")


def _raise_fd_limit(need: int) -> None:
    """The soft descriptor limit up to need (at most the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY
                                                    else min(need, hard), hard))


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def _row(mode: str, s: int, n: int) -> dict:
    """One row, in this process (a fresh one: see run)."""
    from bench.workload import small_payload
    payload = small_payload()
    n -= n % s
    per = n // s
    gate = threading.Event()
    done = []
    counts = [[0] for _ in range(s)]

    def make_target(c):
        def target(msg):
            if not gate.is_set():
                gate.wait()
            c[0] += 1
            if c[0] == per:
                done.append(1)
        return target

    flooder = subprocess.Popen([sys.executable, "-c", FLOODER, str(n), str(s), payload.hex()],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               cwd="/")
    try:
        return _measure(mode, s, n, per, flooder, make_target, counts, gate, done)
    finally:
        if flooder.poll() is None:
            flooder.kill()
            flooder.wait()


def _measure(mode, s, n, per, flooder, make_target, counts, gate, done) -> dict:
    import upcall
    ep = "tcp://127.0.0.1:%s" % flooder.stdout.readline().strip()
    bus = None
    if mode == "sockets":
        # A subscription of its own is SOCKETS_PER_SUB libzmq sockets and up
        # to FDS_PER_SUB descriptors: room for S of them.
        bus = upcall.Bus(max_sockets=max(1023, SOCKETS_PER_SUB * s + 16))
        _raise_fd_limit(FDS_PER_SUB * s + 256)
    elif mode == "shared":
        bus = upcall.Bus()
    rss0 = _rss_kb()
    threads0 = len(os.listdir("/proc/self/task"))
    fds0 = len(os.listdir("/proc/self/fd"))
    targets = [make_target(counts[i]) for i in range(s)]
    subs = []
    loop = None
    if mode == "pyzmq+dict":
        import msgspec
        import zmq
        ctx = zmq.Context()
        sock = ctx.socket(zmq.SUB)
        sock.rcvhwm = 0
        sock.sndhwm = 0          # else subscriptions past 1,000 are dropped (libzmq)
        handlers = {}
        for i in range(s):
            sock.setsockopt(zmq.SUBSCRIBE, PREFIX % i)
            handlers[PREFIX % i] = targets[i]
        sock.connect(ep)
        decode = msgspec.msgpack.Decoder().decode

        def run():
            recv, poll, again, nb = sock.recv, sock.poll, zmq.Again, zmq.NOBLOCK
            got = 0
            while got < n:
                try:
                    topic = recv(nb)
                except again:
                    poll(200)
                    continue
                handlers[topic](decode(recv()))
                got += 1
        loop = threading.Thread(target=run, daemon=True)
        loop.start()
    else:
        shared = mode == "shared"
        for i in range(s):
            subs.append(bus.subscribe(ep, targets[i], topics=[PREFIX % i], rcvhwm=0,
                                      shared=shared))
    assert flooder.stdout.readline().strip() == "subscribed"
    time.sleep(0.2)              # let the threads settle before counting them
    rss1 = _rss_kb()
    threads = len(os.listdir("/proc/self/task")) - threads0
    fds = len(os.listdir("/proc/self/fd")) - fds0
    flooder.stdin.write("go\n")
    flooder.stdin.flush()
    assert flooder.stdout.readline().strip() == "sent"
    time.sleep(0.5)              # the last frames from the kernel into the receiving pipes
    t0, c0 = time.perf_counter(), time.process_time()
    gate.set()
    while len(done) < s:
        time.sleep(0.002)
    t1, c1 = time.perf_counter(), time.process_time()
    flooder.stdin.close()
    flooder.wait()
    exact = all(c[0] == per for c in counts)
    if bus is not None:
        bus.close()
    return {"mode": mode, "S": s, "n": n, "rate": n / (t1 - t0),
            "cpu_us": (c1 - c0) / n * 1e6, "threads": threads, "fds": fds,
            "rss_per_sub_kb": (rss1 - rss0) / s if s > 1 else float("nan"),
            "rss_kb": rss1 - rss0, "exact": exact}


def run(opts) -> list[dict]:
    svals = [int(v) for v in opts.shared_s.split(",")]
    n = opts.shared_n or (40_000 if opts.quick else 2_000_000 if opts.full else 400_000)
    rows = []
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for s in svals:
        for mode in ("shared", "sockets", "pyzmq+dict"):
            if mode == "sockets" and s > SOCKET_LIMIT_S:
                rows.append({"mode": mode, "S": s, "note": "over the socket limit"})
                continue
            r = subprocess.run([sys.executable, "-m", "bench.shared", mode, str(s), str(n)],
                               cwd=here, capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                rows.append({"mode": mode, "S": s, "note": r.stderr.strip().splitlines()[-1:]})
                continue
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(f"  {rows[-1]}", flush=True)
    base = {(r["mode"]): r for r in rows if r.get("S") == svals[0] and "rate" in r}
    for r in rows:
        b = base.get("shared")
        if "rate" in r and b:
            r["rate_x_s1"] = r["rate"] / b["rate"]
            r["cpu_x_s1"] = r["cpu_us"] / b["cpu_us"]
        pz = next((x for x in rows if x.get("S") == r.get("S") and x["mode"] == "pyzmq+dict"
                   and "rate" in x), None)
        if "rate" in r and pz:
            r["x_pyzmq"] = r["rate"] / pz["rate"]
    cols = [report.Column("mode", "mode"), report.Column("S", "S"),
            report.Column("rate", "msgs/s", fmt=report.fmt_rate),
            report.Column("x_pyzmq", "x pyzmq+dict", fmt=report.fmt_ratio),
            report.Column("rate_x_s1", "rate x S=1 shared", fmt=report.fmt_ratio),
            report.Column("cpu_us", "CPU us/msg", fmt=report.fmt_num),
            report.Column("cpu_x_s1", "CPU x S=1", fmt=report.fmt_ratio),
            report.Column("threads", "threads"), report.Column("fds", "fds"),
            report.Column("rss_per_sub_kb", "KB/sub", fmt=report.fmt_num),
            report.Column("exact", "exact"), report.Column("note", "note")]
    report.print_table(rows, cols, title=f"shared: S subscriptions on one tcp endpoint, "
                                          f"{n:,} messages round-robin, queued first")
    top = max((r for r in rows if r["mode"] == "shared" and "rate" in r), key=lambda r: r["S"],
              default=None)
    if top is not None:
        print(report.target_line(f"shared S={top['S']:,} / shared S={svals[0]}: rate",
                                 top.get("rate_x_s1"), ">=", 0.9))
        print(report.target_line(f"shared S={top['S']:,} / pyzmq+dict: rate",
                                 top.get("x_pyzmq"), ">=", 1.8))
        print(report.target_line(f"shared S={top['S']:,} / shared S={svals[0]}: CPU per message",
                                 top.get("cpu_x_s1"), "<=", 1.1))
    return rows


if __name__ == "__main__":
    print(json.dumps(_row(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
