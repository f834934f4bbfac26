"""Bus section of bench_upcalls.py: the bus end to end, against pyzmq.

For each transport (inproc, ipc, tcp 127.0.0.1) and each way of receiving:

* ``native``          upcall subscription delivered on the core's own thread
* ``python_threads``  upcall subscription delivered on a ``threading.Thread``
* ``caller``          upcall subscription in caller mode, ``sub.poll()`` on
                      the main thread
* ``pyzmq+msgspec``   what a careful pyzmq user writes: a Python thread that
                      polls, then drains with non-blocking receives (two
                      ``recv`` calls per message, faster than
                      ``recv_multipart``), decodes with
                      ``msgspec.msgpack.Decoder().decode`` and calls the target
* ``pyzmq+msgpack``   the same loop decoding with ``msgpack.unpackb``

* ``c-floor``         the physical floor: a plain C libzmq PULL loop
                      (bench/floor_pull.c, built by :mod:`bench.floors`,
                      run by :mod:`bench.harness`) receiving the
                      same flood in its own process: no decoding, no call;
                      ipc and tcp only (inproc needs this process's context)

* ``c-pingpong``      the round-trip floor: two plain C libzmq processes
                      (bench/floor_pingpong.c) answering each other with the
                      same message, one in flight (two threads of one process
                      over inproc); round trips only
* ``synthetic``       the same payload through the synthetic source
                      (``_synthetic_subscribe``) on the same delivery path
                      (native thread, the same target): what delivery costs
                      with no zmq at all; the same figure in every transport's
                      table, measured again in each

Coalescing:

* ``coalesced``       upcall, native thread, on a flood of coalesced payloads
                      (docs/wire.md, ext 127) of COALESCE_K (64) copies of the
                      map each, built here by hand so that the receive figure
                      does not depend on the publisher; its round trips are
                      answered through a coalescing publisher that holds a
                      message up to COALESCE_DELAY (1 ms): its p99 minus the
                      ``native`` row's is the latency coalescing adds
* ``coalesced-nil``   the same with nil payloads (what splitting alone costs)

Typed messages (msgspec ``Struct``s: the workload's map as ``Small``) and asyncio:

* ``typed``           upcall, native thread, ``decoder=msgspec.msgpack.Decoder(Small).decode``
* ``typed-raw``       upcall, native thread, ``raw=True`` and the same decoder
                      called by the target (what a user without ``decoder=`` writes)
* ``pyzmq+typed``     the careful pyzmq loop above with the same ``Small`` decoder
* ``asyncio``         ``async for msg in bus.subscribe_async(...)`` on an asyncio
                      event loop (this process's main thread), decoding with
                      ``decoder=msgspec.msgpack.Decoder().decode``
* ``zmq.asyncio``     a careful ``zmq.asyncio`` loop on the same kind of event
                      loop: ``await sock.poll()``, then drain up to a batch with
                      non-blocking ``recv`` calls on the socket's synchronous
                      shadow, decoding with the same msgspec decoder
* ``zmq.asyncio-await`` the plain zmq.asyncio loop: ``await sock.recv_multipart()``
                      per message, the same decoder
* ``asyncio-batches`` ``async for batch in sub.batches()`` (the messages of one
                      wake-up as a list), otherwise as ``asyncio``
* ``asyncio-coalesced`` ``asyncio`` fed a flood of coalesced payloads (as
                      ``coalesced``: COALESCE_K messages per zmq message)
* ``synthetic-asyncio`` the asyncio floor: the same adapter and consumer fed by
                      the synthetic source (no zmq)

Every asyncio row's consumer reads one field of each message (``msg["px"]``).

Pairs compared directly (same decoder, same run): ``typed`` / ``pyzmq+typed``,
``typed`` / ``typed-raw``, ``asyncio`` / ``zmq.asyncio`` and the asyncio rows
against their floors, printed under the table.  No round trips are measured for the asyncio rows, ``c-floor``,
``synthetic`` and ``coalesced-nil``.

it measures:

Throughput (PUSH/PULL, nothing may be lost)
    A peer process (:mod:`bench.peer`; for inproc, a publisher thread
    of this process on the same context) opens a PUSH that *connects* to the
    endpoint with SNDHWM 0 and sends all N messages before anybody listens.
    With zmq a connecting socket gets its pipe at connect time, so the whole
    flood is queued in the publisher when it says "ready"; only then does the
    subscriber *bind* the endpoint, the connection (re)tries and the flood
    drains.  The clock starts at the first message seen by the target and
    stops at the N-th: that is the subscriber's capacity (how fast it takes
    queued messages out of zmq, decodes them and calls the target), not the
    publisher's, and the connection set-up time is not in it.
    ``rate`` = delivered messages/s over that span; ``cpu_us_per_msg`` = this
    process's CPU time (``getrusage``: all threads, libzmq's I/O thread
    included; the publisher is another process) over the same span per
    message; ``lost`` = N - delivered (summed over the repeats).

Round-trip latency
    Over a second pair of sockets: the peer sends a ping (the same message),
    the subscription's target answers with one pre-packed message through an
    upcall Publisher (upcall rows) or a pyzmq socket (pyzmq rows), and the
    peer waits for it: one message in flight at a time, ``--bus-rtt`` round
    trips after a warm-up.  The peer is the same program for every row (pyzmq
    when installed), so the rows differ only in the responder.  For inproc
    the pinger is a thread of this process, written with the row's own
    library (it needs the row's context), so inproc latencies compare two
    different pingers and share one interpreter with the responder.

Publishing (ipc and tcp; ``--bus-no-publish`` skips it; :mod:`bench.publish`)
    The sending side (its own section in --json): a sender in this
    process (a plain C ``zmq_send`` loop in its own process for ``c-send``) connects a PUSH with SNDHWM 0 to a
    receiver that only counts (bench/count_pull.c, its own process; it
    splits coalesced messages with the core's ``mp_skip``) and sends N
    messages as fast as it can; nothing blocks, so the figure is the
    sender's.  ``rate`` = N / (first send to last send returning, and
    ``flush()`` for the coalescing rows); ``cpu_us_per_msg`` = the sender
    process's CPU (its libzmq I/O thread included) over that span per
    message; ``zmq msgs`` = zmq messages the receiver got; ``lost`` = N -
    counted.  Rows: ``c-send``, ``pyzmq+msgspec send`` (``send(topic,
    SNDMORE)`` + ``send(msgspec.msgpack.encode(obj))``), ``send``
    (``Publisher.send(topic, obj)``), ``send_packed``, ``send_many`` (one
    call for the N), ``send+coalesce`` and ``send_many+coalesce``
    (``coalesce=True``).

Variants are interleaved (A B C D E, B C D E A, ...), repeated, and reported
as median (min-max); before each timed run the machine must be idle
(``/proc/stat``) and a run disturbed by other processes is redone (see
:mod:`bench.measure`).  Ratios, all within one transport of one run: ``x
pyzmq`` to the ``pyzmq+msgspec`` row (``pyzmq+msgspec send`` when
publishing), ``x C`` to ``c-floor`` (rate and CPU per message; ``c-send``
when publishing), ``x syn`` to ``synthetic`` (rate), ``x C pp`` to
``c-pingpong`` (p50).  Under each table, the coalescing targets.
"""
from __future__ import annotations

