"""What a peer's subscription messages cost a pub publisher: they are read
as they arrive (on the monitor thread), whatever the publisher sends, so a
peer repeating one subscribe message cannot make libzmq queue them without
bound."""
import pytest
import zmq

import upcall
from helpers import wait_for

pytestmark = pytest.mark.threads

REPEATS = 20_000


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_subscription_messages_are_read_without_sends(endpoints, transport):
    ctx = zmq.Context()
    try:
        with upcall.Bus() as bus:
            ep = endpoints(transport)
            pub = bus.publisher(ep, bind=True)
            xsub = ctx.socket(zmq.XSUB)
            xsub.setsockopt(zmq.SNDHWM, 0)
            xsub.connect(pub.last_endpoint)
            for _ in range(REPEATS):
                xsub.send(b"\x01spam")
            # The publisher sends nothing and nobody waits on it: the
            # messages are read anyway, every one of them.
            wait_for(lambda: pub.stats["subscription_messages"] >= REPEATS,
                     what="the subscription messages read")
            assert pub.stats["subscription_messages"] == REPEATS
            assert pub.wait_subscriptions(0, timeout=0) == REPEATS
            xsub.close(linger=0)
            pub.close()
    finally:
        ctx.destroy(linger=0)
