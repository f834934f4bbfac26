# Client authentication: the bus's ZAP handler (csrc/zap.c), the
# subscribe()/publisher() options that use it (allow=, authenticate=), and
# certificate files in the format of CZMQ's zcert and pyzmq's zmq.auth.
#
# Secret keys never reach a log, a repr or an exception text: a Certificate's
# repr names its public key only, and the key checks (_curve.pxi) name the
# position of a bad character of a secret key, not the character.

from libc.errno cimport EADDRINUSE
from libc.stdint cimport uint32_t

import datetime
import ipaddress

cdef extern from "zap.h" nogil:
    ctypedef struct uc_zap:
        pass
    enum:
        UC_ZAP_ALLOWED
        UC_ZAP_REFUSED_KEY
        UC_ZAP_REFUSED_IP
        UC_ZAP_REFUSED_MECHANISM
        UC_ZAP_MALFORMED
        UC_ZAP_STAT_COUNT
        UC_ZAP_ALLOW
        UC_ZAP_DENY
        UC_ZAP_DOMAIN_MAX
    ctypedef void (*uc_zap_log_fn)(void *ctx, int cause, const char *address,
                                   const char *public_z85, uint64_t unreported) noexcept
    uc_zap *uc_zap_start(uc_bus *bus, int *err)
    void uc_zap_stop(uc_zap *zap)
    int uc_zap_allow_key(uc_zap *zap, uint32_t domain, const char *public_z85)
    int uc_zap_revoke_key(uc_zap *zap, uint32_t domain, const char *public_z85)
    int uc_zap_address(uc_zap *zap, int list, const char *address, int add)
    uint32_t uc_zap_domain_new(uc_zap *zap, char *name)
    void uc_zap_stats(uc_zap *zap, uint64_t *out)
    size_t uc_zap_entries(uc_zap *zap)
    void uc_zap_set_log(uc_zap *zap, uc_zap_log_fn fn, void *ctx, int64_t window_ns)


# The causes of uc_zap_stats, as Authenticator.stats names them.
_ZAP_STAT_NAMES = ("allowed", "refused_key", "refused_address", "refused_mechanism",
                   "malformed")
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


# ---- certificates --------------------------------------------------------

_CERT_PUBLIC_BANNER = """#   ****  Generated on {0} by upcall  ****
#   ZeroMQ CURVE Public Certificate
#   Exchange securely, or use a secure mechanism to verify the contents
#   of this file after exchange. Store public certificates in your home
#   directory, in the .curve subdirectory.

"""
_CERT_SECRET_BANNER = """#   ****  Generated on {0} by upcall  ****
#   ZeroMQ CURVE **Secret** Certificate
#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.

"""


class Certificate:
    """A CURVE certificate: a public key, the secret key when this side owns
    it, and metadata (the zcert format's ``metadata`` section).

    ``Certificate(public, secret=None, metadata=None)``; keys are 40-character
    Z85 (str or bytes), checked as ``curve_server=`` checks them (the public
    key must be the secret's).  ``pair`` is ``(public, secret)`` for
    ``curve_server=`` / ``curve_client=``; a Certificate is accepted there
    and by ``allow=`` as it is.  Its repr and str never show the secret key.
    """
    __slots__ = ("public", "_secret", "metadata")

    def __init__(self, public, secret=None, metadata=None):
        if secret is None:
            pub = _z85_key(public, "public")
        else:
            pub, sec = _z85_pair((public, secret), "certificate")
            secret = sec.decode("ascii")
        object.__setattr__(self, "public", pub.decode("ascii"))
        object.__setattr__(self, "_secret", secret)
        meta = {} if metadata is None else dict(metadata)
        for k, v in meta.items():
            if not isinstance(k, str) or not isinstance(v, str) or "\n" in k + v or "=" in k:
                raise ValueError("metadata must map str names (no '=' or newline) to "
                                 "str values (no newline)")
        object.__setattr__(self, "metadata", meta)

    def __setattr__(self, name, value):
        raise AttributeError("Certificate is frozen")

    @property
    def secret(self):
        """The secret key (Z85 str), or None for a public certificate."""
        return self._secret

    @property
    def pair(self):
        """``(public, secret)``; ValueError for a public certificate."""
        if self._secret is None:
            raise ValueError(f"{self!r} holds no secret key: it cannot be a key pair")
        return (self.public, self._secret)

    def __repr__(self):
        return (f"<upcall.Certificate public={self.public!r}"
                f"{' with secret key' if self._secret is not None else ''}>")

    __str__ = __repr__

    def __eq__(self, other):
        if not isinstance(other, Certificate):
            return NotImplemented
        return self.public == other.public and self._secret == other._secret

    def __hash__(self):
        return hash(self.public)

    def save(self, directory, name):
        """Write ``name.key`` (the public certificate) and, when the secret
        key is held, ``name.key_secret`` (readable by the owner only, 0600)
        in ``directory``, in the format pyzmq's ``zmq.auth`` and CZMQ read.
        Returns ``(public_path, secret_path or None)``."""
        directory = os.fspath(directory)
        if not isinstance(name, str) or not name or os.sep in name or name in (".", ".."):
            raise ValueError(f"name must be a file name without a directory, not {name!r}")
        now = datetime.datetime.now()
        public_path = os.path.join(directory, name + ".key")
        _write_cert(public_path, _CERT_PUBLIC_BANNER.format(now), self.public, None,
                    self.metadata, 0o644)
        secret_path = None
        if self._secret is not None:
            secret_path = os.path.join(directory, name + ".key_secret")
            _write_cert(secret_path, _CERT_SECRET_BANNER.format(now), self.public,
                        self._secret, self.metadata, 0o600)
        return public_path, secret_path


