# Routed subscriptions: many subscribe() calls on one socket (csrc/route.h).
#
# bus.subscribe() joins a router, one per (endpoints, socket options), when
# the subscription is a kind="sub" connect delivered on the core's own
# threads (no thread_factory of its own, none on the bus) and shared=True
# (the default): one SUB socket, one connection, one receive loop and one
# thread for any number of per-topic targets, as NATS, zenoh and LBM users
# expect of a subscription (an entry in a table, not a socket).  The loop
# routes each batch in C, without the GIL, and enters Python once per
# batch for all the subscriptions it reaches.  Each subscription keeps its own target, decoder,
# batch, on_error, stats, close() and end hook; what it shares is the socket
# and the thread (a slow target delays the other subscriptions of its
# router, as one thread delivering them must).  A subscription that asks for
# a thread of its own (thread_factory=, a bus factory), delivery="caller",
# bind=True, kind="pull" or shared=False keeps a socket of its own.

cdef extern from "route.h" nogil:
    ctypedef struct uc_route:
        pass
    uc_route *uc_route_new(int *err)
    int uc_route_open(uc_route *r, uc_bus *bus, const uc_sub_opts *o)
    int uc_route_deliver(uc_route *r, const uc_msg *batch, size_t n, size_t *consumed)
    size_t uc_route_group(uc_route *r, const uc_msg *batch, size_t n)
    int uc_route_hand_out(uc_route *r)
    void uc_route_carrier_ended(uc_route *r)
    uc_sub *uc_route_join(uc_route *r, uc_bus *bus, const uc_sub_opts *o, uint64_t *ticket,
                          int *err)
    void uc_route_member_exit(uc_sub *member)
    int uc_route_member_wait(uc_sub *member, int timeout_ms)
    size_t uc_route_members(uc_route *r)
    int uc_route_closed(uc_route *r)
    void uc_route_close(uc_route *r)
    uc_sub *uc_route_carrier(uc_route *r)
    void uc_route_release(uc_route *r)


cdef struct route_state:
    uc_route *r
    int adopted               # this thread holds a GILState registration for the loop
    PyGILState_STATE gstate
    char native_name[16]


cdef int _route_deliver(void *ctx, const uc_msg *batch, size_t n,
                        size_t *consumed) noexcept nogil:
    cdef route_state *rs = <route_state *>ctx
    if _python_gone():
        consumed[0] = n
        return UC_DELIVER_STOP
    if not rs.adopted:
        # Once per loop, for every subscription of the router: their
        # trampolines then take the GIL with this thread's own state.
        rs.gstate = PyGILState_Ensure()
        _name_python_thread(rs.native_name)
        PyEval_SaveThread()
        rs.adopted = 1
    consumed[0] = n
    if uc_route_group(rs.r, batch, n) == 0:     # without the GIL
        return uc_route_hand_out(rs.r)
    # One GIL crossing for the whole batch, whatever the number of
    # subscriptions it reaches: each one's trampoline finds the GIL held.
    with gil:
        return uc_route_hand_out(rs.r)


cdef int _routed_deliver(void *ctx, const uc_msg *batch, size_t n,
                         size_t *consumed) noexcept:
    # A routed subscription's part of a batch (a Python callable or a
    # Handler): called only from its router's hand-out, which holds the GIL
    # for every subscription the batch reaches (_route_deliver), so it is a
    # plain C call here, with no GIL crossing of its own.
    cdef loop_state *st = <loop_state *>ctx
    return _deliver_each(<Subscription>st.owner, batch, n, NULL, consumed)


cdef void _route_exit(void *ctx) noexcept nogil:
    # The carrier's loop has ended: its subscriptions end here (their
    # _routed_exit runs on this thread), then the adopted thread state goes.
    cdef route_state *rs = <route_state *>ctx
    cdef uc_route *r = rs.r
    cdef int adopted = rs.adopted
    cdef PyGILState_STATE gstate = rs.gstate
    free(rs)
    uc_route_carrier_ended(r)     # drops the loop's reference to the router
    if adopted and not _python_gone():
        PyEval_RestoreThread(PyGILState_GetThisThreadState())
        _forget_python_thread()
        PyGILState_Release(gstate)


