"""Coalescing publishers (send side; docs/wire.md, ext 127).

The messages are read by a plain pyzmq + msgpack reader that splits ext 127
payloads as docs/wire.md shows: the interop check, and a view of the zmq
message boundaries.  Receivers are a fixture parametrized by name
(RECEIVERS), so that an upcall subscription that splits batches itself can
be added as one more receiver.

Real libzmq sockets; every wait is on a condition with a deadline."""
import os
import subprocess
import sys
import textwrap
import threading

import msgpack
import pytest
import zmq

import upcall
from helpers import DEADLINE, MODES, mode_kwargs, script_env, wait_for

HEADER = 7   # c9 <u32> 7f 01


class Batch(list):
    """The messages of one coalesced payload (a list that is not a message)."""


def ext_hook(code, data):
    if code == 127:
        assert data[0] == 1                      # version
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(data[1:])
        return Batch(unpacker)
    return msgpack.ExtType(code, data)


def split(payload):
    """The messages of one zmq payload: several for a coalesced one."""
    obj = msgpack.unpackb(payload, raw=False, ext_hook=ext_hook)
    return list(obj) if isinstance(obj, Batch) else [obj]


class PyzmqReceiver:
    """A pyzmq PULL (or SUB) socket read on a thread of its own: keeps every
    zmq message as (topic, payload bytes)."""

    def __init__(self, kind="push", topics=(b"",)):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL if kind == "push" else zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        if kind == "pub":
            for t in topics:
                self.sock.setsockopt(zmq.SUBSCRIBE, t)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.frames = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-receiver", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            if self.sock.poll(20):
                while True:
                    try:
                        self.frames.append(tuple(self.sock.recv_multipart(zmq.NOBLOCK)))
                    except zmq.Again:
                        break

    def messages(self):
        """[(topic, obj), ...] with coalesced payloads split, in order."""
        return [(f[0], m) for f in list(self.frames) for m in split(f[1])]

    def wait(self, n, timeout=DEADLINE):
        wait_for(lambda: len(self.messages()) >= n, timeout,
                 what=f"{n} messages (have {len(self.messages())})")
        return self.messages()

    def close(self):
        self._stop.set()
        self._thread.join(DEADLINE)
        self.sock.close()
        self.ctx.term()


class UpcallReceiver:
    """An upcall subscription (PULL or SUB) on a bus of its own, in one
    delivery mode; a caller-mode one is polled by a thread of the test.
    Sees messages, not zmq messages: ``frames`` is None."""

    frames = None

    def __init__(self, mode, kind="push", topics=(b"",)):
        self.items = []
        self.bus = upcall.Bus()
        kw = {"kind": "pull"} if kind == "push" else {"kind": "sub", "topics": list(topics)}
        self.sub = self.bus.subscribe(
            "tcp://127.0.0.1:*", lambda t, m: self.items.append((bytes(t), m)),
            bind=True, with_topic=True, **kw, **mode_kwargs(mode))
        self.endpoint = self.sub.last_endpoint
        self._stop = threading.Event()
        self._pump = None
        if mode == "caller":
            self._pump = threading.Thread(target=self._poll, name="test-pump", daemon=True)
            self._pump.start()

    def _poll(self):
        while not self._stop.is_set():
            self.sub.poll(timeout=0.02)

    def messages(self):
        return list(self.items)

    wait = PyzmqReceiver.wait

    def close(self):
        self._stop.set()
        if self._pump is not None:
            self._pump.join(DEADLINE)
        errors = self.sub.stats["decode_errors"]
        self.bus.close()
        assert errors == 0


def _upcall_splits():
    """True once upcall subscriptions split coalesced messages (the
    receive side): two messages sent as one arrive as two."""
    got = []
    with upcall.Bus() as b:
        sub = b.subscribe("tcp://127.0.0.1:*", got.append, kind="pull", bind=True,
                          delivery="caller", on_error=lambda exc, msg: None)
        pub = b.publisher(sub.last_endpoint, kind="push", bind=False)
        pub.send_many(b"t", [1, 2])
        sub.poll(timeout=DEADLINE, max_messages=1)
        sub.poll(timeout=0.2)
        return got == [1, 2]


