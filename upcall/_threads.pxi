# Thread factories: who creates the thread a subscription's loop runs on.
#
# The C hook is start(factory_ctx, entry, arg): arrange for entry(arg) to run
# once, on some thread.  The core never joins that thread; it waits for the
# loop on its own latch, so any factory works.  Three kinds:
#   native_threads   a marker (not called): the core's own detached pthread, named upcall-<n>
#   python_threads   a daemon threading.Thread named upcall-<n>
#   any callable     factory(run): it must arrange for run() to be called once
#                    on another thread, e.g. ThreadPoolExecutor(...).submit
#
# A factory may fail (raise) at any point, also after arranging run():
# subscribe() then raises the factory's exception at once, without waiting
# for run(); a run() that comes anyway returns at once, and one that never
# comes holds nothing (the core gives entry a ticket, not the subscription).

cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    pthread_t pthread_self()
    int pthread_setname_np(pthread_t thread, const char *name)

_thread_numbers = itertools.count(1)


def _next_thread_name():
    return f"upcall-{next(_thread_numbers)}"


@cython.final
cdef class _NativeThreads:
    """``upcall.native_threads``: the default thread factory, the C core's own
    detached pthread, named ``upcall-<n>``.

    A marker, not a callable: ``thread_factory=upcall.native_threads`` (same
    as None) selects it.  A native thread adopts one Python thread state on
    its first upcall and keeps it until its loop ends, so it does not pay the
    classic unknown-thread penalty.
    """

    def __repr__(self):
        return "upcall.native_threads"

    def __reduce__(self):
        return "native_threads"    # copies and pickles are this one marker


native_threads = _NativeThreads()


def python_threads(run):
    """Thread factory: run the loop on a daemon ``threading.Thread``.

    The thread is named after ``run.name`` (``upcall-<n>``), so it shows in
    ``threading.enumerate()``, profilers and debuggers.
    """
    threading.Thread(target=run, name=run.name, daemon=True).start()


cdef struct native_start:
    void (*entry)(void *) noexcept nogil
    void *arg
    char name[16]          # Linux thread names are at most 15 bytes


cdef void _native_entry(void *p) noexcept nogil:
    cdef native_start s = (<native_start *>p)[0]
    free(p)
    pthread_setname_np(pthread_self(), s.name)
    s.entry(s.arg)


cdef int _start_native(void *factory_ctx, void (*entry)(void *) noexcept nogil,
                       void *arg) noexcept nogil:
    # factory_ctx: the thread's name, NUL-terminated (owned by the Subscription).
    cdef native_start *s = <native_start *>malloc(sizeof(native_start))
    if s == NULL:
        return -1
    s.entry = entry
    s.arg = arg
    strncpy(s.name, <const char *>factory_ctx, 15)
    s.name[15] = 0
    cdef int rc = uc_start_pthread(NULL, _native_entry, s)
    if rc != 0:
        free(s)
    return rc


cdef class _Run:
    """What a Python thread factory receives: call it once, on the thread that
    should deliver.  It returns when the subscription's loop ends, or at once
    if there is no loop to run any more (the factory raised, or the
    subscription was closed before run() came)."""
    cdef void (*_entry)(void *) noexcept nogil
    cdef void *_arg
    cdef readonly str name
    cdef object _owner           # the Subscription or _SharedSocket, until run()
    cdef long _factory_thread   # the subscribing thread, while the factory runs
    cdef bint _refused          # the factory tried to run the loop synchronously

    def __cinit__(self, token=None, *args, **kwargs):   # any arguments: the TypeError below
        _made_here(token, "upcall run", "subscribe() gives one to its thread factory")

    def __call__(self):
        if self._entry == NULL:
            raise RuntimeError(f"{self.name}: run() may be called only once")
        if self._factory_thread == threading.get_ident():
            self._refused = True
            raise RuntimeError(
                f"{self.name}: the thread factory called run() on the subscribing "
                "thread; it must arrange for run() to be called on another thread")
        entry, arg = self._entry, self._arg
        self._entry = NULL
        owner, self._owner = self._owner, None
        if isinstance(owner, Subscription):
            (<Subscription>owner)._loop_started = True
            if (<Subscription>owner)._thread_name is None:
                (<Subscription>owner)._thread_name = threading.current_thread().name
        owner = None
        with nogil:
            entry(arg)

    def __repr__(self):
        return f"<upcall run {self.name}>"


