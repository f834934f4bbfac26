"""msgpack values <-> JSON values, for the command line (``upcall listen`` and
``upcall publish``).

msgpack has more types than JSON, so the ones JSON lacks are written as a
one-key object whose key starts with ``$`` (the mapping is in docs/cli.md):

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
any other map               ``{"$map": [[key, value], ...]}`` (in order;
                            no array or map as a key: upcall's decoder
                            refuses them, so ``from_json`` does)
Timestamp (ext -1)          ``{"$timestamp": "2023-11-14T22:13:20.000000005Z"}``
                            (RFC 3339, UTC, 9 digits), or ``[seconds,
                            nanoseconds]`` where a year is outside 1..9999
ext (any other code)        ``{"$ext": [code, "<base64>"]}``
==========================  =============================================

Every form maps back to the same msgpack value (``from_json`` inverts
``to_json``), and a JSON float stays a float (``1.0``), an int an int.
A non-finite float is only ever ``$float``: ``from_json`` refuses the
infinity json.loads makes of ``1e400``.  Neither direction recurses:
``to_json`` and ``dumps`` take any depth, ``from_json`` refuses more than
upcall encodes (``DEFAULT_MAX_DEPTH`` levels).
"""
from __future__ import annotations

import base64
import binascii
import datetime
import itertools
import json
import math
import re
from typing import Any

from upcall._codec import DEFAULT_MAX_DEPTH, ExtType, Timestamp

__all__ = ["to_json", "from_json", "topic_to_json", "dumps"]

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


def _walk(root: Any, step: Any) -> Any:
    """Convert ``root`` node by node without recursion, so that the nesting
    is bounded by memory, not by Python's recursion limit (``listen`` shows
    everything upcall decodes, 512 levels by default and up to 4096).

    ``step(node, depth)`` returns ``(value, None)`` for a leaf, or, for a
    container, ``(the new empty container, (its children, add))``: each
    child is converted in turn and passed to ``add``, which fills it."""
    value, todo = step(root, 1)
    stack = [] if todo is None else [(todo[0], todo[1], 1)]
    while stack:
        children, add, depth = stack[-1]
        for child in children:
            v, sub = step(child, depth + 1)
            add(v)
            if sub is not None:
                stack.append((sub[0], sub[1], depth + 1))
                break
        else:
            stack.pop()
    return value


def _pairs_add(pairs: list) -> Any:
    """``add`` for ``{"$map": pairs}``: keys and values alternate."""
    def add(v: Any) -> None:
        if pairs and len(pairs[-1]) == 1:
            pairs[-1].append(v)
        else:
            pairs.append([v])
    return add


def _object_add(out: dict, keys: Any) -> Any:
    return lambda v: out.__setitem__(next(keys), v)


def _to_json_step(obj: Any, depth: int) -> Any:
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj, None
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj, None
        return {"$float": "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")}, None
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"$bytes": _b64(obj)}, None
    if isinstance(obj, (list, tuple)):
        out: Any = []
        return out, (iter(obj), out.append)
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            out = {}
            return out, (iter(list(obj.values())), _object_add(out, iter(list(obj))))
        pairs: list = []
        return {"$map": pairs}, (itertools.chain.from_iterable(list(obj.items())),
                                 _pairs_add(pairs))
    if isinstance(obj, Timestamp):
        return {"$timestamp": _timestamp_to_json(obj)}, None
    if isinstance(obj, ExtType):
        return {"$ext": [obj.code, _b64(obj.data)]}, None
    if isinstance(obj, datetime.datetime):     # a decoder made with timestamp="datetime"
        return {"$timestamp": _timestamp_to_json(Timestamp.from_datetime(obj))}, None
    raise TypeError(f"no JSON form for {type(obj).__name__}")


def to_json(obj: Any) -> Any:
    """A decoded msgpack value as a value ``json.dumps`` writes as strict JSON
    (:func:`dumps` writes it at any depth)."""
    return _walk(obj, _to_json_step)


class _Text(str):
    """Punctuation that :func:`dumps` writes as it is."""


_COMMA = _Text(", ")
_encode_str = json.encoder.encode_basestring    # json.dumps's, for ensure_ascii=False


def _list_items(v: list) -> Any:
    for i, x in enumerate(v):
        if i:
            yield _COMMA
        yield x
    yield _Text("]")


def _dict_items(v: dict) -> Any:
    for i, (k, x) in enumerate(v.items()):
        if not isinstance(k, str):
            raise TypeError(f"a JSON object key must be str, not {type(k).__name__}")
        yield _Text((", " if i else "") + _encode_str(k) + ": ")
        yield x
    yield _Text("}")


