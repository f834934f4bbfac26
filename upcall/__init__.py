"""upcall: messages from a ZeroMQ bus into Python, fast.

The codec (``packb``/``unpackb``, ``Encoder``/``Decoder``) is msgpack; the
bus (``Bus``, ``Subscription``, ``Publisher``) delivers decoded messages to
Python callables on native or Python-made threads.  See README.md and docs/.
"""
from upcall._codec import (  # noqa: F401
    DecodeError,
    UpcallError,
    Decoder,
    Encoder,
    ExtType,
    Timestamp,
    packb,
    unpackb,
)
from upcall._bus import (  # noqa: F401
    DEFAULT_BATCH,
    DEFAULT_MAX_TOPICS,
    COMPRESSION,
    DEFAULT_OOB_THRESHOLD,
    DEFAULT_MAX_DECOMPRESSED,
    DEFAULT_MAX_BATCH_DECOMPRESSED,
    MAX_OOB_FRAMES,
    DEFAULT_MAX_STREAMS,
    WIRE_MARKER,
    Bus,
    ConnectionEvent,
    EVENT_STATS,
    Publisher,
    PublisherOptions,
    Proxy,
    PROXY_STATS,
    PROXY_STATS_TIMEOUT,
    Sent,
    StopDelivery,
    SubscribeOptions,
    Subscription,
    ZMQError,
    curve_keypair,
    Authenticator,
    native_threads,
    oob_outstanding,
    python_threads,
)

from upcall.certs import (  # noqa: F401
    Certificate,
    create_certificates,
    load_certificate,
    load_certificates,
)
from upcall.handler import Counter, Handler  # noqa: F401
from upcall import native  # noqa: F401  (upcall.native.NativeHandler, Count, FieldFilter)



def __getattr__(name: str) -> str:
    # __version__ has one definition, the build's (meson.build's project
    # version, which the wheel's metadata carries); read on first use, since
    # importlib.metadata costs as much to import as upcall itself.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version
        try:
            value = version("upcall")
        except PackageNotFoundError:       # a source tree on sys.path, never installed
            value = "0+unknown"
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module 'upcall' has no attribute {name!r}")


__all__ = [
    "Bus", "Subscription", "Publisher", "StopDelivery", "DEFAULT_BATCH",
    "ConnectionEvent", "EVENT_STATS",
    "Proxy", "PROXY_STATS", "PROXY_STATS_TIMEOUT",
    "SubscribeOptions", "PublisherOptions",
    "DEFAULT_MAX_TOPICS",
    "Sent", "DEFAULT_OOB_THRESHOLD", "MAX_OOB_FRAMES", "oob_outstanding", "COMPRESSION",
    "DEFAULT_MAX_DECOMPRESSED", "DEFAULT_MAX_STREAMS", "WIRE_MARKER",
    "DEFAULT_MAX_BATCH_DECOMPRESSED",
    "native_threads", "python_threads", "curve_keypair",
    "Authenticator", "Certificate", "create_certificates", "load_certificate",
    "load_certificates",
    "packb", "unpackb", "Encoder", "Decoder", "DecodeError", "Timestamp", "ExtType",
    "UpcallError", "ZMQError",
    "Handler", "Counter", "native", "get_include",
]


def get_include() -> list[str]:
    """Directories a Cython extension that cimports upcall needs.

    ``[include_dir]``: the public C headers (bus.h, split.h, msgpack.h,
    wire.h) that upcall's public .pxd files name, shipped in ``upcall/includes``.  Pass it
    as ``include_dirs`` of the Extension; Cython finds ``upcall/*.pxd`` itself on ``sys.path``
    (or add ``os.path.dirname(os.path.dirname(upcall.__file__))`` to
    ``cythonize(include_path=...)``).
    """
    import os
    pkg = os.path.dirname(os.path.abspath(__file__))
    includes = os.path.join(pkg, "includes")
    if os.path.isfile(os.path.join(includes, "bus.h")):
        return [includes]
    # A source checkout (the editable install): the build copies no header
    # into the tree, they are where they are kept (csrc/, upcall/_compat.h).
    return [includes, os.path.join(os.path.dirname(pkg), "csrc"), pkg]
