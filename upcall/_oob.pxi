# Out-of-band values (docs/wire.md, ext 126): large bytes-like values travel
# as zmq frames of their own, without a copy on either side.  Opt-in
# (publisher(oob_threshold=N) or compression=): a default publisher's
# payload is plain msgpack, which any msgpack reader decodes.
#
# Send: Publisher.send packs with Encoder.pack_oob, which collects the views
# (OobBuffer) of the values at or above the publisher's threshold; the
# frames are copied into libzmq's memory (send's default, copy=True), or,
# with send(copy=False), go to libzmq over that memory (uc_pub_send_frames).
# libzmq frees them on its own threads, where Python must not be entered:
# the C core queues the release (uc_relq), and _drain_releases, on a thread
# holding the GIL, drops the views and marks the message's Sent handle done.
# It runs on every send, Sent.done / Sent.wait(), publisher close, and as a
# pending call on the main thread scheduled by the queue's notify hook.
#
# Receive: the decoder resolves a reference into a read-only memoryview over
# a _HeldFrame, which holds the zmq message itself (uc_sub_hold) until the
# last view of it is gone; freeing it is safe on any thread at any time.
# A compressed frame (a codec id in the flags) is decompressed into one
# allocation (_Inflated), viewed the same way; subscribe(copy=True) gives
# bytes instead.
#
# Compression (publisher(compression="lz4" or any codec of csrc/codec.h's
# table), csrc/compress.h): each frame of UC_COMPRESS_MIN_FRAME bytes or
# more is sampled and compressed when that pays,
# without the GIL, into a buffer libzmq owns: the sender's own buffer is free
# as soon as compression is done.

cdef extern from "Python.h":
    int Py_AddPendingCall(int (*func)(void *) noexcept, void *arg) nogil
    int PyBuffer_FillInfo(Py_buffer *view, object exporter, void *buf, Py_ssize_t len,
                          int readonly, int flags) except -1
    object PyMemoryView_FromObject(object o)
    const Py_ssize_t PY_SSIZE_T_MAX

from upcall._codec cimport OobBuffer
from upcall.includes.compress cimport *

# The reference's codec ids and the faults of a frame that cannot be
# decompressed are the wire format's (csrc/wire.h).
from upcall.includes.wire cimport *

#: The codecs ``publisher(compression=...)`` takes in this build, in the
#: order of the C core's table (csrc/codec.h): ("lz4", "zstd") when upcall
#: was built with liblz4 and libzstd, () with neither.
COMPRESSION = tuple(uc_codec_at(_i).name.decode() for _i in range(uc_codec_count())
                    if uc_codec_at(_i).available)
# Every codec of the table, available or not (error messages).
_CODECS = tuple(uc_codec_at(_i).name.decode() for _i in range(uc_codec_count()))

#: The threshold to opt in with, ``publisher(oob_threshold=DEFAULT_OOB_THRESHOLD)``
#: (and the one ``compression=`` uses): values of this many bytes or more go
#: out of band (PERF.md, "Large payloads").  The default is None: never.
DEFAULT_OOB_THRESHOLD = 16 * 1024
#: Out-of-band values one message carries at most (UC_MAX_FRAMES - 2, less
#: the marker frame); more go inline.
MAX_OOB_FRAMES = UC_WIRE_MAX_OOB


cdef bytes _wire_marker():
    cdef unsigned char buf[UC_MARK_STAMPED_SIZE]
    cdef size_t n = uc_mark_pack(buf, 0, 0, 0, 0)
    return PyBytes_FromStringAndSize(<const char *>buf, <Py_ssize_t>n)


#: The marker frame of an unstamped message (docs/wire.md, "The marker
#: frame"): the last frame of a message whose payload uses upcall's wire
#: extensions (out-of-band references, a coalesced batch).  A foreign
#: producer that writes them appends it: ``[topic, payload, *frames,
#: WIRE_MARKER]``.
WIRE_MARKER = _wire_marker()
#: Bytes the compressed out-of-band frames of one message may decompress to,
#: in all, for a subscription given no ``max_message_size`` (docs/security.md).
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024
cdef uint64_t _DEFAULT_MAX_DECOMPRESSED = DEFAULT_MAX_DECOMPRESSED

