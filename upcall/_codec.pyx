# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""msgpack <-> Python objects: packb/unpackb, Encoder/Decoder, Timestamp, ExtType.

The C side is csrc/msgpack.{h,c} (reader/writer, no Python) and
upcall/_decode.h (the object-building decoder).  See docs/codec.md.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_Size
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_AsDouble
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.object cimport Py_EQ, Py_GE, Py_GT, Py_LE, Py_LT, Py_NE, PyObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport int8_t, int64_t, uint32_t, uint64_t

from upcall.includes.msgpack cimport *

import datetime as _dt

cdef extern from "Python.h":
    # Exact-type checks and the str internals used by the hot paths.
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    const char *PyUnicode_DATA_PTR "PyUnicode_DATA"(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    const char *PyUnicode_AsUTF8AndSize(object o, Py_ssize_t *size) except NULL
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1
    unsigned long long PyLong_AsUnsignedLongLong(object o) except? -1
    const Py_ssize_t PY_SSIZE_T_MAX


cdef extern from "_decode.h":
    ctypedef struct ucd_config:
        Py_ssize_t max_depth
        Py_ssize_t max_len
        int ts_datetime
    enum:
        UCD_ERR_UTF8
        UCD_ERR_UNHASHABLE
        UCD_ERR_MAX_LEN
        UCD_ERR_TS_RANGE
    void ucd_config_clear_keys(ucd_config *cfg)
    object ucd_decode(ucd_config *cfg, const char *data, Py_ssize_t size)
    object (*ucd_make_timestamp)(int64_t sec, uint32_t nsec, int as_datetime)
    object (*ucd_make_ext)(int code, const char *data, Py_ssize_t size)
    object (*ucd_make_error)(int code, Py_ssize_t offset, Py_ssize_t limit)


#: Default nesting limit of Decoder/Encoder (containers inside containers).
DEFAULT_MAX_DEPTH = 512
#: Largest max_depth accepted: the decoder and encoder recurse in C, and this
#: bounds their stack use (well under 1 MiB) on any thread.
MAX_DEPTH_LIMIT = 4096
cdef Py_ssize_t _DEFAULT_MAX_DEPTH = 512
cdef Py_ssize_t _MAX_DEPTH_LIMIT = 4096
# encode() keeps its buffer between calls unless it grew past this.
cdef size_t _KEEP_BUFFER = 1 << 20

cdef object _UTC = _dt.timezone.utc
cdef object _EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
cdef object _timedelta = _dt.timedelta
cdef object _datetime = _dt.datetime


# ---------------------------------------------------------------- errors

class DecodeError(ValueError):
    """Malformed msgpack data.

    ``offset`` is the byte offset of the offending item (for trailing bytes,
    where they start); ``reason`` a short stable name: truncated, reserved,
    length, depth, timestamp, trailing, utf8, unhashable_key, max_len,
    timestamp_range.
    """

    def __init__(self, message, offset=None, reason=None):
        super().__init__(message)
        self.offset = offset
        self.reason = reason

    def __reduce__(self):
        return (type(self), (self.args[0], self.offset, self.reason))


cdef dict _EXTRA_REASONS = {
    UCD_ERR_UTF8: ("utf8", "invalid UTF-8 in a str"),
    UCD_ERR_UNHASHABLE: ("unhashable_key", "a map key is an array or a map (unhashable)"),
    UCD_ERR_MAX_LEN: ("max_len", "a length exceeds max_len"),
    UCD_ERR_TS_RANGE: ("timestamp_range", "a timestamp outside the range of datetime"),
}


cdef object _make_error(int code, Py_ssize_t offset, Py_ssize_t limit):
    if code in _EXTRA_REASONS:
        reason, text = _EXTRA_REASONS[code]
    else:
        reason = mp_errname(code).decode()
        text = mp_strerror(code).decode()
    if code == MP_ERR_DEPTH:
        text = f"containers nested deeper than max_depth={limit}"
    elif code == UCD_ERR_MAX_LEN:
        text = f"a length exceeds max_len={limit}"
    return DecodeError(f"msgpack decode error at byte {offset}: {text}", offset, reason)


cdef int _raise_write_error(int rc) except -1:
    if rc == MP_ERR_NOMEM:
        raise MemoryError("upcall: out of memory while packing")
    if rc == MP_ERR_TOO_BIG:
        raise ValueError("upcall: a str/bytes/list/dict/ext is too long for msgpack (max 2**32-1)")
    if rc == MP_ERR_TIMESTAMP:
        raise ValueError("upcall: timestamp nanoseconds out of range")
    raise SystemError(f"upcall: msgpack writer error {rc}")


cdef inline int _ck(int rc) except -1:
    if rc != 0:
        return _raise_write_error(rc)
    return 0


# ---------------------------------------------------------------- Timestamp

cdef class Timestamp:
    """The msgpack timestamp (ext -1): seconds since the Unix epoch (int64,
    may be negative) plus nanoseconds (0..999999999).  Immutable, hashable,
    ordered, lossless."""

    def __init__(self, seconds, nanoseconds=0):
        if not isinstance(seconds, int) or not isinstance(nanoseconds, int):
            raise TypeError("Timestamp(seconds, nanoseconds): both must be int, got "
                            f"{type(seconds).__name__} and {type(nanoseconds).__name__}")
        if not -(1 << 63) <= seconds < (1 << 63):
            raise OverflowError(f"Timestamp: seconds={seconds} outside the int64 range")
        if not 0 <= nanoseconds <= 999999999:
            raise ValueError(f"Timestamp: nanoseconds={nanoseconds} not in 0..999999999")
        self.seconds = seconds
        self.nanoseconds = nanoseconds

    def __repr__(self):
        return f"upcall.Timestamp(seconds={self.seconds}, nanoseconds={self.nanoseconds})"

    def __hash__(self):
        return hash((self.seconds, self.nanoseconds))

    def __richcmp__(self, other, int op):
        if not isinstance(other, Timestamp):
            return NotImplemented
        a = (self.seconds, self.nanoseconds)
        b = ((<Timestamp>other).seconds, (<Timestamp>other).nanoseconds)
        if op == Py_EQ: return a == b
        if op == Py_NE: return a != b
        if op == Py_LT: return a < b
        if op == Py_LE: return a <= b
        if op == Py_GT: return a > b
        return a >= b

    def __reduce__(self):
        return (Timestamp, (self.seconds, self.nanoseconds))

    def to_datetime(self):
        """A UTC datetime; nanoseconds are truncated to microseconds.
        OverflowError outside datetime's range (years 1..9999)."""
        return _ts_to_datetime(self.seconds, self.nanoseconds)

    @staticmethod
    def from_datetime(dt):
        """The Timestamp of a timezone-aware datetime (naive: TypeError)."""
        return _ts_from_datetime(dt)


cdef object _ts_to_datetime(int64_t sec, uint32_t nsec):
    return _EPOCH + _timedelta(seconds=sec, microseconds=nsec // 1000)


cdef Timestamp _new_timestamp(int64_t sec, uint32_t nsec):
    cdef Timestamp t = Timestamp.__new__(Timestamp)
    t.seconds = sec
    t.nanoseconds = nsec
    return t


cdef Timestamp _ts_from_datetime(object dt):
    if not isinstance(dt, _datetime):
        raise TypeError(f"expected a datetime.datetime, got {type(dt).__name__}")
    if dt.utcoffset() is None:
        raise TypeError("cannot convert a naive datetime (no tzinfo) to a msgpack "
                        "timestamp; attach a timezone, e.g. tzinfo=datetime.timezone.utc")
    delta = dt - _EPOCH
    return _new_timestamp(delta.days * 86400 + delta.seconds, delta.microseconds * 1000)


# ---------------------------------------------------------------- ExtType

cdef class ExtType:
    """A msgpack extension value other than the timestamp: code -128..127
    (not -1) and the raw payload bytes."""

    def __init__(self, code, data):
        if not isinstance(code, int):
            raise TypeError(f"ExtType: code must be int, not {type(code).__name__}")
        if not -128 <= code <= 127 or code == -1:
            raise ValueError(f"ExtType: code={code} not in -128..127 (-1 is the timestamp, use Timestamp)")
        if isinstance(data, bytes):
            data = bytes(data) if type(data) is not bytes else data
        elif isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        else:
            raise TypeError(f"ExtType: data must be bytes, not {type(data).__name__}")
        self.code = code
        self.data = data

    def __repr__(self):
        return f"upcall.ExtType(code={self.code}, data={self.data!r})"

    def __hash__(self):
        return hash((self.code, self.data))

    def __richcmp__(self, other, int op):
        if op != Py_EQ and op != Py_NE:
            return NotImplemented
        if not isinstance(other, ExtType):
            return NotImplemented
        eq = self.code == (<ExtType>other).code and self.data == (<ExtType>other).data
        return eq if op == Py_EQ else not eq

    def __reduce__(self):
        return (ExtType, (self.code, self.data))


# ---------------------------------------------------------------- decoder hooks

cdef object _hook_timestamp(int64_t sec, uint32_t nsec, int as_datetime):
    if as_datetime:
        return _ts_to_datetime(sec, nsec)   # OverflowError -> DecodeError in C
    return _new_timestamp(sec, nsec)


cdef object _hook_ext(int code, const char *data, Py_ssize_t size):
    cdef ExtType e = ExtType.__new__(ExtType)
    e.code = code
    e.data = PyBytes_FromStringAndSize(data, size)
    return e


ucd_make_timestamp = _hook_timestamp
ucd_make_ext = _hook_ext
ucd_make_error = _make_error


# ---------------------------------------------------------------- argument checks

cdef Py_ssize_t _check_depth(object value, str where) except -1:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{where}: max_depth must be an int, not {type(value).__name__}")
    if not 0 <= value <= _MAX_DEPTH_LIMIT:
        raise ValueError(f"{where}: max_depth={value} not in 0..{_MAX_DEPTH_LIMIT}")
    return value


# ---------------------------------------------------------------- Encoder

cdef class Encoder:
    """Reusable msgpack encoder: ``Encoder(*, max_depth=512).encode(obj) -> bytes``.

    None, bool, int (int64/uint64 range, else OverflowError), float (as
    float64), str, bytes/bytearray/memoryview (bin), list/tuple (array), dict
    (map), Timestamp and timezone-aware datetime (timestamp ext), ExtType.
    Subclasses of these encode as their base type; anything else is a
    TypeError.  Nesting deeper than max_depth (or a cycle) is a ValueError.
    """

    def __cinit__(self):
        mp_writer_init(&self._buf)
        self._busy = False
        self._max_depth = _DEFAULT_MAX_DEPTH

    def __init__(self, *, max_depth=DEFAULT_MAX_DEPTH):
        self._max_depth = _check_depth(max_depth, "Encoder")

    def __dealloc__(self):
        mp_writer_free(&self._buf)

    @property
    def max_depth(self):
        return self._max_depth

    def encode(self, obj):
        """Pack obj into a new bytes object."""
        return self._encode(obj)

    cdef object _encode(self, object obj):
        cdef mp_writer tmp
        if self._busy:
            # Re-entered: packing ran Python code (a tzinfo's utcoffset) that
            # packs, or another thread got the GIL meanwhile.  The shared
            # buffer is in use, so this call gets its own.
            mp_writer_init(&tmp)
            try:
                self._pack(obj, &tmp, 0)
                return PyBytes_FromStringAndSize(tmp.data, <Py_ssize_t>tmp.len)
            finally:
                mp_writer_free(&tmp)
        self._busy = True
        self._buf.len = 0
        try:
            self._pack(obj, &self._buf, 0)
            return PyBytes_FromStringAndSize(self._buf.data, <Py_ssize_t>self._buf.len)
        finally:
            self._busy = False
            if self._buf.cap > _KEEP_BUFFER:   # do not pin a huge buffer forever
                mp_writer_free(&self._buf)

    cdef int pack_into(self, object obj, mp_writer *w) except -1:
        return self._pack(obj, w, 0)

    cdef int _pack(self, object o, mp_writer *w, Py_ssize_t depth) except -1:
        cdef type t = type(o)
        cdef Py_ssize_t n, i
        cdef const char *p
        # Exact types first (the common case: one pointer compare each), then
        # the other supported types and subclasses.
        if t is str:
            if PyUnicode_IS_COMPACT_ASCII(o):
                return _ck(mp_write_str(w, PyUnicode_DATA_PTR(o), <size_t>PyUnicode_GET_LENGTH(o)))
            p = PyUnicode_AsUTF8AndSize(o, &n)
            return _ck(mp_write_str(w, p, <size_t>n))
        if t is int:
            return _pack_int(o, w)
        if t is float:
            return _ck(mp_write_float64(w, PyFloat_AS_DOUBLE(o)))
        if t is dict:
            return self._pack_dict(o, w, depth)
        if t is list:
            return self._pack_list(o, w, depth)
        if o is None:
            return _ck(mp_write_nil(w))
        if t is bool:
            return _ck(mp_write_bool(w, o is True))
        if t is bytes:
            return _ck(mp_write_bin(w, PyBytes_AS_STRING(o), <size_t>PyBytes_GET_SIZE(o)))
        if t is tuple:
            return self._pack_tuple(o, w, depth)
        if t is Timestamp:
            return _ck(mp_write_timestamp(w, (<Timestamp>o).seconds, (<Timestamp>o).nanoseconds))
        if t is ExtType:
            return _pack_ext(<ExtType>o, w)
        if t is bytearray:
            return _ck(mp_write_bin(w, PyByteArray_AS_STRING(o), <size_t>PyByteArray_GET_SIZE(o)))
        if t is memoryview:
            return _pack_buffer(o, w)
        return self._pack_other(o, w, depth)

    cdef int _pack_other(self, object o, mp_writer *w, Py_ssize_t depth) except -1:
        cdef Py_ssize_t n
        cdef const char *p
        cdef Timestamp ts
        if isinstance(o, str):
            p = PyUnicode_AsUTF8AndSize(o, &n)
            return _ck(mp_write_str(w, p, <size_t>n))
        if isinstance(o, int):
            return _pack_int(o, w)
        if isinstance(o, float):
            return _ck(mp_write_float64(w, PyFloat_AsDouble(o)))
        if isinstance(o, dict):
            return self._pack_dict(o, w, depth)
        if isinstance(o, list):
            return self._pack_list(o, w, depth)
        if isinstance(o, tuple):
            return self._pack_tuple(o, w, depth)
        if isinstance(o, (bytes, bytearray, memoryview)):
            return _pack_buffer(o, w)
        if isinstance(o, _datetime):
            ts = _ts_from_datetime(o)
            return _ck(mp_write_timestamp(w, ts.seconds, ts.nanoseconds))
        if isinstance(o, Timestamp):
            return _ck(mp_write_timestamp(w, (<Timestamp>o).seconds, (<Timestamp>o).nanoseconds))
        if isinstance(o, ExtType):
            return _pack_ext(<ExtType>o, w)
        raise TypeError(f"upcall cannot pack an object of type {type(o).__qualname__!r}")

    cdef int _enter(self, Py_ssize_t depth) except -1:
        if depth >= self._max_depth:
            raise ValueError(f"upcall: object nested deeper than max_depth={self._max_depth} "
                             "(or it contains itself)")
        return 0

    cdef int _pack_dict(self, object o, mp_writer *w, Py_ssize_t depth) except -1:
        cdef Py_ssize_t pos = 0, n, count = 0
        cdef PyObject *k
        cdef PyObject *v
        self._enter(depth)
        n = PyDict_Size(o)
        _ck(mp_write_map_header(w, <size_t>n))
        while PyDict_Next(o, &pos, &k, &v):
            count += 1
            if count > n:
                break
            self._pack(<object>k, w, depth + 1)
            self._pack(<object>v, w, depth + 1)
        if count != n:
            # Only Python code run while packing (a tzinfo) can do this; the
            # header already went out, so the output would be malformed.
            raise RuntimeError("dict changed size during packing")
        return 0

    cdef int _pack_list(self, object o, mp_writer *w, Py_ssize_t depth) except -1:
        cdef Py_ssize_t i, n
        self._enter(depth)
        n = PyList_GET_SIZE(o)
        _ck(mp_write_array_header(w, <size_t>n))
        for i in range(n):
            if i >= PyList_GET_SIZE(o):
                raise RuntimeError("list changed size during packing")
            self._pack(<object>PyList_GET_ITEM(o, i), w, depth + 1)
        if PyList_GET_SIZE(o) != n:
            raise RuntimeError("list changed size during packing")
        return 0

    cdef int _pack_tuple(self, object o, mp_writer *w, Py_ssize_t depth) except -1:
        cdef Py_ssize_t i, n
        self._enter(depth)
        n = PyTuple_GET_SIZE(o)
        _ck(mp_write_array_header(w, <size_t>n))
        for i in range(n):
            self._pack(<object>PyTuple_GET_ITEM(o, i), w, depth + 1)
        return 0


cdef int _pack_int(object o, mp_writer *w) except -1:
    cdef int overflow = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(o, &overflow)
    cdef unsigned long long u
    if overflow == 0:
        return _ck(mp_write_int(w, v))
    if overflow > 0:
        try:
            u = PyLong_AsUnsignedLongLong(o)
        except OverflowError:
            pass
        else:
            return _ck(mp_write_uint(w, u))
    raise OverflowError(f"upcall: int {int(o)} outside the msgpack range "
                        "(-2**63 .. 2**64-1)")


cdef int _pack_ext(ExtType e, mp_writer *w) except -1:
    return _ck(mp_write_ext(w, <int8_t>e.code, PyBytes_AS_STRING(e.data),
                            <size_t>PyBytes_GET_SIZE(e.data)))


cdef int _pack_buffer(object o, mp_writer *w) except -1:
    cdef Py_buffer view
    if PyObject_GetBuffer(o, &view, PyBUF_SIMPLE) < 0:
        return -1
    try:
        return _ck(mp_write_bin(w, view.buf, <size_t>view.len))
    finally:
        PyBuffer_Release(&view)


# ---------------------------------------------------------------- Decoder

cdef class Decoder:
    """Reusable msgpack decoder: ``Decoder(*, timestamp="timestamp",
    max_depth=512, max_len=None).decode(buf) -> object``.

    timestamp: "timestamp" decodes the timestamp ext to upcall.Timestamp,
    "datetime" to a UTC datetime (microseconds).  max_depth: containers
    nested deeper are an error.  max_len: str/bin/ext lengths and array/map
    counts above it are an error; None means only the buffer's size limits
    them (a length prefix is always checked against the bytes left before
    anything is allocated).  Each Decoder caches short map keys.
    """

    def __cinit__(self):
        cdef ucd_config *cfg = <ucd_config *>PyMem_Calloc(1, sizeof(ucd_config))
        if cfg == NULL:
            raise MemoryError()
        cfg.max_depth = _DEFAULT_MAX_DEPTH
        cfg.max_len = PY_SSIZE_T_MAX
        cfg.ts_datetime = 0
        self._state = cfg

    def __init__(self, *, timestamp="timestamp", max_depth=DEFAULT_MAX_DEPTH, max_len=None):
        cdef ucd_config *cfg = <ucd_config *>self._state
        if not isinstance(timestamp, str):
            raise TypeError(f"Decoder: timestamp must be a str, not {type(timestamp).__name__}")
        if timestamp not in ("timestamp", "datetime"):
            raise ValueError(f"Decoder: timestamp={timestamp!r}, expected 'timestamp' or 'datetime'")
        depth = _check_depth(max_depth, "Decoder")
        if max_len is None:
            length = PY_SSIZE_T_MAX
        elif not isinstance(max_len, int) or isinstance(max_len, bool):
            raise TypeError(f"Decoder: max_len must be an int or None, not {type(max_len).__name__}")
        elif max_len < 0:
            raise ValueError(f"Decoder: max_len={max_len} must be >= 0")
        else:
            length = min(max_len, PY_SSIZE_T_MAX)
        cfg.ts_datetime = timestamp == "datetime"
        cfg.max_depth = depth
        cfg.max_len = length

    def __dealloc__(self):
        cdef ucd_config *cfg = <ucd_config *>self._state
        if cfg != NULL:
            ucd_config_clear_keys(cfg)
            PyMem_Free(cfg)
            self._state = NULL

    @property
    def timestamp(self):
        return "datetime" if (<ucd_config *>self._state).ts_datetime else "timestamp"

    @property
    def max_depth(self):
        return (<ucd_config *>self._state).max_depth

    @property
    def max_len(self):
        cdef Py_ssize_t n = (<ucd_config *>self._state).max_len
        return None if n == PY_SSIZE_T_MAX else n

    def decode(self, buf):
        """Decode exactly one msgpack object from a bytes-like object."""
        return self._decode_obj(buf, "Decoder.decode() argument 'buf'")

    cdef object decode_view(self, const char *data, Py_ssize_t size):
        return ucd_decode(<ucd_config *>self._state, data, size)

    cdef object _decode_obj(self, object data, str argname):
        cdef Py_buffer view
        if PyBytes_CheckExact(data):
            return ucd_decode(<ucd_config *>self._state, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
        try:
            PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        except BufferError:
            # A buffer, but not a contiguous one (a strided memoryview).
            return self._decode_obj(memoryview(data).tobytes(), argname)
        except TypeError:
            raise TypeError(f"{argname} must be a bytes-like object, "
                            f"not {type(data).__name__}") from None
        try:
            return ucd_decode(<ucd_config *>self._state, <const char *>view.buf, view.len)
        finally:
            PyBuffer_Release(&view)


# ---------------------------------------------------------------- module API

cdef Encoder _default_encoder = Encoder()
cdef Decoder _default_decoder = Decoder()


def packb(obj):
    """Pack obj to msgpack bytes (see Encoder for the supported types)."""
    return _default_encoder._encode(obj)


def unpackb(data, *, timestamp="timestamp", max_depth=DEFAULT_MAX_DEPTH, max_len=None):
    """Unpack exactly one msgpack object from a bytes-like object.

    Malformed data, or bytes after the object, raise DecodeError (a
    ValueError) with .offset and .reason.  See Decoder for the options.
    """
    cdef Decoder dec = _default_decoder
    if (max_len is not None or timestamp != "timestamp"
            or type(max_depth) is not int or max_depth != _DEFAULT_MAX_DEPTH):
        dec = Decoder(timestamp=timestamp, max_depth=max_depth, max_len=max_len)
    return dec._decode_obj(data, "unpackb() argument 'data'")
