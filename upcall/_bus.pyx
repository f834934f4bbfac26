# cython: language_level=3
"""The bus: subscriptions delivering decoded msgpack messages to Python
callables on native or Python-made threads, and publishers.

One extension module built from one .pxi per concept, included in this order:
  _trampoline.pxi   the trampolines: C delivery callbacks that carry a batch across the GIL
  _threads.pxi      thread factories: who creates the thread a subscription's loop runs on
  _subscription.pxi Subscription: one receive loop delivering decoded messages to one target
  _publisher.pxi    Publisher: a PUB or PUSH socket sending [topic, msgpack payload]
  _curve.pxi        CURVE security: key pairs and the per-socket roles
  _targets.pxi      targets: which kind a target is, what its loop keeps for it, whole batches
  _synthetic.pxi    the synthetic source: a subscription fed by views of one payload, no zmq
and, here, C return codes -> exceptions, the registry that closes every bus
before interpreter exit, Bus, and the private entry points that open what
Bus.subscribe() does not offer users.
"""
cimport cython
from libc.errno cimport errno, EINVAL, EPROTONOSUPPORT
from libc.stdint cimport uint64_t, int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset, strncpy
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals, PyErr_Restore, PyErr_WriteUnraisable
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF

from upcall.includes.bus cimport *
from upcall.includes.python cimport *
from upcall.includes.zmq cimport ETERM
from upcall.includes.msgpack cimport mp_writer, mp_writer_init, mp_writer_free
from upcall._codec cimport Encoder, Decoder
from upcall.handler cimport Handler
from upcall.native cimport NativeHandler

import atexit
import itertools
import math
import threading
import time

from upcall._codec import DecodeError


class StopDelivery(Exception):
    """Raise from a target to end its subscription cleanly (no error is reported)."""


# ---- C return codes -> exceptions -----------------------------------------

cdef int _check_rc(int rc, str what, int timeout_ms=-1) except -1:
    """The one place where a C return code becomes an exception.

    UC_OK returns 0; anything else raises, naming ``what`` (the call that
    failed).  ``timeout_ms`` is that call's timeout: with UC_ERR_AGAIN it
    tells "would block" (0) from "timed out" (> 0).  For UC_ERR_ZMQ and
    UC_ERR_SYS, errno (read before anything can change it) says why.
    """
    if rc == UC_OK:
        return 0
    err = errno
    reason = uc_strerror(rc, err).decode("utf-8", "replace")
    if rc == UC_ERR_ZMQ or rc == UC_ERR_SYS:
        if rc == UC_ERR_ZMQ and err == ETERM:
            raise ValueError(f"{what}: the bus was closed")
        if err in (EINVAL, EPROTONOSUPPORT):
            raise ValueError(f"{what}: {reason}")
        raise OSError(err, f"{what}: {reason}")
    if rc == UC_ERR_AGAIN:
        if timeout_ms > 0:
            raise TimeoutError(f"{what} did not complete within {timeout_ms} ms "
                               "(high-water mark reached)")
        raise BlockingIOError(f"{what} {reason}")
    if rc == UC_ERR_ARG or rc == UC_ERR_CLOSED:
        raise ValueError(f"{what}: {reason}")
    if rc == UC_ERR_NOMEM:
        raise MemoryError(f"{what}: {reason}")
    if rc == UC_ERR_TIMEOUT:
        raise TimeoutError(f"{what}: {reason}")
    if rc == UC_ERR_BUSY:
        # From Python, the mode was checked before: the loop is busy on this
        # call's own path (a target calling it) or on another thread.
        raise RuntimeError(f"{what} refused: the subscription's loop is busy (this is "
                           "its own target calling, or another thread is polling it)")
    raise RuntimeError(f"{what}: {reason}")


include "_trampoline.pxi"
include "_threads.pxi"
include "_subscription.pxi"
include "_publisher.pxi"
include "_curve.pxi"
include "_targets.pxi"
include "_synthetic.pxi"