# One queue for the process, never freed: a peer (an inproc subscriber
# keeping a view) may hold a frame for as long as it likes.
cdef uc_relq *_relq = uc_relq_new()
if _relq == NULL:
    raise MemoryError("upcall: cannot make the out-of-band release queue")
cdef int _drain_scheduled = 0


@cython.final
cdef class Sent:
    """What :meth:`Publisher.send` returns for a message whose out-of-band
    values went without a copy (``send(..., copy=False)`` on a publisher
    made with ``oob_threshold=``): whether libzmq is done with them
    (docs/wire.md).

    Until ``done``, those buffers are still read by libzmq (or, on
    ``inproc://``, viewed by a subscriber): they must not be changed.  A
    message with no such value (small values only, no out-of-band frames,
    or ``copy=True``, the default) returns None instead: it holds nothing
    once ``send`` returns.
    """
    cdef list _buffers     # the OobBuffer views, until released
    cdef bint _done

    @property
    def done(self):
        """True once every out-of-band buffer of the message is released."""
        if not self._done:
            _drain_releases()
        return self._done

    def wait(self, timeout=None):
        """Wait until ``done`` (``timeout`` seconds, None: no limit); returns
        ``done``.  Lets Ctrl-C in."""
        cdef int ms = _timeout_ms(timeout, "timeout")
        if self._done:
            return True
        _drain_releases()
        if self._done:
            return True
        return _in_signal_slices(self, _release_step, NULL, ms) == 1

    def __repr__(self):
        return f"<upcall.Sent {'done' if self._done else 'in flight'}>"


cdef int _release_step(object owner, int slice_ms, void *arg) except -1:
    with nogil:
        uc_relq_wait(_relq, slice_ms)
    _drain_releases()
    return (<Sent>owner)._done


cdef int _drain_releases() except -1:
    """Take the released tokens (each a Sent with the queue's reference):
    drop their views, mark them done.  With the GIL."""
    cdef void *tokens[64]
    cdef size_t n, i
    cdef Sent s
    global _drain_scheduled
    _drain_scheduled = 0
    while True:
        n = uc_relq_drain(_relq, tokens, 64)
        for i in range(n):
            s = <Sent>tokens[i]
            s._buffers = None      # releases the exporters' buffers
            s._done = True
            Py_DECREF(s)           # the queue's reference
        if n < 64:
            return 0


cdef int _pending_drain(void *arg) noexcept:
    # A pending call: the main thread, with the GIL.
    try:
        _drain_releases()
    except BaseException:
        pass
    return 0


cdef void _relq_notify(void *ctx) noexcept nogil:
    # On whatever thread released the last frame (a zmq I/O thread): no
    # GIL, so ask the main thread to drain.  A failed request (the pending
    # call queue is full) is not lost for good: the next send, wait or close
    # drains.
    global _drain_scheduled
    if _python_gone() or _drain_scheduled:
        return
    _drain_scheduled = 1
    if Py_AddPendingCall(_pending_drain, NULL) != 0:
        _drain_scheduled = 0

uc_relq_set_notify(_relq, _relq_notify, NULL)


def oob_outstanding():
    """Out-of-band buffers still held: ``(sent, received)``.

    ``sent``: messages whose zero-copy frames libzmq has not released yet
    (or whose release is not drained yet); ``received``: received frames
    (or their decompressed copies) still alive in a memoryview.  For leak
    checks; drains first."""
    _drain_releases()
    return (uc_relq_outstanding(_relq), uc_held_outstanding() + _inflated_alive)