# The readers every test runs with: pyzmq + msgpack always, and upcall
# subscriptions in each delivery mode as soon as they split batches.
RECEIVERS = ["pyzmq"] + (["upcall-" + m for m in MODES] if _upcall_splits() else [])


@pytest.fixture(params=RECEIVERS)
def receiver(request):
    made = []

    def make(kind="push", topics=(b"",)):
        if request.param == "pyzmq":
            r = PyzmqReceiver(kind, topics)
        else:
            r = UpcallReceiver(request.param.split("-", 1)[1], kind, topics)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


@pytest.fixture
def bus():
    with upcall.Bus() as b:
        yield b


def publisher(bus, endpoint, **kw):
    kw.setdefault("kind", "push")
    kw.setdefault("coalesce", True)
    kw.setdefault("bind", False)
    return bus.publisher(endpoint, **kw)


# ---- nothing lost, in order ------------------------------------------------

def test_order_across_flushes_and_close(bus, receiver):
    r = receiver()
    pub = publisher(bus, r.endpoint, max_delay=None, max_batch=50)
    sent = []
    for i in range(2000):
        pub.send(b"t", {"i": i})
        sent.append((b"t", {"i": i}))
        if i % 333 == 0:
            pub.flush()
            assert pub.pending == 0
    pending = pub.pending
    assert 0 < pending < 50
    pub.close()                      # sends what is pending
    assert r.wait(len(sent)) == sent
    # Coalesced: far fewer zmq messages than messages, none over max_batch.
    if r.frames is not None:
        sizes = [len(split(f[1])) for f in r.frames]
        assert len(r.frames) < len(sent) // 10 and max(sizes) == 50


def test_max_delay_sends_without_another_call(bus, receiver):
    r = receiver()
    pub = publisher(bus, r.endpoint, max_delay=0.02)
    pub.send(b"alone", "x")
    assert r.wait(1) == [(b"alone", "x")]
    # A batch of one travels as that message alone: a plain payload.
    assert r.frames is None or r.frames[0][1] == msgpack.packb("x")
    pub.send(b"two", 1)
    pub.send(b"two", 2)
    assert r.wait(3)[1:] == [(b"two", 1), (b"two", 2)]
    if r.frames is not None:
        payload = r.frames[1][1]
        assert payload[0] == 0xC9 and payload[5:7] == b"\x7f\x01"
        assert int.from_bytes(payload[1:5], "big") == len(payload) - 6
    wait_for(lambda: pub.pending == 0, what="nothing pending")


def test_bus_close_sends_pending(receiver):
    r = receiver()
    with upcall.Bus() as b:
        pub = publisher(b, r.endpoint, max_delay=None)
        for i in range(10):
            pub.send(b"t", i)
        assert pub.pending == 10
    assert [m for _, m in r.wait(10)] == list(range(10))


def test_interpreter_exit_sends_pending(receiver, tmp_path):
    # A program that never closes: the bus closed at exit sends the batches.
    r = receiver()
    script = textwrap.dedent(f"""
        import upcall
        bus = upcall.Bus()
        pub = bus.publisher({r.endpoint!r}, kind="push", bind=False, coalesce=True,
                            max_delay=None)
        for i in range(10):
            pub.send(b"t", i)
        assert pub.pending == 10
    """)
    # cwd: not the source tree, whose upcall/ (built for one CPython only)
    # "-c" would import ahead of the one under test.
    proc = subprocess.run([sys.executable, "-c", script], env=script_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=DEADLINE)
    assert proc.returncode == 0, proc.stderr
    assert [m for _, m in r.wait(10)] == list(range(10))


# ---- batch boundaries --------------------------------------------------------

