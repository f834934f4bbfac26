# Publisher: a PUB or PUSH socket sending [topic, msgpack payload].

# Coalescing defaults (Bus.publisher(coalesce=True)); why these: PERF.md,
# "Coalescing".
DEFAULT_MAX_DELAY = 0.001
DEFAULT_MAX_BATCH = 256
DEFAULT_MAX_BYTES = 64 * 1024

cdef int64_t _max_delay_us(object value) except? -2:
    """publisher(max_delay=...): seconds (0 .. 3600) as microseconds; None: -1."""
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"max_delay must be a number of seconds or None, not {type(value).__name__}")
    if not (0 <= value <= 3600):
        raise ValueError(f"max_delay must be between 0 and 3600 seconds (or None), not {value!r}")
    return <int64_t>round(value * 1e6)


cdef class _TopicView:
    """A topic argument as bytes: bytes-like objects as they are, str as UTF-8."""
    cdef Py_buffer view
    cdef bint held

    def __cinit__(self, object topic):
        if isinstance(topic, str):
            topic = (<str>topic).encode("utf-8")
        try:
            PyObject_GetBuffer(topic, &self.view, PyBUF_SIMPLE)
        except TypeError:
            raise TypeError(f"topic must be bytes or str, not {type(topic).__name__}") from None
        self.held = True

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


cdef inline object _topic_of(object topic, const char **buf, size_t *size):
    """A topic argument's bytes in *buf, *size: a bytes object as it is (the
    common case: no view object made per send), anything else through a
    _TopicView, returned so that the caller keeps it alive."""
    if type(topic) is bytes:
        buf[0] = PyBytes_AS_STRING(topic)
        size[0] = <size_t>PyBytes_GET_SIZE(topic)
        return None
    cdef _TopicView t = _TopicView(topic)
    buf[0] = <const char *>t.view.buf
    size[0] = <size_t>t.view.len
    return t


cdef struct _send_args:
    uc_pub *c
    const char *topic
    size_t topic_len
    const char *data
    size_t size
    const uc_oob_frame *frames
    size_t n_frames
    size_t count            # a coalesced payload's messages (send_many), else 0
    int flags


# Why a send cannot go when the publisher has no connection at all (its
# peers count, from the socket monitor, is 0).
_NO_PEER = "no peer connected: nothing has connected to or accepted this publisher"


cdef void _collect_stream(void *ctx, uint64_t stream, const char *topic, size_t topic_len,
                          uint64_t numbered) noexcept nogil:
    with gil:
        (<dict>ctx)[stream] = {"topic": PyBytes_FromStringAndSize(topic, <Py_ssize_t>topic_len),
                               "numbered": numbered}


cdef int _send_step(object owner, int slice_ms, void *arg) except -1:
    cdef _send_args *a = <_send_args *>arg
    cdef int rc
    with nogil:
        if a.count:
            rc = uc_pub_send_batch(a.c, a.topic, a.topic_len, a.data, a.size, a.count,
                                   slice_ms, a.flags)
        else:
            rc = uc_pub_send_ex(a.c, a.topic, a.topic_len, a.data, a.size,
                                a.frames, a.n_frames, slice_ms, a.flags)
    if rc == UC_ERR_AGAIN:
        return 0
    _check_rc(rc, "send")
    return 1


cdef int _flush_step(object owner, int slice_ms, void *arg) except -1:
    cdef uc_pub *c = <uc_pub *>arg
    cdef int rc
    with nogil:
        rc = uc_pub_flush(c, slice_ms, 0)
    if rc == UC_ERR_AGAIN:
        return 0
    _check_rc(rc, "flush")
    return 1


cdef int _close_flush_step(object owner, int slice_ms, void *arg) except -1:
    """A slice of a close sending its pending coalesced batches (Publisher._close_c)."""
    cdef uc_pub *c = <uc_pub *>arg
    cdef int rc
    with nogil:
        rc = uc_pub_close_flush(c, slice_ms)
    return rc != UC_ERR_AGAIN


# The most topics a coalescing publisher keeps a batch open for at once
# (one more sends the oldest batch first).
cdef enum:
    _MAX_TOPICS = 64


cdef struct _subs_wait_args:
    uc_pub *c
    int n
    int count     # the subscriptions seen last


