# cython: language_level=3
"""Native handlers: filter or aggregate a firehose in C, without the GIL.

A :class:`NativeHandler` passed as the target of ``bus.subscribe`` runs on
the delivery thread with no GIL at all: its ``select`` method (C, ``nogil``)
sees each batch as the raw zero-copy views (``const uc_msg *batch, size_t
n``), reads what it needs with the C msgpack reader, and returns the indices
of the messages to hand on.  Only if it selects any, and its ``target`` is
not None, does the trampoline take the GIL: once for the batch, decoding the
selected messages with the usual codec and calling ``target`` for each.

Shipped here: :class:`Count` (a pure aggregator: counts messages and payload
bytes, upcalls nothing) and :class:`FieldFilter` (select the map messages
whose field satisfies a comparison).  Write your own in Cython with
``from upcall.native cimport NativeHandler`` (see native.pxd).
"""
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcmp

from upcall.includes.bus cimport uc_msg
from upcall.includes.msgpack cimport *

cdef enum:
    COND_EQ = 1
    COND_NE
    COND_GT
    COND_GE
    COND_LT
    COND_LE

cdef enum:
    VAL_NIL = 1
    VAL_BOOL
    VAL_INT
    VAL_FLOAT
    VAL_STR
    VAL_BIN

# Nesting the key lookup may skip through (values of other keys).
cdef int _MAX_DEPTH = 64


cdef int map_find(mp_reader *r, const char *key, size_t klen) noexcept nogil:
    return mp_map_find(r, key, klen, _MAX_DEPTH)


cdef int read_number(mp_reader *r, double *out) noexcept nogil:
    cdef mp_item it
    if mp_read(r, &it) != MP_OK:
        return -1
    if it.type == MP_UINT:
        out[0] = <double>it.v.u
    elif it.type == MP_INT:
        out[0] = <double>it.v.i
    elif it.type == MP_FLOAT32 or it.type == MP_FLOAT64:
        out[0] = it.v.f
    else:
        return -1
    return 0


cdef class NativeHandler:
    """Base class of native (nogil) handlers.

    ``NativeHandler(target=None)``: ``target`` receives the selected
    messages (a callable or an ``upcall.Handler``; None: nothing is
    upcalled).  The base class selects every message (a pass-through).
    One instance serves one subscription at a time: its counters are plain
    fields, updated by that subscription's delivery thread.
    """

    def __init__(self, target=None):
        self.target = target

    cdef Py_ssize_t select(self, const uc_msg *batch, size_t n, size_t *selected) noexcept nogil:
        cdef size_t i
        for i in range(n):
            selected[i] = i
        return <Py_ssize_t>n


cdef class Count(NativeHandler):
    """Counts messages and payload bytes on the delivery thread; upcalls nothing."""

    def __init__(self):
        self.target = None

    cdef Py_ssize_t select(self, const uc_msg *batch, size_t n, size_t *selected) noexcept nogil:
        cdef size_t i
        cdef uint64_t b = 0
        for i in range(n):
            b += batch[i].payload.size
        self.messages += n
        self.bytes += b
        return 0

    def __repr__(self):
        return f"<upcall.native.Count messages={self.messages} bytes={self.bytes}>"


_OPS = {"eq": COND_EQ, "ne": COND_NE, "gt": COND_GT, "ge": COND_GE, "lt": COND_LT, "le": COND_LE}
_INT64_MIN = -(2 ** 63)
_INT64_MAX = 2 ** 63 - 1


# Compare a msgpack number with a condition's number: -1, 0, 1, or 2 when
# they do not compare (not a number, NaN).
cdef inline int _cmp_num(const mp_item *it, const field_cond *c) noexcept nogil:
    cdef double x, y
    if c.kind == VAL_INT and (it.type == MP_UINT or it.type == MP_INT):
        if it.type == MP_UINT:
            if c.i < 0:
                return 1
            return (it.v.u > <uint64_t>c.i) - (it.v.u < <uint64_t>c.i)
        return (it.v.i > c.i) - (it.v.i < c.i)
    if it.type == MP_UINT:
        x = <double>it.v.u
    elif it.type == MP_INT:
        x = <double>it.v.i
    elif it.type == MP_FLOAT32 or it.type == MP_FLOAT64:
        x = it.v.f
    else:
        return 2
    y = c.f if c.kind == VAL_FLOAT else <double>c.i
    if x < y:
        return -1
    if x > y:
        return 1
    if x == y:
        return 0
    return 2


cdef inline bint _equal(const mp_item *it, const field_cond *c) noexcept nogil:
    if c.kind == VAL_NIL:
        return it.type == MP_NIL
    if c.kind == VAL_BOOL:
        return it.type == MP_BOOL and (it.v.b != 0) == (c.i != 0)
    if c.kind == VAL_STR or c.kind == VAL_BIN:
        return (it.type == (MP_STR if c.kind == VAL_STR else MP_BIN) and it.len == c.slen
                and (c.slen == 0 or memcmp(it.ptr, c.s, c.slen) == 0))
    return _cmp_num(it, c) == 0


