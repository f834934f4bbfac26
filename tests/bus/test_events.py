"""Connection events (csrc/monitor.c, upcall/_events.pxi): what libzmq's
socket monitor reports of every subscription and publisher, counted in
``stats``, visible as ``peers``/``connected``, handed to ``on_event`` and
logged.

Real sockets over tcp 127.0.0.1 and ipc; pyzmq peers where the other end
must not be upcall.  Nothing waits by sleeping: each check waits for the
condition it needs (helpers.wait_for), with the test's deadline.
"""
import asyncio
import logging
import threading

import pytest

import upcall
from helpers import DEADLINE, MODES, mode_kwargs, unreachable_tcp_endpoint, wait_for

zmq = pytest.importorskip("zmq")

pytestmark = pytest.mark.threads

TRANSPORTS = ["tcp", "ipc"]


class Events:
    """on_event: records ConnectionEvents, from any thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.items = []

    def __call__(self, ev):
        with self.lock:
            self.items.append(ev)

    def kinds(self):
        with self.lock:
            return [(e.kind, e.cause) for e in self.items]

    def has(self, kind, cause=None):
        return (kind, cause) in self.kinds()


def pumped(sub, mode):
    """A predicate's helper: a caller-mode subscription reads its monitor in
    poll() only, so poll briefly before looking."""
    if mode == "caller":
        sub.poll(timeout=0.01)


def test_event_stats_are_documented_keys():
    assert upcall.EVENT_STATS == (
        "connected", "connect_retried", "accepted", "disconnected", "handshakes",
        "handshake_failed_protocol", "handshake_failed_auth", "handshake_failed_no_detail")


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mode", MODES)
def test_connect_accept_disconnect(endpoints, transport, mode):
    sub_events, pub_events = Events(), Events()
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints(transport), on_event=pub_events, bind=True)
        assert pub.peers == 0
        sub = bus.subscribe(pub.last_endpoint, lambda m: None, on_event=sub_events,
                            **mode_kwargs(mode))

        def both_up():
            pumped(sub, mode)
            return sub.peers == 1 and pub.peers == 1 and sub_events.has("handshake_succeeded") \
                and pub_events.has("handshake_succeeded")
        wait_for(both_up, what=lambda: (sub_events.kinds(), pub_events.kinds()))
        assert sub.connected is True
        st = sub.stats
        assert (st["connected"], st["accepted"], st["handshakes"], st["disconnected"]) == (1, 0, 1, 0)
        assert st["received"] == 0                       # events are no messages
        ps = pub.stats
        assert (ps["connected"], ps["accepted"], ps["handshakes"], ps["disconnected"]) == (0, 1, 1, 0)
        assert sub_events.kinds()[:2] == [("connected", None), ("handshake_succeeded", None)]
        assert pub_events.kinds()[:2] == [("accepted", None), ("handshake_succeeded", None)]
        ev = sub_events.items[0]
        assert ev.endpoint == pub.last_endpoint and ev.cause is None
        assert isinstance(ev, upcall.ConnectionEvent)

        sub.close()
        wait_for(lambda: pub.peers == 0 and pub_events.has("disconnected"),
                 what=pub_events.kinds)
        assert pub.stats["disconnected"] == 1
        assert sub.peers == 0 and sub.connected is False


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bound_collector_sees_a_pyzmq_pusher_come_and_go(endpoints, transport):
    events = Events()
    ctx = zmq.Context()
    try:
        with upcall.Bus() as bus:
            sub = bus.subscribe(endpoints(transport), lambda m: None, kind="pull", bind=True,
                                on_event=events)
            push = ctx.socket(zmq.PUSH)
            push.connect(sub.last_endpoint)
            wait_for(lambda: sub.peers == 1 and events.has("handshake_succeeded"),
                     what=events.kinds)
            assert events.kinds()[0] == ("accepted", None)
            push.close(linger=0)
            wait_for(lambda: sub.peers == 0 and events.has("disconnected"), what=events.kinds)
            assert sub.stats["accepted"] == sub.stats["disconnected"] == 1
    finally:
        ctx.destroy(linger=0)


def test_refused_connect_is_retried_and_counted():
    events = Events()
    with upcall.Bus() as bus:
        sub = bus.subscribe(unreachable_tcp_endpoint(), lambda m: None, on_event=events)
        wait_for(lambda: sub.stats["connect_retried"] >= 2, what=events.kinds)
        assert sub.peers == 0 and sub.connected is False
        assert sub.stats["connected"] == 0
        # A connection was attempted and refused: the event says so.
        assert events.kinds()[0] == ("connect_retried", "refused")
        assert events.items[0].value > 0          # the retry interval, in ms


def test_refused_reconnect_to_an_address_is_refused():
    """A peer that went away: on loopback the kernel refuses the reconnects at
    once (no connect in progress first), and a numeric host is never
    "unresolved" (the text said "cannot resolve host '127.0.0.1'")."""
    events = Events()
    with upcall.Bus() as bus:
        listener = bus.subscribe("tcp://127.0.0.1:*", lambda m: None, bind=True)
        pub = bus.publisher(listener.last_endpoint, bind=False, on_event=events)
        wait_for(lambda: pub.peers == 1, what=events.kinds)
        listener.close()
        wait_for(lambda: pub.stats["connect_retried"] >= 5, what=events.kinds)
        retried = [k for k in events.kinds() if k[0] == "connect_retried"]
        assert retried and all(cause == "refused" for _, cause in retried), retried


@pytest.mark.parametrize("side", ["subscription", "publisher"])
def test_host_that_does_not_resolve(side):
    endpoint = "tcp://nosuchhost.invalid:5556"
    events = Events()
    with upcall.Bus() as bus:
        if side == "subscription":
            sock = bus.subscribe(endpoint, lambda m: None, on_event=events)
        else:
            sock = bus.publisher(endpoint, kind="push", bind=False, on_event=events)
        wait_for(lambda: sock.stats["connect_retried"] >= 2, what=events.kinds)
        assert sock.peers == 0
        # No connection could even start: the event says why.
        assert all(k == ("connect_retried", "unresolved") for k in events.kinds())
        assert {e.endpoint for e in events.items} == {endpoint}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_wrong_curve_server_key_counted_by_cause_on_both_sides(endpoints, transport):
    server = upcall.curve_keypair()
    wrong = upcall.curve_keypair()
    sub_events, pub_events = Events(), Events()
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints(transport), curve_server=server, on_event=pub_events, bind=True)
        sub = bus.subscribe(pub.last_endpoint, lambda m: None, curve_serverkey=wrong[0],
                            on_event=sub_events)
        # The server cannot decrypt the client's HELLO: a protocol error
        # (ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC); the client only sees the
        # connection drop during its handshake (no detail, EPIPE or so).
        wait_for(lambda: pub.stats["handshake_failed_protocol"] >= 1
                 and sub.stats["handshake_failed_no_detail"]
                 + sub.stats["handshake_failed_protocol"] >= 1,
                 what=lambda: (sub_events.kinds(), pub_events.kinds()))
        assert pub.stats["handshakes"] == sub.stats["handshakes"] == 0
        assert pub.stats["handshake_failed_auth"] == 0
        wait_for(lambda: pub_events.has("handshake_failed", "protocol"), what=pub_events.kinds)
        failed = [e for e in pub_events.items if e.kind == "handshake_failed"]
        assert failed[0].cause == "protocol"
        assert failed[0].value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC
        # A connection that failed its handshake is not a peer.
        wait_for(lambda: pub_events.has("disconnected"), what=pub_events.kinds)
        sub.close()
        wait_for(lambda: pub.peers == 0)


def test_plain_pyzmq_subscriber_at_a_curve_publisher():
    server = upcall.curve_keypair()
    events = Events()
    ctx = zmq.Context()
    try:
        with upcall.Bus() as bus:
            pub = bus.publisher("tcp://127.0.0.1:*", curve_server=server, on_event=events, bind=True)
            s = ctx.socket(zmq.SUB)
            s.connect(pub.last_endpoint)
            # Which side sees the mismatch first is libzmq's race: the
            # server reads the client's NULL greeting (a protocol error), or
            # the client hangs up first (no detail).  Either way it is
            # counted as a failed handshake by its cause, and no handshake
            # succeeds.
            wait_for(lambda: events.has("handshake_failed", "protocol")
                     or events.has("handshake_failed", "no_detail"), what=events.kinds)
            ev = next(e for e in events.items if e.kind == "handshake_failed")
            key = f"handshake_failed_{ev.cause}"
            assert pub.stats[key] >= 1 and pub.stats["handshakes"] == 0
            if ev.cause == "protocol":
                assert ev.value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
    finally:
        ctx.destroy(linger=0)


def test_handshake_failures_logged_at_warning_with_a_rate_limit(caplog, monkeypatch):
    monkeypatch.setattr(upcall._bus, "LOG_BURST", 2)
    monkeypatch.setattr(upcall._bus, "LOG_INTERVAL", 3600.0)
    server = upcall.curve_keypair()
    with caplog.at_level(logging.WARNING, logger="upcall"):
        with upcall.Bus() as bus:
            pub = bus.publisher("tcp://127.0.0.1:*", curve_server=server, bind=True)
            where = pub.last_endpoint
            # Plain subscribers, each refused once (libzmq does not retry
            # after a protocol error).
            subs = [bus.subscribe(pub.last_endpoint, lambda m: None, shared=False)
                    for _ in range(5)]
            wait_for(lambda: pub.stats["handshake_failed_protocol"] == 5,
                     what=lambda: pub.stats)
            for sub in subs:
                sub.close()
    pub_records = [r for r in caplog.records
                   if r.name == "upcall.events" and r.levelno == logging.WARNING
                   and r.msg.startswith("%s: handshake failed")
                   and r.args[0].startswith("publisher")]
    assert len(pub_records) == 2, [r.getMessage() for r in pub_records]
    text = pub_records[0].getMessage()
    assert "protocol error" in text and where in text
    assert pub_records[0].cause == "protocol"


def test_connects_logged_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger="upcall"):
        with upcall.Bus() as bus:
            pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
            sub = bus.subscribe(pub.last_endpoint, lambda m: None, shared=False)
            wait_for(lambda: sub.stats["handshakes"] == 1)
            sub.close()
    debug = [r.getMessage() for r in caplog.records
             if r.levelno == logging.DEBUG and r.name == "upcall.events"]
    assert any(m.startswith("subscription") and "connected" in m for m in debug), debug
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_on_event_that_raises_never_stops_delivery(endpoints, monkeypatch):
    seen = []
    got = threading.Event()
    unraisable = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)

    def bad(ev):
        raise RuntimeError("on_event broke")

    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("tcp"), kind="push", on_event=bad, bind=True)
        sub = bus.subscribe(pub.last_endpoint, lambda m: (seen.append(m), got.set()),
                            kind="pull", on_event=bad)
        pub.send(b"", {"n": 1}, timeout=DEADLINE)
        assert got.wait(DEADLINE)
        assert seen == [{"n": 1}]
        # The loop reads its monitor once the data socket lets it poll.
        wait_for(lambda: sub.stats["handshakes"] == 1)
    # Reported as a target's exception would be: to sys.unraisablehook.
    wait_for(lambda: len(unraisable) >= 2)
    assert all(isinstance(u.exc_value, RuntimeError) for u in unraisable)


def test_on_event_is_checked():
    with upcall.Bus() as bus:
        with pytest.raises(TypeError, match="on_event must be callable or None, not int"):
            bus.subscribe("tcp://127.0.0.1:5556", print, on_event=5)
        with pytest.raises(TypeError, match="on_event must be callable or None, not str"):
            bus.publisher("tcp://127.0.0.1:*", on_event="no", bind=True)
        assert bus.subscribe("tcp://127.0.0.1:5556", print, on_event=None).peers == 0


def test_inproc_has_no_connection_state(endpoints):
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("inproc"), bind=True)
        sub = bus.subscribe(pub.last_endpoint, lambda m: None)
        assert sub.peers is None and sub.connected is None
        assert pub.peers is None
        assert set(upcall.EVENT_STATS) <= set(sub.stats)
        assert all(sub.stats[k] == 0 for k in upcall.EVENT_STATS)


# ---- sends with no peer at all name that cause ------------------------------

def test_blocking_send_with_no_peer_says_so(endpoints):
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("tcp"), kind="push", bind=True)     # bound, nobody connects
        with pytest.raises(TimeoutError, match="no peer connected") as info:
            pub.send(b"", 1, timeout=0.05)
        assert "high-water mark" not in str(info.value)
        with pytest.raises(BlockingIOError, match="no peer connected"):
            pub.send(b"", 1, timeout=0)


def test_send_async_with_no_peer_says_so(endpoints):
    from upcall import aio  # noqa: F401  (send_async's adapter)
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("tcp"), kind="push", bind=True)

        async def main():
            with pytest.raises(TimeoutError, match="no peer connected") as info:
                await pub.send_async(b"", 1, timeout=0.05)
            assert "high-water mark" not in str(info.value)
            with pytest.raises(BlockingIOError, match="no peer connected"):
                await pub.send_async(b"", 1, timeout=0)
        asyncio.run(main())


def test_send_at_the_mark_of_a_connected_peer_still_says_high_water_mark(endpoints):
    ctx = zmq.Context()
    try:
        with upcall.Bus() as bus:
            pub = bus.publisher(endpoints("tcp"), kind="push", sndhwm=1, bind=True)
            pull = ctx.socket(zmq.PULL)
            pull.setsockopt(zmq.RCVHWM, 1)
            pull.connect(pub.last_endpoint)
            wait_for(lambda: pub.peers == 1 and pub.stats["handshakes"] == 1)
            with pytest.raises(TimeoutError, match="high-water mark reached"):
                for i in range(100_000):     # fills both queues and the kernel's buffers
                    pub.send(b"", b"x" * 65536, timeout=0.05)
    finally:
        ctx.destroy(linger=0)


def test_closing_a_publisher_from_its_own_on_event_is_refused(endpoints, monkeypatch):
    unraisable = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    holder = {}

    def close_me(ev):
        holder["pub"].close()

    with upcall.Bus() as bus:
        holder["pub"] = pub = bus.publisher(endpoints("tcp"), on_event=close_me, bind=True)
        sub = bus.subscribe(pub.last_endpoint, lambda m: None)
        wait_for(lambda: unraisable, what="on_event's close() refused")
        assert isinstance(unraisable[0].exc_value, RuntimeError)
        assert "own on_event" in str(unraisable[0].exc_value)
        assert not pub.closed
        sub.close()
    assert pub.closed


FORK_CHILD_EVENTS = """
import os, sys, time
import upcall
from helpers import wait_for

