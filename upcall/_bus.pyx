# cython: language_level=3
"""The bus: subscriptions delivering decoded msgpack messages to Python
callables on native or Python-made threads, and publishers.

One extension module built from one .pxi per concept, included in this order:
  _slices.pxi       waiting in slices: blocking calls let signals (Ctrl-C) in
  _oob.pxi          out-of-band frames: zero-copy sends and views, compression, copy=True
  _trampoline.pxi   the trampolines: C delivery callbacks that carry a batch across the GIL
  _threads.pxi      thread factories: who creates the thread a subscription's loop runs on
  _errlog.pxi       errors without on_error: rate-limited records on the "upcall" logger
  _events.pxi       connection events: counted in C, logged and handed to on_event
  _subscription.pxi Subscription: one receive loop delivering decoded messages to one target
  _shared.pxi       shared sockets: many subscriptions on one SUB socket and thread
  _publisher.pxi    Publisher: a PUB or PUSH socket sending [topic, msgpack payload]
  _curve.pxi        CURVE security: key pairs and the per-socket roles
  _sockopts.pxi     socket options: the libzmq options a deployment tunes, by name
  _targets.pxi      targets: which kind a target is, what its loop keeps for it, whole batches
  _decoders.pxi     payload decoders: subscribe(decoder=..., raw=True) in place of msgpack
  _auth.pxi         client authentication: the bridge to the bus's ZAP handler
  _proxy.pxi        Proxy: an XSUB/XPUB forwarder on libzmq's zmq_proxy_steerable
  _options.pxi      SubscribeOptions, PublisherOptions: every keyword argument, checked once
  _synthetic.pxi    the synthetic source: a subscription fed by views of one payload, no zmq
  _aiter.pxi        async iteration: __anext__ with no coroutine while messages are queued
and, here, C return codes -> exceptions, the registry that closes every bus
before interpreter exit, what a forked child does with the objects it
inherits, Bus, and the private entry points that open what Bus.subscribe()
does not offer users.
"""
cimport cython
from libc.errno cimport (errno, EADDRNOTAVAIL, EINVAL, EMFILE, ENODEV, ENOENT,
                         EPROTONOSUPPORT)
from libc.stdint cimport uint64_t, int64_t
from libc.stdlib cimport calloc, malloc, free
from libc.string cimport memcmp, memmove, memset, strncpy
from posix.unistd cimport getpid
from cpython.buffer cimport PyObject_CheckBuffer, PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.exc cimport (PyErr_CheckSignals, PyErr_Restore, PyErr_SetInterrupt,
                          PyErr_WriteUnraisable)
from cpython.object cimport PyTypeObject
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE

from upcall.includes.bus cimport *
from upcall.includes.coalesce cimport *
from upcall.includes.handover cimport *
from upcall.includes.oob cimport *
from upcall.includes.proxy cimport *
from upcall.includes.python cimport *
from upcall.includes.sub_shared cimport *
from upcall.includes.zap cimport *
from upcall.includes.zmq cimport ETERM
from upcall.includes.msgpack cimport mp_writer, mp_writer_init, mp_writer_free, mp_write_raw
from upcall._codec cimport Encoder, Decoder
from upcall._arguments cimport c_string, int_arg, timeout_ms as _timeout_ms
from upcall.handler cimport Handler
from upcall.native cimport NativeHandler

import atexit
import collections
import heapq
import inspect
import itertools
import logging
import math
import os
import sys
import threading
import time
import types
import warnings
import weakref

from upcall._codec import DecodeError, UpcallError


class StopDelivery(Exception):
    """Raise from a target to end its subscription cleanly (no error is reported).

    Not an UpcallError: it is the target's request, never a failure, and an
    ``except upcall.UpcallError`` in a target must not swallow it."""
    __module__ = "upcall"


class ZMQError(UpcallError, OSError):
    """libzmq or the operating system refused (address in use, too many
    sockets, no such device...): ``errno`` says why, as for any OSError."""
    __module__ = "upcall"


# ---- C return codes -> exceptions -----------------------------------------

cdef str _seconds_text(int ms):
    """A timeout the core held in milliseconds, said in the seconds the API
    takes: 2000 -> "2 s", 250 -> "0.25 s"."""
    return f"{ms / 1000:.3f}".rstrip("0").rstrip(".") + " s"


cdef int _check_rc(int rc, str what, int timeout_ms=-1, str detail=None) except -1:
    """The one place where a C return code becomes an exception.

    UC_OK returns 0; anything else raises, naming ``what`` (the call that
    failed).  ``timeout_ms`` is that call's timeout: with UC_ERR_AGAIN it
    tells "would block" (0) from "timed out" (> 0).  For UC_ERR_ZMQ and
    UC_ERR_SYS, errno (read before anything can change it) says why, and
    ``detail`` what that means here (libzmq's strerror alone is terse).
    """
    if rc == UC_OK:
        return 0
    err = errno
    reason = uc_strerror(rc, err).decode("utf-8", "replace")
    if detail and (rc == UC_ERR_ZMQ or rc == UC_ERR_SYS):
        reason = f"{reason} ({detail})"
    if rc == UC_ERR_ZMQ or rc == UC_ERR_SYS:
        if rc == UC_ERR_ZMQ and err == ETERM:
            raise ValueError(f"{what}: the bus was closed")
        if err in (EINVAL, EPROTONOSUPPORT):
            raise ValueError(f"{what}: {reason}")
        raise ZMQError(err, f"{what}: {reason}")
    if rc == UC_ERR_AGAIN:
        if timeout_ms > 0:
            raise TimeoutError(f"{what} did not complete within {_seconds_text(timeout_ms)} "
                               "(high-water mark reached)")
        raise BlockingIOError(f"{what} {reason}")
    if rc == UC_ERR_ARG or rc == UC_ERR_CLOSED or rc == UC_ERR_STOPPING:
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


# ---- fork: what a child inherits is inert ------------------------------------
#
# libzmq sockets and contexts must not be used across fork, and a child has
# none of the parent's threads (delivery loops, libzmq's I/O threads).  Every
# Bus, Subscription and Publisher remembers the fork generation it was made
# in; in a child (after_in_child bumps the generation) every method of an
# inherited one raises, exit does not close it, and nothing of its C state is
# ever touched or freed: it belongs to the parent's libzmq.

# Forks between this process's start and now, on the line of processes that
# made it (0 in a process that never forked from one that imported upcall).
cdef int _fork_generation = 0


def _after_fork_in_child():
    global _fork_generation
    _fork_generation += 1
    _open_buses.clear()     # the parent's: exit must not wait for them


os.register_at_fork(after_in_child=_after_fork_in_child)


# Where an object was made: every object holding C state keeps one (its
# `_born`), set by _born_here() when it is made.
cdef struct born_in:
    int generation           # the fork generation
    long pid


