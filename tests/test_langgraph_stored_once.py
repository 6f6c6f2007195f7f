"""A message LangGraph hands to ``put_writes`` and then, folded by a reducer, to ``put``
is stored once (docs/FORMAT.md section 5, "Pending writes as channel deltas").

Each message carries a unique marker; the test counts the markers in the store's
files byte for byte, decompressing every zstd frame found in them, so it sees
through any encoding the store picks. Before the change every marker was there
twice (the pending write and the checkpoint's channel delta). The same count holds
after ``compact()``, and everything reads back exactly after compaction,
``copy_thread``, ``prune`` and ``delete_thread``.
"""

from __future__ import annotations

import operator
import re
import uuid
from pathlib import Path
from typing import Annotated

import pytest
import zstandard
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from durkv.langgraph import DurkvSaver

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_FILLER = ("agent tool call result plan step observe think answer retry search read write "
           "file shell patch test pass fail error fix deploy review ") * 12


class DictState(TypedDict):
    n: int
    messages: Annotated[list, operator.add]


class MessagesState(TypedDict):
    n: int
    messages: Annotated[list, add_messages]


def _content(run: str, i: int, big: bool) -> str:
    # big: ~1.2 KB, stored zstd-compressed; small: stored as is
    return f"MARK-{run}-{i:04d}-END " + (_FILLER if big else "short")


def agent_graph(n: int, kind: str, run: str, big: bool):
    if kind == "dict":
        def agent(s):
            return {"n": s["n"] + 1, "messages": [{"role": "assistant", "id": f"m{s['n']}",
                                                   "content": _content(run, s["n"], big)}]}
        state = DictState
    else:
        def agent(s):
            return {"n": s["n"] + 1,
                    "messages": [AIMessage(content=_content(run, s["n"], big), id=f"m{s['n']}")]}
        state = MessagesState
    g = StateGraph(state)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["n"] < n else END)
    return g


def store_text(path: Path) -> bytes:
    """Every byte of the store's files, with each zstd frame in them replaced by its
    output (a frame keeps literals as they are: counted once, decompressed)."""
    out = []
    d = zstandard.ZstdDecompressor()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        data = f.read_bytes()
        start = 0
        pos = data.find(_ZSTD_MAGIC)
        while pos >= 0:
            o = d.decompressobj()
            try:
                text = o.decompress(data[pos:])
            except zstandard.ZstdError:
                text = None
            if text is not None and o.eof:
                out.append(data[start:pos])
                out.append(text)
                start = len(data) - len(o.unused_data)
                pos = data.find(_ZSTD_MAGIC, start)
            else:
                pos = data.find(_ZSTD_MAGIC, pos + 1)
        out.append(data[start:])
    return b"\n".join(out)


def marker_counts(path: Path, run: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in re.findall(rb"MARK-" + run.encode() + rb"-\d{4}-END", store_text(path)):
        counts[m.decode()] = counts.get(m.decode(), 0) + 1
    return counts


def contents(state_messages) -> list[str]:
    return [m["content"] if isinstance(m, dict) else m.content for m in state_messages]


N = 12


@pytest.mark.parametrize("big", [True, False], ids=["zstd", "plain"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", ["dict", "aimessage"])
def test_message_appended_once_is_stored_once(tmp_path, kind, mode, big):
    run = uuid.uuid4().hex[:8]
    path = tmp_path / "s.durkv"
    cfg = {"configurable": {"thread_id": "t"}, "recursion_limit": N + 10}
    with DurkvSaver.open(str(path)) as saver:
        graph = agent_graph(N, kind, run, big).compile(checkpointer=saver)
        graph.invoke({"n": 0, "messages": []}, cfg, durability=mode)
        want = [_content(run, i, big) for i in range(N)]
        assert contents(graph.get_state(cfg).values["messages"]) == want
        history = [contents(s.values["messages"]) for s in graph.get_state_history(cfg)]
        saver.flush()
        counts = marker_counts(path, run)
        assert sorted(counts) == [f"MARK-{run}-{i:04d}-END" for i in range(N)]
        twice = {m: c for m, c in counts.items() if c != 1}
        assert not twice, f"stored more than once: {twice}"

        saver.store.compact()
        saver.flush()
        counts = marker_counts(path, run)
        twice = {m: c for m, c in counts.items() if c != 1}
        assert len(counts) == N and not twice, f"after compact: {twice or counts}"
        assert contents(graph.get_state(cfg).values["messages"]) == want
        assert [contents(s.values["messages"]) for s in graph.get_state_history(cfg)] == history
    # and from disk, in a new process's view
    with DurkvSaver.open(str(path)) as saver:
        graph = agent_graph(N, kind, run, big).compile(checkpointer=saver)
        assert [contents(s.values["messages"]) for s in graph.get_state_history(cfg)] == history
        assert not saver.store.verify(deep=True).damage


def test_copy_prune_delete_then_compact_read_back(tmp_path):
    run = uuid.uuid4().hex[:8]
    path = tmp_path / "s.durkv"
    with DurkvSaver.open(str(path)) as saver:
        graph = agent_graph(N, "dict", run, True).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "a"}, "recursion_limit": N + 10}
        graph.invoke({"n": 0, "messages": []}, cfg, durability="async")
        saver.flush()
        history = [(s.config["configurable"]["checkpoint_id"], contents(s.values["messages"]),
                    s.next) for s in graph.get_state_history(cfg)]
        saver.copy_thread("a", "b")
        saver.store.prune(["a"], keep_last=3)
        saver.store.compact()
        bcfg = {"configurable": {"thread_id": "b"}}
        got = [(s.config["configurable"]["checkpoint_id"], contents(s.values["messages"]),
                s.next) for s in graph.get_state_history(bcfg)]
        assert got == history
        got_a = [(s.config["configurable"]["checkpoint_id"], contents(s.values["messages"]),
                  s.next) for s in graph.get_state_history(cfg)]
        assert got_a == history[:3]
        # every old checkpoint of the copy reads on its own, and its pending writes too
        for cid, msgs, _next in history:
            t = saver.get_tuple({"configurable": {"thread_id": "b", "checkpoint_id": cid}})
            assert contents(t.checkpoint["channel_values"].get("messages", [])) == msgs
        saver.delete_thread("b")
        saver.store.compact()
        assert [(s.config["configurable"]["checkpoint_id"], contents(s.values["messages"]),
                 s.next) for s in graph.get_state_history(cfg)] == history[:3]
        # a marker of a message the kept checkpoints still hold is stored exactly once
        counts = marker_counts(path, run)
        assert counts and all(c == 1 for c in counts.values()), counts
        # the loop goes on from the compacted store
        graph.invoke({"n": 0, "messages": []}, {**cfg, "recursion_limit": 2 * N + 10})
        assert len(graph.get_state(cfg).values["messages"]) == 2 * N
        assert not saver.store.verify(deep=True).damage
