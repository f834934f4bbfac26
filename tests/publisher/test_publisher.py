"""Publishers end to end: sends from several threads, bytes-like packed
payloads, unsupported objects, send timeouts, bound port 0, io_threads."""
import re

import pytest

import upcall
from helpers import Collector, Sender
from bus_pair import pair

pytestmark = pytest.mark.threads


# --- publishers ---------------------------------------------------------------------

def test_publisher_send_from_several_threads(endpoints):
    col = Collector()
    n_threads, per_thread = 4, 5000
    with pair(endpoints, "tcp", "pull", "native", col) as (pub, sub, _):
        senders = [Sender(pub, [(b"t", [k, i]) for i in range(per_thread)]) for k in range(n_threads)]
        for s in senders:
            s.start()
        col.wait(n_threads * per_thread)
        for s in senders:
            s.finish()
    for k in range(n_threads):
        assert [i for kk, i in col.items if kk == k] == list(range(per_thread))
    assert len(col.items) == n_threads * per_thread


def test_send_packed_accepts_bytes_like(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "pull", "native", col) as (pub, sub, _):
        obj = {"a": [1, 2.5, "x"], "b": b"\x00\x01"}
        data = upcall.packb(obj)
        pub.send_packed(b"t", data)
        pub.send_packed(b"t", bytearray(data))
        pub.send_packed(b"t", memoryview(data))
        pub.send_packed(b"t", memoryview(b"xx" + data)[2:])
        col.wait(4)
    assert col.items == [obj] * 4


def test_send_unsupported_object_raises_and_publisher_survives(endpoints):
    col = Collector()
    with pair(endpoints, "inproc", "pull", "native", col) as (pub, sub, _):
        with pytest.raises(TypeError):
            pub.send(b"t", object())
        pub.send(b"t", "fine")
        col.wait(1)
    assert col.items == ["fine"]


def test_send_timeout_when_nobody_receives(endpoints):
    # Assumption: a send that cannot complete within `timeout` seconds (PUSH
    # with no peer) raises TimeoutError, like close(timeout=...); timeout=0
    # means "never block" and raises BlockingIOError (EAGAIN) or TimeoutError.
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), kind="push", bind=True)
        with pytest.raises(TimeoutError):
            pub.send(b"t", 1, timeout=0.05)
        with pytest.raises((BlockingIOError, TimeoutError)):
            pub.send_packed(b"t", b"\x01", timeout=0)


def test_bound_port_zero_is_resolved(endpoints):
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:0", col, kind="pull", bind=True)
        m = re.fullmatch(r"tcp://127\.0\.0\.1:(\d+)", sub.last_endpoint)
        assert m and int(m.group(1)) != 0, sub.last_endpoint
        assert sub.endpoint == "tcp://127.0.0.1:0"
        pub = bus.publisher(sub.last_endpoint, kind="push", bind=False)
        assert pub.endpoint == pub.last_endpoint == sub.last_endpoint
        pub.send(b"t", "hello")
        col.wait(1)
        assert col.items == ["hello"]

        pub2 = bus.publisher("tcp://127.0.0.1:0", kind="push", bind=True)
        m = re.fullmatch(r"tcp://127\.0\.0\.1:(\d+)", pub2.last_endpoint)
        assert m and int(m.group(1)) != 0, pub2.last_endpoint


def test_io_threads(endpoints):
    col = Collector()
    with upcall.Bus(io_threads=2) as bus:
        ep = endpoints("tcp")
        pub = bus.publisher(ep, kind="push", bind=True)
        bus.subscribe(ep, col, kind="pull")
        for i in range(100):
            pub.send(b"t", i)
        col.wait(100)
    assert col.items == list(range(100))


@pytest.mark.parametrize("timeout, said", [(2, "2 s"), (0.25, "0.25 s")])
def test_a_send_timeout_is_told_in_seconds(endpoints, timeout, said):
    # The API takes seconds; the message says the timeout as it was given,
    # not in the core's milliseconds.
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), kind="push", bind=True)   # no peer, ever
        with pytest.raises(TimeoutError) as info:
            pub.send(b"t", 1, timeout=timeout)
    text = str(info.value)
    assert f"within {said} " in text and " ms" not in text, text


def test_subscribe_documents_where_target_errors_go():
    # Without on_error, a target's exception is logged on the "upcall"
    # logger (tests/bus/test_logging.py), not sent to sys.unraisablehook.
    doc = upcall.Bus.subscribe.__doc__
    assert "unraisablehook" not in doc
    assert '"upcall" logger' in doc
