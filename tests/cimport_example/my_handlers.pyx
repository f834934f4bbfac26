# cython: language_level=3
"""A downstream user's own handlers, compiled by tests/packaging/test_cimport.py.

Built the way a user builds one (see docs/handlers.md): cythonize with
upcall importable, include_dirs=upcall.get_include().
"""
from upcall.handler cimport Handler
from upcall.native cimport NativeHandler, map_find, read_number
from upcall.includes.bus cimport uc_msg
from upcall.includes.msgpack cimport mp_reader, mp_reader_init


cdef class Collect(Handler):
    """Keeps every message; reached from the trampoline through the vtable."""
    cdef public list got

    def __init__(self):
        self.got = []

    cpdef on_message(self, object msg):
        self.got.append(msg)


cdef class Above(NativeHandler):
    """Selects the map messages whose "px" is above a threshold, without the GIL."""
    cdef double threshold
    cdef public long long seen

    def __init__(self, double threshold, target=None):
        self.threshold = threshold
        self.target = target

    cdef Py_ssize_t select(self, const uc_msg *batch, size_t n, size_t *selected) noexcept nogil:
        cdef size_t i, k = 0
        cdef mp_reader r
        cdef double v
        for i in range(n):
            self.seen += 1
            mp_reader_init(&r, batch[i].payload.data, batch[i].payload.size)
            if map_find(&r, "px", 2) == 0 and read_number(&r, &v) == 0 and v > self.threshold:
                selected[k] = i
                k += 1
        return <Py_ssize_t>k
