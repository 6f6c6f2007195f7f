"""Stored values as strict JSON: the one encoding of every value the ``durkv`` command prints.

A store holds what JSON cannot say: NaN and infinities, bytes, tuples, sets,
dates, UUIDs, and dicts keyed by tuples, bytes or numbers (everything
:class:`durkv.serde.MsgpackSerde` stores, and whatever LangGraph's serializer
loads). ``--json`` output must still parse with a strict parser (RFC 8259:
no ``NaN``/``Infinity`` tokens), be unambiguous, and never end in a traceback,
so :func:`plain` turns a value into JSON types by these rules (README,
"Command line"):

- ``None``, ``bool``, ``str``, ``int`` and finite ``float``: themselves
  (``int`` of any size, as a JSON number); ``list``: an array.
- A ``dict`` whose keys are all ``str`` and none starts with ``$``: an object.
- Everything else is a *marker*: an object with exactly one key, which starts
  with ``$``:

  =====================================  ===============================================
  ``{"$float": "NaN"}``                   also ``"Infinity"``, ``"-Infinity"``
  ``{"$bytes": "00ff"}``                  bytes, bytearray, memoryview, as hex
  ``{"$tuple": [...]}``                   a namedtuple is an object of its fields
  ``{"$set": [...]}``                     also ``$frozenset``; items sorted by their JSON text
  ``{"$map": [[key, value], ...]}``       any other dict, in its order; keys by these rules
  ``{"$datetime": "2026-01-01T00:00"}``   also ``$date``, ``$time``: ISO 8601 text
  ``{"$timedelta": [days, s, us]}``       Python's normalized fields, exact
  ``{"$uuid": "..."}``                    also ``{"$decimal": "1.10"}`` (exact text)
  ``{"$ext": [code, "hex"]}``             a msgpack extension no serde knows
  ``{"$encrypted": {"type", "bytes"}}``   a value that needs a key (:class:`Encrypted`)
  ``{"$repr": "..."}``                    anything else, and a container inside itself
  =====================================  ===============================================

- An enum member is its value; an object with ``to_dict()``, ``model_dump()``
  (pydantic, LangChain messages) or ``_asdict()``, and a dataclass, are their
  fields, encoded by the same rules.

So an object with one ``$`` key is always a marker, and every other object a
plain dict with string keys.

>>> dumps({("a", 1): float("nan"), "b": b"\\x01"})
'{"$map": [[{"$tuple": ["a", 1]}, {"$float": "NaN"}], ["b", {"$bytes": "01"}]]}'
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import math
import sys
import uuid
from typing import Any

import msgpack

from ..errors import SerializationError

__all__ = ["plain", "dumps", "Encrypted"]


class Encrypted:
    """A stored value the reader has no key for (LangGraph's ``EncryptedSerializer``): its
    type as stored (``"msgpack+aes"``) and its size in bytes, which is all that can be
    shown of it. Printed as ``{"$encrypted": {"type": ..., "bytes": ...}}``."""

    __slots__ = ("type", "bytes")

    def __init__(self, type_: str, size: int) -> None:
        self.type = type_
        self.bytes = size

    def __repr__(self) -> str:
        return f"<encrypted {self.type}, {self.bytes} bytes>"

_BYTES = (bytes, bytearray, memoryview)
_AS_TEXT = ((dt.datetime, "$datetime"), (dt.date, "$date"), (dt.time, "$time"),
            (uuid.UUID, "$uuid"), (decimal.Decimal, "$decimal"))   # datetime before date


# Printing takes a few Python frames per nesting level (here and in json's indenting
# encoder): msgpack nests values up to 512 levels, LangGraph's serializers deeper still.
_FRAMES_FOR_DEEP_VALUES = 8_000   # ~2,000 levels; not more: on Python 3.10 each frame
                                 # also takes C stack


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` of ``plain(value)``: strict JSON, non-ASCII text kept as is.

    Raises SerializationError (not RecursionError) for a value nested too deep to print.
    """
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, _FRAMES_FOR_DEEP_VALUES))
    try:
        return json.dumps(plain(value), ensure_ascii=False, allow_nan=False, **options)
    except RecursionError:
        raise SerializationError("a stored value is nested too deep to print "
                                 f"(over {_FRAMES_FOR_DEEP_VALUES // 4} levels); read it "
                                 "through the library: durkv.open(PATH, read_only=True)") from None
    finally:
        sys.setrecursionlimit(limit)


