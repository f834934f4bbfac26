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
#
# Each call tells the core how many messages of the batch it took (bus.h,
# uc_deliver_fn).  All of them, unless a KeyboardInterrupt, SystemExit or
# GeneratorExit from the target or on_error interrupts a caller-mode batch:
# the messages after the interrupted one are left to the core, which hands
# them over first in the next poll() (UC_DELIVER_PAUSE), and poll() raises.
# Every message taken is counted once: delivered, filtered (a native handler
# did not select it), decode_errors or callback_errors; the core counts the
# rest (received, dropped).

cdef enum:
    GIL_ADOPT = 0
    GIL_PER_UPCALL = 1

# uc_exiting(): set when the bus registry closes everything at exit (csrc/util.h).
from upcall.includes.util cimport uc_exiting, uc_set_exiting

# A loop's thread entering Python for good (adopt mode): one for a
# subscription's own loop (loop_state), one for a shared socket's reader
# (_shared.pxi), both through _adopt and _let_go below.
cdef struct adopted_thread:
    int adopted              # this thread holds a GILState registration for the loop
    const char *native_name  # the core's own thread (default factory): its name, else NULL
    PyGILState_STATE gstate

cdef struct loop_state:
    PyObject *owner          # the Subscription; a reference the loop owns (thread mode)
    int gil_mode
    adopted_thread thread
    # How the target is delivered to (subscribe() decides once: _set_target)
    # and that flavour's own state: a native_state (TARGET_NATIVE), the
    # hand-over queue (TARGET_ASYNC; the target keeps it), else NULL.
    const delivery_ops *ops
    void *flavour


cdef enum:
    TARGET_CALLABLE = 0
    TARGET_HANDLER = 1       # an upcall.Handler: on_message through the vtable
    TARGET_NATIVE = 2        # an upcall.native.NativeHandler: select() without the GIL
    TARGET_ASYNC = 3         # the asyncio adapter's target: no GIL for a plain message
    TARGET_KINDS = 4

ctypedef int (*deliver_op)(loop_state *st, const uc_msg *batch, size_t n,
                           size_t *consumed) noexcept nogil

# A delivery flavour's operations, as uc_sub_ops are a source's: the
# trampoline calls deliver and knows no flavour; release (NULL: nothing to
# free) frees the flavour's state with the Subscription.
cdef struct delivery_ops:
    int kind                 # TARGET_*
    deliver_op deliver       # the batch, on the loop's thread without the GIL
    void (*release)(void *flavour) noexcept nogil


# TARGET_NATIVE's state: the handler (Subscription._target keeps it), room
# for `batch` selected indices, the uc_sub for the stats (learnt under the GIL
# on the first batch) and, after a paused call, what select() has seen of
# the next batch: the first `examined` messages (the rest the core kept),
# selected[:sel_n] its choices among them, relative to that batch.
cdef struct native_state:
    PyObject *handler
    size_t *selected
    uc_sub *c
    size_t examined
    size_t sel_n


cdef inline bint _python_gone() noexcept nogil:
    return uc_exiting() or uc_py_finalizing()


cdef int _deliver(void *ctx, const uc_msg *batch, size_t n, size_t *consumed) noexcept nogil:
    cdef loop_state *st = <loop_state *>ctx
    if _python_gone():
        consumed[0] = 0
        return UC_DELIVER_STOP
    return st.ops.deliver(st, batch, n, consumed)


cdef int _deliver_plain(loop_state *st, const uc_msg *batch, size_t n,
                        size_t *consumed) noexcept nogil:
    """A callable's or a Handler's batch: all of it with the GIL, once."""
    return _upcall(st, batch, n, NULL, consumed)


cdef void _release_native(void *flavour) noexcept nogil:
    cdef native_state *ns = <native_state *>flavour
    if ns != NULL:
        free(ns.selected)
        free(ns)


