"""Argument checks at the edges: every integer argument states its whole
range, timeouts accept None and math.inf for "no limit", strings that reach
C as NUL-terminated strings refuse NUL bytes while topics carry any byte,
tcp ports are 0..65535, ``closed`` is a bool, and the types that only the
bus makes cannot be made from Python.
"""
import math

import pytest

import upcall
from upcall._bus import _Run, _synthetic_subscribe
from upcall._codec import MAX_DEPTH_LIMIT
from helpers import DEADLINE, Collector, warm_up
from helpers import thread_count, wait_for

zmq = pytest.importorskip("zmq")

INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
INT_MAX = 2**31 - 1


# ---- integer arguments ------------------------------------------------------

def _bus_call(fn):
    def call(value):
        with upcall.Bus() as bus:
            fn(bus, value)
    return call


def _poll(bus, value):
    sub = bus.subscribe("inproc://poll-max-messages", print, delivery="caller")
    sub.poll(timeout=0, max_messages=value)


# name -> (call(value), argument name, lowest, highest (None: no upper bound))
INT_ARGS = {
    "Bus(io_threads)": (lambda v: upcall.Bus(io_threads=v).close(), "io_threads", 0, 64),
    "subscribe(batch)": (_bus_call(lambda b, v: b.subscribe("inproc://a", print, batch=v)),
                         "batch", 1, 1_000_000),
    "subscribe(rcvhwm)": (_bus_call(lambda b, v: b.subscribe("inproc://a", print, rcvhwm=v)),
                          "rcvhwm", 0, INT_MAX),
    "subscribe(max_message_size)": (
        _bus_call(lambda b, v: b.subscribe("inproc://a", print, max_message_size=v)),
        "max_message_size", 1, INT64_MAX),
    "publisher(sndhwm)": (_bus_call(lambda b, v: b.publisher("inproc://a", sndhwm=v, bind=True)),
                          "sndhwm", 0, INT_MAX),
    "poll(max_messages)": (_bus_call(_poll), "max_messages", 1, INT64_MAX),
    "_synthetic_subscribe(count)": (
        _bus_call(lambda b, v: _synthetic_subscribe(b, print, count=v, delivery="caller")),
        "count", 1, UINT64_MAX),
    "_synthetic_subscribe(backlog_max)": (
        _bus_call(lambda b, v: _synthetic_subscribe(b, print, rate=1.0, backlog_max=v,
                                                    delivery="caller")),
        "backlog_max", 1, UINT64_MAX),
    "Encoder(max_depth)": (lambda v: upcall.Encoder(max_depth=v), "max_depth", 0,
                           MAX_DEPTH_LIMIT),
    "Decoder(max_depth)": (lambda v: upcall.Decoder(max_depth=v), "max_depth", 0,
                           MAX_DEPTH_LIMIT),
    "Decoder(max_len)": (lambda v: upcall.Decoder(max_len=v), "max_len", 0, None),
    "unpackb(max_depth)": (lambda v: upcall.unpackb(b"\xc0", max_depth=v), "max_depth", 0,
                           MAX_DEPTH_LIMIT),
    "unpackb(max_len)": (lambda v: upcall.unpackb(b"\xc0", max_len=v), "max_len", 0, None),
    "ExtType(code)": (lambda v: upcall.ExtType(v, b""), "code", -128, 127),
    "Timestamp(nanoseconds)": (lambda v: upcall.Timestamp(0, v), "nanoseconds", 0, 999_999_999),
}


@pytest.mark.parametrize("which", sorted(INT_ARGS))
def test_integer_out_of_range_states_the_range(which):
    call, name, low, high = INT_ARGS[which]
    bad = [low - 1, low - 2**70] + ([] if high is None else [high + 1, 2**40 + high, 2**70])
    for value in bad:
        with pytest.raises(ValueError) as info:
            call(value)
        text = str(info.value)
        assert name in text and str(value) in text, text
        assert str(low) in text and (high is None or str(high) in text), text


@pytest.mark.parametrize("which", sorted(INT_ARGS))
def test_integer_arguments_refuse_other_types(which):
    call, name, low, high = INT_ARGS[which]
    for value in (1.5, float(low), True, "1"):
        with pytest.raises(TypeError) as info:
            call(value)
        assert name in str(info.value), str(info.value)


