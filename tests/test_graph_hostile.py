"""durkv.Graph used as a hostile user would (issue 18 review): wrong types, wrong stores,
run ids that hold something else, async graphs called from a running loop. Each test
held a defect of the first version."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
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


# -- the second review (session 18): cancellation, resumed types, inputs, failures --------

def _counting_loop(n_max=3):
    g = durkv.Graph({"n": durkv.Last(0), "who": durkv.Append()})
    g.add_node("inc", lambda s, ctx: {"n": s["n"] + 1, "who": [s["n"]]})
    g.add_edge(durkv.START, "inc")
    g.add_conditional_edges("inc", lambda s: "inc" if s["n"] < n_max else durkv.END)
    return g


def test_cancelling_arun_while_it_starts_in_a_thread_still_releases_the_run(
        store, monkeypatch):
    """The start runs in a worker thread and claims the run there; a cancellation at that
    await once returned before the claim, which nothing then released (RunBusyError for
    as long as the process lived)."""
    from durkv.runtime import graph_exec
    start = graph_exec.Execution.start
    in_start = threading.Event()

    def slow_start(self, *a, **kw):
        in_start.set()
        threading.Event().wait(0.2)
        return start(self, *a, **kw)

    monkeypatch.setattr(graph_exec.Execution, "start", slow_start)
    app = _counting_loop().compile(store)

    async def cancel_it():
        t = asyncio.ensure_future(app.arun({"n": 0}, run_id="r"))
        while not in_start.is_set():
            await asyncio.sleep(0.001)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        monkeypatch.undo()
        return await app.arun(None, run_id="r")

    res = asyncio.run(cancel_it())
    assert res.status == "finished" and res.state == {"n": 3, "who": [0, 1, 2]}


def test_a_cancelled_arun_commits_nothing_after_it_returns(tmp_path):
    """Under `sync` the barrier (route and commit) runs in a worker thread: a cancellation
    there waits for it, so no commit lands after arun gave the run up (one once did,
    overwriting the next driver's checkpoint)."""
    slow = threading.Event()
    g = durkv.Graph({"n": durkv.Last(0), "who": durkv.Append()})
    g.add_node("inc", lambda s, ctx: {"n": s["n"] + 1, "who": [s["n"]]})

    def router(s):
        if s["n"] == 2 and not slow.is_set():
            slow.set()
            threading.Event().wait(0.4)
        return "inc" if s["n"] < 4 else durkv.END

    g.add_edge(durkv.START, "inc")
    g.add_conditional_edges("inc", router)
    with durkv.open(str(tmp_path / "c.durkv"), durability="sync") as store:
        app = g.compile(store)

        async def cancel_it():
            t = asyncio.ensure_future(app.arun({"n": 0}, run_id="r"))
            while not slow.is_set():
                await asyncio.sleep(0.001)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            return len(list(store.history("r", "", values=False)))

        seen = asyncio.run(cancel_it())
        threading.Event().wait(0.5)             # the old barrier would have committed now
        assert len(list(store.history("r", "", values=False))) == seen
        res = app.run(None, run_id="r")
        assert res.status == "finished" and res.state == {"n": 4, "who": [0, 1, 2, 3]}
        cks = [c.values.get("who", []) for c in store.history("r", "")][::-1]
        assert all(b[:len(a)] == a for a, b in zip(cks, cks[1:]))   # each extends the last


def test_cancelling_arun_waits_for_its_plain_nodes_threads(store):
    done = threading.Event()

    def blocking(state, ctx):
        threading.Event().wait(0.3)
        ctx.step("after", lambda: 1)        # still this run's: the claim is held meanwhile
        done.set()
        return {"x": 1}

    app = one_node(blocking).compile(store)

    async def cancel_it():
        t = asyncio.ensure_future(app.arun({"x": 0}, run_id="r"))
        await asyncio.sleep(0.1)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        return done.is_set()

    assert asyncio.run(cancel_it()) is True
    assert app.run(None, run_id="r").state == {"x": 1}


def test_a_resumed_sibling_update_keeps_its_tuples(store):
    """A failing task's siblings are kept as pending writes; on resume their updates are
    folded as the node returned them (a tuple once came back a list, and a reducer
    `a + b` then failed the run an uninterrupted execution finishes)."""
    fail = {"on": True}
    g = durkv.Graph({"pair": durkv.Last(None), "acc": (lambda a, b: a + b)})
    g.add_node("a", lambda s, ctx: {"pair": (1, 2), "acc": (10,)})

    def b(state, ctx):
        if fail["on"]:
            raise RuntimeError("transient")
        return {"acc": (20,)}

    g.add_node("b", b)
    g.add_edge(durkv.START, "a")
    g.add_edge(durkv.START, "b")
    app = g.compile(store)
    assert app.run({"acc": ()}, run_id="r").status == "failed"
    fail["on"] = False
    res = app.run(None, run_id="r")
    assert res.status == "finished"
    assert res.state == {"pair": (1, 2), "acc": (10, 20)}
    assert type(res.state["pair"]) is tuple and type(app.state("r").state["acc"]) is tuple


def test_an_equal_input_resumes_whatever_its_dict_and_set_order(tmp_path):
    g = one_node(lambda s, ctx: ctx.approve("go") and {"x": 1},
                 {"x": durkv.Last(0), "cfg": durkv.Last(None)})
    path = str(tmp_path / "e.durkv")
    store = durkv.open(path)
    app = g.compile(store)
    assert app.run({"cfg": {"a": 1, "b": 2}}, run_id="d").status == "waiting"
    assert app.run({"cfg": {"b": 2, "a": 1}}, run_id="d").status == "waiting"
    with pytest.raises(RunConflictError):
        app.run({"cfg": {"a": 1, "b": 3}}, run_id="d")
    tags = {f"tag-{i}" for i in range(50)}
    assert app.run({"cfg": tags}, run_id="s").status == "waiting"
    code = ("import durkv, sys\n"
            "from test_graph_hostile import one_node\n"
            "g = one_node(lambda s, ctx: ctx.approve('go') and {'x': 1},\n"
            "             {'x': durkv.Last(0), 'cfg': durkv.Last(None)})\n"
            "with durkv.open(sys.argv[1]) as store:\n"
            "    tags = {f'tag-{i}' for i in range(50)}\n"
            "    print(g.compile(store).run({'cfg': tags}, run_id='s').status)\n")
    store.close()
    for seed in ("1", "2"):         # another process, another set order
        out = subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                             text=True, cwd=os.path.dirname(__file__),
                             env={**os.environ, "PYTHONHASHSEED": seed}, timeout=60)
        assert out.stdout.strip() == "waiting", out.stderr


