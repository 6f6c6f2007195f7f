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
