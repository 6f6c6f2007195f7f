"""DurkvSaver under real LangGraph graphs (plain Python nodes, no LLMs).

Each scenario runs on ``memory://`` and on a local store in tmp_path; the
local runs reopen the store (a new saver) between steps to prove the state
comes back from disk. Where LangGraph's own ``InMemorySaver`` is a reference,
the same scenario runs on both and the states must agree.
"""

from __future__ import annotations

import asyncio
import operator
import os
from typing import Annotated

import pytest
from typing_extensions import TypedDict


from langgraph.channels import DeltaChannel  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command, Send, interrupt  # noqa: E402

from durkv import ConfigError  # noqa: E402
from durkv.langgraph import DurkvSaver  # noqa: E402


@pytest.fixture(params=["memory", "local"])
def url(request, tmp_path):
    """A store URL; "memory" stores die with the saver, so tests keep one open."""
    return "memory://" if request.param == "memory" else str(tmp_path / "lg.durkv")


class Reopener:
    """Hands out savers on one URL: the same one for memory://, a fresh one per call on disk."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.saver: DurkvSaver | None = None

    def __call__(self, **kw) -> DurkvSaver:
        if self.saver is not None and self.url != "memory://":
            self.saver.close()
            self.saver = None
        if self.saver is None:
            self.saver = DurkvSaver.open(self.url, **kw)
        return self.saver

    def close(self) -> None:
        if self.saver is not None:
            self.saver.close()
            self.saver = None


@pytest.fixture
def reopen(url):
    r = Reopener(url)
    yield r
    r.close()


def cfg(thread: str = "t1", **extra) -> dict:
    return {"configurable": {"thread_id": thread, **extra}}


# ---- graphs ------------------------------------------------------------------------------


class LoopState(TypedDict):
    n: int
    messages: Annotated[list, operator.add]


def loop_graph(limit: int):
    def step(s: LoopState) -> dict:
        return {"n": s["n"] + 1, "messages": [{"role": "ai", "n": s["n"], "text": "x" * 64}]}

    g = StateGraph(LoopState)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["n"] < limit else END)
    return g


class FanState(TypedDict):
    items: list[int]
    results: Annotated[list, operator.add]


def fan_graph():
    def plan(s: FanState) -> dict:
        return {}

    def work(arg: dict) -> dict:
        return {"results": [arg["x"] * 10]}

    def total(s: FanState) -> dict:
        return {"results": [sum(s["results"])]}

    g = StateGraph(FanState)
    g.add_node("plan", plan)
    g.add_node("work", work)
    g.add_node("total", total)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", lambda s: [Send("work", {"x": x}) for x in s["items"]], ["work"])
    g.add_edge("work", "total")
    g.add_edge("total", END)
    return g


class ApprovalState(TypedDict):
    request: str
    decision: str
    log: Annotated[list, operator.add]


def approval_graph():
    def ask(s: ApprovalState) -> dict:
        answer = interrupt({"question": f"approve {s['request']}?"})
        return {"decision": answer, "log": ["asked"]}

    def act(s: ApprovalState) -> dict:
        return {"log": [f"acted:{s['decision']}"]}

    g = StateGraph(ApprovalState)
    g.add_node("ask", ask)
    g.add_node("act", act)
    g.add_edge(START, "ask")
    g.add_edge("ask", "act")
    g.add_edge("act", END)
    return g


def subgraph_parent():
    class Inner(TypedDict):
        log: Annotated[list, operator.add]

    def inner_a(s: Inner) -> dict:
        return {"log": ["inner_a"]}

    def inner_b(s: Inner) -> dict:
        ok = interrupt("inner ok?")
        return {"log": [f"inner_b:{ok}"]}

    sub = StateGraph(Inner)
    sub.add_node("inner_a", inner_a)
    sub.add_node("inner_b", inner_b)
    sub.add_edge(START, "inner_a")
    sub.add_edge("inner_a", "inner_b")
    sub.add_edge("inner_b", END)

    def outer(s: Inner) -> dict:
        return {"log": ["outer"]}

    g = StateGraph(Inner)
    g.add_node("outer", outer)
    g.add_node("sub", sub.compile())
    g.add_edge(START, "outer")
    g.add_edge("outer", "sub")
    g.add_edge("sub", END)
    return g


def _extend(state: list, writes: list) -> list:
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


class DeltaState(TypedDict):
    n: int
    items: Annotated[list, DeltaChannel(_extend, snapshot_frequency=4)]


def delta_graph(limit: int, pause_at: int | None = None):
    def step(s: DeltaState) -> dict:
        if s["n"] == pause_at:
            interrupt("pause")
        return {"n": s["n"] + 1, "items": [f"item-{s['n']}"]}

    g = StateGraph(DeltaState)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["n"] < limit else END)
    return g


# ---- scenarios ---------------------------------------------------------------------------


def test_loop_resumes_after_reopen(reopen):
    graph = loop_graph(20).compile(checkpointer=reopen())
    out = graph.invoke({"n": 0, "messages": []}, cfg(), durability="sync")
    assert out["n"] == 20 and len(out["messages"]) == 20

    graph = loop_graph(30).compile(checkpointer=reopen())
    state = graph.get_state(cfg())
    assert state.values["n"] == 20
    assert [m["n"] for m in state.values["messages"]] == list(range(20))
    assert len(list(graph.get_state_history(cfg()))) == 22  # input + 21 loop checkpoints
    out = graph.invoke({"n": 20}, cfg())  # continue the same thread
    assert out["n"] == 30 and [m["n"] for m in out["messages"]] == list(range(30))


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_each_durability_mode_persists(reopen, mode):
    graph = loop_graph(5).compile(checkpointer=reopen())
    graph.invoke({"n": 0, "messages": []}, cfg(), durability=mode)
    graph = loop_graph(5).compile(checkpointer=reopen())
    assert graph.get_state(cfg()).values["n"] == 5


def test_parallel_send_matches_inmemory(reopen):
    inputs = {"items": [1, 2, 3, 4], "results": []}
    ref = fan_graph().compile(checkpointer=InMemorySaver()).invoke(inputs, cfg())
    graph = fan_graph().compile(checkpointer=reopen())
    out = graph.invoke(inputs, cfg(), durability="sync")
    assert out == ref
    assert sorted(out["results"][:4]) == [10, 20, 30, 40] and out["results"][4] == 100
    graph = fan_graph().compile(checkpointer=reopen())
    assert graph.get_state(cfg()).values == ref


def test_interrupt_and_resume_across_reopen(reopen):
    graph = approval_graph().compile(checkpointer=reopen())
    out = graph.invoke({"request": "deploy", "log": []}, cfg())
    assert out["__interrupt__"][0].value == {"question": "approve deploy?"}

    graph = approval_graph().compile(checkpointer=reopen())  # a new process would do this
    state = graph.get_state(cfg())
    assert state.next == ("ask",)
    assert state.tasks[0].interrupts[0].value == {"question": "approve deploy?"}
    out = graph.invoke(Command(resume="yes"), cfg())
    assert out["decision"] == "yes" and out["log"] == ["asked", "acted:yes"]


def test_subgraph_namespaces(reopen):
    graph = subgraph_parent().compile(checkpointer=reopen())
    out = graph.invoke({"log": []}, cfg())
    assert "__interrupt__" in out

    saver = reopen()
    graph = subgraph_parent().compile(checkpointer=saver)
    state = graph.get_state(cfg(), subgraphs=True)
    sub_state = state.tasks[0].state
    assert sub_state.values["log"] == ["outer", "inner_a"]
    ns = sub_state.config["configurable"]["checkpoint_ns"]
    assert ns.startswith("sub:")
    assert ns in saver.store.namespaces("t1")
    out = graph.invoke(Command(resume="fine"), cfg())
    # the subgraph returns its whole log, which the parent's reducer appends
    assert out["log"] == ["outer", "outer", "inner_a", "inner_b:fine"]


def test_time_travel_fork_and_replay(reopen):
    graph = loop_graph(6).compile(checkpointer=reopen())
    graph.invoke({"n": 0, "messages": []}, cfg())

    graph = loop_graph(6).compile(checkpointer=reopen())
    history = list(graph.get_state_history(cfg()))
    assert [h.values.get("n") for h in history] == [6, 5, 4, 3, 2, 1, 0, None]
    at3 = next(h for h in history if h.values.get("n") == 3)

    # replay from an old checkpoint: re-runs steps 3..6 on a new branch
    out = graph.invoke(None, at3.config)
    assert out["n"] == 6 and [m["n"] for m in out["messages"]] == list(range(6))

    # fork: edit the state at step 3 and continue from there
    forked = graph.update_state(at3.config, {"n": 4})
    out = graph.invoke(None, forked)
    assert out["n"] == 6 and [m["n"] for m in out["messages"]] == [0, 1, 2, 4, 5]

    graph = loop_graph(6).compile(checkpointer=reopen())
    assert graph.get_state(cfg()).values == out
    parent = graph.get_state(forked).parent_config
    assert parent["configurable"]["checkpoint_id"] == at3.config["configurable"]["checkpoint_id"]


def test_delta_channel_matches_inmemory(reopen):
    ref_saver = InMemorySaver()
    ref = delta_graph(11).compile(checkpointer=ref_saver)
    ref.invoke({"n": 0, "items": []}, cfg())
    ref_hist = [h.values for h in ref.get_state_history(cfg())]

    graph = delta_graph(11).compile(checkpointer=reopen())
    graph.invoke({"n": 0, "items": []}, cfg(), durability="sync")
    graph = delta_graph(11).compile(checkpointer=reopen())
    assert graph.get_state(cfg()).values == {"n": 11, "items": [f"item-{i}" for i in range(11)]}
    assert [h.values for h in graph.get_state_history(cfg())] == ref_hist

    # continue after reopen: the channel must rebuild from snapshot + writes
    graph = delta_graph(15).compile(checkpointer=reopen())
    out = graph.invoke({"n": 11}, cfg())
    assert out["items"] == [f"item-{i}" for i in range(15)]


def test_delta_channel_history_native_equals_base(reopen):
    from langgraph.checkpoint.base import BaseCheckpointSaver

    saver = reopen()
    graph = delta_graph(9).compile(checkpointer=saver)
    graph.invoke({"n": 0, "items": []}, cfg())
    for h in graph.get_state_history(cfg()):
        native = saver.get_delta_channel_history(config=h.config, channels=["items", "n"])
        base = BaseCheckpointSaver.get_delta_channel_history(saver, config=h.config,
                                                             channels=["items", "n"])
        assert native == base


def test_delta_channel_survives_prune(reopen):
    saver = reopen()
    graph = delta_graph(10).compile(checkpointer=saver)
    graph.invoke({"n": 0, "items": []}, cfg())
    before = graph.get_state(cfg()).values
    saver.prune(["t1"])
    graph = delta_graph(10).compile(checkpointer=reopen())
    assert graph.get_state(cfg()).values == before
    assert len(list(graph.get_state_history(cfg()))) < 12


def test_delta_channel_survives_prune_after_a_fork_and_a_copy(reopen):
    # after a fork (update_state of an older checkpoint) or a __copy__, the newest ids
    # are not the latest checkpoint's ancestors: keeping the newest N lost the seed
    saver = reopen()
    graph = delta_graph(10, pause_at=4).compile(checkpointer=saver)
    graph.invoke({"n": 0, "items": []}, cfg())             # pauses at n == 4
    main = graph.get_state(cfg()).config
    hist = list(graph.get_state_history(cfg()))
    graph.update_state(hist[2].config, {"n": 40})          # a side branch, newer ids
    graph.invoke(Command(resume="go"), main)               # the main branch goes on
    before = graph.get_state(cfg()).values
    assert before["items"] == [f"item-{i}" for i in range(10)]
    saver.prune(["t1"])
    graph = delta_graph(10, pause_at=4).compile(checkpointer=reopen())
    assert graph.get_state(cfg()).values == before
    # a copy of the latest checkpoint: its parent is the source's parent
    graph.update_state(graph.get_state(cfg()).config, None, as_node="__copy__")
    saver = reopen()
    saver.prune(["t1"])
    graph = delta_graph(10, pause_at=4).compile(checkpointer=reopen())
    assert graph.get_state(cfg()).values == before


def test_async_graph(reopen):
    saver = reopen()

    async def run():
        graph = loop_graph(8).compile(checkpointer=saver)
        out = await graph.ainvoke({"n": 0, "messages": []}, cfg("a"), durability="sync")
        state = await graph.aget_state(cfg("a"))
        hist = [h async for h in graph.aget_state_history(cfg("a"))]
        return out, state, hist

    out, state, hist = asyncio.run(run())
    assert out["n"] == 8 and state.values == out and len(hist) == 10


def test_operator_add_bytes_grow_linearly(tmp_path):
    """N supersteps appending ~1 KiB each cost O(N) bytes on disk, not O(N^2)."""
    payload = os.urandom(512).hex()  # ~1 KiB of text that compresses ~2:1 at best

    def step(s: LoopState) -> dict:
        return {"n": s["n"] + 1, "messages": [{"n": s["n"], "text": payload}]}

    sizes = {}
    for n in (100, 400):
        g = StateGraph(LoopState)
        g.add_node("step", step)
        g.add_edge(START, "step")
        g.add_conditional_edges("step", lambda s, n=n: "step" if s["n"] < n else END)
        path = tmp_path / f"lin{n}.durkv"
        with DurkvSaver.open(str(path)) as saver:
            g.compile(checkpointer=saver).invoke(
                {"n": 0, "messages": []}, {**cfg(), "recursion_limit": n + 10})
        sizes[n] = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    per_step_small, per_step_big = sizes[100] / 100, sizes[400] / 400
    assert per_step_big < per_step_small * 1.5, sizes  # quadratic growth would be ~4x
    assert per_step_big < 4096, sizes


def test_missing_thread_id_says_the_fix():
    with DurkvSaver.open("memory://") as saver:
        with pytest.raises(ConfigError, match="configurable.thread_id") as exc:
            saver.get_tuple({"configurable": {}})
        assert isinstance(exc.value, ValueError)
        graph = loop_graph(2).compile(checkpointer=saver)
        with pytest.raises(ValueError):
            graph.invoke({"n": 0, "messages": []}, {"configurable": {"checkpoint_ns": ""}})


def test_a_bad_thread_id_is_a_config_error_at_every_door(tmp_path):
    """A lone surrogate is refused before it names the thread's claim file (it escaped
    as a UnicodeEncodeError from graph.invoke); None is a missing thread id for
    copy_thread and delete_thread too (they stored and deleted a thread named 'None')."""
    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:
        graph = loop_graph(2).compile(checkpointer=saver)
        with pytest.raises(ConfigError, match="not valid Unicode"):
            graph.invoke({"n": 0, "messages": []}, {"configurable": {"thread_id": "t\ud800"}})
        graph.invoke({"n": 0, "messages": []}, {"configurable": {"thread_id": "x"}})
        for call in (lambda: saver.copy_thread("x", None), lambda: saver.copy_thread(None, "y"),
                     lambda: saver.delete_thread(None), lambda: saver.delete_thread("\ud800")):
            with pytest.raises(ConfigError):
                call()
        assert list(saver.store.threads()) == ["x"]


def test_pinned_durability_overrides_langgraph():
    with DurkvSaver.open("memory://", durability="sync") as saver:
        assert saver._policy({"__pregel_durability": "exit"}) == "sync"
    with DurkvSaver.open("memory://") as saver:
        assert saver._policy({}) == "async"
        assert saver._policy({"__pregel_durability": "sync"}) == "sync"
        assert saver._policy({"__pregel_durability": "exit"}) == "async"
    with pytest.raises(ConfigError):
        DurkvSaver.open("memory://", durability="fast")


def test_next_version_monotonic():
    with DurkvSaver.open("memory://") as saver:
        v = None
        seen = []
        for _ in range(5):
            v = saver.get_next_version(v, None)
            seen.append(v)
        assert seen == [1, 2, 3, 4, 5]
        s = saver.get_next_version("00000000000000000000000000000007.5", None)
        assert s > "00000000000000000000000000000007.9" and s.startswith("0" * 31 + "8")
        for bad in (float("inf"), float("nan"), "x.1", object()):
            with pytest.raises(ConfigError, match="channel version"):
                saver.get_next_version(bad, None)


def test_saver_on_an_open_store(tmp_path):
    import durkv
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from durkv.langgraph import LangGraphSerde

    with durkv.open("memory://") as plain:
        with pytest.raises(ConfigError, match="DurkvSaver.open"):
            DurkvSaver(plain)
    path = str(tmp_path / "own.durkv")
    with durkv.open(path, serde=LangGraphSerde(JsonPlusSerializer())) as store:
        graph = approval_graph().compile(checkpointer=DurkvSaver(store))
        graph.invoke({"request": "x", "log": []}, cfg())
    with durkv.open(path, serde=LangGraphSerde(JsonPlusSerializer())) as store:
        graph = approval_graph().compile(checkpointer=DurkvSaver(store, durability="sync"))
        assert graph.invoke(Command(resume="ok"), cfg())["log"] == ["asked", "acted:ok"]


def test_delta_channel_fork_matches_inmemory(reopen):
    """A fork's delta channel rebuilds from its own branch, not its siblings'."""

    def run(saver):
        graph = delta_graph(8).compile(checkpointer=saver)
        graph.invoke({"n": 0, "items": []}, cfg())
        at5 = next(h for h in graph.get_state_history(cfg()) if h.values.get("n") == 5)
        forked = graph.update_state(at5.config, {"items": ["forked"]})
        graph.invoke(None, forked)
        return [(h.values, h.next) for h in graph.get_state_history(cfg())]

    assert run(reopen()) == run(InMemorySaver())


def test_concurrent_graphs_on_one_saver(reopen):
    import threading

    saver = reopen()
    graph = loop_graph(15).compile(checkpointer=saver)
    errors = []

    def one(i):
        try:
            graph.invoke({"n": 0, "messages": []}, cfg(f"c{i}"), durability="sync" if i % 2 else "async")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    graph = loop_graph(15).compile(checkpointer=reopen())
    for i in range(6):
        assert [m["n"] for m in graph.get_state(cfg(f"c{i}")).values["messages"]] == list(range(15))


def test_writes_ride_on_the_next_checkpoint():
    with DurkvSaver.open("memory://") as saver:
        sync = {"__pregel_durability": "sync"}
        assert saver._writes_policy(sync, [("messages", 1)]) == "async"
        assert saver._writes_policy(sync, [("__interrupt__", 1)]) == "sync"
        assert saver._writes_policy({}, [("__interrupt__", 1)]) == "async"
    with DurkvSaver.open("memory://", durability="exit") as saver:
        assert saver._writes_policy({}, [("__interrupt__", 1)]) == "exit"


# ---- issue 7 A: a copied or forked checkpoint reads back its own values ------------------


def test_copy_fork_reads_back_the_copied_state(reopen):
    """``update_state(config, None, as_node="__copy__")`` saves the whole copy with an
    empty ``new_versions``: it must read back the copied values, not its parent's (a
    silent rewind of one step) nor the thread's newest (a copy of the root)."""
    graph = loop_graph(4).compile(checkpointer=reopen())
    graph.invoke({"n": 0, "messages": []}, cfg())
    history = list(graph.get_state_history(cfg()))
    assert history[-1].parent_config is None          # the root: copied with no parent
    forks = [(h, graph.update_state(h.config, None, as_node="__copy__")) for h in history]
    graph = loop_graph(4).compile(checkpointer=reopen())
    for h, fork in forks:
        got = graph.get_state(fork)
        assert (got.values, got.next) == (h.values, h.next), h.values

    # running a copy re-runs nothing: it goes on from the copied step, as on InMemorySaver
    def run_copy_of_n2(saver):
        g = loop_graph(4).compile(checkpointer=saver)
        g.invoke({"n": 0, "messages": []}, cfg("c"))
        at2 = next(h for h in g.get_state_history(cfg("c")) if h.values.get("n") == 2)
        out = g.invoke(None, g.update_state(at2.config, None, as_node="__copy__"))
        return out, [(h.values, h.next) for h in g.get_state_history(cfg("c"))]

    assert run_copy_of_n2(reopen()) == run_copy_of_n2(InMemorySaver())


