"""The messages every benchmark section sends, decodes or delivers.

* :data:`SMALL_MESSAGE`: a 5-key map, 77 bytes packed, the message of the
  codec's small workload, of the upcall and contention rows with a map
  payload, and of every bus flood, ping and reply (:func:`small_payload`,
  under :data:`TOPIC`);
* :data:`NIL`: the packed nil, the payload of the bare upcall rows;
* :func:`timestamped_payload`: the small map plus its send time, for the
  paced publisher of the contention section;
* :func:`large_document`: the codec's large workload, nested maps, arrays,
  strings and floats generated from a fixed seed.
"""
import random

import upcall

TOPIC = b"bench.small"

SMALL_MESSAGE = {
    "id": 1700000000123456,
    "sym": "AAPL.OQ",
    "px": 187.25,
    "sizes": [100, 200, 300, 400, 500],
    "venue": "NASDAQ-GS/XNGS",
}

NIL = b"\xc0"

#: Placeholder of the send time: a uint64 (0xcf + 8 bytes) found by its bytes.
_T_PLACEHOLDER = 2 ** 63
_T_PACKED = b"\xcf\x80\x00\x00\x00\x00\x00\x00\x00"


def small_payload() -> bytes:
    """SMALL_MESSAGE packed."""
    return bytes(upcall.packb(SMALL_MESSAGE))


def timestamped_payload() -> tuple[bytearray, int]:
    """SMALL_MESSAGE with a key ``"t"`` packed, and the offset of t's 8 bytes.

    The sender writes its CLOCK_MONOTONIC ns there (big-endian) right before
    each send; the receiver reads ``msg["t"]``.
    """
    packed = bytearray(upcall.packb({**SMALL_MESSAGE, "t": _T_PLACEHOLDER}))
    return packed, bytes(packed).index(_T_PACKED) + 1


_WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
          "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"]
_KEYS = ["id", "name", "price", "qty", "tags", "meta", "ts", "venue", "side", "book",
         "account", "status", "notes", "levels", "score", "owner"]


def _text(rng):
    n = rng.randint(3, 40)
    if rng.random() < 0.1:   # some non-ASCII text
        return "".join(rng.choice("àéîõüßñçøæ€中文かな") for _ in range(n // 2 + 1))
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ0123456789_-.") for _ in range(n))


def _record(rng, depth=0):
    """One realistic record: a map of scalars, a list of floats, nested maps."""
    rec = {
        "id": rng.randrange(1 << 40),
        "name": _text(rng),
        "price": round(rng.uniform(0, 5000), 4),
        "qty": rng.randint(-1000, 100000),
        "side": rng.choice(("buy", "sell")),
        "tags": [rng.choice(_WORDS) for _ in range(rng.randint(0, 6))],
        "levels": [rng.uniform(-1e6, 1e6) for _ in range(rng.randint(2, 12))],
        "status": rng.choice((None, True, False, "open", "filled")),
    }
    if depth < 2:
        rec["meta"] = {rng.choice(_KEYS): _text(rng) for _ in range(rng.randint(1, 5))}
        rec["book"] = [_record(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rec


def large_document(target_bytes, seed=20240601):
    """A deterministic document of about target_bytes packed bytes."""
    rng = random.Random(seed)
    # Size the record list by packing a sample of records.
    sample = [_record(rng) for _ in range(50)]
    per_record = len(upcall.packb(sample)) / len(sample)
    n = max(1, int(target_bytes / per_record))
    rng = random.Random(seed)
    return {"version": 3, "source": "upcall-bench", "records": [_record(rng) for _ in range(n)]}