def test_a_run_started_before_the_canonical_input_fingerprint_still_resumes(
        store, monkeypatch):
    """Runs started by an earlier durkv recorded the hash of the input's serde bytes."""
    from durkv.runtime import graph_exec
    from durkv.runtime.run import fingerprint
    g = one_node(lambda s, ctx: ctx.approve("go") and {"x": 1},
                 {"x": durkv.Last(0), "cfg": durkv.Last(None)})
    app = g.compile(store)
    new = graph_exec.Execution._fingerprint

    def old(self, input):
        copy, _ = new(self, input)
        raw = fingerprint(self.store.serde.dumps(input))
        return copy, (raw, raw)

    monkeypatch.setattr(graph_exec.Execution, "_fingerprint", old)
    assert app.run({"cfg": {"a": 1}}, run_id="o").status == "waiting"
    monkeypatch.undo()
    assert store.get("o").checkpoint["in"] == fingerprint(store.serde.dumps({"cfg": {"a": 1}}))
    assert app.run({"cfg": {"a": 1}}, run_id="o").status == "waiting"
    with pytest.raises(RunConflictError):
        app.run({"cfg": {"a": 2}}, run_id="o")


def test_a_superstep_over_max_commit_bytes_fails_its_run_and_recover_goes_on(tmp_path):
    g = durkv.Graph({"blob": durkv.Last(None), "n": durkv.Last(0)})

    def n(state, ctx):
        if state["n"] == 1 and state["blob"] == "big":
            return {"blob": os.urandom(200_000)}     # incompressible
        if state["n"] == 1:
            ctx.approve("go")
        return {"n": state["n"] + 1}

    g.add_node("n", n)
    g.add_edge(durkv.START, "n")
    g.add_conditional_edges("n", lambda s: "n" if s["n"] < 2 else durkv.END)
    with durkv.open(str(tmp_path / "m.durkv"), max_commit_bytes=64 << 10) as store:
        app = g.compile(store)
        with pytest.raises(GraphError, match="over max_commit_bytes"):
            app.run({"blob": "big"}, run_id="big")
        big = app.state("big")
        assert big.status == "failed" and big.state == {"blob": "big", "n": 1}
        waiting = app.run({"blob": "ok"}, run_id="other")
        store.decide("other", waiting.interrupt.step_id, True)
        got = {r.run_id: r.status for r in app.recover()}
        assert got == {"big": "failed", "other": "finished"}