cdef inline born_in _born_here() noexcept:
    cdef born_in b
    b.generation = _fork_generation
    b.pid = getpid()
    return b


cdef inline bint _inherited(born_in born) noexcept:
    """True for an object made where ``born`` says when this process is a
    forked child of the one that made it."""
    return born.generation != _fork_generation


cdef int _check_not_inherited(born_in born, str what) except -1:
    """The fork check of every entry point of Bus, Subscription, Publisher
    and Proxy: RuntimeError in a forked child for what the parent made."""
    if _inherited(born):
        raise RuntimeError(
            f"this {what} was created in process {born.pid}, and this is its forked child "
            f"{os.getpid()}: objects inherited across fork are inert; create a new Bus in "
            "the child")
    return 0


# Subscription, Publisher and the run objects given to thread factories are
# made only here: their constructors refuse to run without this token, so
# that Python code cannot make one that was never opened.
cdef object _MADE_HERE = object()


cdef int _made_here(object token, str cls, str how) except -1:
    if token is not _MADE_HERE:
        raise TypeError(f"cannot create {cls} objects directly: {how}")
    return 0


include "_slices.pxi"
include "_oob.pxi"
include "_trampoline.pxi"
include "_threads.pxi"
include "_errlog.pxi"
include "_events.pxi"
include "_subscription.pxi"
include "_shared.pxi"
include "_publisher.pxi"
include "_curve.pxi"
include "_sockopts.pxi"
include "_targets.pxi"
include "_decoders.pxi"
include "_auth.pxi"
include "_proxy.pxi"
include "_options.pxi"
include "_synthetic.pxi"
include "_aiter.pxi"


# ---- the registry: every open bus is closed before finalization ----------

# How long closing at exit waits for each bus: for targets still running, and
# for its publishers' unsent messages (their linger is cut to what is left).
EXIT_TIMEOUT = 5.0

# Weak: a bus nobody uses any more is collected (closed, with a
# ResourceWarning, see Bus.__del__); one still in use is closed at exit.  A
# subscription delivering on a thread keeps its bus alive, as a running
# thread keeps itself alive: its loop holds the Subscription, which holds
# the Bus.
_open_buses = weakref.WeakSet()
_exit_hook_installed = False


def _close_all_at_exit():
    """Close every open bus before the interpreter finalizes.

    Registered with threading's exit hooks, which run before Python waits for
    non-daemon threads (so a loop running on an executor's thread is stopped
    before the executor waits for it) and long before finalization.
    """
    uc_set_exiting()      # loops stop instead of starting another batch
    for bus in list(_open_buses):
        try:
            bus.close(timeout=EXIT_TIMEOUT)
        except Exception as exc:  # a stuck target: report, do not hang exit
            # A record, so that an application's logging setup gets it; with
            # none, logging's last resort prints the message to stderr.
            _log.warning("upcall: at exit: %s", exc)


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

cdef str _plural(Py_ssize_t n, str noun):
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


cdef object _check_factory(object factory, str name):
    if factory is None or factory is native_threads or callable(factory):
        return factory
    raise TypeError(f"{name} must be callable, upcall.native_threads, "
                    f"upcall.python_threads or None, not {type(factory).__name__}")


cdef bytes _endpoint_bytes(object endpoint, str name="endpoint"):
    if not isinstance(endpoint, str):
        raise TypeError(f"{name} must be a str such as 'tcp://127.0.0.1:5556', "
                        f"not {type(endpoint).__name__}")
    if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError(f"{name} must start with tcp://, ipc:// or inproc://: {endpoint!r}")
    ep = c_string(endpoint, name)
    if endpoint.startswith("tcp://"):
        _check_tcp_ports(endpoint, name)
    return ep


cdef int _check_tcp_ports(str endpoint, str name) except -1:
    """libzmq reads a tcp port with atoi() into 16 bits: ":99999" would bind
    34463 and ":-1" 65535.  Every port (the source address of a connect,
    "tcp://src:port;dst:port", has one too) must be * or 0..65535."""
    for part in endpoint[len("tcp://"):].split(";"):
        host, colon, port = part.rpartition(":")
        if not colon or part.endswith("]"):     # libzmq: a bare "Invalid argument"
            raise ValueError(f"{name}: a tcp endpoint needs a port, 'tcp://host:port' "
                             f"(binding: port * or 0 picks a free one): {endpoint!r}")
        if port != "*" and not (port.isascii() and port.isdigit() and int(port) <= 65535):
            raise ValueError(f"{name}: a tcp port must be a number between 0 and 65535 "
                             f"or *, not {port!r}: {endpoint!r}")
    return 0


cdef str _endpoint_detail(str endpoint, int err, bint bind):
    """What libzmq's bare strerror means for a bind or connect of endpoint
    (None: it says enough)."""
    if endpoint.startswith("tcp://"):
        host = endpoint[len("tcp://"):].split(";")[-1].rpartition(":")[0]
        if err == ENODEV and ":" in host:
            return "an IPv6 address needs socket_options={'ipv6': 1}"
        if err == ENODEV:
            return (f"{host!r} is neither a local network interface nor a host name that "
                    "resolves: an unknown host or interface" if bind else
                    f"unknown host or interface in {endpoint!r}")
        if err == EADDRNOTAVAIL and bind:
            return f"{host!r} is not an address of this machine: bind to one of its own, or *"
    elif endpoint.startswith("ipc://") and err == ENOENT:
        return "the directory of the ipc path does not exist"
    return None


cdef list _endpoint_list(object endpoint):
    """subscribe()'s ``endpoint``, one str or a list/tuple of them, as a
    non-empty list of distinct str (checked as _endpoint_bytes does)."""
    if isinstance(endpoint, str):
        _endpoint_bytes(endpoint)
        return [endpoint]
    if not isinstance(endpoint, (list, tuple)):
        raise TypeError(f"endpoint must be a str such as 'tcp://127.0.0.1:5556', or a list "
                        f"or tuple of them, not {type(endpoint).__name__}")
    if not endpoint:
        raise ValueError("endpoint: an empty list; give at least one endpoint")
    seen = set()
    for i, ep in enumerate(endpoint):
        _endpoint_bytes(ep, f"endpoint[{i}]")
        # Two connects to one publisher make two connections: each message
        # would arrive twice.  (A port picked at bind is a new one each time.)
        if ep in seen and not ep.endswith((":*", ":0")):
            raise ValueError(f"endpoint[{i}]: {ep!r} is given twice")
        seen.add(ep)
    return list(endpoint)


# upcall.aio, the asyncio adapter behind Bus.subscribe_async and
# Publisher.send_async: imported at their first call (``import upcall`` does
# not import asyncio).  This is the one place the bus names it; the adapter
# uses only the bus's public API (Bus.subscribe(options=...),
# Subscription.set_end_hook, Publisher.try_send_packed/watch_room/unwatch_room).
cdef object _aio = None


