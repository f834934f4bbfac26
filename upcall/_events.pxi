# Connection events (csrc/monitor.c): libzmq's socket monitor on every
# subscription and publisher, counted in C, and here logged and handed to
# on_event.
#
# The C core reads a socket's monitor on the thread that owns it (a
# subscription's loop, only when the monitor is readable; publishers on one
# process-wide monitor thread) and calls _on_conn_event once per event,
# without the GIL: it takes the GIL for that event only, so a socket whose
# connections do not change costs nothing on its receive path.
#
# Logging, on the "upcall.events" logger (its level tunes them apart from
# errors): handshake refusals (protocol, auth) at WARNING; the first failed
# connect since the socket opened or last connected at WARNING, with why
# (ConnectionEvent.cause); a handshake that
# failed with no detail (the peer hung up during it: a health check's bare
# TCP connect, a port scan, a process exiting) at INFO; the rest at DEBUG.
# Each level rate-limited as errors are (at most LOG_BURST records per
# LOG_INTERVAL seconds per socket and level; a summary record says how many
# were left out).

_event_log = logging.getLogger("upcall.events")

# (stats key, event kind, cause) of each uc_event_kind, keyed by the C
# enum's values (so that a reordering of the enum cannot mislabel).
_EVENT_NAMES = {
    UC_EV_CONNECTED: ("connected", "connected", None),
    UC_EV_CONNECT_RETRIED: ("connect_retried", "connect_retried", None),
    UC_EV_ACCEPTED: ("accepted", "accepted", None),
    UC_EV_DISCONNECTED: ("disconnected", "disconnected", None),
    UC_EV_HANDSHAKE_SUCCEEDED: ("handshakes", "handshake_succeeded", None),
    UC_EV_HANDSHAKE_FAILED_PROTOCOL: ("handshake_failed_protocol", "handshake_failed", "protocol"),
    UC_EV_HANDSHAKE_FAILED_AUTH: ("handshake_failed_auth", "handshake_failed", "auth"),
    UC_EV_HANDSHAKE_FAILED_NO_DETAIL: ("handshake_failed_no_detail", "handshake_failed",
                                       "no_detail"),
}

# The stats keys of the connection events, by the counters' index
# (uc_event_kind; a kind missing from the table fails the import).
EVENT_STATS = tuple(_EVENT_NAMES[k][0] for k in range(<int>UC_EV_COUNT))


class ConnectionEvent:
    """What happened to one connection of a subscription or a publisher,
    as handed to ``on_event``.

    ``kind``: "connected", "connect_retried", "accepted", "disconnected",
    "handshake_succeeded" or "handshake_failed"; ``cause``: for a failed
    handshake "protocol" (the peer broke the protocol: a plain peer at a
    CURVE socket, a wrong server key), "auth" (the ZAP handler refused it)
    or "no_detail"; for connect_retried "unresolved" (a tcp host name that
    does not resolve, or that refused at once) or "refused" (a connection
    was attempted and failed, to a name or an address, or an ipc path has
    no socket); else None; ``endpoint``: the endpoint it is
    about (as bound or connected); ``value``: libzmq's number for it (the
    retry interval in ms for connect_retried, the ZMQ_PROTOCOL_ERROR_*
    code for a failed handshake, an errno for no_detail, else the fd).

    ``kind`` "gap" (a subscription only, not counted with the connection
    events): messages of a stamped stream never arrived (docs/wire.md,
    "Stamps"); ``stream`` names the stream, ``first`` the first missing
    sequence number, ``count`` how many are missing (all three None for
    the other kinds)."""
    __slots__ = ("kind", "cause", "endpoint", "value", "stream", "first", "count")

    def __init__(self, kind, endpoint, cause=None, value=0, stream=None, first=None,
                 count=None):
        self.kind, self.endpoint, self.cause, self.value = kind, endpoint, cause, value
        self.stream, self.first, self.count = stream, first, count

    def __repr__(self):
        if self.kind == "gap":
            return (f"<upcall.ConnectionEvent gap {self.endpoint} stream {self.stream:#018x} "
                    f"first {self.first} count {self.count}>")
        cause = f" ({self.cause})" if self.cause else ""
        return f"<upcall.ConnectionEvent {self.kind}{cause} {self.endpoint}>"

    def __eq__(self, other):
        if not isinstance(other, ConnectionEvent):
            return NotImplemented
        return (self.kind, self.cause, self.endpoint, self.value, self.stream, self.first,
                self.count) == (other.kind, other.cause, other.endpoint, other.value,
                                other.stream, other.first, other.count)

    __hash__ = None


