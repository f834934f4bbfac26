# The trampolines: C delivery callbacks that carry a batch across the GIL.
#
# The C core calls `_deliver` on the loop's thread without the GIL.  It takes
# the GIL once per batch, decodes each message straight from its zmq frame,
# calls the target, and lets the GIL go again.  How the GIL is taken depends
# on the thread (docs/threads.md):
#
# * adopt (default): on the first batch the thread enters Python with
#   PyGILState_Ensure and keeps that thread state (and its GILState
#   registration) until the loop ends.  Later batches find it, so a native
#   thread pays what a Python-made one pays: a plain GIL acquire.  On a thread
#   Python made (python_threads, an executor) Ensure finds the thread's own
#   state, so the same code path is right for every thread.
# * per-upcall: the classic PyGILState_Ensure/Release around every message,
#   kept to measure what adoption saves (private: _subscribe_per_upcall).  On a native thread each Ensure builds
#   and tears down a thread state.
#
# Nothing here runs Python once interpreter finalization has begun: the loop
# is told to stop instead.

cdef enum:
    GIL_ADOPT = 0
    GIL_PER_UPCALL = 1

# Set when the bus registry closes everything at exit: from then on a loop
# stops instead of entering Python.  A plain int read without the GIL: a stale
# read costs at most one more batch, which the closing code waits for.
cdef int _exiting = 0

cdef struct loop_state:
    PyObject *owner          # the Subscription; a reference the loop owns (thread mode)
    int gil_mode
    int adopted              # this thread holds a GILState registration for the loop
    PyGILState_STATE gstate
    # What the target is (subscribe() decides once): TARGET_CALLABLE,
    # TARGET_HANDLER (an upcall.Handler: on_message through the vtable) or
    # TARGET_NATIVE (an upcall.native.NativeHandler: select() without the GIL).
    int kind
    PyObject *native         # TARGET_NATIVE: the handler (Subscription._target keeps it)
    size_t *selected         # TARGET_NATIVE: room for `batch` indices (freed by the Subscription)
    uc_sub *c                # TARGET_NATIVE: for the stats, learnt under the GIL on the first batch


cdef enum:
    TARGET_CALLABLE = 0
    TARGET_HANDLER = 1
    TARGET_NATIVE = 2


cdef inline bint _python_gone() noexcept nogil:
    return _exiting or uc_py_finalizing()


cdef int _deliver(void *ctx, const uc_msg *batch, size_t n) noexcept nogil:
    cdef loop_state *st = <loop_state *>ctx
    cdef size_t i
    cdef int stop = 0
    cdef Py_ssize_t k
    cdef const size_t *idx = NULL
    if _python_gone():
        return 1
    if st.kind == TARGET_NATIVE:
        # The native handler sees the raw views, GIL-free; Python is entered
        # (once for the batch) only for what it selects.
        if st.c == NULL:
            if st.gil_mode == GIL_ADOPT and not st.adopted:
                _adopt(st)
            with gil:   # subscribe() has returned: its uc_sub is known
                st.c = (<Subscription>st.owner)._c
        k = (<NativeHandler>st.native).select(batch, n, st.selected)
        if k < 0:
            return 1
        uc_sub_add_stat(st.c, UC_STAT_DELIVERED, n)
        if k == 0:
            return 0
        idx = st.selected
        n = <size_t>k
    if st.gil_mode == GIL_PER_UPCALL:
        for i in range(n):
            with gil:
                if idx != NULL:
                    stop = _deliver_each(<Subscription>st.owner, batch, 1, idx + i)
                else:
                    stop = _deliver_each(<Subscription>st.owner, batch + i, 1, NULL)
            if stop or _python_gone():
                return 1
        return 0
    if not st.adopted:
        _adopt(st)
    with gil:
        return _deliver_each(<Subscription>st.owner, batch, n, idx)


cdef inline void _adopt(loop_state *st) noexcept nogil:
    # First upcall on this thread: create (native thread) or find (Python
    # thread) its thread state and keep it registered until the loop ends,
    # so the `with gil` of later batches never builds one.
    st.gstate = PyGILState_Ensure()
    PyEval_SaveThread()
    st.adopted = 1


cdef void _loop_exit(void *ctx) noexcept nogil:
    # Called once on the loop's thread when the loop ends (thread mode): drop
    # the loop's reference to its Subscription, then the adopted thread state.
    cdef loop_state *st = <loop_state *>ctx
    cdef PyObject *owner = st.owner
    cdef int adopted = st.adopted
    cdef PyGILState_STATE gstate = st.gstate
    if _python_gone():
        return  # leave both behind: Python may not be entered any more
    # `st` lives inside the Subscription and may be freed by the decref below.
    st.owner = NULL
    if adopted:
        PyEval_RestoreThread(PyGILState_GetThisThreadState())
        Py_DecRef(owner)
        PyGILState_Release(gstate)   # native thread: its thread state goes now
    else:
        with gil:
            Py_DecRef(owner)


