"""The agent loop as a LangGraph graph, for ``durkv bench`` (needs ``durkv[langgraph]``).

One node run N times; each superstep appends one ~1 KiB message
(:func:`durkv.cli.benchwork.message`) to ``messages: Annotated[list, operator.add]``.
It is checkpointed by DurkvSaver, SqliteSaver (when ``langgraph-checkpoint-sqlite`` is
installed), InMemorySaver and :class:`NullSaver`, under LangGraph's ``durability="sync"``
and ``"async"``; every saver's ratio is taken against the null saver under the same
mode: what storing costs on top of LangGraph's own checkpointing.

Importing this module raises ImportError when LangGraph is not installed.
"""

from __future__ import annotations

import operator
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from ..durability import ASYNC, SYNC
from ..langgraph import DurkvSaver
from .benchwork import Run, Workload, dir_bytes, message

DURKV = "langgraph + DurkvSaver"
SQLITE = "langgraph + SqliteSaver"
MEMORY = "langgraph + InMemorySaver"
NULL = "langgraph + null saver"
MODES = (SYNC, ASYNC)


class NullSaver(BaseCheckpointSaver[int]):
    """A checkpointer that stores nothing: LangGraph's own checkpointing cost.

    The graph still builds every checkpoint, computes new versions and calls
    ``put``/``put_writes``; only the storing is free. The gap between it and a real
    saver is what the saver costs on LangGraph's hot path.
    """

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return None

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        return iter(())

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        conf = config["configurable"]
        return {"configurable": {"thread_id": conf["thread_id"],
                                 "checkpoint_ns": conf.get("checkpoint_ns", ""),
                                 "checkpoint_id": checkpoint["id"]}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        return None

    def delete_thread(self, thread_id: str) -> None:
        return None

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return None

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        return
        yield

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        return None

    async def adelete_thread(self, thread_id: str) -> None:
        return None


class State(TypedDict):
    n: int
    messages: Annotated[list, operator.add]


def agent_graph(n: int, state: type = State, make: Callable[[int], Any] = message
                ) -> StateGraph:
    """The agent loop: node ``agent`` adds message ``make(n)`` and loops until N steps."""
    def agent(s) -> dict:
        return {"n": s["n"] + 1, "messages": [make(s["n"])]}

    g = StateGraph(state)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["n"] < n else END)
    return g


def cfg(thread: str, n: int) -> dict:
    """The invoke config of thread ``thread`` with room for N supersteps."""
    return {"configurable": {"thread_id": thread}, "recursion_limit": n + 10}


def _durkv(where: Path) -> tuple[Any, Any]:
    saver = DurkvSaver.open(str(where / "agent.durkv"))   # follows LangGraph's durability=

    def close() -> None:
        saver.flush()
        saver.close()
    return saver, close


def _sqlite(where: Path) -> tuple[Any, Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver
    conn = sqlite3.connect(str(where / "agent.sqlite"), check_same_thread=False)
    return SqliteSaver(conn), conn.close


def graph_run(open_saver: Any, mode: str, on_disk: bool) -> Run:
    """Invoke the agent graph once for N supersteps under LangGraph's ``durability=mode``
    on a saver made by ``open_saver(where) -> (saver, close)``."""
    def run(where: Path, n: int) -> tuple[float, int | None]:
        saver, close = open_saver(where)
        try:
            graph = agent_graph(n).compile(checkpointer=saver)
            t0 = time.perf_counter()
            graph.invoke({"n": 0, "messages": []}, cfg("agent", n), durability=mode)
            took = time.perf_counter() - t0
        finally:
            close()
        return took, dir_bytes(where) if on_disk else None
    return run


def workloads() -> tuple[list[Workload], list[str]]:
    """The LangGraph workloads, and a note for each saver left out (and why)."""
    savers: list[tuple[str, Any, bool]] = [
        (NULL, lambda where: (NullSaver(), lambda: None), False),
        (MEMORY, lambda where: (InMemorySaver(), lambda: None), False),
        (DURKV, _durkv, True)]
    notes = []
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401 - a separate distribution
        savers.append((SQLITE, _sqlite, True))
    except ImportError as exc:
        notes.append(f"{SQLITE} rows left out: {exc} "
                     f"(pip install langgraph-checkpoint-sqlite)")
    out = [Workload(name, mode, graph_run(opener, mode, disk), (NULL, mode))
           for mode in MODES for name, opener, disk in savers]
    return out, notes
