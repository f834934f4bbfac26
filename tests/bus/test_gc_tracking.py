"""What the garbage collector sees of a delivered message, in every delivery
mode: a decoded dict of atoms is untracked (as CPython leaves such a dict),
one holding a list is tracked, and a dict of atoms that is given a container
is tracked again.  The asyncio adapter queues a plain message as its bytes
and decodes it on the event loop when it is taken (upcall/_aiter.pxi): it
must hand it out tracked exactly so, and decode nothing it drops.

Real sockets, real threads and event loops; no timing thresholds.
"""
import asyncio
import gc

import pytest

import upcall
from helpers import DEADLINE, Collector, batch_handler, make_pump, mode_kwargs, wait_for
from aio_helpers import LOOPS, flood, joined, pull_pair, run, take, until

pytestmark = pytest.mark.threads

ATOMS = {"id": 1700000000123456, "sym": "AAPL.OQ", "px": 187.25, "venue": "NASDAQ-GS/XNGS"}
NESTED = {"id": 1, "sizes": [100, 200, 300], "book": {"bid": [1.5, 2.5], "ask": [[1, 2]]}}


def check_tracking(atoms, nested, pair=None):
    assert atoms == ATOMS and nested == NESTED
    assert not gc.is_tracked(atoms)
    assert gc.is_tracked(nested)
    assert gc.is_tracked(nested["sizes"]) and gc.is_tracked(nested["book"])
    assert gc.is_tracked(nested["book"]["bid"]) and gc.is_tracked(nested["book"]["ask"][0])
    if pair is not None:        # with_topic: the (topic, msg) tuple holds a dict
        assert gc.is_tracked(pair)
    # Mutation re-tracks: a dict of atoms given a container is seen again,
    # and a cycle made through it is collected.
    atoms["self"] = [atoms]
    assert gc.is_tracked(atoms)
    del atoms["self"]


@pytest.mark.parametrize("mode", ["native", "python", "caller", "executor"])
def test_thread_delivery_tracking(endpoints, mode):
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        got = Collector()
        sub = bus.subscribe(ep, got, kind="pull", bind=True, **mode_kwargs(mode))
        pub = bus.publisher(ep, kind="push", bind=False)
        pub.send(b"t", ATOMS)
        pub.send(b"t", NESTED)
        got.wait(2, pump=make_pump(sub) if mode == "caller" else None)
        check_tracking(*got.items)
        sub.close()


def test_handler_batch_tracking(endpoints):
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        keep = batch_handler()     # whole batches: the vtable path the adapter uses
        sub = bus.subscribe(ep, keep, kind="pull", bind=True)
        pub = bus.publisher(ep, kind="push", bind=False)
        pub.send(b"t", ATOMS)
        pub.send(b"t", NESTED)
        wait_for(lambda: len(keep.got) >= 2, what="both messages")
        check_tracking(*keep.got)
        sub.close()


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("how", ["messages", "batches", "with_topic"])
def test_asyncio_tracking(endpoints, loop_kind, how):
    # Queued first, then handed out: tracked as the decoder made them.
    async def main():
        with upcall.Bus() as bus:
            ep = endpoints("inproc")
            sub, pub = pull_pair(bus, ep, pub_kw=dict(sndhwm=0), with_topic=how == "with_topic")
            flood(pub, [(b"t", ATOMS), (b"t", NESTED)]).join(DEADLINE)
            await until(lambda: sub.stats["queued"] == 2, "both to be queued")
            if how == "batches":
                got = []
                async for batch in sub.batches():
                    got += batch
                    if len(got) == 2:
                        break
                check_tracking(*got)
            elif how == "with_topic":
                (t1, atoms), pair = await take(sub, 2)
                check_tracking(atoms, pair[1], pair)
            else:
                check_tracking(*await take(sub, 2))
            await sub.aclose()
    run(loop_kind, main())


def recording_decoder():
    """The built-in decoder, recording every object it makes: (made, decoder)."""
    made = []
    decode = upcall.Decoder().decode

    def decoder(payload):
        obj = decode(payload)
        made.append(obj)
        return obj
    return made, decoder


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_asyncio_queued_messages_wait_undecoded(endpoints, loop_kind):
    # While queued, a plain message is its bytes: the event loop decodes it
    # when the consumer takes it, so there is nothing queued for the
    # collector to walk; a message handed out is tracked as the decoder
    # made it.
    n = 50
    made, decoder = recording_decoder()

    async def main():
        with upcall.Bus() as bus:
            ep = endpoints("inproc")
            sub, pub = pull_pair(bus, ep, pub_kw=dict(sndhwm=0), batch=n, decoder=decoder)
            flood(pub, ((b"t", {"i": i, "sizes": [i]}) for i in range(n))).join(DEADLINE)
            await until(lambda: sub.stats["queued"] == n, "the flood to be queued")
            assert made == []
            first = await sub.__anext__()
            assert first == {"i": 0, "sizes": [0]} and made == [first]
            assert gc.is_tracked(first) and gc.is_tracked(first["sizes"])
            # Closing discards the queue: nothing more is decoded.
            await sub.aclose()
            assert len(made) == 1
            assert sub.stats["dropped"] == n - 1
    run(loop_kind, main())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_asyncio_dropped_messages_are_never_decoded(endpoints, loop_kind):
    # A kind="sub" queue that is full drops a plain message as bytes: the
    # decoder never sees it, no object is made for it.
    made, decoder = recording_decoder()

    async def main():
        with upcall.Bus() as bus:
            ep = endpoints("inproc")
            sub = bus.subscribe_async(ep, bind=True, queue_size=2, rcvhwm=0, decoder=decoder)
            pub = bus.publisher(ep, bind=False, sndhwm=0)
            await joined(sub, pub, b"t", -1)      # slow joiner, without consuming
            for i in range(20):
                pub.send(b"t", i)
            await until(lambda: sub.stats["received"] >= 21
                        and sub.stats["dropped"] == sub.stats["received"] - 2,
                        lambda: f"the flood to be accounted for: {sub.stats}")
            assert made == [] and sub.stats["queued"] == 2
            kept = await take(sub, 2)           # the oldest: a probe, then a probe or 0
            assert kept[0] == -1 and kept[1] in (-1, 0)
            assert made == kept
            await sub.aclose()
    run(loop_kind, main())
