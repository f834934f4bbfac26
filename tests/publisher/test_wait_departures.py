"""wait_subscriptions counts the subscriptions that can receive now: a
subscriber whose departure has reached the publisher is not counted, even
while its unsubscriptions are still on their way inside libzmq, and even
when another one comes in its place at once (the slow joiner's cure must
not count the departed).

What no publisher can see is a departure that has not reached it yet (the
subscriber's close is still in flight): the tests wait for the publisher's
connection count to drop, as the publisher would see it."""
import pytest

import upcall
from helpers import DEADLINE, Collector, wait_for

pytestmark = pytest.mark.threads

TRIALS = 10


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_close_then_subscribe_again_gets_the_first_message(endpoints, transport):
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints(transport), bind=True)
        for trial in range(TRIALS):
            first = bus.subscribe(pub.last_endpoint, lambda m: None)
            assert pub.wait_subscriptions(1, timeout=DEADLINE) == 1
            first.close()
            wait_for(lambda: pub.peers == 0, what="the departure seen by the publisher")
            col = Collector()
            second = bus.subscribe(pub.last_endpoint, col)
            assert pub.wait_subscriptions(1, timeout=DEADLINE) == 1
            pub.send(b"", trial)
            col.wait(1)
            second.close()
            wait_for(lambda: pub.peers == 0, what="the departure seen by the publisher")
            assert col.items == [trial], f"trial {trial}"


def test_many_prefixes_of_a_departed_subscriber_are_not_counted(endpoints):
    n = 10_000
    with upcall.Bus() as bus:
        pub = bus.publisher(endpoints("tcp"), bind=True)
        a = bus.subscribe(pub.last_endpoint, lambda m: None,
                          topics=[b"a.%05d." % i for i in range(n)])
        assert pub.wait_subscriptions(n, timeout=DEADLINE) == n
        a.close()
        wait_for(lambda: pub.peers == 0, what="the departure seen by the publisher")
        col = Collector()
        b = bus.subscribe(pub.last_endpoint, col, topics=[b"b.%05d." % i for i in range(n)])
        # The departed subscriber's prefixes are gone from the count, and
        # every one of b's is in it: no more, no fewer.
        assert pub.wait_subscriptions(n, timeout=DEADLINE) == n
        probes = [b"b.%05d." % i for i in range(0, n, n // 5)]
        for i, topic in enumerate(probes):
            pub.send(topic, i)
        col.wait(len(probes))
        assert sorted(col.items) == list(range(len(probes)))
        assert pub.wait_subscriptions(0, timeout=0) == n
        b.close()
