"""CURVE: encrypted endpoints with server authentication (docs/security.md).

Real sockets over tcp 127.0.0.1 and ipc.  "Receives nothing" is never shown
by sleeping: the publisher sends its CURVE traffic and then a sentinel on a
plain endpoint; once the sentinel (and the correctly keyed subscriber's copy
of the traffic) has arrived, the wrongly keyed subscriber must have nothing.
"""
import pytest

import upcall
from helpers import DEADLINE, PROBE, PROBE_TOPIC, Collector, make_msg, wait_for
from netns_peer import Peer

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

if not zmq.has("curve"):
    pytest.skip("libzmq without CURVE support", allow_module_level=True)

TRANSPORTS = ["tcp", "ipc"]


def is_data(item):
    return not (isinstance(item, str) and item == PROBE)


# ---- keys and arguments ---------------------------------------------------

def test_curve_keypair():
    public, secret = upcall.curve_keypair()
    assert isinstance(public, str) and isinstance(secret, str)
    assert len(public) == len(secret) == 40
    assert public != secret
    assert upcall.curve_keypair() != (public, secret)
    # The pair is what libzmq derives: pyzmq agrees on the public key.
    assert zmq.curve_public(secret.encode()) == public.encode()


def test_keys_accepted_as_str_and_bytes(endpoints):
    server = upcall.curve_keypair()
    client = upcall.curve_keypair()
    got = Collector()
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("tcp"), kind="push",
                            curve_server=(server[0].encode(), server[1]), bind=True)
        bus.subscribe(pub.last_endpoint, got, kind="pull",
                      curve_serverkey=bytearray(server[0].encode()),
                      curve_client=[client[0], client[1].encode()])
        pub.send(b"", 1)
        got.wait(1)
    assert got.items == [1]


PUB_ = upcall.curve_keypair()
OTHER = upcall.curve_keypair()


@pytest.mark.parametrize("kwargs, exc, words", [
    ({"curve_serverkey": PUB_[0][:39]}, ValueError, ["curve_serverkey", "40", "39"]),
    ({"curve_serverkey": PUB_[0] + "0"}, ValueError, ["curve_serverkey", "41"]),
    ({"curve_serverkey": " " + PUB_[0][1:]}, ValueError, ["curve_serverkey", "Z85", "position 0"]),
    ({"curve_serverkey": "#" * 40}, ValueError, ["curve_serverkey", "Z85", "32 bits"]),
    ({"curve_serverkey": "é" * 40}, ValueError, ["curve_serverkey", "Z85"]),
    ({"curve_serverkey": b"\xff" * 40}, ValueError, ["curve_serverkey", "ASCII"]),
    ({"curve_serverkey": 12}, TypeError, ["curve_serverkey", "int"]),
    ({"curve_server": PUB_[0]}, TypeError, ["curve_server", "(public, secret)"]),
    ({"curve_server": (PUB_[0],)}, TypeError, ["curve_server", "length 1"]),
    ({"curve_server": (PUB_[1], PUB_[0])}, ValueError, ["curve_server", "order"]),
    ({"curve_server": (OTHER[0], PUB_[1])}, ValueError, ["curve_server", "not the one"]),
    ({"curve_server": (PUB_[0], 5)}, TypeError, ["curve_server[1]", "secret"]),
    ({"curve_serverkey": PUB_[0], "curve_client": (PUB_[0], OTHER[1])}, ValueError,
     ["curve_client", "not the one"]),
    ({"curve_client": OTHER}, ValueError, ["curve_client", "curve_serverkey"]),
    ({"curve_server": PUB_, "curve_serverkey": OTHER[0]}, ValueError,
     ["curve_server", "curve_serverkey", "not both"]),
    ({"curve_server": PUB_, "curve_client": OTHER}, ValueError, ["curve_client"]),
])
@pytest.mark.parametrize("side", ["subscribe", "publisher"])
def test_bad_arguments(side, kwargs, exc, words):
    with upcall.Bus() as bus:
        with pytest.raises(exc) as info:
            if side == "subscribe":
                bus.subscribe("tcp://127.0.0.1:1", print, **kwargs)
            else:
                bus.publisher("tcp://127.0.0.1:1", bind=False, **kwargs)
        for word in words:
            assert word in str(info.value)


def test_inproc_is_refused():
    """libzmq runs no handshake on inproc: keys there would silently do nothing."""
    with upcall.Bus() as bus:
        with pytest.raises(ValueError, match="inproc"):
            bus.publisher("inproc://curve", curve_server=PUB_, bind=True)
        with pytest.raises(ValueError, match="inproc"):
            bus.subscribe("inproc://curve", print, curve_serverkey=PUB_[0])


# ---- delivery and refusal -------------------------------------------------

