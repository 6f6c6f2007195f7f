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

import collections
import datetime as _dt
import enum
import re
from typing import Any, Callable

import msgpack
import xxhash

from ..errors import SerializationError, StepFailedError
from ..serde import (
    EXT_COUNTER, EXT_DEFAULTDICT, EXT_ENUM, EXT_FROZENSET, EXT_SET, MsgpackSerde, class_path,
    find_class,
)

__all__ = ["Values", "fingerprint"]

_EXT_FOREIGN = 127     # fingerprints only: a value the default serde cannot encode, as the
                       # store serde's bytes

# A default-serde encoding with none of these bytes holds no map of two or more keys and
# no set, frozenset, Counter, defaultdict or Enum: it is canonical as it is. A match may be
# a false alarm (the byte inside a string or a float): that only takes the slower path.
_codes = bytes([EXT_SET, EXT_FROZENSET, EXT_ENUM, EXT_COUNTER, EXT_DEFAULTDICT])
_UNORDERED = re.compile(
    rb"[\x82-\x8f\xde\xdf]|[\xd4-\xd8][%s]|\xc7.[%s]|\xc8..[%s]|\xc9....[%s]"
    % ((re.escape(_codes),) * 4), re.DOTALL).search


def fingerprint(b: bytes) -> int:
    """xxh3-64 of bytes, as journal records keep it."""
    return xxhash.xxh3_64_intdigest(b)


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
        self.loads: Callable[[bytes], Any] = serde.loads
        self._faithful = getattr(serde, "faithful", False) is True
        # the serde's own bytes are the canonical ones when nothing in them is unordered
        self._fast = type(serde) is MsgpackSerde
        self._canon = serde if self._fast else MsgpackSerde(
            fallback=lambda o: msgpack.ExtType(_EXT_FOREIGN, serde.dumps(o)))

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
        if self._fast and _UNORDERED(b) is None:
            return b, fingerprint(b)             # the hot path: canonical as encoded
        return b, self.canonical(value)

    def canonical(self, value: Any) -> int:
        """The fingerprint of ``value`` whatever its set and dict orders (FORMAT.md 5a)."""
        return fingerprint(self._canon.dumps(self._sorted(value)))

    def _sorted(self, v: Any) -> Any:
        t = type(v)
        if t is list:
            return [self._sorted(x) for x in v]
        if t is dict or t is collections.Counter or t is collections.defaultdict:
            out = t() if t is not collections.defaultdict else t(v.default_factory)
            dict.update(out, self._ordered((self._sorted(k), self._sorted(x))
                                           for k, x in v.items()))
            return out
        if t is tuple:
            return tuple(self._sorted(x) for x in v)
        if t is set or t is frozenset:
            items = sorted(self._key_bytes(self._sorted(x)) for x in v)
            return msgpack.ExtType(EXT_SET if t is set else EXT_FROZENSET,
                                   msgpack.Packer().pack_array_header(len(items)) + b"".join(items))
        if t is collections.OrderedDict:         # its order is part of its value
            return t((self._sorted(k), self._sorted(x)) for k, x in v.items())
        if isinstance(v, enum.Enum):             # by name: its value may hold a set
            try:
                return msgpack.ExtType(EXT_ENUM, self._canon.dumps([*class_path(t), v.name]))
            except TypeError:                    # not reachable: the store serde's bytes
                return v
        if isinstance(v, tuple) and hasattr(t, "_fields"):
            return tuple.__new__(t, [self._sorted(x) for x in v])
        return v

    def _key_bytes(self, v: Any) -> bytes:
        return self._canon.dumps(v)

    def _ordered(self, pairs: Any) -> list:
        pairs = list(pairs)
        if all(type(k) is str for k, _ in pairs):
            return sorted(pairs, key=lambda kv: kv[0])
        return sorted(pairs, key=lambda kv: self._key_bytes(kv[0]))

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
        state = {k: v for k, v in vars(exc).items() if self._try(v) is not None}
        if state:
            more["d"] = state
        return [f"{t.__module__}.{t.__qualname__}", str(exc), args_b, self._try(more)]

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
        loaded = None if args_b is None else self._load(args_b)
        args = tuple(loaded) if type(loaded) is list else None
        state = more.get("d") if type(more.get("d")) is dict else {}
        init = tuple(more["i"]) if type(more.get("i")) is list else args
        if init is not None:
            try:
                exc = cls(*init)
                exc.__dict__.update(state)
                if str(exc) == msg:
                    return exc
            except Exception:
                pass
        return self._bare(cls, args if args is not None else (msg,), state)

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
