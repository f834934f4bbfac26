# Native handlers: run on the delivery thread with no GIL, over the raw
# zero-copy views of a batch, and pass on only the messages they select.
#
#     from upcall.native cimport NativeHandler, map_find
#     from upcall.includes.bus cimport uc_msg
#     from upcall.includes.msgpack cimport mp_reader, mp_reader_init, mp_read, mp_item
#
#     cdef class Big(NativeHandler):
#         cdef Py_ssize_t select(self, const uc_msg *batch, size_t n,
#                                size_t *selected) noexcept nogil:
#             ...   # read batch[i].payload.data/.size with mp_reader; no Python here
#
# ``select`` writes the indices (ascending) of the messages to hand on to
# ``self.target`` into ``selected`` (room for n) and returns how many; -1 ends
# the subscription.  If any are selected and ``target`` is not None, the
# trampoline takes the GIL once for the batch, decodes the selected messages
# with the usual codec and calls the target (a callable or an upcall.Handler).
from libc.stdint cimport int64_t, uint64_t

from upcall.includes.bus cimport uc_msg
from upcall.includes.msgpack cimport mp_reader, mp_item


cdef class NativeHandler:
    cdef public object target
    cdef Py_ssize_t select(self, const uc_msg *batch, size_t n, size_t *selected) noexcept nogil


cdef class Count(NativeHandler):
    cdef readonly uint64_t messages
    cdef readonly uint64_t bytes


cdef struct field_cond:
    int op              # COND_EQ, COND_NE, COND_GT, COND_GE, COND_LT, COND_LE
    int kind            # VAL_NIL, VAL_BOOL, VAL_INT, VAL_FLOAT, VAL_STR, VAL_BIN
    int64_t i
    double f
    const char *s       # VAL_STR/VAL_BIN: points into FieldFilter._refs
    size_t slen


cdef class FieldFilter(NativeHandler):
    cdef bytes _key
    cdef const char *_kptr       # into _key
    cdef size_t _klen
    cdef field_cond _conds[6]
    cdef int _n_conds
    cdef list _refs
    cdef readonly uint64_t seen
    cdef readonly uint64_t matched
    cdef readonly uint64_t missing
    cdef readonly uint64_t errors
    cdef bint _match(self, const mp_item *it) noexcept nogil


# Helpers for native handlers written elsewhere (imported through this
# module's C-API, so a user's extension needs no csrc/*.c of its own).
# Position r at the value of map key `key` (a str key) in the map at r's
# position: MP_OK, MP_ERR_NOT_FOUND, MP_ERR_TYPE (not a map) or a read error.
cdef int map_find(mp_reader *r, const char *key, size_t klen) noexcept nogil
# Read the value at r's position as a number: 0 and *out set, or -1 (not a
# number, or malformed).
cdef int read_number(mp_reader *r, double *out) noexcept nogil
