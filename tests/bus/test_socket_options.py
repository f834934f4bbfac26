"""socket_options=: libzmq options by name on subscribe() and publisher().

Checked before any socket is opened (a mistake names its option), and seen
at work on real sockets: ZMQ_IMMEDIATE on a publisher, ZMQ_HANDSHAKE_IVL on
a bound subscription, heartbeats closing a connection to a peer that went
silent, on both ends.  The silent peers are plain TCP sockets speaking just
enough ZMTP 3.0 (RFC 23) to complete the handshake.  (The C tests read every
option back with zmq_getsockopt.)
"""
import socket

import pytest

import upcall
from helpers import DEADLINE, Collector

# Every option offered, with a value that is not libzmq's default.
VALID = {
    "heartbeat_ivl": 250, "heartbeat_ttl": 2000, "heartbeat_timeout": 750,
    "tcp_keepalive": 1, "tcp_keepalive_idle": 30, "tcp_keepalive_cnt": 4,
    "tcp_keepalive_intvl": 5, "tcp_maxrt": 4000, "reconnect_ivl": 50,
    "reconnect_ivl_max": 5000, "connect_timeout": 1500, "handshake_ivl": 3000,
    "immediate": True, "ipv6": 1, "backlog": 50, "sndbuf": 65536, "rcvbuf": -1, "tos": 16,
}


def open_side(bus, side, endpoint, options, **kw):
    if side == "subscribe":
        return bus.subscribe(endpoint, print, socket_options=options, **kw)
    return bus.publisher(endpoint, socket_options=options, **{"bind": True, **kw})


# ---- arguments ------------------------------------------------------------------

@pytest.mark.parametrize("side", ["subscribe", "publisher"])
def test_every_option_is_accepted(endpoints, side):
    with upcall.Bus() as bus:
        open_side(bus, side, endpoints("tcp"), VALID).close()
        open_side(bus, side, endpoints("tcp"), {}).close()
        open_side(bus, side, endpoints("tcp"), None).close()
        # The special values outside the ranges.
        open_side(bus, side, endpoints("tcp"), {"reconnect_ivl": -1, "tcp_keepalive": -1,
                                                "tcp_keepalive_idle": -1, "sndbuf": -1}).close()


@pytest.mark.parametrize("options, exc, words", [
    ([("heartbeat_ivl", 1)], TypeError, ["socket_options", "mapping", "list"]),
    ({1: 2}, TypeError, ["socket_options", "str", "int"]),
    ({"heartbeat": 1000}, ValueError, ["unknown option 'heartbeat'", "heartbeat_ivl"]),
    ({"HEARTBEAT_IVL": 1000}, ValueError, ["'HEARTBEAT_IVL'", "did you mean 'heartbeat_ivl'"]),
    ({"ZMQ_TCP_KEEPALIVE": 1}, ValueError, ["did you mean 'tcp_keepalive'"]),
    ({"linger": 0}, ValueError, ["'linger'", "publisher(linger="]),
    ({"ZMQ_LINGER": 0}, ValueError, ["'ZMQ_LINGER'", "publisher(linger="]),
    ({"rcvhwm": 10}, ValueError, ["'rcvhwm'", "subscribe(rcvhwm="]),
    ({"sndhwm": 10}, ValueError, ["'sndhwm'", "publisher(sndhwm="]),
    ({"maxmsgsize": 10}, ValueError, ["'maxmsgsize'", "max_message_size="]),
    ({"curve_serverkey": "x"}, ValueError, ["'curve_serverkey'", "curve_serverkey="]),
    ({"curve_secretkey": "x"}, ValueError, ["'curve_secretkey'", "curve_client="]),
    ({"subscribe": b""}, ValueError, ["'subscribe'", "topics="]),
    ({"conflate": 1}, ValueError, ["'conflate'", "frames"]),
    ({"rcvtimeo": 100}, ValueError, ["'rcvtimeo'", "timeout"]),
    ({"heartbeat_ivl": 1.5}, TypeError, ["socket_options['heartbeat_ivl']", "int",
                                         "milliseconds", "float"]),
    ({"heartbeat_ivl": "1000"}, TypeError, ["socket_options['heartbeat_ivl']", "str"]),
    ({"heartbeat_ivl": True}, TypeError, ["socket_options['heartbeat_ivl']", "bool"]),
    ({"heartbeat_ivl": -1}, ValueError, ["socket_options['heartbeat_ivl']", "between 0 and"]),
    ({"heartbeat_ivl": 2 ** 31}, ValueError, ["socket_options['heartbeat_ivl']"]),
    ({"heartbeat_ttl": 6553600}, ValueError, ["'heartbeat_ttl'", "6553599"]),
    ({"tcp_keepalive": 2}, ValueError, ["'tcp_keepalive'", "between 0 and 1, or -1"]),
    ({"tcp_keepalive_idle": 0}, ValueError, ["'tcp_keepalive_idle'", "seconds"]),
    ({"tcp_keepalive_cnt": 128}, ValueError, ["'tcp_keepalive_cnt'", "127"]),
    ({"reconnect_ivl": -2}, ValueError, ["'reconnect_ivl'", "or -1", "never reconnect"]),
    ({"sndbuf": -2}, ValueError, ["'sndbuf'", "bytes"]),
    ({"tos": 256}, ValueError, ["'tos'", "255"]),
    ({"immediate": 2}, ValueError, ["'immediate'", "between 0 and 1"]),
    ({"immediate": "yes"}, TypeError, ["'immediate'", "bool"]),
])
@pytest.mark.parametrize("side", ["subscribe", "publisher"])
def test_bad_options(endpoints, side, options, exc, words):
    ep = endpoints("inproc")
    with upcall.Bus() as bus:
        with pytest.raises(exc) as info:
            open_side(bus, side, ep, options, bind=True)
        for w in words:
            assert w in str(info.value)
        # Checked before any socket was made: the endpoint is still free.
        open_side(bus, side, ep, None, bind=True).close()


