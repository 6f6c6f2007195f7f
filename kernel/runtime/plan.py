"""What one durable call will do (replay a recorded entry, or call and record), shared by
the sync verbs (:mod:`durkv.runtime.run`) and the async ones (:mod:`durkv.runtime.aio`)."""

from __future__ import annotations

from typing import Any

from .journal import Entry
from .tools import Retry, ToolSpec

__all__ = ["Plan", "err_type", "ONCE"]

ONCE = Retry(1)      # no retry: one attempt


class Plan:
    """What one durable call will do: replay a recorded entry, or call and record."""

    __slots__ = ("sid", "gen", "kind", "name", "fp", "inputs", "version", "entry", "replay",
                 "rc", "key", "t0", "comp_of", "spec")

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


def err_type(exc: BaseException) -> str:
    t = type(exc)
    return f"{t.__module__}.{t.__qualname__}"