cdef int _deliver_native(loop_state *st, const uc_msg *batch, size_t n,
                         size_t *consumed) noexcept nogil:
    """A native handler's batch: select() sees the raw views without the GIL;
    Python is entered (once for the batch) only for what it selects.  What it
    passes over is counted as filtered when taken."""
    cdef Py_ssize_t k
    cdef size_t c = 0, done = 0, took, j
    cdef int verdict = UC_DELIVER_MORE
    cdef native_state *ns = <native_state *>st.flavour
    if ns.c == NULL:
        if st.gil_mode == GIL_ADOPT and not st.thread.adopted:
            _adopt(&st.thread)
        with gil:   # subscribe() has returned: its uc_sub is known
            ns.c = (<Subscription>st.owner)._c
    if ns.examined == 0:
        k = (<NativeHandler>ns.handler).select(batch, n, ns.selected)
        if k < 0:
            consumed[0] = 0     # the handler ends the subscription: all dropped
            return UC_DELIVER_STOP
        ns.sel_n = <size_t>k
        ns.examined = n
    # Else this batch is the rest of a paused one, handed over alone: its
    # selection is known, and select() does not see a message twice.
    if n > ns.examined:
        n = ns.examined
    while c < ns.sel_n and ns.selected[c] < n:
        c += 1
    if c:
        verdict = _upcall(st, batch, c, ns.selected, &done)
    # Taken: everything, or up to the last selected message the target got.
    if done == c:
        took = n
    elif done:
        took = ns.selected[done - 1] + 1
    else:
        took = 0
    if took > done:
        uc_sub_add_stat(ns.c, UC_STAT_FILTERED, took - done)
    ns.examined -= took
    if verdict == UC_DELIVER_STOP or ns.examined == 0:
        ns.examined = ns.sel_n = 0
    else:
        for j in range(done, ns.sel_n):
            ns.selected[j - done] = ns.selected[j] - took
        ns.sel_n -= done
    consumed[0] = took
    return verdict


cdef int _upcall(loop_state *st, const uc_msg *batch, size_t n, const size_t *idx,
                 size_t *done) noexcept nogil:
    """Hand n messages (batch[idx[i]] with idx) to the target with the GIL:
    once for all of them, or once per message (GIL_PER_UPCALL).  *done: how
    many of the n were taken.  Returns the verdict for the core."""
    cdef size_t i, one = 0
    cdef int verdict = UC_DELIVER_MORE
    if st.gil_mode == GIL_PER_UPCALL:
        done[0] = 0
        for i in range(n):
            with gil:
                if idx != NULL:
                    verdict = _deliver_each(<Subscription>st.owner, batch, 1, idx + i, &one)
                else:
                    verdict = _deliver_each(<Subscription>st.owner, batch + i, 1, NULL, &one)
            done[0] += one
            if verdict != UC_DELIVER_MORE:
                return verdict
            if _python_gone():
                return UC_DELIVER_STOP
        return UC_DELIVER_MORE
    if not st.thread.adopted:
        _adopt(&st.thread)
    with gil:
        return _deliver_each(<Subscription>st.owner, batch, n, idx, done)


cdef inline void _adopt(adopted_thread *t) noexcept nogil:
    # First upcall on this thread: create (native thread) or find (Python
    # thread) its thread state and keep it registered until the loop ends,
    # so the `with gil` of later batches never builds one.
    t.gstate = PyGILState_Ensure()
    if t.native_name != NULL:
        _name_python_thread(t.native_name)
    PyEval_SaveThread()
    t.adopted = 1


cdef void _let_go(adopted_thread t, PyObject *last_ref) noexcept nogil:
    # The loop has ended on this thread: drop last_ref (if not NULL) while
    # the thread state is still there, then the state (a native thread's
    # goes now) and, on a thread of the core's, its dummy Thread.  `t` is a
    # copy: what held it may be freed by that last reference.
    PyEval_RestoreThread(PyGILState_GetThisThreadState())
    if t.native_name != NULL:
        _forget_python_thread()
    if last_ref != NULL:
        Py_DecRef(last_ref)
    PyGILState_Release(t.gstate)


