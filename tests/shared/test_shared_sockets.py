"""Shared sockets: many bus.subscribe() calls to one endpoint share one
SUB socket and one receive loop, which hands each message in C to every
subscription whose prefix matches (csrc/sub_shared.c, upcall/_shared.pxi)."""
import os
import signal
import subprocess
import sys
import threading

import pytest

import upcall
from upcall.handler import Counter
from upcall.native import Count, FieldFilter

from helpers import DEADLINE, fd_count, script_env, thread_count, wait_for

pytestmark = pytest.mark.threads


class Inbox:
    """A target keeping what it got, in order, and whether it was called
    after being marked closed."""

    def __init__(self):
        self.items = []
        self.closed = False
        self.after_close = 0

    def __call__(self, msg):
        if self.closed:
            self.after_close += 1
        self.items.append(msg)


def _pub(bus):
    pub = bus.publisher("tcp://127.0.0.1:*", sndhwm=0, bind=True)
    return pub, pub.last_endpoint


def test_ten_thousand_subscriptions_one_socket_one_thread():
    S = 10_000
    with upcall.Bus() as bus:
        pub, ep = _pub(bus)
        # A few first: the shared socket and its thread exist from then on.
        inboxes = [Inbox() for _ in range(S)]
        subs = [bus.subscribe(ep, inboxes[i], topics=[b"t%05d." % i], rcvhwm=0)
                for i in range(10)]
        pub.wait_subscriptions(10, timeout=DEADLINE)
        pub.send(b"t00000.", "warm")
        wait_for(lambda: inboxes[0].items == ["warm"])
        inboxes[0].items.clear()
        threads, fds = thread_count(), fd_count()
        subs += [bus.subscribe(ep, inboxes[i], topics=[b"t%05d." % i], rcvhwm=0)
                 for i in range(10, S)]
        # Overlapping prefixes: every match gets the message.
        wide = Inbox()            # t000 matches t00000. .. t00099.
        everything = Inbox()      # b"" matches every topic
        subs.append(bus.subscribe(ep, wide, topics=[b"t000"], rcvhwm=0))
        subs.append(bus.subscribe(ep, everything, topics=[b""], rcvhwm=0))
        # One socket, one receive thread, whatever the number of subscriptions
        # (no more than before: in a shared test process, what earlier tests
        # left to the collector may close meanwhile).
        assert thread_count() <= threads
        assert fd_count() <= fds
        assert len({s.thread_name for s in subs}) == 1
        # The publisher sees the union of the prefixes: one SUB socket.
        pub.wait_subscriptions(S + 2, timeout=DEADLINE)
        for r in range(2):
            for i in range(S):
                pub.send(b"t%05d.x" % i, [i, r])
        wait_for(lambda: len(everything.items) == 2 * S, what="every message")
        wait_for(lambda: all(len(b.items) == 2 for b in inboxes), what="every subscription")
        for i, b in enumerate(inboxes):
            assert b.items == [[i, 0], [i, 1]], i
        wait_for(lambda: len(wide.items) == 200)
        assert sorted(map(tuple, wide.items)) == sorted((i, r) for i in range(100) for r in range(2))
        assert subs[5].stats["received"] == subs[5].stats["delivered"] == 2
        assert subs[-1].stats["delivered"] == 2 * S
        assert thread_count() <= threads


def test_same_prefix_counted_unsubscribe_keeps_the_other():
    with upcall.Bus() as bus:
        pub, ep = _pub(bus)
        a, b = Inbox(), Inbox()
        sa = bus.subscribe(ep, a, topics=[b"px"])
        sb = bus.subscribe(ep, b, topics=[b"px"])
        assert sa.thread_name == sb.thread_name
        pub.wait_subscriptions(1, timeout=DEADLINE)
        pub.send(b"px1", 1)
        wait_for(lambda: a.items == [1] and b.items == [1])
        sa.unsubscribe(b"px")     # b still needs px: the socket keeps it
        pub.send(b"px2", 2)
        wait_for(lambda: b.items == [1, 2])
        sa.subscribe(b"qq")
        sa.close()                # its prefix qq goes, px stays
        pub.send(b"px3", 3)
        wait_for(lambda: b.items == [1, 2, 3])
        assert a.items == [1]
        assert sb.topics == (b"px",)


