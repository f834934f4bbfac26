"""The publishing rows of the --bus section: the sending side.

A sender in the benchmark process (a plain C ``zmq_send`` loop in its own
process for ``c-send``) connects a PUSH with SNDHWM 0 to a receiver that only
counts (bench/count_pull.c, its own process, coalesced messages split with
the core's ``mp_skip``) and sends N messages as fast as it can; nothing
blocks, so the figure is the sender's.  ``rate`` = N / (first send to last
send returning, and ``flush()`` for the coalescing rows); ``cpu_us_per_msg``
= the sending process's CPU (its libzmq I/O thread included) over that span
per message; ``zmq_messages`` = zmq messages the receiver got; ``lost`` = N -
counted.  Ratios to ``pyzmq+msgspec send`` (``x pyzmq``) and ``c-send``
(``x C``) of the same transport and run.  ``run(rig, transport, modes, n)``
takes the calling section's :class:`bench.harness.Rig` (its endpoints,
repeats, stable runs, upcall module and payload).
"""
from __future__ import annotations

import gc
import itertools
from typing import Callable

from bench import harness, measure, progress, report
from bench.floors import c_program
from bench.harness import CountingReceiver, Rig
from bench.peer import have_pyzmq
from bench.workload import SMALL_MESSAGE, TOPIC


def _have_msgspec() -> bool:
    try:
        import msgspec  # noqa: F401
    except ImportError:
        return False
    return True


PUB_FLOOR = "c-send"
PUB_REFERENCE = "pyzmq+msgspec send"
#: The publishing rows: a plain C zmq_send loop (bench/floor_push.c), the
#: careful pyzmq loop (send(topic, SNDMORE) + send(msgspec.msgpack.encode(obj))),
#: and upcall's Publisher: send(topic, obj), send_packed(topic, payload),
#: send_many(topic, objs), uncoalesced and with coalesce=True.
PUBLISH_MODES = [PUB_FLOOR, PUB_REFERENCE, "send", "send_packed", "send_many",
                 "send+coalesce", "send_many+coalesce"]


class PublishRun:
    """prepare(): start the counting receiver (bench/count_pull.c, its own
    process, bound); run(): connect a sender, send n messages as fast as it
    can (SNDHWM 0: nothing blocks), time that, then let the receiver count
    them (coalesced ones split), so that lost = n - counted."""

    def __init__(self, rig: Rig, transport: str, mode: str, n: int):
        self.b, self.transport, self.mode = rig, transport, mode
        self.n = n
        self.receiver: CountingReceiver | None = None
        self.endpoint = ""

    def _stop_receiver(self):
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None

    def prepare(self):
        self._stop_receiver()
        self.endpoint = self.b.endpoints.new(self.transport)
        self.receiver = CountingReceiver(self.endpoint, self.n)
        gc.collect()

    def _send_upcall(self) -> tuple[dict, Callable[[], None]]:
        """(figures, close)."""
        ub, n = self.b.ub, self.n
        coalesce = self.mode.endswith("+coalesce")
        bus = ub.Bus()
        pub = bus.publisher(self.endpoint, kind="push", bind=False, sndhwm=0, coalesce=coalesce)

        def close():
            pub.close()
            bus.close()
        obj, payload = SMALL_MESSAGE, self.b.payload
        span = measure.CpuSpan.start()
        if self.mode.startswith("send_many"):
            pub.send_many(TOPIC, itertools.repeat(obj, n))
        elif self.mode == "send_packed":
            send_packed = pub.send_packed
            for _ in range(n):
                send_packed(TOPIC, payload)
        else:
            send = pub.send
            for _ in range(n):
                send(TOPIC, obj)
        if coalesce:
            pub.flush()
        span.stop()
        return {"seconds": span.wall, "cpu": span.cpu}, close

    def _send_pyzmq(self) -> tuple[dict, Callable[[], None]]:
        import msgspec
        import zmq
        ctx = zmq.Context(1)
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.LINGER, -1)
        sock.connect(self.endpoint)

        def close():
            sock.close()
            ctx.term()
        send, more, encode, obj = sock.send, zmq.SNDMORE, msgspec.msgpack.encode, SMALL_MESSAGE
        span = measure.CpuSpan.start()
        for _ in range(self.n):
            send(TOPIC, more)
            send(encode(obj))
        span.stop()
        return {"seconds": span.wall, "cpu": span.cpu}, close

    def run(self) -> dict:
        n = self.n
        close = None
        try:
            if self.mode == PUB_FLOOR:
                sent = harness.floor_push(self.endpoint, n, self.b.payload)
            elif self.mode == PUB_REFERENCE:
                sent, close = self._send_pyzmq()
            else:
                sent, close = self._send_upcall()
            out = self.receiver.result()
        finally:
            if close is not None:
                close()
            self._stop_receiver()
        delivered = out.get("delivered", 0)
        return {"lost": n - delivered, "zmq_messages": out.get("zmq_messages"),
                "seconds": sent["seconds"], "rate": n / sent["seconds"],
                "cpu_us_per_msg": sent["cpu"] / n * 1e6}


