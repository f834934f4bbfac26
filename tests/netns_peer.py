"""A bus peer in its own process, driven line by line over stdin/stdout.

Run by tests/bus/test_netns.py inside a network namespace (``ip netns exec``) and
by tests/bus/test_curve.py as an out-of-process CURVE publisher.  Everything it
reports goes to its stdout; it talks to the test over no socket.

    netns_peer.py pub --kind pub|push --endpoint EP [--connect]
                      [--curve-public K --curve-secret K] [--plain EP2]
                      [--interval SECONDS] [--sndhwm N] [--pad BYTES]
    netns_peer.py sub --kind sub|pull --endpoint EP [--bind]
                      [--curve-serverkey K]

Messages are ``[b"seq", {"seq": n}]`` with n = 0, 1, 2, ...; probes are
helpers.PROBE on topic helpers.PROBE_TOPIC; a sentinel on the plain endpoint
is ``{"sentinel": n}`` (n: data messages sent so far).

Commands (one per line) and their one-line replies:
    pub:  probe -> "probed" (a probe on every endpoint)
          send N -> "sent TOTAL" (N messages, then a sentinel on --plain)
          stream -> "streaming" (send one message per --interval until stop)
          stop -> "stopped TOTAL"        count -> "count TOTAL"
          quit -> "bye", exit 0
    sub:  status -> "status COUNT LAST"  report -> "report {json}"
          close -> "closed {json}" (close(timeout=5); ok, seconds, seqs, stats)
          quit -> "bye", exit 0
At start each prints "ready ENDPOINT [PLAIN_ENDPOINT]".

This module also holds ``Peer``, the test side of that conversation.
"""
import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

_out_lock = threading.Lock()


def say(*words):
    with _out_lock:
        sys.stdout.write(" ".join(str(w) for w in words) + "\n")
        sys.stdout.flush()


def curve_kwargs(args, role):
    if role == "server" and args.curve_public:
        return {"curve_server": (args.curve_public, args.curve_secret)}
    if role == "client" and args.curve_serverkey:
        return {"curve_serverkey": args.curve_serverkey}
    return {}


def run_pub(args, bus):
    from helpers import PROBE, PROBE_TOPIC

    pub = bus.publisher(args.endpoint, kind=args.kind, bind=not args.connect,
                        sndhwm=args.sndhwm, **curve_kwargs(args, "server"))
    plain = bus.publisher(args.plain, kind="pub", bind=True) if args.plain else None
    say("ready", pub.last_endpoint, plain.last_endpoint if plain else "")
    state = {"sent": 0}
    stop = threading.Event()
    streamer = None

    def stream():
        pad = b"x" * args.pad
        while not stop.is_set():
            pub.send(b"seq", {"seq": state["sent"], "pad": pad})
            state["sent"] += 1
            time.sleep(args.interval)

    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "probe":
            pub.send(PROBE_TOPIC, PROBE)
            if plain:
                plain.send(PROBE_TOPIC, PROBE)
            say("probed")
        elif cmd[0] == "send":
            for _ in range(int(cmd[1])):
                pub.send(b"seq", {"seq": state["sent"]})
                state["sent"] += 1
            if plain:
                plain.send(b"sentinel", {"sentinel": state["sent"]})
            say("sent", state["sent"])
        elif cmd[0] == "stream":
            streamer = threading.Thread(target=stream, name="stream", daemon=True)
            streamer.start()
            say("streaming")
        elif cmd[0] == "stop":
            stop.set()
            if streamer is not None:
                streamer.join()
            say("stopped", state["sent"])
        elif cmd[0] == "count":
            say("count", state["sent"])
        elif cmd[0] == "quit":
            break
        else:
            say("error", "unknown command", cmd[0])
    stop.set()


def run_sub(args, bus):
    from helpers import PROBE

    seqs = []
    probes = [0]

    def on_msg(msg):
        if msg == PROBE:
            probes[0] += 1
        else:
            seqs.append(msg["seq"])

    sub = bus.subscribe(args.endpoint, on_msg, kind=args.kind, bind=args.bind,
                        **curve_kwargs(args, "client"))
    say("ready", sub.last_endpoint)

    def summary(**extra):
        got = list(seqs)
        return json.dumps(dict(extra, seqs=got, probes=probes[0], stats=dict(sub.stats)))

    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "status":
            got = list(seqs)
            say("status", len(got), got[-1] if got else -1)
        elif cmd[0] == "report":
            say("report", summary())
        elif cmd[0] == "close":
            t0 = time.monotonic()
            try:
                sub.close(timeout=5.0)
                ok = True
            except TimeoutError:
                ok = False
            say("closed", summary(ok=ok, seconds=time.monotonic() - t0))
        elif cmd[0] == "quit":
            break
        else:
            say("error", "unknown command", cmd[0])


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["pub", "sub"])
    p.add_argument("--kind", required=True, choices=["pub", "push", "sub", "pull"])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bind", action="store_true")
    p.add_argument("--connect", action="store_true")
    p.add_argument("--plain")
    p.add_argument("--interval", type=float, default=0.001)
    p.add_argument("--sndhwm", type=int)
    p.add_argument("--pad", type=int, default=0, help="bytes of padding per streamed message")
    p.add_argument("--curve-public")
    p.add_argument("--curve-secret")
    p.add_argument("--curve-serverkey")
    args = p.parse_args(argv)

    import upcall

    with upcall.Bus() as bus:
        (run_pub if args.role == "pub" else run_sub)(args, bus)
        bus.close(timeout=5.0)
    say("bye")
    return 0


# ---- the test side ----------------------------------------------------------

class Peer:
    """A netns_peer.py process (optionally under a command prefix such as
    ``ip netns exec NAME``) and its line conversation."""

    def __init__(self, argv, prefix=(), timeout=30.0):
        from helpers import script_env   # the test side only
        env = script_env(PYTHONUNBUFFERED="1")
        self.timeout = timeout
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, os.path.join(HERE, "netns_peer.py"), *argv],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1, env=env)
        self._lines = queue.Queue()
        self._stderr = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines.put),
                         daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self._stderr.append),
                         daemon=True).start()

    @staticmethod
    def _pump(stream, put):
        for line in stream:
            put(line.rstrip("\n"))
        put(None)

    def _describe(self):
        return "peer %s (exit status %s); stderr:\n%s" % (
            " ".join(self.proc.args[-6:]), self.proc.poll(),
            "\n".join(line for line in self._stderr if line is not None)[-4000:])

    def expect(self, word, timeout=None):
        """The rest of the next line starting with ``word`` (other lines are skipped)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0))
            except queue.Empty:
                raise AssertionError("no %r from %s" % (word, self._describe())) from None
            if line is None:
                self._lines.put(None)
                self.proc.wait(5)
                raise AssertionError("ended before %r: %s" % (word, self._describe()))
            head, _, rest = line.partition(" ")
            if head == word:
                return rest
            if head == "error":
                raise AssertionError("%s: %s" % (line, self._describe()))

    REPLIES = {"probe": "probed", "send": "sent", "stream": "streaming", "stop": "stopped",
               "close": "closed", "quit": "bye"}

    def ask(self, command, timeout=None):
        """Send a command; return the rest of its reply line."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        word = command.split()[0]
        return self.expect(self.REPLIES.get(word, word), timeout)

    def wait_exit(self, timeout=None):
        try:
            return self.proc.wait(self.timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("still running: %s" % self._describe()) from None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin,):
            try:
                f.close()
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
