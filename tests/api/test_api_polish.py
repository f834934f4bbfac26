"""The small things a user meets first: signatures, names, reprs, errors.

inspect.signature() works on the classes; public types are ``upcall.X``
(so are their reprs); a Publisher's repr shows the endpoint it bound; Bus
reprs read correctly in the singular; an endpoint libzmq refuses says why in
words, not just libzmq's strerror; upcall's exceptions share the base
upcall.UpcallError and keep their builtin bases; a DecodeError pickles with
every attribute; the docstrings of timeouts warn pyzmq users that they are
seconds.
"""
import errno
import inspect
import pickle

import pytest

import upcall
from helpers import Collector, free_tcp_port, wait_for


def params(obj):
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(obj).parameters.values()]


E = inspect.Parameter.empty


@pytest.mark.parametrize("cls, expected", [
    (upcall.Bus, [("io_threads", "POSITIONAL_OR_KEYWORD", 1),
                  ("thread_factory", "POSITIONAL_OR_KEYWORD", None),
                  ("max_sockets", "POSITIONAL_OR_KEYWORD", None)]),
    (upcall.Decoder, [("timestamp", "KEYWORD_ONLY", "timestamp"),
                      ("max_depth", "KEYWORD_ONLY", upcall._codec.DEFAULT_MAX_DEPTH),
                      ("max_len", "KEYWORD_ONLY", None)]),
    (upcall.Encoder, [("max_depth", "KEYWORD_ONLY", upcall._codec.DEFAULT_MAX_DEPTH),
                      ("default", "KEYWORD_ONLY", None)]),
    (upcall.Timestamp, [("seconds", "POSITIONAL_OR_KEYWORD", E),
                        ("nanoseconds", "POSITIONAL_OR_KEYWORD", 0)]),
    (upcall.ExtType, [("code", "POSITIONAL_OR_KEYWORD", E), ("data", "POSITIONAL_OR_KEYWORD", E)]),
    (upcall.Counter, [("batches", "POSITIONAL_OR_KEYWORD", False)]),
])
def test_class_signatures(cls, expected):
    assert params(cls) == expected
    # and the signature is the one the class takes
    kwargs = {name: default for name, kind, default in expected if default is not E}
    if cls is upcall.Bus:
        cls(**kwargs).close()
    elif all(default is not E for _, _, default in expected):
        cls(**kwargs)


def test_method_signatures():
    assert [p[0] for p in params(upcall.Bus.subscribe)][:3] == ["self", "endpoint", "target"]
    # A one-tuple default as it is: Cython's embedded signatures write (b"",) as (b'').
    assert ("topics", "KEYWORD_ONLY", (b"",)) in params(upcall.Bus.subscribe)
    assert ("topics", "KEYWORD_ONLY", (b"",)) in params(upcall.Bus.subscribe_async)
    assert ("timeout", "KEYWORD_ONLY", None) in params(upcall.Publisher.send)
    assert params(upcall.Subscription.poll)[1:] == [
        ("timeout", "POSITIONAL_OR_KEYWORD", None), ("max_messages", "POSITIONAL_OR_KEYWORD", None)]


PUBLIC_TYPES = ["Bus", "Subscription", "Publisher", "StopDelivery", "Encoder", "Decoder",
                "DecodeError", "Timestamp", "ExtType", "Handler", "Counter", "UpcallError",
                "ZMQError"]


@pytest.mark.parametrize("name", PUBLIC_TYPES)
def test_public_types_are_upcall_dot_name(name):
    cls = getattr(upcall, name)
    assert (cls.__module__, cls.__qualname__, cls.__name__) == ("upcall", name, name)
    assert repr(cls) == f"<class 'upcall.{name}'>"


def test_reprs_name_the_public_types():
    assert repr(upcall.Decoder()).startswith("<upcall.Decoder object at 0x")
    assert repr(upcall.Encoder()).startswith("<upcall.Encoder object at 0x")
    assert repr(upcall.Counter()) == "<upcall.Counter count=0>"
    # Error messages Cython writes name the public type too.
    with pytest.raises(TypeError, match=r"expected upcall\.Bus, got object"):
        upcall._bus._subscribe_per_upcall(object(), "inproc://x", print)


def test_pickles_still_round_trip():
    ts = upcall.Timestamp(1_700_000_000, 5)
    assert pickle.loads(pickle.dumps(ts)) == ts
    ext = upcall.ExtType(5, b"abc")
    assert pickle.loads(pickle.dumps(ext)) == ext


def test_publisher_repr_shows_the_bound_endpoint():
    with upcall.Bus() as bus:
        pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
        port = int(pub.last_endpoint.rsplit(":", 1)[1])
        assert port > 0
        assert repr(pub) == f"<upcall.Publisher tcp://127.0.0.1:{port}>"
        pub.close()
        assert repr(pub).endswith(" closed>")


def test_subscription_repr_shows_the_bound_endpoints():
    with upcall.Bus() as bus:
        sub = bus.subscribe(["tcp://127.0.0.1:*", "inproc://repr-sub"], print, kind="pull",
                            bind=True)
        bound = sub.last_endpoints[0]
        assert not bound.endswith(":*")
        assert repr(sub).startswith(f"<upcall.Subscription {bound},inproc://repr-sub topics=[] ")
        sub.close()


