# Publisher: a PUB or PUSH socket sending [topic, msgpack payload].


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


@cython.final
cdef class Publisher:
    """A PUB or PUSH socket.  Made by :meth:`Bus.publisher`.

    ``send`` and ``send_packed`` are safe to call from several threads.
    """
    cdef uc_pub *_c
    cdef Bus _bus
    cdef readonly str endpoint
    cdef Encoder _encoder
    cdef mp_writer _w
    cdef bint _writer_busy   # a send using _w has let the GIL go
    cdef int _in_flight      # sends running without the GIL
    cdef uc_pub *_closing    # closed while sends were in flight: the last one closes

    def __cinit__(self):
        self._c = NULL
        self._closing = NULL
        mp_writer_init(&self._w)

    def __dealloc__(self):
        if self._c != NULL:
            uc_pub_close(self._c)
            self._c = NULL
        mp_writer_free(&self._w)

    def __repr__(self):
        return f"<upcall.Publisher {self.endpoint}{' closed' if self._c == NULL else ''}>"

    @property
    def closed(self):
        return self._c == NULL

    @property
    def last_endpoint(self):
        """The endpoint as bound or connected (a tcp port 0 or * resolved)."""
        if self._c == NULL:
            return self.endpoint
        cdef const char *ep = uc_pub_last_endpoint(self._c)
        return ep.decode("utf-8", "replace") if ep != NULL and ep[0] else self.endpoint

    def send(self, topic, obj, *, timeout=None):
        """Encode ``obj`` as msgpack and send ``[topic, payload]``.

        ``timeout``: None blocks while the high-water mark is reached, 0 never
        blocks (BlockingIOError), a number of seconds blocks at most that long
        (TimeoutError).
        """
        cdef int ms = _timeout_ms(timeout, "timeout")
        cdef _TopicView t = _TopicView(topic)
        self._check_open()
        if self._writer_busy:
            # Another thread is sending from our reusable buffer without the
            # GIL: encode into a private one instead.
            return self._send(t, self._encoder.encode(obj), ms)
        self._w.len = 0
        self._encoder.pack_into(obj, &self._w)
        self._writer_busy = True
        try:
            self._send_raw(t, self._w.data, self._w.len, ms)
        finally:
            self._writer_busy = False

    def send_packed(self, topic, payload, *, timeout=None):
        """Send ``[topic, payload]`` where payload is already-encoded bytes."""
        cdef int ms = _timeout_ms(timeout, "timeout")
        cdef _TopicView t = _TopicView(topic)
        self._check_open()
        return self._send(t, payload, ms)

    cdef _send(self, _TopicView t, object payload, int ms):
        cdef Py_buffer view
        try:
            PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
        except TypeError:
            raise TypeError(f"payload must be bytes-like, not {type(payload).__name__}") from None
        try:
            self._send_raw(t, <const char *>view.buf, <size_t>view.len, ms)
        finally:
            PyBuffer_Release(&view)

    cdef int _send_raw(self, _TopicView t, const char *data, size_t size, int ms) except -1:
        cdef int rc
        cdef uc_pub *c = self._c
        self._in_flight += 1
        with nogil:
            rc = uc_pub_send(c, t.view.buf, <size_t>t.view.len, data, size, ms)
        self._in_flight -= 1
        if self._in_flight == 0 and self._closing != NULL:
            c = self._closing
            self._closing = NULL
            with nogil:
                uc_pub_close(c)
        return _check_rc(rc, "send", ms)

    cdef _check_open(self):
        if self._c == NULL:
            raise ValueError("send on a closed publisher")

    def close(self):
        """Close the socket; pending messages linger up to the publisher's ``linger``."""
        cdef uc_pub *c = self._c
        if c == NULL:
            return
        self._c = NULL
        if self._in_flight:
            # Other threads are sending on it right now: wake the blocked ones
            # (they raise), and the last one out frees it.
            uc_pub_shutdown(c)
            self._closing = c
        else:
            with nogil:
                uc_pub_close(c)
        if self._bus is not None:
            self._bus._forget(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