@cython.final
cdef class _HeldFrame:
    """A received zmq frame kept alive while any memoryview of it is."""
    cdef uc_held *h

    def __getbuffer__(self, Py_buffer *buf, int flags):
        PyBuffer_FillInfo(buf, self, <void *>uc_held_data(self.h), <Py_ssize_t>uc_held_size(self.h),
                          1, flags)

    def __releasebuffer__(self, Py_buffer *buf):
        pass

    def __dealloc__(self):
        uc_held_free(self.h)     # any thread: only a reference count is touched


cdef uint64_t _inflated_alive = 0     # _Inflated objects (under the GIL)


@cython.final
cdef class _Inflated:
    """A decompressed out-of-band frame: one allocation, freed when the last
    memoryview of it is gone."""
    cdef char *data
    cdef Py_ssize_t size

    def __cinit__(self):
        global _inflated_alive
        _inflated_alive += 1

    def __getbuffer__(self, Py_buffer *buf, int flags):
        PyBuffer_FillInfo(buf, self, self.data, self.size, 1, flags)

    def __releasebuffer__(self, Py_buffer *buf):
        pass

    def __dealloc__(self):
        global _inflated_alive
        free(self.data)
        _inflated_alive -= 1


cdef struct _oob_ctx:
    # The decoder's context for a message's out-of-band frames.
    const uc_msg *m
    # The size limit of the message once decompressed (_oob_size_limit):
    # `limit` bytes in all, `left` of them not taken yet by the frames
    # resolved so far.  With max_message_size (`whole`), the payload and the
    # raw frames count too; without, only what decompression allocates.
    uint64_t limit
    uint64_t left
    uint64_t refused        # the size the message would have reached, once refused
    bint whole


cdef inline void _oob_size_limit(_oob_ctx *c, const uc_msg *m, uint64_t max_message_size,
                                 bint given):
    c.m = m
    c.whole = given
    c.limit = max_message_size if given else _DEFAULT_MAX_DECOMPRESSED
    c.left = c.limit
    c.refused = 0
    if given:
        c.left = c.limit - m.payload.size if m.payload.size < c.limit else 0


cdef inline bint _oob_take(_oob_ctx *c, uint64_t size, int *err) noexcept:
    """Count size bytes of the message against its limit, before anything
    is allocated for them; past it, False with *err set (a decode error,
    reason "message_size", which _oob_explain words)."""
    if size <= c.left:
        c.left -= size
        return True
    c.refused = c.limit - c.left + size
    err[0] = UC_WIRE_ERR_MSG_SIZE
    return False


cdef int _oob_explain(object exc, const _oob_ctx *c) except -1:
    """The limit and the size in the text of a "message_size" decode error."""
    if c.whole:
        why = f"over the subscription's max_message_size={c.limit}"
    else:
        why = (f"over the {c.limit} bytes of decompressed out-of-band frames a message may "
               "take by default (subscribe(max_message_size=...) sets the limit)")
    exc.args = (f"msgpack decode error at byte {exc.offset}: message refused: it would take "
                f"at least {c.refused} bytes once its out-of-band frames are decompressed, "
                f"{why}",)
    return 0


cdef object _oob_inflated(_oob_ctx *c, size_t i, unsigned codec_id, uint64_t size, bint copy,
                          int *err):
    """The i-th frame decompressed with the codec of codec_id: a memoryview
    over one allocation, or bytes (copy); with *err set (and None) when it
    cannot be: no codec of this build has that id, or the frame does not
    decompress to exactly size bytes (a size the codec cannot reach from the
    frame is refused before anything is allocated, uc_codec_refuses, and so
    is one past the message's size limit, _oob_take)."""
    cdef const uc_frame *f = &c.m.extra[i]
    cdef const uc_codec *codec = uc_codec_by_id(codec_id)
    cdef _Inflated v
    cdef char *dst
    cdef int rc
    if codec == NULL or not codec.available:
        err[0] = UC_WIRE_ERR_OOB_CODEC
        return None
    if uc_codec_refuses(codec, f.data, f.size, size):
        err[0] = UC_WIRE_ERR_OOB_DECOMPRESS
        return None
    if not _oob_take(c, size, err):
        return None
    if copy:
        out = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>size)
        dst = PyBytes_AS_STRING(out)
    else:
        v = _Inflated.__new__(_Inflated)
        v.data = <char *>malloc(<size_t>size if size else 1)
        if v.data == NULL:
            raise MemoryError()
        v.size = <Py_ssize_t>size
        dst = v.data
    with nogil:
        rc = uc_codec_decompress(codec, f.data, f.size, dst, <size_t>size)
    if rc != UC_OK:
        err[0] = UC_WIRE_ERR_OOB_DECOMPRESS
        return None
    return out if copy else PyMemoryView_FromObject(v)


