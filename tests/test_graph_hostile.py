"""durkv.Graph used as a hostile user would (issue 18 review): wrong types, wrong stores,
run ids that hold something else, async graphs called from a running loop. Each test
held a defect of the first version."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, OrderedDict, defaultdict

import pytest

import durkv
from durkv.errors import ConfigError, GraphError, NotFoundError, RunConflictError


@pytest.fixture
def store(tmp_path):
    with durkv.open(str(tmp_path / "h.durkv")) as s:
        yield s


def one_node(fn, channels=None):
    g = durkv.Graph(channels or {"x": durkv.Last(0)})
    g.add_node("a", fn)
    g.add_edge(durkv.START, "a")
    return g


def counting(calls):
    def a(state, ctx):
        calls["a"] += 1
        return {"x": ctx.step("m", lambda: state["x"] + 1)}
    return one_node(a)


# -- building: names that are not names ---------------------------------------------------

@pytest.mark.parametrize("src, dst", [("a", ["a"]), (["a"], "a"), ("a", {"a": 1}), (5, "a")])
def test_add_edge_with_a_non_str_end_is_a_graph_error(src, dst):
    g = one_node(lambda s, c: None)
    with pytest.raises(GraphError, match="node name"):
        g.add_edge(src, dst)


def test_conditional_edges_from_a_non_str_source_is_a_graph_error():
    g = one_node(lambda s, c: None)
    with pytest.raises(GraphError, match="node name"):
        g.add_conditional_edges(["a"], lambda s: durkv.END)


# -- compile: what it binds to ------------------------------------------------------------

@pytest.mark.parametrize("bad", [None, "memory://", object()])
def test_compile_refuses_what_is_not_a_store(bad):
    with pytest.raises(ConfigError, match=r"durkv\.open"):
        one_node(lambda s, c: None).compile(bad)


@pytest.mark.parametrize("kw", [{"max_supersteps": 0}, {"max_supersteps": -3},
                                {"max_supersteps": "10"}, {"max_workers": 0},
                                {"max_workers": -1}, {"max_workers": 2.5}])
def test_compile_checks_its_limits_at_compile_time(store, kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        one_node(lambda s, c: None).compile(store, **kw)


# -- updates: a dict subclass is a dict ---------------------------------------------------

@pytest.mark.parametrize("kind", [OrderedDict, lambda d: defaultdict(int, d)])
def test_a_dict_subclass_is_an_update_and_an_input(store, kind):
    app = one_node(lambda s, c: kind({"x": s["x"] + 1})).compile(store)
    res = app.run(kind({"x": 1}), run_id="r")
    assert (res.status, res.state["x"]) == ("finished", 2)
    assert app.run(None, run_id="r").state == {"x": 2}
    assert app.run({"x": 1}, run_id="r").state == {"x": 2}     # the same input


# -- reading runs that are not there, or not graphs --------------------------------------

def test_history_of_an_unknown_run_is_not_found(store):
    app = one_node(lambda s, c: None).compile(store)
    with pytest.raises(NotFoundError, match="nope"):
        list(app.history("nope"))


def test_history_of_a_thread_that_is_no_graph_run_is_a_conflict(store):
    store.put("t", "", "0001", checkpoint={}, metadata={"step": 1}, values={"m": [1]},
              versions={"m": 1})
    app = one_node(lambda s, c: None).compile(store)
    with pytest.raises(RunConflictError, match="no durkv.Graph"):
        list(app.history("t"))
    with pytest.raises(RunConflictError):
        app.state("t")


# -- a run id that holds a plain store.run journal ----------------------------------------

@pytest.mark.parametrize("finish", [True, False])
def test_a_plain_journal_run_of_the_same_input_is_not_adopted(store, finish):
    calls = Counter()
    with store.run("plain", input={"x": 1}) as run:
        run.step("s", lambda: 1)
        if not finish:
            run.mark("waiting")
    before = store.journal("plain")
    app = counting(calls).compile(store)
    with pytest.raises(RunConflictError, match="store.run"):
        app.run({"x": 1}, run_id="plain")
    with pytest.raises(RunConflictError, match="store.run"):
        app.run(None, run_id="plain")
    assert calls["a"] == 0 and store.get("plain") is None
    assert store.journal("plain") == before           # nothing written to it


def test_a_graph_run_cut_before_its_first_checkpoint_still_resumes(store):
    """The journal of a graph run can exist without checkpoint 0 (killed between its
    start record and the first commit): that one is the graph's, and resumes."""
    calls = Counter()
    app = counting(calls).compile(store)
    run = durkv.Run(store, "cut", {"x": 1})
    run.open()
    run.close(record=False)                # the start record only, as a kill leaves it
    assert store.get("cut") is None and store.journal_length("cut") == 1
    res = app.run({"x": 1}, run_id="cut")
    assert (res.status, res.state, calls["a"]) == ("finished", {"x": 2}, 1)


# -- async nodes under the sync app.run, inside a running loop ----------------------------

