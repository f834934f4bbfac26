"""Decompression bombs where decoded messages are held together: a
``Handler(batches=True)`` list and an async subscription's hand-over queue.
Each message is bound by max_message_size (64 MiB by default); what one
list and one async queue hold is bound too, by max_batch_decompressed
(docs/security.md, "Decompression").  The bomb: 12 frames of a few KiB
(zstd; lz4 about 250 KiB), each decompressing to 63.9 MiB, inside the
per-message limit: 767 MiB if one list held them all."""
import asyncio

import pytest

import upcall
from aio_helpers import run, until
from helpers import wait_for

BOMBS = 12
BOMB = bytes(int(63.9 * (1 << 20)))
CODECS = [pytest.param(c, marks=pytest.mark.skipif(c not in upcall.COMPRESSION,
                                                   reason=f"built without {c}"))
          for c in ("zstd", "lz4")]


def send_bombs(bus, ep, codec):
    """The bombs queued on an inproc PUSH before its peer binds: the peer's
    first batch can hold them all."""
    pub = bus.publisher(ep, kind="push", bind=False, compression=codec)
    for i in range(BOMBS):
        pub.send(b"bomb", [i, BOMB])
    return pub


class Sizes(upcall.Handler):
    """Handler(batches=True) keeping the sizes of each list, not the lists."""

    def __init__(self):
        self.batches = True
        self.lists = []

    def on_batch(self, msgs):
        self.lists.append([(i, len(v)) for i, v in msgs])


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("limit, most", [(None, 1), (200 << 20, 3)])
def test_a_batch_list_holds_what_max_batch_decompressed_allows(endpoints, codec, limit, most):
    kw = {} if limit is None else {"max_batch_decompressed": limit}
    with upcall.Bus() as bus:
        ep = endpoints("inproc")
        send_bombs(bus, ep, codec)
        h = Sizes()
        sub = bus.subscribe(ep, h, kind="pull", bind=True, **kw)
        wait_for(lambda: sum(map(len, h.lists)) == BOMBS, what="every bomb delivered")
        # Nothing lost, nothing refused: a list ends where the next message
        # would take it past the limit.
        got = [m for lst in h.lists for m in lst]
        assert got == [(i, len(BOMB)) for i in range(BOMBS)]
        assert max(map(len, h.lists)) <= most, h.lists
        assert sub.stats["decode_errors"] == 0
        sub.close()


@pytest.mark.parametrize("codec", CODECS)
def test_an_async_queue_holds_what_max_batch_decompressed_allows(endpoints, codec):
    async def main():
        with upcall.Bus() as bus:
            ep = endpoints("inproc")
            send_bombs(bus, ep, codec)
            sub = bus.subscribe_async(ep, kind="pull", bind=True)
            seen, alive = [], []
            async for i, v in sub:
                seen.append((i, len(v)))
                del v
                # The decompressed frames alive: the queue's (one list, as it
                # holds no more than max_batch_decompressed), the list the
                # delivery thread waits to queue, and the one just taken.
                alive.append(upcall.oob_outstanding()[1])
                assert sub.stats["queued_bytes"] <= (64 << 20) + 4096
                if len(seen) == BOMBS:
                    break
            assert seen == [(i, len(BOMB)) for i in range(BOMBS)]
            assert max(alive) <= 3, alive
            assert sub.stats["decode_errors"] == 0
            await sub.aclose()
    run("asyncio", main())


def test_max_batch_decompressed_is_checked():
    with pytest.raises(ValueError, match="max_batch_decompressed must be between 1 and"):
        upcall.SubscribeOptions(max_batch_decompressed=0)
    with pytest.raises(TypeError, match="max_batch_decompressed"):
        upcall.SubscribeOptions(max_batch_decompressed="1")
    assert upcall.SubscribeOptions().max_batch_decompressed == upcall.DEFAULT_MAX_BATCH_DECOMPRESSED
