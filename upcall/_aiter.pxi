# The event loop's side of an async subscription (upcall/aio.py): the
# awaitables behind `async for msg in sub` and `async for batch in
# sub.batches()`.
#
# A coroutine per __anext__ (an `async def`) costs a frame, its creation and
# its resumption per message.  Here __anext__ is a C method returning a
# _Next, which takes a message when it is awaited: through the am_send slot
# (PyIter_Send, what `await` calls: no StopIteration is made) it returns the
# message at once while messages are queued, without entering the event
# loop.  Only when the queue is empty does it start the adapter's coroutine
# (``owner._wait``) and pass every send, throw and close on to it, as `await`
# would.
#
# Nothing is taken before the _Next is awaited, and never across an await:
# an __anext__ that is cancelled, or never awaited, took nothing
# (docs/asyncio.md).

cdef extern from "_aiter_c.h":
    ctypedef enum PySendResult:
        PYGEN_RETURN
        PYGEN_ERROR
        PYGEN_NEXT
    ctypedef object (*uc_next_step_fn)(object, object, int *)
    void uc_next_set_step(uc_next_step_fn f)
    int uc_next_install_send(PyTypeObject *t)
    object uc_pass_error()
    PySendResult PyIter_Send(object iter, object arg, PyObject **presult)
    int PyGC_Enable()
    int PyGC_Disable()
    void uc_set_tracking(PyObject *o, int track, int depth) noexcept


# _take_now's "nothing queued".
cdef object _NOTHING = object()


# ---- the hand-over queue (csrc/handover.h): frames from the delivery thread, without the GIL ----
#
# An async subscription's delivery thread never takes the GIL for a plain
# message (a topic and a payload: no out-of-band frames, no fault, no
# sender): it copies the message's bytes into a block of records under one
# lock per batch, and wakes the event loop only when the loop waits for
# messages (an eventfd the loop reads, written once per wake-up).  The loop
# takes a whole block under the same lock and decodes one message per
# __anext__ from it, on its own thread: no GIL hand-off between two threads
# per batch, and no decoded message waits anywhere (the collector never
# walks a queue of them).  Copying 77 bytes costs less than the GIL hand-off
# it avoids; a message that is not plain (out-of-band frames, a coalesced
# payload's fault, with_sender) is decoded on the delivery thread instead
# and queued, in order, as an object record holding its list.
#
# The queue is bounded by messages (queue_size) and by the bytes its lists
# decompressed (max_batch_decompressed): kind="pull" waits for room (the
# core keeps the rest of the batch), kind="sub" drops what does not fit and
# counts it.  A wait for room, or a full queue dropping, looks every
# 0.2 s with the GIL whether the event loop was closed.

# ---- the collector and the queue ----
#
# Messages queued for the event loop live longer than a collection of the
# youngest generation, so the collector walks every one of them again and
# again (callgrind: about 1,400 instructions per message of the workload's
# map, more than half of what the hand-over costs).  While a message is
# queued nothing but the queue refers to it, and the decoder never makes a
# reference cycle: so its containers are untracked while it waits
# (by the trampoline, which decodes them for an _AsyncTarget) and
# tracked again when it is handed out (_set_tracking), before anyone else
# can see them.  The collector is conservative about an untracked
# container (what it refers to counts as referenced from outside), so this
# can only delay the collection of a cycle a foreign decoder made, never
# free anything alive; closing hands a discarded queue back to the
# collector too (_unpark_batch).  Only exact dicts, lists and tuples are
# touched, down to 32 levels.

cdef inline void _set_tracking(object o, bint track, int depth) noexcept:
    uc_set_tracking(<PyObject *>o, track, depth)


