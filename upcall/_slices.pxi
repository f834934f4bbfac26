# Waiting in slices: a blocking call (poll, close, wait, send at the
# high-water mark) runs its C wait in short slices without the GIL and runs
# the signal handlers in between, so Ctrl-C raises KeyboardInterrupt within
# a slice whatever the timeout.

# A long wait wakes at least this often to let signals (Ctrl-C) in.
cdef int _SIGNAL_SLICE_MS = 200
# Bus.wait()'s sleep between two looks at the bus's closing flag: how late it
# may return after a close (it cannot wait on the Event's lock: see there).
cdef int _WAIT_POLL_MS = 20


# Steps of a wait in signal slices (see _in_signal_slices): run the C call on
# ``owner`` (the Subscription or Publisher waiting) for at most slice_ms
# without the GIL; 1: done, 0: not yet.
ctypedef int (*_slice_step)(object owner, int slice_ms, void *arg) except -1


cdef int _in_signal_slices(object owner, _slice_step step, void *arg, int total_ms) except -1:
    """Run ``step`` until it is done (1) or ``total_ms`` (-1: no limit) have
    passed (0), in slices of at most _SIGNAL_SLICE_MS with signal handlers
    run in between: Ctrl-C raises KeyboardInterrupt here, even while the C
    core would wait for much longer."""
    cdef int slice_ms
    deadline = time.monotonic() + total_ms / 1000.0
    while True:
        slice_ms = _SIGNAL_SLICE_MS
        if total_ms >= 0:
            slice_ms = min(slice_ms, max(0, <int>math.ceil((deadline - time.monotonic()) * 1000.0)))
        if step(owner, slice_ms, arg):
            return 1
        PyErr_CheckSignals()
        if total_ms >= 0 and time.monotonic() >= deadline:
            return 0
