"""What the run journal records of a value, and what a replay gives back.

Three rules (docs/GUARANTEES.md section 16), kept here so that the verbs in
:mod:`durkv.runtime.run` only call them:

- **A recorded value replays as an equal value of the same type**, recursively, or
  is refused when it is recorded. The default serde is faithful by construction
  (``serde.faithful``); any other (LangGraph's) is checked by decoding what it wrote.
- **Fingerprints are canonical**: set order, dict key order and keyword order never
  matter, and a process's hash seed does not either; ``1``, ``1.0``, ``True`` and
  ``"1"`` stay distinct (docs/FORMAT.md section 5a).
- **A recorded failure replays as its own exception class**, rebuilt from its module
  path and its reduce arguments, never as a look-alike.

>>> from durkv.serde import default_serde
>>> v = Values(default_serde)
>>> v.encode({"b": 1, "a": {"y", "x"}})[1] == v.encode({"a": {"x", "y"}, "b": 1})[1]
True
"""

from __future__ import annotations

import builtins
import collections
import datetime as _dt
import decimal
import enum
import logging
import uuid
from operator import itemgetter
from typing import Any, Callable

import msgpack
import xxhash

from ..errors import SerializationError, StepFailedError
from ..serde import (EXT_ENUM, EXT_FROZENSET, EXT_SET, MsgpackSerde, class_path, find_class,
                     without_fold)

__all__ = ["Values", "err_message", "fingerprint"]

log = logging.getLogger("durkv")

_EXT_FOREIGN = 127     # fingerprints only: a value the default serde cannot encode, as the
                       # store serde's bytes

# A default-serde encoding depends on an order only through a map of two or more entries,
# or a set, frozenset, Enum (its value may hold a set), Counter or defaultdict (extension
# types). Bytes with none of these header bytes hold none of them: they are canonical as
# they are. A byte found may be a false alarm (inside a string): that takes the slower,
# still exact, path.
_EXT_HEADS = [0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8]
_MAYBE = bytes(i in (*range(0x82, 0x90), 0xDE, 0xDF, *_EXT_HEADS) for i in range(256))
_EXT = bytes(i in _EXT_HEADS for i in range(256))      # may hold an extension type

# ormsgpack (LangGraph installs it; durkv does not depend on it) sorts map keys in C, so
# JSON-like data, what steps mostly take, is made canonical without a Python walk. Every
# other type is passed to _not_plain, which sends the value to the walk.
try:
    import ormsgpack
    _ORM = (ormsgpack.OPT_SORT_KEYS | ormsgpack.OPT_PASSTHROUGH_TUPLE
            | ormsgpack.OPT_PASSTHROUGH_SUBCLASS | ormsgpack.OPT_PASSTHROUGH_BIG_INT
            | ormsgpack.OPT_PASSTHROUGH_DATETIME | ormsgpack.OPT_PASSTHROUGH_ENUM
            | ormsgpack.OPT_PASSTHROUGH_UUID | ormsgpack.OPT_PASSTHROUGH_DATACLASS)
except (ImportError, AttributeError):     # pragma: no cover - absent, or too old
    ormsgpack = None
_LEAVES = frozenset([str, int, float, bool, bytes, type(None)])
# exception groups (Python 3.11+): recorded and rebuilt around their sub-exceptions
_GROUP: type | None = getattr(builtins, "BaseExceptionGroup", None)
# the types the default serde encodes itself, and their subclasses: a value of any other type
# is "foreign", and its canonical encoding is ExtType(127, the store serde's bytes of it)
_NATIVE = (type(None), bool, int, float, str, bytes, bytearray, memoryview, list, dict, tuple,
           set, frozenset, _dt.date, _dt.time, _dt.timedelta, uuid.UUID, decimal.Decimal,
           enum.Enum, msgpack.ExtType, msgpack.Timestamp)
_first = itemgetter(0)


def _array_header(n: int) -> bytes:
    return bytes((0x90 | n,)) if n < 16 else (b"\xdc" + n.to_bytes(2, "big") if n < 65536
                                              else b"\xdd" + n.to_bytes(4, "big"))


_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}


