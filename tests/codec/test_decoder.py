"""subscribe(decoder=...) and raw=True, over real sockets.

A decoder replaces the built-in msgpack decoder for every payload; its
exceptions are decode errors (counted, an upcall.DecodeError naming the
topic with the original as __cause__, the raw payload for on_error).
raw=True hands the payload over as bytes, exactly as sent.  Checked in every
delivery mode, for callables, Handlers (one message or whole batches),
native handlers' targets and subscribe_async, with msgspec Structs from a
pyzmq publisher and from upcall's own.
"""
import asyncio
import json
import threading

import pytest

import upcall
from upcall.handler import Handler
from upcall.native import FieldFilter
from helpers import DEADLINE, Collector, mode_kwargs, wait_for

pytestmark = pytest.mark.threads

try:
    import msgspec
except ImportError:
    msgspec = None

needs_msgspec = pytest.mark.skipif(msgspec is None, reason="msgspec is not installed")

# Every way a subscription delivers: the core's thread, threading.Thread, an
# executor's submit as the thread factory, and the caller's thread.
ALL_MODES = ["native", "python", "executor", "caller"]

if msgspec is not None:
    class Trade(msgspec.Struct):
        sym: str
        px: float
        qty: int


def assert_adds_up(st):
    accounted = (st["delivered"] + st["filtered"] + st["decode_errors"]
                 + st["callback_errors"] + st["dropped"])
    assert st["received"] == accounted, st


def open_pull(bus, endpoints, target, mode, transport="inproc", **kwargs):
    """A PULL subscription bound to a fresh endpoint in ``mode``, and a pump
    for Collector.wait (caller mode polls on this thread)."""
    ep = endpoints(transport)
    sub = bus.subscribe(ep, target, kind="pull", bind=True, **mode_kwargs(mode), **kwargs)
    pump = (lambda: sub.poll(timeout=0.01)) if mode == "caller" else None
    return ep, sub, pump


def settle(sub, mode, total):
    """Wait until the subscription has accounted for ``total`` messages."""
    def done():
        if mode == "caller":
            sub.poll(timeout=0.01)
        st = sub.stats
        return st["received"] == total and (
            st["delivered"] + st["decode_errors"] + st["callback_errors"]
            + st["filtered"] + st["dropped"]) == total
    wait_for(done, what=lambda: f"{total} messages accounted for: {sub.stats}")
    return sub.stats


class Errors:
    """on_error that records (exception, msg)."""

    def __init__(self):
        self.items = []
        self.lock = threading.Lock()

    def __call__(self, exc, msg):
        with self.lock:
            self.items.append((exc, msg))


# ---- msgspec Structs --------------------------------------------------------

@needs_msgspec
@pytest.mark.parametrize("mode", ALL_MODES)
def test_structs_from_a_pyzmq_publisher(endpoints, mode):
    zmq = pytest.importorskip("zmq")
    trades = [Trade("AAPL", 187.25 + i, 100 + i) for i in range(50)]
    got = Collector()
    with upcall.Bus() as bus:
        ep, sub, pump = open_pull(bus, endpoints, got, mode, transport="tcp",
                                  decoder=msgspec.msgpack.Decoder(Trade).decode)
        ctx = zmq.Context()
        try:
            push = ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 2000)
            push.connect(ep)
            for t in trades:
                push.send_multipart([b"trades.AAPL", msgspec.msgpack.encode(t)])
            got.wait(len(trades), pump=pump)
            push.close()
        finally:
            ctx.term()
        assert got.items == trades
        assert all(type(t) is Trade for t in got.items)
        st = settle(sub, mode, len(trades))
        assert st["delivered"] == len(trades) and st["decode_errors"] == 0
        assert_adds_up(st)


@needs_msgspec
@pytest.mark.parametrize("mode", ALL_MODES)
def test_structs_from_an_upcall_publisher_with_topic(endpoints, mode):
    got = Collector()
    trades = [Trade("MSFT", 400.5, i) for i in range(20)]
    with upcall.Bus() as bus:
        ep, sub, pump = open_pull(bus, endpoints, got, mode, with_topic=True,
                                  decoder=msgspec.msgpack.Decoder(Trade).decode)
        pub = bus.publisher(ep, kind="push", bind=False,
                            encoder=msgspec.msgpack.Encoder().encode)
        for t in trades:
            pub.send(b"trades.MSFT", t)
        got.wait(len(trades), pump=pump)
        assert got.items == [(b"trades.MSFT", t) for t in trades]
        assert_adds_up(settle(sub, mode, len(trades)))


