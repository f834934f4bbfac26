"""Bad input from a foreign peer never hurts a subscription.

A pyzmq peer (PUSH to an upcall PULL, PUB to an upcall SUB) sends every kind
of malformed message, with a good message before and after each one:
random bytes, truncated msgpack, the reserved byte 0xc1, a 2 GiB length
prefix in a 10-byte frame, 10,000-deep nesting, invalid UTF-8, timestamp
exts of bad lengths, empty frames, five frames where two are expected.
Then a frame larger than max_message_size, which libzmq refuses itself (it
drops the peer's connection before the core sees a byte: docs/wire.md), and
good messages on a new connection.

Afterwards: the subscription is alive, every malformed message was counted as
a decode error and reported to on_error as an upcall.DecodeError naming the
topic, the byte offset and the reason, and every good message arrived, in
order.  For native threads, Python threads and caller delivery.
"""
import random
import re

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

import upcall
from helpers import DEADLINE, PROBE, PROBE_TOPIC, Collector, make_msg, mode_kwargs, wait_for
from bus_pair import pair
from helpers import MODES

MAX_MESSAGE_SIZE = 64 * 1024


def _random_garbage():
    rng = random.Random(5)
    while True:
        data = bytes(rng.randrange(256) for _ in range(64))
        try:
            upcall.unpackb(data)
        except upcall.DecodeError:
            return data


# name: (frames, expected reason).  Topics name the case, so a report can be
# matched to what was sent; the single-frame cases have the empty topic.
BAD = [
    ("random", [b"bad.random", _random_garbage()], None),
    ("truncated", [b"bad.truncated", upcall.packb(make_msg(7))[:-3]], None),
    ("c1", [b"bad.c1", b"\xc1"], "reserved"),
    ("len2g", [b"bad.len2g", b"\xc6\x7f\xff\xff\xff" + b"x" * 5], "length"),
    ("deep", [b"bad.deep", b"\x91" * 10000 + b"\xc0"], "depth"),
    ("utf8", [b"bad.utf8", b"\x82\xa1a\x01\xa3k\xff\xfe\x02"], "utf8"),
    ("ts_len5", [b"bad.ts5", b"\xc7\x05\xff" + b"\x00" * 5], "timestamp"),
    ("ts_len1", [b"bad.ts1", b"\x91\xd4\xff\x00"], "timestamp"),
    ("ext_len_past_end", [b"bad.ext", b"\xc8\xff\xff\x05abc"], "length"),
    ("empty_payload", [b"bad.empty", b""], "truncated"),
    ("empty_frame", [b""], "truncated"),
    ("trailing", [b"bad.trailing", b"\x01\x02"], "trailing"),
    ("five_frames", [b"bad.five", upcall.packb(1), b"a", b"b", b"c"], "oob_unused"),
]


def _expected_error(frames):
    """(topic, offset, reason) the report must carry for these frames."""
    topic = frames[0] if len(frames) > 1 else b""
    if len(frames) > 2:
        # frames after the payload that no out-of-band reference names
        return topic, len(frames[1]), "oob_unused"
    payload = frames[-1]
    with pytest.raises(upcall.DecodeError) as info:
        upcall.unpackb(payload)
    return topic, info.value.offset, info.value.reason


class Errors:
    def __init__(self):
        self.items = []

    def __call__(self, exc, raw):
        self.items.append((exc, raw))


def _good(i):
    return [b"good.%d" % i, upcall.packb(make_msg(i))]


