# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""msgpack <-> Python objects: packb/unpackb, Encoder/Decoder, Timestamp, ExtType.

The C side is csrc/msgpack.{h,c} (reader/writer, no Python) and
upcall/_codec_c.h (the object-building decoder).  See docs/codec.md.
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_Size
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_AsDouble
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.object cimport Py_EQ, Py_GE, Py_GT, Py_LE, Py_LT, Py_NE, PyObject, PyTypeObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport int8_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

from upcall.includes.msgpack cimport *
from upcall.includes.wire cimport *
from upcall._arguments cimport int_arg

import datetime as _dt

cdef extern from "Python.h":
    # Exact-type checks and the str internals used by the hot paths.
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    const char *PyUnicode_DATA_PTR "PyUnicode_DATA"(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    const char *PyUnicode_AsUTF8AndSize(object o, Py_ssize_t *size) except NULL
    const Py_ssize_t PY_SSIZE_T_MAX


cdef extern from "_codec_c.h":
    ctypedef struct ucd_config:
        Py_ssize_t max_depth
        Py_ssize_t max_len
        int ts_datetime
    enum:
        UCD_ERR_UTF8
        UCD_ERR_UNHASHABLE
        UCD_ERR_MAX_LEN
        UCD_ERR_TS_RANGE
        UCD_ERR_OOB_LENGTH
        UCD_ERR_OOB_VERSION
        UCD_ERR_OOB_FLAGS
        UCD_ERR_OOB_INDEX
        UCD_ERR_OOB_TWICE
        UCD_ERR_OOB_SIZE
        UCD_ERR_OOB_UNUSED
        UCD_ERR_COALESCED
        UCD_ERR_OOB_CODEC
        UCD_ERR_OOB_DECOMPRESS
        UCD_ERR_MSG_SIZE
    ctypedef struct ucd_span:
        pass
    ctypedef struct ucd_frames:
        const ucd_span *extra
        size_t n
        uint32_t used
        object (*make)(void *ctx, size_t i, int codec, uint64_t size, int *err)
        void *ctx
    Py_ssize_t ucd_oob_min
    ucd_frames ucd_no_frames
    void ucd_config_clear_keys(ucd_config *cfg)
    object ucd_decode(ucd_config *cfg, const char *data, Py_ssize_t size)
    object ucd_decode_frames(ucd_config *cfg, const char *data, Py_ssize_t size, ucd_frames *fr)
    object (*ucd_make_timestamp)(int64_t sec, uint32_t nsec, int as_datetime)
    object (*ucd_make_ext)(int code, const char *data, Py_ssize_t size)
    object (*ucd_make_error)(int code, Py_ssize_t offset, Py_ssize_t limit)
    int ucd_pack(PyObject *enc, Py_ssize_t max_depth, PyObject *o, mp_writer *w, Py_ssize_t depth) except -1
    int ucd_pack_int(PyObject *o, mp_writer *w) except -1
    int ucd_pack_str(PyObject *o, mp_writer *w) except -1
    int ucd_pack_dict(PyObject *enc, Py_ssize_t max_depth, PyObject *o, mp_writer *w, Py_ssize_t depth) except -1
    int ucd_pack_list(PyObject *enc, Py_ssize_t max_depth, PyObject *o, mp_writer *w, Py_ssize_t depth) except -1
    int ucd_pack_tuple(PyObject *enc, Py_ssize_t max_depth, PyObject *o, mp_writer *w, Py_ssize_t depth) except -1
    int (*ucd_pack_other)(PyObject *enc, PyObject *o, mp_writer *w, Py_ssize_t depth) except -1


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

class UpcallError(Exception):
    """Base class of the exceptions upcall defines.

    Each also derives from the builtin exception it refines (DecodeError is
    a ValueError, ZMQError an OSError), so ``except ValueError`` and the
    like keep working.  Wrong arguments stay TypeError/ValueError, timeouts
    TimeoutError, and a closed object ValueError, as in the standard library.
    """
    __module__ = "upcall"


class DecodeError(UpcallError, ValueError):
    """Malformed msgpack data.

    ``offset`` is the byte offset of the offending item (for trailing bytes,
    where they start); ``reason`` a short stable name: truncated, reserved,
    length, depth, timestamp, trailing, utf8, unhashable_key, max_len,
    timestamp_range, frames, decoder (an exception from a subscription's
    ``decoder=``, kept as ``__cause__``), oob_decoder (out-of-band frames
    for a ``decoder=`` or ``raw=True`` subscription), the oob_* ones,
    message_size (a message over its size limit once its out-of-band frames
    are decompressed, docs/security.md); ``topic`` the topic of the message that did not
    decode (None from unpackb() and Decoder.decode()).
    """
    __module__ = "upcall"

    def __init__(self, message, offset=None, reason=None, topic=None):
        super().__init__(message)
        self.offset = offset
        self.reason = reason
        self.topic = topic

    def __reduce__(self):
        # Whole: the message as the report showed it, every attribute, and
        # anything else set on it (its __dict__: e.g. __notes__).
        return (type(self), (self.args[0] if self.args else "", self.offset, self.reason,
                             self.topic), self.__dict__ or None)


cdef dict _EXTRA_REASONS = {
    UCD_ERR_UTF8: ("utf8", "invalid UTF-8 in a str"),
    UCD_ERR_UNHASHABLE: ("unhashable_key", "a map key is an array or a map (unhashable)"),
    UCD_ERR_MAX_LEN: ("max_len", "a length exceeds max_len"),
    UCD_ERR_TS_RANGE: ("timestamp_range", "a timestamp outside the range of datetime"),
    # docs/wire.md, out-of-band references (ext 126) and coalesced payloads (ext 127)
    UCD_ERR_OOB_LENGTH: ("oob_length", "an out-of-band reference (ext 126) is not 16 bytes"),
    UCD_ERR_OOB_VERSION: ("oob_version", "an out-of-band reference of an unknown version"),
    UCD_ERR_OOB_FLAGS: ("oob_flags", "an out-of-band reference with unknown flags"),
    UCD_ERR_OOB_INDEX: ("oob_index", "an out-of-band reference names no frame after the payload"),
    UCD_ERR_OOB_TWICE: ("oob_twice", "two out-of-band references name the same frame"),
    UCD_ERR_OOB_SIZE: ("oob_size", "an out-of-band frame's length is not the reference's size"),
    UCD_ERR_OOB_UNUSED: ("oob_unused", "a frame after the payload that no out-of-band reference names"),
    UCD_ERR_OOB_CODEC: ("oob_codec", "a compressed out-of-band frame whose codec this upcall "
                        "was built without, or knows no codec of (upcall.COMPRESSION)"),
    UCD_ERR_MSG_SIZE: ("message_size", "the message would exceed its size limit once its "
                       "out-of-band frames are decompressed"),
    UCD_ERR_OOB_DECOMPRESS: ("oob_decompress", "a compressed out-of-band frame that does not "
                             "decompress to the reference's size"),
    UCD_ERR_COALESCED: ("coalesced", "a coalesced payload (ext 127) where one message was expected "
                                     "(inside a coalesced payload: one level only; or from a source that does not split)"),
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
    """Timestamp(seconds, nanoseconds=0)
--

The msgpack timestamp (ext -1): seconds since the Unix epoch (int64,
    may be negative) plus nanoseconds (0..999999999).  Immutable, hashable,
    ordered, lossless."""

    def __init__(self, seconds, nanoseconds=0):
        if not isinstance(seconds, int) or not isinstance(nanoseconds, int):
            raise TypeError("Timestamp(seconds, nanoseconds): both must be int, got "
                            f"{type(seconds).__name__} and {type(nanoseconds).__name__}")
        if not -(1 << 63) <= seconds < (1 << 63):
            raise OverflowError(f"Timestamp: seconds={seconds} outside the int64 range")
        int_arg(nanoseconds, "Timestamp: nanoseconds", 0, 999_999_999)
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
    """ExtType(code, data)
--

A msgpack extension value other than the timestamp: code -128..127
    (not -1) and the raw payload bytes."""

    def __init__(self, code, data):
        code = int_arg(code, "ExtType: code", -128, 127, "except -1: the timestamp, use Timestamp")
        if code == -1:
            raise ValueError("ExtType: code -1 is the timestamp extension: use Timestamp")
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

cdef object _check_default(object default, str where):
    if default is not None and not callable(default):
        raise TypeError(f"{where}: default must be callable or None, not {type(default).__name__}")
    return default


cdef Py_ssize_t _check_depth(object value, str where) except -1:
    return int_arg(value, f"{where}: max_depth", 0, _MAX_DEPTH_LIMIT)


# ---------------------------------------------------------------- Encoder

# The signature in the docstring is written by hand (512: DEFAULT_MAX_DEPTH).
cdef class Encoder:
    """Encoder(*, max_depth=512, default=None)
--

Reusable msgpack encoder: ``Encoder(*, max_depth=512, default=None).encode(obj) -> bytes``.

    None, bool, int (int64/uint64 range, else OverflowError), float (as
    float64), str, bytes/bytearray/memoryview (bin), list/tuple (array), dict
    (map), Timestamp and timezone-aware datetime (timestamp ext), ExtType;
    msgpack's ``Timestamp`` and ``ExtType`` and msgspec's ``msgpack.Ext``
    too.  Subclasses of these encode as their base type.  Anything else goes
    to ``default(obj)``, whose result is packed in its place (msgpack's
    ``default``, msgspec's ``enc_hook``); without it, it is a TypeError.
    Nesting deeper than max_depth (or a cycle, or a ``default`` that keeps
    returning what it cannot convert) is a ValueError.
    """

    def __cinit__(self):
        mp_writer_init(&self._buf)
        self._busy = False
        self._max_depth = _DEFAULT_MAX_DEPTH
        self._default = None

    def __init__(self, *, max_depth=DEFAULT_MAX_DEPTH, default=None):
        self._max_depth = _check_depth(max_depth, "Encoder")
        self._default = _check_default(default, "Encoder")

    def __dealloc__(self):
        mp_writer_free(&self._buf)

    @property
    def max_depth(self):
        return self._max_depth

    @property
    def default(self):
        """The hook for types the encoder does not know, or None."""
        return self._default

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
            # A large buffer is kept while large messages keep coming (no
            # regrowing, its pages stay mapped), and released after a run of
            # small ones, so that one big message does not pin it forever.
            if self._buf.cap > _KEEP_BUFFER:
                if self._buf.len * 4 < self._buf.cap:
                    self._small_streak += 1
                    if self._small_streak >= 16:
                        mp_writer_free(&self._buf)
                        self._small_streak = 0
                else:
                    self._small_streak = 0

    cdef int pack_into(self, object obj, mp_writer *w) except -1:
        return ucd_pack(<PyObject *>self, self._max_depth, <PyObject *>obj, w, 0)

    cdef object pack_oob(self, object obj, mp_writer *w, Py_ssize_t threshold):
        global ucd_oob_min
        cdef Encoder e = self
        if self._oob_on:
            # In use by another send (its packing ran Python code that let
            # the GIL go): this one packs with a twin, so that each send
            # collects its own values.
            e = Encoder.__new__(Encoder)
            e._max_depth = self._max_depth
            e._default = self._default
        if threshold < ucd_oob_min:
            ucd_oob_min = threshold
        e._oob_on = True
        e._oob = None
        e._oob_threshold = threshold
        try:
            ucd_pack(<PyObject *>e, e._max_depth, <PyObject *>obj, w, 0)
            return e._oob
        finally:
            e._oob_on = False
            e._oob = None

    cdef int _pack(self, object obj, mp_writer *w, Py_ssize_t depth) except -1:
        return ucd_pack(<PyObject *>self, self._max_depth, <PyObject *>obj, w, depth)


cdef int _hook_pack_other(PyObject *enc, PyObject *obj, mp_writer *w, Py_ssize_t depth) except -1:
    # Everything the C fast path (ucd_pack) does not take: the module's own
    # types, the other buffers, datetime, and subclasses of the builtins
    # (which encode as their base type).
    cdef object o = <object>obj
    cdef Py_ssize_t max_depth = (<Encoder>enc)._max_depth
    cdef Timestamp ts
    cdef type t = type(o)
    if (<Encoder>enc)._oob_on:
        if _pack_wire(<Encoder>enc, o, w) == 0:
            return 0
    if t is Timestamp:
        return _ck(mp_write_timestamp(w, (<Timestamp>o).seconds, (<Timestamp>o).nanoseconds))
    if t is ExtType:
        return _pack_ext(<ExtType>o, w)
    if t is bytearray:
        return _ck(mp_write_bin(w, PyByteArray_AS_STRING(o), <size_t>PyByteArray_GET_SIZE(o)))
    if t is memoryview:
        return _pack_buffer(o, w)
    if isinstance(o, str):
        return ucd_pack_str(obj, w)
    if isinstance(o, int):          # bool is exact-checked before: never here
        return ucd_pack_int(obj, w)
    if isinstance(o, float):
        return _ck(mp_write_float64(w, PyFloat_AsDouble(o)))
    if isinstance(o, dict):
        return ucd_pack_dict(enc, max_depth, obj, w, depth)
    if isinstance(o, list):
        return ucd_pack_list(enc, max_depth, obj, w, depth)
    if isinstance(o, tuple):
        if _foreign_kind(t) == _FOREIGN_EXT:    # msgpack's ExtType is a namedtuple
            return _pack_foreign_ext(o, w)
        return ucd_pack_tuple(enc, max_depth, obj, w, depth)
    if isinstance(o, (bytes, bytearray, memoryview)):
        return _pack_buffer(o, w)
    if isinstance(o, _datetime):
        ts = _ts_from_datetime(o)
        return _ck(mp_write_timestamp(w, ts.seconds, ts.nanoseconds))
    if isinstance(o, Timestamp):
        return _ck(mp_write_timestamp(w, (<Timestamp>o).seconds, (<Timestamp>o).nanoseconds))
    if isinstance(o, ExtType):
        return _pack_ext(<ExtType>o, w)
    kind = _foreign_kind(t)
    if kind == _FOREIGN_TIMESTAMP:
        return _ck(mp_write_timestamp(w, o.seconds, o.nanoseconds))
    if kind == _FOREIGN_EXT:
        return _pack_foreign_ext(o, w)
    default = (<Encoder>enc)._default
    if default is None:
        raise TypeError(f"upcall cannot pack an object of type {type(o).__qualname__!r} "
                        "(pass default= to convert it)")
    # The hook's result takes the object's place one level deeper, so a hook
    # that keeps returning something it cannot convert ends at max_depth.
    if depth >= max_depth:
        raise ValueError(f"upcall: default= was called more than max_depth={max_depth} times "
                         f"in a row (last for a {type(o).__qualname__!r}): does it return "
                         "objects it cannot convert?")
    converted = default(o)
    return ucd_pack(enc, max_depth, <PyObject *>converted, w, depth + 1)


ucd_pack_other = _hook_pack_other


# ---------------------------------------------------------------- out-of-band values

# Frames after the payload that one message may carry (wire.h,
# upcall.MAX_OOB_FRAMES).
cdef Py_ssize_t MAX_OOB_FRAMES = UC_WIRE_MAX_OOB


@cython.final
cdef class OobBuffer:
    """A buffer view of a value sent out of band, held until libzmq is done."""

    def __dealloc__(self):
        if self.held:
            self.held = False
            PyBuffer_Release(&self.view)


cdef int _pack_wire(Encoder e, object o, mp_writer *w) except -1:
    """Packing for a publisher (Encoder.pack_oob): a buffer-protocol value
    at or above the threshold becomes an out-of-band reference (docs/wire.md,
    ext 126), a smaller one bin; ExtType codes 126 and 127 belong to the wire
    format and are refused.  0: packed; 1: not for this function."""
    cdef OobBuffer b
    cdef unsigned char ref[UC_OOB_REF_SIZE]
    cdef Py_ssize_t n
    if isinstance(o, ExtType) or _foreign_kind(type(o)) == _FOREIGN_EXT:
        code = (<ExtType>o).code if isinstance(o, ExtType) else (o[0] if isinstance(o, tuple) else o.code)
        if code == UC_EXT_OOB or code == UC_EXT_COALESCED:
            raise ValueError(f"upcall: ext code {code} belongs to the wire format "
                             "(docs/wire.md): a publisher cannot send it as an ExtType")
        return 1
    if not PyObject_CheckBuffer(o):
        return 1
    b = OobBuffer.__new__(OobBuffer)
    try:
        PyObject_GetBuffer(o, &b.view, PyBUF_SIMPLE)
    except (BufferError, ValueError) as exc:   # numpy says ValueError
        raise BufferError(f"upcall: cannot send a {type(o).__qualname__} whose buffer is not "
                          f"contiguous ({exc}); send a contiguous copy") from None
    b.held = True
    n = b.view.len
    if n < e._oob_threshold or (e._oob is not None and len(e._oob) >= MAX_OOB_FRAMES):
        if <uint64_t>n > 0xffffffff:
            raise ValueError(f"upcall: a {n}-byte value cannot be packed inline (msgpack's "
                             f"limit is 2**32-1) and a message carries at most "
                             f"{MAX_OOB_FRAMES} out-of-band values")
        return _ck(mp_write_bin(w, b.view.buf, <size_t>n))
    if e._oob is None:
        e._oob = []
    uc_oob_ref_pack(ref, <uint32_t>(UC_WIRE_FIRST_OOB_FRAME + len(e._oob)), <uint64_t>n,
                    UC_OOB_CODEC_NONE)
    _ck(mp_write_ext(w, UC_EXT_OOB, ref, UC_OOB_REF_SIZE))
    b.ref_at = w.len - UC_OOB_REF_SIZE   # the publisher sets the codec there if it compresses
    e._oob.append(b)
    return 0


def _coalesced_payload(messages):
    """The coalesced payload (docs/wire.md, ext 127) that carries
    ``messages``, a bytes-like object of packed msgpack objects back to back,
    with the header csrc/wire.h writes (uc_batch_header_pack).  For the
    benchmark, which floods subscribers with coalesced payloads that no
    publisher built."""
    cdef Py_buffer view
    cdef unsigned char *p
    PyObject_GetBuffer(messages, &view, PyBUF_SIMPLE)
    try:
        out = PyBytes_FromStringAndSize(NULL, UC_BATCH_HEADER + view.len)
        p = <unsigned char *>PyBytes_AS_STRING(out)
        if uc_batch_header_pack(p, <size_t>(UC_BATCH_HEADER + view.len)) != 0:
            raise ValueError("a coalesced payload holds at most 4 GiB")
        memcpy(p + UC_BATCH_HEADER, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return out


# Other libraries' timestamp and ext types, recognised by their type's module
# and name (their packages are never imported here): msgpack's Timestamp
# (.seconds, .nanoseconds) and ExtType (a (code, data) namedtuple), msgspec's
# msgpack.Ext (.code, .data).
cdef enum:
    _FOREIGN_NONE = 0
    _FOREIGN_TIMESTAMP = 1
    _FOREIGN_EXT = 2

cdef dict _FOREIGN_TYPES = {
    ("msgpack.ext", "Timestamp"): _FOREIGN_TIMESTAMP,
    ("msgpack.ext", "ExtType"): _FOREIGN_EXT,
    ("msgspec.msgpack", "Ext"): _FOREIGN_EXT,
}


cdef int _foreign_kind(type t) except -1:
    module = getattr(t, "__module__", None)
    if not isinstance(module, str) or not module.startswith(("msgpack", "msgspec")):
        return _FOREIGN_NONE
    return _FOREIGN_TYPES.get((module, t.__qualname__), _FOREIGN_NONE)


cdef int _pack_foreign_ext(object e, mp_writer *w) except -1:
    cdef Py_buffer view
    code = e[0] if isinstance(e, tuple) else e.code
    if not isinstance(code, int) or not -128 <= code <= 127:
        raise ValueError(f"upcall: {type(e).__qualname__} code {code!r} not in -128..127")
    PyObject_GetBuffer(e[1] if isinstance(e, tuple) else e.data, &view, PyBUF_SIMPLE)
    try:
        return _ck(mp_write_ext(w, <int8_t>code, view.buf, <size_t>view.len))
    finally:
        PyBuffer_Release(&view)


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

# The signature in the docstring is written by hand (512: DEFAULT_MAX_DEPTH).
cdef class Decoder:
    """Decoder(*, timestamp='timestamp', max_depth=512, max_len=None)
--

Reusable msgpack decoder: ``Decoder(*, timestamp="timestamp",
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
        # No upper bound: beyond PY_SSIZE_T_MAX only the buffer's size limits.
        max_len = int_arg(max_len, "Decoder: max_len", 0, None, "None: no limit", or_none=True)
        length = PY_SSIZE_T_MAX if max_len is None else min(max_len, PY_SSIZE_T_MAX)
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

    cdef object decode_wire(self, const char *data, Py_ssize_t size):
        return ucd_decode_frames(<ucd_config *>self._state, data, size, &ucd_no_frames)

    cdef object decode_msg(self, const char *data, Py_ssize_t size, const void *extra,
                           size_t n_extra,
                           object (*make)(void *ctx, size_t i, int codec, uint64_t size, int *err),
                           void *ctx):
        cdef ucd_frames fr
        fr.extra = <const ucd_span *>extra
        fr.n = n_extra
        fr.used = 0
        fr.make = make
        fr.ctx = ctx
        return ucd_decode_frames(<ucd_config *>self._state, data, size, &fr)

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


def packb(obj, *, default=None):
    """Pack obj to msgpack bytes (see Encoder for the supported types).

    ``default(o)`` is called for an object of a type the encoder does not
    know and returns something it can pack instead.
    """
    if default is None:
        return _default_encoder._encode(obj)
    cdef Encoder encoder = Encoder.__new__(Encoder)
    encoder._default = _check_default(default, "packb()")
    return encoder._encode(obj)


def unpackb(data, *, timestamp=None, max_depth=None, max_len=None):
    """Unpack exactly one msgpack object from a bytes-like object.

    Malformed data, or bytes after the object, raise DecodeError (a
    ValueError) with .offset and .reason.  The options are those of Decoder;
    None means the default (timestamp="timestamp", max_depth=512, no max_len).
    """
    cdef Decoder dec = _default_decoder
    if timestamp is not None or max_depth is not None or max_len is not None:
        dec = Decoder(timestamp="timestamp" if timestamp is None else timestamp,
                      max_depth=DEFAULT_MAX_DEPTH if max_depth is None else max_depth,
                      max_len=max_len)
    return dec._decode_obj(data, "unpackb() argument 'data'")


# Public types read as upcall.X (reprs, error messages, help(), pickles by
# reference find them there too), not as this private module.  Static
# extension types take __module__ and __name__ from tp_name.
(<PyTypeObject *>Timestamp).tp_name = b"upcall.Timestamp"
(<PyTypeObject *>ExtType).tp_name = b"upcall.ExtType"
(<PyTypeObject *>Encoder).tp_name = b"upcall.Encoder"
(<PyTypeObject *>Decoder).tp_name = b"upcall.Decoder"