@needs_msgspec
@pytest.mark.parametrize("mode", ALL_MODES)
def test_validation_failure_is_a_decode_error(endpoints, mode):
    errors = Errors()
    got = Collector()
    bad = msgspec.msgpack.encode({"sym": "AAPL", "px": "not a number", "qty": 1})
    good = msgspec.msgpack.encode(Trade("AAPL", 1.0, 2))
    with upcall.Bus() as bus:
        ep, sub, pump = open_pull(bus, endpoints, got, mode, on_error=errors,
                                  decoder=msgspec.msgpack.Decoder(Trade).decode)
        pub = bus.publisher(ep, kind="push", bind=False)
        pub.send_packed(b"trades.bad", bad)
        pub.send_packed(b"trades.good", good)
        got.wait(1, pump=pump)
        st = settle(sub, mode, 2)
    assert got.items == [Trade("AAPL", 1.0, 2)]
    assert st["decode_errors"] == 1 and st["callback_errors"] == 0 and st["delivered"] == 1
    assert_adds_up(st)
    [(exc, msg)] = errors.items
    assert isinstance(exc, upcall.DecodeError)
    assert exc.topic == b"trades.bad"
    assert exc.reason == "decoder" and exc.offset is None
    assert isinstance(exc.__cause__, msgspec.ValidationError)
    assert "ValidationError" in str(exc) and "trades.bad" in str(exc)
    assert msg == bad          # the raw payload, as for malformed msgpack


@needs_msgspec
def test_typed_messages_through_a_native_handler(endpoints):
    # select() reads the msgpack fields; what it passes on is decoded by the
    # subscription's decoder.
    got = Collector()
    with upcall.Bus() as bus:
        ep, sub, _ = open_pull(bus, endpoints, FieldFilter("px", gt=100.0, target=got), "native",
                               decoder=msgspec.msgpack.Decoder(Trade).decode)
        pub = bus.publisher(ep, kind="push", bind=False)
        for px in (50.0, 150.0, 99.0, 101.5):
            pub.send_packed(b"t", msgspec.msgpack.encode(Trade("X", px, 1)))
        got.wait(2)
        st = settle(sub, "native", 4)
    assert got.items == [Trade("X", 150.0, 1), Trade("X", 101.5, 1)]
    assert st["filtered"] == 2 and st["delivered"] == 2
    assert_adds_up(st)


# ---- any callable -----------------------------------------------------------

class OnMessage(Handler):
    def __init__(self):
        self.got = Collector()

    def on_message(self, msg):
        self.got(msg)


class OnBatch(Handler):
    def __init__(self):
        self.batches = True
        self.got = Collector()

    def on_batch(self, msgs):
        for m in msgs:
            self.got(m)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("target", ["callable", "handler", "batch-handler"])
def test_json_decoder_and_its_errors(endpoints, mode, target):
    # Not even msgpack: the decoder owns the payload format.  A payload it
    # refuses is counted and reported where it stands; delivery goes on.
    if target == "callable":
        tgt = got = Collector()
    else:
        tgt = OnMessage() if target == "handler" else OnBatch()
        got = tgt.got
    errors = Errors()
    payloads = [b'{"i": 0}', b"{not json", b'{"i": 2}', b'[3]']
    with upcall.Bus() as bus:
        ep, sub, pump = open_pull(bus, endpoints, tgt, mode, decoder=json.loads,
                                  on_error=errors, batch=3)
        pub = bus.publisher(ep, kind="push", bind=False)
        for p in payloads:
            pub.send_packed(b"j", p)
        got.wait(3, pump=pump)
        st = settle(sub, mode, 4)
    assert got.items == [{"i": 0}, {"i": 2}, [3]]
    assert st["decode_errors"] == 1 and st["delivered"] == 3 and st["callback_errors"] == 0
    [(exc, msg)] = errors.items
    assert isinstance(exc, upcall.DecodeError) and exc.topic == b"j"
    assert isinstance(exc.__cause__, json.JSONDecodeError)
    assert msg == b"{not json"


@pytest.mark.parametrize("mode", ["native", "caller"])
def test_target_errors_stay_callback_errors(endpoints, mode):
    errors = Errors()

    def target(msg):
        raise RuntimeError(f"target refuses {msg!r}")
    with upcall.Bus() as bus:
        ep, sub, _ = open_pull(bus, endpoints, target, mode, decoder=bytes.upper,
                               on_error=errors)
        pub = bus.publisher(ep, kind="push", bind=False)
        pub.send_packed(b"t", b"abc")
        st = settle(sub, mode, 1)
    assert st["callback_errors"] == 1 and st["decode_errors"] == 0
    [(exc, msg)] = errors.items
    assert isinstance(exc, RuntimeError) and msg == b"ABC"


