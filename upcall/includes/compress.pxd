# Cython declarations of the C core's frame compression (csrc/compress.h).
# (Internal; not installed: the bridge's own, built from the source tree.)
from libc.stdint cimport uint64_t

cdef extern from "compress.h" nogil:
    ctypedef struct uc_cbuf:
        pass
    const size_t UC_LZ4_MIN_FRAME
    const unsigned int UC_LZ4_MAX_INPUT
    int uc_lz4_available()
    uc_cbuf *uc_lz4_frame(const void *src, size_t n)
    int uc_lz4_worth_it(const void *src, size_t n)
    const void *uc_cbuf_data(const uc_cbuf *b)
    size_t uc_cbuf_size(const uc_cbuf *b)
    void uc_cbuf_put(uc_cbuf *b)
    int uc_lz4_decompress(const void *src, size_t n, void *dst, size_t size)
    uint64_t uc_lz4_max_decompressed(size_t n)