cdef int _deliver_each(Subscription sub, const uc_msg *batch, size_t n,
                       const size_t *idx) noexcept:
    """Decode n messages and call the target once for each, with the GIL held
    (a Handler that takes batches: _deliver_as_list); non-zero stops the loop.

    idx: NULL, or the messages are batch[idx[0]], ..., batch[idx[n-1]] (what a
    native handler selected; they were counted as delivered already).
    """
    cdef size_t i = 0
    cdef uint64_t delivered = 0, decode_errors = 0, callback_errors = 0
    cdef int stop = 0
    cdef bint decoding = True
    cdef const uc_msg *m = batch
    cdef Decoder decoder = sub._decoder
    cdef object target = sub._target
    cdef object obj = None
    cdef bint with_topic = sub._with_topic
    cdef Handler handler = None
    if sub._st.kind == TARGET_NATIVE:
        target = (<NativeHandler>target).target
        if target is None:
            return 0
    if isinstance(target, Handler):
        handler = <Handler>target
        if handler.batches:
            return _deliver_as_list(sub, handler, batch, n, idx)
    while i < n and not stop:
        # One try block per batch, not per message: the handler resumes the
        # loop after the message that failed.
        try:
            while i < n:
                m = batch + (idx[i] if idx != NULL else i)
                decoding = True
                obj = _decode(decoder, m)
                decoding = False
                if handler is not None:   # the vtable: a C call, no tuple
                    if with_topic:
                        handler.on_topic_message(
                            PyBytes_FromStringAndSize(m.topic.data, <Py_ssize_t>m.topic.size), obj)
                    else:
                        handler.on_message(obj)
                elif with_topic:
                    target(PyBytes_FromStringAndSize(m.topic.data, <Py_ssize_t>m.topic.size), obj)
                else:
                    target(obj)
                delivered += 1
                i += 1
                if sub._closed:    # closed by its own target: deliver no more
                    stop = 1
                    break
        except StopDelivery:
            delivered += 1
            stop = 1
            sub._closed = True
        except BaseException as exc:
            i += 1
            if decoding:
                decode_errors += 1
                stop = sub._report(_with_context(exc, m), PyBytes_FromStringAndSize(
                    m.payload.data, <Py_ssize_t>m.payload.size))
            elif isinstance(exc, SystemExit) and not sub._caller:
                # Ends this delivery thread's work silently, as SystemExit
                # ends a threading.Thread (caller mode: poll() re-raises it).
                delivered += 1
                stop = 1
                sub._closed = True
            else:
                callback_errors += 1
                stop = sub._report(exc, obj)
    if delivered and idx == NULL:
        uc_sub_add_stat(sub._c, UC_STAT_DELIVERED, delivered)
    if decode_errors:
        uc_sub_add_stat(sub._c, UC_STAT_DECODE_ERRORS, decode_errors)
    if callback_errors:
        uc_sub_add_stat(sub._c, UC_STAT_CALLBACK_ERRORS, callback_errors)
    return stop


cdef inline object _decode(Decoder decoder, const uc_msg *m):
    """The message's payload as a Python object; DecodeError for a message
    that is not [topic, payload] (no byte is at fault: offset None)."""
    if m.n_frames > 2:
        _raise_frames(m)
    return decoder.decode_view(m.payload.data, <Py_ssize_t>m.payload.size)


cdef int _raise_frames(const uc_msg *m) except -1:
    # Out of line: with the f-string inside it, _decode was too large for the
    # C compiler to inline and cost every message a call (callgrind: +17
    # instructions per message on the synthetic source).
    raise DecodeError(f"message has {m.n_frames} frames; expected [topic, payload]",
                      None, "frames")


cdef object _with_context(object exc, const uc_msg *m):
    """Name the topic in a decode error, so a report says which message failed."""
    topic = PyBytes_FromStringAndSize(m.topic.data, <Py_ssize_t>m.topic.size)
    if isinstance(exc, DecodeError):
        try:
            exc.topic = topic
            if exc.args and isinstance(exc.args[0], str):
                exc.args = (f"{exc.args[0]} (topic {topic!r})",) + tuple(exc.args[1:])
        except Exception:
            pass
    return exc


cdef void _write_unraisable(BaseException exc, object where) noexcept:
    """Hand exc to sys.unraisablehook (which prints it with its traceback)."""
    cdef object exc_type = type(exc)
    cdef object tb = exc.__traceback__
    # PyErr_Restore steals one reference to each.
    Py_INCREF(exc_type)
    Py_INCREF(exc)
    if tb is not None:
        Py_INCREF(tb)
    PyErr_Restore(<PyObject *>exc_type, <PyObject *>exc,
                  <PyObject *>tb if tb is not None else NULL)
    PyErr_WriteUnraisable(where)