def keypair_with_leading_dash():
    """A pair whose keys both start with "-", as about one in 7,000 do (Z85
    has "-" in its alphabet): on a command line they look like options."""
    while True:
        public, secret = upcall.curve_keypair()
        if public[0] == secret[0] == "-":
            return public, secret


KEYPAIRS = {"random": upcall.curve_keypair, "leading-dash": keypair_with_leading_dash}


@pytest.mark.parametrize("keys", sorted(KEYPAIRS))
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_wrong_server_key_receives_nothing(transport, keys, endpoints):
    """A CURVE publisher in another process: the right key delivers, a wrong
    server key and a plain subscriber get nothing, the publisher lives on."""
    server = KEYPAIRS[keys]()
    wrong = upcall.curve_keypair()
    peer = Peer(["pub", "--kind", "pub", "--endpoint", endpoints(transport),
                 # "--opt=value": a key may begin with "-".
                 "--curve-public=" + server[0], "--curve-secret=" + server[1],
                 "--plain", endpoints(transport)])
    try:
        curve_ep, plain_ep = peer.expect("ready").split()
        good, bad, plain, sentinel = Collector(), Collector(), Collector(), Collector()
        with upcall.Bus() as bus:
            # The refused ones first: they have had longer than the good one.
            bad_sub = bus.subscribe(curve_ep, bad, curve_serverkey=wrong[0])
            plain_sub = bus.subscribe(curve_ep, plain)
            bus.subscribe(curve_ep, good, curve_serverkey=server[0])
            bus.subscribe(plain_ep, sentinel)
            wait_for(lambda: peer.ask("probe") is not None and good.wait_probe(0.01)
                     and sentinel.probes, what="probes on both endpoints")

            total = 0
            for n, burst in enumerate((200, 50), 1):
                total = int(peer.ask("send %d" % burst))
                good.wait(total)
                sentinel.wait(n)
                assert sentinel.items[-1] == {"sentinel": total}
                # The sentinel went out after the CURVE burst: the burst has
                # had its chance to reach the wrongly keyed subscribers.
                assert bad.calls == 0 and plain.calls == 0
                assert bad_sub.stats["received"] == 0 == plain_sub.stats["received"]
                assert peer.proc.poll() is None, "the publisher died"
            assert [m["seq"] for m in good.items] == list(range(total))
        assert peer.ask("quit") == ""
        assert peer.wait_exit() == 0
    finally:
        peer.kill()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_binding_subscriber_is_the_server(transport, endpoints):
    """Roles reversed: a binding PULL is the CURVE server; connecting PUSH
    clients with the right key deliver, one with a wrong key does not."""
    server = upcall.curve_keypair()
    got = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe(endpoints(transport), got, kind="pull", bind=True,
                            curve_server=server, with_topic=True)
        ep = sub.last_endpoint
        bad = bus.publisher(ep, kind="push", bind=False,
                            curve_serverkey=upcall.curve_keypair()[0])
        plain = bus.publisher(ep, kind="push", bind=False)
        good = bus.publisher(ep, kind="push", bind=False, curve_serverkey=server[0],
                             curve_client=upcall.curve_keypair())
        for i in range(20):
            bad.send(b"bad", i, timeout=0)     # queued on a pipe that never opens
            plain.send(b"plain", i, timeout=0)
        for i in range(100):
            good.send(b"good", make_msg(i))
        got.wait(100)
        # Control: a second good client, opened after all of the above, also
        # gets through, and still nothing from the refused ones.
        late = bus.publisher(ep, kind="push", bind=False, curve_serverkey=server[0])
        late.send(b"late", "end")
        wait_for(lambda: got.items[-1] == (b"late", "end"), what="the late client's message")
        assert [t for t, _ in got.items] == [b"good"] * 100 + [b"late"]
        assert [m for _, m in got.items[:100]] == [make_msg(i) for i in range(100)]
        assert sub.stats["received"] == 101


def test_plain_and_curve_endpoints_coexist(endpoints):
    """One bus: plain PUB/SUB, CURVE PUB/SUB over tcp, CURVE PUSH/PULL over
    ipc with the binder as client; each delivers its own traffic."""
    k1, k2 = upcall.curve_keypair(), upcall.curve_keypair()
    plain_got, curve_got, pull_got = Collector(), Collector(), Collector()
    with upcall.Bus() as bus:
        plain_pub = bus.publisher(endpoints("tcp"), bind=True)
        curve_pub = bus.publisher(endpoints("tcp"), curve_server=k1, bind=True)
        plain_sub = bus.subscribe(plain_pub.last_endpoint, plain_got)
        curve_sub = bus.subscribe(curve_pub.last_endpoint, curve_got, curve_serverkey=k1[0])
        # PUSH binds as the CURVE client; PULL connects as the server.
        push = bus.publisher(endpoints("ipc"), kind="push", curve_serverkey=k2[0], bind=True)
        pull_sub = bus.subscribe(push.last_endpoint, pull_got, kind="pull", curve_server=k2)
        for pub, got in ((plain_pub, plain_got), (curve_pub, curve_got)):
            wait_for(lambda: pub.send(PROBE_TOPIC, PROBE) or got.wait_probe(0.01),
                     what="a probe through %s" % pub.endpoint)
        for i in range(300):
            plain_pub.send(b"p", ("plain", i))
            curve_pub.send(b"c", ("curve", i))
            push.send(b"", ("push", i))
        for got, name in ((plain_got, "plain"), (curve_got, "curve"), (pull_got, "push")):
            got.wait(300)
            assert got.items == [[name, i] for i in range(300)]
        for s in (plain_sub, curve_sub, pull_sub):
            assert s.stats["decode_errors"] == 0