cdef class _AsyncTarget(Handler):
    """The base of the async adapter's target (upcall/aio.py, _Bridge): it
    owns the hand-over queue (``_open_queue``), which the trampoline fills
    without the GIL (_deliver_async); what is not plain comes to on_batch
    decoded, untracked by the collector (_deliver_as_list), and is queued
    in order with ``_queue_list``."""
    cdef uc_ho *ho
    cdef public uint64_t loop_errors      # messages the loop found undecodable
    cdef public uint64_t discarded        # messages queued, then discarded (close, the end)
    cdef uint64_t list_inflated           # what the list on_batch gets next decompressed

    def _open_queue(self, size_t limit, bint wait_for_room, int efd, bint with_topic,
                    uint64_t max_inflated):
        """The queue: at most limit messages and max_inflated bytes of
        decompressed frames, kind="pull" waiting for room, the loop woken
        through efd, the topics kept only with with_topic."""
        if self.ho != NULL:
            raise RuntimeError("the hand-over queue is open already")
        self.ho = uc_ho_new(limit, wait_for_room, efd, with_topic, max_inflated)
        if self.ho == NULL:
            raise MemoryError()

    def _queue_list(self, list msgs not None):
        """The delivery thread, with the GIL: queue a list of decoded
        messages (in order with the plain ones).  False: dropped (kind="sub",
        the queue is full; counted) or the loop is closed (StopDelivery)."""
        cdef int rc
        cdef size_t n = <size_t>PyList_GET_SIZE(msgs)
        cdef uint64_t inflated = self.list_inflated
        self.list_inflated = 0
        while True:
            Py_INCREF(msgs)               # the queue's reference
            with nogil:
                rc = uc_ho_put_obj(self.ho, <void *>msgs, n, inflated)
            if rc == UC_HO_OK:
                return True
            Py_DECREF(msgs)
            if rc == UC_HO_FULL:
                _unpark_batch(msgs)       # back to the collector: it may live on elsewhere
                return False
            if rc == UC_HO_ENDED:
                raise StopDelivery
            # UC_HO_CHECK: a wait for room, or a full queue, looks at the loop.
            if not self._loop_open():
                raise StopDelivery
            if not (<object>self).wait_for_room:
                _unpark_batch(msgs)       # dropped: counted by uc_ho_put_obj
                return False

    def _end(self, bint discard):
        """Nothing more is queued (and with discard, what is queued goes);
        wakes the loop and a delivery thread waiting for room."""
        cdef uint64_t discarded = 0
        cdef uc_ho_block *b
        if self.ho == NULL:
            return
        b = uc_ho_end(self.ho, discard, &discarded)
        self.discarded += discarded
        _drop_blocks(b)

    def _forget_fd(self):
        """The eventfd is closed next: never written again."""
        if self.ho != NULL:
            uc_ho_forget_fd(self.ho)

    def _counts(self):
        """(accepted, dropped, wakeups, queued, queued_bytes, ended) of the queue."""
        cdef uint64_t accepted = 0, dropped = 0, wakeups = 0, queued_bytes = 0
        cdef size_t queued = 0
        cdef int ended = 1
        if self.ho != NULL:
            uc_ho_counts(self.ho, &accepted, &dropped, &wakeups, &queued, &queued_bytes, &ended)
        return accepted, dropped, wakeups, queued, queued_bytes, bool(ended)

    def __dealloc__(self):
        cdef uint64_t discarded = 0
        if self.ho != NULL:
            _drop_blocks(uc_ho_end(self.ho, 1, &discarded))
            uc_ho_free(self.ho)
            self.ho = NULL


cdef void _drop_blocks(uc_ho_block *b) noexcept:
    """Free blocks taken off the queue; their lists go back to the collector."""
    cdef uc_ho_block *next
    cdef size_t off
    cdef uc_ho_rec *r
    while b != NULL:
        next = b.next
        off = 0
        while off < b.len:
            r = <uc_ho_rec *>(b.data + off)
            off += uc_ho_rec_span(r)
            if (r.kind & UC_HO_KIND) == UC_HO_OBJ and r.obj != NULL:
                _set_tracking_all(<list>r.obj, True)
                Py_DECREF(<object>r.obj)
                r.obj = NULL
        free(b)
        b = next


cdef int _deliver_async(loop_state *st, const uc_msg *batch, size_t n,
                        size_t *consumed) noexcept nogil:
    """An async subscription's batch, on its delivery thread without the GIL:
    the plain messages are copied into the hand-over queue; a run of others
    is decoded with the GIL (the trampoline, to _Bridge.on_batch)."""
    cdef size_t took = 0
    cdef int rc = uc_ho_put(<uc_ho *>st.flavour, batch, n, &took)
    consumed[0] = took
    if rc == UC_HO_OK:
        return UC_DELIVER_MORE
    if rc == UC_HO_ENDED:
        return UC_DELIVER_STOP
    if rc == UC_HO_CHECK:
        return _async_check_loop(st)
    if took:            # the rest comes again at once, the message that is not plain first
        return UC_DELIVER_MORE
    return _upcall(st, batch, uc_ho_slow_run(batch, n), NULL, consumed)


cdef int _async_check_loop(loop_state *st) noexcept nogil:
    """A full queue, every 0.2 s: is the event loop still open?"""
    cdef bint open_
    if st.gil_mode == GIL_ADOPT and not st.thread.adopted:
        _adopt(&st.thread)
    with gil:
        try:
            open_ = (<_AsyncTarget>(<Subscription>st.owner)._target)._loop_open()
        except BaseException as exc:
            _write_unraisable(exc, None)
            open_ = False
    return UC_DELIVER_MORE if open_ else UC_DELIVER_STOP


