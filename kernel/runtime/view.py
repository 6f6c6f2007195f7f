"""A run's journal as :class:`durkv.runtime.JournalEntry` values, for people and the CLI."""

from __future__ import annotations

from typing import Any, Callable

from .inputs import Unreadable, decoded
from .journal import JournalEntry, fold

__all__ = ["describe", "Opaque", "UnreadableInputs"]


class Opaque:
    """A journaled value this store handle's serde cannot decode (e.g. a LangGraph
    object read through a store opened without the LangGraph serde)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"<{len(self.data)} bytes this serde cannot decode>"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Opaque) and other.data == self.data

    __hash__ = None  # type: ignore[assignment]


class UnreadableInputs:
    """Journaled inputs that cannot be rebuilt: a record they refer to is not in the
    journal (a repair cut it), or an item does not decode with this serde. Never a
    partial value: the inputs' fingerprint still checks a replay."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"<inputs not readable: {self.why}>"


def _decode(loads: Callable[[bytes], Any], b: bytes) -> Any:
    try:
        return loads(b)
    except Exception:
        return Opaque(b)


def _inputs(loads: Callable[[bytes], Any], inputs: Any,
            read: Callable[[int, int, int], bytes] | None) -> Any:
    """A record's inputs decoded: ``in`` bytes, or an ``ir`` followed to its items
    (``read``: the store's ``write_item``, for items named by their place in the log)."""
    if inputs is None or type(inputs) is bytes:
        return inputs if inputs is None else _decode(loads, inputs)
    try:
        return decoded(inputs, loads, read)
    except Unreadable as e:
        return UnreadableInputs(str(e))
    except Exception as e:
        return UnreadableInputs(f"an item does not decode with this store's serde "
                                f"({type(e).__name__}: {e})")


def describe(store: Any, run_id: str) -> list[JournalEntry]:
    """A run's journal as :class:`JournalEntry` values (decoded; newest state per entry)."""
    st = fold(run_id, store.journal(run_id))
    loads = store.serde.loads
    read = getattr(store, "write_item", None)
    out = []
    for e in st.order:
        if e.kind == "approval":
            d = e.decision
            approval = "pending" if d is None else ("approved" if d.get("ok") else "rejected")
        else:
            approval = None
        if e.done or e.decision is not None:
            state = "failed" if e.err is not None else "done"
        elif e.kind == "tool":
            state = "in_doubt"
        else:
            state = "pending"
        inputs = _inputs(loads, e.inputs, read)
        result = None
        if e.result is not None:
            result = _decode(loads, e.result)
        elif e.kind == "approval" and e.decision is not None:
            result = bool(e.decision.get("ok"))
        out.append(JournalEntry(
            e.step_id, e.gen, e.kind, e.name, f"{e.fp:016x}", inputs, e.prompt_version,
            e.tool_version, e.key, approval, result, e.retry_count,
            None if e.err is None else f"{e.err[0]}: {e.err[1]}",
            [list(t) for t in e.tries], state, e.started, e.ended, tuple(e.warnings),
            e.comp_of))
    return out