@pytest.mark.parametrize("which", ["Bus(io_threads)", "subscribe(rcvhwm)", "publisher(sndhwm)",
                                   "subscribe(max_message_size)", "poll(max_messages)",
                                   "Decoder(max_len)", "ExtType(code)", "Timestamp(nanoseconds)"])
def test_integer_bounds_are_accepted(which):
    # The stated bounds themselves are valid (where using them costs nothing).
    call, name, low, high = INT_ARGS[which]
    for value in (low, high if high is not None else 2**70):
        if which == "ExtType(code)" and value == -1:
            continue
        call(value)


def test_ext_code_of_the_timestamp_is_refused():
    with pytest.raises(ValueError, match="Timestamp"):
        upcall.ExtType(-1, b"")


def test_timestamp_seconds_beyond_int64_overflow():
    # Like packb(2**64): a value msgpack cannot represent is an OverflowError.
    for seconds in (2**63, -(2**63) - 1):
        with pytest.raises(OverflowError, match="int64"):
            upcall.Timestamp(seconds, 0)


# ---- timeouts -----------------------------------------------------------------

def _synthetic(bus, **kw):
    return _synthetic_subscribe(bus, print, count=3, **kw)


# name -> call(bus, timeout)
TIMEOUTS = {
    "poll": lambda bus, t: _synthetic(bus, delivery="caller").poll(timeout=t),
    "wait": lambda bus, t: _synthetic(bus).wait(timeout=t),
    "Subscription.close": lambda bus, t: _synthetic(bus).close(timeout=t),
    "Bus.close": lambda bus, t: bus.close(timeout=t),
    "send": lambda bus, t: bus.publisher("inproc://to", kind="pub", bind=True).send(b"t", 1, timeout=t),
    "send_packed": lambda bus, t: bus.publisher("inproc://to", kind="pub", bind=True).send_packed(
        b"t", b"\xc0", timeout=t),
    "linger": lambda bus, t: bus.publisher("inproc://to", linger=t, bind=True).close(),
}
TIMEOUT_NAMES = {"linger": "linger"}


@pytest.mark.parametrize("which", sorted(TIMEOUTS))
@pytest.mark.parametrize("value", [-1, -0.0001, math.nan, -math.inf,
                                   INT_MAX / 1000 + 0.001, 1e300, 10**400])
def test_timeout_out_of_range_states_the_range(which, value):
    with upcall.Bus() as bus:
        with pytest.raises(ValueError) as info:
            TIMEOUTS[which](bus, value)
    text = str(info.value)
    assert TIMEOUT_NAMES.get(which, "timeout") in text, text
    assert "2147483.647" in text and "math.inf" in text, text


@pytest.mark.parametrize("which", sorted(TIMEOUTS))
@pytest.mark.parametrize("value", ["1", b"1", True, 1j, [1]])
def test_timeout_of_another_type_is_a_type_error(which, value):
    with upcall.Bus() as bus:
        with pytest.raises(TypeError) as info:
            TIMEOUTS[which](bus, value)
    assert TIMEOUT_NAMES.get(which, "timeout") in str(info.value)


@pytest.mark.parametrize("which", sorted(TIMEOUTS))
@pytest.mark.parametrize("value", [math.inf, None, 0, 2, INT_MAX / 1000])
def test_infinite_and_longest_timeouts_are_accepted(which, value):
    with upcall.Bus() as bus:
        try:
            TIMEOUTS[which](bus, value)
        except TimeoutError:
            # Accepted, and expired: a delivery thread that has not ended
            # yet on a busy machine makes close(timeout=0) time out.
            assert value == 0