def _monitored_peer(zctx, kind, endpoint):
    sock = zctx.socket(zmq.PUSH if kind == "pull" else zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    sock.connect(endpoint)
    return sock, monitor


def _events(monitor):
    events = []
    while monitor.poll(0):
        events.append(recv_monitor_message(monitor)["event"])
    return events


def _wait_event(monitor, event, pump):
    """Wait for a monitor event (e.g. the receiver dropping the connection)."""
    def seen():
        pump()
        while monitor.poll(0):
            if recv_monitor_message(monitor)["event"] == event:
                return True
        monitor.poll(10)
        return False
    wait_for(seen, what="monitor event %d" % event)


@pytest.mark.parametrize("kind", ["pull", "sub"])
@pytest.mark.parametrize("mode", ["native", "python", "caller"])
def test_bad_input_is_reported_and_good_messages_arrive(endpoints, kind, mode):
    endpoint = endpoints("ipc")
    got = Collector()
    errors = Errors()
    zctx = zmq.Context()
    try:
        with upcall.Bus() as bus:
            sub = bus.subscribe(endpoint, got, kind=kind, bind=True, with_topic=True,
                                on_error=errors, max_message_size=MAX_MESSAGE_SIZE,
                                **mode_kwargs(mode))
            if mode == "caller":
                def pump():
                    sub.poll(timeout=0.005)
            else:
                def pump():
                    pass

            def warm_up(sock):
                # PUB/SUB: the peer drops everything until the subscription has
                # reached it; probes (counted apart by the collector) until one
                # arrives.  PUSH queues, so no probe is needed.
                if kind == "sub":
                    before = got.probes

                    def arrived():
                        sock.send_multipart([PROBE_TOPIC, upcall.packb(PROBE)])
                        pump()
                        with got.cond:
                            return got.cond.wait_for(lambda: got.probes > before, 0.01)
                    wait_for(arrived, what="a probe through the new connection")

            # 1. Every malformed message, each between two good ones, on one connection.
            peer, monitor = _monitored_peer(zctx, kind, endpoint)
            warm_up(peer)
            expected = []
            n_good = 0
            for name, frames, _ in BAD:
                peer.send_multipart(_good(n_good))
                expected.append((b"good.%d" % n_good, make_msg(n_good)))
                n_good += 1
                peer.send_multipart(frames)
            peer.send_multipart(_good(n_good))
            expected.append((b"good.%d" % n_good, make_msg(n_good)))
            n_good += 1

            def all_in():
                pump()
                return len(got) >= len(expected) and len(errors.items) >= len(BAD)
            wait_for(all_in, what=lambda: "%d/%d good, %d/%d errors" % (
                len(got), len(expected), len(errors.items), len(BAD)))

            assert got.items == expected
            for (name, frames, reason), (exc, raw) in zip(BAD, errors.items):
                topic, offset, want_reason = _expected_error(frames)
                assert isinstance(exc, upcall.DecodeError), (name, exc)
                assert exc.topic == topic, name
                assert exc.offset == offset, (name, exc.offset, offset)
                assert exc.reason == want_reason, (name, exc.reason)
                if reason is not None:
                    assert exc.reason == reason, (name, exc.reason)
                assert raw == frames[1 if len(frames) > 1 else 0], name
                text = str(exc)
                assert repr(topic) in text, (name, text)
                if offset is not None:
                    assert "byte %d" % offset in text, (name, text)
                else:
                    assert "%d frames" % len(frames) in text, (name, text)
            wait_for(lambda: sub.stats["decode_errors"] == len(BAD),
                     what=lambda: "decode_errors %s" % sub.stats)
            stats = sub.stats
            assert stats["callback_errors"] == 0
            assert stats["dropped"] == 0

            # 2. A frame over max_message_size: libzmq drops the connection
            # before the core sees the message, so nothing counts it.
            peer.send_multipart([b"big", b"\x00" * (MAX_MESSAGE_SIZE + 1)])
            _wait_event(monitor, zmq.EVENT_DISCONNECTED, pump)
            monitor.close()
            peer.close()
            assert not sub.closed

            # 3. The subscription still works: good messages on a new connection.
            peer2, monitor2 = _monitored_peer(zctx, kind, endpoint)
            warm_up(peer2)
            for _ in range(10):
                peer2.send_multipart(_good(n_good))
                expected.append((b"good.%d" % n_good, make_msg(n_good)))
                n_good += 1
            # A message of exactly max_message_size passes.
            at_limit = upcall.packb(b"y" * (MAX_MESSAGE_SIZE - 3))
            assert len(at_limit) == MAX_MESSAGE_SIZE
            peer2.send_multipart([b"at-limit", at_limit])
            expected.append((b"at-limit", b"y" * (MAX_MESSAGE_SIZE - 3)))

            def rest_in():
                pump()
                return len(got) >= len(expected)
            wait_for(rest_in, what=lambda: "%d/%d good; stats %s; new peer's events %s" % (
                len(got), len(expected), sub.stats, _events(monitor2)))
            monitor2.close()
            peer2.close()

            assert got.items == expected
            assert not sub.closed
            assert sub.stats["decode_errors"] == len(BAD)
            assert len(errors.items) == len(BAD)
            # received = every good message + every probe + every malformed
            # one; the oversized frame is not among them.  (The stats of a
            # batch are added when it ends: wait for them to settle.)
            wait_for(lambda: sub.stats["delivered"] == len(expected) + got.probes,
                     what=lambda: "delivered %s" % sub.stats)
            stats = sub.stats
            assert stats["received"] == stats["delivered"] + len(BAD)
            sub.close(timeout=DEADLINE)
    finally:
        zctx.destroy(linger=0)


@pytest.mark.parametrize("mode", ["native", "python", "caller"])
def test_max_message_size_counts_per_frame(endpoints, mode):
    """ZMQ_MAXMSGSIZE applies to each frame, not to the whole message: a
    message of several frames each under the limit passes (here: as a
    frame-count decode error, since it has more than two frames)."""
    endpoint = endpoints("ipc")
    got = Collector()
    errors = Errors()
    zctx = zmq.Context()
    try:
        with upcall.Bus() as bus:
            sub = bus.subscribe(endpoint, got, kind="pull", bind=True, on_error=errors,
                                max_message_size=1000, **mode_kwargs(mode))
            pump = (lambda: sub.poll(timeout=0.005)) if mode == "caller" else (lambda: None)
            push = zctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(endpoint)
            push.send_multipart([b"t", upcall.packb("x" * 900), b"z" * 900])
            push.send_multipart([b"t", upcall.packb("ok")])

            def arrived():
                pump()
                return len(got) >= 1 and len(errors.items) >= 1
            wait_for(arrived)
            assert got.items == ["ok"]
            assert errors.items[0][0].reason == "oob_unused"
            push.close()
            sub.close(timeout=DEADLINE)
    finally:
        zctx.destroy(linger=0)


# --- decode errors ----------------------------------------------------------------

# A 4-element array whose 4th element is the reserved byte 0xc1, at offset 19.
BAD_PAYLOAD = b"\x94" + b"\xa5hello" * 3 + b"\xc1"
BAD_OFFSET = 19
BAD_TOPIC = b"badtopic"


@pytest.mark.parametrize("mode", MODES)
def test_decode_error_between_good_messages_on_error(endpoints, mode):
    errors = []
    col = Collector()
    with pair(endpoints, "inproc", "pull", mode, col, on_error=lambda e, m: errors.append(e)) \
            as (pub, sub, pump):
        pub.send(b"ok", {"first": 1})
        pub.send_packed(BAD_TOPIC, BAD_PAYLOAD)
        pub.send(b"ok", {"second": 2})
        col.wait(2, pump=pump)
        wait_for(lambda: sub.stats["decode_errors"] == 1, what=lambda: repr(sub.stats))
        assert col.items == [{"first": 1}, {"second": 2}]
        assert len(errors) == 1
        exc = errors[0]
        assert isinstance(exc, upcall.DecodeError), repr(exc)
        text = str(exc)
        assert re.search(r"\b%d\b" % BAD_OFFSET, text), "no byte offset in %r" % text
        assert "badtopic" in text, "no topic in %r" % text
        wait_for(lambda: sub.stats["delivered"] == 2, what=lambda: repr(sub.stats))
        assert sub.stats["callback_errors"] == 0


@pytest.mark.parametrize("payload", [b"", b"\x92\x01", b"\xdb\xff\xff\xff\xff",
                                     b"\x91" * 100_000, b"\x01\x02"])
def test_malformed_payloads_never_stop_delivery(endpoints, payload):
    # empty, truncated, length past the end, nesting too deep, trailing bytes
    errors = []
    col = Collector()
    with pair(endpoints, "inproc", "pull", "native", col,
              on_error=lambda e, m: errors.append(e)) as (pub, sub, _):
        pub.send(b"ok", 1)
        pub.send_packed(b"bad", payload)
        pub.send(b"ok", 2)
        col.wait(2)
        wait_for(lambda: sub.stats["decode_errors"] == 1, what=lambda: repr(sub.stats))
    assert col.items == [1, 2]
    assert len(errors) == 1 and isinstance(errors[0], upcall.DecodeError), errors