#: Events a publisher's on_event thread may have queued; past this, new
#: events are counted (stats) but not handed to on_event, and a warning says
#: how many were left out.  A peer can make events (connect, disconnect)
#: faster than a slow on_event takes them: this bounds what it can queue.
EVENT_QUEUE_SIZE = 1024

_event_threads = itertools.count(1)


@cython.final
cdef class _EventSink:
    """A socket's receiver of events: its on_event and its log limits.

    A subscription's events come on its own loop's thread, which calls
    on_event directly.  A publisher's come on the one monitor thread that
    every publisher of the process shares (csrc/monitor.c): there on_event
    is handed to a thread of this publisher's own (``threaded``), so that a
    slow or blocking on_event holds up only its own publisher's later
    on_event calls, never another publisher's events, counts or logs."""
    cdef str label                # "subscription tcp://..." / "publisher ..."
    cdef object on_event
    cdef _EventLog warn_log      # handshake refusals
    cdef _EventLog info_log      # handshakes that failed with no detail
    cdef _EventLog debug_log     # the rest
    cdef _EventLog gap_log       # gaps in stamped streams
    cdef long calling             # the thread running on_event now (0: none)
    cdef bint retry_said          # a failing connect was logged (until the next connected)
    cdef bint threaded            # on_event runs on a thread of its own
    cdef object queue             # (threaded) events for it, at most EVENT_QUEUE_SIZE
    cdef object cond              # (threaded) guards queue, stopping, thread
    cdef object thread
    cdef bint stopping
    cdef uint64_t left_out        # (threaded) events not queued: the queue was full

    def __cinit__(self, str label, object on_event, bint threaded=False):
        self.label = label
        self.on_event = on_event
        self.warn_log = _EventLog(logging.WARNING)
        self.info_log = _EventLog(logging.INFO)
        self.debug_log = _EventLog(logging.DEBUG)
        self.gap_log = _EventLog(logging.WARNING)
        self.threaded = threaded and on_event is not None
        if self.threaded:
            self.queue = collections.deque()
            self.cond = threading.Condition(threading.Lock())

    cdef void said_retry(self, str endpoint, str cause, uint32_t interval_ms) noexcept:
        """The first failed connect since the socket opened or last
        connected: at WARNING (rate-limited), with the reason."""
        try:
            if _event_log.isEnabledFor(logging.WARNING) and self.warn_log.admit(self.label):
                _event_log.warning("%s: connecting to %s failed: %s; libzmq retries every %d ms "
                                   "(said once until it connects)", self.label, endpoint,
                                   _retry_text(endpoint, cause), interval_ms,
                                   extra={"endpoint": endpoint, "event": "connect_retried",
                                          "cause": cause})
        except BaseException as exc:
            _event_exception(exc, self.label)

    cdef void hand_over(self, object event) noexcept:
        """Queue an event for the on_event thread (started on first use)."""
        try:
            with self.cond:
                if self.stopping:
                    return
                if len(self.queue) >= int(EVENT_QUEUE_SIZE):
                    self.left_out += 1
                    if self.left_out == 1:
                        _event_log.warning("%s: on_event does not keep up: events past %d "
                                           "queued are not handed to it (still counted)",
                                           self.label, len(self.queue))
                    return
                self.queue.append(event)
                if self.thread is None:
                    self.thread = threading.Thread(
                        target=self._deliver, daemon=True,
                        name=f"upcall-events-{next(_event_threads)}")
                    self.thread.start()
                self.cond.notify()
        except BaseException as exc:
            _event_exception(exc, self.label)

    def _deliver(self):
        """The on_event thread: every queued event, in order, until finish()."""
        while True:
            with self.cond:
                while not self.queue and not self.stopping:
                    self.cond.wait()
                if not self.queue:
                    return
                event = self.queue.popleft()
            self.calling = threading.get_ident()
            try:
                self.on_event(event)
            except BaseException as exc:
                _event_exception(exc, self.on_event)
            finally:
                self.calling = 0
            event = None

    cdef void finish(self) noexcept:
        """After the socket's close (no event comes any more): the on_event
        thread calls on_event for what is queued, then ends; waited for,
        unless this is that thread."""
        if not self.threaded:
            return
        try:
            with self.cond:
                self.stopping = True
                self.cond.notify()
                thread = self.thread
            if thread is not None and thread is not threading.current_thread():
                thread.join()
        except BaseException as exc:
            _event_exception(exc, self.label)

    cdef void handle(self, const uc_event *ev) noexcept:
        # Whatever raises while an event is handled (a Ctrl-C landing in
        # Python code run for it included) goes to _event_exception: a
        # noexcept method would print it and lose the Ctrl-C.
        try:
            self.handle_raising(ev)
        except BaseException as exc:
            _event_exception(exc, self.label)

    cdef int handle_raising(self, const uc_event *ev) except -1:
        cdef int k = <int>ev.kind
        if k == <int>UC_EV_GAP:
            self.gap(ev)
            return 0
        if k < 0 or k >= <int>UC_EV_COUNT:
            return 0
        _, kind, cause = _EVENT_NAMES[k]
        endpoint = (<bytes>ev.endpoint).decode("utf-8", "replace")
        if kind == "connect_retried":
            cause = _retry_cause(endpoint, ev.attempted)
            if not self.retry_said:
                self.retry_said = True
                self.said_retry(endpoint, cause, ev.value)
        elif kind == "connected":
            self.retry_said = False
        cdef _EventLog lim = self.debug_log
        if cause == "no_detail":
            lim = self.info_log
        elif cause is not None and kind == "handshake_failed":
            lim = self.warn_log
        try:
            if _event_log.isEnabledFor(lim.level) and lim.admit(self.label):
                if cause is not None:
                    _event_log.log(lim.level, "%s: handshake failed with a peer of %s: %s (%s)",
                                 self.label, endpoint, _CAUSE_TEXT[cause],
                                 os.strerror(ev.value) if cause == "no_detail"
                                 else f"libzmq code 0x{ev.value:08x}",
                                 extra={"endpoint": endpoint, "event": kind, "cause": cause})
                else:
                    _event_log.debug("%s: %s %s", self.label, kind.replace("_", " "), endpoint,
                               extra={"endpoint": endpoint, "event": kind})
        except BaseException as exc:
            _event_exception(exc, self.label)
        self.call(ConnectionEvent(kind, endpoint, cause, ev.value))
        return 0

    cdef void gap(self, const uc_event *ev) noexcept:
        """A gap in a stamped stream: a WARNING line (rate-limited), then
        on_event."""
        endpoint = (<bytes>ev.endpoint).decode("utf-8", "replace")
        cdef _EventLog lim = self.gap_log
        try:
            if _event_log.isEnabledFor(lim.level) and lim.admit(self.label):
                _event_log.warning("%s: lost %d message(s) of stream %#018x from number %d",
                                   self.label, ev.gap.count, ev.gap.stream, ev.gap.first,
                                   extra={"endpoint": endpoint, "event": "gap",
                                          "stream": ev.gap.stream, "first": ev.gap.first,
                                          "count": ev.gap.count})
        except BaseException as exc:
            _event_exception(exc, self.label)
        self.call(ConnectionEvent("gap", endpoint, None, 0, ev.gap.stream, ev.gap.first,
                                  ev.gap.count))

    cdef void call(self, object event) noexcept:
        if self.on_event is None:
            return
        if self.threaded:
            self.hand_over(event)
            return
        self.calling = threading.get_ident()
        try:
            self.on_event(event)
        except BaseException as exc:
            # Like a target's exception, it never stops the socket.
            _event_exception(exc, self.on_event)
        finally:
            self.calling = 0


