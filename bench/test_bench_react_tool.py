"""The ReAct agent of ``test_bench_react.py`` with only its tool durable (issue 20).

The model is called plainly and the tool through ``durkv.langgraph.tool``: this isolates
what a keyed tool's journal records cost per superstep, apart from what the model step
records about its input (measured by ``test_bench_react.py``). Under ``async`` a keyed
tool's intent and receipt wait for no fdatasync (docs/GUARANTEES.md 16.9); under ``sync``
they are fdatasync'd as every ``sync`` commit is. Rounds alternate plain and tool-only.

| group                  | measured                            | reported                  |
|------------------------|-------------------------------------|---------------------------|
| react-tool-{mode}-{N}  | supersteps/s of one graph.invoke    | tool-only vs plain        |
"""

from __future__ import annotations

import itertools
import time

import pytest
from benchlib import QUICK, record

pytest.importorskip("langgraph")

from langchain_core.messages import ToolMessage  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from test_bench_react import N, State, fake_model, invoke, lookup  # noqa: E402

from durkv.langgraph import DurkvSaver, tool  # noqa: E402

ROUNDS = 1 if QUICK else 5


def tool_graph(n: int, durable: bool):
    """``agent`` (a plain model call) and ``tools`` (durable or not) alternate."""
    def agent(state):
        return {"messages": [fake_model(state["messages"])]}

    def tools(state):
        call = state["messages"][-1].tool_calls[0]
        out = tool(lookup, **call["args"]) if durable else lookup(**call["args"])
        return {"messages": [ToolMessage(content=out, tool_call_id=call["id"],
                                         id=f"tool-{call['id']}")]}

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_node("tools", tools)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "tools" if len(s["messages"]) < n else END)
    g.add_edge("tools", "agent")
    return g


@pytest.fixture(scope="module")
def tool_graphs(bench_root):
    out, savers = {}, []
    for durable in (False, True):
        saver = DurkvSaver.open(str(bench_root / f"react-tool-{durable}.durkv"))
        savers.append(saver)
        out[durable] = tool_graph(N, durable).compile(checkpointer=saver)
    yield out
    for s in savers:
        s.close()


_threads = itertools.count()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_react_tool_only_supersteps(benchmark, tool_graphs, mode):
    benchmark.group = f"react-tool-{mode}-{N}"
    times: dict[bool, list[float]] = {False: [], True: []}

    def both():
        for durable in ((False, True) if len(times[True]) % 2 == 0 else (True, False)):
            t0 = time.perf_counter()
            invoke(tool_graphs[durable], f"{mode}-{next(_threads)}", mode)
            times[durable].append(time.perf_counter() - t0)

    benchmark.pedantic(both, rounds=ROUNDS, iterations=1)
    med = {d: sorted(v)[len(v) // 2] for d, v in times.items()}
    benchmark.extra_info["supersteps_per_s"] = {
        "plain": round(N / med[False], 1), "tool_only": round(N / med[True], 1)}
    record(benchmark, f"react {mode} N={N} tool-only durable vs plain",
           ratio=med[False] / med[True], target="reported", ok=True)
