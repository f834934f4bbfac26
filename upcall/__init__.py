"""upcall: messages from a ZeroMQ bus into Python, fast.

The codec (``packb``/``unpackb``, ``Encoder``/``Decoder``) is msgpack; the
bus (``Bus``, ``Subscription``, ``Publisher``) delivers decoded messages to
Python callables on native or Python-made threads.  See README.md and docs/.
"""
from upcall._codec import (  # noqa: F401
    DecodeError,
    Decoder,
    Encoder,
    ExtType,
    Timestamp,
    packb,
    unpackb,
)
from upcall._bus import (  # noqa: F401
    DEFAULT_BATCH,
    Bus,
    Publisher,
    StopDelivery,
    Subscription,
    curve_keypair,
    native_threads,
    python_threads,
)

__version__ = "0.1.0"

__all__ = [
    "Bus", "Subscription", "Publisher", "StopDelivery", "DEFAULT_BATCH",
    "native_threads", "python_threads", "curve_keypair",
    "packb", "unpackb", "Encoder", "Decoder", "DecodeError", "Timestamp", "ExtType",
]