with upcall.Bus() as bus:
    # The parent's monitor thread runs (a publisher on tcp) when it forks.
    pub = bus.publisher("tcp://127.0.0.1:*", bind=True)
    pid = os.fork()
    if pid == 0:
        try:
            events = []
            with upcall.Bus() as child_bus:
                p = child_bus.publisher("tcp://127.0.0.1:*", on_event=events.append, bind=True)
                s = child_bus.subscribe(p.last_endpoint, lambda m: None)
                wait_for(lambda: p.peers == 1 and any(e.kind == "handshake_succeeded"
                                                      for e in events))
                s.close()
                p.close()
            os._exit(0)
        except BaseException as exc:
            print("child:", repr(exc), flush=True)
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    print("child status", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_child_after_fork_gets_its_own_monitor_thread(tmp_path):
    import subprocess
    import sys
    from helpers import script_env
    proc = subprocess.run([sys.executable, "-c", FORK_CHILD_EVENTS], env=script_env(),
                          cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE * 2)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("child status 0"), (proc.stdout, proc.stderr)


def test_zap_refusal_counted_as_auth_on_the_client(tmp_path):
    """A pyzmq CURVE server whose ZAP handler (zmq.auth) knows no client
    key refuses the upcall subscriber: the ERROR command of the handshake
    reaches the client as ZMQ_EVENT_HANDSHAKE_FAILED_AUTH (value: the ZAP
    status code, 400)."""
    from zmq.auth.thread import ThreadAuthenticator
    server_public, server_secret = zmq.curve_keypair()
    client = upcall.curve_keypair()
    events = Events()
    ctx = zmq.Context()
    auth = ThreadAuthenticator(ctx)
    auth.start()
    try:
        auth.configure_curve(domain="*", location=str(tmp_path))   # an empty allow-list
        pub = ctx.socket(zmq.PUB)
        pub.curve_server = True
        pub.curve_publickey, pub.curve_secretkey = server_public, server_secret
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        with upcall.Bus() as bus:
            sub = bus.subscribe(f"tcp://127.0.0.1:{port}", lambda m: None,
                                curve_serverkey=server_public.decode(), curve_client=client,
                                on_event=events)
            wait_for(lambda: events.has("handshake_failed", "auth"), what=events.kinds)
            assert sub.stats["handshake_failed_auth"] >= 1
            assert sub.stats["handshakes"] == 0
            ev = next(e for e in events.items if e.cause == "auth")
            assert ev.value == 400
        pub.close(linger=0)
    finally:
        auth.stop()
        ctx.destroy(linger=0)


def test_async_subscription_sees_its_connection(endpoints):
    events = Events()

    async def main():
        with upcall.Bus() as bus:
            pub = bus.publisher(endpoints("tcp"), bind=True)
            async with bus.subscribe_async(pub.last_endpoint, on_event=events) as asub:
                while not (asub.peers == 1 and events.has("handshake_succeeded")):
                    await asyncio.sleep(0.005)
                assert asub.connected is True
                assert asub.stats["handshakes"] == 1
    asyncio.run(asyncio.wait_for(main(), DEADLINE))