import gc
import math
import threading
import time
from typing import Any, Callable

from bench import harness, measure, progress, publish, report
from bench.coalescing import coalesced_payload
from bench.floors import c_program
from bench.harness import STALL_SECONDS, Counting, PyzmqLoop, caller_poll, upcall_bus
from bench.peer import PeerProcess, flood_upcall, flood_zmq, have_pyzmq, ping_upcall, ping_zmq
from bench.workload import NIL, TOPIC

TRANSPORTS = ["inproc", "ipc", "tcp"]
#: Coalesced rows: the flood's payloads are coalesced messages
#: (docs/wire.md, ext 127) of the map / of nil, built here by hand, so that the
#: receive figure does not depend on the publisher; native thread.
COALESCED = "coalesced"
COALESCED_NIL = "coalesced-nil"
COALESCED_MODES = [COALESCED, COALESCED_NIL]
#: asyncio rows: every one consumed by the same coroutine body (reads one
#: field of each message); batches: ``async for batch in sub.batches()``;
#: coalesced: fed a flood of coalesced payloads (COALESCE_K per zmq message).
ASYNC_BATCHES = "asyncio-batches"
ASYNC_COALESCED = "asyncio-coalesced"
#: The asyncio floor: the same consumer fed by the synthetic source through
#: the same bridge (no zmq).
SYNTHETIC_ASYNC = "synthetic-asyncio"
#: CURVE rows (ipc and tcp): the ``native`` and ``pyzmq+msgspec`` rows with
#: the receiving end a CURVE server and the flood a CURVE client: what
#: encryption costs per message, beside the plain rows of the same run.
CURVE = "curve"
PYZMQ_CURVE = "pyzmq+curve"
CURVE_MODES = {CURVE, PYZMQ_CURVE}
UPCALL_MODES = ["native", "python_threads", "caller", "typed", "typed-raw",
                "asyncio", ASYNC_BATCHES, ASYNC_COALESCED] + COALESCED_MODES + [CURVE]
PYZMQ_MODES = ["pyzmq+msgspec", "pyzmq+msgpack", "pyzmq+typed", "zmq.asyncio",
               "zmq.asyncio-await", PYZMQ_CURVE]
FLOOR = "c-floor"
PINGPONG = "c-pingpong"
SYNTHETIC = "synthetic"
#: The physical floors, measured in the same run as the rest.
FLOOR_MODES = [FLOOR, PINGPONG, SYNTHETIC, SYNTHETIC_ASYNC]
#: Rows fed by the synthetic source.
SYNTHETIC_MODES = {SYNTHETIC, SYNTHETIC_ASYNC}
MODES = FLOOR_MODES + UPCALL_MODES + PYZMQ_MODES
REFERENCE = "pyzmq+msgspec"
#: Rows consumed by a coroutine on an event loop.
ASYNC_MODES = {"asyncio", "zmq.asyncio", "zmq.asyncio-await", ASYNC_BATCHES, ASYNC_COALESCED,
               SYNTHETIC_ASYNC}
#: Rows of upcall's asyncio adapter.
UPCALL_ASYNC_MODES = {"asyncio", ASYNC_BATCHES, ASYNC_COALESCED, SYNTHETIC_ASYNC}
#: Rows without round trips.
NO_RTT_MODES = ASYNC_MODES | {FLOOR, SYNTHETIC, COALESCED_NIL} | CURVE_MODES
#: Rows without a flood (round trips only).
NO_FLOOD_MODES = {PINGPONG}
#: Messages per coalesced zmq message in the coalesced floods.
COALESCE_K = 64
#: The coalesced row's round trips: its responder is a coalescing publisher
#: that holds a message at most this long (target: added p99 <= L + 50 us).
COALESCE_DELAY = 0.001
#: (row, the row it is compared with): same decoder, same run.
PAIRS = [("typed", "pyzmq+typed"), ("typed", "typed-raw"), ("asyncio", "zmq.asyncio"),
         ("asyncio", "zmq.asyncio-await"), ("asyncio", SYNTHETIC_ASYNC),
         (ASYNC_BATCHES, SYNTHETIC), (ASYNC_BATCHES, SYNTHETIC_ASYNC),
         (ASYNC_COALESCED, "zmq.asyncio"), (CURVE, "native"), (PYZMQ_CURVE, "pyzmq+msgspec"),
         (CURVE, PYZMQ_CURVE)]

