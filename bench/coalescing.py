"""Coalescing as the benchmark sees it: what this build has, and
the wire form of a coalesced payload (docs/wire.md, ext 127), its header
written by the package (csrc/wire.h), not by any publisher.

A row that needs what the build lacks prints :data:`NO_COALESCING` and no
figure, so that the rows light up once the build has it.
"""
from __future__ import annotations

import os
from typing import Any

NO_COALESCING = "n/a: this build has no coalescing"


def coalesced_payload(message: bytes, k: int) -> bytes:
    """k copies of one packed message as one coalesced payload (docs/wire.md,
    ext 127), the header from csrc/wire.h through upcall._codec."""
    from upcall._codec import _coalesced_payload
    return _coalesced_payload(message * k)


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