def test_max_batch_splits(bus, receiver):
    r = receiver()
    pub = publisher(bus, r.endpoint, max_delay=None, max_batch=7)
    for i in range(50):
        pub.send(b"t", i)
    pub.flush()
    assert [m for _, m in r.wait(50)] == list(range(50))
    if r.frames is not None:
        assert [len(split(f[1])) for f in r.frames] == [7] * 7 + [1]


def test_max_bytes_splits_and_large_goes_alone(bus, receiver):
    r = receiver()
    pub = publisher(bus, r.endpoint, max_delay=None, max_bytes=200)
    small = "s" * 40                               # 42 bytes packed
    for i in range(20):
        pub.send(b"t", [i, small])
    big = "b" * 500
    pub.send(b"t", big)                            # after the pending ones, alone
    pub.send(b"t", "after")
    pub.flush()
    got = r.wait(22)
    assert [m for _, m in got] == [[i, small] for i in range(20)] + [big, "after"]
    if r.frames is not None:
        assert all(len(f[1]) <= 200 for f in r.frames if f[1] != msgpack.packb(big))
        assert msgpack.packb(big) in [f[1] for f in r.frames]


def test_topics_batched_apart_order_per_topic(bus, receiver):
    r = receiver()
    pub = publisher(bus, r.endpoint, max_delay=None, max_batch=10)
    topics = [b"a", b"bb", "c"]                    # str topics go as UTF-8
    for i in range(90):
        pub.send(topics[i % 3], i)
    pub.flush()
    got = r.wait(90)
    for k, t in enumerate([b"a", b"bb", b"c"]):
        assert [m for tt, m in got if tt == t] == list(range(k, 90, 3))
    assert r.frames is None or len(r.frames) == 9  # one topic per zmq message


def test_more_topics_than_slots(bus, receiver):
    r = receiver()
    pub = publisher(bus, r.endpoint, max_delay=None)
    for rnd in range(3):
        for t in range(100):
            pub.send(b"topic%d" % t, (rnd, t))
    assert pub.pending <= 64 * 3
    pub.flush()
    got = r.wait(300)
    for t in range(100):
        assert [m for tt, m in got if tt == b"topic%d" % t] == [[0, t], [1, t], [2, t]]


def test_uncoalesced_sends_keep_topic_order(bus, receiver):
    r = receiver()
    pub = publisher(bus, r.endpoint, max_delay=None, oob_threshold=100)
    pub.send(b"t", 1)
    pub.send_packed(b"t", msgpack.packb(2))        # never coalesced
    pub.send(b"t", 3)
    pub.send(b"t", {"blob": b"x" * 1000}, copy=True)   # out of band: alone
    pub.send(b"t", 5)
    pub.flush()
    got = [m for _, m in r.wait(5)]
    assert got[:3] == [1, 2, 3] and got[4] == 5
    if r.frames is not None:                       # [topic, payload, blob, marker]
        assert len(r.frames) == 5
        assert len(r.frames[3]) == 4 and r.frames[3][2] == b"x" * 1000
    else:
        assert bytes(got[3]["blob"]) == b"x" * 1000


# ---- send_many -------------------------------------------------------------

@pytest.mark.parametrize("coalesce", [False, True])
def test_send_many(bus, receiver, coalesce):
    r = receiver()
    pub = publisher(bus, r.endpoint, coalesce=coalesce, max_batch=8, max_delay=None)
    pub.send(b"t", "first")
    pub.send_many(b"t", ({"i": i} for i in range(20)))
    assert pub.pending == 0
    got = r.wait(21)
    assert got == [(b"t", "first")] + [(b"t", {"i": i}) for i in range(20)]
    if not coalesce and r.frames is not None:
        assert [len(split(f[1])) for f in r.frames] == [1, 8, 8, 4]
    pub.send_many(b"t", [])                         # nothing to send
    pub.send_many(b"t", ["one"])
    assert r.wait(22)[-1] == (b"t", "one")