#: --full (what PERF.md's figures come from).
FULL_N = 200_000
FULL_RTT = 20_000
FULL_REPEATS = 3
#: The default profile: ``make bench`` in a few minutes (one transport that
#: needs a peer process, and inproc).
DEFAULT_N = 50_000
DEFAULT_RTT = 5_000
DEFAULT_REPEATS = 2
DEFAULT_TRANSPORTS = ["inproc", "tcp"]
QUICK_N = 2_000
QUICK_RTT = 200


#: Printed once under the bus tables: the words and columns they use.
TERMS = f"""\
Terms:
  {FLOOR:<17} the physical floor: a plain C libzmq PULL loop in its own process (no decoding, no call)
  {PINGPONG:<17} the round-trip floor: two plain C libzmq processes answering each other
  {SYNTHETIC:<17} the same delivery path fed by upcall's synthetic source: no zmq at all
  {COALESCED:<17} {COALESCE_K} messages per zmq message (docs/wire.md), split by the subscriber
  {CURVE:<17} native with a CURVE server, the flood a CURVE client ({PYZMQ_CURVE}: {REFERENCE}'s)
  native / caller   delivered on upcall's own thread / by sub.poll() on the main thread
  x pyzmq, x C      ratio to the {REFERENCE} row / to {FLOOR}, same transport, same run,
                    of the column before it (msgs/s, CPU us/msg or p50 us)
  x syn, x C pp     ratio to {SYNTHETIC} (rate) / to {PINGPONG} (p50)
  ±N%               half of the repeats' spread (max - min) as a share of the median
  [met] [MISSED]    whether the figure meets the target written beside it
  [quick]           a figure beside its target, not judged: --quick's counts are too small"""


def add_arguments(parser) -> None:
    g = parser.add_argument_group("bus section")
    g.add_argument("--bus-n", type=int, default=None,
                   help=f"messages per throughput run (default {DEFAULT_N:,}; full {FULL_N:,}; "
                        f"quick {QUICK_N:,})")
    g.add_argument("--bus-rtt", type=int, default=None,
                   help=f"round trips per latency run (default {DEFAULT_RTT:,}; full {FULL_RTT:,}; "
                        f"quick {QUICK_RTT})")
    g.add_argument("--bus-repeats", type=int, default=None,
                   help=f"runs of each variant (default {DEFAULT_REPEATS}; full {FULL_REPEATS}; "
                        "quick 1)")
    g.add_argument("--bus-transports", default=None,
                   help="comma-separated subset of inproc,ipc,tcp (default "
                        f"{','.join(DEFAULT_TRANSPORTS)}; full and quick: all)")
    g.add_argument("--bus-modes", default=",".join(MODES),
                   help="comma-separated subset of " + ",".join(MODES))
    g.add_argument("--bus-batch", type=int, default=None,
                   help="batch= for the upcall subscriptions (default: the library's)")
    g.add_argument("--bus-peer", choices=["zmq", "upcall"], default=None,
                   help="library of the peer process (default: pyzmq if installed)")
    g.add_argument("--bus-no-latency", action="store_true", help="skip the round trips")
    g.add_argument("--bus-coalesce-k", type=int, default=None, metavar="K",
                   help=f"messages per zmq message in the coalesced floods (default {COALESCE_K})")
    g.add_argument("--bus-no-publish", action="store_true",
                   help="skip the publishing rows (the sending side)")
    g.add_argument("--bus-publish-n", type=int, default=None, metavar="N",
                   help="messages per publishing run (default: --bus-n's)")
    g.add_argument("--bus-idle-timeout", type=float, default=None, metavar="S",
                   help="longest wait for an idle machine before each run (default 2; full 30; "
                        "quick 0)")
    g.add_argument("--bus-retries", type=int, default=None, metavar="N",
                   help="redo a run disturbed by other processes up to N times (default 1; "
                        "full 3; quick 0)")
    g.add_argument("--bus-pin-latency", type=int, default=None, metavar="CPU",
                   help="run the round trips with both processes pinned to this CPU "
                        "(removes the cost of waking an idle vCPU; see PERF.md)")
    g.add_argument("--bus-pinger", choices=("peer", "c"), default="peer",
                   help="who sends the pings of the round trips over ipc and tcp: the peer "
                        "process (default, the pyzmq or upcall loop) or bench/floor_pingpong.c, "
                        "so that a row differs from c-pingpong only in its responder")


_SMALL_STRUCT = None


def small_struct():
    """The workload's map (bench.workload.SMALL_MESSAGE) as a msgspec Struct."""
    global _SMALL_STRUCT
    if _SMALL_STRUCT is None:
        import msgspec

        class Small(msgspec.Struct):
            id: int
            sym: str
            px: float
            sizes: list[int]
            venue: str
        _SMALL_STRUCT = Small
    return _SMALL_STRUCT


def _decoder(mode: str) -> Callable[[bytes], Any] | None:
    """The payload decoder a row uses (None: upcall's built-in one, or missing)."""
    try:
        if mode in ("pyzmq+msgspec", "zmq.asyncio", "zmq.asyncio-await", PYZMQ_CURVE) or \
                mode in UPCALL_ASYNC_MODES:
            import msgspec
            return msgspec.msgpack.Decoder().decode
        if mode in ("pyzmq+typed", "typed", "typed-raw"):
            import msgspec
            return msgspec.msgpack.Decoder(small_struct()).decode
        if mode == "pyzmq+msgpack":
            import msgpack
            return msgpack.unpackb
    except ImportError:
        return None
    return None


#: Rows whose decoder is msgspec's.
_MSGSPEC_MODES = UPCALL_ASYNC_MODES | {"pyzmq+msgspec", "pyzmq+typed", "typed", "typed-raw", "zmq.asyncio",
                  "zmq.asyncio-await", PYZMQ_CURVE}


