"""Value serialization for the store: a two-method protocol and a safe default.

A serde turns one Python value into bytes and back. The store calls it once
per channel value (or once per list item, so that an append-only list can be
stored as deltas), per checkpoint record and per pending write. The LangGraph
adapter passes its own serde wrapping ``dumps_typed``/``loads_typed``; everyone
else gets :class:`MsgpackSerde`, which never uses pickle.

>>> s = MsgpackSerde()
>>> s.loads(s.dumps({"when": (1, 2), "tags": {"a"}}))
{'when': (1, 2), 'tags': {'a'}}
"""

from __future__ import annotations

import datetime as _dt
import decimal
import enum
import threading
import uuid
from typing import Any, Protocol, runtime_checkable

import msgpack

__all__ = ["Serde", "MsgpackSerde", "default_serde"]


@runtime_checkable
class Serde(Protocol):
    """What the store needs from a serializer.

    ``dumps`` raises (any exception) on a value it cannot encode; the store
    turns that into :class:`durkv.SerializationError` naming the channel and
    commits nothing.
    """

    def dumps(self, obj: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


# msgpack extension type codes of the default serde (part of the stored data: never renumber)
_EXT_TUPLE = 1
_EXT_SET = 2
_EXT_FROZENSET = 3
_EXT_DATETIME = 4      # isoformat text (keeps tzinfo offsets and microseconds)
_EXT_DATE = 5
_EXT_TIME = 6
_EXT_TIMEDELTA = 7     # packed [days, seconds, microseconds]
_EXT_UUID = 8          # 16 raw bytes
_EXT_DECIMAL = 9       # str()
_EXT_BIGINT = 10       # decimal text of an int outside 64 bits


class MsgpackSerde:
    """msgpack plus extension types for what agents store.

    Handles None, bool, int (any size), float, str, bytes, list, dict (any
    msgpack-able keys), tuple, set, frozenset, datetime/date/time/timedelta,
    UUID and Decimal. Subclasses of str/int/float/dict/list (enums, OrderedDict)
    are stored as their base type. Anything else raises ``TypeError``.
    """

    def __init__(self) -> None:
        self._default = self._encode_ext
        self._local = threading.local()   # one reusable Packer per thread (packers are not
                                          # thread-safe; reuse saves ~0.5 us per call)

    def dumps(self, obj: Any) -> bytes:
        try:
            pk = self._local.packer
        except AttributeError:
            pk = self._local.packer = msgpack.Packer(default=self._default, use_bin_type=True,
                                                     strict_types=True)
        return pk.pack(obj)

    def _nested(self, obj: Any) -> bytes:
        # extension payloads are packed while the thread's Packer is busy: use a fresh one
        return msgpack.packb(obj, default=self._default, use_bin_type=True, strict_types=True)

    def loads(self, data: bytes) -> Any:
        return msgpack.unpackb(data, ext_hook=self._decode_ext, raw=False,
                               strict_map_key=False, use_list=True)

    def _encode_ext(self, obj: Any) -> Any:
        t = type(obj)
        if t is tuple:
            return msgpack.ExtType(_EXT_TUPLE, self._nested(list(obj)))
        if t is set:
            return msgpack.ExtType(_EXT_SET, self._nested(list(obj)))
        if t is frozenset:
            return msgpack.ExtType(_EXT_FROZENSET, self._nested(list(obj)))
        if t is _dt.datetime:
            return msgpack.ExtType(_EXT_DATETIME, obj.isoformat().encode())
        if t is _dt.date:
            return msgpack.ExtType(_EXT_DATE, obj.isoformat().encode())
        if t is _dt.time:
            return msgpack.ExtType(_EXT_TIME, obj.isoformat().encode())
        if t is _dt.timedelta:
            return msgpack.ExtType(_EXT_TIMEDELTA,
                                   self._nested([obj.days, obj.seconds, obj.microseconds]))
        if t is uuid.UUID:
            return msgpack.ExtType(_EXT_UUID, obj.bytes)
        if t is decimal.Decimal:
            return msgpack.ExtType(_EXT_DECIMAL, str(obj).encode())
        if t is int:  # only reaches here when outside 64 bits
            return msgpack.ExtType(_EXT_BIGINT, str(obj).encode())
        # subclasses of the plain types: store as the base type
        if isinstance(obj, enum.Enum):
            return obj.value
        if isinstance(obj, bool):
            return bool(obj)
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj)
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, bytes):
            return bytes(obj)
        if isinstance(obj, (bytearray, memoryview)):
            return bytes(obj)
        if isinstance(obj, dict):
            return dict(obj)
        if isinstance(obj, list):
            return list(obj)
        if isinstance(obj, tuple):
            return msgpack.ExtType(_EXT_TUPLE, self._nested(list(obj)))
        if isinstance(obj, _dt.datetime):
            return msgpack.ExtType(_EXT_DATETIME, obj.isoformat().encode())
        raise TypeError(f"cannot serialize object of type {t.__qualname__}")

    def _decode_ext(self, code: int, data: bytes) -> Any:
        if code == _EXT_TUPLE:
            return tuple(self.loads(data))
        if code == _EXT_SET:
            return set(self.loads(data))
        if code == _EXT_FROZENSET:
            return frozenset(self.loads(data))
        if code == _EXT_DATETIME:
            return _dt.datetime.fromisoformat(data.decode())
        if code == _EXT_DATE:
            return _dt.date.fromisoformat(data.decode())
        if code == _EXT_TIME:
            return _dt.time.fromisoformat(data.decode())
        if code == _EXT_TIMEDELTA:
            d, s, us = self.loads(data)
            return _dt.timedelta(days=d, seconds=s, microseconds=us)
        if code == _EXT_UUID:
            return uuid.UUID(bytes=data)
        if code == _EXT_DECIMAL:
            return decimal.Decimal(data.decode())
        if code == _EXT_BIGINT:
            return int(data.decode())
        return msgpack.ExtType(code, data)


default_serde = MsgpackSerde()
