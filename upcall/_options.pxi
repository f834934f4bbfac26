# The options of subscribe(), subscribe_async(), the synthetic source and
# publisher(): each written once, here, as one row (name, default, check,
# where it applies, help), and checked once, when an options object is made.
#
# The entry points take **options and hand them to SubscribeOptions(...) or
# PublisherOptions(...); their signatures (inspect.signature, help()) are
# made from the rows below, and the CLI reads its defaults and help from
# them.  The objects are frozen and read only when a subscription or a
# publisher is opened, never per message.  A new option is one row here and
# one line in upcall/_bus.pyi; what it does is the code that reads it.
#
# Why here and not a pure-Python layer over the extension (pyzmq's sugar
# subclasses its Cython backend's Socket in Python): Bus, Subscription and
# Publisher are final cdef classes whose send and delivery paths must not
# gain a Python frame, and the checks are the backend's own (int_arg,
# socket options, CURVE keys, decoders); a Python module would copy them or
# import the extension that imports it.  So the rows are Python objects
# compiled into the extension, read only on the way in (the sugar's
# place), and _open_subscription/publisher() turn them into C structs (the
# backend's).

cdef object _NO_CHECK = None

# Where an option applies, beyond subscribe() itself.
cdef enum:
    _IN_ASYNC = 1           # subscribe_async() takes it
    _IN_SYNTHETIC = 2       # the synthetic source takes it (the others configure a socket)


class _Option:
    """One keyword argument: its name, default, check (value -> the value
    kept, raising TypeError/ValueError naming the argument), where it
    applies, and a one-line help."""
    __slots__ = ("name", "default", "check", "scope", "help")

    def __init__(self, name, default, check, scope, help):
        self.name, self.default, self.check, self.scope, self.help = \
            name, default, check, scope, help

    def __repr__(self):
        return f"<option {self.name}={self.default!r}>"


class _one_of:
    """The check of an option that takes one of a few values (``choices``,
    which a command line offers too)."""
    __slots__ = ("name", "choices")

    def __init__(self, str name, tuple choices):
        self.name, self.choices = name, choices

    def __call__(self, value):
        if value not in self.choices:
            words = " or ".join(repr(a) for a in self.choices)
            raise ValueError(f"{self.name} must be {words}, not {value!r}")
        return value


def _strict_bool(str name):
    def check(value):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, not {type(value).__name__}")
        return value
    return check


def _callable_or_none(str name):
    def check(value):
        if value is not None and not callable(value):
            raise TypeError(f"{name} must be callable or None, not {type(value).__name__}")
        return value
    return check


def _int_or_none(str name, low, high, str note, default_to=None):
    def check(value):
        value = int_arg(value, name, low, high, note, or_none=True)
        return default_to if value is None else value
    return check


def _truth(value):
    return bool(value)


def _seconds_or_none(str name):
    def check(value):
        _timeout_ms(value, name)
        return value
    return check


def _topics_check(value):
    if isinstance(value, (bytes, str)):
        raise TypeError("topics must be an iterable of bytes/str prefixes, "
                        "not a single bytes/str (wrap it in a list)")
    try:
        topic_list = [_topic_bytes(t) for t in value]
    except TypeError as exc:
        raise TypeError(f"topics: {exc}") from None
    # A prefix given twice is one prefix: one unsubscribe() removes it.
    return tuple(dict.fromkeys(topic_list))


def _factory_check(value):
    return _check_factory(value, "thread_factory")


def _socket_options_check(value):
    _socket_options(value)                       # converted again at open
    return None if value is None else dict(value)


def _max_delay_check(value):
    _max_delay_us(value)
    return value


def _oob_threshold_check(value):
    _oob_threshold_arg(value)
    return value


def _compression_check(value):
    _compression_arg(value)
    return value


def _max_batch_check(value):
    return int_arg(value, "max_batch", 1, 2147483647)


def _max_bytes_check(value):
    return int_arg(value, "max_bytes", 64, 0xffffffff)


cdef int _A = _IN_ASYNC, _S = _IN_SYNTHETIC, _AS = _IN_ASYNC | _IN_SYNTHETIC

