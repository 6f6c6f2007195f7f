"""An exactly-once agent stores each message once: the journal and the checkpoints share
(docs/FORMAT.md 5 ``jref`` and 5a ``ir`` items ``[lsn, entry, index]``, issue 20).

A ReAct agent whose model call is a ``durkv.langgraph.step`` and whose tool is a
``durkv.langgraph.tool``: the model's reply is journaled (STEP ``r``) and then written by
the node; the tool's result is journaled (RECEIPT ``r``) and comes back inside the
ToolMessage; that ToolMessage is then an input of the next model step. Each reply and
each tool result carries a unique marker, and the test counts the markers in the store's
files byte for byte (zstd frames decompressed): each is there once. Everything reads back
as the same agent without the helpers stores it -- state, history, pending writes, the
journal's inputs (``durkv show``) -- also after prune, delete_runs, copy_thread, a
compaction (which writes the shared bytes out again) and a SIGKILL mid-run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Annotated

import msgpack
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

import durkv
import durkv.log
from durkv.errors import CorruptionError
from durkv.langgraph import DurkvSaver, step, tool
from durkv.log import SegmentLog
from durkv.payload import JREF_MAGIC, decode_commit, pack_jref
from durkv.runtime.view import UnreadableInputs, describe
from durkv.store import K_COPY_JOURNAL, K_JOURNAL, is_placed_item

from test_langgraph_stored_once import store_text

N = 16
_PAD = "plan the next call and keep the user's goal in view. " * 3


class State(TypedDict):
    messages: Annotated[list, add_messages]


@durkv.tool(version="1")
def lookup(q: str, *, idempotency_key: str | None = None) -> str:
    return f"TOOL-{q}-END {_PAD}"


def model(mark: str, messages: list) -> AIMessage:
    k = len(messages)
    return AIMessage(content=f"REPLY-{mark}-{k:04d}-END {_PAD}", id=f"ai-{k}",
                     tool_calls=[{"name": "lookup", "args": {"q": f"{mark}-{k:04d}"},
                                  "id": f"call-{k}"}])


def react(n: int, mark: str, durable: bool, kill_at: int = -1):
    """The agent: ``agent`` and ``tools`` alternate until the history has ``n`` messages.
    ``kill_at``: the process SIGKILLs itself inside that tool call (after its receipt
    could not have been written)."""
    def agent(state):
        msgs = state["messages"]
        if durable:
            return {"messages": [step("model", model, mark, msgs)]}
        return {"messages": [model(mark, msgs)]}

    def tools(state):
        call = state["messages"][-1].tool_calls[0]
        if len(state["messages"]) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        out = tool(lookup, **call["args"]) if durable else lookup(**call["args"])
        return {"messages": [tool_message(call, out)]}

    return loop(agent, tools, n)


def tool_message(call: dict, out: str) -> ToolMessage:
    return ToolMessage(content=out, tool_call_id=call["id"], id=f"tool-{call['id']}")


def loop(agent, tools, n: int) -> StateGraph:
    """``agent`` and ``tools`` alternating until the history has ``n`` messages."""
    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_node("tools", tools)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "tools" if len(s["messages"]) < n else END)
    g.add_edge("tools", "agent")
    return g


def cfg(thread: str = "t") -> dict:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 4 * N}


def run_agent(path: Path, mark: str, durable: bool, mode: str, n: int = N) -> None:
    with DurkvSaver.open(str(path)) as saver:
        react(n, mark, durable).compile(checkpointer=saver).invoke(
            {"messages": [HumanMessage(content="find it", id="h0")]}, cfg(), durability=mode)


def markers(path: Path, mark: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in re.findall(rb"(?:REPLY|TOOL)-" + mark.encode() + rb"-\d{4}-END",
                        store_text(path)):
        counts[m.decode()] = counts.get(m.decode(), 0) + 1
    return counts


def readback(path: Path, mark: str, thread: str = "t") -> tuple:
    """What a user reads of the thread: every state of its history (messages as data,
    next nodes) and every checkpoint's pending writes."""
    with DurkvSaver.open(str(path)) as saver:
        g = react(N, mark, False).compile(checkpointer=saver)
        hist = [([m.model_dump() for m in s.values.get("messages", [])], s.next)
                for s in g.get_state_history(cfg(thread))]
        writes = [[(w[1], w[2]) for w in (t.pending_writes or [])]
                  for t in saver.list(cfg(thread))]
    return hist, writes


