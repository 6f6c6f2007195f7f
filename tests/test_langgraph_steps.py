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
        effects.append(idempotency_key)
        return x

    async def node(state):
        from durkv.langgraph import atool
        x, y = await asyncio.gather(atool(a, 1), atool(a, 2))
        return {"log": [x, y]}

    with DurkvSaver.open(str(tmp_path / "lg.durkv")) as saver:
        cfg = {"configurable": {"thread_id": "th-3"}}
        out = asyncio.run(_graph(saver, node).ainvoke({"log": []}, cfg))
        assert out["log"] == [1, 2]
        assert [k.rsplit(":", 1)[1] for k in effects] == ["0", "1"]
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