def _ext_header(code: int, n: int) -> bytes:
    """msgpack's header of an extension value of ``n`` data bytes."""
    fixed = _FIXEXT.get(n)
    if fixed is not None:
        return bytes((fixed, code))
    if n < 256:
        return bytes((0xC7, n, code))
    return (b"\xc8" + n.to_bytes(2, "big") if n < 65536
            else b"\xc9" + n.to_bytes(4, "big")) + bytes((code,))


def _not_plain(obj: Any) -> Any:
    raise TypeError(type(obj).__qualname__)


# xxh3-64 of bytes, as journal records keep it: the C function itself, no Python frame
# around it (a live step fingerprints its inputs through it, from C: run.py's StepEntry)
fingerprint: Callable[[bytes], int] = xxhash.xxh3_64_intdigest


def _differs(a: Any, b: Any, path: str) -> str | None:
    """Where ``b`` (a value read back) is not ``a`` (the value given): another type, or
    another value; None when it is the same, recursively."""
    where = path.lstrip() or "the top level"
    if type(a) is not type(b):
        return (f"a {type(a).__qualname__} at {where} reads back as a "
                f"{type(b).__qualname__}")
    if isinstance(a, (_dt.datetime, _dt.time)) and (a.tzinfo != b.tzinfo or a.fold != b.fold):
        return f"the zone of the {type(a).__qualname__} at {where} reads back as {b.tzinfo!r}"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"the keys of the {type(a).__qualname__} at {where} read back otherwise"
        pairs = [(f"{path}[{k!r}]", a[k], b[k]) for k in a]
    elif isinstance(a, (list, tuple)) and len(a) == len(b):
        pairs = [(f"{path}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b))]
    else:
        try:
            same = a == b or (a != a and b != b)     # NaN reads back as NaN
        except Exception:
            same = False
        return None if same else f"the {type(a).__qualname__} at {where} reads back unequal"
    for p, x, y in pairs:
        bad = _differs(x, y, p)
        if bad is not None:
            return bad
    return None


class Values:
    """The journal's encoding of values, fingerprints and exceptions over one serde."""

    def __init__(self, serde: Any) -> None:
        self.dumps: Callable[[Any], bytes] = serde.dumps
        # (the serde bytes of each value of a list, a state for the call on the list grown
        # from it): LangGraphSerde encodes a LangChain message from its fields, to the same
        # bytes, and an unchanged prefix once (checked by bytes) -- langgraph_messages.py
        many = getattr(serde, "dumps_items", None)
        self.dumps_items: Callable[[list, Any], tuple[list[bytes], Any]] = (
            many if callable(many) else lambda xs, prior=None: ([serde.dumps(x) for x in xs],
                                                                None))
        self.loads: Callable[[bytes], Any] = serde.loads
        self._faithful = getattr(serde, "faithful", False) is True
        # the serde's own bytes are the canonical ones when nothing in them is unordered
        self._fast = type(serde) is MsgpackSerde
        # the store serde is the default one: its bytes of a list are its items' bytes joined
        self.default_serde = self._fast
        self._canon = serde if self._fast else MsgpackSerde(
            fallback=lambda o: msgpack.ExtType(_EXT_FOREIGN, serde.dumps(o)))
        self._foreign: dict[type, bool] = {}
        self._foreign_types: set[type] = set()      # the types _foreign says True of
        self.fingerprint = fingerprint

    # -- values ------------------------------------------------------------------------------

    def record(self, value: Any) -> bytes:
        """The serde bytes of a value to record: a result, a receipt, a payload.

        Raises:
            SerializationError: the value would not replay as an equal value of its type.
        """
        b = self.dumps(value)
        if not self._faithful:
            bad = _differs(value, self.loads(b), "")
            if bad is not None:
                raise SerializationError(
                    f"{bad} through this store's serializer, so a replay would differ from "
                    "the first execution; record a value it keeps (e.g. a list for a tuple, "
                    "a dict for a Counter)")
        return b

    # -- fingerprints ------------------------------------------------------------------------

    def encode(self, value: Any) -> tuple[bytes, int]:
        """The serde bytes of ``value`` and its canonical fingerprint."""
        b = self.dumps(value)
        if self._fast and 1 not in b.translate(_MAYBE):    # one C pass (a regex: ~8x slower)
            return b, fingerprint(b)                     # the hot path: canonical as encoded
        return b, fingerprint(self.canonical_bytes(value, b))

    def canonical_bytes(self, value: Any, b: bytes) -> bytes:
        """The canonical encoding (FORMAT.md 5a) of ``value``, whose serde bytes are ``b``."""
        if self._fast:
            if 1 not in b.translate(_MAYBE):
                return b
            if ormsgpack is not None and 1 not in b.translate(_EXT):
                # no extension type (bytearray, tuple, set...): only maps to sort, which
                # ormsgpack does byte for byte as the walk below would, in C
                try:
                    return ormsgpack.packb(value, option=_ORM, default=_not_plain)
                except Exception:
                    pass                         # a non-str key, a big int: the walk
        elif self._is_foreign(type(value)):    # what the fallback packs, without
            return _ext_header(_EXT_FOREIGN, len(b)) + b     # encoding the value again
        return self._canon.dumps(self._sorted(value))

    def canonical_items(self, values: list, items: list[bytes], base: tuple | None = None,
                        k: int = 0) -> tuple[list[bytes], int]:
        """The canonical encodings of the items ``values`` (their serde bytes ``items``),
        and how many leading items are *foreign* (a value the default serde cannot encode,
        a LangGraph message: its canonical encoding is a header in front of its bytes, a
        function of the bytes alone). ``base``, ``k``: an earlier result of this method
        whose items' bytes equal the first ``k`` of ``items`` (runtime/inputs.py compared
        them): its encodings of leading foreign items are taken as they are, when the same
        items here are foreign too -- bytes compared, never objects."""
        out: list[bytes] = []
        lead = 0
        if base is not None and k:
            k = min(k, base[1])
            if k and set(map(type, values[:k])) <= self._foreign_types:
                out = base[0][:k]
                lead = k
        if lead < len(items):
            foreign, canon = self._is_foreign, self.canonical_bytes
            leading = True
            for v, b in zip(values[lead:], items[lead:]):
                if foreign(type(v)):
                    out.append(_ext_header(_EXT_FOREIGN, len(b)) + b)
                    if leading:
                        lead += 1
                else:
                    out.append(canon(v, b))
                    leading = False
        return out, lead

    def fingerprint_items(self, shape: list[int], canon: tuple[list[bytes], int]) -> int:
        """The canonical fingerprint of the inputs ``[args, kwargs]`` from the canonical
        encodings of their items (:meth:`canonical_items`): msgpack is compositional, an
        array is its header and its elements' encodings."""
        out = canon[0]
        parts = [b"\x92", _array_header(len(shape))]
        i = 0
        for n in shape:
            if n < 0:
                parts.append(out[i])
                i += 1
            else:
                parts.append(_array_header(n))
                parts.extend(out[i:i + n])
                i += n
        parts.append(out[i])
        return fingerprint(b"".join(parts))

    def _is_foreign(self, t: type) -> bool:
        """Whether values of type ``t`` are foreign to the default serde (this store's
        serde is another one, whose bytes of them the canonical encoding wraps)."""
        foreign = self._foreign.get(t)
        if foreign is None:
            foreign = self._foreign[t] = not self._fast and not issubclass(t, _NATIVE)
            if foreign:
                self._foreign_types.add(t)
        return foreign

    def canonical(self, value: Any) -> int:
        """The fingerprint of ``value`` whatever its set and dict orders (FORMAT.md 5a)."""
        return fingerprint(self._canon.dumps(self._sorted(value)))

    def _sorted(self, v: Any) -> Any:
        """``v`` with its maps and sets in canonical order (leaves are passed over inline:
        this walk is the cost of a fingerprint off the hot path)."""
        t = type(v)
        sort = self._sorted
        if t is list or t is tuple:
            out = [x if type(x) in _LEAVES else sort(x) for x in v]
            return out if t is list else tuple(out)
        if t is dict or t is collections.Counter or t is collections.defaultdict:
            return self._sorted_map(v, t)
        if t is set or t is frozenset:
            items = sorted([self._canon.dumps(x if type(x) in _LEAVES else sort(x)) for x in v])
            return msgpack.ExtType(EXT_SET if t is set else EXT_FROZENSET,
                                   _array_header(len(items)) + b"".join(items))
        if t is collections.OrderedDict:         # its order is part of its value
            return t([(sort(k), sort(x)) for k, x in v.items()])
        if isinstance(v, enum.Enum):             # by name: its value may hold a set
            try:
                return msgpack.ExtType(EXT_ENUM, self._canon.dumps([*class_path(t), v.name]))
            except TypeError:                    # not reachable: the store serde's bytes
                return v
        if isinstance(v, tuple) and hasattr(t, "_fields"):
            return tuple.__new__(t, [sort(x) for x in v])
        if t is _dt.datetime or t is _dt.time:
            # fingerprinted as before ext codes 18/19 (FORMAT.md 5a): a fold=1 value was
            # encoded without its fold, and runs recorded then must still replay
            return without_fold(v)
        return v

    def _sorted_map(self, v: Any, t: type) -> Any:
        """A dict (Counter, defaultdict) with its entries in canonical order: by key when
        every key is a str, else by the canonical bytes of the key."""
        sort = self._sorted
        pairs = [(k if type(k) in _LEAVES else sort(k), x if type(x) in _LEAVES else sort(x))
                 for k, x in v.items()]
        if len(pairs) > 1:
            if all([type(k) is str for k in v]):
                pairs.sort(key=_first)
            else:
                pairs.sort(key=lambda kv: self._canon.dumps(kv[0]))
        if t is dict:
            return dict(pairs)
        out = t() if t is collections.Counter else t(v.default_factory)
        dict.update(out, pairs)
        return out

    def matches(self, recorded: int | None, fp: int, recorded_in: bytes | None,
                shape: Callable[[Any], Any] = lambda v: v) -> bool:
        """Whether a recorded fingerprint is that of the input whose fingerprint is
        ``fp``. A record written before fingerprints were canonical hashed the serde
        bytes as given: its recorded input (``in``, when kept) is fingerprinted again."""
        if recorded == fp:
            return True
        if recorded_in is None:
            return False
        try:
            return self.canonical(shape(self.loads(recorded_in))) == fp
        except Exception:
            return False

    # -- exceptions --------------------------------------------------------------------------

    def error(self, exc: BaseException) -> list:
        """A failure as a journal's ``err``: ``[type, message, args, more]`` (FORMAT.md 5a)."""
        t = type(exc)
        args_b = self._try(list(exc.args))
        more: dict = {"m": t.__module__, "q": t.__qualname__}
        init = self._init_args(exc)
        if init is not None and init != exc.args and self._try(list(init)) is not None:
            more["i"] = list(init)
        state, lost = {}, []
        for k, v in vars(exc).items():
            if self._try(v) is None:
                lost.append(k)      # a client's response object: see rebuild
            else:
                state[k] = v
        if state:
            more["d"] = state
        if lost:
            more["x"] = lost
            log.warning("durkv: recording %s.%s without its attribute(s) %s (they do not "
                        "serialize): a replay raises it without them; keep what a handler "
                        "needs as plain data on the exception", t.__module__, t.__qualname__,
                        ", ".join(lost))
        if _GROUP is not None and isinstance(exc, _GROUP):  # its args hold exceptions: apart
            more["gm"] = exc.message
            more["g"] = [self.error(sub) for sub in exc.exceptions]
        return [f"{t.__module__}.{t.__qualname__}", err_message(exc), args_b, self._try(more)]

    def _try(self, v: Any) -> bytes | None:
        try:
            return self.dumps(v)
        except Exception:
            return None

    @staticmethod
    def _init_args(exc: BaseException) -> tuple | None:
        """The arguments the exception's own reduce protocol calls its class with (None:
        it reduces to another callable, which a journal never calls)."""
        try:
            r = exc.__reduce_ex__(2)
        except Exception:
            return None
        if isinstance(r, tuple) and len(r) >= 2 and r[0] is type(exc):
            return tuple(r[1])
        return None

    def rebuild(self, err: list, where: str, **context: Any) -> BaseException:
        """The recorded exception again, as its own class (docs/FORMAT.md 5a); a
        :class:`StepFailedError` naming the recorded type when that class cannot be found."""
        tname, msg, args_b = err[0], err[1], err[2]
        more = self._load(err[3]) if len(err) > 3 and err[3] is not None else None
        more = more if type(more) is dict else {}
        try:
            cls = self._exc_class(tname, more)
        except Exception as e:
            return StepFailedError(
                f"{where} failed with {tname}: {msg}; that exception class cannot be found "
                f"here ({type(e).__name__}: {e}), so it cannot be raised again: replay the run "
                "where the code that recorded it can be imported", error_type=tname, **context)
        state = more.get("d") if type(more.get("d")) is dict else {}
        if _GROUP is not None and issubclass(cls, _GROUP):
            return self._group(cls, msg, more, state, where, context)
        loaded = None if args_b is None else self._load(args_b)
        args = tuple(loaded) if type(loaded) is list else None
        init = tuple(more["i"]) if type(more.get("i")) is list else args
        # attributes that did not serialize are absent on the replay, never another value
        # (``__init__`` called with the args may set one to something else: the message)
        lost = [k for k in more.get("x", ()) if type(k) is str] if type(
            more.get("x")) is list else []
        if init is not None:
            try:
                exc = cls(*init)
                exc.__dict__.update(state)
                for k in lost:
                    exc.__dict__.pop(k, None)
                if str(exc) == msg:
                    return exc
            except Exception:
                pass
        try:
            return self._bare(cls, args if args is not None else (msg,), state)
        except Exception as e:
            return self._unbuildable(tname, msg, where, e, context)

    def _group(self, cls: type, msg: str, more: dict, state: dict, where: str,
               context: dict) -> BaseException:
        """An exception group again: its own class around its sub-exceptions, each
        rebuilt as its own class (an ``except*`` on the replay matches as it did live)."""
        tname = f"{cls.__module__}.{cls.__qualname__}"
        subs, gm = more.get("g"), more.get("gm")
        if type(subs) is not list or type(gm) is not str:   # recorded before groups were
            return self._unbuildable(tname, msg, where, None, context)
        try:
            exc = cls(gm, [self.rebuild(sub, where, **context) for sub in subs])
            exc.__dict__.update(state)
            return exc
        except Exception as e:
            return self._unbuildable(tname, msg, where, e, context)

    @staticmethod
    def _unbuildable(tname: str, msg: str, where: str, e: Exception | None,
                     context: dict) -> StepFailedError:
        why = "its record predates exception groups" if e is None else (
            f"{type(e).__name__}: {e}")
        return StepFailedError(
            f"{where} failed with {tname}: {msg}; that exception cannot be built again here "
            f"({why}), so a StepFailedError stands for it", error_type=tname, **context)

    @staticmethod
    def _bare(cls: type, args: tuple, state: dict) -> BaseException:
        """``cls`` without its ``__init__`` (it takes other arguments than ``args``)."""
        try:
            exc = cls.__new__(cls, *args)
        except Exception:
            exc = BaseException.__new__(cls, *args)
        exc.args = args
        exc.__dict__.update(state)
        return exc

    def _load(self, b: bytes) -> Any:
        try:
            return self.loads(b)
        except Exception:
            return None

    @staticmethod
    def _exc_class(tname: str, more: dict) -> type:
        if type(more.get("m")) is str and type(more.get("q")) is str:
            candidates = [(more["m"], more["q"])]
        else:        # an older record: "module.qualname", split at each dot from the right
            parts = tname.split(".")
            candidates = [(".".join(parts[:i]), ".".join(parts[i:]))
                          for i in range(len(parts) - 1, 0, -1)]
        err: Exception = LookupError(f"no class {tname}")
        for module, qual in candidates:
            try:
                cls = find_class(module, qual)
            except Exception as e:
                err = e
                continue
            if issubclass(cls, Exception):
                return cls
            err = LookupError(f"{tname} is not an Exception class")
        raise err


def err_message(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception's own ``__str__`` fails (a library's
    format string with the wrong arity): its failure is still recorded, as its class with
    its args, never lost to a TypeError from inside the journal."""
    try:
        return str(exc)
    except Exception:
        try:
            args = repr(exc.args)
        except Exception:
            args = "?"
        return f"<{type(exc).__name__} whose str() fails; args {args[:200]}>"