cdef void _routed_exit(void *ctx) noexcept nogil:
    # A routed subscription has ended (on the router's thread, or on the
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
cdef class _Router:
    """One shared SUB socket and its loop (csrc/route.h); the bus keeps one
    per key until its last subscription leaves."""
    cdef uc_route *_r
    cdef readonly str thread_name
    cdef int _fork_generation
    cdef Decoder _decoder         # the built-in decoder its subscriptions share
    # Its subscriptions' connection events: the shared socket's, none of
    # their own (no on_event: bus.subscribe() routes none with one), so one
    # sink for all of them rather than one each.
    cdef _EventSink events
    cdef tuple endpoints          # its subscriptions' `endpoints`, one tuple for all

    cdef Decoder shared_decoder(self, Decoder fresh, bint extensions):
        # extensions is part of the router's key: one kind of decoder each.
        if self._decoder is None:
            self._decoder = fresh
        return self._decoder

    def __cinit__(self):
        self._fork_generation = _fork_generation

    def __dealloc__(self):
        # In a forked child the C state is the parent's: left alone.
        if self._r != NULL and not _inherited(self._fork_generation):
            uc_route_release(self._r)
        self._r = NULL

    @property
    def members(self):
        return uc_route_members(self._r) if self._r != NULL else 0

    @property
    def closed(self):
        return self._r == NULL or uc_route_closed(self._r) != 0

    @property
    def stats(self):
        """The shared socket's counters (received: messages taken from it)."""
        cdef uc_stats s
        uc_sub_stats(uc_route_carrier(self._r), &s)
        return {"received": s.received, "batches": s.batches, "dropped": s.dropped,
                "zmq_received": s.zmq_received}


@cython.final
cdef class _RoutedSource(_Source):
    """subscribe()'s source for a routed subscription: a member of ``router``."""
    cdef _Router router
    cdef uint64_t ticket

    cdef uc_sub *open(self, uc_bus *bus, const uc_sub_opts *o, int *err) noexcept:
        return uc_route_join(self.router._r, bus, o, &self.ticket, err)


cdef _Router _open_router(uc_bus *bus, list ep_list, object opts, int64_t mms,
                          object curve, object sockopts):
    """A new router with its carrier open on ``ep_list`` (connect, kind sub);
    None if it cannot be opened (the subscription then opens a socket of its
    own, which reports the error as any subscribe() does)."""
    cdef uc_sub_opts o
    cdef int err = 0
    cdef int rc
    cdef Py_ssize_t i
    cdef route_state *rs
    cdef const char **ep_ptrs = NULL
    cdef uc_sockopt *opt_array = NULL
    cdef size_t failed = <size_t>-1
    cdef _Router router = _Router.__new__(_Router)
    router._r = uc_route_new(&err)
    if router._r == NULL:
        _check_rc(err, "subscribe()")
    ep_bytes = [(<str>e).encode("utf-8") for e in ep_list]
    name = _next_thread_name()
    router.thread_name = name
    router.endpoints = tuple(ep_list)
    router.events = _EventSink(f"subscription {', '.join(ep_list)}", None)
    rs = <route_state *>malloc(sizeof(route_state))
    if rs == NULL:
        raise MemoryError()
    memset(rs, 0, sizeof(route_state))
    rs.r = router._r
    name_b = name.encode()
    strncpy(rs.native_name, <const char *>name_b, 15)
    rs.native_name[15] = 0
    memset(&o, 0, sizeof(o))
    o.kind = UC_SUB
    o.failed_endpoint = &failed
    o.batch = DEFAULT_BATCH
    o.rcvhwm = -1 if opts.rcvhwm is None else opts.rcvhwm
    o.max_message_size = mms
    o.plain_ext = 0 if opts.extensions else 1
    o.max_streams = opts.max_streams
    _fill_curve(&o.curve, curve)
    o.deliver = _route_deliver
    o.on_exit = _route_exit
    o.ctx = rs
    o.start = _start_native
    o.start_ctx = <void *>rs.native_name
    opt_array = _sockopt_array(sockopts)
    o.sockopts = opt_array
    o.n_sockopts = len(sockopts)
    ep_ptrs = <const char **>malloc(len(ep_bytes) * sizeof(const char *))
    if ep_ptrs == NULL:
        free(opt_array)
        free(rs)
        raise MemoryError()
    for i, e in enumerate(ep_bytes):
        ep_ptrs[i] = <const char *>(<bytes>e)
    o.endpoints = ep_ptrs
    o.n_endpoints = len(ep_bytes)
    rc = uc_route_open(router._r, bus, &o)
    free(ep_ptrs)
    free(opt_array)
    if rc != UC_OK:
        free(rs)                 # the loop never ran: on_exit is not owed
        return None
    return router
