"""Where a publisher's endpoint comes from: it connects unless asked to bind
(as subscribe() does, and as pyzmq and NATS users expect), and an awaited
send that nothing will ever take says so in the log."""
import asyncio
import logging

import pytest

import upcall
import upcall.aio
from helpers import Collector, wait_for

pytestmark = pytest.mark.threads


def test_publisher_connects_by_default():
    assert upcall.PublisherOptions().bind is False
    col = Collector()
    with upcall.Bus() as bus:
        sub = bus.subscribe("tcp://127.0.0.1:*", col, kind="pull", bind=True)
        # A default publisher connects to the bound PULL: the bind it used to
        # make failed with "address in use".
        with bus.publisher(sub.last_endpoint, kind="push") as pub:
            pub.send(b"t", {"i": 1}, timeout=10)
            col.wait(1)
    assert col.items == [{"i": 1}]


def test_publisher_binds_when_asked():
    col = Collector()
    with upcall.Bus() as bus:
        with bus.publisher("tcp://127.0.0.1:*", kind="push", bind=True) as pub:
            bus.subscribe(pub.last_endpoint, col, kind="pull")
            pub.send(b"t", 7, timeout=10)
            col.wait(1)
    assert col.items == [7]


def test_send_async_with_no_peer_ever_is_logged(monkeypatch, caplog):
    monkeypatch.setattr(upcall.aio, "SEND_WAIT_WARNING", 0.05)
    caplog.set_level(logging.WARNING, logger="upcall")

    def warnings():
        return [r for r in caplog.records if "send_async has waited" in r.getMessage()]

    async def main(pub):
        task = asyncio.ensure_future(pub.send_async(b"t", {"x": 1}))
        try:
            for _ in range(2000):
                if warnings():
                    break
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        # A second wait on the same publisher is not said again.
        task = asyncio.ensure_future(pub.send_async(b"t", {"x": 2}))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with upcall.Bus() as bus:
        # Bound, and nothing ever connects: nothing takes the send.  (A
        # connecting PUSH queues for its peer-to-be instead.)
        with bus.publisher("tcp://127.0.0.1:*", kind="push", bind=True, linger=0) as pub:
            asyncio.run(main(pub))
    found = warnings()
    assert len(found) == 1, [r.getMessage() for r in caplog.records]
    assert "no peer connected" in found[0].getMessage()
    assert "timeout=" in found[0].getMessage()