cdef void _event_exception(BaseException exc, object where) noexcept:
    """An exception while an event was handled.  A KeyboardInterrupt is
    Ctrl-C landing while Python code ran for the event (in caller mode, on
    the main thread inside poll()): it is raised again, as a signal, for
    the next check of the poll's wait to see, instead of being lost."""
    if isinstance(exc, KeyboardInterrupt):
        PyErr_SetInterrupt()
    else:
        _write_unraisable(exc, where)


cdef str _tcp_host(str endpoint):
    """The host a tcp endpoint connects to (tcp://[source;]host:port), an
    IPv6 address without its brackets."""
    host = endpoint[len("tcp://"):].rpartition(":")[0]
    return host.rpartition(";")[2].strip("[]")


cdef extern from "<arpa/inet.h>" nogil:
    int inet_pton(int af, const char *src, void *dst)
    enum: AF_INET, AF_INET6


cdef bint _is_address(str host) noexcept:
    """host is a numeric IPv4 or IPv6 address (an IPv6 zone, %eth0, aside).
    No Python code runs here: a Ctrl-C pending while an event is handled
    must not be raised (and lost) in the middle of it."""
    cdef unsigned char addr[16]
    cdef bytes b = host.partition("%")[0].encode("utf-8", "replace")
    return inet_pton(AF_INET, b, addr) == 1 or inet_pton(AF_INET6, b, addr) == 1