def test_a_failed_router_returns_the_committed_state_not_the_applied_one(store):
    boom = {"on": False}
    g = durkv.Graph({"log": durkv.Append(), "n": durkv.Last(0)})

    def n(state, ctx):
        if state["n"] == 1:
            ctx.approve("go")
        return {"log": [f"item{state['n']}"], "n": state["n"] + 1}

    def route(s):
        if boom["on"]:
            raise KeyError("bug in router")
        return "n" if s["n"] < 3 else durkv.END

    g.add_node("n", n)
    g.add_edge(durkv.START, "n")
    g.add_conditional_edges("n", route)
    app = g.compile(store)
    first = app.run({}, run_id="r")
    store.decide("r", first.interrupt.step_id, True)
    boom["on"] = True
    [res] = app.recover()
    assert (res.status, res.step, res.state) == ("failed", 1, {"log": ["item0"], "n": 1})
    now = app.state("r")
    assert (now.status, now.step, now.state) == ("failed", 1, {"log": ["item0"], "n": 1})


def test_the_state_never_holds_the_callers_input_objects(store):
    """The run starts from its input as stored: a caller editing its input while arun
    goes on (or after) changes neither what nodes see nor the result."""
    cfg = ["given"]
    seen = []

    async def node(state, ctx):
        await asyncio.sleep(0.05)
        seen.append(list(state["cfg"]))
        return {"x": 1}

    g = one_node(node, {"x": durkv.Last(0), "cfg": durkv.Last(None)})
    app = g.compile(store)

    async def go():
        t = asyncio.ensure_future(app.arun({"cfg": cfg}, run_id="r"))
        await asyncio.sleep(0.01)
        cfg.append("caller edit")
        return await t

    res = asyncio.run(go())
    cfg.append("another")
    assert seen == [["given"]] and res.state["cfg"] == ["given"]
    assert app.state("r").state["cfg"] == ["given"]


def test_an_update_that_contains_itself_fails_the_run_instead_of_hanging(store):
    loop: list = ["a"]
    loop.append(loop)
    app = one_node(lambda s, ctx: {"x": loop}).compile(store)
    with pytest.raises(GraphError, match="contains itself"):
        app.run({}, run_id="r")
    assert app.state("r").status == "failed"