def plain(value: Any) -> Any:
    """``value`` as JSON types only (dict with str keys, list, str, int, finite float, bool,
    None), by the rules of the module doc. Never raises for a value a serde loaded, save
    RecursionError for one nested deeper than the recursion limit (see :func:`dumps`)."""
    return _plain(value, set())


def _plain(value: Any, inside: set[int]) -> Any:
    if value is None or type(value) in (bool, str, int):
        return value
    if isinstance(value, enum.Enum):
        return _plain(value.value, inside)
    if isinstance(value, (bool, str, int)):   # a subclass: its base value
        return _base(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {"$float": _float_name(value)}
    if isinstance(value, _BYTES):
        return {"$bytes": bytes(value).hex()}
    if isinstance(value, msgpack.ExtType):
        return {"$ext": [value.code, bytes(value.data).hex()]}
    if isinstance(value, Encrypted):
        return {"$encrypted": {"type": value.type, "bytes": value.bytes}}
    for cls, marker in _AS_TEXT:
        if isinstance(value, cls):
            return {marker: value.isoformat() if hasattr(value, "isoformat") else str(value)}
    if isinstance(value, dt.timedelta):
        return {"$timedelta": [value.days, value.seconds, value.microseconds]}
    if id(value) in inside:   # a container (or a to_dict() result) holding itself
        return {"$repr": f"<the enclosing {type(value).__name__}>"}
    inside.add(id(value))
    try:
        if isinstance(value, (dict, list, tuple, set, frozenset)):
            return _container(value, inside)
        fields = _fields(value)
        return {"$repr": _repr(value)} if fields is None else _plain(fields, inside)
    finally:
        inside.discard(id(value))


def _container(value: Any, inside: set[int]) -> Any:
    if isinstance(value, dict):
        if all(type(k) is str and not k.startswith("$") for k in value):
            obj = {}
            for k, v in value.items():
                obj[k] = _plain(v, inside)
            return obj
        pairs = []
        for k, v in value.items():
            pairs.append([_plain(k, inside), _plain(v, inside)])
        return {"$map": pairs}
    if isinstance(value, tuple) and callable(getattr(value, "_asdict", None)):
        return _plain(dict(value._asdict()), inside)      # a namedtuple: its fields
    items = []
    for item in value:
        items.append(_plain(item, inside))
    if isinstance(value, list):
        return items
    if isinstance(value, tuple):
        return {"$tuple": items}
    items.sort(key=lambda item: json.dumps(item, sort_keys=True))   # sets: a stable order
    return {"$frozenset" if isinstance(value, frozenset) else "$set": items}


def _base(value: Any) -> Any:
    """A subclass of bool/str/int as the base value (json would print some of them oddly)."""
    for cls in (bool, str, int):
        if isinstance(value, cls):
            return cls(value)
    raise AssertionError("unreachable")


def _float_name(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _fields(value: Any) -> Any:
    """The fields of a model, message or record object; None when it has no such view."""
    if isinstance(value, type):
        return None
    for attr in ("to_dict", "model_dump", "_asdict"):
        try:
            fn = getattr(value, attr, None)
            if callable(fn):
                return fn()
        except Exception:   # a to_dict() that needs arguments, or fails: try the next view
            continue
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            return dataclasses.asdict(value)
        except Exception:
            return None
    return None


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:   # a broken __repr__ must not end the command
        return f"<{type(value).__qualname__} (repr failed: {type(exc).__name__})>"
