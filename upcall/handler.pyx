# cython: language_level=3
"""Extension-type targets for the bus: :class:`Handler` and an example, :class:`Counter`.

``bus.subscribe(endpoint, handler)`` with a Handler instance makes the
delivery trampoline call ``handler.on_message(msg)`` through the extension
type's vtable (a C function call, no argument tuple).  Cython code subclasses
it with ``from upcall.handler cimport Handler``; Python code may subclass it
too (the override is found through the normal Python call, so it is as fast as
a plain function target, not faster).
"""
cimport cython
from cpython.object cimport PyTypeObject


cdef class Handler:
    """Handler(*args, **kwargs)
--

Base class of extension-type targets.

    Override ``on_message(self, msg)``; with ``with_topic=True`` the bus
    calls ``on_topic_message(self, topic, msg)`` instead, which by default
    calls ``on_message(msg)``.  Set ``self.batches = True`` to receive each
    batch (one GIL crossing's messages) as a list in ``on_batch(self, msgs)``.
    A Handler is also callable (``handler(msg)`` calls ``on_message``), so it
    can be used wherever a callable target is expected.
    """

    def __init__(self, *args, **kwargs):
        pass

    cpdef on_message(self, object msg):
        raise NotImplementedError(f"{type(self).__name__} must override on_message")

    cpdef on_topic_message(self, bytes topic, object msg):
        return self.on_message(msg)

    cpdef on_batch(self, list msgs):
        cdef object m
        for m in msgs:
            self.on_message(m)

    def __call__(self, msg):
        return self.on_message(msg)


@cython.final
cdef class Counter(Handler):
    """Counter(batches=False)
--

Counts the messages it receives and keeps the last one.

    ``Counter(batches=False)``: with ``batches=True`` it takes whole batches.
    """

    def __init__(self, batches=False):
        self.batches = bool(batches)

    cpdef on_message(self, object msg):
        self.count += 1
        self.last = msg

    cpdef on_topic_message(self, bytes topic, object msg):
        self.count += 1
        self.last = (topic, msg)

    cpdef on_batch(self, list msgs):
        self.count += len(msgs)
        if msgs:
            self.last = msgs[len(msgs) - 1]

    def __repr__(self):
        return f"<upcall.Counter count={self.count}>"


def _call_loop(target, Py_ssize_t n, msg=None):
    """For the benchmark (private): call ``target(msg)`` n times from a C loop, GIL held.

    The ceiling an upcall can reach on this thread: for a Handler the call
    goes through the vtable (as the trampoline makes it), for anything else
    with Cython's one-argument call (as the trampoline makes it).  Returns n.
    """
    cdef Py_ssize_t i
    cdef Handler h
    if isinstance(target, Handler):
        h = <Handler>target
        for i in range(n):
            h.on_message(msg)
    else:
        for i in range(n):
            target(msg)
    return n


# Public types read as upcall.X (reprs, error messages, help()); Python and
# Cython subclasses, and cimport, are unaffected.
(<PyTypeObject *>Handler).tp_name = b"upcall.Handler"
(<PyTypeObject *>Counter).tp_name = b"upcall.Counter"