cdef class FieldFilter(NativeHandler):
    """Select the map messages whose field ``key`` satisfies every condition.

    ``FieldFilter(key, *, eq=..., ne=..., gt=..., ge=..., lt=..., le=..., target=None)``.
    ``eq``/``ne`` take a number, str, bytes, bool or None; the others a
    number (int or float; ints compare exactly).  A message that is not a
    map or lacks the key is counted in ``missing``, a malformed one in
    ``errors``; neither is selected (the codec reports malformed messages
    only if they are selected).  ``seen``/``matched`` count the rest.
    Selected messages go to ``target`` once per batch (see NativeHandler).
    """

    def __init__(self, key, *, target=None, **conditions):
        cdef field_cond *c
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, not {type(key).__name__}")
        if not conditions:
            raise TypeError("FieldFilter needs at least one condition: eq, ne, gt, ge, lt or le")
        self._key = key.encode("utf-8")
        self._kptr = <const char *>self._key
        self._klen = len(self._key)
        self._refs = []
        self._n_conds = 0
        self.target = target
        for name, value in conditions.items():
            op = _OPS.get(name)
            if op is None:
                raise TypeError(f"unknown condition {name!r}: use eq, ne, gt, ge, lt or le")
            c = &self._conds[self._n_conds]
            c.op = op
            c.i = 0
            c.f = 0.0
            c.s = NULL
            c.slen = 0
            if value is None or isinstance(value, (bool, str, bytes)):
                if op not in (COND_EQ, COND_NE):
                    raise TypeError(f"{name} takes a number, not {type(value).__name__}")
                if value is None:
                    c.kind = VAL_NIL
                elif isinstance(value, bool):
                    c.kind = VAL_BOOL
                    c.i = 1 if value else 0
                else:
                    b = value.encode("utf-8") if isinstance(value, str) else value
                    self._refs.append(b)
                    c.kind = VAL_STR if isinstance(value, str) else VAL_BIN
                    c.s = <const char *>(<bytes>b)
                    c.slen = len(<bytes>b)
            elif isinstance(value, int):
                if _INT64_MIN <= value <= _INT64_MAX:
                    c.kind = VAL_INT
                    c.i = value
                else:
                    c.kind = VAL_FLOAT
                    c.f = float(value)
            elif isinstance(value, float):
                c.kind = VAL_FLOAT
                c.f = value
            else:
                raise TypeError(f"{name}: a number, str, bytes, bool or None, "
                                f"not {type(value).__name__}")
            self._n_conds += 1

    @property
    def key(self):
        return self._key.decode("utf-8")

    cdef bint _match(self, const mp_item *it) noexcept nogil:
        cdef int k, r
        cdef const field_cond *c
        for k in range(self._n_conds):
            c = &self._conds[k]
            if c.op == COND_EQ:
                if not _equal(it, c):
                    return False
            elif c.op == COND_NE:
                if _equal(it, c):
                    return False
            else:
                r = _cmp_num(it, c)
                if r == 2:
                    return False
                if c.op == COND_GT and r != 1:
                    return False
                if c.op == COND_GE and r < 0:
                    return False
                if c.op == COND_LT and r != -1:
                    return False
                if c.op == COND_LE and r > 0:
                    return False
        return True

    cdef Py_ssize_t select(self, const uc_msg *batch, size_t n, size_t *selected) noexcept nogil:
        cdef size_t i, k = 0
        cdef mp_reader r
        cdef mp_item it
        cdef int rc
        cdef const char *key = self._kptr
        cdef size_t klen = self._klen
        cdef uint64_t seen = 0, matched = 0, missing = 0, errors = 0
        for i in range(n):
            mp_reader_init(&r, batch[i].payload.data, batch[i].payload.size)
            rc = mp_map_find(&r, key, klen, _MAX_DEPTH)
            if rc == MP_ERR_NOT_FOUND or rc == MP_ERR_TYPE:
                missing += 1
                continue
            if rc != MP_OK or mp_read(&r, &it) != MP_OK:
                errors += 1
                continue
            seen += 1
            if self._match(&it):
                matched += 1
                selected[k] = i
                k += 1
        self.seen += seen
        self.matched += matched
        self.missing += missing
        self.errors += errors
        return <Py_ssize_t>k

    def __repr__(self):
        return (f"<upcall.native.FieldFilter {self.key!r} seen={self.seen} "
                f"matched={self.matched} missing={self.missing} errors={self.errors}>")

    def __reduce__(self):
        # Not Cython's automatic pickling: it turns the conditions' C strings
        # (NULL for a number) into bytes, a segfault, and a pointer into
        # _key cannot be restored from a pickle anyway.
        raise TypeError("cannot pickle an upcall.native.FieldFilter: make a new one "
                        "with the same key and conditions")