def model_inputs(store, run_id: str = "t") -> list:
    """The message lists the journal says each model step was called with."""
    return [e.inputs for e in describe(store, run_id) if e.kind == "step"]


def journal_copies(path: Path) -> dict[tuple, int]:
    """How many K_COPY_JOURNAL frames the store holds, by the runs each names."""
    n: dict[tuple, int] = {}
    with SegmentLog.open(str(path), read_only=True) as log:
        for _lsn, payload in log.scan():
            h = msgpack.unpackb(decode_commit(payload)[0], strict_map_key=False)
            if h[0] == K_COPY_JOURNAL:
                runs = tuple(h[1]) if type(h[1]) is list else (h[1],)
                n[runs] = n.get(runs, 0) + 1
    return n


def item_forms(path: Path) -> dict[str, int]:
    """How many stored list items are jrefs, and journal ``ir`` items placed in the log."""
    n = {"jref": 0, "placed": 0}
    with SegmentLog.open(str(path), read_only=True) as log:
        for _lsn, payload in log.scan():
            head, entries = decode_commit(payload)
            n["jref"] += sum(x[:4] == JREF_MAGIC for e in entries for x in e.items)
            h = msgpack.unpackb(head, strict_map_key=False)
            if h[0] in (K_JOURNAL, K_COPY_JOURNAL) and isinstance(h[2].get("ir"), list):
                n["placed"] += sum(is_placed_item(x) for x in h[2]["ir"][2])
    return n


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_replies_and_tool_results_are_stored_once(tmp_path, mode):
    mark = uuid.uuid4().hex[:8]
    plain, durable = tmp_path / "plain.durkv", tmp_path / "durable.durkv"
    run_agent(plain, mark, False, mode)
    run_agent(durable, mark, True, mode)
    counts = markers(durable, mark)
    # a reply's marker is in the reply and in the tool call's arguments it names (the
    # model's `q`), which the plain agent stores as well: compare with the plain agent
    assert counts == markers(plain, mark), "the durable agent stores a message twice"
    forms = item_forms(durable)
    assert forms["jref"] >= N - 2 and forms["placed"] >= N // 2 - 2, forms
    assert readback(durable, mark) == readback(plain, mark)
    with DurkvSaver.open(str(durable)) as saver:
        state = react(N, mark, False).compile(checkpointer=saver).get_state(cfg())
        msgs = [m.model_dump() for m in state.values["messages"]]
        calls = model_inputs(saver.store)
        assert not saver.store.verify(deep=True).damage
    # each model step's inputs, rebuilt from the journal, are the history it was given
    assert len(calls) == N // 2
    for inputs in calls:
        (mark_arg, history), kwargs = inputs[0], inputs[1]
        assert mark_arg == mark and kwargs == {}
        assert [m.model_dump() for m in history] == msgs[:len(history)]


