# Shared sockets: many subscribe() calls on one socket (csrc/sub_shared.h).
#
# bus.subscribe() joins a shared socket, one per (endpoints, socket options), when
# the subscription is a kind="sub" connect delivered on a thread (no
# thread_factory of its own: the shared socket's thread is the bus's, made by the
# bus's factory if it has one) and shared=True
# (the default): one SUB socket, one connection, one receive loop and one
# thread for any number of per-topic targets, as NATS, zenoh and LBM users
# expect of a subscription (an entry in a table, not a socket).  The loop
# hands out each batch in C, without the GIL, and enters Python once per
# batch for all the subscriptions it reaches.  Each subscription keeps its own target, decoder,
# batch, on_error, stats, close() and end hook; what it shares is the socket
# and the thread (a slow target delays the other subscriptions of its
# shared socket, as one thread delivering them must).  A subscription that asks for
# a thread of its own (thread_factory=, a bus factory), delivery="caller",
# bind=True, kind="pull" or shared=False keeps a socket of its own.

cdef struct reader_state:
    uc_shared *sh
    adopted_thread thread     # native_name: name_buf on a thread of the core's, else NULL
    char name_buf[16]


cdef int _reader_deliver(void *ctx, const uc_msg *batch, size_t n,
                        size_t *consumed) noexcept nogil:
    cdef reader_state *rd = <reader_state *>ctx
    if _python_gone():
        consumed[0] = n
        return UC_DELIVER_STOP
    if not rd.thread.adopted:
        # Once per loop, for every subscription of the shared socket: their
        # trampolines then take the GIL with this thread's own state.
        _adopt(&rd.thread)
    consumed[0] = n
    if uc_shared_group(rd.sh, batch, n) == 0:     # without the GIL
        return uc_shared_hand_out(rd.sh)
    # One GIL crossing for the whole batch, whatever the number of
    # subscriptions it reaches: each one's trampoline finds the GIL held.
    with gil:
        return uc_shared_hand_out(rd.sh)


cdef int _shared_sub_deliver(void *ctx, const uc_msg *batch, size_t n,
                         size_t *consumed) noexcept:
    # The part of a batch for one subscription of a shared socket (a Python callable or a
    # Handler): called only from its shared socket's hand-out, which holds the GIL
    # for every subscription the batch reaches (_reader_deliver), so it is a
    # plain C call here, with no GIL crossing of its own.
    cdef loop_state *st = <loop_state *>ctx
    return _deliver_each(<Subscription>st.owner, batch, n, NULL, consumed)


cdef void _reader_exit(void *ctx) noexcept nogil:
    # The reader's loop has ended: its subscriptions end here (their
    # _shared_sub_exit runs on this thread), then the adopted thread state goes.
    cdef reader_state *rd = <reader_state *>ctx
    cdef uc_shared *sh = rd.sh
    cdef adopted_thread thread = rd.thread
    free(rd)
    uc_shared_reader_ended(sh)     # drops the loop's reference to the shared socket
    if thread.adopted and not _python_gone():
        _let_go(thread, NULL)


cdef void _shared_sub_exit(void *ctx) noexcept nogil:
    # A subscription on a shared socket has ended (on the shared socket's thread, or on the
    # thread that closed it): its end hook, then the loop's reference.
    cdef loop_state *st = <loop_state *>ctx
    cdef PyObject *owner
    if _python_gone():
        return
    with gil:
        owner = st.owner
        if owner == NULL:
            return
        _loop_ended_with_gil(<Subscription>owner)
        st.owner = NULL
        Py_DecRef(owner)


@cython.final
cdef class _SharedSocket:
    """One shared SUB socket and its loop (csrc/sub_shared.h); the bus keeps one
    per key until its last subscription leaves."""
    cdef uc_shared *_sh
    cdef readonly str thread_name
    cdef object _factory          # the bus's thread factory (None: the core's own thread)
    cdef object _start_error      # what the factory raised, for the subscribe() that opened it
    cdef born_in _born            # where it was made (the fork check)
    cdef Decoder _decoder         # the built-in decoder its subscriptions share
    # Its subscriptions' connection events: the shared socket's, none of
    # their own (no on_event: bus.subscribe() shares no socket with one), so one
    # sink for all of them rather than one each.
    cdef _EventSink events
    cdef tuple endpoints          # its subscriptions' `endpoints`, one tuple for all

    cdef Decoder shared_decoder(self, Decoder fresh, bint extensions):
        # extensions is part of the shared socket's key: one kind of decoder each.
        if self._decoder is None:
            self._decoder = fresh
        return self._decoder

    def __cinit__(self):
        self._born = _born_here()

    def __dealloc__(self):
        # In a forked child the C state is the parent's: left alone.
        if self._sh != NULL and not _inherited(self._born):
            uc_shared_release(self._sh)
        self._sh = NULL

    @property
    def subs(self):
        return uc_shared_subs(self._sh) if self._sh != NULL else 0

    @property
    def closed(self):
        return self._sh == NULL or uc_shared_closed(self._sh) != 0

    @property
    def stats(self):
        """The shared socket's counters (received: messages taken from it)."""
        cdef uc_stats s
        uc_sub_stats(uc_shared_reader(self._sh), &s)
        return {"received": s.received, "batches": s.batches, "dropped": s.dropped,
                "zmq_received": s.zmq_received}


