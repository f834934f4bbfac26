# The codec's C-level interface, cimported by other upcall modules (the bus
# trampolines): encode straight into a caller's mp_writer, decode straight
# from a (pointer, size) view.
from libc.stdint cimport int64_t, uint32_t

from upcall.includes.msgpack cimport mp_writer


cdef class Timestamp:
    cdef readonly int64_t seconds
    cdef readonly uint32_t nanoseconds


cdef class ExtType:
    cdef readonly int code
    cdef readonly bytes data


cdef class Encoder:
    cdef mp_writer _buf            # reused by encode(); see _busy
    cdef bint _busy                # _buf in use (re-entrant call: use a temporary)
    cdef Py_ssize_t _max_depth
    cdef int _small_streak         # encodes in a row much smaller than a big _buf
    cdef object _default           # default=: called with an object of a type it cannot pack, or None
    # Append obj's encoding to w (w is not reset).  -1 with an exception set
    # (TypeError, OverflowError, ValueError for too deep, MemoryError).
    cdef int pack_into(self, object obj, mp_writer *w) except -1
    cdef int _pack(self, object obj, mp_writer *w, Py_ssize_t depth) except -1
    cdef object _encode(self, object obj)


cdef class Decoder:
    cdef void *_state              # ucd_config (upcall/_codec_c.h): limits + key cache
    # Decode exactly one object from data[0:size]; raises DecodeError.
    cdef object decode_view(self, const char *data, Py_ssize_t size)
    cdef object _decode_obj(self, object data, str argname)
