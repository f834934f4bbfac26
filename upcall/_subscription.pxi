# Subscription: one receive loop delivering decoded messages to one target.

# Most messages delivered per GIL crossing when batch=None.  A busy main
# thread hands the GIL over only once per switch interval (5 ms by default),
# so one crossing must drain what arrived meanwhile: 256 capped a contended
# subscription at 256 per 5 ms (49k of 100k msgs/s offered over tcp), 1024
# took them all (PERF.md, Contention).  A batch only takes what is already
# queued, so a larger one adds no latency; it costs ~220 KB of frame pool.
DEFAULT_BATCH = 1024

# A long poll()/close() wakes at least this often to let signals (Ctrl-C) in.
cdef int _SIGNAL_SLICE_MS = 200

_STAT_NAMES = ("received", "delivered", "batches", "decode_errors",
               "callback_errors", "dropped")


cdef int _timeout_ms(object timeout, str name) except -2:
    """None -> -1 (no limit); seconds -> whole milliseconds, rounded up."""
    if timeout is None:
        return -1
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number of seconds or None, "
                        f"not {type(timeout).__name__}") from None
    if not t >= 0:
        raise ValueError(f"{name} must be >= 0, not {timeout!r}")
    return <int>min(math.ceil(t * 1000.0), 2 ** 31 - 1)


cdef object _raise_uc(int rc, str what):
    err = errno
    msg = uc_strerror(rc, err).decode("utf-8", "replace")
    if rc == UC_ERR_ZMQ or rc == UC_ERR_SYS:
        if rc == UC_ERR_ZMQ and err == ETERM:
            raise ValueError(f"{what}: the bus was closed")
        if err in (EINVAL, EPROTONOSUPPORT):
            raise ValueError(f"{what}: {msg}")
        raise OSError(err, f"{what}: {msg}")
    if rc == UC_ERR_ARG:
        raise ValueError(f"{what}: {msg}")
    if rc == UC_ERR_NOMEM:
        raise MemoryError(f"{what}: {msg}")
    if rc == UC_ERR_TIMEOUT:
        raise TimeoutError(f"{what}: {msg}")
    if rc == UC_ERR_AGAIN:
        raise BlockingIOError(f"{what}: {msg}")
    raise RuntimeError(f"{what}: {msg}")