cdef object _oob_value(void *ctx, size_t i, int codec, uint64_t size, int *err):
    """The decoder's value for the i-th frame after the payload of the
    message of ctx (an _oob_ctx: a uc_msg being delivered): a read-only
    memoryview over the zmq frame itself, or over a copy for a source without
    zmq frames, or over its decompressed bytes (a codec other than UC_OOB_CODEC_NONE)."""
    cdef _oob_ctx *c = <_oob_ctx *>ctx
    cdef const uc_msg *m = c.m
    cdef uc_held *h = NULL
    cdef _HeldFrame f
    cdef int rc
    if codec != UC_OOB_CODEC_NONE:
        return _oob_inflated(c, i, codec, size, False, err)
    if c.whole and not _oob_take(c, m.extra[i].size, err):
        return None
    rc = uc_sub_hold(uc_sub_current(), &m.extra[i], &h)
    if rc == UC_OK:
        f = _HeldFrame.__new__(_HeldFrame)
        f.h = h
        return PyMemoryView_FromObject(f)
    if rc == UC_ERR_NOMEM:
        raise MemoryError()
    return PyMemoryView_FromObject(PyBytes_FromStringAndSize(m.extra[i].data, <Py_ssize_t>m.extra[i].size))


cdef object _oob_bytes(void *ctx, size_t i, int codec, uint64_t size, int *err):
    """_oob_value for subscribe(copy=True): the frame's bytes (decompressed)."""
    cdef _oob_ctx *c = <_oob_ctx *>ctx
    cdef const uc_msg *m = c.m
    if codec != UC_OOB_CODEC_NONE:
        return _oob_inflated(c, i, codec, size, True, err)
    if c.whole and not _oob_take(c, m.extra[i].size, err):
        return None
    return PyBytes_FromStringAndSize(m.extra[i].data, <Py_ssize_t>m.extra[i].size)


cdef const uc_codec *_compression_arg(object value) except? NULL:
    """publisher(compression=...): the codec's row for its name, NULL for None."""
    cdef const uc_codec *codec
    names = " or ".join(repr(n) for n in _CODECS)
    if value is None:
        return NULL
    if not isinstance(value, str):
        raise TypeError(f"compression must be None or a codec name ({names}), "
                        f"not {type(value).__name__}")
    codec = uc_codec_by_name(value.encode()) if value.isascii() and "\0" not in value else NULL
    if codec == NULL:
        raise ValueError(f"compression must be None or a codec name ({names}), not {value!r}")
    if not codec.available:
        lib = codec.library.decode()
        has = ", ".join(repr(n) for n in COMPRESSION) or "none"
        raise ValueError(f"compression={value!r} needs {lib}; this upcall was built without it "
                         f"(this build has: {has}; install {lib}'s development files, e.g. "
                         f"Debian's {lib}-dev, and rebuild; upcall.COMPRESSION lists what this "
                         f"build has)")
    return codec


cdef Py_ssize_t _oob_threshold_arg(object value) except -2:
    if value is None:
        return PY_SSIZE_T_MAX
    return int_arg(value, "oob_threshold", 1, 2 ** 63 - 1, "None: never")