cdef object _async_adapter():
    global _aio
    if _aio is None:
        import upcall.aio
        _aio = upcall.aio
    return _aio


cdef bytes _topic_bytes(object topic):
    if isinstance(topic, str):
        return (<str>topic).encode("utf-8")
    if isinstance(topic, (bytes, bytearray, memoryview)):
        return bytes(topic)
    raise TypeError(f"a topic must be bytes or str, not {type(topic).__name__}")


# Whole milliseconds left until ``deadline`` (time.monotonic(); None: no limit, -1).
cdef int _track(object owned, object obj) except -1:
    """Add obj to one of the bus's weak sets of what it closes.  WeakSet.add
    is Python code: a Ctrl-C can land inside it and leave obj out, open, and
    then bus.close() waits forever for the context its socket holds.  So the
    add is made again before the interrupt goes on (it is idempotent)."""
    try:
        owned.add(obj)
    except BaseException:
        owned.add(obj)
        raise
    return 0


cdef int _ms_left(object deadline):
    if deadline is None:
        return -1
    return max(0, <int>math.ceil((deadline - time.monotonic()) * 1000.0))


# A close with a timeout cuts its publishers' linger to end this much before
# its deadline (when that much is left); libzmq then destroys those sockets
# and ends the context, which takes milliseconds on an idle machine and can
# take hundreds when both cores are busy (its I/O and reaper threads must
# get a core).  The close also waits this much beyond its deadline for that,
# rather than report as late work that is done.
cdef int _LINGER_END_MS = 250

# The most sockets a Bus may have (libzmq's ZMQ_SOCKET_LIMIT with epoll).
_MAX_SOCKETS_LIMIT = 65535


cdef int _bus_close_step(object unused, int slice_ms, void *arg) except -1:
    """A slice of waiting for the bus's context to end (see Bus.close)."""
    cdef uc_bus *c = <uc_bus *>arg
    cdef int rc
    with nogil:
        rc = uc_bus_close(c, slice_ms)
    return rc == UC_OK


cdef int _check_self(object obj, str method) except -1:
    """For Bus's cyfunction methods: the TypeError CPython raises when one of
    the C methods is called unbound with another object as self."""
    if not isinstance(obj, Bus):
        raise TypeError(f"descriptor {method!r} for 'upcall.Bus' objects doesn't apply to a "
                        f"{type(obj).__name__!r} object")
    return 0


# What a subscription costs of a bus's max_sockets, for the errors that
# refuse a socket.
_SOCKET_COST = (
    "Each subscription with a socket of its own (bind=True, kind='pull', "
    "shared=False, its own thread_factory, delivery='caller', ...) uses three: "
    "its socket and the two of its connection monitor; subscriptions that share "
    "one (kind='sub' connects, the default) use none of their own.")


