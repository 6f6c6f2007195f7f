"""One driver per LangGraph thread (GUARANTEES.md section 18, durkv.langgraph_claim).

An invocation of a root graph claims its thread on a local store: a second one, in
this process or another, gets RunBusyError naming the holder's pid; the claim is
released however the invocation ends (a result, an exception in a node or in the
loop's __enter__, an abandoned stream, a cancelled ainvoke task, an interrupt), and a
holder killed with -9 releases at once. Real graphs, real processes, real signals.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from typing import Annotated, TypedDict

import pytest

pytest.importorskip("langgraph")

from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

import durkv  # noqa: E402
from durkv.langgraph import DurkvSaver  # noqa: E402

_HOLDER = r"""
import os, sys, time
from typing import TypedDict
from langgraph.graph import StateGraph, START, END
from durkv.langgraph import DurkvSaver

class S(TypedDict):
    n: int

path, gate = sys.argv[1], sys.argv[2]

def slow(state):
    print("started", flush=True)
    while not os.path.exists(gate):
        time.sleep(0.01)
    return {"n": state["n"] + 1}

g = StateGraph(S)
g.add_node("slow", slow)
g.add_edge(START, "slow")
g.add_edge("slow", END)
with DurkvSaver.open(path) as saver:
    out = g.compile(checkpointer=saver).invoke({"n": 1}, {"configurable": {"thread_id": "t"}})
    print("done", out["n"], flush=True)