def test_a_failed_router_after_an_in_place_reducer_returns_the_committed_state(store):
    """A reducer that edits its old value in place (``a.update(b)``, ``operator.iadd``)
    changed the state before the superstep failed: the failed result showed it."""
    import operator

    def merge(a, b):
        a.update(b)
        return a

    boom = {"on": False}
    g = durkv.Graph({"cfg": merge, "log": operator.iadd, "n": durkv.Last(0)})

    def n(state, ctx):
        if state["n"] == 1:
            ctx.approve("go")
        return {"cfg": {f"k{state['n']}": 1}, "log": [f"item{state['n']}"],
                "n": state["n"] + 1}

    def route(s):
        if boom["on"]:
            raise KeyError("bug in router")
        return "n" if s["n"] < 3 else durkv.END

    g.add_node("n", n)
    g.add_edge(durkv.START, "n")
    g.add_conditional_edges("n", route)
    app = g.compile(store)
    first = app.run({"cfg": {}, "log": []}, run_id="r")
    store.decide("r", first.interrupt.step_id, True)
    boom["on"] = True
    [res] = app.recover()
    committed = {"cfg": {"k0": 1}, "log": ["item0"], "n": 1}
    assert (res.status, res.step, res.state) == ("failed", 1, committed)
    assert app.state("r").state == committed


# -- review of issue 20: values a fold, an alias or a deploy changed ------------------------

def _extend(a, b):
    a.extend(b)         # an in-place reducer, as users write them
    return a


def _three_siblings(c):
    g = durkv.Graph({"items": _extend})
    g.add_node("a", lambda s, ctx: {"items": ["a"]})
    g.add_node("b", lambda s, ctx: {"items": ["b"]})
    g.add_node("c", c)
    for n in "abc":
        g.add_edge(durkv.START, n)
        g.add_edge(n, durkv.END)
    return g


@pytest.mark.parametrize("stop", ["approval", "failure"])
def test_an_in_place_reducer_never_edits_a_kept_sibling_update(store, stop):
    """The first update of a channel without a value was taken as is: the next sibling's
    fold extended node a's own list, which was then kept as a's pending write, and the
    resume folded b's items twice (['a', 'b', 'b', 'c'])."""
    fail = {"on": True}

    def c(state, ctx):
        if stop == "approval":
            ctx.approve("publish")
        elif fail["on"]:
            raise RuntimeError("c fails once")
        return {"items": ["c"]}

    app = _three_siblings(c).compile(store)
    first = app.run({}, run_id="r")
    assert first.status == ("waiting" if stop == "approval" else "failed")
    kept = {w.task_id: w.value for w in store.get("r").writes if w.channel == "items"}
    assert kept == {"0:a:0": ["a"], "0:b:0": ["b"]}
    if stop == "approval":
        store.decide("r", first.interrupt.step_id, True)
    fail["on"] = False
    assert app.run(None, run_id="r").state["items"] == ["a", "b", "c"]


def test_an_in_place_reducer_leaves_the_streamed_updates_as_the_nodes_returned_them(store):
    app = _three_siblings(lambda s, ctx: {"items": ["c"]}).compile(store)
    [step] = app.stream({}, run_id="r")
    assert step.updates == [("a", {"items": ["a"]}), ("b", {"items": ["b"]}),
                            ("c", {"items": ["c"]})]
    assert app.state("r").state["items"] == ["a", "b", "c"]


@pytest.mark.parametrize("wrap", [lambda msgs: msgs, lambda msgs: {"history": msgs},
                                  lambda msgs: [("kept", msgs)]],
                         ids=["the-list", "nested-in-a-dict", "nested-in-a-list"])