def test_runtime_subscribe_and_close_during_flood():
    stay_n, churn_n = 50, 1000
    with upcall.Bus() as bus:
        pub, ep = _pub(bus)
        stay = [Inbox() for _ in range(stay_n)]
        stay_subs = [bus.subscribe(ep, stay[i], topics=[b"s%03d." % i], rcvhwm=0)
                     for i in range(stay_n)]
        pub.wait_subscriptions(stay_n, timeout=DEADLINE)
        rounds = 200

        def flood():
            for r in range(rounds):
                for i in range(stay_n):
                    pub.send(b"s%03d." % i, r)
                for j in range(0, churn_n, 10):
                    pub.send(b"c%04d." % j, r)

        sender = threading.Thread(target=flood)
        sender.start()
        churned = []
        try:
            for j in range(churn_n):
                box = Inbox()
                sub = bus.subscribe(ep, box, topics=[b"c%04d." % j], rcvhwm=0)
                churned.append((box, sub))
                if j % 3 == 0:
                    old_box, old_sub = churned[j // 3]
                    old_sub.close()
                    old_box.closed = True
        finally:
            sender.join()
        for i in range(stay_n):
            wait_for(lambda: len(stay[i].items) == rounds, what=f"stay {i}")
            assert stay[i].items == list(range(rounds))
        assert sum(box.after_close for box, _ in churned) == 0
        for box, sub in churned:
            if sub.closed:
                assert box.after_close == 0
        for s in stay_subs:
            st = s.stats
            assert st["received"] == st["delivered"] == rounds


class Recorder(upcall.Handler):
    def __init__(self):
        self.got = []

    def on_message(self, msg):
        self.got.append(msg)


def test_every_target_kind_on_a_shared_socket():
    import asyncio

    async def main(bus, pub, ep):
        got = []
        cb = Inbox()
        rec = Recorder()
        counter = Counter(batches=True)
        ff_target = Inbox()
        native = FieldFilter("px", gt=100, target=ff_target)
        count = Count()
        topics = []
        subs = [bus.subscribe(ep, cb, topics=[b"k"]),
                bus.subscribe(ep, rec, topics=[b"k"]),
                bus.subscribe(ep, counter, topics=[b"k"]),
                bus.subscribe(ep, native, topics=[b"k"]),
                bus.subscribe(ep, count, topics=[b"k"]),
                bus.subscribe(ep, lambda t, m: topics.append((t, m)), topics=[b"k"],
                              with_topic=True)]
        asub = bus.subscribe_async(ep, topics=[b"k"])
        assert len({s.thread_name for s in subs}) == 1
        pub.wait_subscriptions(1, timeout=DEADLINE)
        msgs = [{"px": 50 + 25 * i} for i in range(6)]

        async def consume():
            async for m in asub:
                got.append(m)
                if len(got) == len(msgs):
                    return
        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0)
        for m in msgs:
            pub.send(b"k", m)
        await asyncio.wait_for(task, DEADLINE)
        wait_for(lambda: len(cb.items) == 6 and len(rec.got) == 6 and counter.count == 6
                 and count.messages == 6 and len(topics) == 6 and len(ff_target.items) == 3)
        assert got == cb.items == rec.got == msgs
        assert ff_target.items == [m for m in msgs if m["px"] > 100]
        assert topics == [(b"k", m) for m in msgs]
        assert subs[3].stats["filtered"] == 3 and subs[3].stats["delivered"] == 3
        await asub.aclose() if hasattr(asub, "aclose") else asub.close()
        for s in subs:
            s.close()

    with upcall.Bus() as bus:
        pub, ep = _pub(bus)
        asyncio.run(main(bus, pub, ep))


def test_own_socket_when_asked():
    with upcall.Bus() as bus:
        pub, ep = _pub(bus)
        a = bus.subscribe(ep, Inbox(), topics=[b"a"])
        b = bus.subscribe(ep, Inbox(), topics=[b"a"])
        c = bus.subscribe(ep, Inbox(), topics=[b"a"], shared=False)
        d = bus.subscribe(ep, Inbox(), topics=[b"a"], thread_factory=upcall.python_threads)
        e = bus.subscribe(ep, Inbox(), topics=[b"a"], rcvhwm=5)   # other socket options
        assert a.thread_name == b.thread_name
        assert len({a.thread_name, c.thread_name, d.thread_name, e.thread_name}) == 4
        with pytest.raises(TypeError, match="shared"):
            bus.subscribe(ep, Inbox(), shared=1)