def test_copy_fork_of_an_interrupt_asks_again(reopen):
    """A copy taken before an interrupt re-triggers it and resumes on its own branch."""
    graph = approval_graph().compile(checkpointer=reopen())
    graph.invoke({"request": "deploy", "log": []}, cfg())
    graph.invoke(Command(resume="yes"), cfg())
    before_ask = [s for s in graph.get_state_history(cfg()) if s.next == ("ask",)][-1]
    fork = graph.update_state(before_ask.config, None, as_node="__copy__")
    graph = approval_graph().compile(checkpointer=reopen())
    out = graph.invoke(None, fork)
    assert out["__interrupt__"][0].value == {"question": "approve deploy?"}
    out = graph.invoke(Command(resume="no"), fork)
    assert out["decision"] == "no" and out["log"] == ["asked", "acted:no"]


# ---- issue 7 item 1: get_state() output is the caller's, not the saver's -----------------


def test_editing_get_state_output_then_update_state(reopen):
    """LangGraph's human-in-the-loop edit: change a tool call in ``get_state()`` output,
    then ``update_state``. The objects the graph already handed out must not change, and
    the edit must be committed (it was gone after a reopen)."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import MessagesState

    def agent(s: MessagesState) -> dict:
        return {"messages": [AIMessage(content="", id="ai1", tool_calls=[
            {"id": "call1", "name": "search", "args": {"query": "query"}}])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    graph = g.compile(checkpointer=reopen())
    out = graph.invoke({"messages": [HumanMessage("hi", id="h1")]}, cfg())
    handed_out = out["messages"][-1]

    msg = graph.get_state(cfg()).values["messages"][-1]
    msg.tool_calls[0]["args"] = {"query": "a different query"}
    assert handed_out.tool_calls[0]["args"] == {"query": "query"}
    assert graph.get_state(cfg()).values["messages"][-1].tool_calls[0]["args"] == {
        "query": "query"}
    graph.update_state(cfg(), {"messages": [msg]})

    graph = g.compile(checkpointer=reopen())
    assert graph.get_state(cfg()).values["messages"][-1].tool_calls[0]["args"] == {
        "query": "a different query"}


# ---- issue 7 B: saver.serde = EncryptedSerializer(...) is honoured ------------------------


def _store_bytes(path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())


def test_assigned_encrypted_serde_encrypts_everything_stored(tmp_path):
    """LangGraph's documented way to turn on encryption is to assign ``saver.serde``;
    it was silently ignored (values and pending writes stayed plaintext)."""
    pytest.importorskip("Crypto")
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    key = b"0123456789abcdef"
    secret = "hunter2-top-secret"
    path = tmp_path / "enc.durkv"
    with DurkvSaver.open(str(path)) as saver:
        saver.serde = EncryptedSerializer.from_pycryptodome_aes(key=key)
        graph = approval_graph().compile(checkpointer=saver)
        out = graph.invoke({"request": secret, "log": [secret]}, cfg())
        assert out["__interrupt__"][0].value == {"question": f"approve {secret}?"}
        state = graph.get_state(cfg())
        saver.put_writes(state.config, [("log", [secret + "-write"])], "task-x")
    raw = _store_bytes(path)
    assert secret.encode() not in raw and b"hunter2" not in raw

    with DurkvSaver.open(str(path)) as saver:
        saver.serde = EncryptedSerializer.from_pycryptodome_aes(key=key)
        graph = approval_graph().compile(checkpointer=saver)
        tup = saver.get_tuple(cfg())
        assert ("task-x", "log", [secret + "-write"]) in tup.pending_writes
        out = graph.invoke(Command(resume="yes"), cfg())
        assert out["request"] == secret and out["log"][:2] == [secret, "asked"]
    with DurkvSaver.open("memory://") as saver:
        with pytest.raises(ConfigError, match="serializer"):
            saver.serde = object()


def test_the_langgraph_extra_declares_the_checkpoint_floor():
    """issue 7 C: with langgraph-checkpoint 4.2.0 the install succeeded and the import
    failed (writes_sort_key is new in 4.3.0): the extra must say so."""
    tomllib = pytest.importorskip("tomllib")
    from importlib.metadata import version
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    assert "langgraph-checkpoint>=4.3.0,<5" in extras["langgraph"]
    assert "langgraph>=1.2" in extras["langgraph"]      # DeltaChannel, the tested line
    assert "pycryptodome" in extras["dev"]          # the EncryptedSerializer test
    major, minor = (int(x) for x in version("langgraph-checkpoint").split(".")[:2])
    assert (major, minor) >= (4, 3)


def test_loads_many_equals_loads_item_by_item():
    """get() deserializes a list channel's items in one serializer call when it can."""
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from durkv.langgraph_serde import EMPTY, LangGraphSerde

    s = LangGraphSerde(JsonPlusSerializer())
    for values in ([], [1], [{"a": 1}, "x", None, b"raw", AIMessage("hi", id="m1")] * 7,
                   [{"n": i} for i in range(70000)], [1, EMPTY, 2], [b"x", bytearray(b"y")]):
        items = [s.dumps(v) for v in values]
        got = s.loads_many(items)
        assert got == [s.loads(b) for b in items] == values