def test_sync_run_of_an_async_graph_inside_a_loop_says_use_arun(store):
    async def a(state, ctx):
        return {"x": await ctx.astep("m", lambda: 1)}
    app = one_node(a).compile(store)

    async def main():
        with pytest.raises(ConfigError, match="arun"):
            app.run({"x": 0}, run_id="r")
        return await app.arun({"x": 0}, run_id="r")
    res = asyncio.run(main())
    assert (res.status, res.state) == ("finished", {"x": 1})
    assert [r.status for r in store.runs()] == ["finished"]


# -- a value the store cannot serialize: the run fails, recover goes on --------------------

def test_an_update_the_store_cannot_store_fails_the_run_and_recover_goes_on(store):
    mode = {"kill": True}
    lock = threading.Lock()

    def a(state, ctx):
        if mode["kill"]:
            raise KeyboardInterrupt      # leaves both runs unfinished, as a crash does
        return {"x": lock if state["x"] == 1 else state["x"] + 1}
    app = one_node(a).compile(store)
    for rid, x in (("bad", 1), ("good", 5)):
        with pytest.raises(KeyboardInterrupt):
            app.run({"x": x}, run_id=rid)
    mode["kill"] = False
    got = {r.run_id: r for r in app.recover()}
    assert got["good"].status == "finished" and got["good"].state == {"x": 6}
    assert got["bad"].status == "failed" and "cannot be stored" in got["bad"].message
    assert isinstance(got["bad"].error, GraphError)
    assert app.state("bad").status == "failed" and app.state("bad").step == 0
    with pytest.raises(GraphError, match="cannot be stored"):
        app.run(None, run_id="bad")


def test_a_send_argument_or_sibling_update_the_store_cannot_store_fails_the_run(store):
    lock = threading.Lock()
    g = durkv.Graph({"x": durkv.Last(0)})
    g.add_node("fan", lambda s, c: None)

    def w(arg, ctx):
        if arg == "raise":
            raise ValueError("w")
        return {"x": lock}
    g.add_node("w", w)
    g.add_edge(durkv.START, "fan")
    g.add_conditional_edges("fan", lambda s: [durkv.Send("w", lock)])
    app = g.compile(store)
    with pytest.raises(GraphError, match="cannot be stored"):
        app.run({}, run_id="send")
    assert app.state("send").status == "failed"
    g2 = durkv.Graph({"x": durkv.Last(0)})
    g2.add_node("fan", lambda s, c: None)
    g2.add_node("w", w)
    g2.add_edge(durkv.START, "fan")
    g2.add_conditional_edges("fan", lambda s: [durkv.Send("w", "ok"), durkv.Send("w", "raise")])
    app2 = g2.compile(store, name="g2")
    with pytest.raises(GraphError, match="node 'w'.*cannot be stored"):
        app2.run({}, run_id="sib")                 # w[0]'s pending write is the lock
    assert app2.state("sib").status == "failed"


def test_reading_and_forking_name_the_run_id_argument(store):
    app = one_node(lambda s, c: None).compile(store)
    app.run({}, run_id="r")
    for call in (lambda: app.state(5), lambda: list(app.history(["r"])),
                 lambda: app.fork(b"r", "000000000000", "f")):
        with pytest.raises(ConfigError, match="^run_id must"):
            call()
    with pytest.raises(ConfigError, match="^new_run_id must"):
        app.fork("r", "000000000000", 5)


def test_an_object_with_an_async_call_is_an_async_node(store):
    class Node:
        async def __call__(self, state, ctx):
            return {"x": await ctx.astep("m", lambda: state["x"] + 1)}
    app = one_node(Node()).compile(store)
    assert app.run({"x": 1}, run_id="r").state == {"x": 2}
    assert asyncio.run(app.arun({"x": 5}, run_id="r2")).state == {"x": 6}


def test_state_lists_only_the_approvals_still_to_decide(store):
    g = durkv.Graph({"d": durkv.Append()})
    g.add_node("fan", lambda s, c: None)
    g.add_node("w", lambda arg, ctx: {"d": [(arg, ctx.approve("act", arg).approved)]})
    g.add_edge(durkv.START, "fan")
    g.add_conditional_edges("fan", lambda s: [durkv.Send("w", 1), durkv.Send("w", 2)])
    app = g.compile(store)
    res = app.run({}, run_id="ap")
    first, second = res.waiting
    store.decide("ap", first.step_id, False)
    st = app.state("ap")
    assert (st.status, st.waiting) == ("waiting", [second])    # not the decided one
    store.decide("ap", second.step_id, True)
    assert (app.state("ap").status, app.state("ap").waiting) == ("running", [])
    assert [r.status for r in app.recover()] == ["finished"]
    assert app.state("ap").state == {"d": [(1, False), (2, True)]}


@pytest.mark.parametrize("bad", [{"y": 1}, {"l": 5}])
def test_a_bad_input_does_not_burn_the_run_id(store, bad):
    g = durkv.Graph({"x": durkv.Last(0), "l": durkv.Append()})
    g.add_node("a", lambda s, c: {"x": s["x"] + 1})
    g.add_edge(durkv.START, "a")
    app = g.compile(store)
    with pytest.raises(GraphError, match="the input"):
        app.run(bad, run_id="r")
    assert store.journal_length("r") == 0 and store.get("r") is None
    assert app.run({"x": 1}, run_id="r").state == {"x": 2, "l": []}   # the fixed input
