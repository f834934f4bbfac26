"""CURVE certificate files, in the format of CZMQ's zcert and pyzmq's zmq.auth.

A certificate is a public key, the secret key when this side owns it, and
metadata.  ``NAME.key`` holds the public certificate (give it to peers),
``NAME.key_secret`` the pair (readable by its owner only).

This module is plain Python and imports no extension when it is loaded:
reading and checking public certificates needs nothing else.  Two things
need libzmq and load upcall's extension when first asked for: a new key
pair (``create_certificates``) and the check that a secret key's public key
is the one given with it (a Certificate holding a secret key).

Secret keys never reach a log, a repr or an exception text: a Certificate's
repr names its public key only, and the key checks name the position of a
bad character of a secret key, not the character.
"""
from __future__ import annotations

import datetime
import errno
import os
import stat
from collections.abc import Iterable, Mapping
from typing import Union

__all__ = ["Certificate", "create_certificates", "load_certificate", "load_certificates"]

CurveKey = Union[str, bytes]

# Z85 (ZeroMQ RFC 32): 5 characters encode 4 bytes; a 32-byte key is 40.
_Z85_CHARS = ("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
              ".-:+=^!/*?&<>()[]{}@%$#")
_Z85_INDEX = {c: i for i, c in enumerate(_Z85_CHARS)}
_Z85_KEY_CHARS = 40

#: The largest certificate file read (a zcert file is a few hundred bytes);
#: a larger one is refused rather than read into memory.
MAX_CERTIFICATE_FILE = 64 * 1024

_PUBLIC_SUFFIX = ".key"
_SECRET_SUFFIX = ".key_secret"

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