# ---- issue 15 item 21: int thread ids, ":memory:", a read-only saver that follows ----------

def test_open_memory_like_sqlitesaver_makes_a_saver_in_memory(tmp_path, monkeypatch):
    """DurkvSaver.open(":memory:") (SqliteSaver's idiom) created a directory ":memory:"."""
    monkeypatch.chdir(tmp_path)
    with DurkvSaver.open(":memory:") as saver:
        assert saver.store.url.startswith("memory://")
        graph = loop_graph(3).compile(checkpointer=saver)
        assert graph.invoke({"n": 0, "messages": []}, cfg())["n"] == 3
        assert saver.get_tuple(cfg())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("segment_bytes", [64 << 20, 4096])
def test_a_read_only_saver_follows_a_writer_in_another_process(tmp_path, segment_bytes):
    """A read-only DurkvSaver showed the state as of its open until a private
    store.refresh(). Reads now catch up whenever the log grew (also across the writer's
    segment rolls: 4 KiB segments); a read that finds nothing new costs one stat."""
    import subprocess
    import sys
    from pathlib import Path

    path = str(tmp_path / "shared.durkv")
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("lg_writer_child.py")),
                              path, str(segment_bytes)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    conf = cfg("t")

    def writer_step(n):
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == f"DONE {n}"

    try:
        writer_step(0)
        with DurkvSaver.open(path, read_only=True) as reader:
            assert reader.get_tuple(conf).checkpoint["channel_values"]["log"] == [0]
            for n in range(1, 4):
                writer_step(n)
                assert reader.get_tuple(conf).checkpoint["channel_values"]["log"] == [
                    *range(n + 1)]
                assert len(list(reader.list(conf))) == 3 * (n + 1)
            refreshes = []
            real = reader.store.refresh
            reader.store.refresh = lambda: refreshes.append(1) or real()
            for _ in range(200):                        # nothing new: no refresh
                reader.get_tuple(conf)
            assert refreshes == []
            writer_step(4)
            assert reader.get_tuple(conf).checkpoint["channel_values"]["log"] == [*range(5)]
            assert refreshes == [1] or segment_bytes == 4096 and len(refreshes) <= 2
            reader.refresh()                            # the public verb
    finally:
        child.stdin.write("quit\n")
        child.stdin.close()
        child.wait(timeout=60)
    assert child.returncode == 0