# ---- interoperability with pyzmq ------------------------------------------

def _pyzmq_recv(sock, timeout=DEADLINE):
    assert sock.poll(int(timeout * 1000)), "nothing arrived at the pyzmq socket"
    return sock.recv_multipart()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_pyzmq_curve_server_to_upcall(transport, endpoints):
    """A pyzmq PUB (CURVE server, keys from zmq.curve_keypair(), bytes) and an
    upcall subscriber as its client."""
    spub, ssec = zmq.curve_keypair()
    got = Collector()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    try:
        sock.curve_secretkey = ssec
        sock.curve_publickey = spub
        sock.curve_server = True
        sock.linger = 0
        ep = endpoints(transport)
        sock.bind(ep)
        with upcall.Bus() as bus:
            bus.subscribe(ep, got, curve_serverkey=spub, topics=[b"t.", PROBE_TOPIC])
            wait_for(lambda: sock.send_multipart([PROBE_TOPIC, msgpack.packb(PROBE)])
                     or got.wait_probe(0.01), what="a probe from pyzmq")
            for i in range(100):
                sock.send_multipart([b"t.%d" % i, msgpack.packb(make_msg(i))])
            got.wait(100)
            assert got.items == [make_msg(i) for i in range(100)]
    finally:
        sock.close()
        ctx.term()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_upcall_curve_server_to_pyzmq(transport, endpoints):
    """An upcall PUSH (CURVE server, upcall's str keys) and a pyzmq PULL client."""
    server = upcall.curve_keypair()
    cpub, csec = zmq.curve_keypair()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    try:
        sock.curve_serverkey = server[0].encode()
        sock.curve_publickey = cpub
        sock.curve_secretkey = csec
        sock.linger = 0
        with upcall.Bus() as bus:
            pub = bus.publisher(endpoints(transport), kind="push", curve_server=server, bind=True)
            sock.connect(pub.last_endpoint)
            for i in range(100):
                pub.send(b"x", make_msg(i))
            got = [_pyzmq_recv(sock) for _ in range(100)]
            assert [t for t, _ in got] == [b"x"] * 100
            assert [msgpack.unpackb(p) for _, p in got] == [make_msg(i) for i in range(100)]
    finally:
        sock.close()
        ctx.term()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_pyzmq_client_to_upcall_server(transport, endpoints):
    """A binding upcall PULL as the CURVE server; a pyzmq PUSH client with the
    right key delivers, one with a wrong key sees its handshake fail."""
    server = upcall.curve_keypair()
    got = Collector()
    ctx = zmq.Context()
    good = ctx.socket(zmq.PUSH)
    bad = ctx.socket(zmq.PUSH)
    monitor = bad.get_monitor_socket()
    try:
        with upcall.Bus() as bus:
            sub = bus.subscribe(endpoints(transport), got, kind="pull", bind=True,
                                curve_server=server)
            for sock, key in ((bad, upcall.curve_keypair()[0]), (good, server[0])):
                sock.curve_serverkey = key.encode()
                sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
                sock.linger = 0
                sock.connect(sub.last_endpoint)
            bad.send_multipart([b"", msgpack.packb("from the wrong key")])
            # The wrongly keyed client's handshake is refused (the server
            # cannot decrypt it): wait for the failure its monitor reports.
            failed = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                      zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_DISCONNECTED}
            from zmq.utils.monitor import recv_monitor_message
            events = []
            while not failed & set(events):
                assert monitor.poll(int(DEADLINE * 1000)), "no monitor event: %s" % events
                events.append(recv_monitor_message(monitor)["event"])
            assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in events
            for i in range(50):
                good.send_multipart([b"", msgpack.packb(i)])
            got.wait(50)
            assert got.items == list(range(50))
            assert sub.stats["received"] == 50
    finally:
        bad.disable_monitor()
        monitor.close(linger=0)
        for sock in (good, bad):
            sock.close(linger=0)
        ctx.term()