# ---- the registry: every open bus is closed before finalization ----------

# How long closing at exit waits for targets still running.
EXIT_TIMEOUT = 5.0

_open_buses = set()
_exit_hook_installed = False


def _close_all_at_exit():
    """Close every open bus before the interpreter finalizes.

    Registered with threading's exit hooks, which run before Python waits for
    non-daemon threads (so a loop running on an executor's thread is stopped
    before the executor waits for it) and long before finalization.
    """
    global _exiting
    _exiting = 1          # loops stop instead of starting another batch
    for bus in list(_open_buses):
        try:
            bus.close(timeout=EXIT_TIMEOUT)
        except Exception as exc:  # a stuck target: report, do not hang exit
            import sys
            print(f"upcall: at exit: {exc}", file=sys.stderr)


def _install_exit_hook():
    # threading's hooks run in reverse order of registration; registering
    # (again) after anything else keeps ours ahead of e.g. concurrent.futures,
    # which would otherwise wait for a worker that is running one of our loops.
    global _exit_hook_installed
    hooks = getattr(threading, "_threading_atexits", None)
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        if not _exit_hook_installed:
            atexit.register(_close_all_at_exit)
    elif hooks is None or not hooks or hooks[-1] is not _close_all_at_exit:
        try:
            register(_close_all_at_exit)
        except RuntimeError:       # already shutting down
            pass
    _exit_hook_installed = True


# ---- Bus --------------------------------------------------------------------

cdef object _check_factory(object factory, str name):
    if factory is None or factory is native_threads or callable(factory):
        return factory
    raise TypeError(f"{name} must be callable, upcall.native_threads, "
                    f"upcall.python_threads or None, not {type(factory).__name__}")


cdef bytes _endpoint_bytes(object endpoint):
    if not isinstance(endpoint, str):
        raise TypeError(f"endpoint must be a str such as 'tcp://127.0.0.1:5556', "
                        f"not {type(endpoint).__name__}")
    if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError(f"endpoint must start with tcp://, ipc:// or inproc://: {endpoint!r}")
    return (<str>endpoint).encode("utf-8")


cdef int _hwm(object value, str name) except -2:
    if value is None:
        return -1
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int or None, not {type(value).__name__}")
    if value < 0 or value > 2 ** 31 - 1:
        raise ValueError(f"{name} must be >= 0 (0: no limit), not {value!r}")
    return value


cdef bytes _topic_bytes(object topic):
    if isinstance(topic, str):
        return (<str>topic).encode("utf-8")
    if isinstance(topic, (bytes, bytearray, memoryview)):
        return bytes(topic)
    raise TypeError(f"a topic must be bytes or str, not {type(topic).__name__}")


