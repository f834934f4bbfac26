"""upcall: messages from a ZeroMQ bus into Python, fast.

The codec (``packb``/``unpackb``, ``Encoder``/``Decoder``) is msgpack; the
bus (``Bus``, ``Subscription``, ``Publisher``) delivers decoded messages to
Python callables or ``Handler`` extension types on native or Python-made
threads.  See README.md and docs/.
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

__version__ = "0.1.0"