def test_bus_repr_reads_in_the_singular_and_plural():
    with upcall.Bus() as bus:
        assert repr(bus) == "<upcall.Bus 0 subscriptions, 0 publishers>"
        pub = bus.publisher("inproc://repr", bind=True)
        sub = bus.subscribe("inproc://repr", lambda m: None)
        assert repr(bus) == "<upcall.Bus 1 subscription, 1 publisher>"
        pub2 = bus.publisher("inproc://repr2", bind=True)
        assert repr(bus) == "<upcall.Bus 1 subscription, 2 publishers>"
        sub.close(), pub.close(), pub2.close()


# ---- endpoint errors say what is wrong ------------------------------------------

@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1", "tcp://localhost", "tcp://[::1]",
                                      "tcp://127.0.0.1:5555;127.0.0.1"])
@pytest.mark.parametrize("bind", [True, False])
def test_a_tcp_endpoint_without_a_port(endpoint, bind):
    with upcall.Bus() as bus:
        with pytest.raises(ValueError, match="a tcp endpoint needs a port"):
            bus.publisher(endpoint, bind=bind)
        with pytest.raises(ValueError, match="a tcp endpoint needs a port"):
            bus.subscribe(endpoint, print, bind=bind)


def open_both(bus, endpoint):
    """The error of binding a publisher, then a subscription, to endpoint."""
    errors = []
    for open_ in (lambda: bus.publisher(endpoint, bind=True), lambda: bus.subscribe(endpoint, print, bind=True)):
        with pytest.raises(upcall.ZMQError) as info:
            open_()
        errors.append(info.value)
    return errors


def test_binding_to_an_unknown_host_says_so():
    with upcall.Bus() as bus:
        for exc in open_both(bus, "tcp://no-such-host.invalid:5556"):
            assert exc.errno == errno.ENODEV
            assert "'no-such-host.invalid' is neither a local network interface nor a host " \
                   "name that resolves: an unknown host or interface" in str(exc)


def test_binding_to_an_ipv6_address_without_ipv6_says_so():
    with upcall.Bus() as bus:
        for exc in open_both(bus, "tcp://[::1]:0"):
            assert exc.errno == errno.ENODEV and "socket_options={'ipv6': 1}" in str(exc)


def test_binding_to_another_machines_address_says_so():
    with upcall.Bus() as bus:
        for exc in open_both(bus, "tcp://192.0.2.1:5556"):     # TEST-NET-1: never local
            assert exc.errno == errno.EADDRNOTAVAIL
            assert "'192.0.2.1' is not an address of this machine" in str(exc)


def test_an_ipc_path_in_a_missing_directory_says_so(tmp_path):
    with upcall.Bus() as bus:
        for exc in open_both(bus, f"ipc://{tmp_path}/missing/s.sock"):
            assert exc.errno == errno.ENOENT
            assert "the directory of the ipc path does not exist" in str(exc)


# ---- the exception hierarchy ------------------------------------------------------

def test_upcall_error_is_the_base_of_upcalls_exceptions():
    assert issubclass(upcall.UpcallError, Exception)
    assert issubclass(upcall.DecodeError, upcall.UpcallError)
    assert issubclass(upcall.DecodeError, ValueError)          # the builtin base is kept
    assert issubclass(upcall.ZMQError, upcall.UpcallError)
    assert issubclass(upcall.ZMQError, OSError)
    # The target's request to stop is no error: a target's "except
    # UpcallError" must not swallow it.
    assert not issubclass(upcall.StopDelivery, upcall.UpcallError)


def test_an_address_in_use_is_a_zmq_error_and_an_os_error():
    port = free_tcp_port()
    with upcall.Bus() as bus:
        pub = bus.publisher(f"tcp://127.0.0.1:{port}", bind=True)
        with pytest.raises(upcall.UpcallError) as info:
            bus.publisher(f"tcp://127.0.0.1:{port}", bind=True)
        assert isinstance(info.value, OSError) and info.value.errno == errno.EADDRINUSE
        pub.close()


def test_a_decode_error_pickles_whole():
    errors = []
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe("inproc://pickle", col, kind="pull", bind=True,
                            on_error=lambda e, m: errors.append(e))
        with bus.publisher("inproc://pickle", kind="push", bind=False) as pub:
            pub.send_packed(b"prices.x", b"\x92\x01")        # truncated
            wait_for(lambda: errors, what="the decode error")
        sub.close()
    [exc] = errors
    assert exc.topic == b"prices.x"
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is upcall.DecodeError
    assert (str(copy), copy.offset, copy.reason, copy.topic) == \
        (str(exc), exc.offset, exc.reason, b"prices.x")
    # One from unpackb() has no topic.
    with pytest.raises(upcall.DecodeError) as info:
        upcall.unpackb(b"\xc1")
    assert info.value.topic is None
    assert pickle.loads(pickle.dumps(info.value)).topic is None


# ---- seconds, not pyzmq's milliseconds -------------------------------------------

@pytest.mark.parametrize("method", [upcall.Publisher.send, upcall.Bus.publisher,
                                    upcall.Subscription.poll, upcall.Subscription.close,
                                    upcall.Bus.close])
def test_timeouts_say_they_are_seconds_not_milliseconds(method):
    doc = method.__doc__
    assert "seconds" in doc and "pyzmq" in doc and "milliseconds" in doc, doc