def test_infinite_timeouts_mean_no_limit(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        sub = bus.subscribe(ep, col, kind="pull", bind=True, delivery="caller")
        pub = bus.publisher(ep, kind="push", bind=False, linger=math.inf)
        pub.send(b"t", 1, timeout=math.inf)
        assert sub.poll(timeout=math.inf, max_messages=1) == 1
        ended = _synthetic_subscribe(bus, print, count=5)
        assert ended.wait(timeout=math.inf) is True
        sub.close(timeout=math.inf)
        pub.close()
    assert col.items == [1]


# ---- strings that cross into C ---------------------------------------------------

@pytest.mark.parametrize("endpoint", ["inproc://a\x00b", "ipc:///tmp/uc\x00x", "tcp://127.0.0.1:5\x006",
                                      "tcp://127.0.0.1\x00:5556", "inproc://\x00"])
def test_nul_in_endpoint_is_refused(endpoint):
    with upcall.Bus() as bus:
        for open_it in (lambda: bus.subscribe(endpoint, print, bind=True),
                        lambda: bus.subscribe(endpoint, print),
                        lambda: bus.publisher(endpoint, bind=True),
                        lambda: bus.publisher(endpoint, bind=False)):
            with pytest.raises(ValueError, match="endpoint.*NUL"):
                open_it()


def test_nul_endpoint_binds_nothing(endpoints):
    # Before the check, "inproc://x\0y" silently bound "inproc://x".
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        with pytest.raises(ValueError):
            bus.subscribe(ep + "\x00tail", print, kind="pull", bind=True)
        bus.subscribe(ep, print, kind="pull", bind=True)     # still free


def test_unencodable_endpoint_names_the_argument():
    with upcall.Bus() as bus:
        with pytest.raises(ValueError, match="endpoint"):
            bus.subscribe("inproc://\ud800", print)


def _with_nul(key, as_bytes):
    key = key[:7] + "\x00" + key[8:]
    return key.encode("latin-1") if as_bytes else key


@pytest.mark.parametrize("as_bytes", [False, True])
@pytest.mark.parametrize("argument", ["curve_server[0]", "curve_server[1]", "curve_serverkey",
                                      "curve_client[0]", "curve_client[1]"])
def test_nul_in_curve_key_is_refused(endpoints, argument, as_bytes):
    if not zmq.has("curve"):
        pytest.skip("libzmq without CURVE support")
    server, client = upcall.curve_keypair(), upcall.curve_keypair()
    if argument.startswith("curve_server["):
        pair = list(server)
        pair[int(argument[-2])] = _with_nul(pair[int(argument[-2])], as_bytes)
        kw = {"curve_server": tuple(pair)}
    elif argument == "curve_serverkey":
        kw = {"curve_serverkey": _with_nul(server[0], as_bytes)}
    else:
        pair = list(client)
        pair[int(argument[-2])] = _with_nul(pair[int(argument[-2])], as_bytes)
        kw = {"curve_serverkey": server[0], "curve_client": tuple(pair)}
    with upcall.Bus() as bus:
        for open_it in (lambda: bus.subscribe(endpoints("tcp"), print, **kw),
                        lambda: bus.publisher(endpoints("tcp"), **kw)):
            with pytest.raises(ValueError) as info:
                open_it()
            assert argument in str(info.value), str(info.value)


NUL_TOPICS = [b"a\x00b", b"\x00", "x\x00y"]          # subscribed prefixes (str as UTF-8)
SENT = [b"a\x00b", b"a\x00bc\x00d", b"a\x00c", b"a", b"", b"\x00", b"\x00\x00z", b"x\x00y\x00",
        b"x", b"x\x00"]
MATCHING = [t for t in SENT if t.startswith((b"a\x00b", b"\x00", b"x\x00y"))]


@pytest.mark.parametrize("mode", ["native", "caller"])
def test_topics_with_nul_bytes_are_filtered_and_delivered_intact(endpoints, mode):
    col = Collector()
    kw = {"delivery": "caller"} if mode == "caller" else {}
    pump = None
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        pub = bus.publisher(ep, kind="pub", bind=True)
        sub = bus.subscribe(ep, col, topics=NUL_TOPICS + [b"probe"], with_topic=True, **kw)
        if mode == "caller":
            def pump():
                sub.poll(timeout=0.01)
        warm_up(pub, col, pump=pump)
        for i, topic in enumerate(SENT):
            pub.send(topic, i)
        pub.send(b"probe", "end")         # after everything above, on the same pipe
        col.wait(len(MATCHING) + 1, pump=pump)
    assert col.items == [(t, SENT.index(t)) for t in MATCHING] + [(b"probe", "end")]


def test_topics_with_nul_bytes_reach_pyzmq_whole(endpoints):
    # The publish side on its own: a plain zmq SUB subscribed to a prefix
    # holding NUL receives the topic frames byte for byte.
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"a\x00")
        sock.setsockopt(zmq.SUBSCRIBE, b"probe")
        sock.rcvtimeo = int(DEADLINE * 1000)
        with upcall.Bus() as bus:
            pub = bus.publisher(endpoints("ipc"), kind="pub", bind=True)
            sock.connect(pub.last_endpoint)
            sock.poll(10)
            while True:                        # slow joiner: probe until connected
                pub.send(b"probe", 0)
                if sock.poll(20):
                    break
            while sock.poll(50):
                sock.recv_multipart()
            for topic in (b"a\x00b\x00", b"a", b"a\x00", b"b\x00"):
                pub.send(topic, 1)
            pub.send(b"probe", 2)
            got = []
            while True:
                frames = sock.recv_multipart()
                got.append(frames)
                if frames[0] == b"probe":
                    break
        assert got == [[b"a\x00b\x00", b"\x01"], [b"a\x00", b"\x01"], [b"probe", b"\x02"]]
        sock.close(0)
    finally:
        ctx.term()


