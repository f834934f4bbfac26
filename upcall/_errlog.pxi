# Error reports without on_error: records on logging.getLogger("upcall"),
# rate-limited per subscription.
#
# A sender of malformed messages, or a target that fails on every message,
# must not turn each message into a log record: 20,000 tracebacks cost far
# more than the messages themselves and bury everything else in the log.  So
# each subscription logs at most LOG_BURST errors of each kind (decode errors,
# target errors) per LOG_INTERVAL seconds; the rest of that interval are only
# counted (they are in sub.stats as well), and one summary record says how
# many were left out: when the next error of that kind comes after the
# interval, or when the subscription closes.  Counting a left-out error is a
# monotonic clock read and two compares, cheaper than calling an on_error.

from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

_log = logging.getLogger("upcall")

# Read when an interval opens, so tests and applications may change them.
LOG_BURST = 10          # records per interval, per subscription and kind
LOG_INTERVAL = 10.0     # seconds


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef class _RateLimit:
    """At most LOG_BURST records per LOG_INTERVAL seconds, the rest only
    counted, then one summary of those left out (summary(), a subclass's):
    when the next one comes after the interval, or at flush().  The one
    limiter of upcall's log records: errors here, connection events in
    _events.pxi."""
    cdef double start             # the interval: [start, end); end 0: none open
    cdef double end
    cdef long burst               # LOG_BURST when the interval opened
    cdef long logged
    cdef uint64_t left_out

    cdef bint admit(self, object about) noexcept:
        """True: log this one; False: it is only counted.  ``about``: what
        the summary is about (passed to it)."""
        cdef double now = _now()
        if now >= self.end:
            self.flush(about, now)
            self.start = now
            try:
                self.end = now + float(LOG_INTERVAL)
                self.burst = int(LOG_BURST)
            except Exception:           # a bad setting: the defaults
                self.end = now + 10.0
                self.burst = 10
            self.logged = 0
        if self.logged < self.burst:
            self.logged += 1
            return True
        self.left_out += 1
        return False

    cdef void flush(self, object about, double now) noexcept:
        """The summary record of the interval, if any were left out."""
        cdef uint64_t n = self.left_out
        if n == 0:
            return
        self.left_out = 0
        self.summary(about, n, min(now, self.end) - self.start)

    cdef void summary(self, object about, uint64_t n, double span) noexcept:
        """One record: n left out over the last span seconds (never raises)."""
        pass


@cython.final
cdef class _ErrorLog(_RateLimit):
    """How many errors of one kind one subscription has logged, and left
    out, in the current interval."""
    cdef str what                 # "decode errors" / "target errors"

    def __cinit__(self, str what):
        self.what = what

    cdef void summary(self, object sub, uint64_t n, double span) noexcept:
        try:
            _log.error("%r: %d more %s in the last %.1f s (not logged: at most %d "
                       "per %g s per subscription; upcall._bus.LOG_BURST, LOG_INTERVAL)",
                       sub, n, self.what, span, self.burst,
                       self.end - self.start, extra={"subscription": sub, "left_out": n})
        except BaseException as exc:
            _write_unraisable(exc, sub)


cdef void _log_error(object sub, _ErrorLog log, BaseException exc, object topic,
                     bint decoding) noexcept:
    """Report exc (no on_error): a record on the "upcall" logger, if the rate
    limit lets it through.  A logging setup that raises (a failing filter)
    sends the error to sys.unraisablehook instead; nothing stops delivery."""
    if not log.admit(sub):
        return
    try:
        if decoding:
            # No traceback: it would only show upcall's decoder; the error
            # says the byte offset and the reason.
            _log.error("%r: decode error on topic %r in thread %s: %s",
                       sub, topic, threading.current_thread().name, exc,
                       extra={"subscription": sub, "topic": topic})
        else:
            # topic None: a Handler's on_batch raised, for a whole batch.
            _log.error("%r: the target raised on %s in thread %s; delivery goes on",
                       sub, "a batch" if topic is None else f"topic {topic!r}",
                       threading.current_thread().name, exc_info=exc,
                       extra={"subscription": sub, "topic": topic})
    except BaseException as log_exc:
        _write_unraisable(log_exc, sub)
        _write_unraisable(exc, sub)
