"""Type stubs for upcall._bus: the bus, subscriptions, publishers, thread factories."""
import os
from types import TracebackType
from array import array
from typing import (Any, Callable, ClassVar, Coroutine, Generator, Iterable, Literal, Mapping, Protocol,
                    TypedDict, Union, final)

from typing_extensions import Self, Unpack, disjoint_base

from upcall._codec import Decoder, UpcallError
from upcall.certs import Certificate
from upcall.aio import AsyncSubscription
from upcall.handler import Handler
from upcall.native import NativeHandler

Endpoint = str
# subscribe(): one endpoint, or several served by one socket.
Endpoints = Endpoint | list[Endpoint] | tuple[Endpoint, ...]
# A callable, an upcall.Handler (on_message through the vtable), or a native
# handler that runs without the GIL and upcalls only what it selects.
Target = Union[Callable[..., Any], Handler, NativeHandler]
# subscribe(decoder=...): each payload (bytes) -> the message, such as
# msgspec.msgpack.Decoder(Type).decode; or an upcall.Decoder, used as it is.
PayloadDecoder = Union[Callable[[bytes], Any], Decoder]

# A topic a publisher sends: bytes-like, or str (sent as UTF-8).
Topic = bytes | bytearray | memoryview | str

class StopDelivery(Exception):
    """Raise from a target to end its subscription cleanly."""

class ZMQError(UpcallError, OSError):
    """libzmq or the operating system refused; ``errno`` says why."""

class _Run(Protocol):
    """What a thread factory receives: call it once, on some thread."""
    name: str
    def __call__(self) -> None: ...

@final
class _NativeThreads:
    """The type of ``native_threads``: a marker, not a callable."""

# The default thread factory: the C core's own pthread, named ``upcall-<n>``
# (a marker for ``thread_factory=``, same as None; never called).
native_threads: _NativeThreads

ThreadFactory = Callable[[_Run], Any] | _NativeThreads

CurveKey = str | bytes
"""A CURVE key as 40 characters of Z85 text."""
CurveKeyPair = tuple[CurveKey, CurveKey] | list[CurveKey] | Certificate
"""(public, secret), as made by curve_keypair(), or a Certificate with its secret key."""
AllowedKeys = CurveKey | Certificate | os.PathLike[str] | Iterable[CurveKey | Certificate | os.PathLike[str]]
"""CURVE client public keys: Z85 keys, Certificates, directories of public certificates."""

def curve_keypair() -> tuple[str, str]:
    """A new CURVE key pair (public, secret) as Z85 strings; RuntimeError without CURVE."""
# The public key of a Z85 secret key, as libzmq derives it (upcall.certs).
def _curve_public(secret: bytes) -> bytes: ...

def python_threads(run: _Run) -> None:
    """Run the loop on a daemon ``threading.Thread`` named ``upcall-<n>``."""

# Connection events (docs/events.md): the stats keys, in the core's order.
EVENT_STATS: tuple[str, ...]

class ConnectionEvent:
    """One connection event of a subscription or a publisher (``on_event``),
    or a gap in a stamped stream (kind "gap": stream, first, count)."""
    kind: str
    cause: str | None
    endpoint: str
    value: int
    stream: int | None
    first: int | None
    count: int | None
    def __init__(self, kind: str, endpoint: str, cause: str | None = None,
                 value: int = 0, stream: int | None = None, first: int | None = None,
                 count: int | None = None) -> None: ...