# ---- at work ----------------------------------------------------------------------

def held_tcp_port():
    """A TCP port on 127.0.0.1 that is bound but not listening: a connection
    to it is refused, and nobody else can take it while the socket is open."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    return s, "tcp://127.0.0.1:%d" % s.getsockname()[1]


def test_immediate_on_a_publisher():
    """ZMQ_IMMEDIATE: a PUSH with no completed connection has nowhere to queue."""
    held, ep = held_tcp_port()
    with held, upcall.Bus() as bus:
        eager = bus.publisher(ep, kind="push", bind=False, linger=0)
        eager.send(b"t", 1, timeout=0)        # queued for the pending connection
        strict = bus.publisher(ep, kind="push", bind=False, linger=0,
                               socket_options={"immediate": True})
        with pytest.raises(BlockingIOError):
            strict.send(b"t", 1, timeout=0)


def read_until_eof(conn, timeout=DEADLINE):
    """Read (and discard) until the peer closes; fail if it does not."""
    conn.settimeout(timeout)
    while True:
        try:
            data = conn.recv(4096)
        except socket.timeout:
            raise AssertionError("the connection is still open after %.0f s" % timeout)
        if not data:
            return


def still_open(conn):
    """True if the peer has not closed ``conn`` (reads what is pending)."""
    conn.setblocking(False)
    try:
        while True:
            if not conn.recv(4096):
                return False
    except BlockingIOError:
        return True
    finally:
        conn.setblocking(True)


def test_handshake_ivl_on_a_bound_subscription():
    """ZMQ_HANDSHAKE_IVL: a connection that never completes the handshake
    (a TCP client that sends nothing) is closed by the subscription."""
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", print, kind="pull", bind=True,
                            socket_options={"handshake_ivl": 100})
        host, port = sub.last_endpoint[len("tcp://"):].rsplit(":", 1)
        with socket.create_connection((host, int(port))) as conn:
            read_until_eof(conn)


# A just-enough ZMTP 3.0 peer (RFC 23) with the NULL mechanism: it completes
# the handshake as ``socket_type`` and then says nothing, as a peer whose
# process hangs or whose host vanished would, while the kernel keeps the TCP
# connection up.

def zmtp_handshake(conn, socket_type):
    greeting = (b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00"
                + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31)
    conn.sendall(greeting)
    theirs = b""
    conn.settimeout(DEADLINE)
    while len(theirs) < 64:
        chunk = conn.recv(64 - len(theirs))
        assert chunk, "the peer closed during the greeting"
        theirs += chunk
    assert theirs[0] == 0xFF and theirs[9] == 0x7F and theirs[12:16] == b"NULL"
    body = (b"\x05READY" + b"\x0bSocket-Type" + len(socket_type).to_bytes(4, "big")
            + socket_type)
    conn.sendall(b"\x04" + bytes([len(body)]) + body)
    # Their READY (a short command frame): once it is in, the link is up.
    head = conn.recv(2)
    assert len(head) == 2 and head[0] & 0x04, head
    rest = b""
    while len(rest) < head[1]:
        rest += conn.recv(head[1] - len(rest))
    assert rest.startswith(b"\x05READY")


HEARTBEATS = {"heartbeat_ivl": 50, "heartbeat_timeout": 200}


def test_heartbeats_on_a_publisher_close_a_silent_subscriber():
    with upcall.Bus() as bus:
        beating = bus.publisher("tcp://127.0.0.1:*", socket_options=HEARTBEATS, bind=True)
        quiet = bus.publisher("tcp://127.0.0.1:*", bind=True)
        conns = []
        for pub in (beating, quiet):
            host, port = pub.last_endpoint[len("tcp://"):].rsplit(":", 1)
            conn = socket.create_connection((host, int(port)))
            conns.append(conn)
            zmtp_handshake(conn, b"SUB")
        with conns[0], conns[1]:
            read_until_eof(conns[0])          # PINGs, no answer, closed
            assert still_open(conns[1])       # no heartbeats: never closed


def test_heartbeats_on_a_subscription_drop_a_silent_publisher_and_reconnect():
    """The connecting end: heartbeats close the link to a publisher that went
    silent, and reconnect_ivl brings a new connection."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(DEADLINE)
        port = server.getsockname()[1]
        col = Collector()
        with upcall.Bus() as bus:
            bus.subscribe("tcp://127.0.0.1:%d" % port, col,
                          socket_options={**HEARTBEATS, "reconnect_ivl": 20})
            first, _ = server.accept()
            with first:
                zmtp_handshake(first, b"PUB")
                read_until_eof(first)
            second, _ = server.accept()       # it came back by itself
            second.close()
        assert col.items == []


def test_options_given_to_several_endpoints_apply_to_each():
    with upcall.Bus() as bus:
        sub = bus.subscribe(["tcp://127.0.0.1:*", "tcp://127.0.0.1:*"], print, kind="pull",
                            bind=True, socket_options={"handshake_ivl": 100})
        for resolved in sub.last_endpoints:
            host, port = resolved[len("tcp://"):].rsplit(":", 1)
            with socket.create_connection((host, int(port))) as conn:
                read_until_eof(conn)
