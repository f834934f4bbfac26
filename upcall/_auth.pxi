# Client authentication: the bridge to the bus's ZAP handler (csrc/zap.c)
# and the subscribe()/publisher() options that use it (allow=,
# authenticate=).  Certificate files are upcall.certs's (plain Python).

from libc.errno cimport EADDRINUSE
from libc.stdint cimport uint32_t

import ipaddress

from upcall.certs import _public_keys

# The causes of uc_zap_stats, as Authenticator.stats names them, keyed by
# the C enum's values (so that a reordering of the enum cannot mislabel).
_ZAP_STAT_NAMES = {
    UC_ZAP_ALLOWED: "allowed",
    UC_ZAP_REFUSED_KEY: "refused_key",
    UC_ZAP_REFUSED_IP: "refused_address",
    UC_ZAP_REFUSED_MECHANISM: "refused_mechanism",
    UC_ZAP_MALFORMED: "malformed",
}


cdef dict _zap_stats_dict(const uint64_t *out):
    """uc_zap_stats' counters by name."""
    return {_ZAP_STAT_NAMES[i]: out[i] for i in range(<int>UC_ZAP_STAT_COUNT)}

_ZAP_CAUSE_TEXT = {
    UC_ZAP_REFUSED_KEY: "a CURVE client key on no allow list",
    UC_ZAP_REFUSED_IP: "an address denied (or not on the allow list)",
    UC_ZAP_REFUSED_MECHANISM: "a security mechanism upcall does not offer",
    UC_ZAP_MALFORMED: "a malformed ZAP request",
}

# Seconds between two log records of one refusal cause (the rest are counted
# in Authenticator.stats and summed up in the next record).  Read when the
# handler starts.
AUTH_LOG_INTERVAL = 10.0


cdef void _zap_log(void *ctx, int cause, const char *address, const char *z85,
                   uint64_t unreported) noexcept with gil:
    # No object behind ctx: the handler's thread may log while the bus and
    # its Authenticator are being collected.
    try:
        key = z85.decode("ascii")
        _log.warning("upcall: handshake refused: %s (from %s%s)%s",
                     _ZAP_CAUSE_TEXT.get(cause, "refused"), address.decode("utf-8", "replace"),
                     f", public key {key}" if key else "",
                     f"; {unreported} more refusals of this kind since the last record "
                     f"(at most one per {AUTH_LOG_INTERVAL:g} s)" if unreported else "",
                     extra={"auth_cause": _ZAP_STAT_NAMES[cause], "address":
                            address.decode("utf-8", "replace"), "public_key": key or None,
                            "left_out": unreported})
    except BaseException as exc:
        _write_unraisable(exc, None)


# ---- the authenticator ---------------------------------------------------