def test_a_channel_set_to_the_states_append_list_keeps_what_the_node_saw(store, wrap):
    """`{"snap": state["msgs"]}` aliased the state's Append list: apply extended it in
    place, so the stored snapshot held the superstep's own new item and the value in
    memory grew with every later one (a resumed run, which reads the store, saw another
    value: its recorded step then conflicted)."""
    seen = []

    def agent(state, ctx):
        n = state["n"]
        seen.append(state["snap"])
        upd = {"msgs": [f"m{n}"], "n": n + 1}
        if n == 1:
            upd["snap"] = wrap(state["msgs"])
        return upd

    g = durkv.Graph({"msgs": durkv.Append(), "snap": durkv.Last(None), "n": durkv.Last(0)})
    g.add_node("agent", agent)
    g.add_edge(durkv.START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["n"] < 4 else durkv.END)
    app = g.compile(store)
    res = app.run({"msgs": ["hi"]}, run_id="r")
    snap = wrap(["hi", "m0"])
    assert res.state["snap"] == snap and seen[2:] == [snap, snap]
    assert res.state["msgs"] == ["hi", "m0", "m1", "m2", "m3"]
    assert [s.state["snap"] for s in app.history("r")] == [snap] * 3 + [None] * 2
    assert app.state("r").state == res.state


def test_a_function_channel_set_to_another_channels_value_is_not_edited_by_its_reducer(
        store):
    """The same alias through an in-place function reducer (``operator.iadd``)."""
    import operator

    def agent(state, ctx):
        n = state["n"]
        upd = {"log": [f"l{n}"], "n": n + 1}
        if n == 1:
            upd["snap"] = state["log"]
        return upd

    g = durkv.Graph({"log": operator.iadd, "snap": durkv.Last(None), "n": durkv.Last(0)})
    g.add_node("agent", agent)
    g.add_edge(durkv.START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["n"] < 3 else durkv.END)
    app = g.compile(store)
    res = app.run({"log": []}, run_id="r")
    assert res.state == {"log": ["l0", "l1", "l2"], "snap": ["l0"], "n": 3}
    assert app.state("r").state == res.state


def test_a_snapshot_of_an_append_list_replays_the_same_after_a_crash(store):
    """The reproducer of the review: a step fed with the snapshot, cut after it was
    recorded, resumed -- the same input, not an IdempotencyConflictError."""
    crash = {"on": True}

    def agent(state, ctx):
        n = state["n"]
        upd = {"msgs": [f"m{n}"], "n": n + 1}
        if n == 1:
            upd["snap"] = state["msgs"]
        if n == 3:
            ctx.step("summarize", len, state["snap"])
            if crash["on"]:
                raise RuntimeError("crash after the step was recorded")
        return upd

    g = durkv.Graph({"msgs": durkv.Append(), "snap": durkv.Last(None), "n": durkv.Last(0)})
    g.add_node("agent", agent)
    g.add_edge(durkv.START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["n"] < 5 else durkv.END)
    app = g.compile(store)
    assert app.run({"msgs": ["hi"]}, run_id="r").status == "failed"
    crash["on"] = False
    res = app.run(None, run_id="r")
    assert (res.status, res.state["snap"]) == ("finished", ["hi", "m0"])


def test_a_reducer_returning_the_nodes_update_does_not_hand_it_to_the_next_fold(store):
    """``merge`` returns ``b`` itself while the channel is empty, and edits ``a`` in place
    after: the next sibling's fold edited node a's own dict, its kept pending write."""
    def merge(a, b):
        if not a:
            return b
        a.update(b)
        return a

    g = durkv.Graph({"cfg": merge})
    g.add_node("a", lambda s, ctx: {"cfg": {"a": 1}})
    g.add_node("b", lambda s, ctx: {"cfg": {"b": 2}})
    g.add_node("c", lambda s, ctx: ctx.approve("go") and {"cfg": {"c": 3}})
    for n in "abc":
        g.add_edge(durkv.START, n)
    app = g.compile(store)
    first = app.run({"cfg": {}}, run_id="r")
    kept = {w.task_id: w.value for w in store.get("r").writes if w.channel == "cfg"}
    assert kept == {"0:a:0": {"a": 1}, "0:b:0": {"b": 2}}
    store.decide("r", first.interrupt.step_id, True)
    assert app.run(None, run_id="r").state == {"cfg": {"a": 1, "b": 2, "c": 3}}