def _write_cert(str path, str banner, str public, object secret, dict metadata, int mode):
    lines = [banner, "metadata\n"]
    for k, v in metadata.items():
        lines.append(f'    {k} = "{v}"\n')
    lines.append("curve\n")
    lines.append(f'    public-key = "{public}"\n')
    if secret is not None:
        lines.append(f'    secret-key = "{secret}"\n')
    # Created with its final mode (no moment readable by others), and the
    # mode set again for a file that was there before.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, "".join(lines).encode("utf-8"))
    finally:
        os.close(fd)


def create_certificates(directory, name, metadata=None):
    """A new key pair written as ``name.key`` and ``name.key_secret`` (0600)
    in ``directory`` (pyzmq's ``zmq.auth.create_certificates``); returns
    ``(public_path, secret_path)``."""
    public, secret = curve_keypair()
    return Certificate(public, secret, metadata).save(directory, name)


def load_certificate(path):
    """The Certificate in a zcert file (``name.key``: public only;
    ``name.key_secret``: with the secret key), as pyzmq's
    ``zmq.auth.load_certificate`` reads it.  OSError if it cannot be read;
    ValueError (naming the file, never a key) if it holds no valid key."""
    path = os.fspath(path)
    public = secret = None
    metadata = {}
    section = None
    with open(path, "rb") as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith(b"#"):
                continue
            if not raw[:1].isspace():
                section = line
                continue
            if b"=" not in line:
                continue
            k, v = line.split(b"=", 1)
            k = k.strip()
            v = v.strip().strip(b"'\"")
            if section == b"curve" and k == b"public-key":
                public = v
            elif section == b"curve" and k == b"secret-key":
                secret = v
            elif section == b"metadata":
                metadata[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    if public is None:
        raise ValueError(f"{path}: no public-key in its curve section: not a certificate file")
    try:
        return Certificate(public, secret, metadata)
    except (TypeError, ValueError) as exc:
        # The text names the key checked, never its value beyond a position.
        raise ValueError(f"{path}: {exc}") from None


def load_certificates(directory):
    """The public certificates (every ``*.key`` file) of ``directory``,
    sorted by file name: the allow-list pyzmq's ``configure_curve(location=)``
    reads."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ValueError(f"{directory!r} is not a directory of certificates")
    return [load_certificate(os.path.join(directory, n))
            for n in sorted(os.listdir(directory)) if n.endswith(".key")]


def _public_keys(object keys, str name):
    """Z85 public keys (bytes) from keys (str/bytes), Certificates, a
    directory (os.PathLike) of certificates, or an iterable of those."""
    if isinstance(keys, (str, bytes, bytearray, memoryview, Certificate)):
        keys = [keys]
    elif isinstance(keys, os.PathLike):
        keys = load_certificates(keys)
    else:
        try:
            keys = list(keys)
        except TypeError:
            raise TypeError(f"{name} must be public keys (Z85 str/bytes), Certificates, a "
                            f"directory (pathlib.Path) of certificates, or a list of those, "
                            f"not {type(keys).__name__}") from None
    out = []
    for i, k in enumerate(keys):
        if isinstance(k, Certificate):
            out.append((<str>k.public).encode("ascii"))
        elif isinstance(k, os.PathLike):
            out.extend((<str>c.public).encode("ascii") for c in load_certificates(k))
        else:
            out.append(_z85_key(k, f"{name}[{i}]"))
    return out


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
            return self._domains[socket]
        except (KeyError, TypeError):
            raise ValueError(f"socket={socket!r} was not opened with allow= or "
                             "authenticate=True on this bus") from None

    def allow(self, keys, *, socket=None):
        """Admit CURVE clients: ``keys`` are public keys (Z85 str/bytes),
        Certificates, a directory (``pathlib.Path``) of public certificates,
        or a list of those; on every CURVE server of the bus, or only on
        ``socket`` (a Subscription or Publisher opened with ``allow=``)."""
        self._check()
        cdef uint32_t domain = self._domain_of(socket)
        for key in _public_keys(keys, "keys"):
            _check_rc(uc_zap_allow_key(self._c, domain, <const char *>(<bytes>key)), "allow")

    def revoke(self, keys, *, socket=None):
        """Refuse these keys' next handshakes (see the class: a connection
        already accepted stays until it closes)."""
        self._check()
        cdef uint32_t domain = self._domain_of(socket)
        for key in _public_keys(keys, "keys"):
            _check_rc(uc_zap_revoke_key(self._c, domain, <const char *>(<bytes>key)), "revoke")

    cdef _address(self, object addresses, int which, int add):
        self._check()
        if isinstance(addresses, str):
            addresses = [addresses]
        for a in addresses:
            if not isinstance(a, str):
                raise TypeError(f"addresses must be str (e.g. '127.0.0.1'), not {type(a).__name__}")
            try:
                ipaddress.ip_address(a)
            except ValueError:
                raise ValueError(f"addresses: {a!r} is not an IPv4 or IPv6 address") from None
            _check_rc(uc_zap_address(self._c, which, a.encode("ascii"), add), "address")

    def allow_address(self, addresses):
        """Admit only these peer addresses (plus others allowed so), on
        CURVE servers and on sockets with ``authenticate=True``."""
        self._address(addresses, UC_ZAP_ALLOW, 1)

    def deny_address(self, addresses):
        """Refuse these peer addresses (checked before the allow list)."""
        self._address(addresses, UC_ZAP_DENY, 1)

    def forget_address(self, addresses):
        """Take these addresses off both lists."""
        self._address(addresses, UC_ZAP_ALLOW, 0)
        self._address(addresses, UC_ZAP_DENY, 0)

    @property
    def stats(self):
        """Handshakes answered, by outcome: allowed, refused_key,
        refused_address, refused_mechanism, malformed (once stopped: the
        final counts)."""
        cdef uint64_t out[8]
        if self._c == NULL and self._final is not None:
            return dict(self._final)
        self._check()
        uc_zap_stats(self._c, out)
        return {name: out[i] for i, name in enumerate(_ZAP_STAT_NAMES)}

    @property
    def entries(self):
        """Keys and addresses held (what its memory grows with)."""
        self._check()
        return uc_zap_entries(self._c)

    @property
    def running(self):
        return self._c != NULL

    def __repr__(self):
        return f"<upcall.Authenticator {'running' if self._c != NULL else 'stopped'}>"

    cdef void _stop(self) noexcept:
        cdef uc_zap *c = self._c
        cdef uint64_t out[8]
        if c != NULL:
            uc_zap_stats(c, out)
            self._final = {name: out[i] for i, name in enumerate(_ZAP_STAT_NAMES)}
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


cdef object _auth_domain(Bus bus, object opts, object curve):
    """For a socket being opened: None (no authentication asked), or
    (Authenticator, domain id, ZMQ_ZAP_DOMAIN bytes) with its allow= keys
    registered."""
    cdef char name[UC_ZAP_DOMAIN_MAX]
    cdef uint32_t domain
    allow = opts.allow
    if allow is None and not opts.authenticate:
        return None
    if allow is not None and (curve is None or not curve[3]):
        raise ValueError("allow= lists the CURVE clients a CURVE server admits: it needs "
                         "curve_server=(public, secret) (authenticate=True applies the "
                         "address lists to a plain socket)")
    keys = [] if allow is None else _public_keys(allow, "allow")
    auth = _start_authenticator(bus)
    domain = uc_zap_domain_new((<Authenticator>auth)._c, name)
    for key in keys:
        _check_rc(uc_zap_allow_key((<Authenticator>auth)._c, domain, <const char *>(<bytes>key)),
                  "allow")
    return (auth, domain, <bytes>name)


cdef void _auth_register(object dom, object socket):
    if dom is not None:
        (<Authenticator>dom[0])._domains[socket] = dom[1]


def _allow_check(value):
    if value is not None:
        _public_keys(value, "allow")       # converted again at open
    return value