@final
class Subscription:
    """One receive loop delivering decoded messages to one target."""
    @property
    def endpoint(self) -> str:
        """The endpoint as given (the first one of several)."""
    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every endpoint as given, in order."""
    @property
    def closed(self) -> bool: ...
    @property
    def stats(self) -> dict[str, int]:
        """received, delivered, filtered, batches, decode_errors, callback_errors, dropped,
        zmq_received (zmq messages; a coalesced one holds many messages), the
        loss of stamped messages (lost, gaps, streams, unstamped, reordered,
        duplicates, streams_forgotten), prefix_copies and prefix_copy_bytes
        (the full copies of a SUB's prefixes its send queues may hold, and an
        upper bound of their bytes: docs/security.md) and the connection
        events' counts (EVENT_STATS)."""
    def streams(self) -> dict[int, dict[str, int]]:
        """Per stamped stream: received, lost, gaps, next_seq."""
    @property
    def peers(self) -> int | None:
        """Connections up now (None: unknown, inproc:// only)."""
    @property
    def connected(self) -> bool | None:
        """True while at least one connection is up."""
    @property
    def topics(self) -> tuple[bytes, ...]:
        """SUB prefixes with every subscribe()/unsubscribe() so far; () for PULL."""
    def subscribe(self, topic: bytes | bytearray | memoryview | str,
                  timeout: float | None = None) -> None:
        """SUB: add a prefix while delivery runs; returns once the socket's
        thread has made the change (TimeoutError: still queued)."""
    def unsubscribe(self, topic: bytes | bytearray | memoryview | str,
                    timeout: float | None = None) -> None:
        """SUB: remove a prefix while delivery runs, like subscribe()."""
    @property
    def thread_name(self) -> str | None:
        """Name of the delivery thread (None in caller mode)."""
    @property
    def last_endpoint(self) -> str:
        """The endpoint as bound (tcp port 0 resolved), or as given; the first of several."""
    @property
    def last_endpoints(self) -> tuple[str, ...]:
        """Every endpoint as bound or connected, in the order of ``endpoints``."""
    def poll(self, timeout: float | None = None, max_messages: int | None = None) -> int:
        """Caller mode: deliver on this thread; return how many messages were
        delivered, as soon as a batch was (0 after ``timeout``).  ValueError
        once the subscription has ended; an interrupt from the target
        (KeyboardInterrupt...) propagates, and the rest of its batch is
        delivered by the next poll()."""
    def recv(self, timeout: float | None = None) -> Any:
        """Opened without a target (delivery="caller"): the next message, as a
        target would get it ((topic, msg) with with_topic).  TimeoutError
        after ``timeout`` seconds, the subscription kept and nothing lost;
        ValueError once closed."""
    def __iter__(self) -> Subscription:
        """``for msg in sub``: recv() until the subscription or its bus closes."""
    def __next__(self) -> Any: ...
    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the loop to end by itself (StopDelivery, the end of its
        source) without stopping it; True if it has ended.  Thread mode only."""
    def close(self, timeout: float | None = None) -> None:
        """Stop delivery and wait for the loop to end (``TimeoutError`` after timeout)."""
    def set_end_hook(self, hook: Callable[[BaseException | None], object]) -> None:
        """For async adapters: hook(exc) once the delivery loop has ended, for any reason."""
    def __enter__(self) -> Subscription: ...
    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None: ...

@final
class Publisher:
    """A PUB or PUSH socket; send() is safe from several threads."""
    @property
    def endpoint(self) -> str: ...
    @property
    def last_endpoint(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def stats(self) -> dict[str, int]:
        """sent, sent_bytes, dropped, dropped_bytes and the connection events' counts (EVENT_STATS)."""
    @property
    def stream(self) -> int | None:
        """The random id of this instance's stamps (None without stamp=True)."""
    def stream_of(self, topic: Topic) -> int | None:
        """The stream id of ``topic``'s stamped messages (None without stamp=True)."""
    def streams(self) -> dict[int, dict[str, Any]]:
        """Per stamped topic: {"topic": bytes, "numbered": n}."""
    @property
    def peers(self) -> int | None:
        """Connections up now (None: unknown, inproc://)."""
    def send(self, topic: Topic, obj: Any, *, timeout: float | None = None,
             copy: bool = True) -> Sent | None:
        """``timeout`` in seconds (pyzmq's are milliseconds).  ``copy=False``:
        out-of-band values go without a copy; do not change them until the
        returned Sent is done."""
    def send_async(self, topic: Topic, obj: Any, *,
                   timeout: float | None = None) -> Coroutine[Any, Any, None]:
        """Encode obj now; the awaitable sends it without blocking the event loop."""
    def try_send_packed(self, topic: Topic, payload: bytes | bytearray | memoryview) -> bool:
        """For async adapters: send if that can be done without waiting at all."""
    def watch_room(self, efd: int) -> int:
        """For async adapters: register efd for wake-ups; return a dup of the socket's fd."""
    def unwatch_room(self, efd: int) -> None:
        """Undo watch_room before efd is closed."""
    def send_packed(self, topic: Topic, payload: Any, *, timeout: float | None = None) -> None: ...
    def send_many(self, topic: Topic, objs: Iterable[Any], *,
                  timeout: float | None = None) -> None:
        """Send the objects as coalesced messages (docs/wire.md, ext 127), in order."""
    def flush(self, *, timeout: float | None = None) -> None:
        """coalesce=True: send every pending batch now."""
    @property
    def pending(self) -> int:
        """Messages waiting in coalesced batches now."""
    def wait_subscriptions(self, n: int = 1, *, timeout: float | None = None) -> int:
        """kind="pub": wait until the peers hold at least n subscriptions; return how many."""
    def close(self) -> None: ...
    def __enter__(self) -> Publisher: ...
    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None: ...