_SUBSCRIBE_OPTIONS = (
    _Option("topics", (b"",), _topics_check, _A,
            "SUB prefixes to receive (none: nothing until sub.subscribe(prefix))"),
    _Option("kind", "sub", _one_of("kind", ("sub", "pull")), _A, "socket kind: sub or pull"),
    _Option("bind", False, _truth, _A, "bind instead of connect"),
    _Option("batch", None, _int_or_none("batch", 1, 1_000_000, f"None: {DEFAULT_BATCH}",
                                        DEFAULT_BATCH), _AS,
            "most messages per GIL crossing"),
    _Option("delivery", "thread", _one_of("delivery", ("thread", "caller")), _S,
            "thread (a delivery loop on a thread) or caller (poll()/recv())"),
    _Option("thread_factory", None, _factory_check, _AS, "who makes the delivery thread"),
    _Option("with_topic", False, _truth, _AS, "deliver (topic, msg)"),
    _Option("on_error", None, _callable_or_none("on_error"), _AS,
            "on_error(exc, msg) for target exceptions and decode errors"),
    _Option("rcvhwm", None, _int_or_none("rcvhwm", 0, 2 ** 31 - 1, "0: no limit"), _A,
            "zmq receive high-water mark (0: no limit)"),
    _Option("max_message_size", None,
            _int_or_none("max_message_size", 1, 2 ** 63 - 1, "None: no limit"), _A,
            "largest message in bytes, out-of-band frames decompressed included"),
    _Option("max_batch_decompressed", None,
            _int_or_none("max_batch_decompressed", 1, 2 ** 63 - 1,
                         f"None: {DEFAULT_MAX_BATCH_DECOMPRESSED}", DEFAULT_MAX_BATCH_DECOMPRESSED),
            _A, "decompressed bytes one batch list and one async queue may hold"),
    _Option("curve_server", None, _NO_CHECK, _A, "CURVE server key pair (public, secret)"),
    _Option("curve_serverkey", None, _NO_CHECK, _A,
            "the CURVE server's public key (Z85): connect encrypted"),
    _Option("curve_client", None, _NO_CHECK, _A, "CURVE client key pair (public, secret)"),
    _Option("socket_options", None, _socket_options_check, _A, "libzmq options by name"),
    _Option("decoder", None, _NO_CHECK, _AS, "payload (bytes) -> message, or an upcall.Decoder"),
    _Option("raw", False, _strict_bool("raw"), _AS, "deliver each payload's bytes undecoded"),
    _Option("copy", False, _strict_bool("copy"), _A,
            "out-of-band values as bytes (True) or memoryviews (False)"),
    _Option("max_topics", None, _int_or_none("max_topics", 1, 2 ** 31 - 1,
                                             f"None: {DEFAULT_MAX_TOPICS}", DEFAULT_MAX_TOPICS),
            _A, "most topic prefixes the subscription may hold"),
    _Option("on_event", None, _callable_or_none("on_event"), _A,
            "on_event(upcall.ConnectionEvent) for each connection event"),
    _Option("extensions", True, _strict_bool("extensions"), _AS,
            "read ext 126/127 as upcall's wire extensions in marked messages (False: never)"),
    _Option("max_streams", None, _int_or_none("max_streams", 1, 2 ** 24,
                                              f"None: {DEFAULT_MAX_STREAMS}", DEFAULT_MAX_STREAMS),
            _A, "stamped publisher streams tracked (the oldest forgotten first)"),
    _Option("allow", None, _allow_check, _A,
            "CURVE client public keys this CURVE server admits (with the bus's)"),
    _Option("authenticate", False, _strict_bool("authenticate"), _A,
            "ask the bus's authenticator about every peer (address lists, plain too)"),
    _Option("with_sender", False, _strict_bool("with_sender"), 0,
            "deliver the sender's authenticated identity too: (msg, sender)"),
    _Option("shared", True, _strict_bool("shared"), _A,
            "share one SUB socket and loop with the bus's other subscriptions to the same "
            "endpoint (False: a socket of its own)"),
)

# publisher(on_full=...): the policy's name -> the core's (csrc/bus.h, uc_full_policy).
_FULL_POLICIES = {"drop": UC_FULL_DROP, "block": UC_FULL_BLOCK, "skip": UC_FULL_SKIP}