def available_modes(wanted: list[str]) -> tuple[list[str], list[str]]:
    """(modes that can run here, notes on the ones that cannot)."""
    ok, notes = [], []
    ub = upcall_bus()
    zmq_ok = have_pyzmq()
    for m in wanted:
        if m in (FLOOR, PINGPONG):
            path, why = c_program("floor_pull" if m == FLOOR else "floor_pingpong")
            if path is None:
                notes.append(f"{m}: {why}")
            else:
                ok.append(m)
            continue
        if m in UPCALL_MODES or m in SYNTHETIC_MODES:
            if ub is None:
                notes.append(f"{m}: upcall._bus not built")
                continue
        elif m in PYZMQ_MODES:
            if not zmq_ok:
                notes.append(f"{m}: pyzmq not installed")
                continue
        else:
            raise ValueError(f"unknown bus mode {m!r}")
        if (m in _MSGSPEC_MODES or m in PYZMQ_MODES) and _decoder(m) is None:
            notes.append(f"{m}: {'msgspec' if m in _MSGSPEC_MODES else 'msgpack'} not installed")
            continue
        ok.append(m)
    return ok, notes


# ---- receivers: how each mode consumes a PULL socket ------------------------------------

_CURVE_PAIR: list = []


def _curve_pair() -> tuple[str, str]:
    """The CURVE rows' server key pair (one per run)."""
    if not _CURVE_PAIR:
        _CURVE_PAIR.append(tuple(upcall_bus().curve_keypair()))
    return _CURVE_PAIR[0]


def _open_upcall_sub(bus, ub, mode: str, endpoint: str, target: Callable, batch: int | None):
    kw: dict[str, Any] = {"kind": "pull", "bind": True}
    if batch is not None:
        kw["batch"] = batch
    if mode == "caller":
        kw["delivery"] = "caller"
    elif mode == "python_threads":
        kw["thread_factory"] = ub.python_threads
    elif mode == "typed":
        kw["decoder"] = _decoder(mode)
    elif mode == CURVE:
        kw["curve_server"] = _curve_pair()
    elif mode == "typed-raw":
        kw["raw"] = True
        decode, inner = _decoder(mode), target

        def target(payload):                # what a user without decoder= writes
            inner(decode(payload))
    return bus.subscribe(endpoint, target, **kw)


# ---- the asyncio rows ----------------------------------------------------------------

async def _consume_upcall(bus, endpoint: str, n: int, target: Callable, batch: int | None,
                          mode: str = "asyncio", payload: bytes = b""):
    """n messages of ``bus.subscribe_async`` to target (each reads one field
    of the message); returns its stats.  SYNTHETIC_ASYNC: the same adapter fed
    by the synthetic source; ASYNC_BATCHES: ``async for batch in sub.batches()``."""
    kw: dict[str, Any] = {"kind": "pull", "bind": True, "decoder": _decoder(mode)}
    if batch is not None:
        kw["batch"] = batch
    if mode == SYNTHETIC_ASYNC:
        from upcall import aio
        from upcall._bus import SubscribeOptions, _synthetic_subscribe
        del kw["bind"]

        def open_synthetic(bridge):
            return _synthetic_subscribe(bus, bridge, count=n, payload=payload,
                                        **{k: v for k, v in kw.items() if k != "kind"})
        sub = aio.AsyncSubscription(bus, "synthetic", None, SubscribeOptions(**kw),
                                    _open=open_synthetic)
    else:
        sub = bus.subscribe_async(endpoint, **kw)
    try:
        i = 0
        if mode == ASYNC_BATCHES:
            async for msgs in sub.batches():
                for msg in msgs:
                    msg["px"]
                    target(msg)
                i += len(msgs)
                if i >= n:
                    break
        else:
            async for msg in sub:
                msg["px"]
                target(msg)
                i += 1
                if i == n:
                    break
        return dict(sub.stats)
    finally:
        await sub.aclose()


async def _consume_zmq_asyncio(ctx, endpoint: str, n: int, target: Callable,
                               batch: int | None, plain: bool = False):
    """A careful zmq.asyncio consumer: wait for readability on the event loop,
    then drain what is queued (up to a batch, as upcall's loop does) with
    non-blocking receives on the socket's synchronous shadow: no future per
    message.  ``plain``: ``await sock.recv_multipart()`` for each message."""
    import zmq
    import zmq.asyncio
    actx = zmq.asyncio.Context.shadow(ctx.underlying)
    sock = actx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    recv = zmq.Socket.shadow(sock.underlying).recv
    decode = _decoder("zmq.asyncio")
    nb, again, pollin = zmq.NOBLOCK, zmq.Again, zmq.POLLIN
    most = batch or 1024
    try:
        if plain:
            recv_multipart = sock.recv_multipart
            for _ in range(n):
                msg = decode((await recv_multipart())[1])
                msg["px"]
                target(msg)
            return {}
        i = 0
        while i < n:
            await sock.poll(100, pollin)
            for _ in range(most):
                try:
                    recv(nb)                    # topic
                except again:
                    break
                msg = decode(recv(nb))          # payload: a multipart message arrives whole
                msg["px"]
                target(msg)
                i += 1
                if i == n:
                    break
        return {}
    finally:
        sock.close()


def _run_async_row(mode: str, ctx, endpoint: str, c: "Counting", batch: int | None,
                   payload: bytes = b""):
    """Consume the flood with a coroutine on a fresh event loop (this thread);
    (complete, stats).  Gives up after STALL_SECONDS without progress."""
    import asyncio

    async def main():
        if mode in UPCALL_ASYNC_MODES:
            job = asyncio.ensure_future(_consume_upcall(ctx, endpoint, c.n, c.target, batch,
                                                        mode, payload))
        else:
            job = asyncio.ensure_future(_consume_zmq_asyncio(ctx, endpoint, c.n, c.target, batch,
                                                             plain=mode == "zmq.asyncio-await"))
        last, last_t = -1, time.monotonic()
        while not job.done():
            await asyncio.wait([job], timeout=0.2)
            now, got = time.monotonic(), c.delivered()
            if got != last:
                last, last_t = got, now
            elif now - last_t > STALL_SECONDS:
                job.cancel()
                try:
                    await job
                except asyncio.CancelledError:
                    pass
                return False, {}
        return c.done.is_set(), job.result()
    return asyncio.run(main())