def _z85_key(key: object, name: str) -> bytes:
    """A 40-character Z85 key as ASCII bytes, or TypeError/ValueError naming
    ``name`` (a secret key's characters are never shown)."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        try:
            text = bytes(key).decode("ascii")
        except UnicodeDecodeError:
            raise ValueError(f"{name} must be a 40-character Z85 key; "
                             "it holds non-ASCII bytes") from None
    elif isinstance(key, str):
        text = key
    else:
        raise TypeError(f"{name} must be a 40-character Z85 key as str or bytes, "
                        f"not {type(key).__name__}")
    if len(text) != _Z85_KEY_CHARS:
        raise ValueError(f"{name} must be a 40-character Z85 key (a 32-byte CURVE key), "
                         f"not {len(text)} characters")
    if text.strip(_Z85_CHARS):
        pos = next(i for i, c in enumerate(text) if c not in _Z85_INDEX)
        shown = "the character" if "secret" in name else repr(text[pos])
        raise ValueError(f"{name} is not a Z85 key: {shown} at position "
                         f"{pos} is not a Z85 character")
    for start in range(0, _Z85_KEY_CHARS, 5):
        # 85**5 > 2**32: a group can encode too much only when its first
        # digit is 82 or more (82 * 85**4 < 2**32 < 83 * 85**4).
        if _Z85_INDEX[text[start]] >= 82:
            value = 0
            for pos in range(start, start + 5):
                value = value * 85 + _Z85_INDEX[text[pos]]
            if value > 0xFFFFFFFF:
                raise ValueError(f"{name} is not a Z85 key: characters {start}-{start + 4} "
                                 "encode more than 32 bits")
    return text.encode("ascii")


def _z85_pair(pair: object, name: str) -> tuple[bytes, bytes]:
    """(public, secret) as bytes; checks that the public key is the secret's
    (libzmq derives it: the extension is loaded here)."""
    if isinstance(pair, Certificate):
        pair = pair.pair
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"{name} must be a (public, secret) pair of Z85 keys as made "
                        f"by upcall.curve_keypair(), not {type(pair).__name__}"
                        + (f" of length {len(pair)}" if isinstance(pair, (tuple, list)) else ""))
    public = _z85_key(pair[0], f"{name}[0] (the public key)")
    secret = _z85_key(pair[1], f"{name}[1] (the secret key)")
    from upcall._bus import _curve_public
    try:
        derived = _curve_public(secret)
    except ValueError:
        raise ValueError(f"{name}: cannot derive a public key from the secret key") from None
    if derived != public:
        raise ValueError(f"{name}: the public key is not the one of this secret key "
                         "(is the pair in (public, secret) order?)")
    return (public, secret)


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
    public: str
    _secret: str | None
    metadata: dict[str, str]

    def __init__(self, public: CurveKey, secret: CurveKey | None = None,
                 metadata: Mapping[str, str] | None = None) -> None:
        if secret is None:
            pub = _z85_key(public, "public")
            sec = None
        else:
            pub, sec_bytes = _z85_pair((public, secret), "certificate")
            sec = sec_bytes.decode("ascii")
        object.__setattr__(self, "public", pub.decode("ascii"))
        object.__setattr__(self, "_secret", sec)
        meta = {} if metadata is None else dict(metadata)
        for k, v in meta.items():
            if not isinstance(k, str) or not isinstance(v, str) or "\n" in k + v or "=" in k:
                raise ValueError("metadata must map str names (no '=' or newline) to "
                                 "str values (no newline)")
        object.__setattr__(self, "metadata", meta)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Certificate is frozen")

    @property
    def secret(self) -> str | None:
        """The secret key (Z85 str), or None for a public certificate."""
        return self._secret

    @property
    def pair(self) -> tuple[str, str]:
        """``(public, secret)``; ValueError for a public certificate."""
        if self._secret is None:
            raise ValueError(f"{self!r} holds no secret key: it cannot be a key pair")
        return (self.public, self._secret)

    def __repr__(self) -> str:
        return (f"<upcall.Certificate public={self.public!r}"
                f"{' with secret key' if self._secret is not None else ''}>")

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Certificate):
            return NotImplemented
        return self.public == other.public and self._secret == other._secret

    def __hash__(self) -> int:
        return hash(self.public)

    def save(self, directory: str | os.PathLike[str], name: str, *,
             overwrite: bool = False) -> tuple[str, str | None]:
        """Write ``name.key`` (the public certificate) and, when the secret
        key is held, ``name.key_secret`` (readable by the owner only, 0600)
        in ``directory``, in the format pyzmq's ``zmq.auth`` and CZMQ read.
        Returns ``(public_path, secret_path or None)``.

        A file (or a symbolic link, dangling or not) already at either path
        is a FileExistsError, unless ``overwrite=True``: then the path is
        replaced (a link itself, never the file it points to)."""
        directory = os.fspath(directory)
        if not isinstance(name, str) or not name or os.sep in name or name in (".", ".."):
            raise ValueError(f"name must be a file name without a directory, not {name!r}")
        now = datetime.datetime.now()
        public_path = os.path.join(directory, name + _PUBLIC_SUFFIX)
        secret_path = (os.path.join(directory, name + _SECRET_SUFFIX)
                       if self._secret is not None else None)
        if not overwrite:
            # Both checked first: no public file written beside a refused secret one.
            for path in (public_path, secret_path):
                if path is not None and os.path.lexists(path):
                    raise FileExistsError(errno.EEXIST, "exists (overwrite=True replaces it)", path)
        _write_cert(public_path, _CERT_PUBLIC_BANNER.format(now), self.public, None,
                    self.metadata, 0o644, overwrite)
        if secret_path is not None:
            _write_cert(secret_path, _CERT_SECRET_BANNER.format(now), self.public,
                        self._secret, self.metadata, 0o600, overwrite)
        return public_path, secret_path


def _write_cert(path: str, banner: str, public: str, secret: str | None,
                metadata: dict[str, str], mode: int, overwrite: bool) -> None:
    lines = [banner, "metadata\n"]
    for k, v in metadata.items():
        lines.append(f'    {k} = "{v}"\n')
    lines.append("curve\n")
    lines.append(f'    public-key = "{public}"\n')
    if secret is not None:
        lines.append(f'    secret-key = "{secret}"\n')
    data = "".join(lines).encode("utf-8")
    # O_EXCL | O_NOFOLLOW: a new file, never one a link leads to (O_EXCL
    # fails on any link there, dangling or not); created with its final mode,
    # so that no moment exists at which others can read it.  Replacing writes
    # a new file beside it and renames it over the path: the rename replaces
    # a link itself, not its target.
    target = path
    if overwrite:
        target = os.path.join(os.path.dirname(path) or ".",
                              f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                 | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        try:
            os.fchmod(fd, mode)       # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        if overwrite:
            os.replace(target, path)
    except BaseException:
        if overwrite:
            try:
                os.unlink(target)
            except OSError:
                pass
        raise


def create_certificates(directory: str | os.PathLike[str], name: str,
                        metadata: Mapping[str, str] | None = None, *,
                        overwrite: bool = False) -> tuple[str, str]:
    """A new key pair written as ``name.key`` and ``name.key_secret`` (0600)
    in ``directory`` (pyzmq's ``zmq.auth.create_certificates``); returns
    ``(public_path, secret_path)``.  FileExistsError if either path exists
    (a link included), unless ``overwrite=True``."""
    from upcall._bus import curve_keypair
    public, secret = curve_keypair()
    public_path, secret_path = Certificate(public, secret, metadata).save(
        directory, name, overwrite=overwrite)
    assert secret_path is not None
    return public_path, secret_path


def _read_regular(path: str) -> bytes:
    """The bytes of a regular file; ValueError for anything else (a FIFO, a
    device, a directory: never opened in a way that could block)."""
    # O_NONBLOCK: opening a FIFO for reading would wait for a writer.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file: not a certificate file")
        if st.st_size > MAX_CERTIFICATE_FILE:
            raise ValueError(f"{path}: {st.st_size} bytes, more than a certificate file "
                             f"holds (at most {MAX_CERTIFICATE_FILE})")
        chunks = []
        size = 0
        while True:
            chunk = os.read(fd, 16384)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_CERTIFICATE_FILE:
                raise ValueError(f"{path}: more than a certificate file holds "
                                 f"(at most {MAX_CERTIFICATE_FILE} bytes)")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_certificate(path: str | os.PathLike[str]) -> Certificate:
    """The Certificate in a zcert file (``name.key``: public only;
    ``name.key_secret``: with the secret key), as pyzmq's
    ``zmq.auth.load_certificate`` reads it.  OSError if it cannot be read;
    ValueError (naming the file, never a key) if it is not a regular file of
    at most MAX_CERTIFICATE_FILE bytes or holds no valid key."""
    path = os.fspath(path)
    public = secret = None
    metadata = {}
    section = None
    for raw in _read_regular(path).splitlines():
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


def load_certificates(directory: str | os.PathLike[str]) -> list[Certificate]:
    """The public certificates (every ``*.key`` file) of ``directory``,
    sorted by file name: the allow-list pyzmq's ``configure_curve(location=)``
    reads.  A ``*.key`` entry that is not a regular file (a FIFO, a
    directory) is a ValueError naming it."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ValueError(f"{directory!r} is not a directory of certificates")
    return [load_certificate(os.path.join(directory, n))
            for n in sorted(os.listdir(directory)) if n.endswith(_PUBLIC_SUFFIX)]


def _public_keys(keys: object, name: str, read_directories: bool = True) -> list[bytes]:
    """Z85 public keys (bytes) from keys (str/bytes), Certificates, a
    directory (os.PathLike) of certificates, or an iterable of those; the
    argument is named ``name`` in errors.  read_directories=False checks
    that each directory is one, without reading it (what an option's check
    does: the files are read when the socket opens)."""
    items: Iterable[object]
    if isinstance(keys, (str, bytes, bytearray, memoryview, Certificate)):
        items = [keys]
    elif isinstance(keys, os.PathLike):
        items = [keys]
    else:
        try:
            items = list(keys)  # type: ignore[call-overload]
        except TypeError:
            raise TypeError(f"{name} must be public keys (Z85 str/bytes), Certificates, a "
                            f"directory (pathlib.Path) of certificates, or a list of those, "
                            f"not {type(keys).__name__}") from None
    out: list[bytes] = []
    for i, k in enumerate(items):
        if isinstance(k, Certificate):
            out.append(k.public.encode("ascii"))
        elif isinstance(k, os.PathLike):
            if read_directories:
                out.extend(c.public.encode("ascii") for c in load_certificates(k))
            elif not os.path.isdir(k):
                raise ValueError(f"{os.fspath(k)!r} is not a directory of certificates")
        else:
            out.append(_z85_key(k, f"{name}[{i}]"))
    return out
