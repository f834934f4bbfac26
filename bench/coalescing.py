"""The wire form of a coalesced payload (docs/wire.md, ext 127), its header
written by the package (csrc/wire.h), not by any publisher, so that the
receive figures of the coalesced rows do not depend on the publisher.
"""
from __future__ import annotations


def coalesced_payload(message: bytes, k: int) -> bytes:
    """k copies of one packed message as one coalesced payload (docs/wire.md,
    ext 127), the header from csrc/wire.h through upcall._codec."""
    from upcall._codec import _coalesced_payload
    return _coalesced_payload(message * k)
