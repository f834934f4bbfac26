# Cython declarations of the C core's frame compression (csrc/compress.h)
# and its codec table (csrc/codec.h).
# (Internal; not installed: the bridge's own, built from the source tree.)
from libc.stdint cimport uint64_t

cdef extern from "codec.h" nogil:
    ctypedef struct uc_codec:
        const char *name
        unsigned id
        int available
        const char *library
        uint64_t max_input
    const uc_codec *uc_codec_by_name(const char *name)
    const uc_codec *uc_codec_by_id(unsigned id)
    size_t uc_codec_count()
    const uc_codec *uc_codec_at(size_t i)

cdef extern from "compress.h" nogil:
    ctypedef struct uc_cbuf:
        pass
    const size_t UC_COMPRESS_MIN_FRAME
    uc_cbuf *uc_codec_frame(const uc_codec *c, const void *src, size_t n)
    int uc_codec_worth_it(const uc_codec *c, const void *src, size_t n)
    const void *uc_cbuf_data(const uc_cbuf *b)
    size_t uc_cbuf_size(const uc_cbuf *b)
    void uc_cbuf_put(uc_cbuf *b)
    int uc_codec_refuses(const uc_codec *c, const void *src, size_t n, uint64_t size)
    int uc_codec_decompress(const uc_codec *c, const void *src, size_t n, void *dst, size_t size)
