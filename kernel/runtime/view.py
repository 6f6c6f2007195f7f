"""A run's journal as :class:`durkv.runtime.JournalEntry` values, for people and the CLI."""

from __future__ import annotations

from typing import Any, Callable

from .journal import JournalEntry, fold

__all__ = ["describe", "Opaque"]


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


def _decode(loads: Callable[[bytes], Any], b: bytes) -> Any:
    try:
        return loads(b)
    except Exception:
        return Opaque(b)


def describe(store: Any, run_id: str) -> list[JournalEntry]:
    """A run's journal as :class:`JournalEntry` values (decoded; newest state per entry)."""
    st = fold(run_id, store.journal(run_id))
    loads = store.serde.loads
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
        inputs = None if e.inputs is None else _decode(loads, e.inputs)
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