cdef void _set_tracking_all(list batch, bint track) noexcept:
    cdef Py_ssize_t i
    for i in range(PyList_GET_SIZE(batch)):
        _set_tracking(<object>PyList_GET_ITEM(batch, i), track, 0)


def _unpark_batch(list batch not None):
    """Track them again: a batch discarded."""
    _set_tracking_all(batch, True)


# _take_now's "nothing queued", for the adapter too.
_nothing = _NOTHING


@cython.final
cdef class _Pending:
    """The event loop's side of the hand-over queue: the block it took and
    decodes one message at a time (``blk`` from ``off``), and the list of an
    object record being handed out (``batch[pos:]``).  The adapter
    (upcall/aio.py) keeps it."""
    cdef list batch
    cdef Py_ssize_t pos
    cdef uc_ho_block *blk
    cdef size_t off
    cdef _AsyncTarget target
    cdef Subscription sub
    cdef Decoder decoder
    cdef bint with_topic
    cdef bytes topic              # the last topic made (one object for a run of one topic)
    cdef const char *topic_at     # the stored topic `topic` was made from, in blk
    cdef const char *block_topic  # the topic stored last in blk (UC_HO_SAME_TOPIC's)
    cdef bint last                # the record taken last ended a batch (UC_HO_LAST)

    def __cinit__(self):
        self.batch = []
        self.pos = 0

    def bind(self, _AsyncTarget target not None, Subscription sub not None):
        """The queue to take from and the subscription whose decoder,
        with_topic and on_error apply."""
        self.target = target
        self.sub = sub
        self.decoder = sub._decoder
        self.with_topic = sub._with_topic

    def clear(self):
        """Discard what is left (close): counted as discarded."""
        self.target.discarded += self._discard()

    cdef size_t _discard(self):
        cdef size_t n = <size_t>(PyList_GET_SIZE(self.batch) - self.pos)
        cdef list rest = self.batch[self.pos:]
        self.batch = []
        self.pos = 0
        _set_tracking_all(rest, True)
        if self.blk != NULL:
            n += _records_left(self.blk, self.off)
            self.blk.next = NULL
            _drop_blocks_from(self.blk, self.off)
            self.blk = NULL
        return n

    @property
    def count(self):
        """Messages taken and not handed out yet."""
        cdef size_t n = <size_t>(PyList_GET_SIZE(self.batch) - self.pos)
        if self.blk != NULL:
            n += _records_left(self.blk, self.off)
        return n

    def __dealloc__(self):
        if self.blk != NULL:
            self.blk.next = NULL
            _drop_blocks_from(self.blk, self.off)
            self.blk = NULL


cdef size_t _records_left(uc_ho_block *b, size_t off) noexcept:
    cdef size_t n = 0
    cdef uc_ho_rec *r
    while off < b.len:
        r = <uc_ho_rec *>(b.data + off)
        off += uc_ho_rec_span(r)
        n += <size_t>r.size if (r.kind & UC_HO_KIND) == UC_HO_OBJ else 1
    return n


cdef void _drop_blocks_from(uc_ho_block *b, size_t off) noexcept:
    """Drop the object records from off on (those before were taken), free b."""
    cdef uc_ho_rec *r
    while off < b.len:
        r = <uc_ho_rec *>(b.data + off)
        off += uc_ho_rec_span(r)
        if (r.kind & UC_HO_KIND) == UC_HO_OBJ and r.obj != NULL:
            _set_tracking_all(<list>r.obj, True)
            Py_DECREF(<object>r.obj)
            r.obj = NULL
    free(b)


cdef inline object _pending_from_list(_Pending p, bint whole):
    """The next message of the object record's list being handed out (with
    whole: the rest of it), or _NOTHING."""
    cdef Py_ssize_t pos = p.pos
    cdef list batch = p.batch
    if pos >= PyList_GET_SIZE(batch):
        return _NOTHING
    if whole:
        p.batch = []
        p.pos = 0
        batch = batch[pos:] if pos else batch
        _set_tracking_all(batch, True)
        return batch
    p.pos = pos + 1
    value = <object>PyList_GET_ITEM(batch, pos)
    _set_tracking(value, True, 0)
    return value