def test_prune_delete_runs_copy_then_compact_read_back(tmp_path):
    mark = uuid.uuid4().hex[:8]
    path = tmp_path / "s.durkv"
    run_agent(path, mark, True, "async")
    before = readback(path, mark)
    with DurkvSaver.open(str(path)) as saver:
        inputs = model_inputs(saver.store)
        saver.copy_thread("t", "c")
        saver.store.prune(["t"], keep_last=2)
        records = saver.store.journal_length("t")
    # the shared bytes stay where they are until a compaction
    assert readback(path, mark, "c") == before
    with DurkvSaver.open(str(path)) as saver:
        assert model_inputs(saver.store) == inputs
        saver.store.compact()
        assert model_inputs(saver.store) == inputs
    assert readback(path, mark, "c") == before
    assert readback(path, mark)[0] == before[0][:2]
    # the copies share as the originals did: the checkpoints' items name the journal
    # records' copies, the journal's inputs the entries' copies
    forms = item_forms(path)
    assert forms["jref"] >= N - 2 and forms["placed"] >= N // 2 - 2, forms
    # the journal "c" shares with "t" is copied once, naming both (FORMAT.md 5a), and a deep
    # verify follows every reference (the copies' forward ones included)
    assert journal_copies(path) == {("c", "t"): records}
    assert durkv.log.verify(str(path), deep=True).ok
    # a run deleted, its journal compacted away: the checkpoints that shared it read on
    with DurkvSaver.open(str(path)) as saver:
        saver.store.delete_runs(["t", "c"])
        saver.store.compact()
        assert not saver.store.verify(deep=True).damage
    assert readback(path, mark, "c") == before
    assert item_forms(path) == {"jref": 0, "placed": 0}
    counts = markers(path, mark)
    assert counts and set(counts.values()) == {1}, counts


def test_compaction_keeps_the_messages_shared(tmp_path):
    """With nothing deleted, a compaction stores no message again: the copies name each
    other as the originals did (its sizes are in bench/test_bench_react.py)."""
    mark = uuid.uuid4().hex[:8]
    path = tmp_path / "s.durkv"
    run_agent(path, mark, True, "async")
    before, counts, forms = readback(path, mark), markers(path, mark), item_forms(path)
    with DurkvSaver.open(str(path)) as saver:
        inputs = model_inputs(saver.store)
        saver.store.compact()
        assert model_inputs(saver.store) == inputs
        assert not saver.store.verify(deep=True).damage
    assert readback(path, mark) == before
    assert markers(path, mark) == counts
    assert item_forms(path) == forms


def test_delete_runs_before_compaction_keeps_checkpoints_readable(tmp_path):
    mark = uuid.uuid4().hex[:8]
    path = tmp_path / "s.durkv"
    run_agent(path, mark, True, "sync")
    before = readback(path, mark)
    with DurkvSaver.open(str(path)) as saver:
        saver.store.delete_runs(["t"])
    assert readback(path, mark) == before
    with DurkvSaver.open(str(path)) as saver:
        saver.store.compact()
    assert readback(path, mark) == before


def test_a_resumed_agent_after_sigkill_reads_and_shares(tmp_path):
    """Killed inside the fourth tool call: the reopened store reads every checkpoint and
    every journaled input; the agent resumes and finishes as the plain one does."""
    mark = uuid.uuid4().hex[:8]
    path = tmp_path / "s.durkv"
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "from test_journal_shared import react, cfg, N\n"
            "from langchain_core.messages import HumanMessage\n"
            "from durkv.langgraph import DurkvSaver\n"
            f"saver = DurkvSaver.open({str(path)!r})\n"
            f"react(N, {mark!r}, True, kill_at=8).compile(checkpointer=saver).invoke("
            "{'messages': [HumanMessage(content='find it', id='h0')]}, cfg(), "
            "durability='async')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr.decode()[-2000:]
    with DurkvSaver.open(str(path)) as saver:
        assert len(model_inputs(saver.store)) == 4
        assert not any(isinstance(i, UnreadableInputs) for i in model_inputs(saver.store))
        g = react(N, mark, True).compile(checkpointer=saver)
        g.invoke(None, cfg(), durability="async")
        assert len(g.get_state(cfg()).values["messages"]) == N
    plain = tmp_path / "plain.durkv"
    run_agent(plain, mark, False, "async")
    assert readback(path, mark)[0][0] == readback(plain, mark)[0][0]


# -- the store's side, without LangGraph ----------------------------------------------------