# ---- tcp ports -------------------------------------------------------------------

@pytest.mark.parametrize("port", ["99999", "65536", "-1", "+5", "5x", " 5556", "5556 ", "",
                                  "\u0665\u0665"])
def test_invalid_tcp_port_is_refused(port):
    with upcall.Bus() as bus:
        for endpoint in (f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port};127.0.0.1:5556",
                         f"tcp://[::1]:{port}"):
            for open_it in (lambda: bus.subscribe(endpoint, print, bind=True),
                            lambda: bus.subscribe(endpoint, print),
                            lambda: bus.publisher(endpoint, bind=True),
                            lambda: bus.publisher(endpoint, bind=False)):
                with pytest.raises(ValueError) as info:
                    open_it()
                text = str(info.value)
                assert "port" in text and "65535" in text and repr(port) in text, text


def test_valid_tcp_ports_are_accepted():
    with upcall.Bus() as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
        port = int(pub.last_endpoint.rsplit(":", 1)[1])
        assert 0 < port <= 65535
        bus.publisher("tcp://127.0.0.1:0", bind=True)
        bus.subscribe(f"tcp://127.0.0.1:{port}", print)
        bus.subscribe(f"tcp://127.0.0.1:0;127.0.0.1:{port}", print)
        bus.subscribe("tcp://127.0.0.1:65535", print)


# ---- closed is a bool --------------------------------------------------------------

@pytest.mark.parametrize("mode", ["native", "caller"])
def test_closed_is_a_bool(endpoints, mode):
    kw = {"delivery": "caller"} if mode == "caller" else {}
    bus = upcall.Bus()
    ep = endpoints("inproc")
    sub = bus.subscribe(ep, print, kind="pull", **kw)
    pub = bus.publisher(ep, kind="push", bind=False)
    ended = _synthetic_subscribe(bus, print, count=1, **kw)
    if mode == "caller":
        ended.poll(timeout=DEADLINE)
    else:
        assert ended.wait(timeout=DEADLINE)
    assert [obj.closed for obj in (bus, sub, pub)] == [False, False, False]
    assert ended.closed is True                    # ended by itself: not closed by anyone
    sub.close()
    pub.close()
    assert (sub.closed, pub.closed) == (True, True)
    bus.close()
    assert bus.closed is True
    assert all(type(obj.closed) is bool for obj in (bus, sub, pub, ended))


# ---- types only the bus makes ---------------------------------------------------------

@pytest.mark.parametrize("cls, how", [(upcall.Subscription, "Bus.subscribe()"),
                                      (upcall.Publisher, "Bus.publisher()"),
                                      (_Run, "subscribe()")])
def test_internal_types_cannot_be_made_from_python(cls, how):
    for make in (lambda: cls(), lambda: cls.__new__(cls), lambda: cls("x", 1)):
        with pytest.raises(TypeError) as info:
            make()
        assert how in str(info.value), str(info.value)


