# Targets: which kind a subscribe() target is, what its loop keeps for it, and
# the delivery of a Handler that takes whole batches (Handler.batches) as one
# list.  The per-message path is in _trampoline.pxi (_deliver, _deliver_each).

cdef int _target_kind(object target) except -1:
    if isinstance(target, NativeHandler):
        _refuse_async((<NativeHandler>target).target, "the native handler's target")
        return TARGET_NATIVE
    if isinstance(target, Handler):
        for method in ("on_message", "on_topic_message", "on_batch"):
            _refuse_async(getattr(type(target), method), f"{type(target).__name__}.{method}")
        return TARGET_HANDLER
    if callable(target):
        _refuse_async(target, "target")
        return TARGET_CALLABLE
    raise TypeError(f"target must be callable, an upcall.Handler or an "
                    f"upcall.native.NativeHandler, not {type(target).__name__}")


cdef bint _is_async_callable(object f) except -1:
    """True when calling f returns something to await or iterate
    asynchronously: an async def (Python's or Cython's), an async generator,
    or an object whose __call__ is one.  The one check of every callable a
    delivery thread calls (targets, decoders), which could never await it."""
    if f is None:
        return False
    # Cython's async def functions carry asyncio's old marker (which Cython
    # imported to set it, so it is looked for only where it can be).
    marker = getattr(sys.modules.get("asyncio.coroutines"), "_is_coroutine", None)
    call = getattr(type(f), "__call__", None)   # an object whose __call__ is async
    for c in (f, call):
        if (inspect.iscoroutinefunction(c) or inspect.isasyncgenfunction(c)
                or (marker is not None and getattr(c, "_is_coroutine", None) is marker)):
            return True
    return False


cdef int _refuse_async(object f, str what) except -1:
    """Async targets are refused, pointing to the asyncio way of subscribing."""
    if _is_async_callable(f):
        raise TypeError(
            f"{what} is an async callable ({f!r}): subscribe() calls it on a delivery "
            "thread and could never await it. From a coroutine, use "
            "`async for msg in bus.subscribe_async(endpoint, ...)` (docs/asyncio.md)")
    return 0


# The delivery flavours, by TARGET_* (filled below, once).
cdef delivery_ops _DELIVERY_OPS[TARGET_KINDS]


cdef void _fill_delivery_ops() noexcept:
    cdef int k
    for k in range(TARGET_KINDS):
        _DELIVERY_OPS[k].kind = k
        _DELIVERY_OPS[k].deliver = _deliver_plain
        _DELIVERY_OPS[k].release = NULL
    _DELIVERY_OPS[TARGET_NATIVE].deliver = _deliver_native
    _DELIVERY_OPS[TARGET_NATIVE].release = _release_native
    _DELIVERY_OPS[TARGET_ASYNC].deliver = _deliver_async

_fill_delivery_ops()


cdef int _set_target(Subscription sub, int kind, size_t batch) except -1:
    """Choose the loop's delivery flavour for the target's kind; a native
    handler also gets room for the indices it selects from a batch."""
    cdef native_state *ns
    sub._st.ops = &_DELIVERY_OPS[kind]
    sub._st.flavour = NULL
    if kind == TARGET_HANDLER and isinstance(sub._target, _AsyncTarget) and \
            (<_AsyncTarget>sub._target).ho != NULL and not sub._caller:
        # The asyncio adapter's: plain messages go to its queue without the GIL.
        sub._st.ops = &_DELIVERY_OPS[TARGET_ASYNC]
        sub._st.flavour = (<_AsyncTarget>sub._target).ho
    if kind == TARGET_NATIVE:
        ns = <native_state *>calloc(1, sizeof(native_state))
        if ns == NULL:
            raise MemoryError()
        sub._st.flavour = ns
        ns.handler = <PyObject *>sub._target
        ns.selected = <size_t *>malloc(batch * sizeof(size_t))
        if ns.selected == NULL:
            raise MemoryError()
    return 0


cdef int _deliver_as_list(Subscription sub, Handler handler, const uc_msg *batch, size_t n,
                          const size_t *idx, size_t *done) noexcept:
    """Handler.batches: decode the batch into lists, one on_batch call each.

    The messages of one list decompress at most max_batch_decompressed
    bytes together: a message that would take the list past it starts the
    next list (on_batch gets the list so far first), so that nothing is
    lost and no list holds more (docs/security.md).

    A message that does not decode is reported (on_error) where it stands:
    on_batch first gets the messages decoded before it, so that a report
    interrupted in caller mode (KeyboardInterrupt) leaves nothing decoded
    and undelivered behind; the messages after it stay for the next poll().
    An exception from on_batch is reported once, with the list, and counts
    every message of the list as a callback error.  *done: how many of the
    n were taken; returns the verdict for the core.
    """
    cdef size_t i = 0
    cdef const uc_msg *m
    cdef list msgs = []
    cdef int verdict = UC_DELIVER_MORE
    cdef Decoder decoder = sub._decoder
    cdef bint with_topic = sub._with_topic
    cdef bytes topic = sub._split_topic
    cdef const uc_frame *topic_wire = NULL
    # The asyncio adapter queues the messages: untracked from the start
    # (upcall/_aiter.pxi), the collector does not walk them.
    cdef bint park = isinstance(handler, _AsyncTarget)
    cdef _inflate_budget budget
    budget.limit = sub._max_batch_inflated
    budget.used = 0
    budget.over = False
    sub._budget = &budget
    while i < n:
        m = batch + (idx[i] if idx != NULL else i)
        try:
            obj = _decode(decoder, m, sub)
        except BaseException as exc:
            if msgs:
                verdict = _hand_list(sub, handler, msgs, budget.used)
                msgs = []
                budget.used = 0
                if verdict != UC_DELIVER_MORE:
                    break
            if budget.over:       # the list is handed: decoded again, first of the next
                budget.over = False
                continue
            i += 1
            uc_sub_add_stat(sub._c, UC_STAT_DECODE_ERRORS, 1)
            bad_topic = PyBytes_FromStringAndSize(m.topic.data, <Py_ssize_t>m.topic.size)
            verdict = sub._report(_with_context(exc, bad_topic), _raw_payload(m), bad_topic, True)
            if verdict != UC_DELIVER_MORE:
                break
            continue
        if with_topic:
            topic = _msg_topic(m, &topic_wire, topic)
            obj = (topic, obj)
        if park:
            uc_set_tracking(<PyObject *>obj, 0, 0)
        msgs.append(obj)
        i += 1
    if msgs:
        verdict = _hand_list(sub, handler, msgs, budget.used)
    sub._budget = NULL
    if with_topic:
        sub._split_topic = topic if topic_wire != NULL else None
    done[0] = i
    return verdict


cdef int _hand_list(Subscription sub, Handler handler, list msgs, uint64_t inflated) noexcept:
    """One on_batch call; every message of the list is counted once.
    inflated: the bytes its messages decompressed (the async queue counts them)."""
    cdef int verdict = UC_DELIVER_MORE
    if inflated and isinstance(handler, _AsyncTarget):
        (<_AsyncTarget>handler).list_inflated = inflated
    try:
        handler.on_batch(msgs)
    except StopDelivery:
        verdict = UC_DELIVER_STOP
        sub._closed = True
    except BaseException as exc:
        uc_sub_add_stat(sub._c, UC_STAT_CALLBACK_ERRORS, len(msgs))
        return sub._report(exc, msgs, None, False)
    uc_sub_add_stat(sub._c, UC_STAT_DELIVERED, len(msgs))
    if sub._closed:
        verdict = UC_DELIVER_STOP
    return verdict