cdef int _start_python(void *factory_ctx, void (*entry)(void *) noexcept nogil,
                       void *arg) noexcept with gil:
    # factory_ctx: the Subscription, or the _SharedSocket of a shared socket, whose
    # loop it starts; its _factory is the Python callable.
    owner = <object>factory_ctx
    cdef _Run run = _Run.__new__(_Run, _MADE_HERE)
    run._entry = entry
    run._arg = arg
    run._owner = owner
    run._factory_thread = threading.get_ident()
    if isinstance(owner, _SharedSocket):
        run.name = (<_SharedSocket>owner).thread_name
        factory = (<_SharedSocket>owner)._factory
    else:
        run.name = (<Subscription>owner)._run_name
        factory = (<Subscription>owner)._factory
    error = None
    try:
        factory(run)
    except BaseException as exc:
        error = exc
    finally:
        run._factory_thread = 0
    if error is None and run._refused:   # the factory ran it here and swallowed our error
        error = RuntimeError(
            f"{run.name}: the thread factory called run() on the subscribing thread")
    if error is None:
        return 0
    if isinstance(owner, _SharedSocket):
        (<_SharedSocket>owner)._start_error = error
    else:
        (<Subscription>owner)._start_error = error
    return -1


# What Python calls the core's own threads.  threading knows a thread it did
# not start only through the _DummyThread that current_thread() makes for it
# on demand, named "Dummy-<n>"; logging's %(threadName)s and
# threading.enumerate() read that object.  On its first upcall a native thread
# (which adopts one thread state for its whole loop) renames that object to
# the name the core gave the OS thread, "upcall-<n>", through the public
# Thread.name setter.  Chosen over registering a Thread of our own, which
# would have to fake Thread's private start/stop state (_started,
# _tstate_lock up to 3.12, _handle from 3.13): the dummy is CPython's own
# object for exactly this case, on every version from 3.10 to 3.13.
# Threads from a Python factory are threading's own and keep their names.

cdef void _name_python_thread(const char *name) noexcept with gil:
    try:
        threading.current_thread().name = name.decode("utf-8", "replace")
    except BaseException as exc:    # a name is not worth a failed delivery
        _write_unraisable(exc, None)


cdef void _forget_python_thread() noexcept with gil:
    # The loop ends and the thread state goes: its dummy must leave
    # threading._active, or threading.enumerate() lists a thread that has
    # ended, and a later thread that reuses the ident would find the old
    # name.  3.13 removes a dummy itself when its thread state is deleted;
    # 3.10-3.12 never do.  Removed as 3.13 does it, under threading's lock,
    # and only if the entry is still a dummy of this thread.
    try:
        active = getattr(threading, "_active", None)
        lock = getattr(threading, "_active_limbo_lock", None)
        dummy = getattr(threading, "_DummyThread", None)
        if active is None or lock is None or dummy is None:
            return
        ident = threading.get_ident()
        with lock:
            if isinstance(active.get(ident), dummy):
                del active[ident]
    except BaseException as exc:
        _write_unraisable(exc, None)


# Calls made later on a thread of their own (_later): the start watch below
# and send_async's warning (upcall/aio.py), which must not put a timer on the
# event loop (its wait is readiness only).  One thread, made when a call is
# due and gone when none is; a call runs once, unless cancelled before.

_later_cv = threading.Condition(threading.Lock())
_later_due = []          # heap of [when, n, fn, args]; fn None: cancelled
_later_n = itertools.count()
_later_thread = None


def _later(delay, fn, *args):
    """Call fn(*args) on the later-thread ``delay`` seconds from now; returns
    a handle for _cancel_later."""
    global _later_thread
    entry = [time.monotonic() + float(delay), next(_later_n), fn, args]
    with _later_cv:
        heapq.heappush(_later_due, entry)
        if _later_thread is None:
            _later_thread = threading.Thread(target=_later_main, daemon=True,
                                             name="upcall-later")
            _later_thread.start()
        _later_cv.notify()
    return entry


def _cancel_later(entry):
    """The call will not be made (nor its arguments kept)."""
    with _later_cv:
        entry[2] = entry[3] = None


def _later_main():
    global _later_thread
    while True:
        with _later_cv:
            while True:
                if not _later_due:
                    _later_thread = None
                    return
                left = _later_due[0][0] - time.monotonic()
                if left <= 0:
                    entry = heapq.heappop(_later_due)
                    fn, args = entry[2], entry[3]
                    entry[2] = entry[3] = None
                    break
                _later_cv.wait(left)
        if fn is not None:
            try:
                fn(*args)
            except BaseException as exc:
                _write_unraisable(exc, fn)
        fn = args = entry = None


# The start watch: a Python thread factory that never calls run() (a
# Thread made but not started, a pool whose workers are all held by other
# subscriptions) would leave its subscription silent for ever: each such
# subscription is looked at again LOOP_START_WARNING seconds after
# subscribe(), on the later-thread.

#: Seconds a Python thread factory may take to start a subscription's loop
#: (call run() on a thread) before a WARNING on the "upcall" logger and
#: ``sub.stats["loop_start_late"]`` say so, once per subscription.  None:
#: never.
LOOP_START_WARNING = 5.0


cdef void _watch_loop_start(Subscription sub) except *:
    """After a Python factory accepted run(): look again later."""
    delay = LOOP_START_WARNING
    if delay is None or sub._loop_started:
        return
    _later(float(delay), _check_loop_start, weakref.ref(sub), float(delay))


def _check_loop_start(ref, delay):
    sub = ref()
    if sub is not None:
        (<Subscription>sub)._check_loop_started(delay)