class RawSerde:
    """A serde that stores bytes as themselves (so a test can choose an item's bytes);
    anything else (a checkpoint record) as msgpack, read back as its bytes."""

    def dumps(self, v):
        return v if type(v) is bytes else msgpack.packb(v)

    def loads(self, b):
        return bytes(b)


def _put(s, cid: str, values: dict) -> None:
    s.put("t", "", cid, checkpoint={"id": cid}, metadata={}, values=values,
          versions={ch: 1 for ch in values})


def _frames(s) -> list[tuple[int, bytes, list]]:
    """(lsn, head, entries) of every frame of the store's log."""
    s.flush()
    with SegmentLog.open(s.url, read_only=True) as log:
        return [(lsn, *decode_commit(p)) for lsn, p in log.scan()]


def test_an_item_that_begins_with_the_jref_magic_is_stored_as_itself(tmp_path):
    """The escape rule (FORMAT.md 5): such an item is compressed, in the C and the Python
    paths of put and put_writes, and reads back as the bytes given."""
    hostile = [JREF_MAGIC + b"\x91\x00", JREF_MAGIC, JREF_MAGIC + b"x" * 80]
    with durkv.open(str(tmp_path / "s.durkv"), serde=RawSerde()) as s:
        _put(s, "c1", {"ch": list(hostile)})
        s.put_writes("t", "", "c1", "task", [(0, "w", list(hostile))])
        # the Python path (a write that is a list, not a tuple)
        s.put_writes("t", "", "c1", "task2", [[0, "w", list(hostile)]])
        ck = s.get("t", "", "c1")
        assert ck.values["ch"] == hostile
        assert sorted(w.value for w in ck.writes) == [hostile, hostile]
        stored = [x for _l, _h, es in _frames(s) for e in es for x in e.items]
        assert not any(x[:4] == JREF_MAGIC for x in stored)


def test_a_pending_write_names_a_journal_result_by_its_bytes(tmp_path):
    r = b"R" * 100
    with durkv.open(str(tmp_path / "s.durkv"), serde=RawSerde()) as s:
        _put(s, "c1", {})
        # results are remembered once the handle has stored a pending write (a saver's)
        s.put_writes("t", "", "c1", "input", [(0, "w", b"in")])
        lsn = s.append_journal("run", {"e": 2, "t": 1.0, "s": "0", "r": r})
        s.put_writes("t", "", "c1", "task", [(0, "w", [r, b"<" + r + b">", b"small"])])
        items = [e.items for _l, _h, es in _frames(s) for e in es][-1]
        assert items == [pack_jref(lsn), pack_jref(lsn, 0, 100, b"<", b">"), b"small"]
        want = {"input": b"in", "task": [r, b"<" + r + b">", b"small"]}
        assert {w.task_id: w.value for w in s.get("t", "", "c1").writes} == want
    with durkv.open(str(tmp_path / "s.durkv"), serde=RawSerde()) as s:
        assert {w.task_id: w.value for w in s.get("t", "", "c1").writes} == want


def test_a_jref_that_names_no_journal_result_is_corruption(tmp_path):
    with durkv.open(str(tmp_path / "s.durkv"), serde=RawSerde()) as s:
        _put(s, "c0", {"ch": [b"x"]})
        codec = s._reads.codec
        with pytest.raises(CorruptionError) as e:
            codec.unpack(pack_jref(0))          # a checkpoint frame, not a journal record
        assert e.value.kind == "bad_record" and "frame 0" in str(e.value)
        lsn = s.append_journal("run", {"e": 2, "t": 1.0, "s": "0", "r": b"abc"})
        with pytest.raises(CorruptionError, match="has 3"):
            codec.unpack(pack_jref(lsn, 0, 9, b"", b""))
        with pytest.raises(CorruptionError):
            codec.unpack(JREF_MAGIC + b"\xc1")
        assert codec.unpack(pack_jref(lsn, 1, 3, b"<", b">")) == b"<bc>"


