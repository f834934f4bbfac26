"""msgpack values <-> JSON values, for the command line (``upcall listen`` and
``upcall publish``).

msgpack has more types than JSON, so the ones JSON lacks are written as a
one-key object whose key starts with ``$`` (the mapping is in README.md,
"Command line"):

==========================  =============================================
msgpack (as upcall decodes) JSON
==========================  =============================================
nil, bool, int, str         null, true/false, number, string
float                       number with a fraction or exponent (``1.0``);
                            NaN and infinities: ``{"$float": "nan"}``,
                            ``"inf"``, ``"-inf"``
bin (``bytes``)             ``{"$bytes": "<base64>"}``
array                       array
map, all keys str, none     object
starting with ``$``
any other map               ``{"$map": [[key, value], ...]}`` (in order)
Timestamp (ext -1)          ``{"$timestamp": "2023-11-14T22:13:20.000000005Z"}``
                            (RFC 3339, UTC, 9 digits), or ``[seconds,
                            nanoseconds]`` where a year is outside 1..9999
ext (any other code)        ``{"$ext": [code, "<base64>"]}``
==========================  =============================================

Every form maps back to the same msgpack value (``from_json`` inverts
``to_json``), and a JSON float stays a float (``1.0``), an int an int.
"""
from __future__ import annotations

import base64
import binascii
import datetime
import math
import re
from typing import Any

from upcall._codec import ExtType, Timestamp

__all__ = ["to_json", "from_json", "topic_to_json"]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_TAGS = ("$bytes", "$float", "$map", "$timestamp", "$ext")


def _b64(data) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def _timestamp_to_json(ts: Timestamp) -> Any:
    try:
        dt = _EPOCH + datetime.timedelta(seconds=ts.seconds)
    except OverflowError:
        return [ts.seconds, ts.nanoseconds]
    return (f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:"
            f"{dt.second:02d}.{ts.nanoseconds:09d}Z")


def to_json(obj: Any) -> Any:
    """A decoded msgpack value as a value ``json.dumps`` writes as strict JSON."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return {"$float": "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")}
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"$bytes": _b64(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return {k: to_json(v) for k, v in obj.items()}
        return {"$map": [[to_json(k), to_json(v)] for k, v in obj.items()]}
    if isinstance(obj, Timestamp):
        return {"$timestamp": _timestamp_to_json(obj)}
    if isinstance(obj, ExtType):
        return {"$ext": [obj.code, _b64(obj.data)]}
    if isinstance(obj, datetime.datetime):     # a decoder made with timestamp="datetime"
        return {"$timestamp": _timestamp_to_json(Timestamp.from_datetime(obj))}
    raise TypeError(f"no JSON form for {type(obj).__name__}")


def topic_to_json(topic: bytes) -> Any:
    """A topic (always bytes on the wire): a string if it is UTF-8, else
    ``{"$bytes": ...}``."""
    try:
        return bytes(topic).decode("utf-8")
    except UnicodeDecodeError:
        return {"$bytes": _b64(topic)}


def _unb64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a base64 string, not {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what}: not valid base64: {text!r}") from None


_RFC3339 = re.compile(r"(\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?"
                      r"([Zz]|[+-]\d{2}:\d{2})")


def _timestamp_from_json(v: Any) -> Timestamp:
    if isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v):
        return Timestamp(v[0], v[1])
    m = _RFC3339.fullmatch(v) if isinstance(v, str) else None
    if m is None:
        raise ValueError('"$timestamp" must be an RFC 3339 time such as '
                         f'"2023-11-14T22:13:20.5Z", or [seconds, nanoseconds], not {v!r}')
    base, frac, tz = m.groups()
    try:
        dt = datetime.datetime.fromisoformat(base.replace("t", "T").replace(" ", "T")
                                             + ("+00:00" if tz in "Zz" else tz))
    except ValueError as e:
        raise ValueError(f'"$timestamp": {v!r}: {e}') from None
    delta = dt - _EPOCH
    return Timestamp(delta.days * 86400 + delta.seconds, int((frac or "").ljust(9, "0")))


def from_json(obj: Any) -> Any:
    """A parsed JSON value (``json.loads``) as the value to pack: the inverse
    of :func:`to_json`.  ValueError for a malformed ``$`` form."""
    if isinstance(obj, list):
        return [from_json(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (tag, v), = obj.items()
        if tag == "$bytes":
            return _unb64(v, '"$bytes"')
        if tag == "$float":
            if v not in ("nan", "inf", "-inf"):
                raise ValueError(f'"$float" must be "nan", "inf" or "-inf", not {v!r}')
            return float(v)
        if tag == "$map":
            if not isinstance(v, list) or not all(isinstance(p, list) and len(p) == 2 for p in v):
                raise ValueError('"$map" must be a list of [key, value] pairs')
            out = {}
            for k, val in v:
                k = from_json(k)
                if isinstance(k, list):
                    k = _hashable(k)
                try:
                    out[k] = from_json(val)
                except TypeError:
                    raise ValueError(f'"$map": a key that cannot be a key: {k!r}') from None
            return out
        if tag == "$timestamp":
            return _timestamp_from_json(v)
        if tag == "$ext":
            if not (isinstance(v, list) and len(v) == 2 and type(v[0]) is int):
                raise ValueError('"$ext" must be [code, "<base64>"]')
            return ExtType(v[0], _unb64(v[1], '"$ext" data'))
    for k in obj:
        if k.startswith("$"):
            raise ValueError(f"unknown form {k!r} (a map whose keys start with $ is written "
                             f'as {{"$map": [[key, value], ...]}}; forms: {", ".join(_TAGS)})')
    return {k: from_json(v) for k, v in obj.items()}


def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v