"""


class S(TypedDict):
    n: int


def _cfg(thread="t"):
    return {"configurable": {"thread_id": thread}}


def _inc_graph(saver, node=None):
    g = StateGraph(S)
    g.add_node("inc", node or (lambda s: {"n": s["n"] + 1}))
    g.add_edge(START, "inc")
    g.add_edge("inc", END)
    return g.compile(checkpointer=saver)


@pytest.fixture
def saver(tmp_path):
    with DurkvSaver.open(str(tmp_path / "s.durkv")) as s:
        yield s
    assert not os.listdir(tmp_path / "s.durkv" / "drivers")    # no claim outlives its test


def _holder(tmp_path):
    path, gate = str(tmp_path / "s.durkv"), str(tmp_path / "gate")
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, path, gate], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if line != "started":
        p.kill()
        pytest.fail(f"holder did not start: {line!r} {p.stderr.read()}")
    return p, path, gate


def _reap(p):
    if p.poll() is None:
        p.kill()
    p.wait(timeout=30)


def test_two_processes_on_one_thread_the_second_is_busy_naming_the_first(tmp_path):
    p, path, gate = _holder(tmp_path)
    try:
        with DurkvSaver.open(path) as saver:
            graph = _inc_graph(saver)
            with pytest.raises(durkv.RunBusyError,
                               match=f"thread 't' is being driven by pid {p.pid}") as e:
                graph.invoke({"n": 10}, _cfg())
            assert e.value.context["holder_pid"] == str(p.pid)
            assert graph.invoke({"n": 10}, _cfg("u"))["n"] == 11    # another thread: free
            open(gate, "w").close()
            assert p.stdout.readline().split() == ["done", "2"]    # the holder: unaffected
            assert p.wait(timeout=60) == 0
            assert graph.get_state(_cfg()).values == {"n": 2}
            assert graph.invoke({"n": 5}, _cfg())["n"] == 6         # released at its end
    finally:
        _reap(p)


def test_a_holder_killed_with_sigkill_releases_the_thread_at_once(tmp_path):
    p, path, _ = _holder(tmp_path)
    try:
        with DurkvSaver.open(path) as saver:
            graph = _inc_graph(saver)
            with pytest.raises(durkv.RunBusyError):
                graph.invoke({"n": 10}, _cfg())
            os.kill(p.pid, signal.SIGKILL)
            assert p.wait(timeout=30) == -signal.SIGKILL
            assert graph.invoke({"n": 10}, _cfg())["n"] == 11       # no wait, no retry
    finally:
        _reap(p)


def test_a_loop_failing_in_its_enter_releases(saver):
    from langgraph.errors import EmptyInputError

    graph = _inc_graph(saver)
    with pytest.raises(EmptyInputError):        # raised by the loop's __enter__ (_first)
        graph.invoke(None, _cfg())
    assert graph.invoke({"n": 1}, _cfg())["n"] == 2

    async def main():
        with pytest.raises(EmptyInputError):    # and by __aenter__
            await graph.ainvoke(None, _cfg("v"))
        return await graph.ainvoke({"n": 1}, _cfg("v"))

    assert asyncio.run(main())["n"] == 2


class Log(TypedDict):
    log: Annotated[list, lambda a, b: a + b]


def test_an_ambiguous_resume_refused_in_enter_releases(saver):
    # LangGraph's test_resume_without_id_rejected_when_subgraph_has_parallel_interrupts,
    # the case that leaked the first attempt at this claim
    child = StateGraph(Log)
    child.add_node("a", lambda s: {"log": [f"a:{interrupt('A')}"]})
    child.add_node("b", lambda s: {"log": [f"b:{interrupt('B')}"]})
    child.add_edge(START, "a")
    child.add_edge(START, "b")
    parent = StateGraph(Log)
    parent.add_node("child", child.compile())
    parent.add_edge(START, "child")
    graph = parent.compile(checkpointer=saver)
    graph.invoke({"log": []}, _cfg())
    with pytest.raises(RuntimeError, match="multiple pending interrupts"):
        graph.invoke(Command(resume="ambiguous"), _cfg())
    ids = {i.value: i.id for i in graph.get_state(_cfg()).interrupts}
    out = graph.invoke(Command(resume={ids["A"]: "x", ids["B"]: "y"}), _cfg())
    assert sorted(out["log"]) == ["a:x", "b:y"]


def test_a_node_raising_releases(saver):
    def boom(s):
        raise ValueError("node failed")
    with pytest.raises(ValueError, match="node failed"):
        _inc_graph(saver, boom).invoke({"n": 1}, _cfg())
    assert _inc_graph(saver).invoke({"n": 1}, _cfg())["n"] == 2


def test_an_abandoned_stream_releases(saver):
    g = StateGraph(S)
    g.add_node("a", lambda s: {"n": s["n"] + 1})
    g.add_node("b", lambda s: {"n": s["n"] + 1})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    graph = g.compile(checkpointer=saver)
    stream = graph.stream({"n": 1}, _cfg())
    assert next(stream) == {"a": {"n": 2}}
    with pytest.raises(durkv.RunBusyError):      # the suspended stream drives the thread
        graph.invoke({"n": 1}, _cfg())
    del stream                                   # abandoned: closed by its collection
    assert graph.invoke({"n": 1}, _cfg())["n"] == 3
    for _ in graph.stream({"n": 1}, _cfg()):     # a loop left by break
        break
    assert graph.invoke({"n": 1}, _cfg())["n"] == 3


def test_an_astream_broken_out_of_releases_before_the_next_ainvoke(saver):
    # the event loop closes an async generator left by `break` a moment later: the next
    # ainvoke of the thread was refused, naming this very process
    async def b(s):
        await asyncio.sleep(0.05)
        return {"n": s["n"] + 1}

    async def main():
        graph = _inc_graph(saver, b)
        async for _ in graph.astream({"n": 1}, _cfg(), stream_mode="debug"):
            break
        return await graph.ainvoke({"n": 10}, _cfg())

    assert asyncio.run(main())["n"] == 11


def test_a_stream_whose_graph_finished_holds_nothing_while_suspended(saver):
    graph = _inc_graph(saver)
    stream = graph.stream({"n": 1}, _cfg(), stream_mode="values")
    assert [next(stream), next(stream)] == [{"n": 1}, {"n": 2}]   # the last state: taken
    # the generator is suspended, not exhausted: the loop has exited, the thread is free
    assert graph.invoke({"n": 5}, _cfg())["n"] == 6
    assert list(stream) == []


def test_a_cancelled_ainvoke_task_releases(saver):
    async def main():
        entered = asyncio.Event()

        async def slow(s):
            entered.set()
            await asyncio.sleep(30)
            return {"n": 0}

        graph = _inc_graph(saver, slow)
        task = asyncio.create_task(graph.ainvoke({"n": 1}, _cfg()))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await _inc_graph(saver).ainvoke({"n": 1}, _cfg())

    assert asyncio.run(main())["n"] == 2


def test_an_interrupt_releases_and_the_resume_claims_again(saver):
    def ask(s):
        return {"n": s["n"] + interrupt("how many?")}
    graph = _inc_graph(saver, ask)
    out = graph.invoke({"n": 1}, _cfg())
    assert [i.value for i in out["__interrupt__"]] == ["how many?"]
    assert graph.invoke(Command(resume=41), _cfg())["n"] == 42


def test_two_ainvokes_of_one_thread_in_one_process_one_is_refused(saver):
    async def slow(s):
        await asyncio.sleep(1.0)    # well past the 0.25 s a claim held here is waited for
        return {"n": s["n"] + 1}

    async def main():
        graph = _inc_graph(saver, slow)
        return await asyncio.gather(graph.ainvoke({"n": 1}, _cfg()),
                                    graph.ainvoke({"n": 1}, _cfg()), return_exceptions=True)

    a, b = asyncio.run(main())
    assert sorted(type(x).__name__ for x in (a, b)) == ["RunBusyError", "dict"]
    assert f"pid {os.getpid()}" in str(a if isinstance(a, Exception) else b)


def test_different_threads_never_wait_on_each_other(saver):
    gate, entered = threading.Event(), threading.Event()

    def held(s):
        entered.set()
        assert gate.wait(30)
        return {"n": s["n"] + 1}

    results = {}
    t = threading.Thread(target=lambda: results.update(
        t=_inc_graph(saver, held).invoke({"n": 1}, _cfg("t"))))
    t.start()
    try:
        assert entered.wait(30)
        for i in range(5):            # thread t is held the whole time
            assert _inc_graph(saver).invoke({"n": i}, _cfg(f"u{i}"))["n"] == i + 1
        with pytest.raises(durkv.RunBusyError):
            _inc_graph(saver).invoke({"n": 1}, _cfg("t"))
    finally:
        gate.set()
        t.join(30)
    assert results["t"]["n"] == 2


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_subgraphs_run_under_the_roots_claim_in_every_durability(saver, durability):
    child = StateGraph(S)
    child.add_node("inc", lambda s: {"n": s["n"] + 1})
    child.add_edge(START, "inc")
    parent = StateGraph(S)
    parent.add_node("child", child.compile(checkpointer=True))   # its own namespace
    parent.add_node("inc", lambda s: {"n": s["n"] + 10})
    parent.add_edge(START, "child")
    parent.add_edge("child", "inc")
    graph = parent.compile(checkpointer=saver)
    for k in range(3):
        assert graph.invoke({"n": k}, _cfg(), durability=durability)["n"] == k + 11
    assert graph.get_state(_cfg()).values == {"n": 13}


def test_a_loop_entered_without_a_run_that_fails_releases_when_collected(saver, tmp_path):
    # the net under the two releases: no Pregel.stream around the loop (no run manager
    # to report its end), and an __enter__ that fails (no exit stack unwound)
    import gc

    from langgraph.errors import EmptyInputError
    from langgraph.pregel._loop import SyncPregelLoop

    loop = SyncPregelLoop(None, stream=None, store=None, cache=None, checkpointer=saver,
                          config={"configurable": {"thread_id": "t"}, "recursion_limit": 5},
                          nodes={}, specs={}, trigger_to_nodes={}, durability="sync")
    with pytest.raises(EmptyInputError):
        loop.__enter__()
    with pytest.raises(durkv.RunBusyError):         # held by the failed loop ...
        _inc_graph(saver).invoke({"n": 1}, _cfg())
    del loop
    gc.collect()                                    # ... until it is collected
    assert _inc_graph(saver).invoke({"n": 1}, _cfg())["n"] == 2