def test_the_run_a_factory_gets_cannot_be_copied_by_its_type(endpoints):
    runs = []

    def factory(run):
        runs.append(run)
        with pytest.raises(TypeError):
            type(run)()
        upcall.python_threads(run)

    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints("inproc"), print, thread_factory=factory)
        sub.close(timeout=DEADLINE)
    assert len(runs) == 1 and repr(runs[0]).startswith("<upcall run")


# --- argument validation -------------------------------------------------------------

def _raises_naming(exc_types, word, fn, *args, **kwargs):
    with pytest.raises(exc_types) as info:
        fn(*args, **kwargs)
    assert word in str(info.value), "%r does not name %r" % (info.value, word)


@pytest.mark.parametrize("kwargs,exc,word", [
    ({"kind": "nope"}, ValueError, "kind"),
    ({"kind": "pub"}, ValueError, "kind"),
    ({"batch": 0}, ValueError, "batch"),
    ({"batch": -5}, ValueError, "batch"),
    ({"batch": "10"}, TypeError, "batch"),
    ({"delivery": "x"}, ValueError, "delivery"),
    ({"topics": [1]}, TypeError, "topics"),
    ({"thread_factory": 42}, TypeError, "thread_factory"),
    ({"on_error": "print"}, TypeError, "on_error"),
    ({"rcvhwm": "big"}, TypeError, "rcvhwm"),
])
def test_subscribe_rejects_bad_arguments(endpoints, kwargs, exc, word):
    with upcall.Bus() as bus:
        base_threads = thread_count()
        _raises_naming(exc, word, bus.subscribe, endpoints("inproc"), print, **kwargs)
        wait_for(lambda: thread_count() <= base_threads, what="no thread left behind")


def test_private_gil_mode_rejects_bad_values():
    with upcall.Bus() as bus:
        _raises_naming(ValueError, "gil", _synthetic_subscribe, bus, print, gil="x")


def test_subscribe_rejects_non_callable_target(endpoints):
    with upcall.Bus() as bus:
        _raises_naming(TypeError, "target", bus.subscribe, endpoints("inproc"), 42)


@pytest.mark.parametrize("endpoint", ["foo://x", "tcp://", "not an endpoint", ""])
def test_subscribe_rejects_bad_endpoint(endpoint):
    with upcall.Bus() as bus:
        with pytest.raises((ValueError, OSError)) as info:
            bus.subscribe(endpoint, print)
        text = str(info.value)
        assert text and (endpoint in text or "endpoint" in text.lower()), text
        with pytest.raises((ValueError, OSError)):
            bus.publisher(endpoint, bind=True)


def test_subscribe_rejects_non_str_endpoint():
    with upcall.Bus() as bus:
        _raises_naming(TypeError, "endpoint", bus.subscribe, 5, print)


def test_bind_conflict_raises_oserror(endpoints):
    ep = endpoints("tcp")
    with upcall.Bus() as bus:
        pub = bus.publisher(ep, kind="push", bind=True)   # referenced: a dropped publisher is closed
        with pytest.raises(OSError):
            bus.publisher(ep, kind="push", bind=True)
        with pytest.raises(OSError):
            bus.subscribe(ep, print, kind="pull", bind=True)
        pub.close()


@pytest.mark.parametrize("kwargs,exc,word", [
    ({"kind": "sub"}, ValueError, "kind"),
    ({"kind": "nope"}, ValueError, "kind"),
    ({"sndhwm": "x"}, TypeError, "sndhwm"),
    ({"linger": "x"}, TypeError, "linger"),
])
def test_publisher_rejects_bad_arguments(endpoints, kwargs, exc, word):
    with upcall.Bus() as bus:
        _raises_naming(exc, word, bus.publisher, endpoints("inproc"), **kwargs)


def test_send_rejects_bad_topic(endpoints):
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), bind=True)
        _raises_naming(TypeError, "topic", pub.send, 1, {})
        _raises_naming(TypeError, "topic", pub.send_packed, None, b"\x01")
        with pytest.raises(TypeError):
            pub.send_packed(b"t", 12)


def test_bus_rejects_bad_arguments():
    _raises_naming(TypeError, "thread_factory", upcall.Bus, thread_factory=1)
    _raises_naming(ValueError, "io_threads", upcall.Bus, io_threads=-1)