_PUBLISHER_OPTIONS = (
    _Option("kind", "pub", _one_of("kind", ("pub", "push")), 0, "socket kind: pub or push"),
    _Option("bind", False, _truth, 0,
            "bind instead of connect (as subscribe(): nothing binds unless asked)"),
    _Option("sndhwm", None, _int_or_none("sndhwm", 0, 2 ** 31 - 1, "0: no limit"), 0,
            "zmq send high-water mark (0: no limit)"),
    _Option("linger", 2.0, _seconds_or_none("linger"), 0,
            "seconds unsent messages may keep the socket open at close"),
    _Option("curve_server", None, _NO_CHECK, 0, "CURVE server key pair (public, secret)"),
    _Option("curve_serverkey", None, _NO_CHECK, 0,
            "the CURVE server's public key (Z85): connect encrypted"),
    _Option("curve_client", None, _NO_CHECK, 0, "CURVE client key pair (public, secret)"),
    _Option("default", None, _callable_or_none("default"), 0,
            "hook of the built-in encoder for unknown types"),
    _Option("encoder", None, _callable_or_none("encoder"), 0,
            "obj -> bytes, in place of the built-in encoder"),
    _Option("socket_options", None, _socket_options_check, 0, "libzmq options by name"),
    _Option("oob_threshold", None, _oob_threshold_check, 0,
            "bytes-like values this large or larger travel out of band"),
    _Option("compression", None, _compression_check, 0, "compress out-of-band frames"),
    _Option("coalesce", False, _strict_bool("coalesce"), 0, "coalesce messages into batches"),
    _Option("max_delay", DEFAULT_MAX_DELAY, _max_delay_check, 0,
            "coalesce: seconds a batch may wait"),
    _Option("max_batch", DEFAULT_MAX_BATCH, _max_batch_check, 0, "messages per batch"),
    _Option("max_bytes", DEFAULT_MAX_BYTES, _max_bytes_check, 0, "payload bytes per batch"),
    _Option("allow", None, _allow_check, 0,
            "CURVE client public keys this CURVE server admits (with the bus's)"),
    _Option("authenticate", False, _strict_bool("authenticate"), 0,
            "ask the bus's authenticator about every peer (address lists, plain too)"),
    _Option("on_event", None, _callable_or_none("on_event"), 0,
            "on_event(upcall.ConnectionEvent) for each connection event"),
    _Option("stamp", False, _strict_bool("stamp"), 0,
            "stamp every message with its stream and sequence number (loss you can see)"),
    _Option("on_full", "drop", _one_of("on_full", tuple(_FULL_POLICIES)), 0,
            "pub at a full subscriber pipe: drop (for every subscriber) and count, block "
            "(wait, then raise), or skip (only the full one misses it, uncounted)"),
)


class _Options:
    """Keyword arguments checked once, kept frozen (see the subclasses); each
    option reads as an attribute.  ``fields``: the rows by name (name,
    default, check, help), for a command line built from them."""
    __slots__ = ("_values",)
    _ROWS = ()
    _BY_NAME = {}
    _WHAT = ""
    fields = types.MappingProxyType({})

    def __init__(self, **options):
        by_name = type(self)._BY_NAME
        for name in options:
            if name not in by_name:
                raise TypeError(f"{type(self)._WHAT} got an unexpected keyword argument {name!r}")
        values = {}
        for row in type(self)._ROWS:
            value = options.get(row.name, row.default)
            values[row.name] = value if row.check is None else row.check(value)
        object.__setattr__(self, "_values", values)
        self._check_together()

    def _check_together(self):
        pass

    def __getattr__(self, name):
        # Only for names that are not attributes: the options.
        try:
            return object.__getattribute__(self, "_values")[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}") \
                from None

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is frozen: make a new one with replace()")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __dir__(self):
        return [*object.__dir__(self), *type(self)._BY_NAME]

    def replace(self, **changes):
        """A copy with ``changes`` (checked as the constructor checks them)."""
        return type(self)(**{**self._values, **changes})

    def as_dict(self):
        """Every option by name, as kept."""
        return dict(self._values)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._values == other._values

    __hash__ = None

    def __repr__(self):
        changed = ", ".join(f"{row.name}={self._values[row.name]!r}"
                            for row in type(self)._ROWS
                            if self._values[row.name] != row.default and
                            (row.check is None or self._values[row.name] != row.check(row.default)))
        return f"upcall.{type(self).__name__}({changed})"

    def __reduce__(self):
        return (_options_from_dict, (type(self), self.as_dict()))


