"""The wire form of a coalesced payload, built by hand (docs/wire.md,
ext 127), so that the receive figures of the coalesced rows do not depend
on the publisher.
"""
from __future__ import annotations


def coalesced_payload(message: bytes, k: int) -> bytes:
    """k copies of one packed message as one coalesced payload (docs/wire.md,
    ext 127: ``c9 <u32 BE length> 7f 01 <messages>``), built by hand."""
    body = b"\x01" + message * k
    return b"\xc9" + len(body).to_bytes(4, "big") + b"\x7f" + body