@cython.final
cdef class Subscription:
    """One receive loop delivering decoded messages to one target.

    Made by :meth:`Bus.subscribe`.  A context manager: leaving it closes.
    """
    cdef uc_sub *_c
    cdef loop_state _st
    cdef Bus _bus
    cdef readonly str endpoint
    cdef object _target
    cdef object _on_error
    cdef object _factory
    cdef object _start_error
    cdef object _pending          # caller mode: a BaseException to re-raise from poll
    cdef Decoder _decoder
    cdef bint _with_topic
    cdef bint _caller
    cdef bint _closed
    cdef str _thread_name
    cdef str _run_name
    cdef bytes _run_name_b        # NUL-terminated name for the native thread
    cdef object _topics

    def __cinit__(self):
        self._c = NULL

    def __dealloc__(self):
        if self._c != NULL:
            # The loop holds a reference to us while it runs, so it has ended.
            uc_sub_free(self._c)
            self._c = NULL
        free(self._st.selected)
        self._st.selected = NULL

    def __repr__(self):
        state = "closed" if self.closed else ("caller" if self._caller else self._thread_name)
        return f"<upcall.Subscription {self.endpoint} topics={list(self._topics)!r} {state}>"

    @property
    def closed(self):
        """True once close() was called or delivery ended (StopDelivery)."""
        return self._closed or (self._c != NULL and uc_sub_finished(self._c))

    @property
    def stats(self):
        """Counters: received, delivered, batches, decode_errors, callback_errors, dropped."""
        cdef uc_stats s
        uc_sub_stats(self._c, &s)
        return {"received": s.received, "delivered": s.delivered, "batches": s.batches,
                "decode_errors": s.decode_errors, "callback_errors": s.callback_errors,
                "dropped": s.dropped}

    @property
    def last_endpoint(self):
        """The endpoint as bound or connected (a tcp port 0 or * resolved)."""
        cdef const char *ep = uc_sub_last_endpoint(self._c)
        return ep.decode("utf-8", "replace") if ep != NULL and ep[0] else self.endpoint

    @property
    def thread_name(self):
        """Name of the delivery thread; None in caller mode."""
        return None if self._caller else self._thread_name

    def poll(self, timeout=None, max_messages=None):
        """Caller mode: receive and deliver on this thread.

        Returns after ``timeout`` seconds (None: no limit), once
        ``max_messages`` were delivered, when a target raised StopDelivery,
        or when the subscription is closed.  Returns the number of messages
        handed to the target.  Wakes at least every 200 ms for signals, so
        Ctrl-C raises KeyboardInterrupt here.
        """
        cdef int total_ms = _timeout_ms(timeout, "timeout")
        cdef size_t limit = 0, got = 0, done = 0
        cdef int slice_ms, rc
        if not self._caller:
            raise ValueError("poll() is for delivery='caller' subscriptions; "
                             "this one delivers on its own thread")
        if self._closed:
            raise ValueError("poll() on a closed subscription")
        if max_messages is not None:
            if max_messages < 1:
                raise ValueError(f"max_messages must be >= 1, not {max_messages!r}")
            limit = max_messages
        deadline = time.monotonic() + total_ms / 1000.0
        while True:
            slice_ms = _SIGNAL_SLICE_MS
            if total_ms >= 0:
                slice_ms = min(slice_ms, max(0, <int>math.ceil((deadline - time.monotonic()) * 1000.0)))
            got = 0
            with nogil:
                rc = uc_sub_poll(self._c, slice_ms, limit - done if limit else 0, &got)
            done += got
            if self._pending is not None:
                exc, self._pending = self._pending, None
                raise exc
            if rc == UC_ERR_CLOSED:
                break
            if rc != UC_OK:
                _raise_uc(rc, "poll")
            PyErr_CheckSignals()
            if (limit and done >= limit) or self._closed or uc_sub_finished(self._c):
                break
            if total_ms >= 0 and time.monotonic() >= deadline:
                break
        return done

    def wait(self, timeout=None):
        """Wait for the loop to end by itself (a synthetic source's last
        message, StopDelivery) without stopping it; True if it has ended."""
        return _sub_wait(self, timeout)

    @property
    def synthetic(self):
        """A synthetic source's figures (None for a socket); see _synthetic.pxi."""
        return _synthetic_info(self)

    def close(self, timeout=None):
        """Stop delivery and wait for the loop to end.

        Safe from inside this subscription's own target (it then only asks the
        loop to stop after the current message).  Raises TimeoutError if the
        loop did not end within ``timeout`` seconds, e.g. because a target is
        stuck; calling close() again waits again.
        """
        cdef int total_ms = _timeout_ms(timeout, "timeout")
        cdef int slice_ms, rc
        if self._c == NULL:
            return
        self._closed = True
        deadline = time.monotonic() + total_ms / 1000.0
        while True:
            slice_ms = _SIGNAL_SLICE_MS
            if total_ms >= 0:
                slice_ms = min(slice_ms, max(0, <int>math.ceil((deadline - time.monotonic()) * 1000.0)))
            with nogil:
                rc = uc_sub_close(self._c, slice_ms)
            if rc == UC_OK:
                break
            if rc != UC_ERR_TIMEOUT:
                _raise_uc(rc, "close")
            PyErr_CheckSignals()
            if total_ms >= 0 and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{self!r} did not stop within {timeout} s: a target is still "
                    "running; close() again to wait longer")
        if self._bus is not None:
            self._bus._forget(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    cdef int _report(self, BaseException exc, object msg) noexcept:
        """Route an exception from decoding or from the target; non-zero stops."""
        if not isinstance(exc, Exception):
            # KeyboardInterrupt, SystemExit...: in caller mode they belong to
            # the caller, so poll() re-raises them.  On a delivery thread they
            # end this subscription after being reported.
            if self._caller:
                self._pending = exc
                return 1
            _write_unraisable(exc, self)
            return 1
        if self._on_error is not None:
            try:
                self._on_error(exc, msg)
                return 0
            except StopDelivery:
                return 1
            except BaseException as handler_exc:
                _write_unraisable(handler_exc, self._on_error)
                return 0
        _write_unraisable(exc, self)
        return 0