@cython.final
cdef class Bus:
    """A zmq context and every subscription and publisher opened on it.

    ``Bus(io_threads=1, thread_factory=None)``: ``io_threads`` are libzmq's
    I/O threads; ``thread_factory`` is the default for subscriptions
    (None or ``upcall.native_threads``: the core's own threads;
    ``upcall.python_threads``; or any callable ``factory(run)``).
    A context manager: leaving it closes everything.
    """
    cdef uc_bus *_c
    cdef object _factory
    cdef set _subs
    cdef set _pubs
    cdef bint _closed

    def __cinit__(self):
        self._c = NULL

    def __init__(self, io_threads=1, thread_factory=None):
        cdef int err = 0
        if not isinstance(io_threads, int) or isinstance(io_threads, bool):
            raise TypeError(f"io_threads must be an int, not {type(io_threads).__name__}")
        if not 0 <= io_threads <= 64:
            raise ValueError(f"io_threads must be between 0 and 64, not {io_threads!r}")
        self._factory = _check_factory(thread_factory, "thread_factory")
        self._subs = set()
        self._pubs = set()
        self._c = uc_bus_new(io_threads, &err)
        if self._c == NULL:
            _check_rc(err, "Bus()")
        _open_buses.add(self)
        _install_exit_hook()

    def __dealloc__(self):
        if self._c != NULL:
            with nogil:
                uc_bus_free(self._c)
            self._c = NULL

    def __repr__(self):
        state = "closed" if self._closed else f"{len(self._subs)} subscriptions, {len(self._pubs)} publishers"
        return f"<upcall.Bus {state}>"

    @property
    def closed(self):
        return self._closed

    cdef _check_open(self):
        if self._closed:
            raise ValueError("the bus is closed")

    def subscribe(self, endpoint, target, *, topics=(b"",), kind="sub", bind=False,
                  batch=None, delivery="thread", thread_factory=None, with_topic=False,
                  on_error=None, rcvhwm=None, max_message_size=None,
                  curve_server=None, curve_serverkey=None, curve_client=None):
        """Deliver each message arriving at ``endpoint`` to ``target``.

        ``target(msg)`` gets the decoded payload (``target(topic, msg)`` with
        ``with_topic=True``).  ``kind``: "sub" (topic prefix filtering with
        ``topics``) or "pull".  ``bind``: bind instead of connect.  ``batch``:
        most messages per GIL crossing (None: DEFAULT_BATCH).  ``delivery``:
        "thread" (a loop on a thread from ``thread_factory``) or "caller"
        (no thread: call ``poll()``).  ``on_error(exc, msg)`` receives
        exceptions raised by the target and decode errors (default:
        sys.unraisablehook).  ``rcvhwm``: zmq receive high-water mark (0: no
        limit).  ``max_message_size``: bytes; larger messages are refused by
        libzmq (ZMQ_MAXMSGSIZE).
        CURVE encryption (docs/security.md): ``curve_server=(public, secret)``
        makes this end the CURVE server; ``curve_serverkey=public`` (the
        server's) makes it a client, with ``curve_client=(public, secret)`` or
        a fresh pair.
        ``target`` may also be an ``upcall.Handler`` (its ``on_message`` is
        called through the vtable) or an ``upcall.native.NativeHandler`` (it
        runs without the GIL and upcalls only what it selects).
        """
        return self._open_subscription(
            endpoint, target, topics, kind, bind, batch, delivery, thread_factory, with_topic,
            on_error, rcvhwm, max_message_size, curve_server, curve_serverkey, curve_client,
            GIL_ADOPT, None)

    cdef Subscription _open_subscription(
            self, object endpoint, object target, object topics, object kind, object bind,
            object batch, object delivery, object thread_factory, object with_topic,
            object on_error, object rcvhwm, object max_message_size, object curve_server,
            object curve_serverkey, object curve_client, int gil_mode, _Source source):
        """subscribe()'s body, which the private entry points share: they add a
        GIL mode (GIL_ADOPT or GIL_PER_UPCALL) and a source (None: a zmq
        socket on ``endpoint``; else ``source.open`` makes the loop)."""
        cdef uc_sub_opts o
        cdef int err = 0
        cdef Py_ssize_t i
        cdef uc_frame *frames = NULL
        self._check_open()
        ep = _endpoint_bytes(endpoint) if source is None else b""
        target_kind = _target_kind(target)
        if on_error is not None and not callable(on_error):
            raise TypeError(f"on_error must be callable or None, not {type(on_error).__name__}")
        if kind not in ("sub", "pull"):
            raise ValueError(f"kind must be 'sub' or 'pull', not {kind!r}")
        if delivery not in ("thread", "caller"):
            raise ValueError(f"delivery must be 'thread' or 'caller', not {delivery!r}")
        if batch is None:
            batch = DEFAULT_BATCH
        elif not isinstance(batch, int) or isinstance(batch, bool):
            raise TypeError(f"batch must be an int or None, not {type(batch).__name__}")
        elif not 1 <= batch <= 1_000_000:
            raise ValueError(f"batch must be between 1 and 1000000, not {batch!r}")
        if isinstance(topics, (bytes, str)):
            raise TypeError("topics must be an iterable of bytes/str prefixes, "
                            "not a single bytes/str (wrap it in a list)")
        try:
            topic_list = [_topic_bytes(t) for t in topics]
        except TypeError as exc:
            raise TypeError(f"topics: {exc}") from None
        if kind == "pull" and topic_list not in ([], [b""]):
            raise ValueError("topics apply to kind='sub' only; a pull socket receives everything")
        factory = _check_factory(thread_factory, "thread_factory")
        if factory is None:
            factory = self._factory
        mms = -1
        if max_message_size is not None:
            if not isinstance(max_message_size, int) or isinstance(max_message_size, bool):
                raise TypeError("max_message_size must be an int or None")
            if max_message_size < 1:
                raise ValueError(f"max_message_size must be >= 1, not {max_message_size!r}")
            mms = max_message_size
        curve = _curve_keys(endpoint, curve_server, curve_serverkey, curve_client)

        cdef Subscription sub = Subscription.__new__(Subscription)
        sub._bus = self
        sub.endpoint = endpoint
        sub._source = source
        sub._target = target
        sub._on_error = on_error
        sub._decoder = Decoder()
        sub._with_topic = bool(with_topic)
        sub._caller = delivery == "caller"
        sub._topics = tuple(topic_list)
        sub._st.gil_mode = gil_mode
        sub._st.owner = <PyObject *>sub
        sub._st.adopted = 0
        _set_target(sub, target_kind, batch)

        memset(&o, 0, sizeof(o))
        o.kind = UC_SUB if kind == "sub" else UC_PULL
        o.endpoint = ep
        o.bind = 1 if bind else 0
        o.batch = batch
        o.rcvhwm = _hwm(rcvhwm, "rcvhwm")
        o.max_message_size = mms
        _fill_curve(&o.curve, curve)
        o.deliver = _deliver
        o.ctx = &sub._st
        if kind == "sub":
            frames = <uc_frame *>malloc(max(1, len(topic_list)) * sizeof(uc_frame))
            if frames == NULL:
                raise MemoryError()
            for i, t in enumerate(topic_list):
                frames[i].data = <const char *>(<bytes>t)
                frames[i].size = len(<bytes>t)
            o.topics = frames
            o.n_topics = len(topic_list)
        if not sub._caller:
            o.on_exit = _loop_exit
            sub._run_name = _next_thread_name()
            if factory is None or factory is native_threads:
                sub._run_name_b = sub._run_name.encode() + b"\0"
                sub._thread_name = sub._run_name
                o.start = _start_native
                o.start_ctx = <void *><const char *>sub._run_name_b
            else:
                if factory is python_threads:
                    sub._thread_name = sub._run_name
                sub._factory = factory
                o.start = _start_python
                o.start_ctx = <void *>sub
                _install_exit_hook()   # stay ahead of e.g. concurrent.futures' hook
            Py_INCREF(sub)             # the loop's reference, dropped by _loop_exit
        try:
            if source is None:
                sub._c = uc_sub_open(self._c, &o, &err)
            else:
                sub._c = source.open(self._c, &o, &err)
        finally:
            free(frames)
        if sub._c == NULL:
            sub._st.owner = NULL
            if not sub._caller:
                Py_DECREF(sub)         # the loop will never run
            if sub._start_error is not None:
                raise sub._start_error
            _check_rc(err, f"subscribe({endpoint!r})")
        self._subs.add(sub)
        return sub

    def publisher(self, endpoint, *, kind="pub", bind=True, sndhwm=None, linger=2.0,
                  curve_server=None, curve_serverkey=None, curve_client=None):
        """Open a PUB (``kind="pub"``) or PUSH (``kind="push"``) socket.

        ``bind``: bind (default) or connect.  ``sndhwm``: zmq send high-water
        mark (0: no limit).  ``linger``: seconds that unsent messages may keep
        the socket open at close.  ``curve_server``, ``curve_serverkey``,
        ``curve_client``: CURVE encryption, as for :meth:`subscribe`.
        """
        cdef uc_pub_opts o
        cdef int err = 0
        self._check_open()
        ep = _endpoint_bytes(endpoint)
        if kind not in ("pub", "push"):
            raise ValueError(f"kind must be 'pub' or 'push', not {kind!r}")
        curve = _curve_keys(endpoint, curve_server, curve_serverkey, curve_client)
        memset(&o, 0, sizeof(o))
        o.kind = UC_PUB if kind == "pub" else UC_PUSH
        o.endpoint = ep
        o.bind = 1 if bind else 0
        o.sndhwm = _hwm(sndhwm, "sndhwm")
        o.linger_ms = _timeout_ms(linger, "linger")
        _fill_curve(&o.curve, curve)
        cdef Publisher pub = Publisher.__new__(Publisher)
        pub._bus = self
        pub.endpoint = endpoint
        pub._encoder = Encoder()
        pub._c = uc_pub_open(self._c, &o, &err)
        if pub._c == NULL:
            _check_rc(err, f"publisher({endpoint!r})")
        self._pubs.add(pub)
        return pub

    cdef _forget(self, obj):
        self._subs.discard(obj)
        self._pubs.discard(obj)

    def close(self, timeout=None):
        """Close every subscription (waiting up to ``timeout`` seconds for
        each) and publisher, then the zmq context.  Safe from inside a target."""
        if self._closed:
            return
        self._closed = True
        _open_buses.discard(self)
        cdef uc_bus *c
        subs = list(self._subs)
        errors = []
        for sub in subs:
            try:
                sub.close(timeout)
            except TimeoutError as exc:
                errors.append(exc)
        for pub in list(self._pubs):
            pub.close()
        # Shut the context down now.  It is terminated once its last socket
        # is closed: at once, or, for a loop that is still running (closed
        # from inside its own target, or stuck), when that loop ends.
        c = self._c
        self._c = NULL
        with nogil:
            uc_bus_free(c)
        if errors:
            raise TimeoutError(f"{len(errors)} subscription(s) did not stop: {errors[0]}")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


