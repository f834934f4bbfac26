"""Bus.proxy: an XSUB/XPUB forwarder on libzmq's own proxy, between upcall
publishers and subscribers over real tcp/ipc sockets: subscriptions go
upstream through it, messages of every wire form pass unchanged, pause and
resume, statistics, CURVE and authentication on a side, close (by hand, by
the bus)."""
import gc
import threading

import pytest

import upcall
from helpers import DEADLINE, Collector, wait_for


def open_proxy(bus, transport, tmp_path, **kwargs):
    if transport == "tcp":
        return bus.proxy("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", **kwargs)
    return bus.proxy(f"ipc://{tmp_path}/front", f"ipc://{tmp_path}/back", **kwargs)


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_each_subscriber_behind_the_proxy_gets_only_its_topics(transport, tmp_path):
    with upcall.Bus() as bus:
        proxy = open_proxy(bus, transport, tmp_path)
        a, b = Collector(), Collector()
        bus.subscribe(proxy.backend, a, topics=[b"a."], with_topic=True)
        bus.subscribe(proxy.backend, b, topics=[b"b."], with_topic=True)
        pub = bus.publisher(proxy.frontend, bind=False)
        # Both subscriptions came through the proxy to the publisher.
        assert pub.wait_subscriptions(2, timeout=DEADLINE) >= 2
        # "c." is filtered by the publisher itself: it never reaches the
        # proxy, and what follows it on the same connection does.
        pub.send(b"c.1", "nobody")
        pub.send(b"a.1", "for a")
        pub.send(b"b.1", "for b")
        a.wait(1)
        b.wait(1)
        assert a.items == [(b"a.1", "for a")]
        assert b.items == [(b"b.1", "for b")]
        stats = proxy.stats
        assert set(stats) == set(upcall.PROXY_STATS)
        assert stats["messages"] == 2
        assert stats["bytes"] == len(b"a.1") + len(upcall.packb("for a")) \
            + len(b"b.1") + len(upcall.packb("for b"))
        assert stats["subscription_messages"] >= 2
        proxy.close()


