# Payload decoders: what subscribe(decoder=..., raw=...) puts in place of the
# built-in msgpack decoder.
#
# The trampolines turn every payload into the message with one call through
# Decoder's vtable (_trampoline.pxi, _decode): `decode_wire(data, size)` for
# [topic, payload], `decode_msg(...)` for a payload followed by out-of-band
# frames (docs/wire.md).  decoder= and raw=True are served by Decoder
# subclasses that override both: the choice is made once, at subscribe()
# time, and the default path keeps exactly the code it had (no branch per
# message, nor per batch).
#
# Out-of-band frames are upcall's own references (ext 126) inside its
# msgpack: a foreign decoder cannot resolve them, and raw bytes would hand
# over a payload whose large values are missing.  A message carrying them is
# a decode error (reason "oob_decoder"), counted and reported like any other;
# publishers meant for such subscribers leave out-of-band frames off (no
# oob_threshold= or compression=, the default).
#
# A payload is handed on as `bytes`, copied out of its zmq frame: the frame
# is only valid during the delivery call, and a decoder or a target may keep
# what it is given (a msgspec Struct may keep a bytes field's buffer).  A
# small message's copy costs about what a memoryview would.


@cython.final
cdef class _RawPayload(Decoder):
    """raw=True: the payload itself, undecoded."""

    cdef object decode_view(self, const char *data, Py_ssize_t size):
        return self.decode_wire(data, size)     # the trampoline calls decode_wire

    cdef object decode_wire(self, const char *data, Py_ssize_t size):
        return PyBytes_FromStringAndSize(data, size)

    cdef object decode_msg(self, const char *data, Py_ssize_t size, const void *extra,
                           size_t n_extra,
                           object (*make)(void *ctx, size_t i, int flags, uint64_t size, int *err),
                           void *ctx):
        raise _oob_refused(n_extra, "raw=True")


@cython.final
cdef class _CallDecoder(Decoder):
    """decoder=fn: ``fn(payload_bytes)`` is the message.

    Any Exception from fn is a decode error: it is raised as an
    upcall.DecodeError (reason "decoder", the original as ``__cause__``), so
    the trampoline counts it in decode_errors, names the topic and hands
    ``on_error`` the raw payload, as for a malformed msgpack payload.  A
    BaseException that is not an Exception (KeyboardInterrupt...) goes
    through unchanged, as from the built-in decoder's caller.
    """
    cdef object fn

    cdef object decode_view(self, const char *data, Py_ssize_t size):
        return self.decode_wire(data, size)     # the trampoline calls decode_wire

    cdef object decode_wire(self, const char *data, Py_ssize_t size):
        try:
            return self.fn(PyBytes_FromStringAndSize(data, size))
        except Exception as exc:
            raise _decoder_failed(self.fn, exc) from exc

    cdef object decode_msg(self, const char *data, Py_ssize_t size, const void *extra,
                           size_t n_extra,
                           object (*make)(void *ctx, size_t i, int flags, uint64_t size, int *err),
                           void *ctx):
        raise _oob_refused(n_extra, "decoder=")


@cython.final
cdef class _PlainExt(Decoder):
    """subscribe(extensions=False) with the built-in decoder: ext 126 and
    127 are an application's own codes (docs/wire.md), decoded as plain
    ExtType values by the decoder it wraps, with its options; the C core
    does not split ext 127 payloads (uc_sub_opts.plain_ext)."""
    cdef Decoder inner

    cdef object decode_view(self, const char *data, Py_ssize_t size):
        return self.inner.decode_view(data, size)

    cdef object decode_wire(self, const char *data, Py_ssize_t size):
        return self.inner.decode_view(data, size)   # no frames: references are not resolved

    cdef object decode_msg(self, const char *data, Py_ssize_t size, const void *extra,
                           size_t n_extra,
                           object (*make)(void *ctx, size_t i, int flags, uint64_t size, int *err),
                           void *ctx):
        raise DecodeError(
            f"message carries {n_extra} frame(s) after its payload, which nothing "
            "references: this subscription reads ext 126 as a plain value "
            "(extensions=False, docs/wire.md)", <Py_ssize_t>size, "oob_unused")


cdef Decoder _plain_ext_decoder(Decoder decoder):
    """The decoder of a subscription with extensions=False: raw=True and
    decoder=fn see the payload's bytes anyway (only the C core's split
    changes for them); the built-in decoder is wrapped."""
    if isinstance(decoder, (_RawPayload, _CallDecoder)):
        return decoder
    cdef _PlainExt plain = _PlainExt.__new__(_PlainExt)
    plain.inner = decoder
    return plain


cdef object _oob_refused(size_t n_extra, str what):
    return DecodeError(
        f"message carries {n_extra} out-of-band frame(s) (large values sent apart, "
        f"docs/wire.md), which {what} cannot take: only upcall's built-in decoder resolves "
        "them; publish to this subscriber without out-of-band frames (oob_threshold=None "
        "and no compression=, the publisher's default)", None, "oob_decoder")


cdef object _decoder_failed(object fn, object exc):
    # Out of line: decode_wire stays small (its only job is the call).
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return DecodeError(f"decoder {name} raised {type(exc).__name__}: {exc}", None, "decoder")


cdef Decoder _payload_decoder(object decoder, object raw):
    """The Decoder a subscription decodes its payloads with, from subscribe()'s
    ``decoder`` and ``raw`` (checked here, before any socket is opened).

    None and False: a fresh built-in Decoder.  An upcall.Decoder, or its bound
    ``decode`` method, is used as it is (its options, the built-in path's
    speed).  Any other callable is called with each payload as bytes.
    """
    if not isinstance(raw, bool):
        raise TypeError(f"raw must be True or False, not {type(raw).__name__}")
    if raw:
        if decoder is not None:
            raise ValueError("decoder= and raw=True exclude each other: raw=True delivers "
                             "each payload as bytes, without decoding it")
        return _RawPayload.__new__(_RawPayload)
    if decoder is None:
        return Decoder()
    if isinstance(decoder, Decoder):    # upcall.Decoder(...): its C entry point
        return <Decoder>decoder
    owner = getattr(decoder, "__self__", None)
    if type(owner) is Decoder and getattr(decoder, "__name__", None) == "decode":
        return <Decoder>owner
    if not callable(decoder):
        raise TypeError(f"decoder must be a callable taking the payload (bytes) and returning "
                        f"the message, an upcall.Decoder, or None, not {type(decoder).__name__}")
    if _is_async_callable(decoder):
        raise TypeError(f"decoder is an async callable ({decoder!r}): it is called on the "
                        "delivery thread, which could never await it; decode synchronously "
                        "(msgspec.msgpack.Decoder(Type).decode) or with raw=True in the target")
    cdef _CallDecoder call = _CallDecoder.__new__(_CallDecoder)
    call.fn = decoder
    return call
