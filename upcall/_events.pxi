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
# errors): handshake refusals (protocol, auth) at WARNING; a handshake that
# failed with no detail (the peer hung up during it: a health check's bare
# TCP connect, a port scan, a process exiting) at INFO; the rest at DEBUG.
# Each level rate-limited as errors are (at most LOG_BURST records per
# LOG_INTERVAL seconds per socket and level; a summary record says how many
# were left out).

_event_log = logging.getLogger("upcall.events")

# (stats key, event kind, cause), by uc_event_kind.
_EVENT_NAMES = (
    ("connected", "connected", None),
    ("connect_retried", "connect_retried", None),
    ("accepted", "accepted", None),
    ("disconnected", "disconnected", None),
    ("handshakes", "handshake_succeeded", None),
    ("handshake_failed_protocol", "handshake_failed", "protocol"),
    ("handshake_failed_auth", "handshake_failed", "auth"),
    ("handshake_failed_no_detail", "handshake_failed", "no_detail"),
)

# The stats keys of the connection events, in uc_event_kind order.
EVENT_STATS = tuple(row[0] for row in _EVENT_NAMES)


class ConnectionEvent:
    """What happened to one connection of a subscription or a publisher,
    as handed to ``on_event``.

    ``kind``: "connected", "connect_retried", "accepted", "disconnected",
    "handshake_succeeded" or "handshake_failed"; ``cause`` (a failed
    handshake only, else None): "protocol" (the peer broke the protocol: a
    plain peer at a CURVE socket, a wrong server key), "auth" (the ZAP
    handler refused it) or "no_detail"; ``endpoint``: the endpoint it is
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


@cython.final
cdef class _EventSink:
    """A socket's receiver of events: its on_event and its log limits."""
    cdef str label                # "subscription tcp://..." / "publisher ..."
    cdef object on_event
    cdef _RateLimit warn_log      # handshake refusals
    cdef _RateLimit info_log      # handshakes that failed with no detail
    cdef _RateLimit debug_log     # the rest
    cdef _RateLimit gap_log       # gaps in stamped streams
    cdef long calling             # the thread running on_event now (0: none)

    def __cinit__(self, str label, object on_event):
        self.label = label
        self.on_event = on_event
        self.warn_log = _RateLimit(logging.WARNING)
        self.info_log = _RateLimit(logging.INFO)
        self.debug_log = _RateLimit(logging.DEBUG)
        self.gap_log = _RateLimit(logging.WARNING)

    cdef void handle(self, const uc_event *ev) noexcept:
        cdef int k = <int>ev.kind
        if k == <int>UC_EV_GAP:
            self.gap(ev)
            return
        if k < 0 or k >= <int>UC_EV_COUNT:
            return
        _, kind, cause = _EVENT_NAMES[k]
        endpoint = (<bytes>ev.endpoint).decode("utf-8", "replace")
        cdef _RateLimit lim = self.debug_log
        if cause == "no_detail":
            lim = self.info_log
        elif cause is not None:
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

    cdef void gap(self, const uc_event *ev) noexcept:
        """A gap in a stamped stream: a WARNING line (rate-limited), then
        on_event."""
        endpoint = (<bytes>ev.endpoint).decode("utf-8", "replace")
        cdef _RateLimit lim = self.gap_log
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


_CAUSE_TEXT = {
    "protocol": "protocol error (a plain peer at a CURVE socket, a mechanism mismatch "
                "or a wrong server key)",
    "auth": "refused by the authentication (ZAP) handler",
    "no_detail": "no detail from libzmq",
}


@cython.final
cdef class _RateLimit:
    """At most LOG_BURST records per LOG_INTERVAL seconds (_errlog.pxi's
    settings) at one level; then one summary of those left out."""
    cdef int level
    cdef double end
    cdef long burst, logged
    cdef double start
    cdef uint64_t left_out

    def __cinit__(self, int level):
        self.level = level

    cdef bint admit(self, str label) except -1:
        cdef double now = _now()
        if now >= self.end:
            if self.left_out:
                _event_log.log(self.level, "%s: %d more connection events in the last %.1f s "
                         "(not logged: at most %d per %g s)", label, self.left_out,
                         min(now, self.end) - self.start, self.burst, self.end - self.start)
                self.left_out = 0
            self.start = now
            try:
                self.end = now + float(LOG_INTERVAL)
                self.burst = int(LOG_BURST)
            except Exception:
                self.end = now + 10.0
                self.burst = 10
            self.logged = 0
        if self.logged < self.burst:
            self.logged += 1
            return True
        self.left_out += 1
        return False


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