cdef object _next_record(_Pending p):
    """Decode the next message of the block being taken (on the loop's
    thread); an object record's list becomes the list handed out next.
    _NOTHING: the block is used up (given back).  A message that does not
    decode is reported (on_error) and passed over; when that ends delivery,
    the queue is ended and _NOTHING returned."""
    cdef uc_ho_block *b = p.blk
    cdef uc_ho_rec *r
    cdef const char *t
    cdef size_t tl
    cdef int verdict
    while p.off < b.len:
        r = <uc_ho_rec *>(b.data + p.off)
        p.last = (r.kind & UC_HO_LAST) != 0
        if (r.kind & UC_HO_KIND) == UC_HO_OBJ:
            p.off += uc_ho_rec_size(0)
            lst = <list>r.obj             # the record's reference, now the pending's
            Py_DECREF(lst)
            r.obj = NULL
            p.batch = lst
            p.pos = 0
            return _NOTHING if PyList_GET_SIZE(lst) == 0 else _OBJ_LIST
        if (r.kind & UC_HO_SAME_TOPIC) == 0:
            p.block_topic = <const char *>(r + 1)
        t = p.block_topic
        tl = r.topic_len
        p.off += uc_ho_rec_span(r)
        try:
            if r.kind & UC_HO_MARKED:    # upcall's own: its extensions apply (docs/wire.md)
                obj = p.decoder.decode_wire(uc_ho_rec_payload(r), <Py_ssize_t>r.size)
            else:
                obj = p.decoder.decode_view(uc_ho_rec_payload(r), <Py_ssize_t>r.size)
        except BaseException as exc:
            verdict = _loop_decode_error(p, exc, t, tl, uc_ho_rec_payload(r), <size_t>r.size)
            if verdict == UC_DELIVER_MORE:
                if p.last:
                    return _NOTHING     # a batch ends here (sub.batches())
                continue
            _stop_on_loop(p)
            return _NOTHING
        if p.with_topic:
            return (_record_topic(p, t, tl), obj)
        return obj
    p.blk = NULL
    p.block_topic = NULL
    p.topic_at = NULL
    uc_ho_give_back(p.target.ho, b)
    return _NOTHING


# _next_record's "the object record's list is next".
cdef object _OBJ_LIST = object()


cdef inline bytes _record_topic(_Pending p, const char *t, size_t tl):
    """The topic at t as bytes: one object for the records sharing one
    stored topic (a coalesced zmq message's), and for a run of one topic."""
    cdef bytes last = p.topic
    if t == p.topic_at and last is not None:
        return last
    p.topic_at = t
    if last is not None and <size_t>PyBytes_GET_SIZE(last) == tl and \
            memcmp(PyBytes_AS_STRING(last), t, tl) == 0:
        return last
    last = PyBytes_FromStringAndSize(t, <Py_ssize_t>tl)
    p.topic = last
    return last


cdef int _loop_decode_error(_Pending p, BaseException exc, const char *t, size_t tl,
                            const char *payload, size_t size) noexcept:
    """A message the loop could not decode: counted and reported as on a
    delivery thread (on_error runs here, on the loop's thread)."""
    cdef Subscription sub = p.sub
    uc_sub_add_stat(sub._c, UC_STAT_DECODE_ERRORS, 1)
    p.target.loop_errors += 1
    bad_topic = PyBytes_FromStringAndSize(t, <Py_ssize_t>tl)
    return sub._report(_with_context(exc, bad_topic),
                       PyBytes_FromStringAndSize(payload, <Py_ssize_t>size), bad_topic, True)


cdef void _stop_on_loop(_Pending p) noexcept:
    """on_error (or an interrupt) ended delivery while the loop decoded: the
    iteration ends after what was handed out, with that interrupt (once);
    what is queued is discarded; the delivery loop stops at its next batch."""
    cdef Subscription sub = p.sub
    exc, sub._end_exc = sub._end_exc, None
    try:
        p.target.finish(exc, True)
    except BaseException as err:
        _write_unraisable(err, p.target)
    p.target.discarded += p._discard()


