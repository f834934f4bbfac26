"""Instructions per message to drain a pre-queued flood, one bus row at a time, for callgrind.

The --bus table's CPU per message moves with the machine's load (a shared
2-vCPU VM); instruction counts do not.  This runs one throughput run of a
``bench/bus.py`` row (the same FloodRun: a peer process queues N messages,
then this process binds and drains them) so that callgrind can count what
this process executes, every thread included (the peer is another process
and is not counted).  Run it for two N and divide the difference by the
difference in N, so start-up, the peer's commands and teardown cancel out:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python bench/drain_cost.py MODE TRANSPORT N

MODE: a --bus row (typed, pyzmq+typed, asyncio, zmq.asyncio, ...);
TRANSPORT: ipc or tcp.  callgrind runs one thread at a time, so this is the
CPU work per message, not what two cores make of it in parallel.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import bus  # noqa: E402
from bench.peer import PeerProcess  # noqa: E402


def main(mode: str, transport: str, n: int) -> None:
    if transport not in ("ipc", "tcp"):
        raise SystemExit("drain_cost: the transport must be ipc or tcp (a peer process)")
    opts = argparse.Namespace(quick=True, bus_n=n, bus_modes=mode, bus_transports=transport)
    b = bus.BusBench(opts)
    if b.modes != [mode]:
        raise SystemExit(f"drain_cost: mode {mode!r} cannot run here: {b.notes}")
    b.peer = PeerProcess(None)
    try:
        run = bus.FloodRun(b, transport, mode)
        run.prepare()
        res = run.run()
    finally:
        b.peer.close()
        b.endpoints.cleanup()
    if res["lost"]:
        raise SystemExit(f"drain_cost: {res['lost']} of {n} messages lost")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