def _x_graph(x_reducer):
    append = isinstance(x_reducer, durkv.Append)
    g = durkv.Graph({"x": x_reducer, "n": durkv.Last(0)})
    g.add_node("a", lambda s, ctx: {"x": [s["n"]] if append else s["n"], "n": s["n"] + 1})
    g.add_edge(durkv.START, "a")
    g.add_conditional_edges("a", lambda s: "a" if s["n"] < 3 else durkv.END)
    return g


def test_a_channel_whose_reducer_changed_under_a_run_fails_it_and_recover_goes_on(store):
    """A deploy turned channel x from Last into Append under the same name: resuming the
    run raised a raw AttributeError from the fold ('int' has no 'extend'), and
    app.recover() stopped there, leaving the other runs unresumed."""
    it = _x_graph(durkv.Last(0)).compile(store, name="agent").stream({}, run_id="old")
    next(it)
    it.close()      # a run cut mid-flight under the old graph: x holds an int
    app = _x_graph(durkv.Append()).compile(store, name="agent")
    it = app.stream({}, run_id="new")
    next(it)
    it.close()
    got = {r.run_id: r for r in app.recover()}
    assert got["new"].status == "finished" and got["new"].state["x"] == [0, 1, 2]
    assert got["old"].status == "failed" and isinstance(got["old"].error, GraphError)
    assert "channel 'x'" in got["old"].message and "name=" in got["old"].message
    assert app.state("old").status == "failed"
    with pytest.raises(GraphError, match="channel 'x' is a durkv.Append.*reducer changed"):
        app.run(None, run_id="old")
    assert _x_graph(durkv.Last(0)).compile(store, name="agent").run(
        None, run_id="old").state == {"x": 2, "n": 3}       # the old code finishes it


def test_a_pending_write_that_no_longer_fits_its_channel_is_a_graph_error(store):
    g = durkv.Graph({"x": durkv.Last(0)})
    g.add_node("a", lambda s, ctx: {"x": 5})
    g.add_node("b", lambda s, ctx: ctx.approve("go") and None)
    for n in "ab":
        g.add_edge(durkv.START, n)
    first = g.compile(store, name="agent").run({}, run_id="r")
    store.decide("r", first.interrupt.step_id, True)
    g2 = durkv.Graph({"x": durkv.Append()})
    g2.add_node("a", lambda s, ctx: {"x": [5]})
    g2.add_node("b", lambda s, ctx: None)
    for n in "ab":
        g2.add_edge(durkv.START, n)
    with pytest.raises(GraphError, match="channel 'x'.*pending write of task 0:a:0"):
        g2.compile(store, name="agent").run(None, run_id="r")


class _Killed(BaseException):
    """A kill -9 inside a tool call: neither a receipt nor an error is journaled."""


@pytest.mark.parametrize("done", [True, False])
def test_an_at_most_once_tool_in_doubt_pauses_the_run_until_it_is_resolved(store, done):
    """It listed as `failed` (durkv runs --status in_doubt missed it), and after
    `durkv resolve` app.recover() passed it by as failed instead of resuming it."""
    kill, paid = {"on": True}, []

    @durkv.tool(version="1", at_most_once=True, name="pay")
    def pay(amount, *, idempotency_key):
        if kill["on"]:
            raise _Killed()
        paid.append(idempotency_key)
        return f"paid {amount}"

    g = durkv.Graph({"out": durkv.Last(None), "other": durkv.Last(0)})
    g.add_node("n", lambda s, ctx: {"out": ctx.tool(pay, 10)})
    g.add_node("m", lambda s, ctx: {"other": 1})
    for n in "mn":
        g.add_edge(durkv.START, n)
    app = g.compile(store)
    with pytest.raises(_Killed):
        app.run({}, run_id="r")
    kill["on"] = False
    res = app.run(None, run_id="r")
    assert (res.status, res.in_doubt) == ("in_doubt", ["0:n:0:0"])
    assert "store.resolve('r', '0:n:0:0'" in res.message
    assert [(i.status, i.step) for i in store.runs()] == [("in_doubt", "0:n:0:0")]
    length = store.journal_length("r")
    assert app.run(None, run_id="r").status == "in_doubt"      # nothing runs before
    assert [r.status for r in app.recover()] == ["in_doubt"]
    assert app.state("r").status == "in_doubt" and store.journal_length("r") == length
    store.resolve("r", "0:n:0:0", done=done, result="paid 10" if done else None)
    assert app.state("r").status == "running"
    [res] = app.recover()
    assert res.status == "finished" and res.state == {"out": "paid 10", "other": 1}
    assert paid == ([] if done else ["r:0:n:0:0"])


