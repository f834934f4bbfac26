# The codec's C-level interface, cimported by other upcall modules (the bus
# trampolines): encode straight into a caller's mp_writer, decode straight
# from a (pointer, size) view.
from libc.stdint cimport int64_t, uint32_t, uint64_t
from cpython.object cimport PyObject

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
    # Packing for a publisher (pack_oob): buffers of _oob_threshold bytes or
    # more are collected in _oob (OobBuffer) and referenced (ext 126).
    cdef bint _oob_on
    cdef list _oob
    cdef Py_ssize_t _oob_threshold
    # Append obj's encoding to w (w is not reset).  -1 with an exception set
    # (TypeError, OverflowError, ValueError for too deep, MemoryError).
    cdef int pack_into(self, object obj, mp_writer *w) except -1
    cdef int _pack(self, object obj, mp_writer *w, Py_ssize_t depth) except -1
    cdef object _encode(self, object obj)
    # pack_into for a publisher: returns the list of OobBuffer to send as
    # frames 2, 3, ... (None: none).  ExtType 126/127 refused (ValueError).
    cdef object pack_oob(self, object obj, mp_writer *w, Py_ssize_t threshold)


cdef class OobBuffer:
    cdef Py_buffer view
    cdef bint held
    cdef size_t ref_at             # where its reference's 16 bytes start in the payload


cdef class Decoder:
    cdef void *_state              # ucd_config (upcall/_codec_c.h): limits + key cache
    # Decode exactly one object from data[0:size]; raises DecodeError.
    cdef object decode_view(self, const char *data, Py_ssize_t size)
    # decode_msg for a message with no frame after its payload.
    cdef object decode_wire(self, const char *data, Py_ssize_t size)
    # decode_view for a subscription's message: extra points to n_extra
    # (data, size) frames after the payload (uc_frame's layout); its
    # out-of-band references become make(ctx, i, codec, size, &err) (see
    # ucd_frames in _codec_c.h), each frame must be
    # referenced exactly once, a coalesced payload is refused.
    cdef object decode_msg(self, const char *data, Py_ssize_t size, const void *extra,
                           size_t n_extra,
                           object (*make)(void *ctx, size_t i, int codec, uint64_t size, int *err),
                           void *ctx)
    cdef object _decode_obj(self, object data, str argname)
