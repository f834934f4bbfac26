"""The compression codecs as a foreign peer writes and reads them: one row
per codec of the C core's table (csrc/codec.c), with its wire id
(docs/wire.md: the codec field of the ext 126 flags) and the Python package
that implements its format independently of upcall.

The codec suite (tests/codec/test_compression.py) runs every case for every
codec of ``upcall.COMPRESSION`` against its row here; the build without the
codecs' libraries (tests/packaging/test_no_codecs.py) sends each row's frame
to a build that must refuse it."""
import functools

import pytest


class Reference:
    """A codec's format, written and read by its Python package.

    most_from(frame, sized): the most the C core may take the frame to
    decompress to (its row's max_decompressed), which the bomb tests stay
    under."""

    def __init__(self, name, wire_id, library, module, compress, decompress, most_from):
        self.name = name
        self.wire_id = wire_id
        self.library = library          # what a build needs for it (its error messages)
        self.module = module
        self._compress = compress
        self._decompress = decompress
        self._most_from = most_from
        self.lib = None

    def load(self):
        """The row with its package imported; the test skips without it."""
        if self.lib is None:
            self.lib = pytest.importorskip(self.module)
        return self

    def compress(self, data, sized=True):
        """One frame of data; sized: with its content size in the frame's
        header where the format carries one (a format without ignores it)."""
        return _compressed(self.name, bytes(data), sized)

    def decompress(self, frame, size):
        return self._decompress(self.lib, bytes(frame), size)

    def most_from(self, frame, sized=True):
        return self._most_from(self.lib, frame, sized)


# One row per codec, in the order of the C core's table.
_ROWS = [
    # One raw LZ4 block (no size in it); LZ4 stores at most 255 bytes of a
    # run per byte.
    Reference("lz4", 1, "liblz4", "lz4.block",
              lambda m, data, sized: m.compress(data, store_size=False),
              lambda m, frame, size: m.decompress(frame, uncompressed_size=size),
              lambda m, frame, sized: len(frame) * 255 + 64),
    # One zstd frame, its content size in its header unless told otherwise;
    # without it, at most a 128 KiB block per 4 bytes.
    Reference("zstd", 2, "libzstd", "zstandard",
              lambda m, data, sized: m.ZstdCompressor(write_content_size=sized).compress(data),
              lambda m, frame, size: m.ZstdDecompressor().decompress(frame, max_output_size=size),
              lambda m, frame, sized: (m.frame_content_size(frame) if sized
                                       else (len(frame) // 4 + 1) * 128 * 1024)),
]
REFERENCE = {r.name: r for r in _ROWS}

# A codec id past every known one: refused as unknown flags.
UNKNOWN_CODEC = max(r.wire_id for r in _ROWS) + 1


@functools.lru_cache(maxsize=None)
def _compressed(name, data, sized):
    r = REFERENCE[name]
    return r._compress(r.lib, data, sized)