cdef str _retry_cause(str endpoint, int attempted):
    """A connect_retried's cause: "unresolved" when no tcp connection could
    be started to a host name (libzmq starts one as soon as the name
    resolves), else "refused" (one was attempted and failed, or an ipc path
    has no socket).  An address never needs resolving: on loopback the
    kernel refuses a connect at once, without the attempt libzmq reports."""
    if attempted or not endpoint.startswith("tcp://") or _is_address(_tcp_host(endpoint)):
        return "refused"
    return "unresolved"


def _retry_text(endpoint, cause):
    """Why a connect failed, for a person: ConnectionEvent.cause in words."""
    if cause == "unresolved":
        return f"cannot resolve host {_tcp_host(endpoint)!r}"
    if endpoint.startswith("ipc://"):
        return "no socket listens at that path (or it refused the connection)"
    return "connection refused (nothing listens at that port, or a firewall rejects it)"


_CAUSE_TEXT = {
    "protocol": "protocol error (a plain peer at a CURVE socket, a mechanism mismatch "
                "or a wrong server key)",
    "auth": "refused by the authentication (ZAP) handler",
    "no_detail": "no detail from libzmq",
}


@cython.final
cdef class _EventLog(_RateLimit):
    """Connection-event records at one level, rate-limited as errors are
    (_errlog.pxi's _RateLimit and settings)."""
    cdef int level

    def __cinit__(self, int level):
        self.level = level

    cdef void summary(self, object label, uint64_t n, double span) noexcept:
        try:
            _event_log.log(self.level, "%s: %d more connection events in the last %.1f s "
                           "(not logged: at most %d per %g s)", label, n, span, self.burst,
                           self.end - self.start)
        except BaseException as exc:
            _event_exception(exc, label)


cdef void _on_conn_event(void *ctx, const uc_event *ev) noexcept nogil:
    """uc_event_fn: ctx is an _EventSink kept alive by its socket's owner
    (a Subscription; a Publisher's manual reference until uc_pub_close)."""
    if _python_gone():
        return
    with gil:
        (<_EventSink>ctx).handle(ev)


cdef dict _event_stats(const uint64_t *counts):
    cdef int i
    return {EVENT_STATS[i]: counts[i] for i in range(<int>UC_EV_COUNT)}
