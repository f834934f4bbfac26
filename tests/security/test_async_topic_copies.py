"""What a peer can make an async subscription hold: a coalesced zmq message
of many small messages under one large topic.  The hand-over queue keeps
the topic once per zmq message (per block of records), not once per
message, and none for a consumer that did not ask for topics
(docs/security.md, "What a peer can make a subscriber hold")."""
import asyncio
import os

import pytest

import upcall
from aio_helpers import run, until

N = 16000                      # one-byte messages in one zmq message
TOPIC = b"t" * 16000           # topic and message: 16,001 bytes, a plain message
RECORD = 32                    # a queue record with a one-byte payload and no topic
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@pytest.mark.parametrize("with_topic", [False, True])
def test_a_coalesced_message_keeps_its_topic_once(endpoints, with_topic):
    async def main():
        with upcall.Bus() as bus:
            ep = endpoints("inproc")
            sub = bus.subscribe_async(ep, kind="pull", bind=True, queue_size=N,
                                      with_topic=with_topic)
            pub = bus.publisher(ep, kind="push", bind=False, max_batch=N, max_bytes=1 << 20)
            before = rss()
            pub.send_many(TOPIC, [0] * N)      # one zmq message of 32,007 bytes
            await until(lambda: sub.stats["queued"] == N, "the messages to be queued")
            grown = rss() - before
            # A copy of the topic per message was 256 MB here.
            assert grown < 64 << 20, grown
            held = sub.stats["queued_bytes"]
            if with_topic:
                assert held <= N * RECORD + 16 * len(TOPIC), held
            else:
                assert held <= N * RECORD, held
            got = []
            async for msg in sub:
                got.append(msg)
                if len(got) == N:
                    break
            if with_topic:
                assert all(t == TOPIC and m == 0 for t, m in got)
                # One bytes object per stored copy, not one per message.
                assert len({id(t) for t, _ in got}) <= 16
            else:
                assert got == [0] * N
            assert sub.stats["queued_bytes"] == 0
            await sub.aclose()
    run("asyncio", main())
