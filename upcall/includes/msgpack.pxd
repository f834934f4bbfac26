# Cython declarations of csrc/msgpack.h: the C msgpack reader and writer.
# (Public: shipped in the wheel with the headers it names, upcall.get_include().)
# cimport from here to read or write msgpack without Python objects, e.g.
# in a nogil native handler, or to keep one reusable mp_writer per publisher.
from libc.stdint cimport int8_t, int64_t, uint32_t, uint64_t


cdef extern from "msgpack.h" nogil:
    enum:
        MP_OK
        MP_ERR_TRUNCATED
        MP_ERR_RESERVED
        MP_ERR_LENGTH
        MP_ERR_DEPTH
        MP_ERR_TIMESTAMP
        MP_ERR_TRAILING
        MP_ERR_NOT_FOUND
        MP_ERR_TYPE
        MP_ERR_NOMEM
        MP_ERR_TOO_BIG
        MP_SKIP_MAX_DEPTH

    const char *mp_errname(int err)
    const char *mp_strerror(int err)

    # ---- reader ----
    ctypedef enum mp_type:
        MP_NIL
        MP_BOOL
        MP_UINT
        MP_INT
        MP_FLOAT32
        MP_FLOAT64
        MP_STR
        MP_BIN
        MP_ARRAY
        MP_MAP
        MP_EXT
        MP_TIMESTAMP

    cdef struct mp_ts:
        int64_t sec
        uint32_t nsec

    cdef union mp_value:
        int b
        uint64_t u
        int64_t i
        double f
        mp_ts ts

    ctypedef struct mp_item:
        mp_type type
        int8_t ext_type
        uint32_t len
        const char *ptr
        mp_value v

    ctypedef struct mp_reader:
        const char *data
        size_t len
        size_t pos
        int err
        size_t err_pos

    void mp_reader_init(mp_reader *r, const char *data, size_t len)
    int mp_read(mp_reader *r, mp_item *it)
    int mp_skip(mp_reader *r, int max_depth)
    int mp_validate(const char *data, size_t len, int max_depth, size_t *err_pos)
    int mp_map_find(mp_reader *r, const char *key, size_t klen, int max_depth)

    # ---- writer ----
    ctypedef struct mp_writer:
        char *data
        size_t len
        size_t cap

    void mp_writer_init(mp_writer *w)
    void mp_writer_free(mp_writer *w)
    void mp_writer_reset(mp_writer *w)
    int mp_writer_grow(mp_writer *w, size_t extra)
    int mp_writer_reserve(mp_writer *w, size_t n)
    int mp_write_raw(mp_writer *w, const void *p, size_t n)
    int mp_write_nil(mp_writer *w)
    int mp_write_bool(mp_writer *w, int v)
    int mp_write_uint(mp_writer *w, uint64_t v)
    int mp_write_int(mp_writer *w, int64_t v)
    int mp_write_float32(mp_writer *w, float v)
    int mp_write_float64(mp_writer *w, double v)
    int mp_write_str_header(mp_writer *w, size_t n)
    int mp_write_bin_header(mp_writer *w, size_t n)
    int mp_write_str(mp_writer *w, const char *s, size_t n)
    int mp_write_bin(mp_writer *w, const void *s, size_t n)
    int mp_write_array_header(mp_writer *w, size_t n)
    int mp_write_map_header(mp_writer *w, size_t n)
    int mp_write_ext_header(mp_writer *w, int8_t type, size_t n)
    int mp_write_ext(mp_writer *w, int8_t type, const void *data, size_t n)
    int mp_write_timestamp(mp_writer *w, int64_t sec, uint32_t nsec)