def test_coalesced_and_out_of_band_messages_pass_unchanged():
    blob = bytes(range(256)) * 200
    with upcall.Bus() as bus:
        with bus.proxy("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as proxy:
            got = Collector()
            bus.subscribe(proxy.backend, got, topics=[b"t"])
            pub = bus.publisher(proxy.frontend, bind=False, coalesce=True, max_delay=None,
                                oob_threshold=1024)
            pub.wait_subscriptions(1, timeout=DEADLINE)
            pub.send_many(b"t", list(range(100)))
            pub.flush(timeout=DEADLINE)
            pub.send(b"t", {"blob": blob})
            got.wait(101)
            assert got.items[:100] == list(range(100))
            assert got.items[100] == {"blob": blob}
            # A coalesced batch is one zmq message through the proxy.
            assert proxy.stats["messages"] < 101


def test_pause_holds_messages_until_resume():
    with upcall.Bus() as bus:
        proxy = bus.proxy("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        got = Collector()
        bus.subscribe(proxy.backend, got, topics=[b""])
        pub = bus.publisher(proxy.frontend, bind=False)
        pub.wait_subscriptions(1, timeout=DEADLINE)
        proxy.pause()
        assert proxy.paused
        assert "paused" in repr(proxy)
        pub.send(b"x", 1)
        # A paused proxy answers, and has forwarded nothing.
        assert proxy.stats["messages"] == 0
        assert len(got) == 0
        proxy.resume()
        assert not proxy.paused
        got.wait(1)
        assert got.items == [1]
        assert proxy.stats["messages"] == 1
        proxy.close()


def test_close_keeps_the_last_counts_and_refuses_steering():
    with upcall.Bus() as bus:
        proxy = bus.proxy("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        got = Collector()
        bus.subscribe(proxy.backend, got)
        pub = bus.publisher(proxy.frontend, bind=False)
        pub.wait_subscriptions(1, timeout=DEADLINE)
        pub.send(b"", "one")
        got.wait(1)
        assert proxy.running
        proxy.close()
        proxy.close()                      # idempotent
        assert not proxy.running
        assert "closed" in repr(proxy)
        assert proxy.stats["messages"] == 1
        assert proxy.peers == (0, 0)
        with pytest.raises(ValueError, match="closed"):
            proxy.pause()
        with pytest.raises(ValueError, match="closed"):
            proxy.resume()


def test_bus_close_closes_its_proxies():
    bus = upcall.Bus()
    proxy = bus.proxy("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    bus.close(timeout=DEADLINE)
    assert not proxy.running
    with pytest.raises(ValueError, match="closed"):
        bus.proxy("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")


def test_a_proxy_left_unreferenced_closes_with_a_warning():
    with upcall.Bus() as bus:
        proxy = bus.proxy("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        with pytest.warns(ResourceWarning, match="unclosed"):
            del proxy
            gc.collect()


def test_connection_events_of_each_side():
    events = []
    lock = threading.Lock()

    def on_event(ev):
        with lock:
            events.append((ev.kind, ev.endpoint))

    with upcall.Bus() as bus:
        with bus.proxy("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", on_event=on_event) as proxy:
            sub = bus.subscribe(proxy.backend, Collector())
            pub = bus.publisher(proxy.frontend, bind=False)
            pub.wait_subscriptions(1, timeout=DEADLINE)
            wait_for(lambda: proxy.peers == (1, 1), what=lambda: f"peers {proxy.peers}")
            ev = proxy.events
            assert ev["frontend"]["accepted"] == 1 and ev["backend"]["accepted"] == 1
            with lock:
                assert ("accepted", proxy.frontend) in events
                assert ("accepted", proxy.backend) in events
            sub.close()
            wait_for(lambda: proxy.events["backend"]["disconnected"] == 1)


def test_curve_and_client_authentication_on_the_backend():
    server = upcall.curve_keypair()
    good, bad = upcall.curve_keypair(), upcall.curve_keypair()
    with upcall.Bus() as bus:
        with bus.proxy("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", backend_curve_server=server,
                       backend_allow=[good[0]]) as proxy:
            refused = Collector()
            bus.subscribe(proxy.backend, refused, curve_serverkey=server[0], curve_client=bad)
            wait_for(lambda: proxy.events["backend"]["handshake_failed_auth"] >= 1)
            got = Collector()
            bus.subscribe(proxy.backend, got, curve_serverkey=server[0], curve_client=good)
            pub = bus.publisher(proxy.frontend, bind=False)
            pub.wait_subscriptions(1, timeout=DEADLINE)
            pub.send(b"", "secret")
            got.wait(1)
            assert got.items == ["secret"]
            assert len(refused) == 0


def test_curve_on_the_frontend():
    server = upcall.curve_keypair()
    with upcall.Bus() as bus:
        with bus.proxy("tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
                       frontend_curve_server=server) as proxy:
            got = Collector()
            bus.subscribe(proxy.backend, got)
            pub = bus.publisher(proxy.frontend, bind=False, curve_serverkey=server[0])
            pub.wait_subscriptions(1, timeout=DEADLINE)
            pub.send(b"", "through curve")
            got.wait(1)
            # The monitor thread counts it, maybe after the message arrived.
            wait_for(lambda: proxy.events["frontend"]["handshakes"] == 1)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(frontend=5), TypeError, "frontend must be a str"),
    (dict(backend="udp://x:1"), ValueError, "backend must start with"),
    (dict(frontend_bind="yes"), TypeError, "frontend_bind must be True or False"),
    (dict(backend_hwm=-1), ValueError, "backend_hwm"),
    (dict(frontend_allow=[upcall.curve_keypair()[0]]), ValueError, "allow= lists"),
    (dict(backend_curve_serverkey="short"), ValueError, "backend: curve_serverkey"),
    (dict(frontend_socket_options={"linger": 5}), ValueError, "linger"),
])
def test_bad_arguments_name_the_argument(kwargs, error, match):
    args = {"frontend": "tcp://127.0.0.1:*", "backend": "tcp://127.0.0.1:*"}
    for key in ("frontend", "backend"):
        if key in kwargs:
            args[key] = kwargs.pop(key)
    with upcall.Bus() as bus:
        with pytest.raises(error, match=match):
            bus.proxy(args["frontend"], args["backend"], **kwargs)


def test_an_address_in_use_is_an_oserror(tmp_path):
    with upcall.Bus() as bus:
        with bus.proxy("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as first:
            with pytest.raises(OSError):
                bus.proxy(first.frontend, "tcp://127.0.0.1:*")


def test_stamped_messages_keep_their_stamps_through_the_proxy():
    with upcall.Bus() as bus:
        with bus.proxy("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as proxy:
            got = Collector()
            sub = bus.subscribe(proxy.backend, got, topics=[b"t"])
            pub = bus.publisher(proxy.frontend, bind=False, stamp=True)
            pub.wait_subscriptions(1, timeout=DEADLINE)
            for i in range(10):
                pub.send(b"t", i)
            got.wait(10)
            assert got.items == list(range(10))
            stream = sub.streams()[pub.stream_of(b"t")]
            assert (stream["received"], stream["lost"], stream["gaps"]) == (10, 0, 0)
            assert sub.stats["unstamped"] == 0