cdef int _subs_wait_step(object owner, int slice_ms, void *arg) except -1:
    cdef _subs_wait_args *a = <_subs_wait_args *>arg
    cdef int rc
    with nogil:
        rc = uc_pub_wait_subscriptions(a.c, a.n, slice_ms, &a.count)
    if rc == UC_ERR_AGAIN:
        return 0
    if rc == UC_ERR_ARG:
        raise ValueError("wait_subscriptions: a push publisher has no subscriptions "
                         "(its send waits for a peer instead)")
    _check_rc(rc, "wait_subscriptions")
    return 1


cdef object _encoded(object encode, object obj):
    """publisher(encoder=...): the encoder's payload for obj, checked to be bytes-like."""
    payload = encode(obj)
    if not PyObject_CheckBuffer(payload):
        raise TypeError(f"the publisher's encoder returned {type(payload).__name__}; "
                        "it must return a bytes-like object (bytes, bytearray, memoryview)")
    return payload


@cython.final
cdef class Publisher:
    """A PUB or PUSH socket.  Made by :meth:`Bus.publisher`.

    ``send``, ``send_many``, ``send_packed`` and ``flush`` are safe to call
    from several threads.
    """
    cdef uc_pub *_c
    cdef Bus _bus
    cdef readonly str endpoint
    cdef Encoder _encoder
    cdef object _encode      # publisher(encoder=...): obj -> bytes-like, in place of _encoder
    cdef mp_writer _w
    cdef bint _writer_busy   # a send using _w has let the GIL go
    cdef int _in_flight      # sends running without the GIL
    cdef uc_pub *_closing    # closed while sends were in flight: the last one closes
    cdef uc_pub *_flushing   # being closed, sending its pending batches (see _close_c)
    cdef bint _linger_cut    # a bus closing by a deadline cut the linger
    cdef born_in _born            # where it was made (the fork check)
    cdef Py_ssize_t _oob_threshold   # publisher(oob_threshold=...); PY_SSIZE_T_MAX: never
    cdef const uc_codec *_codec   # publisher(compression=...); NULL: none
    cdef int _coalesce       # UC_SEND_COALESCE for publisher(coalesce=True), else 0
    cdef size_t _max_batch   # publisher(max_batch=..., max_bytes=...): also send_many's
    cdef size_t _max_bytes
    cdef object __weakref__  # the bus keeps a weak reference
    cdef PyObject *_events   # its _EventSink, referenced until uc_pub_close (NULL: dropped)

    def __cinit__(self, token=None, *args, **kwargs):   # any arguments: the TypeError below
        mp_writer_init(&self._w)
        self._oob_threshold = PY_SSIZE_T_MAX
        _made_here(token, "upcall.Publisher", "Bus.publisher() returns one")
        self._c = NULL
        self._closing = NULL
        self._flushing = NULL
        self._born = _born_here()

    def __del__(self):
        if self._c != NULL and not _inherited(self._born):
            try:
                warnings.warn(f"unclosed {self!r}: close it, or use it as a context manager",
                              ResourceWarning, source=self)
            finally:
                # Even when the warning raises (-W error): __dealloc__'s
                # close could not let Ctrl-C in.
                self.close()

    def __dealloc__(self):
        cdef uc_pub *c = self._c
        # In a forked child the socket is the parent's: left alone.
        if c != NULL and not _inherited(self._born):
            # Without the GIL: closing a coalescing publisher sends its
            # pending batches, which may wait (up to linger) for a peer.
            with nogil:
                uc_pub_close(c)
            self._drop_events()
        self._c = NULL
        mp_writer_free(&self._w)

    cdef void _drop_events(self) noexcept:
        """After uc_pub_close (or a failed open): no event callback runs now."""
        cdef PyObject *sink = self._events
        self._events = NULL
        if sink != NULL:
            (<_EventSink>sink).finish()
            Py_DECREF(<object>sink)

    @property
    def stats(self):
        """Messages and payload bytes sent, and dropped at a full subscriber
        pipe (on_full="drop"; docs/wire.md, "What a publisher counts"):
        sent, sent_bytes, dropped, dropped_bytes; each message of a
        coalesced batch counts.  Connection events (upcall.EVENT_STATS,
        docs/events.md): connected, connect_retried, accepted,
        disconnected, handshakes, handshake_failed_protocol,
        handshake_failed_auth, handshake_failed_no_detail; and
        ``subscription_messages``, the subscribe and unsubscribe messages
        read from a ``kind="pub"`` publisher's peers (read as they arrive:
        docs/security.md)."""
        cdef uint64_t counts[UC_EV_COUNT]
        cdef uc_pub_counts pc
        cdef uint64_t subscription_messages = 0
        if self._c == NULL:
            memset(&pc, 0, sizeof(pc))
            memset(counts, 0, sizeof(counts))
        else:
            uc_pub_counts_get(self._c, &pc)
            uc_pub_events(self._c, counts, NULL)
            subscription_messages = uc_pub_subscription_messages(self._c)
        return {"sent": pc.sent, "sent_bytes": pc.sent_bytes, "dropped": pc.dropped,
                "dropped_bytes": pc.dropped_bytes, **_event_stats(counts),
                "subscription_messages": subscription_messages}

    @property
    def stream(self):
        """The random id of this publisher instance's stamps (a new one per
        publisher: a restart is a new stream, never a gap); None without
        stamp=True.  Each topic is a stream of its own, whose id
        :meth:`stream_of` gives (docs/wire.md, "Stamps")."""
        cdef uint64_t base = 0
        self._check_open()
        uc_pub_streams(self._c, &base, NULL, NULL)
        return base if base else None

    def stream_of(self, topic):
        """The stream id this publisher stamps ``topic``'s messages with (what
        a subscriber's ``streams()`` and gap events name); None without
        stamp=True."""
        cdef const char *tb
        cdef size_t tn
        self._check_open()
        keep = _topic_of(topic, &tb, &tn)
        cdef uint64_t sid = uc_pub_stream_of(self._c, tb, tn)
        return sid if sid else None

    def streams(self):
        """``{stream_id: {"topic": bytes, "numbered": n}}``, one per topic
        sent with stamp=True: numbered counts the sequence numbers given out
        (messages sent and messages dropped at a full pipe), so that per
        stream a subscriber's ``received + lost`` equals it once everything
        sent has arrived.  {} without stamp=True."""
        cdef uint64_t base = 0
        cdef uc_pub *c
        self._check_open()
        c = self._c
        out = {}
        with nogil:
            uc_pub_streams(c, &base, _collect_stream, <void *>out)
        return out

    @property
    def peers(self):
        """Connections up now (transport connections made or accepted and
        not yet ended), read by the monitor thread as they change; 0 once
        closed.  None when unknown: an inproc:// endpoint (libzmq reports no
        connections there) or a socket libzmq could not monitor."""
        cdef int peers = -1
        if self._c == NULL:
            return 0
        uc_pub_events(self._c, NULL, &peers)
        return None if peers < 0 else peers

    def __repr__(self):
        if _inherited(self._born):
            return f"<upcall.Publisher {self.endpoint} inherited from process {self._born.pid}>"
        return f"<upcall.Publisher {self.last_endpoint}{' closed' if self._c == NULL else ''}>"

    @property
    def closed(self):
        """True once closed, and for a Publisher inherited across fork."""
        return self._c == NULL or _inherited(self._born)

    @property
    def last_endpoint(self):
        """The endpoint as bound or connected (a tcp port 0 or * resolved)."""
        if self._c == NULL:
            return self.endpoint
        cdef const char *ep = uc_pub_last_endpoint(self._c)
        return ep.decode("utf-8", "replace") if ep != NULL and ep[0] else self.endpoint

    def send(self, topic, obj, *, timeout=None, copy=True):
        """Encode ``obj`` as msgpack and send ``[topic, payload, *out-of-band frames]``.

        ``timeout``: None (or math.inf) blocks while the high-water mark is
        reached, 0 never blocks (BlockingIOError), a number of seconds blocks
        at most that long (TimeoutError); seconds, not the milliseconds of
        pyzmq's timeouts: ``timeout=1.0`` is one second.  A blocked send lets Ctrl-C in
        (KeyboardInterrupt); the message is then not sent at all.

        ``copy``: True (default): what ``obj`` holds is copied before send
        returns, so its buffers may be changed or reused at once, as with
        pyzmq.  ``copy=False`` allows a zero-copy send of the values that
        travel out of band (a publisher made with ``oob_threshold=`` or
        ``compression=``; docs/wire.md): they are handed to libzmq over
        their own memory, and **must not be changed until the returned**
        :class:`Sent` **is** ``done`` (or ``wait()`` for it): libzmq may
        read them long after send returns.  Returns a :class:`Sent` when
        the message holds such buffers, else None (nothing to wait for:
        ``copy=True``, or nothing out of band).

        On a publisher made with ``coalesce=True`` the message joins its
        topic's pending batch (see :meth:`Bus.publisher`); the send waits
        (per ``timeout``) only when a batch in its way cannot go.  A message
        with out-of-band buffers goes alone, after its topic's batch.
        """
        cdef int ms = -1 if timeout is None else _timeout_ms(timeout, "timeout")
        cdef const char *tb
        cdef size_t tn
        keep = _topic_of(topic, &tb, &tn)
        self._check_open()
        if uc_relq_ready(_relq):
            _drain_releases()
        return self._send_obj(tb, tn, obj, ms, copy)

    cdef object _send_obj(self, const char *tb, size_t tn, object obj, int ms, bint copy):
        """send() after its checks: encode obj, send or coalesce it."""
        cdef mp_writer own
        if self._encode is not None:
            self._send_payload(tb, tn, _encoded(self._encode, obj), ms, self._coalesce)
            return None
        if not self._writer_busy:
            # The shared buffer is claimed before packing: packing may run
            # Python code (a tzinfo's utcoffset), and any other thread may
            # send while it does.  No lock needed: check and claim happen
            # under the GIL with nothing in between that could release it.
            self._writer_busy = True
            try:
                self._w.len = 0
                oob = self._encoder.pack_oob(obj, &self._w, self._oob_threshold)
                if oob is None:
                    self._send_raw(tb, tn, self._w.data, self._w.len, ms, NULL, 0, self._coalesce)
                    return None
                return self._send_oob(tb, tn, self._w.data, self._w.len, <list>oob, ms, copy)
            finally:
                self._writer_busy = False
        # Another send holds the shared buffer (packing, or sending without
        # the GIL): this one packs into its own.
        mp_writer_init(&own)
        try:
            oob = self._encoder.pack_oob(obj, &own, self._oob_threshold)
            if oob is None:
                self._send_raw(tb, tn, own.data, own.len, ms, NULL, 0, self._coalesce)
                return None
            return self._send_oob(tb, tn, own.data, own.len, <list>oob, ms, copy)
        finally:
            mp_writer_free(&own)

    cdef object _send_oob(self, const char *tb, size_t tn, const char *data, size_t size,
                          list oob, int ms, bint copy):
        """Send the payload and the out-of-band values in oob (OobBuffer):
        over their own memory (a release through _relq marks the Sent done
        once libzmq is done with every frame), or copied (copy=True), or
        compressed into buffers of libzmq's own (compression=...: the
        frames that pay, whose buffers are then free at once).  Never
        coalesced: on a coalescing publisher the topic's open batch goes
        first (the C core sends it), then this message alone."""
        cdef uc_oob_frame frames[UC_WIRE_MAX_OOB]
        cdef size_t i, n = len(oob), n_raw = n
        cdef Sent sent = Sent.__new__(Sent)
        cdef uc_release *r = NULL
        cdef OobBuffer b
        for i in range(n):
            b = <OobBuffer>oob[i]
            frames[i].data = b.view.buf
            frames[i].size = <size_t>b.view.len
            frames[i].release = NULL
            frames[i].cbuf = NULL
        if self._codec != NULL:
            n_raw = self._compress_frames(data, oob, frames, n)
        if not copy and n_raw:
            r = uc_release_new(_relq, <void *>sent)
            if r == NULL:
                self._put_cbufs(frames, n)
                raise MemoryError()
            Py_INCREF(sent)            # the queue's reference, dropped by _drain_releases
            sent._buffers = oob if n_raw == n else [
                oob[i] for i in range(n) if frames[i].cbuf == NULL]
            for i in range(n):
                frames[i].release = r
        else:
            sent._done = True          # nothing of the sender's is held
        try:
            self._send_raw(tb, tn, data, size, ms, frames, n, 0)
        finally:
            # Whatever happened: the frames libzmq took hold their own
            # references; the buffers are released once they are all back.
            if r != NULL:
                uc_release_put(r)
            self._put_cbufs(frames, n)
        if copy:
            return None        # libzmq has its own copies: nothing to wait for
        return sent

    cdef size_t _compress_frames(self, const char *data, list oob, uc_oob_frame *frames, size_t n):
        """compression=...: compress the frames that pay with the publisher's
        codec (csrc/compress.h), without the GIL, and put its id in their
        references' flags in the payload (ours: the writer's buffer).
        Returns how many frames stay raw."""
        cdef size_t i, n_raw = n
        cdef OobBuffer b
        cdef const uc_codec *codec = self._codec
        with nogil:
            for i in range(n):
                if frames[i].size >= UC_COMPRESS_MIN_FRAME:
                    frames[i].cbuf = uc_codec_frame(codec, frames[i].data, frames[i].size)
        for i in range(n):
            if frames[i].cbuf != NULL:
                b = <OobBuffer>oob[i]
                uc_oob_ref_set_codec(<unsigned char *>data + b.ref_at, codec.id)
                n_raw -= 1
        return n_raw

    cdef void _put_cbufs(self, uc_oob_frame *frames, size_t n) noexcept:
        cdef size_t i
        for i in range(n):
            if frames[i].cbuf != NULL:
                uc_cbuf_put(frames[i].cbuf)     # libzmq holds its own references
                frames[i].cbuf = NULL

    def send_async(self, topic, obj, *, timeout=None):
        """Encode ``obj`` now; return an awaitable that sends ``[topic, payload]``
        without ever blocking the event loop.

        At the high-water mark it waits on the event loop, woken when the
        socket may have room (no timer, no busy retry), while other
        coroutines run.  ``timeout``: None waits
        until sent, 0 raises BlockingIOError if the message cannot go at once,
        a number of seconds raises TimeoutError after that long.  Cancelling
        the awaiting task leaves the message unsent.  See docs/asyncio.md.
        """
        _timeout_ms(timeout, "timeout")
        _TopicView(topic)
        self._check_open()
        payload = _encoded(self._encode, obj) if self._encode is not None else self._encoder._encode(obj)
        return _async_adapter().send_when_ready(self, topic, payload,
                                                None if timeout is None else float(timeout))

    def try_send_packed(self, topic, payload):
        """For async adapters (send_async): send ``[topic, payload]``
        (already-encoded bytes) if that can be done now, without waiting even
        for another thread's send.  True if sent, False at the high-water
        mark or while another thread sends."""
        cdef _TopicView t = _TopicView(topic)
        cdef Py_buffer view
        cdef int rc
        self._check_open()
        PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
        try:
            rc = uc_pub_try_send(self._c, t.view.buf, <size_t>t.view.len,
                                 view.buf, <size_t>view.len)
        finally:
            PyBuffer_Release(&view)
        if rc == UC_ERR_AGAIN:
            return False
        _check_rc(rc, "send_async")
        return True

    def watch_room(self, int efd):
        """For async adapters (send_async) at the high-water mark: register the eventfd efd,
        signalled when another sender may have left room (uc_pub_watch);
        return a duplicate of the socket's ZMQ_FD, for the event loop to
        watch too (the caller closes it: it stays valid, silent, once the
        publisher is closed)."""
        self._check_open()
        _check_rc(uc_pub_watch(self._c, efd), "send_async")
        try:
            return os.dup(uc_pub_zmq_fd(self._c))
        except BaseException:
            uc_pub_unwatch(self._c, efd)
            raise

    def unwatch_room(self, int efd):
        """Undo watch_room before efd is closed.  A closed publisher has
        forgotten it already (its close shut it down first)."""
        if self._c != NULL and not _inherited(self._born):
            uc_pub_unwatch(self._c, efd)

    def send_packed(self, topic, payload, *, timeout=None):
        """Send ``[topic, payload]`` where payload is already-encoded bytes
        (``timeout`` as for :meth:`send`).  Never coalesced: on a coalescing
        publisher the topic's pending messages go first, then this one, as
        given."""
        cdef int ms = -1 if timeout is None else _timeout_ms(timeout, "timeout")
        cdef const char *tb
        cdef size_t tn
        keep = _topic_of(topic, &tb, &tn)
        self._check_open()
        self._send_payload(tb, tn, payload, ms, 0)

    def send_many(self, topic, objs, *, timeout=None):
        """Send every object of the iterable ``objs`` under ``topic``, coalesced:
        as few zmq messages as ``max_batch`` and ``max_bytes`` allow
        (docs/wire.md, ext 127), in order; returns once all are handed to
        libzmq.

        On a coalescing publisher they join the topic's pending batch, then
        everything pending is flushed.  On any other publisher the batches
        are built here, after the topic's earlier messages, and sent at once:
        the same messages on the wire, values packed inline.  (On a
        coalescing publisher made with ``oob_threshold=`` a message with
        values of that many bytes or more goes alone, as with send, its
        values copied.)
        ``timeout`` as for :meth:`send`, per zmq
        message; an error leaves the objects before the failing batch sent
        and the rest not (on a coalescing publisher, pending).
        """
        cdef int ms = -1 if timeout is None else _timeout_ms(timeout, "timeout")
        cdef const char *tb
        cdef size_t tn
        keep = _topic_of(topic, &tb, &tn)
        self._check_open()
        if self._coalesce:
            for obj in objs:
                self._send_obj(tb, tn, obj, ms, True)   # no Sent to give back: copy
            self.flush(timeout=timeout)
            return None
        self._send_built(tb, tn, objs, ms)
        return None

    cdef int _send_built(self, const char *tb, size_t tn, object objs, int ms) except -1:
        """send_many without coalescing: the batches are built by the C core's
        coalescer (csrc/coalesce.h), one of its own for this one topic, with
        the publisher's max_batch and max_bytes: the same batches a
        coalescing publisher sends."""
        cdef uc_coal co
        cdef uc_batch *b
        cdef mp_writer w
        cdef int full = 0
        if uc_coal_init(&co, 1, self._max_batch, self._max_bytes) != UC_OK:
            raise MemoryError()
        mp_writer_init(&w)
        try:
            b = uc_coal_slot(&co, tb, tn, &full)
            if b == NULL:
                raise MemoryError()
            for obj in objs:
                w.len = 0
                if self._encode is not None:
                    payload = _encoded(self._encode, obj)
                    self._append_payload(&w, payload)
                else:
                    self._encoder.pack_oob(obj, &w, PY_SSIZE_T_MAX)
                if uc_coal_alone(&co, w.len):
                    # Too large for any batch: alone, after the batch before it.
                    self._send_batch(tb, tn, &co, b, ms)
                    self._send_raw(tb, tn, w.data, w.len, ms, NULL, 0, 0)
                    continue
                if not uc_batch_fits(&co, b, w.len):
                    self._send_batch(tb, tn, &co, b, ms)
                if uc_batch_append(&co, b, w.data, w.len, 0) != UC_OK:
                    raise MemoryError()
                if uc_batch_full(&co, b):
                    self._send_batch(tb, tn, &co, b, ms)
            self._send_batch(tb, tn, &co, b, ms)
        finally:
            mp_writer_free(&w)
            uc_coal_free(&co)
        return 0

    cdef int _append_payload(self, mp_writer *w, object payload) except -1:
        cdef Py_buffer view
        PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
        try:
            if mp_write_raw(w, view.buf, <size_t>view.len) != 0:
                raise MemoryError()
        finally:
            PyBuffer_Release(&view)
        return 0

    cdef int _send_batch(self, const char *tb, size_t tn, uc_coal *co, uc_batch *b,
                         int ms) except -1:
        """Send batch b, if it holds anything, as one message (a batch of one
        as that message alone: uc_batch_payload), then empty it."""
        cdef const char *data
        cdef size_t size
        if b.count == 0:
            return 0
        data = uc_batch_payload(b, &size)
        self._send_raw(tb, tn, data, size, ms, NULL, 0, 0, b.count if b.count > 1 else 0)
        uc_batch_clear(co, b)
        return 0

    def flush(self, *, timeout=None):
        """Send every pending coalesced batch now, oldest first (nothing to do
        on a publisher that does not coalesce).  ``timeout`` as for
        :meth:`send`, per batch; on BlockingIOError / TimeoutError the
        batches not sent stay pending."""
        cdef int ms = -1 if timeout is None else _timeout_ms(timeout, "timeout")
        cdef uc_pub *c
        cdef int rc
        self._check_open()
        c = self._c
        if not self._coalesce:
            return None
        self._in_flight += 1       # until _landed()
        try:
            with nogil:
                rc = uc_pub_flush(c, 0, 0)
            if rc == UC_ERR_AGAIN and ms != 0:
                if _in_signal_slices(self, _flush_step, <void *>c, ms):
                    rc = UC_OK
        finally:
            self._landed()
        _check_rc(rc, "flush", ms)
        return None

    @property
    def pending(self):
        """Messages waiting in coalesced batches now (0 without coalescing)."""
        if self._c == NULL or _inherited(self._born):
            return 0
        return uc_pub_pending(self._c)

    cdef int _send_payload(self, const char *tb, size_t tn, object payload, int ms,
                           int flags) except -1:
        cdef Py_buffer view
        try:
            PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
        except TypeError:
            raise TypeError(f"payload must be bytes-like, not {type(payload).__name__}") from None
        try:
            return self._send_raw(tb, tn, <const char *>view.buf, <size_t>view.len, ms,
                                  NULL, 0, flags)
        finally:
            PyBuffer_Release(&view)

    cdef int _send_raw(self, const char *tb, size_t tn, const char *data, size_t size, int ms,
                       const uc_oob_frame *frames, size_t n_frames, int flags,
                       size_t count=0) except -1:
        """Send (or, flags UC_SEND_COALESCE, coalesce) one message, or with
        count >= 2 a coalesced payload of count messages; at the high-water
        mark wait in signal slices."""
        cdef int rc
        cdef uc_pub *c = self._c
        cdef _send_args a
        if c == NULL:
            # Closed while the message was being packed (by Python code it ran).
            self._check_open()
        # First with the GIL held: a send that does not wait (zmq_send with
        # ZMQ_DONTWAIT never blocks, the senders' mutex is only tried) costs
        # less than letting the GIL go and taking it back.  Nothing can close
        # the publisher meanwhile: that needs the GIL too.
        if count:
            rc = uc_pub_send_batch(c, tb, tn, data, size, count, 0, flags | UC_SEND_TRY)
        else:
            rc = uc_pub_send_ex(c, tb, tn, data, size, frames, n_frames, 0, flags | UC_SEND_TRY)
        if rc == UC_OK:
            return 0
        if rc != UC_ERR_BUSY and (rc != UC_ERR_AGAIN or ms == 0):
            return self._check_send_rc(rc, ms)
        self._in_flight += 1       # until _landed()
        try:
            if rc == UC_ERR_BUSY:
                # Another sender's turn (maybe blocked at the mark): wait
                # for it without the GIL.
                with nogil:
                    if count:
                        rc = uc_pub_send_batch(c, tb, tn, data, size, count, 0, flags)
                    else:
                        rc = uc_pub_send_ex(c, tb, tn, data, size, frames, n_frames, 0, flags)
            if rc == UC_ERR_AGAIN and ms != 0:
                # Each slice sends the whole message or nothing (the mark is
                # checked on the first frame only, and a message's frames go
                # out under one lock), so an interrupted send sent nothing.
                a.c, a.topic, a.topic_len, a.data, a.size = c, tb, tn, data, size
                a.frames, a.n_frames, a.flags, a.count = frames, n_frames, flags, count
                if _in_signal_slices(self, _send_step, &a, ms):
                    rc = UC_OK
        finally:
            self._landed()
        return self._check_send_rc(rc, ms)

    cdef int _check_send_rc(self, int rc, int ms) except -1:
        if rc == UC_ERR_AGAIN and self._c != NULL and self.peers == 0:
            # Not the high-water mark of a peer that reads slowly: nobody
            # is there to take it.
            if ms > 0:
                raise TimeoutError(f"send did not complete within {_seconds_text(ms)} ({_NO_PEER})")
            raise BlockingIOError(f"send would block: {_NO_PEER}")
        return _check_rc(rc, "send", ms)

    def wait_subscriptions(self, n=1, *, timeout=None):
        """Wait until this ``kind="pub"`` publisher's peers hold at least
        ``n`` subscriptions; return how many they hold.

        The cure for ZeroMQ's slow joiner: a PUB socket drops what it sends
        before a SUB has subscribed, and subscribing takes a round trip after
        the connection.  A message sent after this returns reaches every
        subscription counted.  A SUB subscribed to k prefixes holds k (a
        subscriber with the default ``topics`` holds one), one that went away
        holds none: after a peer's connection ends (a ``disconnected``
        event), the count is compared only once that peer's unsubscriptions
        have had 200 ms to reach the socket, and never while no connection
        is up, so a subscriber that left is not counted for the one that
        takes its place (a subscriber whose close has not reached the
        publisher yet still is).  ``timeout`` in seconds (None: no limit, 0: look once);
        TimeoutError when it passes.  Lets Ctrl-C in, and other threads send
        meanwhile.  ``wait_subscriptions(0, timeout=0)`` just counts.  A
        ``kind="push"`` publisher raises ValueError: its sends wait for a
        peer by themselves.
        """
        cdef int ms = _timeout_ms(timeout, "timeout")
        cdef _subs_wait_args a
        cdef int done
        want = int_arg(n, "n", 0, 2147483647)
        self._check_open()
        a.c, a.n, a.count = self._c, want, 0
        self._in_flight += 1       # until _landed()
        try:
            done = _in_signal_slices(self, _subs_wait_step, &a, ms)
        finally:
            self._landed()
        if not done:
            raise TimeoutError(f"wait_subscriptions: {a.count} of {want} subscriptions "
                               f"after {timeout} s")
        return a.count

    cdef int _landed(self) except -1:
        """A call that let the GIL go with the socket in use (_in_flight
        counted it) is done with it: the last one out closes the socket a
        close() left to it."""
        cdef uc_pub *c
        self._in_flight -= 1
        if self._in_flight == 0 and self._closing != NULL:
            c = self._closing
            self._closing = NULL
            self._close_c(c)
        return 0

    cdef _check_open(self):
        _check_not_inherited(self._born, "Publisher")
        if self._c == NULL:
            raise ValueError("send on a closed publisher")

    cdef _close_lingering_at_most(self, int max_ms):
        """close(), lingering at most max_ms (-1: as configured): for a bus
        closing by a deadline.  A close already under way on another thread
        (sending its pending batches) is cut to that too."""
        if max_ms >= 0:
            self._linger_cut = True
            uc_pub_cap_linger(self._c if self._c != NULL
                              else self._closing if self._closing != NULL
                              else self._flushing, max_ms)
        self.close()

    cdef int _close_c(self, uc_pub *c) except -1:
        """Close c, on which no send runs any more.  A coalescing publisher
        first sends its pending batches within its linger, waiting in signal
        slices as a blocked send does: Ctrl-C raises KeyboardInterrupt from
        it even with ``linger=None``, and a bus closing by a deadline on
        another thread cuts the linger (through _flushing).  What is still
        pending then is discarded, with a warning on the "upcall" logger
        saying how many messages; the publisher is closed either way."""
        cdef size_t n
        endpoint = uc_pub_last_endpoint(c).decode("utf-8", "replace") or self.endpoint
        why = "its linger ended"
        self._flushing = c
        try:
            _in_signal_slices(self, _close_flush_step, <void *>c, -1)
        except BaseException as exc:
            why = f"the close was interrupted ({type(exc).__name__})"
            raise
        finally:
            # Under the GIL, before the free: a bus closing on another thread
            # reads _flushing with the GIL held.
            self._flushing = NULL
            n = uc_pub_discard(c)
            if self._linger_cut and why == "its linger ended":
                why = "the close of its bus by a deadline cut its linger"
            with nogil:
                uc_pub_close(c)
            self._drop_events()
            if n:
                _log.warning("upcall: publisher %s closed with %d coalesced message(s) "
                             "not sent (%s): discarded", endpoint, n, why,
                             extra={"publisher": endpoint, "discarded": n})
        return 0

    def close(self):
        """Close the socket; pending messages linger up to the publisher's ``linger``.

        A coalescing publisher sends its pending batches first, within that
        linger; the wait lets Ctrl-C in (KeyboardInterrupt, even with
        ``linger=None``), and a bus closed with a ``timeout`` meanwhile cuts
        it.  Batches still pending then are discarded, with a warning on
        the "upcall" logger saying how many messages (``extra``:
        ``discarded``); the publisher is closed either way."""
        cdef uc_pub *c = self._c
        _check_not_inherited(self._born, "Publisher")
        if c == NULL:
            return
        if self._events != NULL and (<_EventSink>self._events).calling == threading.get_ident():
            # The monitor thread runs on_event and would free what it reads.
            raise RuntimeError("close() from the publisher's own on_event: close it from "
                               "another thread (e.g. hand it to one)")
        self._c = NULL
        try:
            _drain_releases()
        finally:
            try:
                if self._in_flight:
                    # Other threads are sending on it right now: wake the blocked
                    # ones (they raise), and the last one out frees it.
                    uc_pub_shutdown(c)
                    self._closing = c
                else:
                    self._close_c(c)
            finally:
                if self._bus is not None:
                    self._bus._forget(self)

    def __enter__(self):
        _check_not_inherited(self._born, "Publisher")
        return self

    def __exit__(self, *exc_info):
        self.close()