def test_results_over_256_kib_are_not_remembered(tmp_path):
    """The writer's memories hold results and items of 64 bytes to 256 KiB (at most ~20
    MiB): a larger reply is stored whole in both places, and reads back."""
    small, big = b"S" * (256 << 10), b"B" * ((256 << 10) + 1)
    with durkv.open(str(tmp_path / "s.durkv"), serde=RawSerde()) as s:
        _put(s, "c1", {})
        s.put_writes("t", "", "c1", "input", [(0, "w", b"in")])
        s.append_journal("run", {"e": 2, "t": 1.0, "s": "0", "r": small})
        s.append_journal("run", {"e": 2, "t": 1.0, "s": "1", "r": big})
        s.put_writes("t", "", "c1", "task", [(0, "w", [small, big])])
        items = [e.items for _l, _h, es in _frames(s) for e in es][-1]
        assert items[0][:4] == JREF_MAGIC and items[1][:4] != JREF_MAGIC
        assert {w.task_id: w.value for w in s.get("t", "", "c1").writes}["task"] == [small, big]


def test_an_async_agent_shares_as_the_sync_one(tmp_path):
    """The same agent with async nodes (``astep``/``atool``, ``ainvoke``) stores each
    message once and reads back as the plain agent's."""
    import asyncio

    from durkv.langgraph import astep, atool

    mark = uuid.uuid4().hex[:8]

    async def amodel(mark: str, messages: list) -> AIMessage:
        await asyncio.sleep(0)
        return model(mark, messages)

    async def agent(state):
        return {"messages": [await astep("model", amodel, mark, state["messages"])]}

    async def tools(state):
        call = state["messages"][-1].tool_calls[0]
        return {"messages": [tool_message(call, await atool(lookup, **call["args"]))]}

    g = loop(agent, tools, N)
    path, plain = tmp_path / "s.durkv", tmp_path / "plain.durkv"

    async def main() -> None:
        async with DurkvSaver.open(str(path)) as saver:
            await g.compile(checkpointer=saver).ainvoke(
                {"messages": [HumanMessage(content="find it", id="h0")]}, cfg(),
                durability="async")

    asyncio.run(main())
    run_agent(plain, mark, False, "async")
    assert markers(path, mark) == markers(plain, mark)
    assert item_forms(path)["jref"] >= N - 2
    assert readback(path, mark) == readback(plain, mark)


def test_sigkill_during_compaction_of_shared_messages_loses_nothing(tmp_path):
    """`durkv compact` of the agent's store (and of a copy of its thread, whose journal it
    copies once for both) SIGKILLed at random moments: the copies name copies written after
    them, and without the durable END none of them counts -- every state and journaled
    input reads as before, and a last compaction completes."""
    import random
    import time

    from test_cli_maint import _kill_inside_compaction

    mark = uuid.uuid4().hex[:8]
    path = tmp_path / "s.durkv"
    probe = tmp_path / "probe.durkv"
    for p in (path, probe):
        run_agent(p, mark, True, "async", n=60)
        with DurkvSaver.open(str(p)) as saver:
            saver.copy_thread("t", "c")
    def state(saver) -> tuple:
        return (readback(path, mark), readback(path, mark, "c"), model_inputs(saver.store),
                model_inputs(saver.store, "c"))

    with DurkvSaver.open(str(path)) as saver:
        expect = state(saver)
    with DurkvSaver.open(str(probe)) as saver:
        t0 = time.monotonic()
        saver.store.compact()
        span = time.monotonic() - t0
    rnd = random.Random(20)
    landed = 0
    for _ in range(6):
        landed += _kill_inside_compaction(path, rnd.uniform(0.0, span))
        with DurkvSaver.open(str(path)) as saver:
            assert state(saver) == expect
            # deep: every jref and ir place resolves; an abandoned compaction's dead copies
            # (whose references name LSNs the log reused) are not read
            assert not saver.store.verify(deep=True).damage
    assert landed >= 1, "no kill landed inside a compaction: nothing proved"
    with DurkvSaver.open(str(path)) as saver:
        saver.store.compact()
        assert state(saver) == expect
    assert set(journal_copies(path)) == {("c", "t")}


