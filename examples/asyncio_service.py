"""An asyncio service on upcall: trades in, running VWAP per symbol out.

    feed (PUSH, send_async) --> service: async for trade in bus.subscribe_async(...)
                                 --> PUB "vwap.<sym>" (send_async) --> a client's
                                     async for (topic, msg) in bus.subscribe_async(...)

Everything runs in one process over inproc:// endpoints so the example is
self-contained; with tcp:// endpoints the three parts could be three
processes.  Uses uvloop when it is installed.
"""
import asyncio
import collections

import upcall

TRADES = "inproc://trades"
VWAP = "inproc://vwap"
N_TRADES = 3000
SYMBOLS = ["AAPL", "MSFT", "NVDA"]


async def feed(bus):
    """Publish N_TRADES trades; send_async never blocks the event loop, even
    when the service falls behind and the high-water mark is reached."""
    with bus.publisher(TRADES, kind="push", bind=False, sndhwm=100) as push:
        for i in range(N_TRADES):
            sym = SYMBOLS[i % len(SYMBOLS)]
            await push.send_async(b"trade", {"sym": sym, "px": 100.0 + i % 7, "qty": 1 + i % 5})
        await push.send_async(b"trade", {"sym": None})          # end of the feed


async def service(bus, ready):
    """Consume trades (backpressure: a PULL subscription's queue is bounded,
    so a slow service slows the feed down instead of growing without limit)
    and publish each symbol's running VWAP."""
    notional = collections.Counter()
    volume = collections.Counter()
    # sndhwm=0: the client must see every symbol's last update
    with bus.publisher(VWAP, sndhwm=0, bind=True) as out:
        async with bus.subscribe_async(TRADES, kind="pull", bind=True,
                                       queue_size=1000) as trades:
            ready.set()
            async for trade in trades:
                sym = trade["sym"]
                if sym is None:
                    break
                notional[sym] += trade["px"] * trade["qty"]
                volume[sym] += trade["qty"]
                await out.send_async(f"vwap.{sym}",
                                     {"sym": sym, "vwap": notional[sym] / volume[sym]})
            stats = trades.stats
        print(f"service: {stats['delivered']} trades in {stats['batches']} batches, "
              f"{stats['wakeups']} event-loop wake-ups, {stats['dropped']} dropped")
        await out.send_async(b"vwap.end", None)


async def client(bus, subscribed):
    last = {}
    async with bus.subscribe_async(VWAP, topics=[b"vwap."], with_topic=True,
                                   rcvhwm=0) as updates:
        subscribed.set()
        async for topic, msg in updates:
            if topic == b"vwap.end":
                break
            last[msg["sym"]] = msg["vwap"]
    for sym in sorted(last):
        print(f"client: {sym} vwap {last[sym]:.4f}")


async def main():
    with upcall.Bus() as bus:
        ready, subscribed = asyncio.Event(), asyncio.Event()
        client_task = asyncio.ensure_future(client(bus, subscribed))
        await subscribed.wait()
        service_task = asyncio.ensure_future(service(bus, ready))
        await ready.wait()
        # PUB/SUB: a subscriber that has just connected may miss the first
        # messages ("slow joiner"); over inproc a short pause is enough here.
        await asyncio.sleep(0.1)
        await feed(bus)
        await service_task
        await asyncio.wait_for(client_task, 30)


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())