def _options_from_dict(cls, dict options):
    return cls(**options)


class SubscribeOptions(_Options):
    """subscribe()'s keyword arguments, checked (TypeError/ValueError naming
    the argument) and frozen: ``bus.subscribe(ep, target, options=opts)``
    opens a subscription with them, keywords given beside ``options``
    replacing its values.  Every subscription made from one options object
    gets its own decoder and socket; the object is only read."""
    __slots__ = ()
    _ROWS = _SUBSCRIBE_OPTIONS
    _BY_NAME = {row.name: row for row in _SUBSCRIBE_OPTIONS}
    fields = types.MappingProxyType(_BY_NAME)
    _WHAT = "subscribe()"

    def _check_together(self):
        _payload_decoder(self.decoder, self.raw)
        if self.kind == "pull" and self.topics not in ((), (b"",)):
            raise ValueError("topics apply to kind='sub' only; a pull socket receives everything")
        if self.kind == "sub" and len(self.topics) > self.max_topics:
            raise ValueError(f"topics: {len(self.topics)} prefixes, more than the limit "
                             f"(max_topics={self.max_topics}); pass a larger "
                             "subscribe(max_topics=...) to allow more")
        # CURVE's keys are checked with the endpoints they apply to, at open.
        _curve_keys([], self.curve_server, self.curve_serverkey, self.curve_client)


class PublisherOptions(_Options):
    """publisher()'s keyword arguments, checked and frozen, as SubscribeOptions."""
    __slots__ = ()
    _ROWS = _PUBLISHER_OPTIONS
    _BY_NAME = {row.name: row for row in _PUBLISHER_OPTIONS}
    fields = types.MappingProxyType(_BY_NAME)
    _WHAT = "publisher()"

    def _check_together(self):
        if self.default is not None and self.encoder is not None:
            raise TypeError("give default= (a hook of the built-in encoder) or encoder= (a "
                            "replacement of it), not both: pass the hook to your encoder")
        _curve_keys([], self.curve_server, self.curve_serverkey, self.curve_client)


cdef object _subscribe_options(object options, dict kwargs, int scope, str what):
    """The SubscribeOptions an entry point opens with: ``options`` (one made
    before, or None) with ``kwargs`` replacing its values; ``scope``: the
    rows this entry point takes (0: all)."""
    if scope:
        for name in kwargs:
            row = SubscribeOptions._BY_NAME.get(name)
            if row is not None and not (<int>row.scope & scope):
                raise TypeError(f"{what} got an unexpected keyword argument {name!r}")
    if options is None:
        return SubscribeOptions(**kwargs)
    if not isinstance(options, SubscribeOptions):
        raise TypeError(f"options must be an upcall.SubscribeOptions or None, "
                        f"not {type(options).__name__}")
    return options.replace(**kwargs) if kwargs else options


cdef object _publisher_options(object options, dict kwargs):
    if options is None:
        return PublisherOptions(**kwargs)
    if not isinstance(options, PublisherOptions):
        raise TypeError(f"options must be an upcall.PublisherOptions or None, "
                        f"not {type(options).__name__}")
    return options.replace(**kwargs) if kwargs else options


def _signature(rows, leading, int scope=0, extra=()):
    """inspect.Signature of an entry point: its leading parameters, then
    the rows it takes as keyword-only, then ``extra`` and ``options``."""
    P = inspect.Parameter
    params = list(leading)
    params += [P(row.name, P.KEYWORD_ONLY, default=row.default) for row in rows
               if not scope or (<int>row.scope & scope)]
    params += list(extra)
    params.append(P("options", P.KEYWORD_ONLY, default=None))
    return inspect.Signature(params)