def test_decoder_gets_each_payload_as_bytes_it_may_keep(endpoints):
    seen = []

    def decoder(payload):
        seen.append(payload)
        return len(payload)
    got = Collector()
    with upcall.Bus() as bus:
        ep, sub, _ = open_pull(bus, endpoints, got, "native", decoder=decoder)
        pub = bus.publisher(ep, kind="push", bind=False)
        for p in (b"", b"x", b"\x00" * 3000):
            pub.send_packed(b"t", p)
        got.wait(3)
    assert got.items == [0, 1, 3000]
    # Kept past the delivery call and the frames' release: still intact.
    assert seen == [b"", b"x", b"\x00" * 3000]
    assert all(type(p) is bytes for p in seen)


def test_keyboard_interrupt_from_the_decoder_in_caller_mode(endpoints):
    # As from a target: poll() raises it, the message counts as a decode
    # error, and the rest of the batch comes with the next poll().
    def decoder(payload):
        if payload == b"stop":
            raise KeyboardInterrupt
        return payload.decode()
    got = Collector()
    with upcall.Bus() as bus:
        ep, sub, _ = open_pull(bus, endpoints, got, "caller", decoder=decoder)
        pub = bus.publisher(ep, kind="push", bind=False)
        for p in (b"a", b"stop", b"b"):
            pub.send_packed(b"t", p)
        with pytest.raises(KeyboardInterrupt):
            for _ in range(int(DEADLINE / 0.01)):
                sub.poll(timeout=0.01)
        got.wait(2, pump=lambda: sub.poll(timeout=0.01))
        st = sub.stats
    assert got.items == ["a", "b"]
    assert st["decode_errors"] == 1 and st["delivered"] == 2
    assert_adds_up(st)


def test_an_upcall_decoder_is_used_as_it_is(endpoints):
    import datetime as dt
    ts = upcall.Timestamp(1700000000, 0)
    expect = dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.timezone.utc)
    for decoder in (upcall.Decoder(timestamp="datetime"),
                    upcall.Decoder(timestamp="datetime").decode):
        got = Collector()
        with upcall.Bus() as bus:
            ep, sub, _ = open_pull(bus, endpoints, got, "native", decoder=decoder)
            pub = bus.publisher(ep, kind="push", bind=False)
            pub.send(b"t", {"at": ts})
            got.wait(1)
        assert got.items == [{"at": expect}]


# ---- raw=True -----------------------------------------------------------------

RAW = [b"", b"\xc1 not msgpack", upcall.packb({"a": 1}), bytes(range(256)) * 40]


@pytest.mark.parametrize("mode", ALL_MODES)
def test_raw_gives_the_exact_bytes(endpoints, mode):
    got = Collector()
    with upcall.Bus() as bus:
        ep, sub, pump = open_pull(bus, endpoints, got, mode, raw=True, with_topic=True)
        pub = bus.publisher(ep, kind="push", bind=False)
        for p in RAW:
            pub.send_packed(b"raw", p)
        got.wait(len(RAW), pump=pump)
        st = settle(sub, mode, len(RAW))
    assert got.items == [(b"raw", p) for p in RAW]
    assert all(type(p) is bytes for _, p in got.items)
    assert st["decode_errors"] == 0 and st["delivered"] == len(RAW)
    assert_adds_up(st)


@pytest.mark.parametrize("target", ["batch-handler", "native"])
def test_raw_with_handlers(endpoints, target):
    if target == "native":
        got = Collector()
        tgt = FieldFilter("px", ge=0, target=got)
        payloads = [upcall.packb({"px": 1}), upcall.packb({"px": -1}), upcall.packb({"px": 2})]
        want = [payloads[0], payloads[2]]
    else:
        tgt = OnBatch()
        got = tgt.got
        payloads = want = RAW
    with upcall.Bus() as bus:
        ep, sub, _ = open_pull(bus, endpoints, tgt, "native", raw=True)
        pub = bus.publisher(ep, kind="push", bind=False)
        for p in payloads:
            pub.send_packed(b"", p)
        got.wait(len(want))
        assert_adds_up(settle(sub, "native", len(payloads)))
    assert got.items == want


@needs_msgspec
def test_raw_pyzmq_interop(endpoints):
    zmq = pytest.importorskip("zmq")
    got = Collector()
    payload = msgspec.msgpack.encode({"k": [1, 2, 3]})
    with upcall.Bus() as bus:
        ep, sub, _ = open_pull(bus, endpoints, got, "native", transport="tcp", raw=True)
        ctx = zmq.Context()
        try:
            push = ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 2000)
            push.connect(ep)
            push.send_multipart([b"t", payload])
            got.wait(1)
            push.close()
        finally:
            ctx.term()
    assert got.items == [payload]


# ---- asyncio --------------------------------------------------------------------

def run_async(coro):
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


