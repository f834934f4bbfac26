"""Shared helpers for the bus tests: waiting on conditions, endpoints, collectors.

No timing thresholds anywhere: every wait is "until this condition holds, or
fail after a generous deadline" (DEADLINE seconds); normally they return in
milliseconds.
"""
import concurrent.futures
import contextlib
import itertools
import os
import re
import socket
import textwrap
import threading
import time

import upcall

# Generous deadline for anything that should normally take milliseconds.
DEADLINE = 30.0

# Payload of warm-up messages (PUB/SUB "slow joiner"); collectors count them
# apart and never record them as data.
PROBE = "__upcall_probe__"
PROBE_TOPIC = b"probe"

STATS_KEYS = {"received", "delivered", "filtered", "batches", "decode_errors",
              "callback_errors", "dropped", "zmq_received"}

MODES = ["native", "python", "caller"]
KINDS = ["sub", "pull"]
TRANSPORTS = ["inproc", "ipc", "tcp"]


def wait_for(predicate, timeout=DEADLINE, what=None):
    """Poll ``predicate()`` until it is truthy; return its value.

    Fails with an AssertionError naming ``what`` (a string, or a callable
    returning one, evaluated at failure time) after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    delay = 0.0002
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            desc = what() if callable(what) else what
            raise AssertionError("timed out after %.0f s waiting for %s"
                                 % (timeout, desc or getattr(predicate, "__name__", predicate)))
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


# ---- scripts in a fresh interpreter -----------------------------------------

# Where the upcall under test was imported from (the source tree with an
# editable install, site-packages with `pip install .`), and this folder.
UPCALL_PATH = os.path.dirname(os.path.dirname(os.path.abspath(upcall.__file__)))
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


# Interpreter flags for the examples and doc programs: development mode, an
# unclosed resource an error (what a careful user runs them with).
DEV_MODE = ("-X", "dev", "-W", "error::ResourceWarning")

# Development mode turns on asyncio's debug mode, which logs every callback
# that held the event loop longer than slow_callback_duration (0.1 s):
# "Executing <Task ...> took 0.104 seconds".  On a loaded machine any
# callback can take that long; the line says how busy the machine was, not
# that the program did something wrong.
ASYNCIO_SLOW_CALLBACK = re.compile(r"Executing <.*> took [0-9.]+ seconds")


def unexpected_stderr(text):
    """A child interpreter's stderr without asyncio's slow-callback notes:
    what the examples and documented programs must leave empty."""
    return "\n".join(line for line in text.splitlines() if not ASYNCIO_SLOW_CALLBACK.fullmatch(line))


def script_env(**extra):
    """The environment for a child interpreter: it imports the same upcall
    as this process, and these helpers, from any working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [UPCALL_PATH, TESTS_DIR] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra)
    return env


# Opens a script that is run with a delivery mode as its first argument:
# KW is what subscribe() takes for that mode.
MODE_PRELUDE = textwrap.dedent("""
    import sys
    import upcall
    from helpers import mode_kwargs

    mode = sys.argv[1]
    KW = mode_kwargs(mode)
""")


# ---- tcp ports ----------------------------------------------------------------

def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Test ports come from below the kernel's ephemeral range, never from
# bind(0): an ephemeral number can be handed to some connect() before the
# test binds it, and a socket reconnecting to an ephemeral port that nobody
# listens on can connect to itself.  Each process walks the range from its
# own starting point, so concurrent runs rarely probe the same numbers, and
# never hands out a number twice.
_PORT_LOW = 20000
_PORT_SPAN = max(_ephemeral_low() - _PORT_LOW, 1000)
_port_walk = itertools.count(os.getpid() * 7919)


def free_tcp_port():
    """A TCP port on 127.0.0.1, free now, not ephemeral, not handed out before."""
    for _ in range(_PORT_SPAN):
        port = _PORT_LOW + next(_port_walk) % _PORT_SPAN
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free tcp port in %d..%d" % (_PORT_LOW, _PORT_LOW + _PORT_SPAN))