@cython.final
cdef class Bus:
    """Bus(io_threads=1, thread_factory=None, max_sockets=None)
--

A zmq context and every subscription and publisher opened on it.

    ``Bus(io_threads=1, thread_factory=None, max_sockets=None)``:
    ``io_threads`` are libzmq's I/O threads; ``thread_factory`` is the
    default for subscriptions (None or ``upcall.native_threads``: the core's
    own threads; ``upcall.python_threads``; or any callable
    ``factory(run)``); ``max_sockets`` is libzmq's ZMQ_MAX_SOCKETS (None:
    libzmq's default, 1023), one of which is kept free for closing the bus.
    A context manager: leaving it closes everything.

    A bus nobody references any more is closed when it is collected, with a
    ResourceWarning; a subscription delivering on a thread references its
    bus until it ends (docs/subscribing.md, "Lifetimes").
    """
    cdef uc_bus *_c               # freed with the Bus: a close may wait on it meanwhile
    cdef object _factory
    cdef object _subs             # weakref.WeakSet: its open subscriptions ...
    cdef object _pubs             # ... and publishers, which reference the bus
    cdef object _async_subs       # WeakSet: an AsyncSubscription left unreferenced closes itself
    cdef object _proxies          # WeakSet: its open proxies (_proxy.pxi)
    cdef dict _shared_sockets     # shared sockets (_shared.pxi): key -> _SharedSocket
    cdef bint _closed             # close() was called (it may still have work left)
    cdef bint _ended              # ... and saw the zmq context end: nothing left to do
    cdef object _closing          # threading.Event, set by close(): what wait() waits for
    cdef born_in _born            # where it was made (the fork check)
    cdef object _auth             # its Authenticator once authentication is on (_auth.pxi)
    cdef object __weakref__

    def __cinit__(self):
        self._c = NULL
        self._born = _born_here()
        self._closing = threading.Event()

    def __init__(self, io_threads=1, thread_factory=None, max_sockets=None):
        cdef int err = 0
        cdef int rc
        io_threads = int_arg(io_threads, "io_threads", 0, 64)
        max_sockets = int_arg(max_sockets, "max_sockets", 2, _MAX_SOCKETS_LIMIT,
                              "one is kept for closing the bus; None: libzmq's default",
                              or_none=True)
        self._factory = _check_factory(thread_factory, "thread_factory")
        self._subs = weakref.WeakSet()
        self._pubs = weakref.WeakSet()
        self._async_subs = weakref.WeakSet()
        self._proxies = weakref.WeakSet()
        self._shared_sockets = {}
        self._c = uc_bus_new(io_threads, &err)
        if self._c == NULL:
            _check_rc(err, "Bus()")
        if max_sockets is not None:
            rc = uc_bus_set_max_sockets(self._c, max_sockets)
            if rc != UC_OK:
                raise ValueError(f"max_sockets={max_sockets!r} is refused by libzmq: "
                                 f"{uc_strerror(rc, errno).decode('utf-8', 'replace')}")
        _open_buses.add(self)
        _install_exit_hook()

    def __del__(self):
        # Subscriptions and publishers reference their bus: when it goes, they
        # have gone (each closed itself, with its own warning).
        if self._c != NULL and not self._closed and not _inherited(self._born):
            warnings.warn(f"unclosed {self!r}: close it, or use it as a context manager",
                          ResourceWarning, source=self)

    def __dealloc__(self):
        # A bus not closed (or whose close did not see the end) is closed
        # without waiting: the context ends in the background.  In a forked
        # child the C state is the parent's: left alone.
        if self._c != NULL and not _inherited(self._born):
            if self._auth is not None:
                (<Authenticator>self._auth)._stop()
            with nogil:
                uc_bus_free(self._c)
        self._c = NULL

    def authenticator(self):
        """The bus's :class:`Authenticator` (its ZAP handler), started by the
        first call: from then on every CURVE server socket of the bus admits
        only the client keys it allows (docs/security.md)."""
        self._check_process()
        return _start_authenticator(self)

    def __repr__(self):
        if _inherited(self._born):
            state = f"inherited from process {self._born.pid}"
        elif self._closed:
            state = "closed" if self._ended else "closing"
        else:
            state = f"{_plural(len(self._subs), 'subscription')}, {_plural(len(self._pubs), 'publisher')}"
        return f"<upcall.Bus {state}>"

    @property
    def closed(self):
        """True once close() was called (always, for a Bus inherited across fork)."""
        return self._closed or _inherited(self._born)

    @property
    def max_sockets(self):
        """libzmq's socket limit for this bus (ZMQ_MAX_SOCKETS); one of them is
        kept free so that closing the bus never runs out."""
        self._check_process()
        return uc_bus_max_sockets(self._c)

    cdef int _check_process(self) except -1:
        _check_not_inherited(self._born, "Bus")
        return 0

    cdef _check_open(self):
        self._check_process()
        if self._closed:
            raise ValueError("the bus is closed")

    cdef _open_failed(self, int rc, int err, str what, str endpoint, bint bind):
        """Raise for a subscription or publisher that could not be opened
        (``err``: errno right after the call) on ``endpoint``."""
        if err == EMFILE and rc == UC_ERR_SYS:
            raise ZMQError(EMFILE, (
                f"{what}: too many sockets: this bus has max_sockets="
                f"{uc_bus_max_sockets(self._c)}, one of which is kept free so that closing the "
                "bus never runs out (a socket closed while its inproc connect still waits for a "
                f"bind keeps its slot); {_SOCKET_COST} Close some, or make the bus with "
                "Bus(max_sockets=...)"))
        if err == EMFILE and rc == UC_ERR_ZMQ:
            raise ZMQError(EMFILE, (
                f"{what}: too many open sockets or files: libzmq refused a socket (this bus has "
                f"max_sockets={uc_bus_max_sockets(self._c)}; sockets closed a moment ago or "
                "still lingering keep their slot meanwhile) or the process ran out of file "
                f"descriptors. {_SOCKET_COST}"))
        errno = err
        _check_rc(rc, what, -1, _endpoint_detail(endpoint, err, bind))

    # A cyfunction (binding=True), unlike the other methods (setup.py): the
    # default (b"",) in a C method's text signature reads as b'' to
    # inspect.signature() on Python < 3.12 (a trailing comma is dropped).
    # So self is checked here, as CPython checks it for the others.
    # A cyfunction (binding=True), unlike the other methods (setup.py): its
    # signature is set below from the option rows (_options.pxi), which a
    # cyfunction keeps; the default (b"",) would also read as b'' in a C
    # method's text signature on Python < 3.12.  So self is checked here, as
    # CPython checks it for the others.
    @cython.binding(True)
    def subscribe(self, endpoint, target=None, *, options=None, **kwargs):
        """Deliver each message arriving at ``endpoint`` to ``target``.

        Without a target (``delivery="caller"`` only), nothing is delivered:
        the caller takes each message with ``sub.recv(timeout)`` or
        ``for msg in sub``.

        ``endpoint``: one endpoint, or a list/tuple of them: one socket bound
        (or connected) to each, so one loop and one thread serve them all,
        fair-queued between peers.  ``target(msg)`` gets the decoded payload
        (``target(topic, msg)`` with ``with_topic=True``).  ``kind``: "sub"
        (topic prefix filtering with ``topics``; none: nothing until
        ``sub.subscribe(prefix)``) or "pull".  ``max_topics``: most prefixes
        the subscription may hold, in ``topics`` and added by
        ``sub.subscribe()`` (None: DEFAULT_MAX_TOPICS); more is a ValueError.
        Every prefix reaches every publisher, on each (re)connection.
        ``bind``: bind instead of
        connect.  ``batch``:
        most messages per GIL crossing (None: DEFAULT_BATCH).  ``delivery``:
        "thread" (a loop on a thread from ``thread_factory``) or "caller"
        (no thread: call ``poll()``, or ``recv()`` without a target).  ``on_error(exc, msg)`` receives
        exceptions raised by the target and decode errors (default: logged
        on the "upcall" logger at ERROR, rate-limited; counted either way).  ``rcvhwm``: zmq receive high-water mark (0: no
        limit).  ``max_message_size``: bytes; a larger frame is refused by
        libzmq (ZMQ_MAXMSGSIZE), and a message that would take more once its
        out-of-band frames are decompressed (payload and frames together) is
        a decode error, reason "message_size", before it is allocated; None:
        no limit on frames, and at most DEFAULT_MAX_DECOMPRESSED bytes of
        decompressed frames per message.
        CURVE encryption (docs/security.md): ``curve_server=(public, secret)``
        makes this end the CURVE server; ``curve_serverkey=public`` (the
        server's) makes it a client, with ``curve_client=(public, secret)`` or
        a fresh pair.
        ``socket_options``: libzmq options by name, such as
        ``{"heartbeat_ivl": 1000, "tcp_keepalive": 1}`` (libzmq's units:
        milliseconds; docs/connections.md, Socket options).
        ``target`` may also be an ``upcall.Handler`` (its ``on_message`` is
        called through the vtable) or an ``upcall.native.NativeHandler`` (it
        runs without the GIL and upcalls only what it selects).
        ``decoder``: a callable taking each payload as ``bytes`` and returning
        the message, in place of the built-in msgpack decoder (e.g.
        ``msgspec.msgpack.Decoder(Trade).decode``); its exceptions are decode
        errors (counted in ``decode_errors``, an ``upcall.DecodeError`` naming
        the topic, the original as ``__cause__``, for ``on_error``).  An
        ``upcall.Decoder`` is used as it is.  ``raw=True``: the message is the
        payload's ``bytes``, undecoded.  With a native handler they decide
        what its ``target`` gets; ``select()`` always sees the raw views.
        ``copy``: out-of-band values (docs/wire.md) are delivered as
        read-only ``memoryview`` objects over the received frames, without a
        copy (False, the default), or as ``bytes`` (True).
        ``extensions``: True (the default) reads ext 126 as an out-of-band
        reference and an ext 127 payload as coalesced messages in upcall's
        marked messages (docs/wire.md, "The marker frame"; a plain message's
        ext 126/127 are always plain ``upcall.ExtType`` values); False: in
        marked messages too, and a message with frames after its payload is
        a decode error (``oob_unused``).
        ``max_streams``: stamped streams tracked for loss accounting (None:
        ``upcall.DEFAULT_MAX_STREAMS``); past it the oldest is forgotten
        (docs/wire.md, "Stamps").

        ``options``: an :class:`upcall.SubscribeOptions` made before (these
        keywords, checked once and kept); keywords given beside it replace
        its values.
        """
        _check_self(self, "subscribe")
        return self._open_subscription(endpoint, target,
                                       _subscribe_options(options, kwargs, 0, "subscribe()"),
                                       GIL_ADOPT, None)

    @cython.binding(True)               # as subscribe(): a signature of its own
    def subscribe_async(self, endpoint, *, queue_size=None, options=None, **kwargs):
        """Subscribe for ``async for msg in bus.subscribe_async(endpoint, ...)``.

        Call it from a coroutine: messages are delivered to the running event
        loop, woken at most once per batch.  The keywords are those of
        :meth:`subscribe` (a delivery thread from ``thread_factory`` receives
        and decodes; ``on_error`` runs there); ``queue_size`` (None:
        ``upcall.aio.DEFAULT_QUEUE_SIZE``) bounds the messages waiting for the
        event loop: a full queue makes a ``kind="pull"`` subscription wait
        (backpressure into zmq) and a ``kind="sub"`` one drop, counted in
        ``stats["dropped"]``.  Returns an ``upcall.aio.AsyncSubscription``
        (``async with`` closes it).  docs/asyncio.md.
        """
        _check_self(self, "subscribe_async")
        opts = _subscribe_options(options, kwargs, _IN_ASYNC, "subscribe_async()")
        self._check_open()
        asub = _async_adapter().AsyncSubscription(self, endpoint, queue_size, opts)
        _track(self._async_subs, asub)
        return asub

    cdef Subscription _open_subscription(self, object endpoint, object target, object opts,
                                         int gil_mode, _Source source):
        """subscribe()'s body, which the private entry points share: they add a
        GIL mode (GIL_ADOPT or GIL_PER_UPCALL) and a source (None: a zmq
        socket on ``endpoint``; else ``source.open`` makes the loop).  ``opts``:
        a SubscribeOptions, whose values are checked already."""
        cdef uc_sub_opts o
        cdef int err = 0
        cdef Py_ssize_t i
        cdef size_t failed = <size_t>-1     # set by a failed bind/connect
        cdef uc_frame *frames = NULL
        cdef const char **ep_ptrs = NULL
        cdef uc_sockopt *opt_array = NULL
        self._check_open()
        ep_list = _endpoint_list(endpoint) if source is None else [endpoint]
        ep_bytes = [(<str>e).encode("utf-8") for e in ep_list] if source is None else []
        delivery = opts.delivery
        kind = opts.kind
        inbox = None
        if target is None:
            if delivery != "caller":
                raise TypeError("subscribe() without a target takes messages on the caller's "
                                "thread: pass delivery='caller' (then sub.recv() or `for msg "
                                "in sub`), or a target to deliver to")
            target = inbox = _Inbox()
        target_kind = _target_kind(target)
        payload_decoder = _payload_decoder(opts.decoder, opts.raw)   # each its own
        if not opts.extensions:
            payload_decoder = _plain_ext_decoder(payload_decoder)
        batch = opts.batch
        topic_list = list(opts.topics) if kind == "sub" else []
        max_topics = opts.max_topics
        factory = opts.thread_factory
        if factory is None:
            factory = self._factory
        mms = -1 if opts.max_message_size is None else opts.max_message_size
        curve = _curve_keys(ep_list, opts.curve_server, opts.curve_serverkey, opts.curve_client)
        sockopts = _socket_options(opts.socket_options)
        if opts.with_sender and target_kind != TARGET_CALLABLE:
            raise ValueError("with_sender=True delivers target(msg, sender): it needs a "
                             "callable target (not a Handler)")
        zap = _auth_domain(self, opts, curve)
        cdef _SharedSource shared_src = None
        if (source is None and gil_mode == GIL_ADOPT and opts.shared and kind == "sub"
                and not opts.bind and delivery == "thread" and opts.thread_factory is None
                # What a shared socket cannot give one subscription alone: its
                # own peers' identities, its own admission rules, its own events.
                and not opts.with_sender and opts.allow is None and not opts.authenticate
                and opts.on_event is None):
            shared_src = self._shared_source(ep_list, opts, mms, curve, sockopts)
            source = shared_src
            if shared_src is not None and opts.decoder is None and not opts.raw:
                # The built-in decoder, shared by the shared socket's subscriptions
                # (they decode on its one thread): one key cache (25 KB), hot
                # for all of them, instead of a cold one each.
                payload_decoder = shared_src.sock.shared_decoder(payload_decoder, opts.extensions)

        cdef Subscription sub = Subscription.__new__(Subscription, _MADE_HERE)
        sub._bus = self
        sub.endpoint = ep_list[0]
        # A shared one: its shared socket's tuple, and no source object kept (it
        # is only the open's; _shared says what it is): less memory each.
        sub.endpoints = shared_src.sock.endpoints if shared_src is not None else tuple(ep_list)
        sub._source = source if shared_src is None else None
        sub._target = target
        sub._inbox = inbox
        sub._on_error = opts.on_error
        sub._decoder = payload_decoder
        sub._with_topic = opts.with_topic
        sub._copy = opts.copy
        sub._max_message_size = <uint64_t>mms if mms >= 0 else 0
        sub._max_size_given = mms >= 0
        sub._max_batch_inflated = opts.max_batch_decompressed
        sub._caller = delivery == "caller"
        sub._topic_set = dict.fromkeys(topic_list)
        sub._topics = tuple(topic_list)
        sub._max_topics = max_topics
        sub._pull = kind == "pull"
        sub._shared = shared_src is not None
        sub._st.gil_mode = gil_mode
        sub._st.owner = <PyObject *>sub
        sub._st.thread.adopted = 0
        _set_target(sub, target_kind, batch)

        memset(&o, 0, sizeof(o))
        o.kind = UC_SUB if kind == "sub" else UC_PULL
        o.failed_endpoint = &failed
        o.bind = 1 if opts.bind else 0
        o.batch = batch
        o.rcvhwm = -1 if opts.rcvhwm is None else opts.rcvhwm
        o.max_message_size = mms
        o.plain_ext = 0 if opts.extensions else 1
        o.max_streams = opts.max_streams
        o.with_sender = 1 if opts.with_sender else 0
        sub._with_sender = opts.with_sender
        _fill_curve(&o.curve, curve)
        if zap is not None:
            o.curve.zap_domain = <const char *>(<_ZapDomain>zap).name
        o.deliver = _deliver
        o.ctx = &sub._st
        if shared_src is not None:
            sub._events = shared_src.sock.events
        else:
            sub._events = _EventSink(f"subscription {', '.join(ep_list)}", opts.on_event)
        o.on_event = _on_conn_event
        o.event_ctx = <void *>sub._events
        opt_array = _sockopt_array(sockopts)
        o.sockopts = opt_array
        o.n_sockopts = len(sockopts)
        if ep_bytes:
            ep_ptrs = <const char **>malloc(len(ep_bytes) * sizeof(const char *))
            if ep_ptrs == NULL:
                free(opt_array)
                raise MemoryError()
            for i, e in enumerate(ep_bytes):
                ep_ptrs[i] = <const char *>(<bytes>e)
            o.endpoints = ep_ptrs
            o.n_endpoints = len(ep_bytes)
        if kind == "sub":
            frames = <uc_frame *>malloc(max(1, len(topic_list)) * sizeof(uc_frame))
            if frames == NULL:
                free(ep_ptrs)
                free(opt_array)
                raise MemoryError()
            for i, t in enumerate(topic_list):
                frames[i].data = <const char *>(<bytes>t)
                frames[i].size = len(<bytes>t)
            o.topics = frames
            o.n_topics = len(topic_list)
        if shared_src is not None:
            # Delivered on the shared socket's thread, which adopts its thread
            # state once for all its subscriptions.
            o.on_exit = _shared_sub_exit
            if target_kind != TARGET_NATIVE:
                o.deliver = <uc_deliver_fn><void *>_shared_sub_deliver   # the hand-out holds the GIL
            sub._st.thread.adopted = 1
            sub._run_name = sub._thread_name = shared_src.sock.thread_name
            Py_INCREF(sub)             # the loop's reference, dropped by _shared_sub_exit
        elif not sub._caller:
            o.on_exit = _loop_exit
            sub._run_name = _next_thread_name()
            if factory is None or factory is native_threads:
                sub._run_name_b = sub._run_name.encode() + b"\0"
                sub._thread_name = sub._run_name
                sub._st.thread.native_name = <const char *>sub._run_name_b   # Python's name for it too
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
            # Its loop waits for uc_sub_ready below: the target runs only once
            # the caller holds the subscription, as a shared one's does.
            o.start_held = 1
        cdef int open_errno = 0
        try:
            if source is None:
                sub._c = uc_sub_open(self._c, &o, &err)
            else:
                sub._c = source.open(self._c, &o, &err)
            open_errno = errno
        finally:
            free(frames)
            free(ep_ptrs)
            free(opt_array)
        if sub._c == NULL:
            sub._st.owner = NULL
            if not sub._caller:
                Py_DECREF(sub)         # the loop will never run
            if sub._start_error is not None:
                raise sub._start_error
            if len(ep_list) > 1 and failed < <size_t>len(ep_list):
                self._open_failed(err, open_errno, f"subscribe(): endpoint[{failed}] {ep_list[failed]!r}",
                                  ep_list[failed], opts.bind)
            self._open_failed(err, open_errno, f"subscribe({endpoint!r})", ep_list[0], opts.bind)
        try:
            _track(self._subs, sub)
            _auth_register(zap, sub)
            if shared_src is None and sub._events is not None:
                # Named as bound (a tcp port * or 0 resolved), as its logs say it.
                sub._events.label = f"subscription {', '.join(sub.last_endpoints)}"
            if sub._factory is not None:
                _watch_loop_start(sub)
            if shared_src is not None and shared_src.ticket:
                # As a socket of its own subscribes at open: the shared socket
                # has the prefixes when subscribe() returns.
                sub._topic_ticket = shared_src.ticket
                _in_signal_slices(sub, _topics_step, &shared_src.ticket, -1)
        finally:
            # Its target may run from now on: not before the caller has the
            # subscription (the shared socket, or the held loop, kept what
            # reached it so far; the first batch lets the calling statement
            # take the handle).
            if shared_src is not None:
                _note_opener(sub)
                uc_shared_sub_ready(sub._c)
            elif o.start_held:
                _note_opener(sub)
                uc_sub_ready(sub._c)
        return sub

    cdef _SharedSource _shared_source(self, list ep_list, object opts, int64_t mms,
                                      object curve, object sockopts):
        """The source joining the bus's shared socket for these endpoints and socket
        options, opened now if there is none (or the last one has closed);
        None when it cannot be opened."""
        key = (tuple(ep_list), opts.rcvhwm, mms, opts.extensions, opts.max_streams, repr(curve),
               tuple(sorted(sockopts.items())) if isinstance(sockopts, dict) else repr(sockopts))
        cdef _SharedSocket sock = self._shared_sockets.get(key)
        if sock is None or sock.closed:
            sock = _open_shared_socket(self._c, ep_list, opts, mms, curve, sockopts, self._factory)
            if sock is None:
                return None
            self._shared_sockets[key] = sock
        cdef _SharedSource src = _SharedSource.__new__(_SharedSource)
        src.sock = sock
        return src

    @cython.binding(True)               # a signature of its own, from the option rows
    def publisher(self, endpoint, *, options=None, **kwargs):
        """Open a PUB (``kind="pub"``) or PUSH (``kind="push"``) socket.

        ``bind``: False (default) connects to ``endpoint``, as :meth:`subscribe`
        does and as pyzmq and NATS users expect (nothing binds unless asked);
        True binds it (the usual PUB side of a bus: ``bind=True``).  ``sndhwm``: zmq send high-water
        mark (0: no limit).  ``linger``: seconds (pyzmq's ZMQ_LINGER is in
        milliseconds: ``linger=2.0`` is two seconds) that unsent messages may keep
        the socket open at close (None or math.inf: until they are sent).  ``curve_server``, ``curve_serverkey``,
        ``curve_client``: CURVE encryption, as for :meth:`subscribe`.
        ``default(obj)``: called by the built-in encoder for an object of a
        type it does not know; returns something it can pack (msgpack's
        ``default``, msgspec's ``enc_hook``).  ``encoder(obj) -> bytes``: a
        complete replacement of the built-in encoder (e.g.
        ``msgspec.msgpack.Encoder().encode``); it must return a bytes-like
        object.
        ``socket_options``: libzmq options by name, as for :meth:`subscribe`.
        ``oob_threshold``: None (default): every value is packed into the
        payload, which is then plain msgpack that any msgpack reader
        decodes.  A number (``upcall.DEFAULT_OOB_THRESHOLD``, 16 KiB, is
        the measured choice): bytes-like values of this many bytes or more
        travel out of band, as zmq frames of their own after the payload
        (docs/wire.md, ext 126), which an upcall subscriber reads and a
        plain msgpack reader sees as an ``ExtType(126)``; with
        ``send(..., copy=False)`` they go without a copy.
        ``compression``: None (default) or a codec's name, ``"lz4"`` or
        ``"zstd"`` (``upcall.COMPRESSION``: those of this build): out-of-band
        frames of 10 kB or more are compressed when samples of them compress
        well, and sent raw otherwise (docs/wire.md); the receiver
        decompresses.  Only out-of-band frames are compressed, so ``compression=``
        turns them on: at ``DEFAULT_OOB_THRESHOLD`` when ``oob_threshold``
        is None.  A compressed frame is libzmq's own copy: its value may
        change as soon as ``send`` returns (with ``copy=False`` the
        returned ``Sent`` then waits only for the values sent raw).
        ValueError for a name no codec has, and for a codec this upcall was
        built without (liblz4, libzstd; ``upcall.COMPRESSION`` lists the
        others).

        ``coalesce=True``: :meth:`Publisher.send` appends each message to a
        pending batch of its topic, and a batch travels as one zmq message
        (docs/wire.md, ext 127; an upcall subscriber splits it, other
        readers see one msgpack ext value).  A batch is sent once it holds
        ``max_batch`` messages, when the next message would take it over
        ``max_bytes`` payload bytes (a larger message goes alone), by
        :meth:`Publisher.flush` and at close, and ``max_delay`` seconds
        after its first message (by a thread of the C core, with no further
        call and without the GIL; None: no time limit).  Order is kept per
        topic (a message sent uncoalesced, with out-of-band buffers or by
        ``send_packed``, goes after its topic's pending batch); at most 64
        topics have a batch pending at once, a new one past that sends the
        oldest batch first.  A PUB socket at its high-water mark drops whole
        batches; PUSH waits as a send does.  Payloads must be msgpack to be
        coalesced: the built-in encoder's, or an ``encoder=`` that writes
        msgpack (e.g. msgspec's).  ``max_batch`` and ``max_bytes``
        also size :meth:`Publisher.send_many`'s batches without coalescing.

        ``options``: an :class:`upcall.PublisherOptions` made before;
        keywords given beside it replace its values.
        """
        cdef uc_pub_opts o
        cdef int err = 0
        _check_self(self, "publisher")
        opts = _publisher_options(options, kwargs)
        self._check_open()
        ep = _endpoint_bytes(endpoint)
        curve = _curve_keys([endpoint], opts.curve_server, opts.curve_serverkey,
                            opts.curve_client)
        sockopts = _socket_options(opts.socket_options)
        memset(&o, 0, sizeof(o))
        o.kind = UC_PUB if opts.kind == "pub" else UC_PUSH
        o.endpoint = ep
        o.bind = 1 if opts.bind else 0
        o.sndhwm = -1 if opts.sndhwm is None else opts.sndhwm
        o.linger_ms = _timeout_ms(opts.linger, "linger")
        _fill_curve(&o.curve, curve)
        zap = _auth_domain(self, opts, curve)
        if zap is not None:
            o.curve.zap_domain = <const char *>(<_ZapDomain>zap).name
        cdef Publisher pub = Publisher.__new__(Publisher, _MADE_HERE)
        pub._bus = self
        pub.endpoint = endpoint
        pub._encoder = Encoder(default=opts.default)
        pub._encode = opts.encoder
        pub._oob_threshold = _oob_threshold_arg(opts.oob_threshold)
        pub._codec = _compression_arg(opts.compression)
        if pub._codec != NULL and opts.oob_threshold is None:
            # Compression applies to out-of-band frames only: asking for it
            # asks for them.
            pub._oob_threshold = DEFAULT_OOB_THRESHOLD
        o.coalesce = 1 if opts.coalesce else 0
        o.max_delay_us = _max_delay_us(opts.max_delay)
        o.max_batch = opts.max_batch
        o.max_bytes = opts.max_bytes
        o.max_topics = _MAX_TOPICS
        o.stamp = 1 if opts.stamp else 0
        o.on_full = _FULL_POLICIES[opts.on_full]
        pub._coalesce = UC_SEND_COALESCE if opts.coalesce else 0
        pub._max_batch, pub._max_bytes = o.max_batch, o.max_bytes
        o.sockopts = _sockopt_array(sockopts)
        o.n_sockopts = len(sockopts)
        # The monitor thread may call it until uc_pub_close: a reference of
        # its own, dropped after that (Publisher._drop_events).
        sink = _EventSink(f"publisher {endpoint}", opts.on_event, True)
        Py_INCREF(sink)
        pub._events = <PyObject *>sink
        o.on_event = _on_conn_event
        o.event_ctx = <void *>sink
        try:
            pub._c = uc_pub_open(self._c, &o, &err)
        finally:
            free(<void *>o.sockopts)
        if pub._c == NULL:
            pub._drop_events()
            self._open_failed(err, errno, f"publisher({endpoint!r})", endpoint, opts.bind)
        sink.label = f"publisher {pub.last_endpoint}"
        _track(self._pubs, pub)
        _auth_register(zap, pub)
        return pub

    def proxy(self, frontend, backend, *, frontend_bind=True, backend_bind=True,
              frontend_hwm=None, backend_hwm=None,
              frontend_curve_server=None, frontend_curve_serverkey=None,
              frontend_curve_client=None, frontend_allow=None, frontend_authenticate=False,
              backend_curve_server=None, backend_curve_serverkey=None,
              backend_curve_client=None, backend_allow=None, backend_authenticate=False,
              frontend_socket_options=None, backend_socket_options=None, on_event=None):
        """Start a forwarder: publishers send to ``frontend`` (an XSUB
        socket), subscribers subscribe at ``backend`` (an XPUB socket), and
        libzmq's own proxy (``zmq_proxy_steerable``) forwards between them
        on a thread of the bus, messages downstream and subscriptions
        upstream, frame for frame (stamped, coalesced and out-of-band
        messages arrive as they were sent).  Returns a :class:`Proxy`.

        ``frontend_bind`` / ``backend_bind``: bind (default) or connect that
        side.  ``*_hwm``: the frontend's receive and the backend's send
        high-water mark (per peer; None: libzmq's 1000).  Each side takes the
        CURVE and authentication arguments of :meth:`subscribe`, prefixed:
        ``frontend_curve_server=(public, secret)``, ``frontend_allow=keys``,
        ``frontend_authenticate=True``, ``backend_curve_serverkey=...`` and so
        on, and ``*_socket_options`` (libzmq options by name).  ``on_event``:
        called with each side's :class:`ConnectionEvent` (its ``endpoint``
        says which side), on the bus's monitor thread.  docs/proxy.md.
        """
        _check_self(self, "proxy")
        self._check_open()
        kw = dict(frontend_bind=frontend_bind, backend_bind=backend_bind,
                  frontend_hwm=frontend_hwm, backend_hwm=backend_hwm,
                  frontend_curve_server=frontend_curve_server,
                  frontend_curve_serverkey=frontend_curve_serverkey,
                  frontend_curve_client=frontend_curve_client, frontend_allow=frontend_allow,
                  frontend_authenticate=frontend_authenticate,
                  backend_curve_server=backend_curve_server,
                  backend_curve_serverkey=backend_curve_serverkey,
                  backend_curve_client=backend_curve_client, backend_allow=backend_allow,
                  backend_authenticate=backend_authenticate,
                  frontend_socket_options=frontend_socket_options,
                  backend_socket_options=backend_socket_options, on_event=on_event)
        p = _open_proxy(self, frontend, backend, kw)
        _track(self._proxies, p)
        return p

    cdef _forget(self, obj):
        self._subs.discard(obj)
        self._pubs.discard(obj)
        _auth_forget(self._auth, obj)
        self._proxies.discard(obj)

    def wait(self, timeout=None):
        """Wait until the bus is closed (by another thread, a target, or at
        exit); True if it is, False once ``timeout`` seconds (None: no limit)
        have passed.

        The way for a program that only subscribes to wait for Ctrl-C: the
        wait sleeps in slices of at most 20 ms with the signal
        handlers run in between, so KeyboardInterrupt is raised here even for
        a signal that landed just before the wait began, which
        ``threading.Event().wait()`` or ``signal.pause()`` can miss (CPython
        runs the handler, then goes to sleep with nothing left to wake it).
        It holds no lock while a signal can interrupt it: a KeyboardInterrupt
        raised inside ``Event.wait`` (CPython 3.10: between the Condition's
        acquire and its ``__enter__`` returning) left the Event's lock held,
        and the close at exit, setting that Event, waited for it for ever.
        """
        cdef int total_ms = _timeout_ms(timeout, "timeout")
        self._check_process()
        deadline = None if total_ms < 0 else time.monotonic() + total_ms / 1000.0
        closing = self._closing
        while True:
            if closing.is_set():             # reads a flag: takes no lock
                return True
            slice_s = _WAIT_POLL_MS / 1000.0
            if deadline is not None:
                slice_s = min(slice_s, max(0.0, deadline - time.monotonic()))
            time.sleep(slice_s)              # a signal's handler raises here, no lock held
            PyErr_CheckSignals()
            if deadline is not None and time.monotonic() >= deadline:
                return closing.is_set()

    def close(self, timeout=None):
        """Close every subscription and publisher, then the zmq context.

        In this order: every send blocked on one of the bus's publishers is
        woken (it raises ValueError, "the bus was closed"), every
        subscription is asked to stop, then each is waited for, the
        publishers are closed (with ``timeout``, their linger is cut to end
        0.25 s before the deadline, when that much is left), and the context
        is waited for (up to 0.25 s past the deadline: libzmq's own end).  ``timeout`` (seconds, not
        pyzmq's milliseconds; None: no limit) bounds the whole; TimeoutError if a target is still
        running or unsent messages still linger then.  Safe from inside a
        target: the context then ends when that target's loop does.  An
        interrupted or timed-out close leaves the bus closing: close() again
        (or exit) finishes it.
        """
        cdef int total_ms = _timeout_ms(timeout, "timeout")
        cdef Subscription sub
        cdef Publisher pub
        cdef uc_bus *c = self._c
        self._check_process()
        if self._ended:
            return
        deadline = None if total_ms < 0 else time.monotonic() + total_ms / 1000.0
        self._closed = True
        self._closing.set()
        uc_bus_shutdown(c)
        subs = list(self._subs)
        for sub in subs:
            sub._request_stop()
        errors = []
        # Async subscriptions before the others: closing one also ends its
        # consumer's iteration (its Subscription is among subs, already done then).
        for asub in list(self._async_subs):
            try:
                asub.close(None if deadline is None else _ms_left(deadline) / 1000.0)
            except TimeoutError as exc:
                errors.append(exc)
        for sub in subs:
            try:
                sub.close(None if deadline is None else _ms_left(deadline) / 1000.0)
            except TimeoutError as exc:
                errors.append(exc)
        for pub in list(self._pubs):
            left = _ms_left(deadline)
            pub._close_lingering_at_most(left if left < 2 * _LINGER_END_MS else left - _LINGER_END_MS)
        for proxy in list(self._proxies):
            try:
                proxy.close(None if deadline is None else _ms_left(deadline) / 1000.0)
            except TimeoutError as exc:
                errors.append(exc)
        if self._auth is not None:
            # Its socket holds the context: the handler goes with the sockets.
            (<Authenticator>self._auth)._stop()
        for sock in list(self._shared_sockets.values()):
            uc_shared_close((<_SharedSocket>sock)._sh)    # none left but after a failed join
        self._shared_sockets.clear()
        if errors:
            # The stuck loops end the context when they let go of it.
            with nogil:
                uc_bus_close(c, 0)
            raise TimeoutError(f"{len(errors)} subscription(s) did not stop: {errors[0]}")
        for sub in subs:
            if sub._c != NULL and not uc_sub_finished(sub._c):
                # Called from inside this target: its loop ends (and lets the
                # context go) once the target returns, which cannot be waited
                # for here.
                with nogil:
                    uc_bus_close(c, 0)
                return
        wait_ms = -1 if deadline is None else _ms_left(deadline) + _LINGER_END_MS
        if not _in_signal_slices(None, _bus_close_step, <void *>c, wait_ms):
            raise TimeoutError(f"{self!r}: the zmq context did not end within {timeout} s: "
                               "unsent messages of publishers closed before still linger; "
                               "close() again to wait longer")
        self._ended = True
        _open_buses.discard(self)

    def __enter__(self):
        self._check_process()
        return self

    def __exit__(self, *exc_info):
        self.close()


