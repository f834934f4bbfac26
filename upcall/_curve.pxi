# CURVE security (ZeroMQ's CurveZMQ): key pairs and the per-socket roles.
#
# Keys travel as Z85 text, 40 characters for a 32-byte Curve25519 key.
# curve_keypair() returns str; every argument accepts str or bytes.  The key
# checks are upcall.certs's (plain Python, shared with certificate files).

from upcall.includes.zmq cimport zmq_has, zmq_curve_keypair, zmq_curve_public, zmq_version

from upcall.certs import _z85_key, _z85_pair

_curve_checked = False


cdef int _require_curve() except -1:
    global _curve_checked
    cdef int major = 0, minor = 0, patch = 0
    if _curve_checked:
        return 0
    if not zmq_has(b"curve"):
        zmq_version(&major, &minor, &patch)
        raise RuntimeError(
            f"CURVE security is not available: this libzmq ({major}.{minor}.{patch}) "
            "was built without libsodium/tweetnacl (Debian's libzmq5 has it)")
    _curve_checked = True
    return 0


def _curve_public(bytes secret):
    """The Z85 public key (bytes) of a checked 40-character Z85 secret key,
    as libzmq derives it (upcall.certs checks key pairs with it)."""
    cdef char derived[41]
    _require_curve()
    if zmq_curve_public(derived, secret) != 0:
        raise ValueError("cannot derive a public key from the secret key")
    return derived[:40]


def curve_keypair():
    """A new CURVE key pair ``(public, secret)``: two 40-character Z85 strings.

    Give the pair to the server side (``curve_server=(public, secret)``) and
    the public key to its clients (``curve_serverkey=public``).  Keep the
    secret key secret.  RuntimeError if libzmq has no CURVE support.
    """
    cdef char public[41]
    cdef char secret[41]
    _require_curve()
    if zmq_curve_keypair(public, secret) != 0:
        _check_rc(UC_ERR_ZMQ, "curve_keypair()")
    return (public[:40].decode("ascii"), secret[:40].decode("ascii"))


cdef object _curve_keys(list endpoints, object server, object serverkey, object client):
    """Resolve the CURVE keyword arguments of subscribe()/publisher() for
    their socket's endpoints (one role and one set of keys for all of them).

    None for a plain socket, else (serverkey, public, secret, is_server), all
    bytes (serverkey None for a server).
    """
    if server is None and serverkey is None:
        if client is not None:
            raise ValueError("curve_client needs curve_serverkey (the public key of "
                             "the CURVE server to connect to)")
        return None
    _require_curve()
    for endpoint in endpoints:
        if endpoint.startswith("inproc://"):
            # libzmq runs no security handshake on inproc: keys would be ignored.
            raise ValueError("CURVE applies to tcp:// and ipc:// endpoints; libzmq does "
                             f"no handshake on inproc:// (it never leaves the process): {endpoint!r}")
    if server is not None:
        if serverkey is not None:
            raise ValueError("curve_server and curve_serverkey are the two ends of a "
                             "CURVE link: give one of them, not both")
        if client is not None:
            raise ValueError("curve_client is for the client end (with curve_serverkey); "
                             "a CURVE server only has curve_server")
        public, secret = _z85_pair(server, "curve_server")
        return (None, public, secret, 1)
    skey = _z85_key(serverkey, "curve_serverkey")
    if client is None:
        public, secret = [k.encode("ascii") for k in curve_keypair()]
    else:
        public, secret = _z85_pair(client, "curve_client")
    return (skey, public, secret, 0)


cdef inline const char *_key_ptr(object key):
    if key is None:
        return NULL
    return <const char *>(<bytes>key)


cdef int _fill_curve(uc_curve *c, object keys) except -1:
    # keys must stay alive until the open call returns (libzmq copies them).
    if keys is not None:
        c.serverkey = _key_ptr(keys[0])
        c.publickey = _key_ptr(keys[1])
        c.secretkey = _key_ptr(keys[2])
        c.server = keys[3]
    return 0
