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

cdef extern from *:
    """
    typedef PyObject *(*uc_next_step_fn)(PyObject *self, PyObject *arg, int *done);
    static uc_next_step_fn uc_next_step;

    static void uc_next_set_step(uc_next_step_fn f) { uc_next_step = f; }

    /* am_send: PYGEN_RETURN with the message, PYGEN_NEXT with what the
     * waiting coroutine yields, PYGEN_ERROR with an exception set. */
    static PySendResult uc_next_send(PyObject *self, PyObject *arg, PyObject **result) {
        int done = 0;
        PyObject *r = uc_next_step(self, arg, &done);
        *result = r;
        if (r == NULL) return PYGEN_ERROR;
        return done ? PYGEN_RETURN : PYGEN_NEXT;
    }

    static int uc_next_install_send(PyTypeObject *t) {
        if (t->tp_as_async == NULL) return -1;
        t->tp_as_async->am_send = uc_next_send;
        return 0;
    }

    /* NULL: the exception PyIter_Send set goes on (Cython raises it). */
    static PyObject *uc_pass_error(void) { return NULL; }
    """
    ctypedef enum PySendResult:
        PYGEN_RETURN
        PYGEN_ERROR
        PYGEN_NEXT
    ctypedef object (*uc_next_step_fn)(object, object, int *)
    void uc_next_set_step(uc_next_step_fn f)
    int uc_next_install_send(PyTypeObject *t)
    object uc_pass_error()
    PySendResult PyIter_Send(object iter, object arg, PyObject **presult)


# _take_now's "nothing queued".
cdef object _NOTHING = object()


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

cdef extern from *:
    """
    /* Untrack (track = 0) or track again o's containers, children first;
     * only exact dicts, lists and tuples, down to depth 32.  Tracking again
     * follows CPython's own rule for dicts: a dict only if it holds
     * something the collector may have to see, so a dict of atoms stays
     * untracked as the decoder made it.  The children are visited with the
     * type's own tp_traverse, as the collector visits them (PyDict_Next
     * cost about 50 instructions an entry); atoms are passed over without
     * a call (their type has no Py_TPFLAGS_HAVE_GC). */
    typedef struct { int track, depth, need; } uc_tracking;

    static void uc_set_tracking(PyObject *o, int track, int depth);

    static int uc_tracking_visit(PyObject *v, void *arg) {
        uc_tracking *t = (uc_tracking *)arg;
        if (!PyType_HasFeature(Py_TYPE(v), Py_TPFLAGS_HAVE_GC)) return 0;
        uc_set_tracking(v, t->track, t->depth + 1);
        if (!t->need) t->need = !PyTuple_CheckExact(v) || PyObject_GC_IsTracked(v);
        return 0;
    }

    static void uc_set_tracking(PyObject *o, int track, int depth) {
        PyTypeObject *tp = Py_TYPE(o);
        uc_tracking t;
        if (tp != &PyDict_Type && tp != &PyList_Type && tp != &PyTuple_Type)
            return;     /* atoms, and objects of other types: left as they are */
        t.track = track;
        t.depth = depth;
        t.need = depth >= 32;
        if (!t.need) tp->tp_traverse(o, uc_tracking_visit, &t);
        if (track) {
            /* A list or a tuple is tracked whatever it holds, as CPython makes them. */
            if ((t.need || tp != &PyDict_Type) && !PyObject_GC_IsTracked(o))
                PyObject_GC_Track(o);
        } else if (PyObject_GC_IsTracked(o)) {
            PyObject_GC_UnTrack(o);
        }
    }
    """
    void uc_set_tracking(PyObject *o, int track, int depth) noexcept


cdef inline void _set_tracking(object o, bint track, int depth) noexcept:
    uc_set_tracking(<PyObject *>o, track, depth)


cdef class _AsyncTarget(Handler):
    """The base of the async adapter's target (upcall/aio.py, _Bridge): the
    trampoline untracks each message it decodes for it (_deliver_as_list),
    so a batch being decoded is not walked by the collector either."""
    pass


cdef void _set_tracking_all(list batch, bint track) noexcept:
    cdef Py_ssize_t i
    for i in range(PyList_GET_SIZE(batch)):
        _set_tracking(<object>PyList_GET_ITEM(batch, i), track, 0)


def _unpark_batch(list batch not None):
    """Track them again: a batch discarded."""
    _set_tracking_all(batch, True)


@cython.final
cdef class _Pending:
    """What an async subscription's consumer has taken from its queue and not
    handed out yet: ``batch[pos:]``.  The adapter (upcall/aio.py) keeps it;
    it refers to nothing, so the adapter stays out of reference cycles (it
    closes itself when dropped)."""
    cdef list batch
    cdef Py_ssize_t pos

    def __cinit__(self):
        self.batch = []
        self.pos = 0

    def start(self, list batch not None, bint whole):
        """A batch the waiting coroutine took: its first message (the rest
        is handed out next), or with ``whole`` the batch itself."""
        if whole:
            _set_tracking_all(batch, True)
            return batch
        self.batch = batch
        self.pos = 1
        value = batch[0]
        _set_tracking(value, True, 0)
        return value

    def clear(self):
        """Discard what is left (close): handed back to the collector."""
        cdef list batch = self.batch[self.pos:]
        self.batch = []
        self.pos = 0
        _set_tracking_all(batch, True)

    @property
    def count(self):
        """Messages taken and not handed out yet."""
        return PyList_GET_SIZE(self.batch) - self.pos


cdef object _take_now(_Pending p, object owner, bint whole):
    """The next message (with ``whole``: the rest of the current batch, or
    the next batch), or _NOTHING if none is queued.  ``owner._take()`` gives
    the next queued batch (None: none queued; raises at the end)."""
    cdef Py_ssize_t pos = p.pos
    cdef list batch = p.batch
    if pos < PyList_GET_SIZE(batch):
        if whole:
            # What `async for msg` left of its batch comes first, in order.
            p.batch = []
            p.pos = 0
            batch = batch[pos:] if pos else batch
            _set_tracking_all(batch, True)
            return batch
        p.pos = pos + 1
        value = <object>PyList_GET_ITEM(batch, pos)
        _set_tracking(value, True, 0)
        return value
    p.batch = []              # do not keep a consumed batch alive
    p.pos = 0
    got = owner._take()
    if got is None:
        return _NOTHING
    if whole:
        _set_tracking_all(<list>got, True)
        return got
    p.batch = <list>got
    p.pos = 1
    value = <object>PyList_GET_ITEM(p.batch, 0)
    _set_tracking(value, True, 0)
    return value


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