@needs_msgspec
def test_subscribe_async_typed_and_raw(endpoints):
    async def main():
        with upcall.Bus() as bus:
            eps = endpoints("inproc"), endpoints("inproc")
            errors = Errors()
            typed = bus.subscribe_async(eps[0], kind="pull", bind=True, on_error=errors,
                                        decoder=msgspec.msgpack.Decoder(Trade).decode)
            raw = bus.subscribe_async(eps[1], kind="pull", bind=True, raw=True, with_topic=True)
            p0 = bus.publisher(eps[0], kind="push", bind=False)
            p1 = bus.publisher(eps[1], kind="push", bind=False)
            p0.send_packed(b"t", b"\x93\x01")            # not a Trade: a decode error
            p0.send_packed(b"t", msgspec.msgpack.encode(Trade("A", 2.5, 3)))
            p1.send_packed(b"r", b"\xc1")
            assert await asyncio.wait_for(typed.__anext__(), DEADLINE) == Trade("A", 2.5, 3)
            assert await asyncio.wait_for(raw.__anext__(), DEADLINE) == (b"r", b"\xc1")
            st = typed.stats
            assert st["decode_errors"] == 1 and st["delivered"] == 1
            [(exc, msg)] = errors.items
            assert isinstance(exc, upcall.DecodeError) and msg == b"\x93\x01"
            await typed.aclose()
            await raw.aclose()
    run_async(main())


# ---- arguments ------------------------------------------------------------------

async def _coroutine_decoder(payload):
    return payload


def _cython_coroutine_decoder(payload):
    return payload


# What Cython puts on its `async def` functions (inspect does not know them):
# asyncio's marker, where this Python still has it.
_CYTHON_MARKER = getattr(asyncio.coroutines, "_is_coroutine", None)
if _CYTHON_MARKER is not None:
    _cython_coroutine_decoder._is_coroutine = _CYTHON_MARKER


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(decoder=1), TypeError, r"decoder must be a callable.*not int"),
    (dict(decoder=b"msgpack"), TypeError, r"decoder must be a callable.*not bytes"),
    (dict(decoder=_coroutine_decoder), TypeError, r"decoder is an async callable"),
    pytest.param(dict(decoder=_cython_coroutine_decoder), TypeError, r"decoder is an async callable",
                 marks=pytest.mark.skipif(_CYTHON_MARKER is None, reason="no asyncio marker"),
                 id="cython-async-def"),
    (dict(raw=1), TypeError, r"raw must be True or False, not int"),
    (dict(raw="yes"), TypeError, r"raw must be True or False, not str"),
    (dict(raw=None), TypeError, r"raw must be True or False, not NoneType"),
    (dict(raw=True, decoder=json.loads), ValueError, r"decoder= and raw=True exclude"),
])
def test_argument_errors(endpoints, kwargs, error, match):
    ep = endpoints("inproc")
    with upcall.Bus() as bus:
        with pytest.raises(error, match=match):
            bus.subscribe(ep, print, kind="pull", bind=True, **kwargs)

        async def main():
            with pytest.raises(error, match=match):
                bus.subscribe_async(ep, kind="pull", bind=True, **kwargs)
        run_async(main())
        # Refused before any socket was opened: the endpoint is still free.
        with bus.subscribe(ep, print, kind="pull", bind=True):
            pass


def test_raw_false_and_decoder_none_are_the_defaults(endpoints):
    got = Collector()
    with upcall.Bus() as bus:
        ep, sub, _ = open_pull(bus, endpoints, got, "native", raw=False, decoder=None)
        bus.publisher(ep, kind="push", bind=False).send(b"t", {"a": [1]})
        got.wait(1)
    assert got.items == [{"a": [1]}]


# ---- out-of-band frames -----------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(raw=True), dict(decoder=upcall.unpackb)])
def test_out_of_band_frames_need_the_built_in_decoder(endpoints, kw):
    # A large value travels as a frame after the payload, referenced from
    # inside it (ext 126): only the built-in decoder resolves it.  With
    # decoder=/raw=True such a message is a decode error; a default
    # publisher (no out-of-band frames) sends it inside the payload.
    big = {"blob": b"x" * (64 * 1024)}
    errors = Errors()
    got = Collector()
    with upcall.Bus() as bus:
        ep, sub, _ = open_pull(bus, endpoints, got, "native", on_error=errors, **kw)
        oob = bus.publisher(ep, kind="push", bind=False,
                            oob_threshold=upcall.DEFAULT_OOB_THRESHOLD)
        oob.send(b"big", big)
        inline = bus.publisher(ep, kind="push", bind=False)
        inline.send(b"big", big)
        got.wait(1)
        st = settle(sub, "native", 2)
    assert st["decode_errors"] == 1 and st["delivered"] == 1
    [(exc, payload)] = errors.items
    assert isinstance(exc, upcall.DecodeError)
    assert exc.reason == "oob_decoder" and exc.topic == b"big"
    assert "oob_threshold=None" in str(exc)
    [msg] = got.items
    assert (upcall.unpackb(msg) if kw.get("raw") else msg) == big
