"""Coalescing as the benchmark sees it: what this build has, and
the wire form of a coalesced payload, built by hand (docs/wire.md, ext 127).

A row that needs what the build lacks prints :data:`NO_COALESCING` and no
figure, so that the rows light up once the build has it.
"""
from __future__ import annotations

import os
from typing import Any

NO_COALESCING = "n/a: this build has no coalescing"


def coalesced_payload(message: bytes, k: int) -> bytes:
    """k copies of one packed message as one coalesced payload (docs/wire.md,
    ext 127: ``c9 <u32 BE length> 7f 01 <messages>``), built by hand."""
    body = b"\x01" + message * k
    return b"\xc9" + len(body).to_bytes(4, "big") + b"\x7f" + body


_FEATURES: dict[str, Any] = {}


def coalesced_receive(ub) -> bool:
    """Whether this build's subscriptions split coalesced payloads (they then
    count zmq messages apart: stats["zmq_received"], docs/wire.md)."""
    if "rx" not in _FEATURES:
        from upcall._bus import _synthetic_subscribe
        with ub.Bus() as bus:
            sub = _synthetic_subscribe(bus, lambda msg: None, count=1)
            try:
                _FEATURES["rx"] = "zmq_received" in sub.stats
            finally:
                sub.close()
    return _FEATURES["rx"]


def coalescing_kwargs(ub, delay: float | None = None) -> dict | None:
    """publisher() keywords of a coalescing publisher (holding a message at
    most ``delay`` seconds if given), or None if this build has none.  The
    delay's keyword is tried as ``max_delay``, then ``linger``."""
    key = ("tx", delay)
    if key not in _FEATURES:
        tries = [{"coalesce": True}] if delay is None else [
            {"coalesce": True, "max_delay": delay}, {"coalesce": True, "linger": delay}]
        _FEATURES[key] = None
        for kw in tries:
            try:
                with ub.Bus() as bus:
                    bus.publisher(f"inproc://upcall-bench-probe-{os.getpid()}", kind="push",
                                  bind=True, **kw).close()
            except (TypeError, ValueError):     # no such keyword / not this combination
                continue
            _FEATURES[key] = kw
            break
    return _FEATURES[key]
