"""A program that only subscribes: delivery runs on the core's thread, and
the main thread waits for Ctrl-C with bus.wait(), the wait that cannot miss
it (README, "Waiting for Ctrl-C").

    python examples/subscriber.py        # three ticks, then the target closes the bus
    python examples/subscriber.py 0      # ticks until Ctrl-C

A publisher of its own feeds it, so that it runs anywhere; a real subscriber
connects to someone else's.
"""
import sys
import threading

import upcall

ENDPOINT = "inproc://ticks"


def main(count):
    with upcall.Bus() as bus:
        seen = 0

        def on_tick(msg):
            nonlocal seen
            seen += 1
            if seen <= 3:
                print(f"tick {msg['n']}", flush=True)
            if seen == count:
                bus.close()          # from a target: ends bus.wait() below

        bus.subscribe(ENDPOINT, on_tick, kind="pull", bind=True)
        pub = bus.publisher(ENDPOINT, kind="push", bind=False)

        def feed():
            n = 0
            try:
                while count == 0 or n < count:
                    pub.send(b"ticks", {"n": n})
                    n += 1
            except ValueError:       # the bus was closed: no more ticks
                pass

        try:
            # Ctrl-C can come as soon as ticks flow: the feeder starts inside.
            threading.Thread(target=feed, daemon=True).start()
            bus.wait()               # until the bus is closed; Ctrl-C raises here
            ended = "the bus was closed"
        except KeyboardInterrupt:
            ended = "interrupted"
    # Said once the bus is closed: no tick is printed after it (or into its line).
    print(ended)


main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