# Sockets that hold a port for the whole test process (see unreachable_tcp_endpoint).
_held_ports = []


def unreachable_tcp_endpoint():
    """A tcp endpoint that refuses every connection for the rest of the run.

    The port is bound by a socket of ours that never listens: no other
    process (a concurrent test run) can bind it and accept, and a connecting
    socket cannot take it as its own source port (the loopback self-connect).
    A port that is merely free now gives neither guarantee."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    _held_ports.append(s)
    return "tcp://127.0.0.1:%d" % s.getsockname()[1]


class Collector:
    """A target that records what it is called with.

    ``collector(msg)`` records ``msg``; ``collector(topic, msg)`` (with_topic)
    records ``(topic, msg)``.  Messages equal to PROBE are only counted
    (``.probes``).  ``record`` (optional) is called with the same arguments
    before recording, on the delivery thread, and may raise.
    """

    def __init__(self, record=None):
        self.items = []
        self.probes = 0
        self.calls = 0
        self.cond = threading.Condition()
        self._want = None
        self._record = record

    def __call__(self, *args):
        msg = args[-1]
        with self.cond:
            self.calls += 1
            if isinstance(msg, str) and msg == PROBE:
                self.probes += 1
                self.cond.notify_all()
                return
        if self._record is not None:
            self._record(*args)
        with self.cond:
            self.items.append(args[0] if len(args) == 1 else tuple(args))
            if self._want is None or len(self.items) >= self._want:
                self.cond.notify_all()

    def __len__(self):
        with self.cond:
            return len(self.items)

    def wait(self, n, timeout=DEADLINE, pump=None):
        """Wait until at least ``n`` data messages were recorded.

        ``pump`` (caller mode): called repeatedly (e.g. a short ``sub.poll``)
        instead of waiting on the condition.
        """
        deadline = time.monotonic() + timeout
        if pump is not None:
            while len(self) < n:
                if time.monotonic() >= deadline:
                    break
                pump()
        else:
            with self.cond:
                self._want = n
                self.cond.wait_for(lambda: len(self.items) >= n, timeout)
                self._want = None
        got = len(self)
        assert got >= n, ("timed out after %.0f s: %d of %d messages arrived"
                          % (timeout, got, n))

    def wait_probe(self, timeout):
        with self.cond:
            return self.cond.wait_for(lambda: self.probes > 0, timeout)


def make_pump(sub, interval=0.01):
    """For caller mode: one short poll on the calling thread."""
    def pump():
        sub.poll(timeout=interval)
    return pump


def warm_up(pub, collector, pump=None, topic=PROBE_TOPIC, timeout=DEADLINE):
    """Send probes until one arrives (PUB/SUB slow-joiner), then return.

    After this the subscription is known to be connected and subscribed; the
    probes still in flight are counted by the collector, never recorded.
    """
    deadline = time.monotonic() + timeout
    sent = 0
    while collector.probes == 0:
        if time.monotonic() >= deadline:
            raise AssertionError("no probe arrived within %.0f s (%d sent): the "
                                 "subscription never connected" % (timeout, sent))
        pub.send(topic, PROBE)
        sent += 1
        if pump is not None:
            pump()
        else:
            collector.wait_probe(0.01)


def mode_kwargs(mode):
    """subscribe() keyword arguments for a delivery mode name.

    "executor" makes a two-thread ThreadPoolExecutor whose submit is the
    thread factory; it lives as long as the process (for scripts)."""
    if mode == "native":
        return {}
    if mode == "python":
        return {"thread_factory": upcall.python_threads}
    if mode == "caller":
        return {"delivery": "caller"}
    if mode == "executor":
        pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="pool")
        return {"thread_factory": pool.submit}
    raise ValueError(mode)


def thread_count():
    """Threads of this process (kernel view, includes detached native ones)."""
    return len(os.listdir("/proc/self/task"))


def fd_count():
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


class Sender(threading.Thread):
    """Send ``messages`` [(topic, obj), ...] on ``pub`` from another thread.

    Keeps the test's main thread free to wait or poll (caller mode), and
    keeps a blocking PUSH send (high-water mark) from deadlocking the test.
    Call ``finish()`` to join it and re-raise what it raised.
    """

    def __init__(self, pub, messages, packed=False):
        super().__init__(name="test-sender", daemon=True)
        self.pub = pub
        self.messages = messages
        self.packed = packed
        self.error = None

    def run(self):
        try:
            send = self.pub.send_packed if self.packed else self.pub.send
            for topic, obj in self.messages:
                send(topic, obj)
        except BaseException as e:  # reported by finish()
            self.error = e

    def finish(self, timeout=DEADLINE):
        self.join(timeout)
        assert not self.is_alive(), "sender thread still blocked after %.0f s" % timeout
        if self.error is not None:
            raise self.error


def make_msg(i):
    """A small message with a few types; distinct for every i."""
    return {"i": i, "s": "m%d" % i, "f": i / 4.0, "l": [i, -i, None, True],
            "b": bytes([i % 256]) * (i % 5)}


def marked(frames):
    """A message of upcall's own, as a foreign producer writes it when it
    uses upcall's extensions (out-of-band references, a coalesced payload):
    its frames, then the marker frame (docs/wire.md, "The marker frame")."""
    import upcall
    return list(frames) + [upcall.WIRE_MARKER]


def marked_error_then_good(zctx, endpoint, mode, bad_frames, good_frames, **subscribe_kw):
    """decode_error_then_good with ``bad_frames`` marked as upcall's own."""
    return decode_error_then_good(zctx, endpoint, mode, marked(bad_frames), good_frames,
                                  **subscribe_kw)


