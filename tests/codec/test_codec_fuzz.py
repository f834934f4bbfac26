"""Fuzzing unpackb: random and mutated inputs raise only DecodeError.

Never a crash, a hang, another exception type or a huge allocation.  The C
reader has its own libFuzzer harness (csrc/fuzz/fuzz_msgpack.c).
"""
import random

from hypothesis import given, settings, strategies as st

import upcall
from upcall import DecodeError, ExtType, Timestamp

SEEDS = [
    upcall.packb(v) for v in (
        {"id": 123456, "sym": "AAPL.OQ", "px": 187.25, "sizes": [100, 200, 300], "venue": "NASDAQ"},
        [None, True, False, -1, 2**64 - 1, -(2**63), 1.5, "é", b"\x00", Timestamp(-1, 5), ExtType(3, b"ab")],
        {"nested": {"a": [[], {}, [1, [2, [3]]]], "b": {"c": {"d": "x" * 40}}}},
        ["x" * 300, b"y" * 300, list(range(20)), {str(i): i for i in range(20)}],
        Timestamp(2**40, 999999999),
    )
]


def check(data, **kw):
    try:
        upcall.unpackb(data, **kw)
    except DecodeError as e:
        assert 0 <= e.offset <= len(data)
        assert e.reason
    # anything else propagates and fails the test


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes(data):
    check(data)


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(
    # byte values biased toward headers with lengths
    [0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xd4, 0xd8, 0xd9, 0xda, 0xdb, 0xdc, 0xdd, 0xde, 0xdf,
     0xff, 0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc1, 0xca, 0xcb, 0xcf, 0xd3]),
    max_size=40))
def test_random_headers(bs):
    check(bytes(bs))
    check(bytes(bs), max_depth=3, max_len=4)


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from(SEEDS), st.data())
def test_hypothesis_mutations(seed, data):
    b = bytearray(seed)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(b) - 1))
        b[i] = data.draw(st.integers(0, 255))
    check(bytes(b))


def test_deterministic_mutation_loop():
    rng = random.Random(1234)
    ops = 0
    for seed in SEEDS:
        check(seed)
        for _ in range(4000):
            b = bytearray(seed)
            for _ in range(rng.randint(1, 6)):
                kind = rng.randrange(5)
                i = rng.randrange(len(b)) if b else 0
                if kind == 0 and b:
                    b[i] = rng.randrange(256)
                elif kind == 1 and b:
                    b[i] ^= 1 << rng.randrange(8)
                elif kind == 2:
                    b[i:i] = bytes([rng.choice([0xc1, 0xdd, 0xdf, 0xdb, 0xc9, 0xff, 0x00])])
                elif kind == 3 and b:
                    del b[i:i + rng.randint(1, 8)]
                else:
                    b = b[:rng.randrange(len(b) + 1)]
            check(bytes(b))
            ops += 1
    assert ops == 4000 * len(SEEDS)


def test_every_single_byte_and_pair():
    for a in range(256):
        check(bytes([a]))
        for b in (0x00, 0x01, 0x7f, 0x80, 0xff):
            check(bytes([a, b]))