@cython.final
cdef class _SharedSource(_Source):
    """subscribe()'s source for a subscription joining the shared socket ``sock``."""
    cdef _SharedSocket sock
    cdef uint64_t ticket

    cdef uc_sub *open(self, uc_bus *bus, const uc_sub_opts *o, int *err) noexcept:
        return uc_shared_join(self.sock._sh, bus, o, &self.ticket, err)


cdef _SharedSocket _open_shared_socket(uc_bus *bus, list ep_list, object opts, int64_t mms,
                          object curve, object sockopts, object factory):
    """A new shared socket with its reader open on ``ep_list`` (connect, kind sub),
    its thread made by ``factory`` (the bus's: None or native_threads for the
    core's own); None if it cannot be opened (the subscription then opens a
    socket of its own, which reports the error as any subscribe() does).
    What the factory raised is raised here."""
    cdef uc_sub_opts o
    cdef int err = 0
    cdef int rc
    cdef Py_ssize_t i
    cdef reader_state *rd
    cdef const char **ep_ptrs = NULL
    cdef uc_sockopt *opt_array = NULL
    cdef size_t failed = <size_t>-1
    cdef _SharedSocket sock = _SharedSocket.__new__(_SharedSocket)
    sock._sh = uc_shared_new(&err)
    if sock._sh == NULL:
        _check_rc(err, "subscribe()")
    ep_bytes = [(<str>e).encode("utf-8") for e in ep_list]
    name = _next_thread_name()
    sock.thread_name = name
    sock.endpoints = tuple(ep_list)
    sock.events = _EventSink(f"subscription {', '.join(ep_list)}", None)
    rd = <reader_state *>malloc(sizeof(reader_state))
    if rd == NULL:
        raise MemoryError()
    memset(rd, 0, sizeof(reader_state))
    rd.sh = sock._sh
    native = factory is None or factory is native_threads
    if native:
        name_b = name.encode()
        strncpy(rd.name_buf, <const char *>name_b, 15)
        rd.name_buf[15] = 0
        rd.thread.native_name = rd.name_buf
    memset(&o, 0, sizeof(o))
    o.kind = UC_SUB
    o.failed_endpoint = &failed
    o.batch = DEFAULT_BATCH
    o.rcvhwm = -1 if opts.rcvhwm is None else opts.rcvhwm
    o.max_message_size = mms
    o.plain_ext = 0 if opts.extensions else 1
    o.max_streams = opts.max_streams
    _fill_curve(&o.curve, curve)
    o.deliver = _reader_deliver
    o.on_exit = _reader_exit
    o.ctx = rd
    if native:
        o.start = _start_native
        o.start_ctx = <void *>rd.name_buf
    else:
        sock._factory = factory
        o.start = _start_python
        o.start_ctx = <void *>sock
        _install_exit_hook()   # stay ahead of e.g. concurrent.futures' hook
    opt_array = _sockopt_array(sockopts)
    o.sockopts = opt_array
    o.n_sockopts = len(sockopts)
    ep_ptrs = <const char **>malloc(len(ep_bytes) * sizeof(const char *))
    if ep_ptrs == NULL:
        free(opt_array)
        free(rd)
        raise MemoryError()
    for i, e in enumerate(ep_bytes):
        ep_ptrs[i] = <const char *>(<bytes>e)
    o.endpoints = ep_ptrs
    o.n_endpoints = len(ep_bytes)
    rc = uc_shared_open(sock._sh, bus, &o)
    free(ep_ptrs)
    free(opt_array)
    if rc != UC_OK:
        free(rd)                 # the loop never ran: on_exit is not owed
        if sock._start_error is not None:
            error, sock._start_error = sock._start_error, None
            raise error
        return None
    return sock
