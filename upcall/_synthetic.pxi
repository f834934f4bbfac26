# The synthetic source: bus.subscribe("bench://", target, count=..., payload=...,
# rate=...) runs the real delivery path (the C loop, its thread or the
# caller's, batches, trampolines, stats, close) fed by views of one payload
# instead of zmq frames, so upcall rates measure the trampolines themselves.

from upcall.includes.synth cimport (uc_synth_opts, uc_synth_open, uc_synth_info,
                                    uc_synth_info_get, uc_synth_latencies)

SYNTHETIC_PREFIX = "bench://"
_NIL = b"\xc0"


cdef object _synthetic_args(object endpoint, object count, object payload, object rate,
                            object backlog_max, object record_latency):
    """None for a socket endpoint; for "bench://" the checked arguments as a tuple."""
    if not (isinstance(endpoint, str) and endpoint.startswith(SYNTHETIC_PREFIX)):
        if (count is not None or payload is not None or rate is not None
                or backlog_max is not None or record_latency):
            raise ValueError("count, payload, rate, backlog_max and record_latency apply "
                             f"to a synthetic source (endpoint {SYNTHETIC_PREFIX!r}) only")
        return None
    if count is not None:
        if not isinstance(count, int) or isinstance(count, bool):
            raise TypeError(f"count must be an int or None, not {type(count).__name__}")
        if count < 1:
            raise ValueError(f"count must be >= 1, not {count!r}")
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
    if backlog_max is not None:
        if not isinstance(backlog_max, int) or isinstance(backlog_max, bool) or backlog_max < 1:
            raise ValueError(f"backlog_max must be an int >= 1 or None, not {backlog_max!r}")
        if rate is None:
            raise ValueError("backlog_max needs a rate (an unpaced source has no backlog)")
    if record_latency and (rate is None or count is None):
        raise ValueError("record_latency needs a rate and a count")
    return (count or 0, payload, float(rate or 0.0), backlog_max or 0, 1 if record_latency else 0)


cdef void _synthetic_opts(uc_synth_opts *o, tuple synth):
    cdef bytes payload = synth[1]
    o.count = synth[0]
    o.payload.data = <const char *>payload     # copied by uc_synth_open
    o.payload.size = len(payload)
    o.rate = synth[2]
    o.backlog_max = synth[3]
    o.record_latency = synth[4]


cdef int _set_target(Subscription sub, int kind, size_t batch) except -1:
    sub._st.kind = kind
    sub._st.c = NULL
    if kind == TARGET_NATIVE:
        sub._st.native = <PyObject *>sub._target
        sub._st.selected = <size_t *>malloc(batch * sizeof(size_t))
        if sub._st.selected == NULL:
            raise MemoryError()
    return 0


cdef object _sub_wait(Subscription sub, object timeout):
    cdef int total_ms = _timeout_ms(timeout, "timeout")
    cdef int slice_ms, rc
    if sub._c == NULL:
        return True
    if sub._caller:
        raise ValueError("wait() is for thread-mode subscriptions; in caller mode poll() "
                         "returns once the source has ended")
    deadline = time.monotonic() + total_ms / 1000.0
    while True:
        slice_ms = _SIGNAL_SLICE_MS
        if total_ms >= 0:
            slice_ms = min(slice_ms, max(0, <int>math.ceil((deadline - time.monotonic()) * 1000.0)))
        with nogil:
            rc = uc_sub_wait(sub._c, slice_ms)
        if rc == UC_OK:
            return True
        if rc == UC_ERR_BUSY:
            raise RuntimeError("wait() from inside the subscription's own target would never return")
        PyErr_CheckSignals()
        if total_ms >= 0 and time.monotonic() >= deadline:
            return False


cdef object _synthetic_info(Subscription sub):
    """produced, dropped, max_backlog, the loop's clock (start_ns, first_ns,
    last_ns: CLOCK_MONOTONIC ns), seconds (first deliver call to the end of
    the last), and latency_ns (an array('Q'), one per message in order,
    2**64-1 for a dropped one; None unless recorded and the loop has ended)."""
    cdef uc_synth_info info
    cdef uc_stats st
    cdef size_t n = 0
    cdef const uint64_t *lat
    if sub._c == NULL or not sub.endpoint.startswith(SYNTHETIC_PREFIX):
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