def test_langgraphs_private_config_keys_are_spelled_as_langgraph_spells_them():
    """durkv reads LangGraph's private configurable keys, each spelled once
    (durkv.runtime.langgraph_steps); a LangGraph that renames one fails here, not
    silently in a user's graph (durability read as the default, tasks without ids)."""
    from langgraph._internal import _constants as c

    from durkv.runtime import langgraph_steps as lgs

    assert lgs.CONFIG_KEY_DURABILITY == c.CONFIG_KEY_DURABILITY
    for ours, theirs in (("_CHECKPOINTER", "CONFIG_KEY_CHECKPOINTER"),
                         ("_TASK_ID", "CONFIG_KEY_TASK_ID"), ("_RUNTIME", "CONFIG_KEY_RUNTIME"),
                         ("_SEND", "CONFIG_KEY_SEND"), ("_CHECKPOINT_MAP", "CONFIG_KEY_CHECKPOINT_MAP")):
        assert getattr(lgs, ours) == getattr(c, theirs), ours


def test_an_empty_checkpoint_id_means_the_latest_as_in_langgraphs_savers(reopen):
    saver = reopen()
    graph = loop_graph(3).compile(checkpointer=saver)
    graph.invoke({"n": 0, "messages": []}, cfg())
    empty = cfg(checkpoint_id="")
    latest = saver.get_tuple(cfg())
    assert saver.get_tuple(empty).checkpoint == latest.checkpoint
    assert graph.get_state(empty).values == graph.get_state(cfg()).values
    assert len(list(saver.list(empty))) == len(list(saver.list(cfg())))
    assert len(list(saver.list(cfg(), before=empty))) == len(list(saver.list(cfg())))
    out = loop_graph(5).compile(checkpointer=saver).invoke({"n": 3}, empty)
    assert out["n"] == 5