def test_errors_stop_and_counters_per_subscription():
    errors = []

    def bad(msg):
        raise RuntimeError(msg)

    def stopper(msg):
        raise upcall.StopDelivery

    with upcall.Bus() as bus:
        pub, ep = _pub(bus)
        good = Inbox()
        s_good = bus.subscribe(ep, good, topics=[b"e"])
        s_bad = bus.subscribe(ep, bad, topics=[b"e"], on_error=lambda e, m: errors.append(m))
        s_stop = bus.subscribe(ep, stopper, topics=[b"e"])
        pub.wait_subscriptions(1, timeout=DEADLINE)
        for i in range(5):
            pub.send(b"e", i)
        wait_for(lambda: len(good.items) == 5 and len(errors) == 5)
        assert s_stop.wait(DEADLINE)          # ended by StopDelivery, alone
        assert s_stop.closed and not s_good.closed
        assert s_good.stats["delivered"] == 5
        st = s_bad.stats
        assert (st["received"], st["callback_errors"], st["delivered"]) == (5, 5, 0)
        st = s_stop.stats
        assert st["delivered"] == 1 and st["received"] == st["delivered"] + st["dropped"]
        pub.send(b"e", 9)
        wait_for(lambda: good.items[-1] == 9)


def test_close_from_own_target_and_another():
    with upcall.Bus() as bus:
        pub, ep = _pub(bus)
        box = Inbox()
        holder = {}

        def closer(msg):
            holder["self"].close()
            holder["other"].close()

        other = bus.subscribe(ep, box, topics=[b"z"])
        holder["self"] = bus.subscribe(ep, closer, topics=[b"z"])
        holder["other"] = other
        pub.wait_subscriptions(1, timeout=DEADLINE)
        pub.send(b"z", 1)
        wait_for(lambda: holder["self"].closed and other.closed)
        assert box.after_close == 0


def test_keyboard_interrupt_in_target_ends_only_that_subscription():
    hooked = []
    with upcall.Bus() as bus:
        pub, ep = _pub(bus)
        box = Inbox()

        def interrupted(msg):
            raise KeyboardInterrupt

        s_ok = bus.subscribe(ep, box, topics=[b"i"])
        s_ki = bus.subscribe(ep, interrupted, topics=[b"i"])
        s_ki.set_end_hook(hooked.append)
        pub.wait_subscriptions(1, timeout=DEADLINE)
        pub.send(b"i", 1)
        assert s_ki.wait(DEADLINE)
        wait_for(lambda: len(hooked) == 1)
        assert isinstance(hooked[0], KeyboardInterrupt)
        pub.send(b"i", 2)
        wait_for(lambda: box.items == [1, 2])
        assert not s_ok.closed


SCRIPT = r"""
import os, sys, time, upcall
bus = upcall.Bus()
pub = bus.publisher("tcp://127.0.0.1:*", sndhwm=0, bind=True)
ep = pub.last_endpoint
got = [[] for _ in range(50)]
subs = [bus.subscribe(ep, got[i].append, topics=[b"f%02d" % i]) for i in range(50)]
pub.wait_subscriptions(50, timeout=30)
pid = os.fork()
if pid == 0:
    assert all(s.closed for s in subs)
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
for i in range(50):
    pub.send(b"f%02d" % i, i)
deadline = time.monotonic() + 30
while any(len(g) < 1 for g in got) and time.monotonic() < deadline:
    time.sleep(0.01)
assert [g for g in got] == [[i] for i in range(50)], got
print("ok", flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)            # leaves the bus open: the exit hook closes it
print("ready", flush=True)
bus.wait()
"""


@pytest.mark.parametrize("how", ["exit", "sigint"])
def test_fork_exit_and_ctrl_c(tmp_path, how):
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, how], cwd=str(tmp_path),
                         env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    if how == "sigint":
        for line in p.stdout:
            if line.strip() == "ready":
                break
        p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=DEADLINE)
    assert "ok" in out or how == "sigint", (out, err)
    if how == "exit":
        assert p.returncode == 0, err
    else:
        assert p.returncode != 0 and "KeyboardInterrupt" in err, err