# ---- one throughput run -------------------------------------------------------------

class FloodRun:
    """prepare(): queue the flood; run(): bind, drain, time.  Repeatable."""

    def __init__(self, bench: "BusBench", transport: str, mode: str):
        self.b, self.transport, self.mode = bench, transport, mode
        self.ctx = None         # bus (upcall) or zmq context (pyzmq) owned by this run
        self.flood = None       # in-process flood socket / publisher
        self.endpoint = ""
        # What the flood carries: n messages as n_zmq zmq messages of payload.
        self.n, self.n_zmq, self.payload = bench.n, bench.n, bench.payload
        # Coalesced rows: (one message, k), so that the flood marks its
        # payloads as upcall's own (docs/wire.md, "The marker frame").
        self.coalesced: tuple[bytes, int] | None = None
        if mode in COALESCED_MODES or mode == ASYNC_COALESCED:
            k = bench.coalesce_k
            self.n_zmq = -(-bench.n // k)
            self.n = self.n_zmq * k
            one = NIL if mode == COALESCED_NIL else bench.payload
            self.payload = coalesced_payload(one, k)
            self.coalesced = (one, k)

    def _new_ctx(self):
        if self.mode in (FLOOR, PINGPONG):
            return None             # the C program has its own context
        if self.mode in UPCALL_MODES or self.mode in SYNTHETIC_MODES:
            return self.b.ub.Bus()
        import zmq
        return zmq.Context(1)

    def _drop_ctx(self):
        if self.flood is not None:
            self.flood.close()
            self.flood = None
        if self.ctx is not None:
            if self.mode in UPCALL_MODES or self.mode in SYNTHETIC_MODES:
                self.ctx.close()
            else:
                self.ctx.term()
            self.ctx = None

    def prepare(self):
        self._drop_ctx()
        self.b.close_peer_flood()
        if self.mode in NO_FLOOD_MODES:
            return
        self.ctx = self._new_ctx()
        if self.mode in SYNTHETIC_MODES:  # no zmq: the source makes the messages
            gc.collect()
            return
        self.endpoint = self.b.endpoints.new(self.transport)
        if self.transport == "inproc":
            # inproc needs one context: the publisher is a thread of this
            # process on the subscriber's bus / context, done before we bind.
            fn = flood_upcall if self.mode in UPCALL_MODES else flood_zmq
            box: list = []

            def flood():
                try:
                    box.append(fn(self.ctx, self.endpoint, self.n_zmq, self.payload,
                                  coalesced=self.coalesced))
                except Exception as exc:
                    box.append(exc)
            t = threading.Thread(target=flood, name="bench-flood")
            t.start()
            t.join()
            if not box:
                raise RuntimeError("in-process flood publisher failed")
            if isinstance(box[0], Exception):
                raise RuntimeError("in-process flood publisher failed") from box[0]
            self.flood = box[0]
        else:
            extra = {} if self.payload == self.b.payload else {"payload_hex": self.payload.hex()}
            if self.mode in CURVE_MODES:
                extra["curve_serverkey"] = _curve_pair()[0]
            if self.coalesced is not None:
                extra["coalesced"] = [self.coalesced[0].hex(), self.coalesced[1]]
            self.b.peer.request(cmd="flood", endpoint=self.endpoint, n=self.n_zmq, **extra)
            self.b.peer_flooding = True
        gc.collect()

    def _run_floor(self) -> dict:
        """The C floor: bench/floor_pull.c drains the flood in its own process."""
        n = self.n
        t0 = time.perf_counter()
        out = harness.floor_pull(self.endpoint, n)
        delivered = out["delivered"]
        res = {"delivered": delivered, "lost": n - delivered, "complete": delivered == n,
               "wall": time.perf_counter() - t0, "stats": {}}
        if delivered == n and out["seconds"] > 0:
            res.update(seconds=out["seconds"], rate=(n - 1) / out["seconds"],
                       cpu_us_per_msg=out["cpu"] / (n - 1) * 1e6)
        else:
            res.update(seconds=math.nan, rate=math.nan, cpu_us_per_msg=math.nan)
        self.b.close_peer_flood()
        return res

    def run(self) -> dict:
        if self.mode in NO_FLOOD_MODES:
            return harness.not_measured(None)
        if self.mode == FLOOR:
            return self._run_floor()
        n = self.n
        c = Counting(n)
        t0 = time.perf_counter()
        if self.mode == SYNTHETIC:
            from upcall._bus import _synthetic_subscribe
            kw = {} if self.b.batch is None else {"batch": self.b.batch}
            sub = _synthetic_subscribe(self.ctx, c.target, count=n, payload=self.payload, **kw)
            try:
                ok = c.wait()
                stats = dict(sub.stats)
            finally:
                sub.close(timeout=5.0)
        elif self.mode in ASYNC_MODES:
            ok, stats = _run_async_row(self.mode, self.ctx, self.endpoint, c, self.b.batch,
                                       self.payload)
        elif self.mode in UPCALL_MODES:
            sub = _open_upcall_sub(self.ctx, self.b.ub, self.mode, self.endpoint, c.target,
                                   self.b.batch)
            try:
                ok = c.wait(caller_poll(sub) if self.mode == "caller" else None)
                stats = dict(sub.stats)
            finally:
                sub.close(timeout=5.0)
        else:
            loop = PyzmqLoop(self.ctx, self.endpoint, _decoder(self.mode), c.target,
                             _curve_pair() if self.mode in CURVE_MODES else None)
            try:
                ok = c.wait()
            finally:
                loop.close()
            stats = {}
        wall = time.perf_counter() - t0
        delivered = c.delivered()
        span = c.span
        res = {"delivered": delivered, "lost": n - delivered, "complete": ok, "wall": wall,
               "stats": stats}
        if ok and span.wall > 0:
            res.update(seconds=span.wall, rate=(n - 1) / span.wall,
                       cpu_us_per_msg=span.cpu / (n - 1) * 1e6)
        else:
            res.update(seconds=math.nan, rate=math.nan, cpu_us_per_msg=math.nan)
        self._drop_ctx()
        self.b.close_peer_flood()
        return res


# ---- one latency run --------------------------------------------------------------

class PingRun:
    """Responder of the row's kind on (ping, pong); the pinger counts round trips."""

    def __init__(self, bench: "BusBench", transport: str, mode: str):
        self.b, self.transport, self.mode = bench, transport, mode

    def prepare(self):
        gc.collect()

    def run(self) -> dict:
        if self.mode in NO_RTT_MODES:
            return {}               # round trips are not measured for these rows
        if self.b.pin is None:
            return self._run()
        pids = [self.b.peer.pid] if self.b.peer is not None else []
        with measure.pinned([self.b.pin], pids):
            return self._run()

    def _run(self) -> dict:
        b = self.b
        if self.mode == PINGPONG:
            return self._run_c()
        ping_ep, pong_ep = b.endpoints.new(self.transport), b.endpoints.new(self.transport)
        payload = b.payload
        upcall_row = self.mode in UPCALL_MODES
        if self.mode == COALESCED:
            # The reply goes through a coalescing publisher: it waits up to
            # COALESCE_DELAY for company that never comes (one in flight).
            ctx = b.ub.Bus()
            pub = ctx.publisher(pong_ep, kind="push", bind=True,
                                coalesce=True, max_delay=COALESCE_DELAY)
            send = pub.send

            def reply(msg):
                send(TOPIC, msg)

            responder = _open_upcall_sub(ctx, b.ub, self.mode, ping_ep, reply, b.batch)
        elif upcall_row:
            ctx = b.ub.Bus()
            pub = ctx.publisher(pong_ep, kind="push", bind=True, linger=0.0)
            send_packed = pub.send_packed

            def reply(msg):
                send_packed(TOPIC, payload)

            responder = _open_upcall_sub(ctx, b.ub, self.mode, ping_ep, reply, b.batch)
        else:
            import zmq
            ctx = zmq.Context(1)
            pub = ctx.socket(zmq.PUSH)
            pub.setsockopt(zmq.LINGER, 0)
            pub.bind(pong_ep)
            psend, more = pub.send, zmq.SNDMORE

            def reply(msg):
                psend(TOPIC, more)
                psend(payload)

            responder = PyzmqLoop(ctx, ping_ep, _decoder(self.mode), reply)
        poll = caller_poll(responder) if self.mode == "caller" else None
        try:
            if self.transport == "inproc":
                res = self._ping_in_process(ctx, ping_ep, pong_ep, poll)
            elif b.c_pinger:
                res = harness.c_pinger(ping_ep, pong_ep, b.rtt, b.warmup, b.payload, poll)
            else:
                b.peer.send(cmd="ping", ping=ping_ep, pong=pong_ep, count=b.rtt,
                            warmup=b.warmup)
                if poll is not None:
                    deadline = time.monotonic() + 600
                    while not b.peer.readable(0) and time.monotonic() < deadline:
                        poll(0.1)
                res = b.peer.answer(timeout=600)
        finally:
            responder.close()
            pub.close()
            if upcall_row:
                ctx.close()
            else:
                ctx.term()
        return res

    def _run_c(self) -> dict:
        """The round-trip floor: bench/floor_pingpong.c answering itself, two
        processes (one process, two threads, over inproc)."""
        b = self.b
        if self.transport == "inproc":
            return harness.pingpong_inproc(b.rtt, b.warmup, b.payload)
        res = harness.pingpong(b.endpoints.new(self.transport), b.endpoints.new(self.transport),
                               b.rtt, b.warmup, b.payload)
        if COALESCED in b.modes:
            # The floor of the coalesced row's held reply: the same C
            # responder holding each answer COALESCE_DELAY.
            held = harness.pingpong(b.endpoints.new(self.transport),
                                    b.endpoints.new(self.transport), b.rtt, b.warmup, b.payload,
                                    hold_us=round(COALESCE_DELAY * 1e6))
            res["held_p50_us"], res["held_p99_us"] = held["p50_us"], held["p99_us"]
        return res

    def _ping_in_process(self, ctx, ping_ep, pong_ep, poll) -> dict:
        b = self.b
        fn = ping_upcall if self.mode in UPCALL_MODES else ping_zmq
        box: list = []
        t = threading.Thread(target=lambda: box.append(
            fn(ctx, ping_ep, pong_ep, b.rtt, b.warmup, b.payload)),
            name="bench-pinger", daemon=True)
        t.start()
        while t.is_alive():
            if poll is not None:
                poll(0.1)
            else:
                t.join(0.5)
        if not box:
            raise RuntimeError("in-process pinger failed")
        if "error" in box[0]:
            raise RuntimeError(box[0]["error"])
        return box[0]


# ---- the section ------------------------------------------------------------------

class BusBench(harness.Rig):
    """The --bus section: its settings from the command line, its tables."""

    def __init__(self, opts):
        def opt(name, default=None):
            return getattr(opts, name, None) or default

        quick = bool(opt("quick", False))
        full = bool(opt("full", False)) and not quick
        # Quick mode checks that everything runs: no waiting for a quiet machine.
        stable_kw = (dict(retries=0, idle_timeout=measure.QUICK_IDLE_TIMEOUT) if quick
                     else dict(retries=3, idle_timeout=30.0) if full
                     else dict(retries=1, idle_timeout=2.0))
        # A shared machine is never idle for long: the runs may be told to
        # wait less (each one still reports whether it was disturbed).
        if getattr(opts, "bus_idle_timeout", None) is not None:
            stable_kw["idle_timeout"] = opts.bus_idle_timeout
        if getattr(opts, "bus_retries", None) is not None:
            stable_kw["retries"] = opts.bus_retries
        super().__init__(opt("bus_repeats", 1 if quick else FULL_REPEATS if full
                             else DEFAULT_REPEATS), stable_kw)
        self.quick = quick
        self.n = opt("bus_n", QUICK_N if quick else FULL_N if full else DEFAULT_N)
        self.rtt = opt("bus_rtt", QUICK_RTT if quick else FULL_RTT if full else DEFAULT_RTT)
        self.warmup = 20 if quick else 500
        self.batch = opt("bus_batch")
        self.latency = not opt("bus_no_latency", False)
        self.pin = getattr(opts, "bus_pin_latency", None)
        self.c_pinger = getattr(opts, "bus_pinger", "peer") == "c"
        all_or_default = TRANSPORTS if quick or full else DEFAULT_TRANSPORTS
        self.transports = [t for t in opt("bus_transports", ",".join(all_or_default)).split(",")
                           if t]
        for t in self.transports:
            if t not in TRANSPORTS:
                raise SystemExit(f"--bus-transports: unknown transport {t!r}")
        self.modes, self.notes = available_modes(
            [m for m in opt("bus_modes", ",".join(MODES)).split(",") if m])
        self.coalesce_k = opt("bus_coalesce_k", COALESCE_K)
        self.publish_modes, publish_notes = publish.available_modes(self.ub)
        self.notes += publish_notes
        self.publish = not opt("bus_no_publish", False)
        self.publish_n = opt("bus_publish_n", self.n)
        self.peer_backend = opt("bus_peer")

    def modes_for(self, transport: str) -> list[str]:
        """The rows of one transport: the C floor needs a peer process; inproc
        has no CURVE handshake."""
        modes = [m for m in self.modes
                 if not ((m == FLOOR or m in CURVE_MODES) and transport == "inproc")]
        if not self.latency:
            modes = [m for m in modes if m not in NO_FLOOD_MODES]
        return modes

    def run_transport(self, transport: str) -> list[dict]:
        modes = self.modes_for(transport)
        flood: dict[str, list] = {m: [] for m in modes}
        ping: dict[str, list] = {m: [] for m in modes}
        disturbed: dict[str, int] = {m: 0 for m in modes}
        order = list(measure.interleave(modes, self.repeats))
        runs = len(order) * (2 if self.latency else 1)
        with progress.Progress(f"bus {transport}", runs) as shown:
            for rep in range(self.repeats):
                round_modes = [m for r, m in order if r == rep]
                for mode in round_modes:
                    job = FloodRun(self, transport, mode)
                    res, info = self.stable(job)
                    res["info"], res["n"] = info, job.n
                    disturbed[mode] += info.disturbed
                    flood[mode].append(res)
                    shown.step(f"flood {mode}")
                if self.latency:
                    for mode in round_modes:
                        res, info = self.stable(PingRun(self, transport, mode))
                        disturbed[mode] += info.disturbed
                        ping[mode].append(res)
                        shown.step(f"round trips {mode}")
        return self._records(transport, flood, ping, disturbed)

    def _records(self, transport, flood, ping, disturbed) -> list[dict]:
        recs = []
        for mode in flood:
            na = sorted({r["na"] for r in flood[mode] + ping[mode] if r.get("na")})
            lost = [r["lost"] for r in flood[mode] if r["lost"] is not None]
            rate = measure.summarize(r["rate"] for r in flood[mode])
            cpu = measure.summarize(r["cpu_us_per_msg"] for r in flood[mode])
            secs = measure.summarize(r["seconds"] for r in flood[mode])
            p50 = measure.summarize(r.get("p50_us") for r in ping[mode])
            p99 = measure.summarize(r.get("p99_us") for r in ping[mode])
            held99 = measure.summarize(r.get("held_p99_us") for r in ping[mode])
            recs.append({
                "transport": transport, "mode": mode,
                "n": flood[mode][0].get("n", self.n) if flood[mode] else self.n,
                "repeats": self.repeats,
                "rate": rate.median, "rate_min": rate.min, "rate_max": rate.max,
                "cpu_us_per_msg": cpu.median, "cpu_us_min": cpu.min, "cpu_us_max": cpu.max,
                "lost": sum(lost) if lost else None,
                "na": "; ".join(na) or None,
                "p50_us": p50.median, "p50_us_min": p50.min, "p50_us_max": p50.max,
                "p99_us": p99.median, "p99_us_min": p99.min, "p99_us_max": p99.max,
                "held_p99_us": held99.median,   # c-pingpong only: its responder holding replies
                "round_trips": self.rtt if self.latency else 0,
                "latency_pinned_cpu": self.pin,
                "seconds": secs.median,
                "disturbed_runs": disturbed[mode],
                "_s": {"rate": rate, "cpu": cpu, "p50": p50, "p99": p99},
            })
        by_mode = {r["mode"]: r for r in recs}
        ref, floor = by_mode.get(REFERENCE, {}), by_mode.get(FLOOR, {})
        synth, pp = by_mode.get(SYNTHETIC, {}), by_mode.get(PINGPONG, {})
        for r in recs:
            r["rate_ratio"] = report.ratio(r["rate"], ref.get("rate"))
            r["cpu_ratio"] = report.ratio(r["cpu_us_per_msg"], ref.get("cpu_us_per_msg"))
            r["p50_ratio"] = report.ratio(r["p50_us"], ref.get("p50_us"))
            # The physical floors of the same run.
            r["rate_floor_ratio"] = report.ratio(r["rate"], floor.get("rate"))
            r["cpu_floor_ratio"] = report.ratio(r["cpu_us_per_msg"], floor.get("cpu_us_per_msg"))
            r["rate_synth_ratio"] = report.ratio(r["rate"], synth.get("rate"))
            r["p50_pingpong_ratio"] = report.ratio(r["p50_us"], pp.get("p50_us"))
            r["p99_pingpong_ratio"] = report.ratio(r["p99_us"], pp.get("p99_us"))
        return recs

    def print_table(self, transport: str, recs: list[dict]) -> None:
        rng = report.fmt_range
        cols = [
            report.Column("mode"),
            report.Column("rate", report.range_header("msgs/s"), get=lambda r: r["_s"]["rate"],
                          fmt=lambda s: rng(s, report.fmt_rate), align=">"),
            report.Column("rate_ratio", "x pyzmq", fmt=report.fmt_ratio),
            report.Column("rate_floor_ratio", "x C", fmt=report.fmt_ratio),
            report.Column("rate_synth_ratio", "x syn", fmt=report.fmt_ratio),
            report.Column("cpu", "CPU us/msg", get=lambda r: r["_s"]["cpu"],
                          fmt=lambda s: rng(s, report.fmt_us), align=">"),
            report.Column("cpu_ratio", "CPU x pyzmq", fmt=report.fmt_ratio),
            report.Column("cpu_floor_ratio", "CPU x C", fmt=report.fmt_ratio, wide_only=True),
            report.Column("lost", "lost", wide_only=True),
        ]
        if self.latency:
            cols += [
                report.Column("p50", "p50 us", get=lambda r: r["_s"]["p50"],
                              fmt=lambda s: rng(s, report.fmt_us), align=">"),
                report.Column("p50_ratio", "p50 x pyzmq", fmt=report.fmt_ratio),
                report.Column("p50_pingpong_ratio", "x C pp", fmt=report.fmt_ratio),
                report.Column("p99", "p99 us", get=lambda r: r["_s"]["p99"],
                              fmt=lambda s: rng(s, report.fmt_us), align=">"),
            ]
        dist = sum(r["disturbed_runs"] for r in recs)
        note = (f"ratios: x pyzmq to {REFERENCE}, x C to {FLOOR} (rate, CPU), x syn to "
                f"{SYNTHETIC} (rate), x C pp to {PINGPONG} (p50)")
        if dist:
            note += f"; {dist} run(s) kept although disturbed"
        if not report.WIDE:
            lost = [f"{r['mode']} {r['lost']:,}" for r in recs if r["lost"]]
            note += ("\n   lost messages: " + ", ".join(lost)) if lost else "; no message lost"
        for r in recs:
            if r["na"]:
                note += f"\n   {r['mode']}: {r['na']}"
        title = (f"bus over {transport}: {self.n:,} msgs x {self.repeats}"
                 + (f", {self.rtt:,} round trips" if self.latency else "")
                 + (f" pinned to CPU {self.pin}" if self.latency and self.pin is not None else "")
                 + (", pinged by bench/floor_pingpong.c"
                    if self.latency and self.c_pinger and transport != "inproc" else "")
                 + f" (peer: {self._peer_label(transport)})")
        report.print_table(recs, cols, title=title, note=note)
        by_mode = {r["mode"]: r for r in recs}
        for a, b in PAIRS:
            if a in by_mode and b in by_mode:
                ra, rb = by_mode[a], by_mode[b]
                print(f"   {a} / {b}: rate {report.fmt_ratio(report.ratio(ra['rate'], rb['rate']))}"
                      f", CPU per message "
                      f"{report.fmt_ratio(report.ratio(ra['cpu_us_per_msg'], rb['cpu_us_per_msg']))}")
        self.print_checks(by_mode)

    def print_checks(self, by_mode: dict) -> None:
        """The coalescing targets, where both rows are in the table."""
        line = report.target_line
        coal, nil, native = by_mode.get(COALESCED), by_mode.get(COALESCED_NIL), by_mode.get("native")
        floor, synth, pp = (m in by_mode for m in (FLOOR, SYNTHETIC, PINGPONG))
        if coal and synth:
            print(line(f"{COALESCED} / {SYNTHETIC}: rate", coal["rate_synth_ratio"], ">=", 0.8))
        if coal and floor:
            print(line(f"{COALESCED} / {FLOOR}: CPU per message", coal["cpu_floor_ratio"],
                       "<=", 1.0))
        if nil and floor:
            print(line(f"{COALESCED_NIL} / {FLOOR}: rate", nil["rate_floor_ratio"], ">=", 3.0))
        if native and pp:
            print(line(f"native / {PINGPONG}: p50", native["p50_pingpong_ratio"], "<=", 1.1))
        if coal and native and self.latency:
            added = coal["p99_us"] - native["p99_us"]
            print(line(f"{COALESCED} round trip, reply held up to {COALESCE_DELAY * 1e6:.0f} us: "
                       "p99 over native", added, "<=", COALESCE_DELAY * 1e6 + 50,
                       fmt=lambda v: "-" if math.isnan(v) else f"{v:+.0f} us"))
            held = by_mode.get(PINGPONG, {}).get("held_p99_us", math.nan)
            if not math.isnan(held):
                floor_added = held - by_mode[PINGPONG]["p99_us"]
                print(f"   the floor of a held reply: {PINGPONG} with its responder holding "
                      f"each answer {COALESCE_DELAY * 1e6:.0f} us: p99 {floor_added:+.0f} us")

    def _peer_label(self, transport):
        if transport == "inproc":
            return "thread in this process"
        return f"process, {self.peer.backend}" if self.peer else "-"

    def run(self) -> list[dict]:
        print(f"\n## bus: {len(self.payload)}-byte msgpack map over PUSH/PULL, "
              f"subscriber capacity on a pre-queued flood; round trips one at a time")
        for note in self.notes:
            print(f"   skipped {note}")
        if not self.modes:
            return []
        records = []
        try:
            if any(t != "inproc" for t in self.transports):
                self.peer = PeerProcess(self.peer_backend)
            for transport in self.transports:
                recs = self.run_transport(transport)
                self.print_table(transport, recs)
                records += recs
                if self.publish and self.publish_modes and transport != "inproc":
                    recs = publish.run(self, transport, self.publish_modes, self.publish_n)
                    publish.print_table(transport, recs, self.publish_n, self.repeats)
                    records += recs
        finally:
            if self.peer is not None:
                self.peer.close()
            self.endpoints.cleanup()
        print("\n" + TERMS, flush=True)
        for r in records:
            r.pop("_s", None)
        return records


def run(opts) -> list[dict]:
    return BusBench(opts).run()
