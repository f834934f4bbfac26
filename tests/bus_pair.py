"""Publisher and subscription pairs for the end-to-end bus tests (one Bus
or two, per transport, kind and delivery mode), and the checks on what they
deliver."""
import contextlib

import upcall
from helpers import Collector, Sender, make_msg, make_pump, mode_kwargs, wait_for, warm_up

# Assumption (the .pyi does not name the type): using a closed Subscription,
# Publisher or Bus, or polling a thread-mode subscription, is a misuse of the
# object's state and raises ValueError, like I/O on a closed file.
STATE_ERRORS = ValueError


def assert_same_sequence(got, expected):
    """got == expected, with a readable message for long sequences."""
    if got == expected:
        return
    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            raise AssertionError(
                "sequences differ first at index %d of %d (got %d items): got %r, expected %r"
                % (i, len(expected), len(got), g, e))
    raise AssertionError("got %d items, expected %d (common prefix equal); extra/last: %r"
                         % (len(got), len(expected), (got[len(expected):] or got[-3:])[:3]))


def wait_stats(sub, **expected):
    """Wait until sub.stats has the expected values; return the stats."""
    last = {}

    def check():
        last.update(sub.stats)
        return all(last[k] == v for k, v in expected.items())
    wait_for(check, what=lambda: "stats %r to reach %r" % (last, expected))
    return dict(last)


@contextlib.contextmanager
def pair(endpoints, transport, kind, mode, target, *, sub_bind=False, **sub_kw):
    """Open a publisher and a subscription connected over ``transport``.

    inproc uses one Bus for both (inproc needs one zmq context); ipc and tcp
    use two buses.  SUB gets rcvhwm=0 and PUB sndhwm=0 (unlimited).  Yields
    (pub, sub, pump) with pump None in thread mode.
    """
    ep = endpoints(transport)
    kw = dict(mode_kwargs(mode))
    kw.update(sub_kw)
    pub_kw = {}
    if kind == "sub":
        kw.setdefault("rcvhwm", 0)
        pub_kw["sndhwm"] = 0
    pub_kind = "pub" if kind == "sub" else "push"
    with contextlib.ExitStack() as stack:
        sbus = stack.enter_context(upcall.Bus())
        pbus = sbus if transport == "inproc" else stack.enter_context(upcall.Bus())
        if sub_bind:
            sub = stack.enter_context(sbus.subscribe(ep, target, kind=kind, bind=True, **kw))
            pub = stack.enter_context(pbus.publisher(ep, kind=pub_kind, bind=False, **pub_kw))
        else:
            pub = stack.enter_context(pbus.publisher(ep, kind=pub_kind, bind=True, **pub_kw))
            sub = stack.enter_context(sbus.subscribe(ep, target, kind=kind, **kw))
        pump = make_pump(sub) if mode == "caller" else None
        yield pub, sub, pump


def stream(endpoints, mode, kind, transport, n, *, sub_bind=False, **sub_kw):
    """Publish n messages and check each arrives once, in order, equal."""
    col = Collector()
    with pair(endpoints, transport, kind, mode, col, sub_bind=sub_bind, **sub_kw) as (pub, sub, pump):
        if kind == "sub":
            warm_up(pub, col, pump)
        expected = [make_msg(i) for i in range(n)]
        sender = Sender(pub, [(b"data", m) for m in expected])
        sender.start()
        col.wait(n, pump=pump)
        sender.finish()
        # The counters are updated around the target calls (per batch): wait
        # for them to account for every call made so far.
        stats = wait_stats(sub, received=col.calls, delivered=col.calls)
        assert_same_sequence(col.items, expected)
        assert stats["received"] == stats["delivered"] == n + col.probes
        assert stats["decode_errors"] == 0
        assert stats["callback_errors"] == 0
        assert stats["dropped"] == 0
        assert 1 <= stats["batches"] <= stats["delivered"]
    assert sub.closed