def batch_handler():
    """An upcall.Handler taking batches (on_batch), keeping every message in
    .got."""
    import upcall

    class Batches(upcall.Handler):
        def __init__(self):
            self.batches = True
            self.got = []

        def on_batch(self, msgs):
            self.got.extend(msgs)
    return Batches()


def pyzmq_push(zctx, endpoint):
    """A pyzmq PUSH connected to endpoint (linger 0): a foreign peer."""
    import zmq
    push = zctx.socket(zmq.PUSH)
    push.linger = 0
    push.connect(endpoint)
    return push


def run_to_end(sub, mode):
    """Until sub's source has ended (a synthetic source's count): by poll()
    in caller mode (it returns after each batch), else by waiting."""
    if mode == "caller":
        deadline = time.monotonic() + DEADLINE
        while not sub.closed:
            assert time.monotonic() < deadline, "the source did not end"
            sub.poll(timeout=DEADLINE)
    else:
        assert sub.wait(DEADLINE)


@contextlib.contextmanager
def pushed_pull(zctx, endpoint, mode, **subscribe_kw):
    """On a new Bus, a PULL subscription bound to ``endpoint`` in ``mode``
    that collects into a Collector and its decode errors into a list, and a
    pyzmq PUSH connected to it: yields (collector, errors, sub, pump, push),
    pump None unless ``mode`` is "caller"."""
    import upcall
    col = Collector()
    errors = []
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoint, col, kind="pull", bind=True,
                            on_error=lambda exc, raw: errors.append(exc),
                            **subscribe_kw, **mode_kwargs(mode))
        pump = make_pump(sub) if mode == "caller" else None
        yield col, errors, sub, pump, pyzmq_push(zctx, sub.last_endpoint)


def decode_error_then_good(zctx, endpoint, mode, bad_frames, good_frames, **subscribe_kw):
    """Send ``bad_frames`` then ``good_frames`` from a pyzmq PUSH to a PULL
    subscription (ipc, bound here) in ``mode``; wait for the good message.
    Returns (delivered, errors passed to on_error, the subscription's stats)."""
    with pushed_pull(zctx, endpoint, mode, **subscribe_kw) as (col, errors, sub, pump, push):
        push.send_multipart(bad_frames)
        push.send_multipart(good_frames)
        col.wait(1, pump=pump)
        stats = sub.stats
    return col.items, errors, stats
