"""Value serialization for the store: a two-method protocol and a safe default.

A serde turns one Python value into bytes and back. The store calls it once
per channel value (or once per list item, so that an append-only list can be
stored as deltas), per checkpoint record and per pending write. The LangGraph
adapter passes its own serde wrapping ``dumps_typed``/``loads_typed``; everyone
else gets :class:`MsgpackSerde`, which never uses pickle and stores a value only
if it reads back as an equal value of the same type (docs/FORMAT.md section 5b).

>>> from collections import OrderedDict
>>> s = MsgpackSerde()
>>> s.loads(s.dumps({"when": (1, 2), "tags": {"a"}, "seen": OrderedDict(b=1, a=2)}))
{'when': (1, 2), 'tags': {'a'}, 'seen': OrderedDict([('b', 1), ('a', 2)])}
"""

from __future__ import annotations

import collections
import datetime as _dt
import decimal
import enum
import importlib
import sys
import threading
import uuid
import zoneinfo
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

import msgpack

from .errors import SerializationError

__all__ = ["Serde", "MsgpackSerde", "default_serde", "find_class", "class_path", "without_fold"]


@runtime_checkable
class Serde(Protocol):
    """What the store needs from a serializer.

    ``dumps`` raises (any exception) on a value it cannot encode; the store
    turns that into :class:`durkv.SerializationError` naming the channel and
    commits nothing. A serde whose ``faithful`` attribute is True promises that
    ``loads(dumps(v))`` is equal to ``v`` and of the same type, recursively (or
    ``dumps`` raises): the run journal then need not check it by decoding.
    """

    def dumps(self, obj: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


# msgpack extension type codes of the default serde (part of the stored data: never
# renumber; docs/FORMAT.md section 5b)
_EXT_TUPLE = 1
EXT_SET = 2
EXT_FROZENSET = 3
_EXT_DATETIME = 4      # isoformat text (keeps tzinfo offsets and microseconds)
_EXT_DATE = 5
_EXT_TIME = 6
_EXT_TIMEDELTA = 7     # packed [days, seconds, microseconds]
_EXT_UUID = 8          # 16 raw bytes
_EXT_DECIMAL = 9       # str()
_EXT_BIGINT = 10       # decimal text of an int outside 64 bits
EXT_ENUM = 11          # [module, qualname, value]
_EXT_NAMEDTUPLE = 12   # [module, qualname, [fields]]
_EXT_ORDEREDDICT = 13  # [[k, v], ...]
EXT_COUNTER = 14      # [[k, n], ...]
EXT_DEFAULTDICT = 15  # [factory name or nil, [[k, v], ...]]
_EXT_BYTEARRAY = 16    # raw bytes
_EXT_DATETIME_ZONE = 17  # [wall isoformat, fold, IANA key | [offset, name]]
_EXT_DATETIME_FOLD = 18  # as 4, with fold=1 (isoformat carries no fold)
_EXT_TIME_FOLD = 19      # as 6, with fold=1

# the default factories a defaultdict may have: a name in the data, never a callable
_FACTORIES = {f.__name__: f for f in (list, dict, set, frozenset, tuple, int, float, str,
                                      bytes, bool)}
_FACTORY_NAMES = {f: name for name, f in _FACTORIES.items()}

_class_paths: dict[type, tuple[str, str]] = {}
_NATIVE = (type(None), bool, int, float, str, bytes, list, dict)   # msgpack packs these itself


def find_class(module: str, qualname: str) -> type:
    """The class ``module.qualname``, importing the module when this process has not
    (a stored value names its classes by module path; nothing is unpickled).

    Raises:
        ImportError: the module cannot be imported. LookupError: it has no such class.
    """
    obj: Any = sys.modules.get(module)
    if obj is None:
        obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise LookupError(f"module {module!r} has no {qualname!r}")
    if not isinstance(obj, type):
        raise LookupError(f"{module}.{qualname} is not a class")
    return obj


def class_path(cls: type) -> tuple[str, str]:
    """``(module, qualname)`` by which :func:`find_class` finds ``cls`` again.

    Raises:
        TypeError: the class is not reachable by that path (defined inside a function,
            or shadowed), so no reader could find it.
    """
    path = _class_paths.get(cls)
    if path is not None:
        return path
    module, qual = cls.__module__, cls.__qualname__
    found: Any = sys.modules.get(module)
    for part in qual.split("."):
        found = getattr(found, part, None)
    if found is not cls:
        raise TypeError(f"class {module}.{qual} is not reachable by its module path "
                        "(defined inside a function?); define it at module level")
    _class_paths[cls] = path = (module, qual)
    return path


def without_fold(v: Any) -> Any:
    """A naive or fixed-offset ``datetime``/``time`` with ``fold=1`` as ``fold=0`` (what
    ext codes 4 and 6 held before codes 18 and 19: fingerprints keep that form); anything
    else as it is."""
    if v.fold and (v.tzinfo is None or _zone(v.tzinfo) is None):
        return v.replace(fold=0)
    return v


def _zone(tz: Any) -> Any:
    """How an aware datetime's zone is stored (None: the plain offset of code 4 is exact)."""
    if type(tz) is zoneinfo.ZoneInfo and tz.key:
        return tz.key
    if type(tz) is _dt.timezone:
        off = tz.utcoffset(None)
        if tz.tzname(None) == _dt.timezone(off).tzname(None):
            return None
        return [off, tz.tzname(None)]
    raise TypeError(f"tzinfo {type(tz).__module__}.{type(tz).__qualname__} is stored only as "
                    "zoneinfo.ZoneInfo or datetime.timezone; convert it (zoneinfo.ZoneInfo("
                    "'Europe/Paris'))")


def _refusal(obj: Any) -> str:
    """Why ``obj`` itself (not its items) has no faithful encoding."""
    base = next((b for b in (bool, int, float, str, bytes, dict, list, tuple, set, frozenset,
                             _dt.datetime, _dt.date, _dt.time, _dt.timedelta, decimal.Decimal,
                             uuid.UUID) if isinstance(obj, b)), None)
    if base is not None:
        return (f"a subclass of {base.__name__} with no faithful encoding (it would read back "
                f"as a plain {base.__name__}); store a {base.__name__}, or an Enum, namedtuple, "
                "OrderedDict, Counter or defaultdict")
    if isinstance(obj, memoryview):
        return "a memoryview (it would read back as bytes); store bytes(view)"
    return "not a type this serde stores; store plain data (dict, list, str, numbers) instead"


_SCALARS = frozenset([str, int, float, bool, bytes, type(None)])


def _has_buffer(obj: Any) -> bool:
    t = type(obj)
    if t is bytearray or t is memoryview:
        return True
    if isinstance(obj, dict):
        for k, v in obj.items():
            if (type(k) not in _SCALARS and _has_buffer(k)) or (
                    type(v) not in _SCALARS and _has_buffer(v)):
                return True
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            if type(v) not in _SCALARS and _has_buffer(v):
                return True
    return False


def _swap_buffers(obj: Any, path: str) -> Any:
    """``obj`` with each bytearray as its extension type (msgpack would pack it as bytes);
    a memoryview is refused (nothing reads back as one)."""
    t = type(obj)
    if t is bytearray:
        return msgpack.ExtType(_EXT_BYTEARRAY, bytes(obj))
    if t is memoryview:
        raise SerializationError(f"cannot store a memoryview (builtins) at "
                                 f"{path.lstrip() or 'the top level'}: {_refusal(obj)}")
    if isinstance(obj, dict):
        pairs = [(_swap_buffers(k, path), _swap_buffers(v, f"{path}[{k!r}]"))
                 for k, v in obj.items()]
        if t is collections.defaultdict:
            return t(obj.default_factory, pairs)
        return t(pairs) if t is not collections.Counter else t(dict(pairs))
    if isinstance(obj, (list, tuple)):
        items = [_swap_buffers(v, f"{path}[{i}]") for i, v in enumerate(obj)]
        return tuple.__new__(t, items) if isinstance(obj, tuple) else t(items)
    if isinstance(obj, (set, frozenset)):
        return t(_swap_buffers(v, path) for v in obj)
    return obj


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    """(path step, item) of a container the serde descends into, for error paths."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f" (a key {k!r})", k
            yield f"[{k!r}]", v
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield f"[{i}]", v
    elif isinstance(obj, (set, frozenset)):
        for v in obj:
            yield f" (an item {v!r})", v
    elif isinstance(obj, enum.Enum):
        yield ".value", obj.value


def _cycle_at(obj: Any) -> tuple[str, type] | None:
    """(path, type) of the first container found inside itself, or None: a depth-first
    walk that visits each container once (a value shared by two parents is no cycle)."""
    on_path: set[int] = set()
    done: set[int] = set()
    stack: list[tuple[Any, str, Iterator[tuple[str, Any]]]] = [(obj, "", _children(obj))]
    on_path.add(id(obj))
    while stack:
        node, path, children = stack[-1]
        for step, item in children:
            if id(item) in on_path:
                return path + step, type(item)
            if id(item) not in done and isinstance(item, (dict, list, tuple, set, frozenset)):
                on_path.add(id(item))
                stack.append((item, path + step, _children(item)))
                break
        else:
            stack.pop()
            on_path.discard(id(node))
            done.add(id(node))
    return None


class MsgpackSerde:
    """msgpack plus extension types for what agents store (docs/FORMAT.md 5b).

    Handles None, bool, int (any size), float, str, bytes, bytearray, list, dict
    (any msgpack-able keys), tuple, set, frozenset, datetime (naive, fixed offset,
    ZoneInfo), date, time, timedelta, UUID, Decimal, Enum members, namedtuples,
    OrderedDict, Counter and defaultdict. Anything else -- a user class, a
    subclass of a builtin with no faithful encoding -- raises
    :class:`durkv.SerializationError` (a ``TypeError``) naming its type and path.

    ``fallback`` (for fingerprints, not storage): called with a value that has no
    encoding; its return value is packed instead.
    """

    faithful = True

    def __init__(self, fallback: Callable[[Any], Any] | None = None) -> None:
        self._fallback = fallback
        self._default = self._encode_ext if fallback is None else self._encode_or_fallback
        self._local = threading.local()   # one reusable Packer per thread (packers are not
                                          # thread-safe; reuse saves ~0.5 us per call)

    def dumps(self, obj: Any) -> bytes:
        try:
            pk = self._local.packer
        except AttributeError:
            pk = self._local.packer = msgpack.Packer(default=self._default, use_bin_type=True,
                                                     strict_types=True)
        try:
            b = pk.pack(obj)
        except Exception as e:
            raise self._refused(obj, e) from e
        if (0xC4 in b or 0xC5 in b or 0xC6 in b) and _has_buffer(obj):   # memchr: ~30 ns
            # msgpack packs a bytearray or memoryview as bin itself, without asking the
            # hook: a value holding one is packed again. Only bytes with a bin header byte
            # (bytes values, some non-ASCII text) are walked to look for one
            return self.dumps(_swap_buffers(obj, ""))
        return b

    def _refused(self, obj: Any, e: Exception) -> Exception:
        """The error for a value that did not encode, naming the innermost item at fault
        (found again on this error path only: the hot path pays nothing)."""
        if isinstance(e, RecursionError) or (isinstance(e, ValueError)
                                             and "recursion limit" in str(e)):
            # msgpack (or Python, through the tuple hook) gives up past its depth limit: a
            # cycle (which the walk below would follow for ever) or a value nested too deep
            # (which it would walk in O(depth^2))
            cycle = _cycle_at(obj)
            if cycle is not None:
                path, t = cycle
                return SerializationError(
                    f"cannot store a {t.__qualname__} that contains itself (at "
                    f"{path.lstrip() or 'the top level'}): store a copy without the cycle")
            return SerializationError(f"cannot store a value nested this deep ({e}): "
                                      f"flatten it")
        path, bad = "", obj
        while True:
            for step, item in _children(bad):
                try:
                    self._nested(item)
                except Exception:
                    path, bad = path + step, item
                    break
            else:
                break
        t = type(bad)
        why: Exception = e
        if t not in _NATIVE:             # the extension hook says why it refused the item
            try:
                self._encode_ext(bad)
            except Exception as inner:
                why = inner
        where = f"at {path.lstrip()}" if path else "at the top level"
        return SerializationError(f"cannot store a {t.__qualname__} ({t.__module__}) {where}: "
                                  f"{why}")

    def _nested(self, obj: Any) -> bytes:
        # extension payloads are packed while the thread's Packer is busy: use a fresh one
        return msgpack.packb(obj, default=self._default, use_bin_type=True, strict_types=True)

    def loads(self, data: bytes) -> Any:
        try:
            return msgpack.unpackb(data, ext_hook=self._decode_ext, raw=False,
                                   strict_map_key=False, use_list=True)
        except (ValueError, msgpack.UnpackException) as e:     # ExtraData, FormatError...
            if isinstance(e, SerializationError):
                raise
            raise SerializationError(
                f"stored bytes durkv's serde cannot read ({type(e).__name__}: {e}); values "
                "a DurkvSaver wrote are in LangGraph's serializer: read them with "
                "DurkvSaver.open(url), or durkv.open(url, serde=durkv.langgraph_serde."
                "LangGraphSerde(JsonPlusSerializer()))",
                cause=f"{type(e).__name__}: {e}") from None

    def _encode_or_fallback(self, obj: Any) -> Any:
        try:
            return self._encode_ext(obj)
        except TypeError:
            return self._fallback(obj)  # type: ignore[misc]

    def _encode_ext(self, obj: Any) -> Any:
        t = type(obj)
        if t is tuple:
            return msgpack.ExtType(_EXT_TUPLE, self._nested(list(obj)))
        if t is set:
            return msgpack.ExtType(EXT_SET, self._nested(list(obj)))
        if t is frozenset:
            return msgpack.ExtType(EXT_FROZENSET, self._nested(list(obj)))
        if t is _dt.datetime:
            return self._datetime(obj)
        if t is _dt.date:
            return msgpack.ExtType(_EXT_DATE, obj.isoformat().encode())
        if t is _dt.time:
            if obj.tzinfo is not None and _zone(obj.tzinfo) is not None:
                raise TypeError("a time with a named zone reads back as a fixed offset; "
                                "store a datetime with its zone")
            return msgpack.ExtType(_EXT_TIME_FOLD if obj.fold else _EXT_TIME,
                                   obj.isoformat().encode())
        if t is _dt.timedelta:
            return msgpack.ExtType(_EXT_TIMEDELTA,
                                   self._nested([obj.days, obj.seconds, obj.microseconds]))
        if t is uuid.UUID:
            return msgpack.ExtType(_EXT_UUID, obj.bytes)
        if t is decimal.Decimal:
            return msgpack.ExtType(_EXT_DECIMAL, str(obj).encode())
        if t is int:  # only reaches here when outside 64 bits
            return msgpack.ExtType(_EXT_BIGINT, str(obj).encode())
        if t is bytearray:
            return msgpack.ExtType(_EXT_BYTEARRAY, bytes(obj))
        return self._encode_class(obj, t)

    def _datetime(self, obj: _dt.datetime) -> msgpack.ExtType:
        zone = None if obj.tzinfo is None else _zone(obj.tzinfo)
        if zone is None:
            return msgpack.ExtType(_EXT_DATETIME_FOLD if obj.fold else _EXT_DATETIME,
                                   obj.isoformat().encode())
        wall = obj.replace(tzinfo=None).isoformat()
        return msgpack.ExtType(_EXT_DATETIME_ZONE, self._nested([wall, obj.fold, zone]))

    def _encode_class(self, obj: Any, t: type) -> Any:
        """Enum members, namedtuples and the collections types; the rest is refused."""
        if isinstance(obj, enum.Enum):
            return msgpack.ExtType(EXT_ENUM, self._nested([*class_path(t), obj.value]))
        if isinstance(obj, tuple) and hasattr(t, "_fields") and not getattr(obj, "__dict__", None):
            return msgpack.ExtType(_EXT_NAMEDTUPLE, self._nested([*class_path(t), list(obj)]))
        if t is collections.OrderedDict or t is collections.Counter:
            code = _EXT_ORDEREDDICT if t is collections.OrderedDict else EXT_COUNTER
            return msgpack.ExtType(code, self._nested([[k, v] for k, v in obj.items()]))
        if t is collections.defaultdict:
            f = obj.default_factory
            if f is not None and f not in _FACTORY_NAMES:
                raise TypeError(f"a defaultdict's default_factory is stored by name and must be "
                                f"None or one of {', '.join(_FACTORIES)}, not {f!r}")
            return msgpack.ExtType(EXT_DEFAULTDICT, self._nested(
                [_FACTORY_NAMES.get(f), [[k, v] for k, v in obj.items()]]))
        raise TypeError(_refusal(obj))

    def _decode_ext(self, code: int, data: bytes) -> Any:
        if code == _EXT_TUPLE:
            return tuple(self.loads(data))
        if code == EXT_SET:
            return set(self.loads(data))
        if code == EXT_FROZENSET:
            return frozenset(self.loads(data))
        if code == _EXT_DATETIME:
            return _dt.datetime.fromisoformat(data.decode())
        if code == _EXT_DATE:
            return _dt.date.fromisoformat(data.decode())
        if code == _EXT_TIME:
            return _dt.time.fromisoformat(data.decode())
        if code == _EXT_DATETIME_FOLD:
            return _dt.datetime.fromisoformat(data.decode()).replace(fold=1)
        if code == _EXT_TIME_FOLD:
            return _dt.time.fromisoformat(data.decode()).replace(fold=1)
        if code == _EXT_TIMEDELTA:
            d, s, us = self.loads(data)
            return _dt.timedelta(days=d, seconds=s, microseconds=us)
        if code == _EXT_UUID:
            return uuid.UUID(bytes=data)
        if code == _EXT_DECIMAL:
            return decimal.Decimal(data.decode())
        if code == _EXT_BIGINT:
            return int(data.decode())
        if code == _EXT_BYTEARRAY:
            return bytearray(data)
        if _EXT_NAMEDTUPLE >= code >= EXT_ENUM:
            return self._decode_class(code, self.loads(data))
        if _EXT_DATETIME_ZONE >= code >= _EXT_ORDEREDDICT:
            return self._decode_collection(code, self.loads(data))
        return msgpack.ExtType(code, data)

    @staticmethod
    def _decode_class(code: int, v: list) -> Any:
        module, qual, value = v
        kind = "Enum" if code == EXT_ENUM else "namedtuple"
        try:
            cls = find_class(module, qual)
        except Exception as e:
            raise SerializationError(f"a stored {kind} value names class {module}.{qual}, "
                                     f"which cannot be found here ({e}); read it where that "
                                     "module can be imported") from e
        if code == EXT_ENUM and issubclass(cls, enum.Enum):
            return cls(value)
        if code != EXT_ENUM and issubclass(cls, tuple) and hasattr(cls, "_fields"):
            return tuple.__new__(cls, value)
        raise SerializationError(f"a stored {kind} value names {module}.{qual}, which is "
                                 f"not an {kind} class here: refusing to build it")

    @staticmethod
    def _decode_collection(code: int, v: list) -> Any:
        if code == _EXT_ORDEREDDICT:
            return collections.OrderedDict(v)
        if code == EXT_COUNTER:
            return collections.Counter(dict(v))
        if code == EXT_DEFAULTDICT:
            return collections.defaultdict(None if v[0] is None else _FACTORIES[v[0]], v[1])
        wall, fold, zone = v
        tz = (zoneinfo.ZoneInfo(zone) if type(zone) is str
              else _dt.timezone(zone[0], zone[1]))
        return _dt.datetime.fromisoformat(wall).replace(tzinfo=tz, fold=fold)


default_serde = MsgpackSerde()
