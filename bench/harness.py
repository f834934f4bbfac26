"""The harness the sections share: targets, receive loops, stable
runs, and the runners of the physical floors' C programs.

A section (bench/bus.py, bench/publish.py, bench/contention.py, ...) builds
its rows from these pieces; nothing here knows a section.  Beside this
module, the rest of the harness layer: :mod:`bench.measure` (clocks, idle
waits, stable runs, summaries), :mod:`bench.report` (tables),
:mod:`bench.progress`, :mod:`bench.peer` (the peer process),
:mod:`bench.workload` (the messages), :mod:`bench.endpoints` (fresh
endpoints, the tests' too), :mod:`bench.floors` (where the floors'
binaries come from), :mod:`bench.netns` (a rate-limited link) and
:mod:`bench.coalescing` (the coalesced payload built by hand).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable

from bench import measure
from bench.endpoints import Endpoints  # noqa: F401  (the sections' endpoints)
from bench.floors import c_program
from bench.peer import PeerProcess, latency_summary
from bench.workload import small_payload

#: A drain that makes no progress for this long is given up (the rest is lost).
STALL_SECONDS = 5.0
#: Longest a floor's C program may take, beyond STALL_SECONDS.
FLOOR_TIMEOUT = 600


def upcall_bus():
    """The upcall module (Bus, python_threads), or None where it cannot be imported."""
    try:
        import upcall
    except ImportError:
        return None
    return upcall


# ---- what a section's runs share ----------------------------------------------------

class Rig:
    """What the runs of a section share: the upcall module, the payload, fresh
    endpoints, the peer process (if any), the repeats and the stable-run
    settings (:func:`bench.measure.run_stable`'s keywords)."""

    def __init__(self, repeats: int, stable_kw: dict):
        self.repeats = repeats
        self.stable_kw = stable_kw
        self.ub = upcall_bus()
        self.payload = small_payload()
        self.endpoints = Endpoints()
        self.peer: PeerProcess | None = None
        self.peer_flooding = False

    def close_peer_flood(self):
        if self.peer_flooding and self.peer is not None:
            self.peer.request(cmd="close")
            self.peer_flooding = False

    def stable(self, job) -> tuple[dict, measure.RunInfo]:
        """job.prepare(), then job.run() on an idle machine, redone if disturbed."""
        pids = [self.peer.pid] if self.peer is not None else []
        return measure.run_stable(job.run, prepare=job.prepare, pids=pids, **self.stable_kw)


# ---- the target -----------------------------------------------------------------

class Counting:
    """The target of the throughput runs: counts, times first to n-th message."""

    def __init__(self, n: int):
        if n < 2:
            raise ValueError("need at least 2 messages to time a drain")
        self.n = n
        self.done = threading.Event()
        self.span = measure.CpuSpan()
        span, done = self.span, self.done
        count = 0

        def target(msg):
            nonlocal count
            count += 1
            if count == 1:
                span.mark()
            elif count == n:
                span.stop()
                done.set()

        def delivered():
            return count

        self.target = target
        self.delivered = delivered

    def wait(self, poll: Callable[[float], Any] | None = None) -> bool:
        """Wait until n delivered or no progress for STALL_SECONDS.

        ``poll(timeout)``, if given, is called on this thread instead of
        sleeping (caller mode).
        """
        last, last_t = -1, time.monotonic()
        while not self.done.is_set():
            if poll is not None:
                poll(0.2)
            else:
                self.done.wait(0.2)
            now, c = time.monotonic(), self.delivered()
            if c != last:
                last, last_t = c, now
            elif now - last_t > STALL_SECONDS:
                return False
        return True


def caller_poll(sub) -> Callable[[float], Any]:
    """``poll(timeout)`` for a caller-mode subscription: ``sub.poll``, or a
    sleep once it is closed."""
    def poll(timeout: float):
        try:
            sub.poll(timeout=timeout)
        except Exception:
            time.sleep(timeout)
    return poll


# ---- the careful pyzmq loop -----------------------------------------------------------

class PyzmqLoop:
    """A careful pyzmq receive loop on a Python thread.

    Poll (a Poller built once), then drain with non-blocking ``recv`` calls,
    two per message (topic, payload), decode the payload and call the target.
    """

    def __init__(self, ctx, endpoint: str, decode: Callable, target: Callable,
                 curve_server: tuple[str, str] | None = None):
        import zmq
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve_server:                        # the CURVE rows: this end is the server
            self.sock.curve_secretkey = curve_server[1].encode()
            self.sock.curve_publickey = curve_server[0].encode()
            self.sock.curve_server = True
        self.sock.bind(endpoint)
        self.stop = False
        self.thread = threading.Thread(target=self._run, args=(decode, target),
                                       name="pyzmq-loop", daemon=True)
        self.thread.start()

    def _run(self, decode, target):
        import zmq
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poll, recv = poller.poll, self.sock.recv
        nb, again = zmq.NOBLOCK, zmq.Again
        while not self.stop:
            if not poll(100):
                continue
            while True:
                try:
                    recv(nb)                    # topic
                except again:
                    break
                target(decode(recv(nb)))        # payload: a multipart message arrives whole

    def close(self):
        self.stop = True
        self.thread.join(5.0)
        self.sock.close()


# ---- the floors' runners (bench/*.c, built by bench.floors) --------------------------------

def floor_pull(endpoint: str, n: int) -> dict:
    """bench/floor_pull.c drains n messages from endpoint in its own process:
    {"delivered", "seconds" (first to n-th), "cpu" (its CPU over that span)}."""
    r = subprocess.run([c_program("floor_pull")[0], endpoint, str(n)], capture_output=True,
                       text=True, timeout=STALL_SECONDS + FLOOR_TIMEOUT)
    if r.returncode != 0:
        raise RuntimeError(f"floor_pull failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def floor_push(endpoint: str, n: int, payload: bytes) -> dict:
    """bench/floor_push.c sends n messages in its own process: {"seconds", "cpu"}."""
    r = subprocess.run([c_program("floor_push")[0], endpoint, str(n), payload.hex()],
                       capture_output=True, text=True, timeout=FLOOR_TIMEOUT)
    if r.returncode != 0:
        raise RuntimeError(f"floor_push failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def pingpong_inproc(rtt: int, warmup: int, payload: bytes) -> dict:
    """bench/floor_pingpong.c answering itself over inproc (two threads of one
    process): the latency summary of rtt round trips."""
    r = subprocess.run([c_program("floor_pingpong")[0], "inproc", str(rtt), str(warmup),
                        payload.hex()], capture_output=True, text=True,
                       timeout=STALL_SECONDS + FLOOR_TIMEOUT)
    if r.returncode != 0:
        raise RuntimeError(f"floor_pingpong failed: {r.stderr.strip()}")
    return latency_summary(json.loads(r.stdout)["samples_ns"])


def pingpong(ping_ep: str, pong_ep: str, rtt: int, warmup: int, payload: bytes,
             hold_us: int = 0) -> dict:
    """Two bench/floor_pingpong.c processes; the responder holds each answer
    hold_us (0: answers at once).  The latency summary of rtt round trips."""
    prog = c_program("floor_pingpong")[0]
    pong = subprocess.Popen([prog, "pong", ping_ep, pong_ep, str(rtt + warmup), str(hold_us)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        r = subprocess.run([prog, "ping", ping_ep, pong_ep, str(rtt), str(warmup),
                            payload.hex()], capture_output=True, text=True,
                           timeout=STALL_SECONDS + FLOOR_TIMEOUT)
        pong.wait(timeout=STALL_SECONDS + 5)
    finally:
        if pong.poll() is None:
            pong.kill()
            pong.wait()
    if r.returncode != 0:
        raise RuntimeError(f"floor_pingpong failed: {r.stderr.strip()}")
    return latency_summary(json.loads(r.stdout)["samples_ns"])


def c_pinger(ping_ep: str, pong_ep: str, rtt: int, warmup: int, payload: bytes,
             poll: Callable[[float], Any] | None) -> dict:
    """bench/floor_pingpong.c pings a responder of this process (the same
    pinger as the round-trip floor's, so only the responder differs);
    ``poll``: a caller-mode responder's loop, run on this thread meanwhile."""
    prog = c_program("floor_pingpong")[0]
    # Its output goes to files, not pipes: in caller mode this thread
    # polls the responder instead of reading, and the samples (~200 KB)
    # would fill a pipe and stop the pinger mid-write.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([prog, "ping", ping_ep, pong_ep, str(rtt), str(warmup),
                                 payload.hex()], stdout=out, stderr=err)
        try:
            if poll is not None:   # caller mode: this thread is the responder's loop
                deadline = time.monotonic() + FLOOR_TIMEOUT
                while proc.poll() is None and time.monotonic() < deadline:
                    poll(0.1)
            proc.wait(timeout=STALL_SECONDS + FLOOR_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            return {"error": f"floor_pingpong ping failed: {err.read().strip()}"}
        return latency_summary(json.loads(out.read())["samples_ns"])


class CountingReceiver:
    """bench/count_pull.c bound to endpoint in its own process, counting n
    messages (coalesced ones split with the core's ``mp_skip``)."""

    def __init__(self, endpoint: str, n: int):
        self.proc = subprocess.Popen([c_program("count_pull")[0], endpoint, str(n)],
                                     stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("count_pull did not start")

    def result(self) -> dict:
        """{"delivered", "zmq_messages"} once the sender is done."""
        out = json.loads(self.proc.stdout.readline() or "{}")
        self.proc.wait(timeout=60)
        return out

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


def not_measured(why: str | None) -> dict:
    """A throughput run's result with no figure (``why``: printed under the table)."""
    return {"delivered": 0, "lost": None, "complete": False, "wall": 0.0, "stats": {},
            "seconds": math.nan, "rate": math.nan, "cpu_us_per_msg": math.nan, "na": why}