@cython.final
cdef class Authenticator:
    """The bus's ZAP handler: who may complete a handshake with its sockets.

    Made by ``bus.authenticator()`` or by the first socket opened with
    ``allow=`` / ``authenticate=True``; one per bus, running until the bus
    closes.  Once it runs, every CURVE server socket of the bus admits only
    clients whose public key is allowed (bus-wide here, or on that socket's
    ``allow=`` list), and every socket with ``authenticate=True`` (plain ones
    too) applies the address lists.  Changes apply to the next handshake;
    a connection already accepted is not closed (libzmq has no call for it).
    """
    cdef uc_zap *_c
    cdef object _bus_ref
    cdef object _domains      # WeakKeyDictionary: socket -> its domain id
    cdef dict _final          # the stats when it stopped
    cdef object __weakref__

    def __cinit__(self):
        self._c = NULL

    def __init__(self, *args, **kwargs):
        raise TypeError("cannot create Authenticator objects directly: use bus.authenticator()")

    def __dealloc__(self):
        cdef uc_zap *c = self._c
        self._c = NULL
        if c != NULL:
            with nogil:
                uc_zap_stop(c)

    cdef int _check(self) except -1:
        if self._c == NULL:
            raise ValueError("the authenticator is stopped: its bus was closed")
        return 0

    cdef uint32_t _domain_of(self, object socket) except? 0:
        if socket is None:
            return 0
        try:
            return (<_ZapDomain>self._domains[socket]).id
        except (KeyError, TypeError):
            if getattr(socket, "closed", False):
                raise ValueError(f"socket={socket!r} is closed: its allow= keys went "
                                 "with it") from None
            raise ValueError(f"socket={socket!r} was not opened with allow= or "
                             "authenticate=True on this bus") from None

    cdef void _forget_socket(self, object socket):
        # The socket closed: its domain's keys go (see _ZapDomain).
        try:
            self._domains.pop(socket, None)
        except TypeError:
            pass

    def allow(self, keys, *, socket=None):
        """Admit CURVE clients: ``keys`` are public keys (Z85 str/bytes),
        Certificates, a directory (``pathlib.Path``) of public certificates,
        or a list of those; on every CURVE server of the bus, or only on
        ``socket`` (a Subscription or Publisher opened with ``allow=``).
        A socket's keys are forgotten when it closes."""
        self._check()
        cdef uint32_t domain = self._domain_of(socket)
        for key in _public_keys(keys, "keys"):
            _check_rc(uc_zap_allow_key(self._c, domain, <const char *>(<bytes>key)), "allow")

    def revoke(self, keys, *, socket=None):
        """Refuse these keys' next handshakes (see the class: a connection
        already accepted stays until it closes).

        Without ``socket``: the keys are taken out of every scope they were
        allowed in, bus-wide and every socket's ``allow=`` list.  With
        ``socket``: out of that socket's list; a key allowed bus-wide would
        still be admitted there, so that is a ValueError naming the key, and
        nothing is revoked (revoke it bus-wide, then allow it again on the
        sockets that keep it)."""
        self._check()
        cdef uint32_t domain = self._domain_of(socket)
        cdef int rc
        keys = _public_keys(keys, "keys")
        if domain != 0:
            for i, key in enumerate(keys):
                if uc_zap_key_bus_wide(self._c, <const char *>(<bytes>key)) == 1:
                    raise ValueError(_bus_wide_text(key, i))
        for i, key in enumerate(keys):
            rc = uc_zap_revoke_key(self._c, domain, <const char *>(<bytes>key))
            if rc == UC_ZAP_BUS_WIDE:      # allowed bus-wide since the check above
                raise ValueError(_bus_wide_text(key, i))
            _check_rc(rc, "revoke")

    cdef _address(self, object addresses, int which, int add):
        self._check()
        for a in _networks(addresses):
            _check_rc(uc_zap_address(self._c, which, a, add), "address")

    def allow_address(self, addresses):
        """Admit only these peer addresses (plus others allowed so), on
        CURVE servers and on sockets with ``authenticate=True``.

        ``addresses``: one str or a list of them, each an IPv4 or IPv6
        address ("127.0.0.1", "::1") or network ("10.0.0.0/8", "fd00::/8").
        Compared as addresses, not text: every spelling of an address is
        the same one, and an IPv4 address is its IPv4-mapped IPv6 form
        (how a dual-stack socket, ``socket_options={"ipv6": 1}``, reports
        an IPv4 peer)."""
        self._address(addresses, UC_ZAP_ALLOW, 1)

    def deny_address(self, addresses):
        """Refuse these peer addresses or networks (checked before the allow
        list; spelled as for ``allow_address``)."""
        self._address(addresses, UC_ZAP_DENY, 1)

    def forget_address(self, addresses):
        """Take these addresses or networks off both lists (the same
        address or network, however spelled)."""
        self._address(addresses, UC_ZAP_ALLOW, 0)
        self._address(addresses, UC_ZAP_DENY, 0)

    @property
    def stats(self):
        """Handshakes answered, by outcome: allowed, refused_key,
        refused_address, refused_mechanism, malformed (once stopped: the
        final counts)."""
        cdef uint64_t out[UC_ZAP_STAT_COUNT]
        if self._c == NULL and self._final is not None:
            return dict(self._final)
        self._check()
        uc_zap_stats(self._c, out)
        return _zap_stats_dict(out)

    @property
    def entries(self):
        """Keys held, one per scope each is allowed in (bus-wide, each open
        socket's list), plus addresses and networks held: what its memory
        grows with."""
        self._check()
        return uc_zap_entries(self._c)

    @property
    def running(self):
        return self._c != NULL

    def __repr__(self):
        return f"<upcall.Authenticator {'running' if self._c != NULL else 'stopped'}>"

    cdef void _stop(self) noexcept:
        cdef uc_zap *c = self._c
        cdef uint64_t out[UC_ZAP_STAT_COUNT]
        if c != NULL:
            uc_zap_stats(c, out)
            self._final = _zap_stats_dict(out)
        self._c = NULL
        if c != NULL:
            with nogil:
                uc_zap_stop(c)


