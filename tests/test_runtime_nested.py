"""A durable call made inside the function of another durable call of the same run is
refused when it is made, and the outer call records nothing.

A replay returns the outer call's recorded result without running its function: a call
made inside it would never be asked for again, every later automatic step id would
shift, and the run could not be resumed (a NonDeterminismError that blamed a code
change). The first execution used to succeed and record both.
"""

from __future__ import annotations

import asyncio

import pytest

import durkv
from durkv.errors import ConfigError
from durkv.runtime.journal import E_RUN, E_STATUS

NESTED = "inside the function of another durable call of the same run"


@durkv.tool(name="send")
def send(body, *, idempotency_key):
    SENT.append(idempotency_key)
    return "sent"


SENT: list = []


@pytest.fixture(autouse=True)
def _clear():
    SENT.clear()


def _calls(store, run_id="r"):
    """The journal's records of calls (every record but the run's start and statuses)."""
    return [r["e"] for r in store.journal(run_id) if r["e"] not in (E_RUN, E_STATUS)]


@pytest.mark.parametrize("inner", ["step", "tool", "approve", "sleep", "step-with-key"])
@pytest.mark.parametrize("outer_retry", [None, durkv.Retry(3, backoff=0)])
def test_a_call_inside_a_steps_function_is_refused_and_nothing_is_recorded(url, inner,
                                                                             outer_retry):
    def research(q):
        if inner == "step":
            run.step("search", lambda: ["fact"])
        elif inner == "step-with-key":
            run.step("search", lambda: ["fact"], key="search-1")
        elif inner == "tool":
            run.tool(send, q)
        elif inner == "approve":
            run.approve("publish", q)
        else:
            run.sleep(0)
        return "summary"

    with durkv.open(url) as store:
        with pytest.raises(ConfigError, match=NESTED), store.run("r") as run:
            run.step("research", research, "refunds", retry=outer_retry)
        assert _calls(store) == [] and SENT == []
        with store.run("r") as run:         # the code fixed: the run goes on from step 0
            assert run.step("research", lambda q: "summary", "refunds") == "summary"
            assert run.tool(send, "summary") == "sent"
        with store.run("r") as run:         # and replays
            assert run.step("research", lambda q: "other", "refunds") == "summary"
            assert run.tool(send, "summary") == "sent"
        assert len(SENT) == 1


@pytest.mark.parametrize("verb", ["now", "random", "uuid"])
def test_time_and_chance_inside_a_steps_function_are_refused(url, verb):
    """run.now() inside a step recorded a NOW record at an automatic id, and the run then
    could not be resumed."""
    with durkv.open(url) as store:
        with pytest.raises(ConfigError, match=NESTED), store.run("r") as run:
            run.step("stamp", lambda: getattr(run, verb)())
        assert _calls(store) == []
        with store.run("r") as run:
            t = run.now()
            assert run.step("stamp", lambda: t) == t


def test_a_call_of_the_same_run_behind_another_runs_call_is_refused(url):
    """A -> B -> A: the marker of A's outer call was hidden by B's. Neither A's nor B's
    call records anything."""
    with durkv.open(url) as store:
        with pytest.raises(ConfigError, match=NESTED), \
                store.run("A") as a, store.run("B") as b:
            a.step("outer", lambda: b.step("mid", lambda: a.step("inner", lambda: 1) + 1))
        assert _calls(store, "A") == [] and _calls(store, "B") == []
        with store.run("A") as a, store.run("B") as b:     # fixed: side by side
            assert a.step("outer", lambda: b.step("mid", lambda: 2)) == 2
            assert a.step("after", lambda: "Y") == "Y"
        with store.run("A") as a:
            assert a.step("outer", lambda: 0) == 2 and a.step("after", lambda: 0) == "Y"


def test_the_refusal_stands_even_when_the_outer_function_catches_it(url):
    def sly():
        try:
            run.step("inner", lambda: 1)
        except ConfigError:
            pass
        return "fine"

    with durkv.open(url) as store:
        with pytest.raises(ConfigError, match=NESTED), store.run("r") as run:
            run.step("outer", sly)
        assert _calls(store) == []


def test_a_call_inside_a_tools_function_is_refused_before_the_inner_call(url):
    @durkv.tool(name="outer")
    def outer(*, idempotency_key):
        return run.tool(send, "x")

    with durkv.open(url) as store:
        with pytest.raises(ConfigError, match=NESTED), store.run("r") as run:
            run.tool(outer)
        assert SENT == []


def test_async_calls_inside_an_async_steps_function_are_refused(url):
    async def fan_out():
        return await asyncio.gather(run.astep("a", lambda: 1), run.astep("b", lambda: 2))

    async def go():
        async with store.arun("r") as r:
            global run
            run = r
            await r.astep("outer", fan_out)

    with durkv.open(url) as store:
        with pytest.raises(ConfigError, match=NESTED):
            asyncio.run(go())
        assert _calls(store) == []


def test_concurrent_async_calls_of_one_run_are_not_nested(url):
    """Sibling calls gathered at the run's level each run in their own task context."""
    async def slow(v):
        await asyncio.sleep(0.01)
        return v

    async def go():
        async with store.arun("r") as r:
            return await asyncio.gather(*(r.astep(f"s{i}", slow, i) for i in range(5)))

    with durkv.open(url) as store:
        assert asyncio.run(go()) == [0, 1, 2, 3, 4]
        assert asyncio.run(go()) == [0, 1, 2, 3, 4]
        assert len(_calls(store)) == 5


def test_a_call_of_another_run_inside_a_step_is_allowed(url):
    with durkv.open(url) as store:
        with store.run("outer") as a, store.run("inner") as b:
            assert a.step("o", lambda: b.step("i", lambda: 41) + 1) == 42
        assert len(_calls(store, "outer")) == len(_calls(store, "inner")) == 1


def test_a_langgraph_step_inside_a_langgraph_step_is_refused(tmp_path):
    pytest.importorskip("langgraph")
    import operator
    from typing import Annotated

    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    from durkv.langgraph import DurkvSaver
    from durkv.langgraph import step as lg_step

    State = TypedDict("State", {"log": Annotated[list, operator.add]})

    def node(state):
        return {"log": [lg_step("outer", lambda: lg_step("inner", lambda: 1))]}

    g = StateGraph(State)
    g.add_node("act", node)
    g.add_edge(START, "act")
    g.add_edge("act", END)
    with DurkvSaver.open(str(tmp_path / "lg.durkv")) as saver:
        with pytest.raises(ConfigError, match=NESTED):
            g.compile(checkpointer=saver).invoke({"log": []},
                                                 {"configurable": {"thread_id": "t"}})
