"""durkv.langgraph.step / tool inside LangGraph nodes: keyed by LangGraph's task id."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated

import pytest
from typing_extensions import TypedDict

pytest.importorskip("langgraph")

from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

import durkv  # noqa: E402
from durkv.langgraph import DurkvSaver  # noqa: E402
from durkv.langgraph import step as lg_step  # noqa: E402
from durkv.langgraph import tool as lg_tool  # noqa: E402


class State(TypedDict):
    log: Annotated[list, operator.add]


def _graph(saver, node):
    g = StateGraph(State)
    g.add_node("act", node)
    g.add_edge(START, "act")
    g.add_edge("act", END)
    return g.compile(checkpointer=saver)


def test_a_node_rerun_after_a_crash_does_not_call_the_tool_again(tmp_path):
    effects, models = [], []
    crash = {"armed": True}

    @durkv.tool(name="charge")
    def charge(amount, *, idempotency_key):
        effects.append(idempotency_key)
        return {"charged": amount}

    def node(state):
        plan = lg_step("plan", lambda: models.append(1) or "plan-A")
        r = lg_tool(charge, 10)
        if crash["armed"]:        # the process dies after the receipt, before the node ends
            crash["armed"] = False
            raise RuntimeError("crash")
        return {"log": [plan, r["charged"]]}

    path = str(tmp_path / "lg.durkv")
    cfg = {"configurable": {"thread_id": "th-1"}}
    with DurkvSaver.open(path) as saver:
        with pytest.raises(RuntimeError):
            _graph(saver, node).invoke({"log": []}, cfg)
    with DurkvSaver.open(path) as saver:      # a new process: the node runs again
        out = _graph(saver, node).invoke(None, cfg)
        assert out["log"] == ["plan-A", 10]
        assert len(effects) == 1 and effects[0].startswith("th-1:") and len(models) == 1
        j = durkv.Run(saver.store, "th-1").journal()
        assert [e.planned_action for e in j] == ["plan", "charge"]
        assert j[1].idempotency_key == effects[0]


def test_interrupt_then_tool_happens_once(tmp_path):
    effects = []

    @durkv.tool(name="send")
    def send(to, *, idempotency_key):
        effects.append(idempotency_key)
        return "ok"

    def node(state):
        draft = lg_step("draft", lambda: "hello")
        if interrupt({"draft": draft}) != "yes":
            return {"log": ["rejected"]}
        return {"log": [lg_tool(send, "a@b")]}

    path = str(tmp_path / "lg.durkv")
    cfg = {"configurable": {"thread_id": "th-2"}}
    with DurkvSaver.open(path) as saver:
        out = _graph(saver, node).invoke({"log": []}, cfg)
        assert "__interrupt__" in out
    with DurkvSaver.open(path) as saver:
        g = _graph(saver, node)
        assert g.invoke(Command(resume="yes"), cfg)["log"] == ["ok"]
        g.invoke(None, cfg)
    assert len(effects) == 1


def test_async_node_and_errors(tmp_path):
    effects = []

    @durkv.tool(name="a")
    async def a(x, *, idempotency_key):
        effects.append((idempotency_key, x))
        return x

    async def node(state):
        from durkv.langgraph import atool
        x, y = await asyncio.gather(atool(a, 1), atool(a, 2))
        return {"log": [x, y]}

    with DurkvSaver.open(str(tmp_path / "lg.durkv")) as saver:
        cfg = {"configurable": {"thread_id": "th-3"}}
        out = asyncio.run(_graph(saver, node).ainvoke({"log": []}, cfg))
        assert out["log"] == [1, 2]
        # ids are claimed in the order of the calls; the calls themselves run concurrently
        assert sorted((k.rsplit(":", 1)[1], x) for k, x in effects) == [("0", 1), ("1", 2)]
    with pytest.raises(durkv.ConfigError, match="inside a LangGraph node"):
        lg_tool(a, 1)


def test_a_tool_waits_for_its_tasks_checkpoint_under_async(tmp_path):
    """Under durability="async" LangGraph saves a checkpoint in the background while the
    tasks it names (their ids derive from it) already run. A process SIGKILLed after a
    tool's receipt but before that checkpoint was saved used to re-run the node under a
    new task id, so the tool ran again: the email sent twice. The tool now waits for its
    task's checkpoint before its intent is journaled."""
    import subprocess
    import sys
    from pathlib import Path

    child = Path(__file__).with_name("lg_async_window_child.py")
    store, work = str(tmp_path / "lg.durkv"), tmp_path / "work"
    work.mkdir()
    killed = subprocess.run([sys.executable, str(child), store, str(work), "slow"],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert len((work / "effects").read_text().split()) == 1    # sent once, then killed
    done = subprocess.run([sys.executable, str(child), store, str(work), "fast"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['sent to a@b', 'done']"
    assert len((work / "effects").read_text().split()) == 1, "the tool ran again"


def test_async_node_tools_wait_for_their_checkpoint_and_exit_mode_does_not(tmp_path):
    """The same wait for async nodes (``atool``/``astep`` poll, so that a lagging
    ``aput`` on the same event loop runs meanwhile); under durability="exit" LangGraph
    saves no checkpoint before the graph stops, so nothing is waited for."""
    seen = []

    class LaggingSaver(DurkvSaver):
        async def aput(self, *args, **kwargs):
            await asyncio.sleep(0.2)
            return await super().aput(*args, **kwargs)

    @durkv.tool(name="send")
    async def send(x, *, idempotency_key):
        return x

    async def node(state, config):
        from durkv.langgraph import astep, atool
        cid = config["configurable"]["checkpoint_map"][""]
        x = await astep("draft", lambda: "d")
        y = await atool(send, 1)
        seen.append(saver.store.has_checkpoint("th-4", "", cid))
        return {"log": [x, y]}

    with LaggingSaver.open(str(tmp_path / "lg.durkv")) as saver:
        g = _graph(saver, node)
        out = asyncio.run(g.ainvoke({"log": []}, {"configurable": {"thread_id": "th-4"}},
                                    durability="async"))
        assert out["log"] == ["d", 1] and seen == [True]
        out = asyncio.run(g.ainvoke({"log": []}, {"configurable": {"thread_id": "th-5"}},
                                    durability="exit"))
        assert out["log"] == ["d", 1]


# ---- issue 15: the state of a task lives as long as the task -------------------------------

class Fan(TypedDict):
    n: int
    done: Annotated[list, operator.add]


def test_a_send_fan_out_of_4500_async_workers_keeps_every_tasks_call_index():
    """The per-task call index lived in an LRU of 4,096 task ids: with 4,500 workers in
    flight the second call of an evicted worker got index 0 again and silently returned
    the first call's receipt (4,500 effects instead of 9,000). It now lives with the task."""
    from langgraph.types import Send

    effects = []

    @durkv.tool(name="touch")
    def touch(i, *, idempotency_key):
        effects.append((idempotency_key, i))
        return idempotency_key

    async def worker(state):         # the same call twice: two effects, by two keys
        first = lg_tool(touch, state["n"])
        await asyncio.sleep(0)          # every worker makes its first call before any second
        second = lg_tool(touch, state["n"])
        return {"done": [first != second]}

    g = StateGraph(Fan)
    g.add_node("worker", worker)
    g.add_conditional_edges(START, lambda s: [Send("worker", {"n": i}) for i in range(4500)])
    g.add_edge("worker", END)
    with DurkvSaver.open("memory://") as saver:
        out = asyncio.run(g.compile(checkpointer=saver).ainvoke(
            {"n": 0, "done": []}, {"configurable": {"thread_id": "fan"}}, durability="exit"))
    assert len(effects) == 9000                 # main: 4,500 (second calls replayed)
    assert len({k for k, _ in effects}) == 9000
    assert sorted(i for _, i in effects) == sorted(list(range(4500)) * 2)
    assert len(out["done"]) == 4500 and all(out["done"])


# ---- issue 15: a new attempt of a node calls a failed step or tool again, same key ----------

def _flaky(fail_times: int, exc: type = ConnectionError):
    calls = []

    @durkv.tool(name="charge")
    def charge(amount, *, idempotency_key):
        calls.append(idempotency_key)
        if len(calls) <= fail_times:
            raise exc(f"service down ({len(calls)})")
        return {"charged": amount}

    return charge, calls


def test_a_langgraph_retry_policy_calls_a_failed_tool_again_with_the_same_key(tmp_path):
    """The recorded failure was replayed to every retry: RetryPolicy(max_attempts=3)
    failed all three attempts after one call. A retry is a new attempt: the recorded
    success before it is returned, the failed tool and step are called again."""
    from langgraph.types import RetryPolicy

    charge, calls = _flaky(1)
    sent, models = [], []

    @durkv.tool(name="send")
    def send(to, *, idempotency_key):
        sent.append(idempotency_key)
        return "sent"

    def model():
        models.append(1)
        if len(models) == 1:
            raise TimeoutError("model timed out")
        return "plan"

    def node(state):
        a = lg_tool(send, "a@b")              # succeeds in attempt 1: never called again
        p = lg_step("plan", model)            # fails in attempt 1
        r = lg_tool(charge, 10)               # fails in attempt 2
        return {"log": [a, p, r["charged"]]}

    g = StateGraph(State)
    g.add_node("act", node, retry_policy=RetryPolicy(
        max_attempts=3, initial_interval=0.001, jitter=False,
        retry_on=(ConnectionError, TimeoutError)))
    g.add_edge(START, "act")
    g.add_edge("act", END)
    with DurkvSaver.open(str(tmp_path / "lg.durkv")) as saver:
        out = g.compile(checkpointer=saver).invoke({"log": []},
                                                   {"configurable": {"thread_id": "r1"}})
        assert out["log"] == ["sent", "plan", 10]
        assert len(sent) == 1 and len(models) == 2
        assert len(calls) == 2 and calls[0] == calls[1], calls    # the same logical call
        j = [e for e in durkv.Run(saver.store, "r1").journal() if e.planned_action == "charge"]
        assert [e.idempotency_key for e in j] == calls


def test_invoke_none_after_a_failed_tool_calls_it_again_with_the_same_key(tmp_path):
    """Re-invoking a thread whose node failed in a durkv tool raised the recorded error
    forever: the thread was stuck. A new execution calls the failed tool again."""
    charge, calls = _flaky(2, ValueError)
    cfg = {"configurable": {"thread_id": "r2"}}
    path = str(tmp_path / "lg.durkv")

    def node(state):
        return {"log": [lg_tool(charge, 5)["charged"]]}

    with DurkvSaver.open(path) as saver:
        graph = _graph(saver, node)
        with pytest.raises(ValueError, match=r"service down \(1\)"):
            graph.invoke({"log": []}, cfg)
    with DurkvSaver.open(path) as saver:         # another process resumes it
        graph = _graph(saver, node)
        with pytest.raises(ValueError, match=r"service down \(2\)"):
            graph.invoke(None, cfg)
        assert graph.invoke(None, cfg)["log"] == [5]
        assert graph.invoke(None, cfg)["log"] == [5]     # finished: nothing is called
    assert len(calls) == 3 and len(set(calls)) == 1, calls


# ---- issue 15: calls from several threads of one task need key= ----------------------------

def test_keyless_calls_from_a_second_thread_of_a_task_are_refused_before_the_call(tmp_path):
    """Automatic ids follow the order of the calls, which threads do not keep: a keyless
    call from another thread of the same task is a ConfigError before anything is called
    or journaled; with key= the same calls go through."""
    from concurrent.futures import ThreadPoolExecutor

    effects = []

    @durkv.tool(name="send")
    def send(to, *, idempotency_key):
        effects.append((to, idempotency_key))
        return to

    def node(state, config):
        first = lg_tool(send, "a")                       # the node's own thread
        with ThreadPoolExecutor(2) as pool:
            if state["log"] == ["keyed"]:
                more = list(pool.map(lambda to: lg_tool(send, to, config=config, key=to),
                                     ["b", "c"]))
            else:
                more = [pool.submit(lg_tool, send, "b", config=config).result()]
        return {"log": [first, *more]}

    with DurkvSaver.open(str(tmp_path / "lg.durkv")) as saver:
        graph = _graph(saver, node)
        with pytest.raises(durkv.ConfigError, match="two threads of one LangGraph task.*key="):
            graph.invoke({"log": []}, {"configurable": {"thread_id": "t-threads"}})
        assert [to for to, _ in effects] == ["a"]        # "b" was never called ...
        j = durkv.Run(saver.store, "t-threads").journal()
        assert [e.planned_action for e in j] == ["send"]  # ... nor journaled
        out = graph.invoke({"log": ["keyed"]}, {"configurable": {"thread_id": "t-keyed"}})
        assert out["log"] == ["keyed", "a", "b", "c"]


# ---- issue 15 items 18 and 21: the Run cache, int thread ids --------------------------------

def test_an_int_thread_id_works_for_steps_and_tools_as_for_the_saver(tmp_path):
    """DurkvSaver stores thread_id=7 as "7"; durkv.langgraph.step/tool raised ConfigError
    for it (and for 0). They now use the same thread (and run) id."""
    effects = []

    @durkv.tool(name="send")
    def send(to, *, idempotency_key):
        effects.append(idempotency_key)
        return to

    def node(state):
        return {"log": [lg_step("draft", lambda: "d"), lg_tool(send, "a@b")]}

    with DurkvSaver.open(str(tmp_path / "lg.durkv")) as saver:
        graph = _graph(saver, node)
        for tid in (7, 0):
            assert graph.invoke({"log": []}, {"configurable": {"thread_id": tid}})["log"] == [
                "d", "a@b"]
            assert saver.get_tuple({"configurable": {"thread_id": str(tid)}}) is not None
            assert [e.planned_action for e in durkv.Run(saver.store, str(tid)).journal()] == [
                "draft", "send"]
    assert [k.split(":")[0] for k in effects] == ["7", "0"]


def _runs_alive(store) -> int:
    import gc

    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, durkv.Run) and o.store is store)


def test_the_run_cache_holds_what_is_in_use_not_every_thread_ever_seen():
    """One Run per thread id was cached for the store's lifetime: 3,001 after 3,000
    threads were finished and deleted. A deleted thread's Run goes at once; an idle
    thread's stays only among the last few used (it is rebuilt from the store)."""
    @durkv.tool(name="send")
    def send(to, *, idempotency_key):
        return to

    async def node(state):            # async: no thread pool per invoke (twice as fast)
        return {"log": [lg_tool(send, "a@b")]}

    async def invoke_all(graph, prefix, n, delete):
        for i in range(n):
            await graph.ainvoke({"log": []}, {"configurable": {"thread_id": f"{prefix}-{i}"}})
            if delete:
                saver.delete_thread(f"{prefix}-{i}")

    with DurkvSaver.open("memory://", durability="exit") as saver:
        graph = _graph(saver, node)
        asyncio.run(invoke_all(graph, "d", 3000, delete=True))
        assert _runs_alive(saver.store) == 0
        asyncio.run(invoke_all(graph, "k", 300, delete=False))
        assert _runs_alive(saver.store) <= 64
        out = asyncio.run(graph.ainvoke({"log": []}, {"configurable": {"thread_id": "k-0"}}))
        assert out["log"] == ["a@b", "a@b"]     # a dropped Run is rebuilt from its journal


def test_async_toolnode_tools_are_keyed_by_their_tool_call_id(tmp_path):
    """Under ainvoke the ToolNode gathers the tool calls as coroutines (an async tool) or
    runs them in executor threads (a sync tool): either way each call's id names its
    tool call, whatever order the calls reach durkv in."""
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import MessagesState
    from langgraph.prebuilt import ToolNode

    from durkv.langgraph import atool

    keys = []

    @durkv.tool(name="send")
    def send(to, *, idempotency_key):
        keys.append((to, idempotency_key))
        return to

    @lc_tool
    async def notify(i: int) -> str:
        """Notify recipient i (async)."""
        await asyncio.sleep(0.01 * (3 - i))          # the last call reaches durkv first
        return await atool(send, f"n{i}")

    @lc_tool
    def mail(i: int) -> str:
        """Mail recipient i (sync, in an executor thread)."""
        import time
        time.sleep(0.01 * (3 - i))
        return lg_tool(send, f"m{i}")

    def agent(state):
        calls = [{"name": name, "args": {"i": i}, "id": f"{name}_{i}"}
                 for name in ("notify", "mail") for i in range(3)]
        return {"messages": [AIMessage("", tool_calls=calls)]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([notify, mail]))
    g.add_edge(START, "agent")
    g.add_edge("agent", "tools")
    g.add_edge("tools", END)
    with DurkvSaver.open(str(tmp_path / "lg.durkv")) as saver:
        out = asyncio.run(g.compile(checkpointer=saver).ainvoke(
            {"messages": []}, {"configurable": {"thread_id": "tn"}}))
    assert sorted(m.content for m in out["messages"] if m.type == "tool") == sorted(
        f"{p}{i}" for p in "nm" for i in range(3))
    name = {"n": "notify", "m": "mail"}
    assert all(key.endswith(f":{name[to[0]]}_{to[1]}:0") for to, key in keys), keys


@pytest.mark.parametrize("key", ["0", "17", 5, ""])
def test_a_key_that_is_an_automatic_id_is_refused_before_the_call(tmp_path, key):
    """key="0" once named the node's first keyless call: the second, distinct call took
    its receipt and never happened."""
    sent = []

    @durkv.tool(name="send")
    def send(to, *, idempotency_key):
        sent.append(idempotency_key)
        return f"sent to {to}"

    def node(state):
        a = lg_tool(send, "alice", key=key)
        b = lg_tool(send, "alice")
        return {"log": [a, b]}

    with DurkvSaver.open(str(tmp_path / "lg.durkv")) as saver:
        with pytest.raises(durkv.ConfigError, match="key="):
            _graph(saver, node).invoke({"log": []}, {"configurable": {"thread_id": "k"}})
    assert sent == []


def _tool_node_run(tmp_path, mail, calls, thread):
    """A model turn asking for tool ``mail`` once per ``(i, tool_call_id)`` of ``calls``,
    then LangGraph's ToolNode (tool errors as messages) on DurkvSaver: the final state."""
    from langchain_core.messages import AIMessage
    from langgraph.graph import MessagesState
    from langgraph.prebuilt import ToolNode

    def agent(state):
        return {"messages": [AIMessage("", tool_calls=[
            {"name": "mail", "args": {"i": i}, "id": cid} for i, cid in calls])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([mail], handle_tool_errors=lambda e: f"error: {e}"))
    g.add_edge(START, "agent")
    g.add_edge("agent", "tools")
    g.add_edge("tools", END)
    with DurkvSaver.open(str(tmp_path / "lg.durkv")) as saver:
        return g.compile(checkpointer=saver).invoke({"messages": []},
                                                    {"configurable": {"thread_id": thread}})


def test_a_key_naming_a_tool_calls_automatic_id_is_refused_and_a_natural_key_works(tmp_path):
    from langchain_core.tools import tool as lc_tool

    sent = []

    @durkv.tool(name="send")
    def send(to, *, idempotency_key):
        sent.append(idempotency_key)
        return to

    @lc_tool
    def mail(i: int) -> str:
        """Mail recipient i."""
        first = lg_tool(send, f"m{i}", key=f"order:{i}")        # a natural key: fine
        return first + lg_tool(send, "again", key="call_7:0" if i == 7 else f"x{i}")

    out = _tool_node_run(tmp_path, mail, [(1, "call_1"), (7, "call_7")], "tn")
    got = {m.tool_call_id: m.content for m in out["messages"] if m.type == "tool"}
    assert got["call_1"] == "m1again"
    assert "automatic id of a keyless call of tool call 'call_7'" in got["call_7"]
    # m1, again (call_1), m7: the refused call never ran
    assert sorted(k.split(":", 2)[-1] for k in sent) == ["order:1", "order:7", "x1"], sent


def test_tool_calls_sharing_one_id_are_named_as_the_cause(tmp_path):
    # some providers repeat a tool-call id ("call_0" for each call) or leave it out: the
    # ToolNode's parallel calls then share one scope, refused as "two threads" without
    # naming the repeated id, the one thing to fix
    import threading

    from langchain_core.tools import tool as lc_tool

    together = threading.Barrier(2, timeout=10)

    @durkv.tool(name="send")
    def send(to, *, idempotency_key):
        return to

    @lc_tool
    def mail(i: int) -> str:
        """Mail recipient i."""
        together.wait()             # both calls in flight at once, on two threads
        return lg_tool(send, f"m{i}")

    out = _tool_node_run(tmp_path, mail, [(1, "call_0"), (2, "call_0")], "dup")
    errors = [m.content for m in out["messages"] if m.type == "tool" and "error" in m.content]
    assert len(errors) == 1 and "tool call 'call_0'" in errors[0]
    assert "same id" in errors[0]