def test_send_many_out_of_band_on_a_coalescing_publisher(bus, receiver):
    r = receiver()
    pub = publisher(bus, r.endpoint, max_delay=None, oob_threshold=100)
    blob = bytearray(b"y" * 1000)
    pub.send_many(b"t", [1, {"blob": blob}, 3])
    blob[:] = b"z" * 1000                          # copied: free once send_many returns
    got = [m for _, m in r.wait(3)]
    assert got[0] == 1 and got[2] == 3
    if r.frames is not None:
        # the out-of-band one alone, with its marker frame (docs/wire.md)
        assert [len(f) for f in r.frames] == [2, 4, 2] and r.frames[1][2] == b"y" * 1000
    else:
        assert bytes(got[1]["blob"]) == b"y" * 1000


def test_send_many_encoder(bus, receiver):
    r = receiver()
    pub = publisher(bus, r.endpoint, coalesce=False, encoder=msgpack.packb)
    pub.send_many(b"t", range(5))
    assert [m for _, m in r.wait(5)] == list(range(5))
    assert r.frames is None or len(r.frames) == 1


# ---- threads -----------------------------------------------------------------

def test_concurrent_senders(bus, receiver):
    r = receiver()
    pub = publisher(bus, r.endpoint, max_delay=0.001, max_batch=32)
    n, per = 4, 2000
    errors = []

    def run(k):
        try:
            for i in range(per):
                pub.send(b"t%d" % (k % 2), (k, i))
        except BaseException as e:         # checked below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert not errors
    got = r.wait(n * per)
    for k in range(n):
        assert [m[1] for _, m in got if m[0] == k] == list(range(per))


# ---- high-water mark, timeouts, close ----------------------------------------

def test_timeouts_when_a_batch_cannot_go(bus):
    # A bound PUSH with no peer has nowhere to queue: a full batch stays.
    pub = publisher(bus, "tcp://127.0.0.1:*", bind=True, max_batch=2, max_delay=None, linger=0)
    pub.send(b"t", 1, timeout=0)
    pub.send(b"t", 2, timeout=0)                   # full: kept, sent later
    assert pub.pending == 2
    with pytest.raises(BlockingIOError):
        pub.send(b"t", 3, timeout=0)
    with pytest.raises(TimeoutError):
        pub.send(b"t", 3, timeout=0.05)
    with pytest.raises(BlockingIOError):
        pub.flush(timeout=0)
    with pytest.raises(TimeoutError):
        pub.flush(timeout=0.05)
    assert pub.pending == 2                        # nothing lost, nothing doubled
    pub.close()                                    # linger=0: drops, never hangs
    with pytest.raises(ValueError):
        pub.send(b"t", 4)
    with pytest.raises(ValueError):
        pub.flush()


def test_flusher_waits_for_a_peer(bus):
    # The batch is due while there is no peer (a bound PUSH has nowhere to
    # queue): the C core keeps it and sends it once one connects.
    pub = publisher(bus, "tcp://127.0.0.1:*", bind=True, max_delay=0.01)
    pub.send(b"t", "late")
    assert pub.pending == 1
    ctx = zmq.Context()
    try:
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.LINGER, 0)
        pull.connect(pub.last_endpoint)
        assert pull.poll(DEADLINE * 1000)
        assert pull.recv_multipart() == [b"t", msgpack.packb("late")]
        pull.close()
    finally:
        ctx.term()


# ---- PUB/SUB -------------------------------------------------------------------

def test_pub_sub_with_pyzmq_sub(bus, receiver):
    r = receiver("pub", topics=[b"a."])
    pub = publisher(bus, r.endpoint, kind="pub", max_delay=0.005)
    pub.wait_subscriptions(1, timeout=DEADLINE)
    for i in range(100):
        pub.send(b"a.x", i)
        pub.send(b"b.x", -i)                       # filtered by the SUB, whole batches
    pub.flush()
    got = r.wait(100)
    assert got == [(b"a.x", i) for i in range(100)]
    assert r.frames is None or all(f[0] == b"a.x" for f in r.frames)


