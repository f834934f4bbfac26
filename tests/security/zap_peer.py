"""A pyzmq peer in its own process for the authentication tests, driven line
by line over stdin/stdout (it talks to the test over no socket).

    zap_peer.py push|sub --endpoint EP [--serverkey K [--public K --secret K]]
                         [--source ADDR] [--name NAME]
    zap_peer.py flood --endpoint EP --serverkey K --batch N

push: a PUSH socket connecting to EP; sub: a SUB socket (every topic).
--serverkey makes it a CURVE client (with --public/--secret, else a fresh
pair); without it, a plain socket.  --source binds the connection's local
address (to come from another loopback address).  A socket monitor reports
the handshake's outcome on stdout as "event NAME" (HANDSHAKE_SUCCEEDED,
HANDSHAKE_FAILED_AUTH, HANDSHAKE_FAILED_PROTOCOL, HANDSHAKE_FAILED_NO_DETAIL).

Commands and replies:
    push:  send N TAG -> "sent Q" (N messages [b"t", packb({"tag": TAG, "i": i})],
           without blocking: Q of them queued; none without a connection)
    sub:   count -> "count N TAGS" (messages received, their tags joined by ,)
    both:  reconnect -> "reconnected" (a new socket, same keys)
           quit -> "bye"
flood: every "next" line opens --batch CURVE client sockets with fresh random
keys that never reconnect, then closes the previous batch; replies "opened K"
(K sockets so far).
"""
import argparse
import sys
import threading

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

EVENTS = {
    zmq.EVENT_HANDSHAKE_SUCCEEDED: "HANDSHAKE_SUCCEEDED",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "HANDSHAKE_FAILED_AUTH",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "HANDSHAKE_FAILED_PROTOCOL",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "HANDSHAKE_FAILED_NO_DETAIL",
}

_lock = threading.Lock()


def say(*words):
    with _lock:
        sys.stdout.write(" ".join(str(w) for w in words) + "\n")
        sys.stdout.flush()


def watch(mon):
    while True:
        try:
            ev = recv_monitor_message(mon)
        except zmq.ZMQError:
            return
        if ev["event"] in EVENTS:
            say("event", EVENTS[ev["event"]])
        if ev["event"] == zmq.EVENT_MONITOR_STOPPED:
            return


def open_socket(ctx, args, keys):
    sock = ctx.socket(zmq.PUSH if args.role == "push" else zmq.SUB)
    sock.linger = 0
    if args.role == "sub":
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    if keys:
        sock.curve_publickey, sock.curve_secretkey = keys
        sock.curve_serverkey = args.serverkey.encode()
    mon = sock.get_monitor_socket(zmq.EVENT_ALL)
    threading.Thread(target=watch, args=(mon,), daemon=True).start()
    endpoint = args.endpoint
    if args.source:
        proto, _, rest = endpoint.partition("://")
        endpoint = f"{proto}://{args.source}:0;{rest}"
    sock.connect(endpoint)
    return sock


def run_client(args):
    ctx = zmq.Context()
    keys = None
    if args.serverkey:
        keys = ((args.public.encode(), args.secret.encode()) if args.public
                else zmq.curve_keypair())
    sock = open_socket(ctx, args, keys)
    got = []
    lock = threading.Lock()

    if args.role == "sub":
        def recv_loop(s):
            while True:
                try:
                    frames = s.recv_multipart()
                except zmq.ZMQError:
                    return
                with lock:
                    got.append(msgpack.unpackb(frames[-1])["tag"])
        threading.Thread(target=recv_loop, args=(sock,), daemon=True).start()
    say("ready")
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "send":
            n, tag = int(cmd[1]), cmd[2]
            queued = 0
            for i in range(n):
                # A PUSH with no accepted connection has nowhere to queue:
                # it would block, so the count says what was queued.
                try:
                    sock.send_multipart([b"t", msgpack.packb({"tag": tag, "i": i})],
                                        flags=zmq.NOBLOCK)
                    queued += 1
                except zmq.Again:
                    pass
            say("sent", queued)
        elif cmd[0] == "count":
            with lock:
                say("count", len(got), ",".join(got) or "-")
        elif cmd[0] == "reconnect":
            old = sock
            sock = open_socket(ctx, args, keys)
            if args.role == "sub":
                threading.Thread(target=recv_loop, args=(sock,), daemon=True).start()
            old.disable_monitor()
            old.close()
            say("reconnected")
        elif cmd[0] == "quit":
            say("bye")
            break
    sock.disable_monitor()
    ctx.destroy(linger=0)


def run_flood(args):
    ctx = zmq.Context()
    ctx.max_sockets = 4 * args.batch + 64
    opened = 0
    batch = []
    for line in sys.stdin:
        cmd = line.split()
        if cmd and cmd[0] == "next":
            old, batch = batch, []
            for _ in range(args.batch):
                s = ctx.socket(zmq.PUSH)
                s.linger = 0
                s.reconnect_ivl = -1          # one handshake per socket, no retry
                s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()
                s.curve_serverkey = args.serverkey.encode()
                s.connect(args.endpoint)
                batch.append(s)
            for s in old:
                s.close()
            opened += args.batch
            say("opened", opened)
        elif cmd and cmd[0] == "quit":
            say("bye")
            break
    for s in batch:
        s.close()
    ctx.destroy(linger=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["push", "sub", "flood"])
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--serverkey")
    ap.add_argument("--public")
    ap.add_argument("--secret")
    ap.add_argument("--source")
    ap.add_argument("--batch", type=int, default=250)
    args = ap.parse_args()
    if args.role == "flood":
        run_flood(args)
    else:
        run_client(args)


if __name__ == "__main__":
    main()
