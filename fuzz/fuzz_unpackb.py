#!/usr/bin/env python3
"""atheris harness for the decode-to-Python path: msgpack bytes -> objects.

Run through fuzz/run.sh (or `make fuzz`), which builds the extension modules
with clang's ASan+UBSan and libFuzzer coverage instrumentation into
build/fuzz-py, so the fuzzer is guided by coverage of the C decoder
(_codec_c.h, csrc/msgpack.c) and memory errors there abort the run.

For every input the first byte picks the decoder's options (max_depth,
max_len, timestamp kind) and the rest is the payload.  Properties:

* decoding either returns an object or raises upcall.DecodeError with an
  offset within the input and a reason: any other exception, a crash or a
  sanitizer report is a finding;
* a decoded object packs again, and its canonical encoding is a fixed point
  (packb(unpackb(packb(obj))) == packb(obj));
* the strict limits agree with the default decoder: what decodes with a small
  max_depth/max_len also decodes with the defaults, to the same encoding.
"""
import sys

import atheris

with atheris.instrument_imports():
    import upcall
    from upcall import DecodeError, Decoder

DEPTHS = (512, 0, 1, 2, 3, 8, 64, 4096)
LENS = (None, 0, 1, 4, 16, 255, 65536, None)
DECODERS = {}


def decoder_for(opt):
    dec = DECODERS.get(opt)
    if dec is None:
        dec = Decoder(max_depth=DEPTHS[opt & 7], max_len=LENS[(opt >> 3) & 7],
                      timestamp="datetime" if opt & 0x40 else "timestamp")
        DECODERS[opt] = dec
    return dec


DEFAULT = Decoder()
ENCODERS = {}


def encoder_for(depth):
    enc = ENCODERS.get(depth)
    if enc is None:
        enc = ENCODERS[depth] = upcall.Encoder(max_depth=depth)
    return enc


def decode(dec, data):
    try:
        return True, dec.decode(data)
    except DecodeError as exc:
        if exc.offset is None or not 0 <= exc.offset <= len(data):
            raise AssertionError(f"offset {exc.offset!r} outside 0..{len(data)}: {exc}")
        if not exc.reason or not str(exc):
            raise AssertionError(f"DecodeError without reason/message: {exc!r}")
        return False, None


def test_one_input(raw):
    if not raw:
        return
    opt, data = raw[0] & 0x7f, raw[1:]
    dec = decoder_for(opt)
    ok, obj = decode(dec, data)
    # The same bytes through a memoryview and a bytearray (other buffer paths).
    ok2, _ = decode(dec, memoryview(bytearray(data)))
    if ok != ok2:
        raise AssertionError("bytes and bytearray decode differently")
    if not ok:
        return
    enc = encoder_for(dec.max_depth)
    packed = enc.encode(obj)
    again = decoder_for(opt & ~0x38).decode(packed)   # same depth, no max_len
    if enc.encode(again) != packed:
        raise AssertionError(f"not a fixed point: {data!r} -> {packed!r}")
    if dec is not DEFAULT and dec.timestamp == "timestamp" and dec.max_depth <= DEFAULT.max_depth:
        ok3, obj3 = decode(DEFAULT, data)
        if not ok3 or upcall.packb(obj3) != packed:
            raise AssertionError(f"limited decoder accepted what the default refused: {data!r}")


def main():
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