cdef object _take_now(_Pending p, object owner, bint whole, bint arm=False):
    """The next message (with ``whole``: the rest of the current batch, or
    the next batch, as a list), or _NOTHING if none is queued (with ``arm``,
    the next message queued wakes the loop).  At the end: ``owner._ended()``
    raises what ended delivery (once), then StopAsyncIteration."""
    cdef uc_ho_block *b
    cdef int ended = 0
    cdef list out
    while True:
        value = _pending_from_list(p, whole)
        if value is not _NOTHING:
            return value
        if p.blk != NULL:
            if whole:
                # The rest of the batch: to its last record.  The collector
                # is held off while the list grows (it would walk the
                # decoded messages again at each collection of the youngest
                # generation: callgrind, about 600 instructions per message
                # of the workload's map); the next collection sees them once.
                out = []
                gc_was_on = PyGC_Disable()
                try:
                    while p.blk != NULL:
                        value = _next_record(p)
                        if value is _OBJ_LIST:
                            out.extend(_pending_from_list(p, True))
                        elif value is not _NOTHING:
                            out.append(value)
                        if p.last and out:
                            break
                finally:
                    if gc_was_on:
                        PyGC_Enable()
                if out:
                    return out
                continue
            value = _next_record(p)
            if value is _NOTHING:
                continue
            if value is _OBJ_LIST:
                continue
            return value
        if p.target.ho == NULL:
            owner._ended()
        b = uc_ho_take(p.target.ho, arm, &ended)
        if b == NULL:
            if ended:
                owner._ended()
            return _NOTHING
        p.blk = b
        p.off = 0
        p.topic_at = NULL       # a block at an address a freed one had


def _take_armed(_Pending pending not None, owner, bint whole):
    """_take_now for the waiting coroutine: with nothing queued, the next
    message queued wakes the loop (the eventfd)."""
    return _take_now(pending, owner, whole, True)


@cython.final
@cython.freelist(8)
cdef class _Next:
    """What __anext__ returns: awaiting it gives the next message (or batch)."""
    cdef _Pending p
    cdef object owner
    cdef bint whole
    cdef bint finished
    cdef object delegate      # owner._wait(whole) once the queue was found empty

    def __await__(self):
        return self

    def __iter__(self):
        return self

    # The Python-level protocol, for what does not use am_send: a tracer set
    # (CPython 3.11's SEND), `yield from` in a generator-based coroutine
    # (asyncio.ensure_future of a non-coroutine awaitable), throw and close.
    def __next__(self):
        return self.send(None)

    def send(self, arg):
        cdef int done = 0
        value = _next_step(self, arg, &done)
        if done:
            raise StopIteration(value)
        return value

    def throw(self, typ, val=None, tb=None):
        if self.delegate is None or self.finished:
            self.finished = True
            raise (typ if val is None else val)
        if val is None and tb is None:
            return self.delegate.throw(typ)
        return self.delegate.throw(typ, val, tb)

    def close(self):
        self.finished = True
        if self.delegate is not None:
            self.delegate.close()


cdef object _next_step(object o, object arg, int *done):
    """One step of awaiting a _Next: the message (*done = 1), or what the
    waiting coroutine yields (*done = 0)."""
    cdef _Next n = <_Next>o
    cdef PyObject *out = NULL
    cdef PySendResult rc
    if n.finished:
        raise RuntimeError("cannot reuse an already awaited __anext__()")
    if n.delegate is None:
        try:
            value = _take_now(n.p, n.owner, n.whole)
        except BaseException:
            n.finished = True
            raise
        if value is not _NOTHING:
            n.finished = True
            done[0] = 1
            return value
        n.delegate = n.owner._wait(n.whole)
    rc = PyIter_Send(n.delegate, arg, &out)
    if rc == PYGEN_ERROR:
        n.finished = True
        n.delegate = None
        return uc_pass_error()
    value = <object>out
    Py_DECREF(value)          # PyIter_Send gave a new reference
    if rc == PYGEN_RETURN:
        n.finished = True
        n.delegate = None
        done[0] = 1
    return value


uc_next_set_step(_next_step)
if uc_next_install_send(<PyTypeObject *>_Next) < 0:
    raise ImportError("upcall._bus: _Next has no async slots")


cdef inline _Next _next(_Pending p, object owner, bint whole):
    cdef _Next n = _Next.__new__(_Next)
    n.p = p
    n.owner = owner
    n.whole = whole
    return n


def _anext_message(_Pending pending not None, owner):
    return _next(pending, owner, False)


@cython.final
cdef class _AsyncMessages:
    """``async for msg in sub``'s iterator: holds the adapter while the loop runs."""
    cdef _Pending pending
    cdef object owner

    def __cinit__(self, _Pending pending not None, owner):
        self.pending = pending
        self.owner = owner

    def __aiter__(self):
        return self

    def __anext__(self):
        return _next(self.pending, self.owner, False)


@cython.final
cdef class _AsyncBatches:
    """``async for batch in sub.batches()``: the messages of one wake-up as a list."""
    cdef _Pending pending
    cdef object owner

    def __cinit__(self, _Pending pending not None, owner):
        self.pending = pending
        self.owner = owner

    def __aiter__(self):
        return self

    def __anext__(self):
        return _next(self.pending, self.owner, True)