# ---- private entry points: what Bus.subscribe() does not offer users ---------
#
# The benchmark (and the tests) open subscriptions with a GIL mode or a source
# that users have no use for.  They take subscribe()'s keyword arguments, with
# its defaults, and share its body.

cdef Subscription _subscribe_privately(Bus bus, object endpoint, object target, int gil_mode,
                                       _Source source, dict subscribe_kwargs):
    """``bus.subscribe(endpoint, target, **subscribe_kwargs)``, opened with
    ``gil_mode`` and ``source`` (see Bus._open_subscription)."""
    defaults = Bus.subscribe.__kwdefaults__   # its signature is the one place they are written
    for name in subscribe_kwargs:
        if name not in defaults:
            raise TypeError(f"unexpected keyword argument {name!r}: "
                            "Bus.subscribe() has no such argument")
    kw = {**defaults, **subscribe_kwargs}
    return bus._open_subscription(
        endpoint, target, kw["topics"], kw["kind"], kw["bind"], kw["batch"], kw["delivery"],
        kw["thread_factory"], kw["with_topic"], kw["on_error"], kw["rcvhwm"],
        kw["max_message_size"], kw["curve_server"], kw["curve_serverkey"], kw["curve_client"],
        gil_mode, source)


def _subscribe_per_upcall(Bus bus not None, endpoint, target, **subscribe_kwargs):
    """``bus.subscribe(endpoint, target, **subscribe_kwargs)`` with the classic
    PyGILState_Ensure/Release around every message instead of an adopted
    thread state: what adoption saves is measured against it (docs/threads.md)."""
    return _subscribe_privately(bus, endpoint, target, GIL_PER_UPCALL, None, subscribe_kwargs)
