# Socket options: the libzmq options a deployment tunes (heartbeats, TCP
# keepalive, reconnection, ...), given by name to subscribe() and publisher()
# as socket_options={"heartbeat_ivl": 1000, ...}.  Checked here, before any
# socket is opened, so that a mistake names its option (libzmq's own check is
# the backstop).  Units are libzmq's: milliseconds, except the TCP keepalive
# times, which are the kernel's seconds.

from upcall.includes.zmq cimport (
    ZMQ_HEARTBEAT_IVL, ZMQ_HEARTBEAT_TTL, ZMQ_HEARTBEAT_TIMEOUT, ZMQ_TCP_KEEPALIVE,
    ZMQ_TCP_KEEPALIVE_IDLE, ZMQ_TCP_KEEPALIVE_CNT, ZMQ_TCP_KEEPALIVE_INTVL, ZMQ_TCP_MAXRT,
    ZMQ_RECONNECT_IVL, ZMQ_RECONNECT_IVL_MAX, ZMQ_CONNECT_TIMEOUT, ZMQ_HANDSHAKE_IVL,
    ZMQ_IMMEDIATE, ZMQ_IPV6, ZMQ_BACKLOG, ZMQ_SNDBUF, ZMQ_RCVBUF, ZMQ_TOS)

from collections.abc import Mapping

_INT_MAX = 2 ** 31 - 1

# name: (libzmq option, smallest, largest, a special value outside that range
# or None, unit).  The ranges are what libzmq and Linux accept: a value they
# would refuse later (some only when a connection is made) is refused here.
_SOCKET_OPTIONS = {
    "heartbeat_ivl": (ZMQ_HEARTBEAT_IVL, 0, _INT_MAX, None, "milliseconds; 0: no heartbeats"),
    "heartbeat_ttl": (ZMQ_HEARTBEAT_TTL, 0, 6553599, None, "milliseconds, in tenths of a second"),
    "heartbeat_timeout": (ZMQ_HEARTBEAT_TIMEOUT, 0, _INT_MAX, None, "milliseconds"),
    "tcp_keepalive": (ZMQ_TCP_KEEPALIVE, 0, 1, -1, "-1: the OS default, 0: off, 1: on"),
    "tcp_keepalive_idle": (ZMQ_TCP_KEEPALIVE_IDLE, 1, 32767, -1, "seconds; -1: the OS default"),
    "tcp_keepalive_cnt": (ZMQ_TCP_KEEPALIVE_CNT, 1, 127, -1, "probes; -1: the OS default"),
    "tcp_keepalive_intvl": (ZMQ_TCP_KEEPALIVE_INTVL, 1, 32767, -1, "seconds; -1: the OS default"),
    "tcp_maxrt": (ZMQ_TCP_MAXRT, 0, _INT_MAX, None, "milliseconds; 0: the OS default"),
    "reconnect_ivl": (ZMQ_RECONNECT_IVL, 0, _INT_MAX, -1, "milliseconds; -1: never reconnect"),
    "reconnect_ivl_max": (ZMQ_RECONNECT_IVL_MAX, 0, _INT_MAX, None,
                          "milliseconds; 0: always reconnect_ivl"),
    "connect_timeout": (ZMQ_CONNECT_TIMEOUT, 0, _INT_MAX, None, "milliseconds; 0: the OS's"),
    "handshake_ivl": (ZMQ_HANDSHAKE_IVL, 0, _INT_MAX, None, "milliseconds; 0: no limit"),
    "immediate": (ZMQ_IMMEDIATE, 0, 1, None, "a bool"),
    "ipv6": (ZMQ_IPV6, 0, 1, None, "a bool"),
    "backlog": (ZMQ_BACKLOG, 0, _INT_MAX, None, "pending connections"),
    "sndbuf": (ZMQ_SNDBUF, 0, _INT_MAX, -1, "bytes; -1: the OS default"),
    "rcvbuf": (ZMQ_RCVBUF, 0, _INT_MAX, -1, "bytes; -1: the OS default"),
    "tos": (ZMQ_TOS, 0, 255, None, "the IP type-of-service byte"),
}

# Options upcall sets itself or depends on (csrc uc_sockopt_reserved), and
# what to use instead.
_REFUSED_OPTIONS = {
    "linger": "upcall sets it: use publisher(linger=seconds); a subscription never lingers",
    "rcvhwm": "upcall sets it: use subscribe(rcvhwm=...)",
    "sndhwm": "upcall sets it: use publisher(sndhwm=...); a subscription's send queue "
              "carries only its prefixes and has no limit, so that none is dropped "
              "(subscribe(max_topics=...) bounds how many)",
    "maxmsgsize": "upcall sets it: use subscribe(max_message_size=...)",
    "curve_server": "upcall sets it: use curve_server=(public, secret)",
    "curve_publickey": "upcall sets it: use curve_server= or curve_client=",
    "curve_secretkey": "upcall sets it: use curve_server= or curve_client=",
    "curve_serverkey": "upcall sets it: use curve_serverkey=",
    "subscribe": "upcall sets it: use subscribe(topics=...) and sub.subscribe()",
    "unsubscribe": "upcall sets it: use sub.unsubscribe()",
    "conflate": "not supported: upcall's messages have several frames, which "
                "ZMQ_CONFLATE would mangle",
    "rcvtimeo": "not used: upcall never blocks in a receive; poll(timeout=...) and "
                "close(timeout=...) take seconds",
    "sndtimeo": "not used: use send(timeout=seconds)",
}


cdef list _socket_options(object options):
    """``socket_options`` as a list of (libzmq option, value), checked."""
    if options is None:
        return []
    if not isinstance(options, Mapping):
        raise TypeError("socket_options must be a mapping of option names to values, such as "
                        f"{{'heartbeat_ivl': 1000}}, not {type(options).__name__}")
    checked = []
    for name, value in options.items():
        if not isinstance(name, str):
            raise TypeError("socket_options: option names are str such as 'heartbeat_ivl', "
                            f"not {type(name).__name__} {name!r}")
        spec = _SOCKET_OPTIONS.get(name)
        if spec is None:
            key = name.lower()
            if key.startswith("zmq_"):
                key = key[4:]
            if key in _REFUSED_OPTIONS:
                raise ValueError(f"socket_options[{name!r}]: {_REFUSED_OPTIONS[key]}")
            hint = f"; did you mean {key!r}?" if key in _SOCKET_OPTIONS else ""
            raise ValueError(f"socket_options: unknown option {name!r}{hint} (known: "
                             f"{', '.join(sorted(_SOCKET_OPTIONS))})")
        option, low, high, special, unit = spec
        if not isinstance(value, int) or (isinstance(value, bool) and unit != "a bool"):
            raise TypeError(f"socket_options[{name!r}] must be an int ({unit}), "
                            f"not {type(value).__name__}")
        if not (low <= value <= high or value == special):
            allowed = f"between {low} and {high}" + ("" if special is None else f", or {special}")
            raise ValueError(f"socket_options[{name!r}] must be {allowed} ({unit}), "
                             f"not {value!r}")
        checked.append((option, int(value)))
    return checked


cdef uc_sockopt *_sockopt_array(list checked) except? NULL:
    """The C array of _socket_options()'s result (NULL when empty); the
    caller frees it."""
    cdef uc_sockopt *opts
    cdef Py_ssize_t i
    if not checked:
        return NULL
    opts = <uc_sockopt *>malloc(len(checked) * sizeof(uc_sockopt))
    if opts == NULL:
        raise MemoryError()
    for i, (option, value) in enumerate(checked):
        opts[i].option = option
        opts[i].value = value
    return opts
