# The synthetic source: a subscription fed by views of one payload instead of
# zmq frames.  It runs the real delivery path (the C loop, its thread or the
# caller's, batches, trampolines, stats, close), so that upcall rates measure
# the trampolines themselves.  Private, for the benchmark and the tests:
# _synthetic_subscribe() opens one, _synthetic_info() reads its figures.

from upcall.includes.synth cimport (uc_synth_opts, uc_synth_open, uc_synth_info,
                                    uc_synth_info_get, uc_synth_latencies)

_NIL = b"\xc0"

# What Subscription.endpoint says for a synthetic source.
_SYNTHETIC_ENDPOINT = "synthetic source"

# The subscribe() keyword arguments that apply to a synthetic source (the
# rows of _options.pxi marked _IN_SYNTHETIC); the others configure a zmq socket.
_SYNTHETIC_SUBSCRIBE_KWARGS = tuple(row.name for row in _SUBSCRIBE_OPTIONS
                                    if row.scope & _IN_SYNTHETIC)


@cython.final
cdef class _SyntheticSource(_Source):
    """The checked arguments of _synthetic_subscribe(), until the loop is made."""
    cdef bytes payload
    cdef uint64_t count
    cdef double rate
    cdef uint64_t backlog_max
    cdef int record_latency

    cdef uc_sub *open(self, uc_bus *bus, const uc_sub_opts *o, int *err) noexcept:
        cdef uc_synth_opts so
        memset(&so, 0, sizeof(so))
        so.count = self.count
        so.payload.data = <const char *>self.payload     # copied by uc_synth_open
        so.payload.size = len(self.payload)
        so.rate = self.rate
        so.backlog_max = self.backlog_max
        so.record_latency = self.record_latency
        return uc_synth_open(bus, o, &so, err)


def _synthetic_subscribe(Bus bus not None, target, *, count=None, payload=None, rate=None,
                         backlog_max=None, record_latency=False, gil="adopt",
                         **subscribe_kwargs):
    """A subscription of ``target`` to a synthetic source on ``bus``.

    ``count`` messages (None: no end; the subscription ends by itself after
    the last, see ``sub.wait()``), each ``payload`` (msgpack bytes, default
    nil) with an empty topic, offered at ``rate`` messages/s (None: as fast
    as they are taken).  ``backlog_max``: a paced source drops what is due
    beyond this backlog (counted as dropped).  ``record_latency``: keep each
    message's delay from its due time (paced, with a count), for
    _synthetic_info().  ``gil``: "adopt" (what subscribe() does) or
    "per-upcall" (PyGILState_Ensure around every message).
    ``subscribe_kwargs``: subscribe()'s batch, delivery, thread_factory,
    with_topic, on_error, decoder and raw.
    """
    cdef _SyntheticSource source = _SyntheticSource.__new__(_SyntheticSource)
    for name in subscribe_kwargs:
        if name not in _SYNTHETIC_SUBSCRIBE_KWARGS:
            raise TypeError(f"unexpected keyword argument {name!r}: of subscribe()'s, a "
                            f"synthetic source takes only {', '.join(_SYNTHETIC_SUBSCRIBE_KWARGS)}")
    opts = SubscribeOptions(**subscribe_kwargs)
    count = int_arg(count, "count", 1, 2 ** 64 - 1, "None: no end", or_none=True)
    if payload is None:
        payload = _NIL
    elif isinstance(payload, (bytes, bytearray, memoryview)):
        payload = bytes(payload)
    else:
        raise TypeError(f"payload must be msgpack bytes, not {type(payload).__name__}")
    if rate is not None:
        if not isinstance(rate, (int, float)) or isinstance(rate, bool):
            raise TypeError(f"rate must be a number of messages/s or None, not {type(rate).__name__}")
        if not 0 < rate < 1e12:
            raise ValueError(f"rate must be > 0, not {rate!r}")
    backlog_max = int_arg(backlog_max, "backlog_max", 1, 2 ** 64 - 1, "None: no limit",
                          or_none=True)
    if backlog_max is not None:
        if rate is None:
            raise ValueError("backlog_max needs a rate (an unpaced source has no backlog)")
    if record_latency and (rate is None or count is None):
        raise ValueError("record_latency needs a rate and a count")
    if gil not in ("adopt", "per-upcall"):
        raise ValueError(f"gil must be 'adopt' or 'per-upcall', not {gil!r}")
    source.count = count or 0
    source.payload = payload
    source.rate = float(rate or 0.0)
    source.backlog_max = backlog_max or 0
    source.record_latency = 1 if record_latency else 0
    return bus._open_subscription(_SYNTHETIC_ENDPOINT, target, opts,
                                  GIL_PER_UPCALL if gil == "per-upcall" else GIL_ADOPT, source)


def _synthetic_info(Subscription sub not None):
    """A synthetic source's figures as a dict (None for a socket): produced,
    dropped, max_backlog, the loop's clock (start_ns, first_ns, last_ns:
    CLOCK_MONOTONIC ns), seconds (first deliver call to the end of the last),
    and latency_ns (an array('Q'), one per message in order, 2**64-1 for a
    dropped one; None unless recorded and the loop has ended)."""
    cdef uc_synth_info info
    cdef uc_stats st
    cdef size_t n = 0
    cdef const uint64_t *lat
    if sub._c == NULL or not isinstance(sub._source, _SyntheticSource):
        return None
    uc_synth_info_get(sub._c, &info)
    uc_sub_stats(sub._c, &st)
    latency = None
    if uc_sub_finished(sub._c):
        lat = uc_synth_latencies(sub._c, &n)
        if lat != NULL:
            import array
            latency = array.array("Q")
            latency.frombytes(PyBytes_FromStringAndSize(<const char *>lat, n * sizeof(uint64_t)))
    seconds = (info.last_ns - info.first_ns) / 1e9 if info.first_ns else 0.0
    return {"produced": info.produced, "dropped": st.dropped, "max_backlog": info.max_backlog,
            "start_ns": info.start_ns, "first_ns": info.first_ns, "last_ns": info.last_ns,
            "seconds": seconds, "latency_ns": latency}