# ---- private entry points: what Bus.subscribe() does not offer users ---------
#
# The benchmark (and the tests) open subscriptions with a GIL mode or a source
# that users have no use for.  They take subscribe()'s keyword arguments (a
# SubscribeOptions) and share its body.

def _subscribe_per_upcall(Bus bus not None, endpoint, target, **subscribe_kwargs):
    """``bus.subscribe(endpoint, target, **subscribe_kwargs)`` with the classic
    PyGILState_Ensure/Release around every message instead of an adopted
    thread state: what adoption saves is measured against it (docs/threads.md)."""
    return bus._open_subscription(
        endpoint, target, _subscribe_options(None, subscribe_kwargs, 0, "subscribe()"),
        GIL_PER_UPCALL, None)


# The signatures of the entry points that take options (inspect.signature,
# help(), stubtest): made from the option rows, the one place they are written.
_P = inspect.Parameter
Bus.subscribe.__signature__ = _signature(
    _SUBSCRIBE_OPTIONS, [_P("self", _P.POSITIONAL_OR_KEYWORD),
                        _P("endpoint", _P.POSITIONAL_OR_KEYWORD),
                        _P("target", _P.POSITIONAL_OR_KEYWORD, default=None)])
Bus.subscribe_async.__signature__ = _signature(
    _SUBSCRIBE_OPTIONS, [_P("self", _P.POSITIONAL_OR_KEYWORD),
                        _P("endpoint", _P.POSITIONAL_OR_KEYWORD)], _IN_ASYNC,
    [_P("queue_size", _P.KEYWORD_ONLY, default=None)])
Bus.publisher.__signature__ = _signature(
    _PUBLISHER_OPTIONS, [_P("self", _P.POSITIONAL_OR_KEYWORD),
                        _P("endpoint", _P.POSITIONAL_OR_KEYWORD)])
del _P


# Public types read as upcall.X (reprs, error messages, help()), not as this
# private module.  Static extension types take __module__ and __name__ from
# tp_name.
(<PyTypeObject *>Bus).tp_name = b"upcall.Bus"
(<PyTypeObject *>Subscription).tp_name = b"upcall.Subscription"
(<PyTypeObject *>Publisher).tp_name = b"upcall.Publisher"
(<PyTypeObject *>Proxy).tp_name = b"upcall.Proxy"
