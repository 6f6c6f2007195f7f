"""A LangGraph ReAct agent with and without durkv's exactly-once helpers, side by side.

Workload: the prebuilt shape of a ReAct agent -- an ``agent`` node that calls a
(scripted) model on the whole message list and answers with one tool call, a
``tools`` node that runs the tool and appends its result -- for N supersteps, on
``DurkvSaver``. The *durable* variant makes the model call a
``durkv.langgraph.step`` and the tool a ``durkv.langgraph.tool`` (a mutating tool
that takes the idempotency key), the way the README tells users to make an agent
exactly-once; the *plain* variant calls both directly.

| group              | measured                                  | target (durable vs plain)   |
|--------------------|-------------------------------------------|-----------------------------|
| react-durable-{mode}-{N} | supersteps/s of one graph.invoke    | >= 0.8x (async), >= 0.5x    |
|                    |                                           | (sync)                      |
| react-tool-only-{mode}-{N} | the same, only the tool durable   | reported                    |
| react-bytes-{N}    | bytes on disk of one finished run, and    | <= 1.2x, and linear in N    |
|                    | its frames alone (no zero slack)          |                             |
|                    | (and after compact(): reported)           |                             |

Rounds alternate plain and durable so that load drifting on a shared machine
hits both alike. Env: DURKV_BENCH_REACT_N (default 1000; quick 100),
DURKV_BENCH_QUICK=1, DURKV_BENCH_DIR.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Annotated

import pytest
from benchlib import QUICK, frame_bytes, record

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402
from typing_extensions import TypedDict  # noqa: E402

import durkv  # noqa: E402
from durkv.langgraph import DurkvSaver, step, tool  # noqa: E402

N = int(os.environ.get("DURKV_BENCH_REACT_N", "100" if QUICK else "1000"))
ROUNDS = 1 if QUICK else 5
_TEXT = "observe the result, plan the next call, keep the user's goal in view. " * 4


class State(TypedDict):
    messages: Annotated[list, add_messages]


def fake_model(messages: list) -> AIMessage:
    """A scripted model: one tool call per turn, a reply that depends on the history."""
    k = len(messages)
    return AIMessage(content=f"turn {k}: {_TEXT}", id=f"ai-{k}",
                     tool_calls=[{"name": "lookup", "args": {"q": f"q{k}"}, "id": f"call-{k}"}])


@durkv.tool(version="1")
def lookup(q: str, *, idempotency_key: str | None = None) -> str:
    return f"result of {q}: {_TEXT}"


def react_graph(n: int, durable: bool, durable_model: bool = True):
    """``agent`` and ``tools`` alternate until N supersteps have run. ``durable``: the tool
    through ``durkv.langgraph.tool``, and the model through ``step`` unless
    ``durable_model`` is False (the *tool-only* variant: what a keyed tool's journal
    records cost, apart from what the model step records about its input)."""
    def agent(state):
        msgs = state["messages"]
        ai = step("model", fake_model, msgs) if durable and durable_model else fake_model(msgs)
        return {"messages": [ai]}

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


def invoke(graph, thread: str, mode: str) -> None:
    graph.invoke({"messages": [HumanMessage(content="find it", id="h0")]},
                 {"configurable": {"thread_id": thread}, "recursion_limit": N + 10},
                 durability=mode)


def store_bytes(path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# the graphs compared, each on a store of its own: (durable, durable_model)
VARIANTS = {"plain": (False, True), "durable": (True, True), "tool-only": (True, False)}


@pytest.fixture(scope="module")
def graphs(bench_root):
    """The compiled graph of each variant."""
    out, savers = {}, []
    for name, (durable, durable_model) in VARIANTS.items():
        saver = DurkvSaver.open(str(bench_root / f"react-{name}.durkv"))
        savers.append(saver)
        out[name] = react_graph(N, durable, durable_model).compile(checkpointer=saver)
    yield out
    for s in savers:
        s.close()


_threads = itertools.count()


@pytest.mark.parametrize("variant", ["durable", "tool-only"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_react_supersteps(benchmark, graphs, mode, variant):
    """Supersteps/s of the durable (or tool-only) agent against the plain one, in
    alternating rounds. The target is the durable agent's; tool-only is reported."""
    benchmark.group = f"react-{variant}-{mode}-{N}"
    times: dict[str, list[float]] = {"plain": [], variant: []}
    cpu: dict[str, list[float]] = {"plain": [], variant: []}

    def both():
        order = ("plain", variant) if len(times[variant]) % 2 == 0 else (variant, "plain")
        for name in order:
            t0, c0 = time.perf_counter(), time.process_time()
            invoke(graphs[name], f"{mode}-{next(_threads)}", mode)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)

    benchmark.pedantic(both, rounds=ROUNDS, iterations=1)
    med = {d: sorted(v)[len(v) // 2] for d, v in times.items()}
    ratio = med["plain"] / med[variant]
    minimum = 0.8 if mode == "async" else 0.5
    benchmark.extra_info["supersteps_per_s"] = {d: round(N / m, 1) for d, m in med.items()}
    # the process's CPU seconds (all threads): on a machine shared with other jobs the wall
    # clock ratio moves with their load; this one much less (reported, not the target)
    cmed = {d: sorted(v)[len(v) // 2] for d, v in cpu.items()}
    benchmark.extra_info["cpu_ratio"] = round(cmed["plain"] / cmed[variant], 3)
    print(f"\nreact {mode} N={N} {variant}: CPU-time ratio {cmed['plain'] / cmed[variant]:.3f}")
    if variant == "durable":
        record(benchmark, f"react {mode} N={N} durable vs plain", ratio=ratio,
               target=f">= {minimum}x plain", ok=ratio >= minimum)
    else:
        record(benchmark, f"react {mode} N={N} tool-only durable vs plain", ratio=ratio,
               target="reported", ok=True)


def test_react_bytes(benchmark, bench_root):
    """Bytes on disk of one run, durable over plain, at N and N/2 (linear: the ratio of
    the two sizes stays near 2)."""
    benchmark.group = f"react-bytes-{N}"
    sizes: dict[tuple[bool, int], int] = {}
    frames: dict[bool, int] = {}
    compacted: dict[bool, int] = {}

    def measure():
        for n in (N // 2, N):
            for durable in (False, True):
                path = bench_root / f"react-bytes-{durable}-{n}-{next(_threads)}.durkv"
                with DurkvSaver.open(str(path)) as saver:
                    graph = react_graph(n, durable).compile(checkpointer=saver)
                    graph.invoke({"messages": [HumanMessage(content="find it", id="h0")]},
                                 {"configurable": {"thread_id": "t"}, "recursion_limit": n + 10},
                                 durability="async")
                sizes[(durable, n)] = store_bytes(path)
                if n == N:
                    frames[durable] = frame_bytes(path)
                if n == N:      # and after an operator's compaction (reported)
                    with DurkvSaver.open(str(path)) as saver:
                        saver.store.compact()
                    compacted[durable] = store_bytes(path)

    benchmark.pedantic(measure, rounds=1, iterations=1)
    ratio = sizes[(True, N)] / sizes[(False, N)]
    frames_ratio = frames[True] / frames[False]
    growth = sizes[(True, N)] / sizes[(True, N // 2)]
    benchmark.extra_info.update({
        "bytes": {f"{'durable' if d else 'plain'}-{n}": b for (d, n), b in sizes.items()},
        "compacted": {"durable" if d else "plain": b for d, b in compacted.items()},
        "frames": {"durable" if d else "plain": b for d, b in frames.items()},
        "compacted_ratio": round(compacted[True] / compacted[False], 3),
        "durable_growth_n_over_half_n": round(growth, 3)})
    record(benchmark, f"react bytes N={N} durable vs plain", ratio=ratio,
           target="<= 1.2x plain", ok=ratio <= 1.2)
    # the same without the zero slack: what the two stores hold, not where the sawtooth is
    record(benchmark, f"react bytes N={N} durable vs plain, frames only", ratio=frames_ratio,
           target="<= 1.2x plain", ok=frames_ratio <= 1.2)
    record(benchmark, f"react bytes N={N} durable: size(N)/size(N/2)", ratio=growth,
           target="<= 2.2 (linear in N)", ok=growth <= 2.2)

