# Subscription: one receive loop delivering decoded messages to one target.

# Most messages delivered per GIL crossing when batch=None.  A busy main
# thread hands the GIL over only once per switch interval (5 ms by default),
# so one crossing must drain what arrived meanwhile: 256 capped a contended
# subscription at 256 per 5 ms (49k of 100k msgs/s offered over tcp), 1024
# took them all (PERF.md, Contention).  A batch only takes what is already
# queued, so a larger one adds no latency; it costs ~220 KB of frame pool.
DEFAULT_BATCH = 1024

# A long poll()/close()/wait() wakes at least this often to let signals (Ctrl-C) in.
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


# Steps of a wait in signal slices (see _in_signal_slices): run the C call for
# at most slice_ms without the GIL; 1: done, 0: not yet.
ctypedef int (*_slice_step)(Subscription sub, int slice_ms, void *arg) except -1


cdef int _in_signal_slices(Subscription sub, _slice_step step, void *arg, int total_ms) except -1:
    """Run ``step`` until it is done (1) or ``total_ms`` (-1: no limit) have
    passed (0), in slices of at most _SIGNAL_SLICE_MS with signal handlers
    run in between: Ctrl-C raises KeyboardInterrupt here, even while the C
    core would wait for much longer."""
    cdef int slice_ms
    deadline = time.monotonic() + total_ms / 1000.0
    while True:
        slice_ms = _SIGNAL_SLICE_MS
        if total_ms >= 0:
            slice_ms = min(slice_ms, max(0, <int>math.ceil((deadline - time.monotonic()) * 1000.0)))
        if step(sub, slice_ms, arg):
            return 1
        PyErr_CheckSignals()
        if total_ms >= 0 and time.monotonic() >= deadline:
            return 0


cdef struct _poll_progress:
    size_t limit                  # max_messages (0: no limit)
    size_t done                   # messages handed to the target so far


cdef int _poll_step(Subscription sub, int slice_ms, void *arg) except -1:
    cdef _poll_progress *p = <_poll_progress *>arg
    cdef size_t got = 0
    cdef int rc
    with nogil:
        rc = uc_sub_poll(sub._c, slice_ms, p.limit - p.done if p.limit else 0, &got)
    p.done += got
    if sub._pending is not None:
        exc, sub._pending = sub._pending, None
        raise exc
    if rc == UC_ERR_CLOSED:
        return 1
    _check_rc(rc, "poll")
    return (p.limit != 0 and p.done >= p.limit) or sub._closed or uc_sub_finished(sub._c) != 0


cdef int _close_step(Subscription sub, int slice_ms, void *arg) except -1:
    cdef int rc
    with nogil:
        rc = uc_sub_close(sub._c, slice_ms)
    if rc == UC_ERR_TIMEOUT:
        return 0
    _check_rc(rc, "close")
    return 1


cdef int _wait_step(Subscription sub, int slice_ms, void *arg) except -1:
    cdef int rc
    with nogil:
        rc = uc_sub_wait(sub._c, slice_ms)
    if rc == UC_ERR_TIMEOUT:
        return 0
    _check_rc(rc, "wait")
    return 1


cdef class _Source:
    """Where a subscription's messages come from, when not from a zmq socket:
    ``open`` makes the C subscription from the options subscribe() prepared
    (delivery, thread, batch), or returns NULL with ``err[0]`` set."""

    cdef uc_sub *open(self, uc_bus *bus, const uc_sub_opts *o, int *err) noexcept:
        err[0] = UC_ERR_ARG
        return NULL


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
    cdef _Source _source          # None: a zmq socket

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
        cdef _poll_progress progress
        if not self._caller:
            raise ValueError("poll() is for delivery='caller' subscriptions; "
                             "this one delivers on its own thread")
        if self._closed:
            raise ValueError("poll() on a closed subscription")
        progress.limit = progress.done = 0
        if max_messages is not None:
            if max_messages < 1:
                raise ValueError(f"max_messages must be >= 1, not {max_messages!r}")
            progress.limit = max_messages
        _in_signal_slices(self, _poll_step, &progress, total_ms)
        return progress.done

    def wait(self, timeout=None):
        """Wait for the loop to end by itself (StopDelivery, the end of its
        source) without stopping it; True if it has ended.  Thread mode only."""
        cdef int total_ms = _timeout_ms(timeout, "timeout")
        if self._c == NULL:
            return True
        if self._caller:
            raise ValueError("wait() is for thread-mode subscriptions; in caller mode poll() "
                             "returns once delivery has ended")
        return _in_signal_slices(self, _wait_step, NULL, total_ms) == 1

    def close(self, timeout=None):
        """Stop delivery and wait for the loop to end.

        Safe from inside this subscription's own target (it then only asks the
        loop to stop after the current message).  Raises TimeoutError if the
        loop did not end within ``timeout`` seconds, e.g. because a target is
        stuck; calling close() again waits again.
        """
        cdef int total_ms = _timeout_ms(timeout, "timeout")
        if self._c == NULL:
            return
        self._closed = True
        if not _in_signal_slices(self, _close_step, NULL, total_ms):
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
