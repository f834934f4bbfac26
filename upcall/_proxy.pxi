# Proxy: a forwarder between publishers and subscribers (csrc/proxy.c), an
# XSUB frontend and an XPUB backend joined by libzmq's zmq_proxy_steerable
# on a thread of the bus.  Messages never pass through Python (nor through
# a loop of ours); this file opens it, steers it and reads its counts.

from types import SimpleNamespace

# How long Proxy.stats waits for the proxy's thread to answer (it answers
# between bursts of at most 1000 messages: at once unless the machine stalls).
PROXY_STATS_TIMEOUT = 5.0

# The keys of Proxy.stats.
PROXY_STATS = ("messages", "bytes", "subscription_messages", "subscription_bytes")


cdef dict _proxy_stats_dict(const uc_proxy_totals *st):
    return {"messages": st.frontend.messages_in, "bytes": st.frontend.bytes_in,
            "subscription_messages": st.backend.messages_in,
            "subscription_bytes": st.backend.bytes_in}


cdef class _ProxySide:
    """What one side's keyword arguments resolve to, kept alive (the keys'
    bytes) until uc_proxy_open returns."""
    cdef bytes endpoint
    cdef object curve
    cdef object zap
    cdef list sockopts
    cdef int hwm
    cdef bint bind
    cdef _EventSink sink


cdef _ProxySide _proxy_side(Bus bus, str name, object endpoint, object bind, object hwm,
                            object curve_server, object curve_serverkey, object curve_client,
                            object allow, object authenticate, object socket_options,
                            object on_event):
    cdef _ProxySide s = _ProxySide()
    s.endpoint = _endpoint_bytes(endpoint, name)
    if not isinstance(bind, bool):
        raise TypeError(f"{name}_bind must be True or False, not {type(bind).__name__}")
    s.bind = bind
    s.hwm = -1 if hwm is None else int_arg(hwm, f"{name}_hwm", 0, 2**31 - 1,
                                           "None: libzmq's default, 1000", or_none=True)
    try:
        s.curve = _curve_keys([endpoint], curve_server, curve_serverkey, curve_client)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: {exc}") from None
    if allow is not None:
        _allow_check(allow)
    if not isinstance(authenticate, bool):
        raise TypeError(f"{name}_authenticate must be True or False, "
                        f"not {type(authenticate).__name__}")
    s.sockopts = _socket_options(socket_options)
    s.zap = (allow, authenticate)    # resolved by the caller, once the rest is checked
    s.sink = _EventSink(f"proxy {name} {endpoint}", on_event)
    return s


cdef int _fill_side(Bus bus, uc_proxy_side *c, _ProxySide s) except -1:
    c.endpoint = s.endpoint
    c.bind = s.bind
    c.hwm = s.hwm
    _fill_curve(&c.curve, s.curve)
    allow, authenticate = s.zap
    s.zap = _auth_domain(bus, SimpleNamespace(allow=allow, authenticate=authenticate), s.curve)
    if s.zap is not None:
        c.curve.zap_domain = <const char *>(<_ZapDomain>s.zap).name
    c.sockopts = _sockopt_array(s.sockopts)
    c.n_sockopts = len(s.sockopts)
    c.on_event = _on_conn_event
    c.event_ctx = <void *>s.sink
    return 0