cdef Authenticator _start_authenticator(Bus bus):
    cdef int err = 0
    cdef Authenticator auth
    if bus._auth is not None:
        return <Authenticator>bus._auth
    bus._check_open()
    auth = Authenticator.__new__(Authenticator)
    auth._c = uc_zap_start(bus._c, &err)
    if auth._c == NULL:
        if err == UC_ERR_ZMQ and errno == EADDRINUSE:
            raise RuntimeError("another ZAP handler is bound in this bus's zmq context")
        _check_rc(err, "authenticator()")
    try:
        window = float(AUTH_LOG_INTERVAL)
    except Exception:
        window = 10.0
    uc_zap_set_log(auth._c, _zap_log, NULL, <int64_t>(window * 1e9))
    auth._bus_ref = weakref.ref(bus)
    auth._domains = weakref.WeakKeyDictionary()
    bus._auth = auth
    return auth


@cython.final
cdef class _ZapDomain:
    """One socket's domain of the authenticator: its allow= keys are dropped
    when this goes, that is when the socket closes (Bus._forget), is
    collected, or fails to open."""
    cdef object _auth_ref      # weakref to the Authenticator
    cdef readonly uint32_t id
    cdef readonly bytes name

    def __dealloc__(self):
        auth = self._auth_ref() if self._auth_ref is not None else None
        if auth is not None and (<Authenticator>auth)._c != NULL:
            uc_zap_domain_drop((<Authenticator>auth)._c, self.id)


cdef object _auth_domain(Bus bus, object opts, object curve):
    """For a socket being opened: None (no authentication asked), or its
    _ZapDomain with its allow= keys registered."""
    cdef char name[UC_ZAP_DOMAIN_MAX]
    cdef _ZapDomain dom
    allow = opts.allow
    if allow is None and not opts.authenticate:
        return None
    if allow is not None and (curve is None or not curve[3]):
        raise ValueError("allow= lists the CURVE clients a CURVE server admits: it needs "
                         "curve_server=(public, secret) (authenticate=True applies the "
                         "address lists to a plain socket)")
    keys = [] if allow is None else _public_keys(allow, "allow")
    auth = _start_authenticator(bus)
    dom = _ZapDomain.__new__(_ZapDomain)
    dom.id = uc_zap_domain_new((<Authenticator>auth)._c, name)
    dom.name = <bytes>name
    dom._auth_ref = weakref.ref(auth)
    for key in keys:
        _check_rc(uc_zap_allow_key((<Authenticator>auth)._c, dom.id,
                                   <const char *>(<bytes>key)), "allow")
    return dom


cdef void _auth_register(object dom, object socket):
    cdef object auth
    if dom is not None:
        auth = (<_ZapDomain>dom)._auth_ref()
        if auth is not None:
            (<Authenticator>auth)._domains[socket] = dom


cdef void _auth_forget(object auth, object socket):
    if auth is not None:
        (<Authenticator>auth)._forget_socket(socket)


def _bus_wide_text(bytes key, int i):
    return (f"keys[{i}] ({key.decode('ascii')}) is allowed bus-wide: revoking it on one "
            "socket would leave it admitted there; nothing was revoked (revoke(key) "
            "without socket= takes it out of every scope)")


def _networks(addresses):
    """The address lists' entries as canonical text (bytes) for the core, or
    TypeError/ValueError naming the argument."""
    if isinstance(addresses, str):
        addresses = [addresses]
    else:
        try:
            addresses = list(addresses)
        except TypeError:
            raise TypeError("addresses must be a str or a list of str (e.g. '127.0.0.1', "
                            f"'10.0.0.0/8'), not {type(addresses).__name__}") from None
    out = []
    for i, a in enumerate(addresses):
        if not isinstance(a, str):
            raise TypeError(f"addresses[{i}] must be str (e.g. '127.0.0.1'), "
                            f"not {type(a).__name__}")
        try:
            net = ipaddress.ip_network(a, strict=True)
        except ValueError as exc:
            raise ValueError(f"addresses[{i}]: {a!r} is not an IPv4 or IPv6 address or "
                             f"network ({exc})") from None
        if net.prefixlen == net.max_prefixlen:
            out.append(str(net.network_address).encode("ascii"))
        else:
            out.append(str(net).encode("ascii"))
    return out


def _allow_check(value):
    if value is not None:
        _public_keys(value, "allow", False)   # directories are read at open
    return value
