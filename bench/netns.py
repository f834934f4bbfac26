"""A rate-limited link for the benchmark: two network namespaces, one veth pair.

    with RateLimitedLink("1gbit") as link:       # needs root and iproute2 (ip, tc)
        subprocess.run(link.exec_in(link.a) + ["python", ...])

Namespaces ``a`` and ``b`` (unique names per run) are joined by a veth pair
addressed 10.201.0.1/30 (in a) and 10.201.0.2/30 (in b): addresses that
exist only inside them, no traffic leaves them, nothing is added to this
process's own namespace.  Each end's egress goes through a token bucket
(``tc qdisc ... tbf rate RATE``), so each direction carries at most RATE:
a link where a byte saved is time saved, as between two hosts, unlike
loopback.  The namespaces (and so the veth pair) are deleted on leaving the
``with``, on an exception, Ctrl-C or SIGTERM alike (tests/bus/test_netns.py sets
up its link the same way).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid

#: Token bucket of each end: the rate, the bucket (a few 64 KiB GSO segments,
#: so that the shaper does not split them) and how long a packet may queue.
TBF = ["burst", "512kb", "latency", "50ms"]


def unavailable() -> str | None:
    """Why a rate-limited link cannot be made here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    return None


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r


class RateLimitedLink:
    """Namespaces ``a`` and ``b`` joined by a veth pair limited to ``rate``
    (tc syntax: "1gbit") in each direction."""

    def __init__(self, rate: str = "1gbit"):
        tag = uuid.uuid4().hex[:8]
        self.rate = rate
        # The process's id first: whoever lists namespaces (the tests, run
        # beside each other) can tell this process's links from another's.
        self.a, self.b = (f"upcall-bench-{os.getpid()}-{tag}-a",
                          f"upcall-bench-{os.getpid()}-{tag}-b")
        self.dev_a, self.dev_b = f"ubA{tag}", f"ubB{tag}"      # <= 15 characters
        self.addr_a, self.addr_b = "10.201.0.1", "10.201.0.2"
        self._made: list[str] = []
        self._old_term = None

    def __enter__(self) -> "RateLimitedLink":
        # SIGTERM ends the process through the finally blocks, as Ctrl-C does.
        try:
            self._old_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        except ValueError:      # not the main thread: Ctrl-C and exceptions only
            self._old_term = None
        try:
            for ns in (self.a, self.b):
                _run("ip", "netns", "add", ns)
                self._made.append(ns)
            # Both ends are created inside the namespaces, never in ours.
            _run("ip", "-n", self.a, "link", "add", self.dev_a, "type", "veth",
                 "peer", "name", self.dev_b, "netns", self.b)
            for ns, dev, addr in ((self.a, self.dev_a, self.addr_a),
                                  (self.b, self.dev_b, self.addr_b)):
                _run("ip", "-n", ns, "addr", "add", addr + "/30", "dev", dev)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                _run("ip", "-n", ns, "link", "set", dev, "up")
                _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
                     "tbf", "rate", self.rate, *TBF)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in reversed(self._made):
            _run("ip", "netns", "del", ns, check=False)     # the veth pair goes with it
        self._made = []
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None

    def exec_in(self, ns: str) -> list[str]:
        """The command prefix that runs a program inside namespace ns."""
        return ["ip", "netns", "exec", ns]