@cython.final
cdef class Proxy:
    """A forwarder between publishers and subscribers: XSUB frontend, XPUB
    backend, libzmq's own proxy between them on a thread of the bus.  Made
    by :meth:`Bus.proxy`; docs/proxy.md.

    A context manager (closed at the end of the ``with``).  ``pause``,
    ``resume``, ``stats`` and ``close`` may be called from any thread.
    """
    cdef uc_proxy *_c
    cdef Bus _bus
    cdef readonly str frontend    # the endpoints as resolved (the port of tcp://...:*)
    cdef readonly str backend
    cdef tuple _sinks             # the two _EventSinks, which the monitor thread calls until close
    cdef tuple _zaps              # the sides' ZAP domains (None: no authentication)
    cdef born_in _born            # where it was made (the fork check)
    cdef object __weakref__

    def __cinit__(self, token=None, *args, **kwargs):
        _made_here(token, "upcall.Proxy", "Bus.proxy() returns one")
        self._c = NULL
        self._born = _born_here()

    def __del__(self):
        if self._c != NULL and not _inherited(self._born) and self.running:
            try:
                warnings.warn(f"unclosed {self!r}: close it, or use it as a context manager",
                              ResourceWarning, source=self)
            finally:
                self.close()

    def __dealloc__(self):
        if self._c != NULL and not _inherited(self._born):
            with nogil:
                uc_proxy_free(self._c)
        self._c = NULL

    cdef int _check(self) except -1:
        _check_not_inherited(self._born, "Proxy")
        return 0

    def pause(self):
        """Stop forwarding, in both directions, until :meth:`resume`.

        Messages then wait in libzmq's queues: up to the frontend's
        high-water mark in the proxy, then in each publisher's own queue,
        where a publisher at its mark drops (and counts, ``pub.stats``).
        ValueError once closed."""
        self._check()
        if self._c == NULL:
            raise ValueError("pause(): the proxy is closed")
        _check_rc(uc_proxy_pause(self._c), "pause()")

    def resume(self):
        """Forward again after :meth:`pause`.  ValueError once closed."""
        self._check()
        if self._c == NULL:
            raise ValueError("resume(): the proxy is closed")
        _check_rc(uc_proxy_resume(self._c), "resume()")

    @property
    def paused(self):
        """True between :meth:`pause` and :meth:`resume`."""
        return self._c != NULL and bool(uc_proxy_paused(self._c))

    @property
    def running(self):
        """True until the proxy is closed (or its bus's context ended)."""
        return self._c != NULL and bool(uc_proxy_running(self._c))

    @property
    def stats(self):
        """What libzmq's proxy counted, as a dict (``upcall.PROXY_STATS``):

        ``messages``, ``bytes``: the publishers' messages it forwarded (a
        multipart message is one; bytes of all its frames).
        ``subscription_messages``, ``subscription_bytes``: the subscribers'
        subscribe and unsubscribe messages it passed upstream.

        There is no ``dropped``: libzmq's XPUB drops a message at a
        subscriber's full pipe without counting it anywhere.  Stamped
        publishers (``stamp=True``) let each subscriber count what it lost,
        wherever it was lost (docs/proxy.md).  After close: the counts at
        close.  TimeoutError if the proxy's thread does not answer within
        ``upcall.PROXY_STATS_TIMEOUT`` seconds.
        """
        cdef uc_proxy_totals st
        cdef int rc
        cdef int ms = <int>(PROXY_STATS_TIMEOUT * 1000)
        self._check()
        memset(&st, 0, sizeof(st))
        if self._c == NULL:
            raise ValueError("stats: the proxy is closed and released")
        with nogil:
            rc = uc_proxy_stats(self._c, &st, ms)
        if rc == UC_ERR_TIMEOUT:
            raise TimeoutError(f"stats: the proxy did not answer within {PROXY_STATS_TIMEOUT} s")
        _check_rc(rc, "stats")
        return _proxy_stats_dict(&st)

    @property
    def events(self):
        """Connection events of each side so far: ``{"frontend": {...},
        "backend": {...}}``, each keyed by ``upcall.EVENT_STATS``
        (docs/events.md)."""
        cdef uint64_t counts[<int>UC_EV_COUNT]
        out = {}
        for side, name in ((0, "frontend"), (1, "backend")):
            memset(counts, 0, sizeof(counts))
            if self._c != NULL:
                uc_proxy_events(self._c, side, counts, NULL)
            out[name] = _event_stats(counts)
        return out

    @property
    def peers(self):
        """Connections up now on each side, ``(frontend, backend)``; None
        for a side that cannot tell (inproc://); 0 once closed."""
        cdef int n
        out = []
        for side in (0, 1):
            n = 0
            if self._c != NULL and uc_proxy_running(self._c):
                uc_proxy_events(self._c, side, NULL, &n)
            out.append(None if n < 0 else n)
        return tuple(out)

    def close(self, timeout=None):
        """Stop forwarding and close both sockets (what they still queue is
        dropped: linger 0).  ``timeout``: seconds to wait for the proxy's
        thread (None: no limit; it ends as soon as it reads the command).
        Idempotent."""
        cdef int ms = _timeout_ms(timeout, "timeout")
        cdef int rc
        self._check()
        if self._c == NULL:
            return
        with nogil:
            rc = uc_proxy_close(self._c, ms)
        if rc == UC_ERR_TIMEOUT:
            raise TimeoutError(f"close(): the proxy's thread did not end within {timeout} s")
        _check_rc(rc, "close()")
        self._sinks = None           # no event callback runs now
        self._zaps = None            # the sides' allow= keys leave with the proxy
        if self._bus is not None:
            self._bus._forget(self)

    def __enter__(self):
        self._check()
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        if _inherited(self._born):
            state = f"inherited from process {self._born.pid}"
        elif not self.running:
            state = "closed"
        elif self.paused:
            state = "paused"
        else:
            state = "forwarding"
        return f"<upcall.Proxy {self.frontend} -> {self.backend} {state}>"


cdef Proxy _open_proxy(Bus bus, object frontend, object backend, dict kw):
    cdef uc_proxy_opts o
    cdef int err = 0
    cdef _ProxySide f, b
    f = _proxy_side(bus, "frontend", frontend, kw["frontend_bind"], kw["frontend_hwm"],
                    kw["frontend_curve_server"], kw["frontend_curve_serverkey"],
                    kw["frontend_curve_client"], kw["frontend_allow"],
                    kw["frontend_authenticate"], kw["frontend_socket_options"], kw["on_event"])
    b = _proxy_side(bus, "backend", backend, kw["backend_bind"], kw["backend_hwm"],
                    kw["backend_curve_server"], kw["backend_curve_serverkey"],
                    kw["backend_curve_client"], kw["backend_allow"],
                    kw["backend_authenticate"], kw["backend_socket_options"], kw["on_event"])
    memset(&o, 0, sizeof(o))
    cdef Proxy p = Proxy.__new__(Proxy, _MADE_HERE)
    try:
        _fill_side(bus, &o.frontend, f)
        _fill_side(bus, &o.backend, b)
        with nogil:
            p._c = uc_proxy_open(bus._c, &o, &err)
        e = errno
    finally:
        free(<void *>o.frontend.sockopts)
        free(<void *>o.backend.sockopts)
    if p._c == NULL:
        bus._open_failed(err, e, f"proxy({frontend!r}, {backend!r})", frontend,
                         bool(kw["frontend_bind"]))
    p._bus = bus
    p._sinks = (f.sink, b.sink)
    p.frontend = uc_proxy_endpoint(p._c, 0).decode("utf-8", "replace")
    p.backend = uc_proxy_endpoint(p._c, 1).decode("utf-8", "replace")
    f.sink.label = f"proxy frontend {p.frontend}"
    b.sink.label = f"proxy backend {p.backend}"
    # The sides' ZAP domains live as long as the proxy (their allow= keys).
    p._zaps = (f.zap, b.zap)
    return p