def test_a_durable_sleeps_wake_time_is_not_pushed_back_by_its_siblings(store):
    """The pause said `now + left` at the barrier, `now` after the siblings' work: a node
    that slept 0.3 s next to a 1 s sibling was reported sleeping until t0 + 1.3 s, and
    app.run at t0 + 1 s ran nothing."""
    def napper(state, ctx):
        ctx.sleep(0.3)
        return {"x": 1}

    def worker(state, ctx):
        time.sleep(1.0)         # e.g. a slow model call

    g = durkv.Graph({"x": durkv.Last(0)})
    g.add_node("napper", napper)
    g.add_node("worker", worker)
    for n in ("napper", "worker"):
        g.add_edge(durkv.START, n)
    app = g.compile(store)
    t0 = time.time()
    res = app.run({}, run_id="r")
    assert res.status == "sleeping" and t0 + 0.3 <= res.until < t0 + 0.8
    assert store.runs()[0].until == res.until
    assert time.time() > res.until      # the sibling's second is past its wake time
    assert app.run(None, run_id="r").state == {"x": 1}


def test_a_node_running_a_sub_run_of_its_app_wider_than_the_pool_does_not_deadlock(store):
    """Each outer Send worker held a pool thread while it waited for its sub-run's
    parallel tasks, queued on that same pool: with the fan-out wider than the pool,
    every worker waited and no task ran."""
    holder = {}
    g = durkv.Graph({"topic": durkv.Last(""), "depth": durkv.Last(0), "notes": durkv.Append()})
    g.add_node("plan", lambda s, ctx: None)

    def research(arg, ctx):
        topic, depth = arg
        if depth >= 1:
            return {"notes": [topic]}
        sub = holder["app"].run({"topic": topic, "depth": depth + 1},
                                run_id=f"{ctx.run_id}/{topic}")
        return {"notes": sub.state["notes"]}

    g.add_node("research", research)
    g.add_edge(durkv.START, "plan")
    g.add_conditional_edges("plan", lambda s: [
        durkv.Send("research", (f"{s['topic']}.{i}", s["depth"])) for i in range(3)])
    app = holder["app"] = g.compile(store, max_workers=2)
    got = {}
    t = threading.Thread(target=lambda: got.update(
        res=app.run({"topic": "t", "depth": 0}, run_id="root")), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "deadlocked: every pool thread waits for a queued task"
    assert got["res"].state["notes"] == [f"t.{i}.{j}" for i in range(3) for j in range(3)]
    app.close()


def test_a_run_of_another_graph_name_names_the_compile_that_resumes_it(store):
    """A deploy added a node to a graph compiled under its default name: the refusal said
    only "use another run id", not the fix -- compile under the run's old name."""
    def build(extra):
        g = durkv.Graph({"x": durkv.Last(0)})
        g.add_node("a", lambda s, ctx: ctx.approve("go") and {"x": 1})
        g.add_edge(durkv.START, "a")
        if extra:
            g.add_node("audit", lambda s, ctx: None)
            g.add_edge("a", "audit")
        return g

    first = build(False).compile(store).run({}, run_id="t-7")
    store.decide("t-7", first.interrupt.step_id, True)
    with pytest.raises(RunConflictError,
                       match=r"g\.compile\(store, name='graph:a\|x'\)") as e:
        build(True).compile(store).run(None, run_id="t-7")
    assert e.value.context["graph"] == "graph:a|x"
    res = build(True).compile(store, name="graph:a|x").run(None, run_id="t-7")
    assert res.status == "finished" and res.state == {"x": 1}


def test_keyless_ctx_calls_from_a_second_thread_of_a_task_are_refused(tmp_path):
    # a node making its tool calls from a thread pool: the automatic ids went to whichever
    # thread asked first, and a resume in which the threads asked in the other order
    # failed the run with IdempotencyConflictError, depending on timing
    from concurrent.futures import ThreadPoolExecutor

    called = []

    @durkv.tool(name="search")
    def search(q, *, idempotency_key):
        called.append(q)
        return f"results for {q}"

    def build(keyed):
        g = durkv.Graph({"out": durkv.Append()})

        def research(state, ctx):
            first = ctx.tool(search, "own")         # the task's own thread binds it
            with ThreadPoolExecutor(2) as pool:
                more = list(pool.map(lambda q: ctx.tool(search, q, key=q if keyed else None),
                                     ["a", "b"]))
            return {"out": [first, *more]}

        g.add_node("research", research)
        g.add_edge(durkv.START, "research")
        g.add_edge("research", durkv.END)
        return g

    with durkv.open(str(tmp_path / "s.durkv")) as st:
        r = build(False).compile(st, name="g").run({}, run_id="r")
        assert r.status == "failed" and isinstance(r.error, ConfigError)
        assert "second thread of the task" in str(r.error) and "key=" in str(r.error)
        assert called == ["own"]                    # nothing else was called
        r = build(True).compile(st, name="g").run({}, run_id="keyed")
        assert r.status == "finished" and r.state["out"] == [
            "results for own", "results for a", "results for b"]


def test_bad_node_signatures_and_path_maps_are_refused_at_compile_or_named(tmp_path):
    def graph(node=lambda s, ctx: {}):
        g = durkv.Graph({"x": durkv.Last(0)})
        g.add_node("a", node)
        g.add_edge(durkv.START, "a")
        return g

    with durkv.open(str(tmp_path / "s.durkv")) as st:
        # a keyword-only ctx, a third argument: a TypeError in the first superstep before
        for node, what in ((lambda s, *, ctx: {}, r"keyword-only parameter\(s\) ctx"),
                           (lambda s, c, extra: {}, "needs 3 arguments")):
            with pytest.raises(GraphError, match=what):
                graph(node).compile(st)
        with pytest.raises(GraphError, match="path_map of the router"):     # a raw TypeError
            graph().add_conditional_edges("a", lambda s: "b", [["b"]])
        g = graph()
        g.add_conditional_edges("a", lambda s: ["a"], {"x": durkv.END})
        # it said 'a' is not a node of the graph, whose one node is 'a'
        with pytest.raises(GraphError, match="'a' is not a key of its path_map"):
            g.compile(st, name="pm").run({}, run_id="pm")


def test_a_loop_of_plain_edges_is_refused_at_compile(tmp_path):
    # a -> b -> a with no router: compile took it, and a run wrote max_supersteps
    # (10,000) checkpoints before its GraphError
    def graph(routed):
        g = durkv.Graph({"n": durkv.Last(0)})
        g.add_node("a", lambda s, ctx: {"n": s["n"] + 1})
        g.add_node("b", lambda s, ctx: {"n": s["n"] + 1})
        g.add_edge(durkv.START, "a")
        g.add_edge("a", "b")
        if routed:
            g.add_conditional_edges("b", lambda s: durkv.END if s["n"] > 3 else "a")
        else:
            g.add_edge("b", "a")
        return g

    with durkv.open(str(tmp_path / "s.durkv")) as st:
        with pytest.raises(GraphError, match="a -> b -> a form a loop no router can leave"):
            graph(routed=False).compile(st)
        assert graph(routed=True).compile(st).run({}, run_id="r").state["n"] == 4