@final
class Sent:
    """Whether libzmq is done with the out-of-band buffers of a message sent
    with ``copy=False``."""
    @property
    def done(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...

# The threshold to opt in to out-of-band frames with (publisher(oob_threshold=)).
DEFAULT_OOB_THRESHOLD: int
# Bus.publisher(coalesce=True) defaults (PERF.md, "Coalescing").
DEFAULT_MAX_DELAY: float
DEFAULT_MAX_BATCH: int
DEFAULT_MAX_BYTES: int
MAX_OOB_FRAMES: int
# The marker frame a foreign producer appends to a message using upcall's
# wire extensions (docs/wire.md, "The marker frame").
WIRE_MARKER: bytes
# Stamped streams a subscription tracks without max_streams= (docs/wire.md, "Stamps").
DEFAULT_MAX_STREAMS: int
# Decompressed bytes per message without subscribe(max_message_size=...).
DEFAULT_MAX_DECOMPRESSED: int
# Decompressed bytes one batch list (and one async queue) may hold without
# subscribe(max_batch_decompressed=...).
DEFAULT_MAX_BATCH_DECOMPRESSED: int
COMPRESSION: tuple[str, ...]

def oob_outstanding() -> tuple[int, int]: ...

# The keyword arguments of subscribe(), subscribe_async() and publisher(),
# once: upcall/_options.pxi holds their defaults and checks.
class SubscribeAsyncKwargs(TypedDict, total=False):
    """The keywords of subscribe_async() (and subscribe(), with delivery)."""
    topics: Iterable[bytes | str]
    kind: Literal["sub", "pull"]
    bind: bool
    batch: int | None
    thread_factory: ThreadFactory | None
    with_topic: bool
    on_error: Callable[[BaseException, Any], Any] | None
    rcvhwm: int | None
    max_message_size: int | None
    max_batch_decompressed: int | None
    curve_server: CurveKeyPair | None
    curve_serverkey: CurveKey | None
    curve_client: CurveKeyPair | None
    socket_options: Mapping[str, int] | None
    decoder: PayloadDecoder | None
    raw: bool
    copy: bool
    max_topics: int | None
    on_event: Callable[[ConnectionEvent], Any] | None
    extensions: bool
    max_streams: int | None
    allow: AllowedKeys | None
    authenticate: bool
    shared: bool

class SubscribeKwargs(SubscribeAsyncKwargs, total=False):
    """The keywords of subscribe()."""
    delivery: Literal["thread", "caller"]
    with_sender: bool

class PublisherKwargs(TypedDict, total=False):
    """The keywords of publisher()."""
    kind: Literal["pub", "push"]
    bind: bool
    sndhwm: int | None
    linger: float | None
    curve_server: CurveKeyPair | None
    curve_serverkey: CurveKey | None
    curve_client: CurveKeyPair | None
    default: Callable[[Any], Any] | None
    encoder: Callable[[Any], bytes | bytearray | memoryview] | None
    socket_options: Mapping[str, int] | None
    oob_threshold: int | None
    compression: str | None
    coalesce: bool
    max_delay: float | None
    max_batch: int
    max_bytes: int
    allow: AllowedKeys | None
    authenticate: bool
    on_event: Callable[[ConnectionEvent], Any] | None
    stamp: bool
    on_full: Literal["drop", "block", "skip"]

class _Option:
    """One keyword argument: name, default, check (value -> value kept), help."""
    name: str
    default: Any
    check: Callable[[Any], Any] | None
    scope: int
    help: str
    def __init__(self, name: str, default: Any, check: Callable[[Any], Any] | None,
                 scope: int, help: str) -> None: ...

class _Options:
    """Keyword arguments checked once, kept frozen; each option reads as an attribute."""
    fields: ClassVar[Mapping[str, _Option]]
    def __init__(self, **options: Any) -> None: ...
    def __getattr__(self, name: str) -> Any: ...
    def replace(self, **changes: Any) -> Self: ...
    def as_dict(self) -> dict[str, Any]: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class SubscribeOptions(_Options):
    """subscribe()'s keywords, checked and frozen: subscribe(..., options=...)."""
    def __init__(self, **kwargs: Unpack[SubscribeKwargs]) -> None: ...
    # Narrower than the base on purpose: the keywords of this kind of options.
    def replace(self, **changes: Unpack[SubscribeKwargs]) -> SubscribeOptions: ...  # type: ignore[override]

@final
class PublisherOptions(_Options):
    """publisher()'s keywords, checked and frozen: publisher(..., options=...)."""
    def __init__(self, **kwargs: Unpack[PublisherKwargs]) -> None: ...
    def replace(self, **changes: Unpack[PublisherKwargs]) -> PublisherOptions: ...  # type: ignore[override]

# Proxy.stats's keys, and how long it waits for the proxy's thread (seconds).
PROXY_STATS: tuple[str, ...]
PROXY_STATS_TIMEOUT: float

@final
class Proxy:
    """An XSUB/XPUB forwarder on libzmq's own proxy (Bus.proxy, docs/proxy.md)."""
    @property
    def frontend(self) -> str:
        """The frontend's endpoint as resolved (publishers send here)."""
    @property
    def backend(self) -> str:
        """The backend's endpoint as resolved (subscribers subscribe here)."""
    @property
    def running(self) -> bool: ...
    @property
    def paused(self) -> bool: ...
    @property
    def stats(self) -> dict[str, int]:
        """messages, bytes, subscription_messages, subscription_bytes (PROXY_STATS)."""
    @property
    def events(self) -> dict[str, dict[str, int]]:
        """Connection events of "frontend" and "backend" (EVENT_STATS)."""
    @property
    def peers(self) -> tuple[int | None, int | None]:
        """Connections up now, (frontend, backend); None: unknown (inproc://)."""
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def close(self, timeout: float | None = None) -> None: ...
    def __enter__(self) -> Proxy: ...
    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None: ...

@final
class Bus:
    """A zmq context and everything opened on it."""
    def __init__(self, io_threads: int = 1, thread_factory: ThreadFactory | None = None,
                 max_sockets: int | None = None) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def max_sockets(self) -> int | None: ...
    def subscribe(self, endpoint: Endpoints, target: Target | None = None, *,
                  options: SubscribeOptions | None = None,
                  **kwargs: Unpack[SubscribeKwargs]) -> Subscription: ...
    def subscribe_async(self, endpoint: Endpoints, *, queue_size: int | None = None,
                        options: SubscribeOptions | None = None,
                        **kwargs: Unpack[SubscribeAsyncKwargs]) -> AsyncSubscription:
        """For ``async for msg in bus.subscribe_async(...)``, from a coroutine."""
    def publisher(self, endpoint: Endpoint, *, options: PublisherOptions | None = None,
                  **kwargs: Unpack[PublisherKwargs]) -> Publisher: ...
    def proxy(self, frontend: str, backend: str, *, frontend_bind: bool = True,
              backend_bind: bool = True, frontend_hwm: int | None = None,
              backend_hwm: int | None = None,
              frontend_curve_server: CurveKeyPair | None = None,
              frontend_curve_serverkey: CurveKey | None = None,
              frontend_curve_client: CurveKeyPair | None = None,
              frontend_allow: AllowedKeys | None = None, frontend_authenticate: bool = False,
              backend_curve_server: CurveKeyPair | None = None,
              backend_curve_serverkey: CurveKey | None = None,
              backend_curve_client: CurveKeyPair | None = None,
              backend_allow: AllowedKeys | None = None, backend_authenticate: bool = False,
              frontend_socket_options: Mapping[str, int] | None = None,
              backend_socket_options: Mapping[str, int] | None = None,
              on_event: Callable[[ConnectionEvent], Any] | None = None) -> Proxy:
        """Forward from publishers at frontend (XSUB) to subscribers at backend (XPUB)."""
    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the bus is closed; False after timeout.  Ctrl-C raises
        KeyboardInterrupt here, however close to the wait it came (the wait
        runs in slices of at most 200 ms, signal handlers run in between)."""
    def close(self, timeout: float | None = None) -> None: ...
    def authenticator(self) -> Authenticator:
        """The bus's ZAP handler, started by the first call."""
    def __enter__(self) -> Bus: ...
    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None: ...

@final
class Authenticator:
    """The bus's ZAP handler: who may complete a handshake with its sockets."""
    def allow(self, keys: AllowedKeys, *, socket: Subscription | Publisher | None = None) -> None: ...
    def revoke(self, keys: AllowedKeys, *, socket: Subscription | Publisher | None = None) -> None: ...
    def allow_address(self, addresses: str | Iterable[str]) -> None: ...
    def deny_address(self, addresses: str | Iterable[str]) -> None: ...
    def forget_address(self, addresses: str | Iterable[str]) -> None: ...
    @property
    def stats(self) -> dict[str, int]: ...
    @property
    def entries(self) -> int: ...
    @property
    def running(self) -> bool: ...

# Seconds between two log records of one refusal cause of an Authenticator.
AUTH_LOG_INTERVAL: float

DEFAULT_BATCH: int
# Most topic prefixes of a SUB subscription when subscribe(max_topics=None).
DEFAULT_MAX_TOPICS: int
# Errors logged without on_error: at most LOG_BURST records of each kind per
# subscription per LOG_INTERVAL seconds, then one summary record.
LOG_BURST: int
LOG_INTERVAL: float
# Seconds that closing each bus at interpreter exit waits for running targets
# and for unsent messages (the publishers' linger is cut to it).
EXIT_TIMEOUT: float
# Seconds a Python thread factory may take to start a subscription's loop
# before a warning and stats["loop_start_late"] say so (None: never).
LOOP_START_WARNING: float | None
# How many times a subscription's first batch gives the GIL back to the
# statement that called subscribe() until it has taken the handle.
OPENER_YIELDS: int
# Events a publisher's on_event thread may have queued; past it, counted only.
EVENT_QUEUE_SIZE: int

# Private: for the benchmark and the tests, not API.

def _synthetic_subscribe(
    bus: Bus,
    target: Target,
    *,
    count: int | None = None,
    payload: bytes | bytearray | memoryview | None = None,
    rate: float | None = None,
    backlog_max: int | None = None,
    record_latency: bool = False,
    gil: Literal["adopt", "per-upcall"] = "adopt",
    **subscribe_kwargs: Any,
) -> Subscription:
    """A subscription fed by a synthetic source (no zmq); subscribe_kwargs:
    batch, delivery, thread_factory, with_topic, on_error, decoder, raw, extensions."""

def _synthetic_info(sub: Subscription) -> dict[str, int | float | array[Any] | None] | None:
    """A synthetic source's figures (produced, dropped, max_backlog, start_ns,
    first_ns, last_ns, seconds, latency_ns); None for a socket."""

def _subscribe_per_upcall(bus: Bus, endpoint: Endpoint, target: Target,
                          **subscribe_kwargs: Any) -> Subscription:
    """bus.subscribe() with PyGILState_Ensure/Release around every message."""

# Private: the event loop's side of upcall.aio.AsyncSubscription (_aiter.pxi).

@final
class _Pending:
    """The event loop's side of the hand-over queue: the block it decodes from."""
    def bind(self, target: _AsyncTarget, sub: Subscription) -> None: ...
    def clear(self) -> None: ...
    @property
    def count(self) -> int: ...

@final
class _Next:
    """What __anext__ returns: awaiting it gives the next message (or batch)."""
    def __await__(self) -> Generator[Any, Any, Any]: ...
    def __iter__(self) -> _Next: ...
    def __next__(self) -> Any: ...
    def send(self, arg: Any) -> Any: ...
    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any: ...
    def close(self) -> None: ...

@final
class _AsyncMessages:
    def __new__(cls, pending: _Pending, owner: Any) -> Self: ...
    def __aiter__(self) -> _AsyncMessages: ...
    def __anext__(self) -> _Next: ...

@final
class _AsyncBatches:
    def __new__(cls, pending: _Pending, owner: Any) -> Self: ...
    def __aiter__(self) -> _AsyncBatches: ...
    def __anext__(self) -> _Next: ...

def _anext_message(pending: _Pending, owner: Any) -> _Next: ...
def _unpark_batch(batch: list[Any]) -> None: ...
def _take_armed(pending: _Pending, owner: Any, whole: bool) -> Any: ...
def _later(delay: float, fn: Callable[..., object], *args: object) -> list[Any]: ...
def _cancel_later(entry: list[Any]) -> None: ...

_nothing: object

@disjoint_base
class _AsyncTarget(Handler):
    """The async adapter's target: it owns the hand-over queue the trampoline
    fills without the GIL."""
    loop_errors: int
    discarded: int
    def _open_queue(self, limit: int, wait_for_room: bool, efd: int, with_topic: bool,
                    max_inflated: int) -> None: ...
    def _queue_list(self, msgs: list[Any]) -> bool: ...
    def _end(self, discard: bool) -> None: ...
    def _forget_fd(self) -> None: ...
    def _counts(self) -> tuple[int, int, int, int, int, bool]: ...