cdef void _loop_exit(void *ctx) noexcept nogil:
    # Called once on the loop's thread when the loop ends (thread mode): drop
    # the loop's reference to its Subscription, then the adopted thread state.
    cdef loop_state *st = <loop_state *>ctx
    cdef PyObject *owner = st.owner
    cdef adopted_thread thread = st.thread
    if _python_gone():
        return  # leave both behind: Python may not be entered any more
    with gil:   # adopted: finds the thread's own state, as _upcall does
        _loop_ended_with_gil(<Subscription>owner)
    # `st` lives inside the Subscription and may be freed by the decref below.
    st.owner = NULL
    if thread.adopted:
        _let_go(thread, owner)
    else:
        with gil:
            Py_DecRef(owner)


cdef void _loop_ended_with_gil(Subscription sub) noexcept:
    # The one place a thread-mode loop's end is told, whatever ended it:
    # the end hook (Subscription.set_end_hook) runs here, after the last
    # delivery.  An error from the hook is reported, never raised.
    sub._loop_ended = True
    hook, sub._end_hook = sub._end_hook, None
    if hook is None:
        return
    exc, sub._end_exc = sub._end_exc, None
    try:
        hook(exc)
    except BaseException as hook_exc:
        _write_unraisable(hook_exc, hook)


cdef extern from "<sched.h>":
    int sched_yield() nogil


#: How many times a first batch yields the GIL to the statement that called
#: subscribe() before it goes on regardless (_wait_for_opener).
OPENER_YIELDS = 50


cdef void _note_opener(Subscription sub) noexcept:
    """subscribe() is about to let its loop deliver: note the statement
    that called it (the top Python frame: subscribe() makes none)."""
    try:
        f = sys._getframe(0)
        sub._opener_lasti = f.f_lasti
        sub._opener_thread = threading.get_ident()
        sub._opener_frame = id(f)
    except BaseException as exc:
        _write_unraisable(exc, None)


cdef void _wait_for_opener(Subscription sub) noexcept:
    """The first batch, GIL held: subscribe() has returned, but CPython may
    have switched threads right after the call, before the statement that
    made it took the handle (``sub = bus.subscribe(ep, lambda m:
    sub.close())``).  While that statement's frame has not moved past the
    call, give it the GIL back; at most OPENER_YIELDS times (an opener inside
    a C function that goes on running Python code is not waited for)."""
    cdef int i
    frame_id = sub._opener_frame
    sub._opener_frame = 0
    if sub._opener_thread == threading.get_ident():
        return
    try:
        for i in range(OPENER_YIELDS):
            f = sys._current_frames().get(sub._opener_thread)
            if f is None or id(f) != frame_id or f.f_lasti != sub._opener_lasti:
                return
            f = None
            with nogil:
                sched_yield()
    except BaseException as exc:
        _write_unraisable(exc, None)