def _toolnode_agent(path: Path, mark: str, durable: bool) -> list:
    """LangGraph's ToolNode running six tool calls of one AIMessage in parallel threads,
    one of them failing once (the whole node is retried by a RetryPolicy); returns the
    final messages as data."""
    from langchain_core.tools import tool as lc_tool
    from langgraph.prebuilt import ToolNode
    from langgraph.types import RetryPolicy

    failed: list[int] = []

    @durkv.tool(name="fetch", version="1")
    def fetch(i: int, *, idempotency_key: str | None = None) -> str:
        if i == 4 and not failed:
            failed.append(i)
            raise ConnectionError("flaky")
        return f"TOOL-{mark}-{i:04d}-END {_PAD}"

    @lc_tool
    def get(i: int) -> str:
        """Fetch item i."""
        return tool(fetch, i) if durable else fetch(i)

    def agent(state):
        if len(state["messages"]) > 1:
            return {"messages": []}
        calls = [{"name": "get", "args": {"i": i}, "id": f"get_{i}"} for i in range(6)]
        return {"messages": [AIMessage(content=f"REPLY-{mark}-0000-END", tool_calls=calls,
                                       id="ai-0")]}

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([get]), retry_policy=RetryPolicy(
        max_attempts=3, initial_interval=0.01, retry_on=ConnectionError))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "tools" if len(s["messages"]) < 3 else END)
    g.add_edge("tools", "agent")
    with DurkvSaver.open(str(path)) as saver:
        out = g.compile(checkpointer=saver).invoke(
            {"messages": [HumanMessage(content="find it", id="h0")]}, cfg(),
            durability="async")
    return [m.model_dump() for m in out["messages"]]


def test_prebuilt_toolnode_with_parallel_calls_and_a_retry(tmp_path):
    """Six ToolMessages of one parallel ToolNode superstep, each holding one of the six
    results the journal just took (one call retried by a RetryPolicy): each names its
    result, so the durable agent stores every result once, and its thread reads back as
    the plain agent's."""
    mark = uuid.uuid4().hex[:8]
    durable, plain = tmp_path / "durable.durkv", tmp_path / "plain.durkv"
    def no_ids(msgs: list) -> list:     # the ToolNode gives each ToolMessage a new uuid
        return [{k: v for k, v in m.items() if k != "id"} for m in msgs]

    msgs = _toolnode_agent(durable, mark, True)
    assert no_ids(msgs) == no_ids(_toolnode_agent(plain, mark, False))
    assert [m["content"] for m in msgs if m["type"] == "tool"] == [
        f"TOOL-{mark}-{i:04d}-END {_PAD}" for i in range(6)]
    # every result once, in the journal; the plain agent's store holds each once, or twice
    # when it was given two values: LangGraph's add_messages gives an id-less message its
    # id in place, on the loop thread, and the async executor may have serialized the
    # ToolNode's pending write before that (id None); the checkpoint holds it with its id.
    # A checkpoint refers to a pending write's entry whole (FORMAT.md 5, F_REFS), so one
    # message of the write serialized without its id stores the write's every message twice
    got, base = markers(durable, mark), markers(plain, mark)
    assert set(got) == set(base) and all(got[m] <= base[m] for m in got), (got, base)
    write_of = {m.content.split(" ")[0]: [x.id for x in v] for ws in readback(plain, mark)[1]
                for ch, v in ws if ch == "messages" for m in v if isinstance(m, ToolMessage)}
    assert all(None in write_of[m] for m, c in base.items() if m.startswith("TOOL") and c > 1)
    assert all(c == 1 for m, c in got.items() if m.startswith("TOOL")), got
    assert item_forms(durable)["jref"] >= 6
    hist = [no_ids(h) for h, _next in readback(durable, mark)[0]]
    assert hist == [no_ids(h) for h, _next in readback(plain, mark)[0]]
    assert hist[0] == no_ids(msgs)