def dumps(obj: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, allow_nan=False)``, same text,
    for the values :func:`to_json` returns, at any depth (json.dumps
    recurses, and stops at Python's recursion limit)."""
    out: list = []
    stack: list = [iter((obj,))]
    while stack:
        for v in stack[-1]:
            if type(v) is _Text:
                out.append(v)
            elif isinstance(v, str):
                out.append(_encode_str(v))
            elif v is None:
                out.append("null")
            elif v is True or v is False:
                out.append("true" if v else "false")
            elif isinstance(v, int):
                out.append(int.__repr__(v))
            elif isinstance(v, float):
                if not math.isfinite(v):
                    raise ValueError(f"a non-finite float in JSON: {v!r}")
                out.append(float.__repr__(v))
            elif isinstance(v, list):
                out.append("[")
                stack.append(_list_items(v))
                break
            elif isinstance(v, dict):
                out.append("{")
                stack.append(_dict_items(v))
                break
            else:
                raise TypeError(f"no JSON form for {type(v).__name__}")
        else:
            stack.pop()
    return "".join(out)


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
        try:
            return Timestamp(v[0], v[1])
        except OverflowError as e:       # seconds outside int64
            raise ValueError(f'"$timestamp": {e}') from None
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


_NO_KEY = object()


def _map_add(out: dict) -> Any:
    """``add`` for a ``$map``: keys and values alternate."""
    key = _NO_KEY

    def add(v: Any) -> None:
        nonlocal key
        if key is not _NO_KEY:
            out[key] = v
            key = _NO_KEY
        elif isinstance(v, (list, dict)):
            # upcall's decoder (as msgpack's) refuses an array or map key
            # (DecodeError "unhashable_key"): what would be sent could not be read.
            raise ValueError('"$map": a key is an array or a map, which upcall\'s decoder '
                             "refuses (keys are null, booleans, numbers, strings and the "
                             "$bytes, $float, $timestamp and $ext forms)")
        else:
            key = v
    return add


def _deeper(depth: int) -> None:
    if depth > DEFAULT_MAX_DEPTH:
        raise ValueError(f"nested deeper than {DEFAULT_MAX_DEPTH} levels "
                         "(upcall's max_depth for encoding and decoding)")


def _from_json_step(obj: Any, depth: int) -> Any:
    if isinstance(obj, list):
        _deeper(depth)
        out: Any = []
        return out, (iter(obj), out.append)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            # json.loads reads 1e400 as infinity.
            raise ValueError("a number too large for a float (such as 1e400, which would "
                             'be infinity): non-finite floats are written {"$float": "inf"}, '
                             '"-inf" or "nan"')
        return obj, None
    if not isinstance(obj, dict):
        return obj, None
    if len(obj) == 1:
        (tag, v), = obj.items()
        if tag == "$bytes":
            return _unb64(v, '"$bytes"'), None
        if tag == "$float":
            if v not in ("nan", "inf", "-inf"):
                raise ValueError(f'"$float" must be "nan", "inf" or "-inf", not {v!r}')
            return float(v), None
        if tag == "$map":
            if not isinstance(v, list) or not all(isinstance(p, list) and len(p) == 2 for p in v):
                raise ValueError('"$map" must be a list of [key, value] pairs')
            _deeper(depth)
            out = {}
            return out, (itertools.chain.from_iterable(v), _map_add(out))
        if tag == "$timestamp":
            return _timestamp_from_json(v), None
        if tag == "$ext":
            if not (isinstance(v, list) and len(v) == 2 and type(v[0]) is int):
                raise ValueError('"$ext" must be [code, "<base64>"]')
            return ExtType(v[0], _unb64(v[1], '"$ext" data')), None
    for k in obj:
        if k.startswith("$"):
            raise ValueError(f"unknown form {k!r} (a map whose keys start with $ is written "
                             f'as {{"$map": [[key, value], ...]}}; forms: {", ".join(_TAGS)})')
    _deeper(depth)
    out = {}
    return out, (iter(list(obj.values())), _object_add(out, iter(list(obj))))


def from_json(obj: Any) -> Any:
    """A parsed JSON value (``json.loads``) as the value to pack: the inverse
    of :func:`to_json`.  ValueError for a malformed ``$`` form, a map key
    upcall's decoder would refuse (an array or a map), a non-finite number
    (``1e400``: write ``{"$float": "inf"}``), or nesting deeper than upcall
    encodes (512 levels)."""
    return _walk(obj, _from_json_step)