cdef int _deliver_each(Subscription sub, const uc_msg *batch, size_t n,
                       const size_t *idx, size_t *done) noexcept:
    """Decode n messages and call the target once for each, with the GIL held
    (a Handler that takes batches: _deliver_as_list).  *done: how many were
    taken (each counted as delivered, a decode error or a callback error).
    Returns the verdict for the core.

    idx: NULL, or the messages are batch[idx[0]], ..., batch[idx[n-1]] (what a
    native handler selected; with no target the selection is the delivery).
    """
    cdef size_t i = 0
    cdef uint64_t delivered = 0, decode_errors = 0, callback_errors = 0
    cdef int verdict = UC_DELIVER_MORE
    cdef bint decoding = True
    cdef const uc_msg *m = batch
    cdef Decoder decoder = sub._decoder
    cdef object target = sub._target
    cdef object obj = None
    cdef bint with_topic = sub._with_topic
    cdef bint with_sender = sub._with_sender
    cdef bytes topic = sub._split_topic
    cdef const uc_frame *topic_wire = NULL
    cdef Handler handler = None
    if sub._opener_frame:
        _wait_for_opener(sub)
    if sub._st.ops.kind == TARGET_NATIVE:
        target = (<NativeHandler>target).target
        if target is None:
            uc_sub_add_stat(sub._c, UC_STAT_DELIVERED, n)
            done[0] = n
            return UC_DELIVER_MORE
    if isinstance(target, Handler):
        handler = <Handler>target
        if handler.batches:
            return _deliver_as_list(sub, handler, batch, n, idx, done)
    while i < n and verdict == UC_DELIVER_MORE:
        # One try block per batch, not per message: the handler resumes the
        # loop after the message that failed.
        try:
            while i < n:
                m = batch + (idx[i] if idx != NULL else i)
                decoding = True
                obj = _decode(decoder, m, sub)
                decoding = False
                if handler is not None:   # the vtable: a C call, no tuple
                    if with_topic:
                        topic = _msg_topic(m, &topic_wire, topic)
                        handler.on_topic_message(topic, obj)
                    else:
                        handler.on_message(obj)
                elif with_sender:
                    if with_topic:
                        topic = _msg_topic(m, &topic_wire, topic)
                        target(topic, obj, _msg_sender(m))
                    else:
                        target(obj, _msg_sender(m))
                elif with_topic:
                    topic = _msg_topic(m, &topic_wire, topic)
                    target(topic, obj)
                else:
                    target(obj)
                delivered += 1
                i += 1
                if sub._closed:    # closed by its own target: deliver no more
                    verdict = UC_DELIVER_STOP
                    break
        except StopDelivery:
            delivered += 1
            i += 1
            verdict = UC_DELIVER_STOP
            sub._closed = True
        except BaseException as exc:
            i += 1
            if decoding:
                decode_errors += 1
                bad_topic = PyBytes_FromStringAndSize(m.topic.data, <Py_ssize_t>m.topic.size)
                verdict = sub._report(_with_context(exc, bad_topic), _raw_payload(m), bad_topic, True)
            elif isinstance(exc, SystemExit) and not sub._caller:
                # Ends this delivery thread's work silently, as SystemExit
                # ends a threading.Thread (caller mode: poll() re-raises it).
                delivered += 1
                verdict = UC_DELIVER_STOP
                sub._closed = True
            else:
                callback_errors += 1
                verdict = sub._report(exc, obj, PyBytes_FromStringAndSize(
                    m.topic.data, <Py_ssize_t>m.topic.size), False)
    if delivered:
        uc_sub_add_stat(sub._c, UC_STAT_DELIVERED, delivered)
    if decode_errors:
        uc_sub_add_stat(sub._c, UC_STAT_DECODE_ERRORS, decode_errors)
    if callback_errors:
        uc_sub_add_stat(sub._c, UC_STAT_CALLBACK_ERRORS, callback_errors)
    if with_topic:
        sub._split_topic = topic if topic_wire != NULL else None
    done[0] = i
    return verdict


cdef inline object _msg_sender(const uc_msg *m):
    """with_sender: the authenticated identity of m's connection (a CURVE
    client's Z85 public key), None for a peer with none."""
    if m.user_id == NULL or m.user_id[0] == 0:
        return None
    return m.user_id.decode("ascii", "replace")


cdef inline bytes _msg_topic(const uc_msg *m, const uc_frame **last_wire, bytes last):
    """m's topic as bytes.  The messages split from one zmq message (a
    coalesced payload, docs/wire.md: they share `wire`) share one object,
    not a copy each: a large topic over a batch of small messages would
    otherwise take the topic's size per message.  `last` is what this
    returned for the message before (or, first in a batch, for the split
    message that ended the batch before: a coalesced payload may straddle
    batches), `*last_wire` that message's zmq payload (NULL: not split)."""
    if m.wire == NULL:
        last_wire[0] = NULL
    elif m.wire == last_wire[0]:
        return last
    else:
        last_wire[0] = m.wire
        # Another zmq message (or the one the batch before ended in): the
        # same object if it is the same topic, one compare for the rest.
        if last is not None and <size_t>PyBytes_GET_SIZE(last) == m.topic.size and \
                memcmp(PyBytes_AS_STRING(last), m.topic.data, m.topic.size) == 0:
            return last
    return PyBytes_FromStringAndSize(m.topic.data, <Py_ssize_t>m.topic.size)


