"""RSS of a pub publisher sending one message every 10 ms (as a quiet
publisher does) while a plain pyzmq XSUB repeats one subscribe message N
times (docs/security.md, "What a peer can make a publisher hold").

Usage: python tools/pub_subscription_rss.py N"""
import subprocess
import sys
import threading
import time

import upcall

N = int(sys.argv[1])

def rss_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

PEER = """
import sys, zmq
ctx = zmq.Context(); x = ctx.socket(zmq.XSUB); x.sndhwm = 0
x.connect(sys.argv[1])
for _ in range(int(sys.argv[2])):
    x.send(b"\\x01spam")
x.close(linger=10000); ctx.term()
"""
with upcall.Bus() as bus:
    pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
    stop = threading.Event()
    def sender():
        while not stop.is_set():
            pub.send(b"t", 1)
            time.sleep(0.01)
    t = threading.Thread(target=sender); t.start()
    time.sleep(0.3)
    before = rss_kb()
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", PEER, pub.last_endpoint, str(N)], check=True, timeout=300)
    peak = rss_kb()
    time.sleep(1.0)
    stop.set(); t.join()
    after = rss_kb()
    read = pub.stats.get("subscription_messages", "n/a")
    print(f"N={N}: rss before {before} kB, when the peer finished {peak} kB (+{peak-before}), "
          f"1 s later {after} kB; peer took {time.monotonic()-t0:.1f} s; read: {read}")
    pub.close()
