"""What one durable call will do (replay a recorded entry, or call and record), shared by
the sync verbs (:mod:`durkv.runtime.run`) and the async ones (:mod:`durkv.runtime.aio`)."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .journal import Entry
from .tools import Retry, ToolSpec

__all__ = ["Plan", "err_type", "ONCE", "plain_version"]

ONCE = Retry(1)      # no retry: one attempt


class Plan:
    """What one durable call will do: replay a recorded entry, or call and record."""

    __slots__ = ("sid", "gen", "kind", "name", "fp", "inputs", "version", "entry", "replay",
                 "rc", "key", "t0", "comp_of", "spec", "tries")

    def __init__(self, sid: str, kind: str, name: str, fp: int, inputs: Any,
                 version: Any) -> None:
        self.sid, self.kind, self.name, self.fp = sid, kind, name, fp
        self.inputs, self.version = inputs, version
        self.gen = 0
        self.entry: Entry | None = None
        self.replay = False
        self.rc = 0
        self.key: str | None = None
        self.t0 = 0.0
        self.comp_of: str | None = None
        self.spec: ToolSpec | None = None
        self.tries: tuple | list = ()    # failed attempts already journaled (the budget used)


def err_type(exc: BaseException) -> str:
    t = type(exc)
    return f"{t.__module__}.{t.__qualname__}"


def plain_version(v: Any) -> Any:
    """A ``prompt_version`` as the journal records and replays it (a tuple is a list), so
    that a replay compares like with like; anything else is refused before the call."""
    if v is None or isinstance(v, (str, int, float)):
        return v
    if isinstance(v, (list, tuple)):
        return [plain_version(x) for x in v]
    if isinstance(v, dict) and all(type(k) is str for k in v):
        return {k: plain_version(x) for k, x in v.items()}
    raise ConfigError(f"prompt_version must be plain data (str, numbers, lists or str-keyed "
                      f"dicts of them), got {type(v).__name__} {v!r}; pass e.g. str(...) of it")