def test_sqlite_and_postgres_savers_constructor_idioms_work(tmp_path):
    async def async_idiom():
        async with DurkvSaver.from_conn_string(str(tmp_path / "b")) as saver:
            await saver.asetup()
            graph = loop_graph(2).compile(checkpointer=saver)
            return (await graph.ainvoke({"n": 0, "messages": []}, cfg()))["n"]

    with DurkvSaver.from_conn_string(str(tmp_path / "a")) as saver:
        saver.setup()
        graph = loop_graph(2).compile(checkpointer=saver)
        assert graph.invoke({"n": 0, "messages": []}, cfg())["n"] == 2
    assert asyncio.run(async_idiom()) == 2
    with DurkvSaver.from_conn_string(":memory:") as saver:
        assert saver.get_tuple(cfg()) is None


def test_a_store_a_saver_and_durkv_open_share_reads_and_deletes_runs_with_typed_errors(
        tmp_path):
    # a DurkvSaver thread and a plain run in one store: durkv.open's get of the thread was
    # a raw msgpack ExtraData, and delete_runs of any run failed through either handle
    import durkv

    path = str(tmp_path / "mixed")
    with DurkvSaver.open(path) as saver:
        loop_graph(2).compile(checkpointer=saver).invoke({"n": 0, "messages": []}, cfg("lg"))
    with durkv.open(path) as store:
        store.put("plain", "", "0001", checkpoint={}, metadata={"run_id": "r1"},
                  values={"v": 1}, versions={"v": 1})
        with pytest.raises(durkv.SerializationError, match="DurkvSaver.open"):
            store.get("lg")
        store.delete_runs(["r1"])
        assert store.get("plain") is None
    with DurkvSaver.open(path) as saver:
        saver.store.put("plain", "", "0002", checkpoint={}, metadata={"run_id": "r2"},
                        values={"v": 2}, versions={"v": 1})
        saver.delete_for_runs(["r2"])
        assert saver.get_tuple(cfg("lg")) is not None