def available_modes(ub) -> tuple[list[str], list[str]]:
    """(publishing rows that can run here, notes on the ones that cannot)."""
    for prog in ("count_pull", "floor_push"):
        path, why = c_program(prog)
        if path is None:
            return [], [f"publishing rows: {why}"]
    ok, notes = [], []
    for m in PUBLISH_MODES:
        if m == PUB_REFERENCE and not (have_pyzmq() and _have_msgspec()):
            notes.append(f"{m}: pyzmq or msgspec not installed")
        elif m not in (PUB_FLOOR, PUB_REFERENCE) and ub is None:
            notes.append(f"{m}: upcall._bus not built")
        else:
            ok.append(m)
    return ok, notes


def run(rig: Rig, transport: str, modes: list[str], n: int) -> list[dict]:
    """The publishing rows of one transport, n messages each, interleaved and
    repeated rig.repeats times."""
    runs: dict[str, list] = {m: [] for m in modes}
    disturbed: dict[str, int] = {m: 0 for m in modes}
    order = list(measure.interleave(modes, rig.repeats))
    with progress.Progress(f"publishing {transport}", len(order)) as shown:
        for _, mode in order:
            res, info = rig.stable(PublishRun(rig, transport, mode, n))
            disturbed[mode] += info.disturbed
            runs[mode].append(res)
            shown.step(f"send {mode}")
    recs = []
    for mode in modes:
        rate = measure.summarize(r["rate"] for r in runs[mode])
        cpu = measure.summarize(r["cpu_us_per_msg"] for r in runs[mode])
        lost = [r["lost"] for r in runs[mode] if r["lost"] is not None]
        na = sorted({r["na"] for r in runs[mode] if r.get("na")})
        zmq_msgs = [r["zmq_messages"] for r in runs[mode] if r.get("zmq_messages") is not None]
        recs.append({
            # Its own section (``--json``, ``--plot``): sent, not delivered.
            "section": "bus publishing", "part": "publish", "transport": transport,
            "mode": mode, "n": n,
            "repeats": rig.repeats,
            "rate": rate.median, "rate_min": rate.min, "rate_max": rate.max,
            "cpu_us_per_msg": cpu.median, "cpu_us_min": cpu.min, "cpu_us_max": cpu.max,
            "lost": sum(lost) if lost else None, "na": "; ".join(na) or None,
            "zmq_messages": zmq_msgs[-1] if zmq_msgs else None,
            "disturbed_runs": disturbed[mode], "_s": {"rate": rate, "cpu": cpu},
        })
    by_mode = {r["mode"]: r for r in recs}
    ref, floor = by_mode.get(PUB_REFERENCE, {}), by_mode.get(PUB_FLOOR, {})
    for r in recs:
        r["rate_ratio"] = report.ratio(r["rate"], ref.get("rate"))
        r["cpu_ratio"] = report.ratio(r["cpu_us_per_msg"], ref.get("cpu_us_per_msg"))
        r["rate_floor_ratio"] = report.ratio(r["rate"], floor.get("rate"))
        r["cpu_floor_ratio"] = report.ratio(r["cpu_us_per_msg"], floor.get("cpu_us_per_msg"))
    return recs


def print_table(transport: str, recs: list[dict], n: int, repeats: int) -> None:
    rng = report.fmt_range
    cols = [
        report.Column("mode"),
        report.Column("rate", report.range_header("msgs/s"), get=lambda r: r["_s"]["rate"],
                      fmt=lambda s: rng(s, report.fmt_rate), align=">"),
        report.Column("rate_ratio", "x pyzmq", fmt=report.fmt_ratio),
        report.Column("rate_floor_ratio", "x C", fmt=report.fmt_ratio),
        report.Column("cpu", "sender CPU us/msg", get=lambda r: r["_s"]["cpu"],
                      fmt=lambda s: rng(s, report.fmt_us), align=">"),
        report.Column("cpu_ratio", "CPU x pyzmq", fmt=report.fmt_ratio),
        report.Column("cpu_floor_ratio", "CPU x C", fmt=report.fmt_ratio),
        report.Column("zmq_messages", "zmq msgs"),
        report.Column("lost", "lost"),
    ]
    note = f"ratios: x pyzmq to {PUB_REFERENCE}, x C to {PUB_FLOOR}"
    dist = sum(r["disturbed_runs"] for r in recs)
    if dist:
        note += f"; {dist} run(s) kept although disturbed"
    for r in recs:
        if r["na"]:
            note += f"\n   {r['mode']}: {r['na']}"
    title = (f"publishing over {transport}: {n:,} msgs x {repeats}, "
             f"sender = this process, receiver = bench/count_pull.c")
    report.print_table(recs, cols, title=title, note=note)
    by_mode = {r["mode"]: r for r in recs}
    for mode, want in (("send+coalesce", 4.0), ("send", 1.5)):
        if mode in by_mode:
            print(report.target_line(f"{mode} / {PUB_REFERENCE}: rate",
                                     by_mode[mode]["rate_ratio"], ">=", want))