cdef inline object _decode(Decoder decoder, const uc_msg *m, Subscription sub):
    """The message's payload as a Python object, its out-of-band references
    resolved to the frames after it (_decode_oob); DecodeError for a message
    cut at UC_MAX_FRAMES (no byte is at fault: offset None) and for the
    fault of a coalesced payload (_raise_fault)."""
    if m.n_frames > 2 + m.n_extra or m.fault != 0:
        _raise_frames(m)
    if m.n_extra == 0:          # the usual message: no frames to resolve
        if m.marked:            # upcall's own: its extensions apply (docs/wire.md)
            return decoder.decode_wire(m.payload.data, <Py_ssize_t>m.payload.size)
        return decoder.decode_view(m.payload.data, <Py_ssize_t>m.payload.size)
    if not m.marked:
        _raise_unmarked_frames(m)
    return _decode_oob(decoder, m, sub)


cdef int _raise_unmarked_frames(const uc_msg *m) except -1:
    # Out of line, as _raise_frames.
    raise DecodeError(
        f"a frame after the payload that no out-of-band reference names at byte "
        f"{m.payload.size}: {m.n_extra} frame(s) after it and no marker frame (only "
        "upcall's marked messages reference frames, docs/wire.md)",
        <Py_ssize_t>m.payload.size, "oob_unused")


cdef object _decode_oob(Decoder decoder, const uc_msg *m, Subscription sub):
    # Out of line: only messages with frames after the payload come here.
    cdef _oob_ctx c
    _oob_size_limit(&c, m, sub._max_message_size, sub._max_size_given)
    c.batch = sub._budget
    try:
        obj = decoder.decode_msg(m.payload.data, <Py_ssize_t>m.payload.size, m.extra,
                                 m.n_extra, _oob_bytes if sub._copy else _oob_value, <void *>&c)
        if c.batch != NULL:
            c.batch.used += c.inflated
        return obj
    except DecodeError as exc:
        if c.refused and exc.reason == "message_size":
            _oob_explain(exc, &c)
        raise


cdef int _raise_frames(const uc_msg *m) except -1:
    # Out of line: with the f-string inside it, _decode was too large for the
    # C compiler to inline and cost every message a call (callgrind: +17
    # instructions per message on the synthetic source).
    if m.fault != 0 and m.n_frames <= 2 + m.n_extra:
        _raise_fault(m)
    raise DecodeError(f"message has {m.n_frames} frames; at most {UC_MAX_FRAMES} are kept "
                      "([topic, payload, out-of-band frames])", None, "frames")


cdef int _raise_fault(const uc_msg *m) except -1:
    """A coalesced payload broken at m.fault_offset (the core delivered the
    messages before it): the reader's reason (truncated, length, reserved,
    depth, ...) or the payload's own (batch_version, batch_length, batch_oob)."""
    reason = uc_split_errname(m.fault).decode()
    text = uc_split_strerror(m.fault).decode()
    if m.fault_offset == <size_t>-1:
        raise DecodeError(text, None, reason)
    raise DecodeError(f"coalesced payload (ext 127) broken at byte {m.fault_offset}: {text} "
                      "(the messages before it were delivered)", m.fault_offset, reason)


cdef inline bytes _raw_payload(const uc_msg *m):
    """What on_error gets with a decode error: the payload, or for the fault of
    a coalesced payload the whole of it (the error's offset is into it)."""
    cdef const uc_frame *f = m.wire if m.fault != 0 else &m.payload
    return PyBytes_FromStringAndSize(f.data, <Py_ssize_t>f.size)


cdef object _with_context(object exc, bytes topic):
    """Name the topic in a decode error, so a report says which message failed."""
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