# ---- arguments -------------------------------------------------------------------

@pytest.mark.parametrize("kw, exc, name", [
    ({"coalesce": "yes"}, TypeError, "coalesce"),
    ({"coalesce": 1}, TypeError, "coalesce"),
    ({"max_delay": -1}, ValueError, "max_delay"),
    ({"max_delay": float("nan")}, ValueError, "max_delay"),
    ({"max_delay": "1"}, TypeError, "max_delay"),
    ({"max_delay": True}, TypeError, "max_delay"),
    ({"max_batch": 0}, ValueError, "max_batch"),
    ({"max_batch": 1.5}, TypeError, "max_batch"),
    ({"max_bytes": 10}, ValueError, "max_bytes"),
    ({"max_bytes": 2 ** 32}, ValueError, "max_bytes"),
    ({"max_bytes": None}, TypeError, "max_bytes"),
])
def test_argument_errors(bus, kw, exc, name):
    with pytest.raises(exc, match=name):
        bus.publisher("tcp://127.0.0.1:*", coalesce=kw.pop("coalesce", True), **kw)


def test_max_delay_range(bus):
    # The longest delay is an hour (in microseconds it does not fit an int).
    bus.publisher("tcp://127.0.0.1:*", coalesce=True, max_delay=3600, bind=True).close()
    bus.publisher("tcp://127.0.0.1:*", coalesce=True, max_delay=0, bind=True).close()
    with pytest.raises(ValueError, match="max_delay"):
        bus.publisher("tcp://127.0.0.1:*", coalesce=True, max_delay=3600.5, bind=True)


def test_send_many_argument_errors(bus, receiver):
    r = receiver()
    pub = publisher(bus, r.endpoint)
    with pytest.raises(TypeError):
        pub.send_many(b"t", 5)                     # not iterable
    with pytest.raises(TypeError, match="topic"):
        pub.send_many(5, [1])
    with pytest.raises(TypeError):
        pub.send_many(b"t", [object()])            # cannot pack
    with pytest.raises(ValueError, match="timeout"):
        pub.flush(timeout=-1)


# ---- fork -------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_fork_child_publisher_is_inert(bus, receiver):
    r = receiver()
    pub = publisher(bus, r.endpoint, max_delay=0.01)
    pub.send(b"t", "before")
    pid = os.fork()
    if pid == 0:                                    # the child: nothing may hang
        code = 1
        try:
            try:
                pub.send(b"t", "child")
            except RuntimeError:                    # inherited: inert
                code = 0
            except Exception:
                code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    pub.send(b"t", "after")
    assert [m for _, m in r.wait(2)] == ["before", "after"]


# ---- Ctrl-C ---------------------------------------------------------------------

@pytest.mark.parametrize("method", ["send", "flush"])
def test_ctrl_c_while_a_batch_waits(bus, method):
    # A bound PUSH with no peer: a full batch cannot go, and the next send
    # (or a flush) blocks on it until Ctrl-C; the interrupted message is not
    # taken, the pending one is not lost.
    import _thread
    pub = publisher(bus, "tcp://127.0.0.1:*", bind=True, max_batch=1, max_delay=None)
    pub.send(b"t", "pending")
    assert pub.pending == 1
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            if method == "send":
                pub.send(b"t", "interrupted", timeout=DEADLINE)
            else:
                pub.flush(timeout=DEADLINE)
    finally:
        timer.cancel()
    assert pub.pending == 1
    ctx = zmq.Context()
    try:
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.LINGER, 0)
        pull.setsockopt(zmq.RCVTIMEO, int(DEADLINE * 1000))
        pull.connect(pub.last_endpoint)
        pub.send(b"t", "after", timeout=DEADLINE)
        pub.flush(timeout=DEADLINE)
        got = [split(pull.recv_multipart()[1]) for _ in range(2)]
        assert got == [["pending"], ["after"]]
        pull.close()
    finally:
        ctx.term()
