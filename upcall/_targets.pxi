# Targets: which kind a subscribe() target is, what its loop keeps for it, and
# the delivery of a Handler that takes whole batches (Handler.batches) as one
# list.  The per-message path is in _trampoline.pxi (_deliver, _deliver_each).

cdef int _target_kind(object target) except -1:
    if isinstance(target, NativeHandler):
        return TARGET_NATIVE
    if isinstance(target, Handler):
        return TARGET_HANDLER
    if callable(target):
        return TARGET_CALLABLE
    raise TypeError(f"target must be callable, an upcall.Handler or an "
                    f"upcall.native.NativeHandler, not {type(target).__name__}")


cdef int _set_target(Subscription sub, int kind, size_t batch) except -1:
    """Record the target's kind in the loop state; a native handler also gets
    room for the indices it selects from a batch."""
    sub._st.kind = kind
    sub._st.c = NULL
    if kind == TARGET_NATIVE:
        sub._st.native = <PyObject *>sub._target
        sub._st.selected = <size_t *>malloc(batch * sizeof(size_t))
        if sub._st.selected == NULL:
            raise MemoryError()
    return 0


cdef int _deliver_as_list(Subscription sub, Handler handler, const uc_msg *batch, size_t n,
                          const size_t *idx) noexcept:
    """Handler.batches: decode the batch into one list, then one on_batch call.

    A message that does not decode is reported (on_error) and left out of the
    list.  An exception from on_batch is reported once, with the list, and
    counts every message of the list as a callback error.
    """
    cdef size_t i
    cdef const uc_msg *m
    cdef list msgs = []
    cdef uint64_t decode_errors = 0
    cdef int stop = 0
    cdef Decoder decoder = sub._decoder
    cdef bint with_topic = sub._with_topic
    for i in range(n):
        m = batch + (idx[i] if idx != NULL else i)
        try:
            obj = _decode(decoder, m)
        except BaseException as exc:
            decode_errors += 1
            stop = sub._report(_with_context(exc, m), PyBytes_FromStringAndSize(
                m.payload.data, <Py_ssize_t>m.payload.size))
            if stop:
                break
            continue
        if with_topic:
            msgs.append((PyBytes_FromStringAndSize(m.topic.data, <Py_ssize_t>m.topic.size), obj))
        else:
            msgs.append(obj)
    if decode_errors:
        uc_sub_add_stat(sub._c, UC_STAT_DECODE_ERRORS, decode_errors)
    if stop or not msgs:
        return stop
    try:
        handler.on_batch(msgs)
    except StopDelivery:
        stop = 1
        sub._closed = True
    except BaseException as exc:
        uc_sub_add_stat(sub._c, UC_STAT_CALLBACK_ERRORS, len(msgs))
        return sub._report(exc, msgs)
    if idx == NULL:
        uc_sub_add_stat(sub._c, UC_STAT_DELIVERED, len(msgs))
    if sub._closed:
        stop = 1
    return stop
