"""durkv.Graph: reducers, Send fan-out, failures and resume, approvals, durable sleep, fork,
bad graphs and updates, max_supersteps, async nodes, stream/state/history (issue 18)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter

import pytest
from click.testing import CliRunner

import durkv
import durkv.log
from durkv.cli import cli
from durkv.runtime.journal import E_STEP
from durkv.runtime.view import describe


@pytest.fixture
def store(tmp_path):
    with durkv.open(str(tmp_path / "g.durkv")) as s:
        yield s


def loop_graph(n=3, calls=None):
    """agent appends a model reply until count == n."""
    calls = calls if calls is not None else Counter()
    g = durkv.Graph({"messages": durkv.Append(), "count": durkv.Last(0)})

    def model(m):
        calls["model"] += 1
        return m + "!"

    @g.node
    def agent(state, ctx):
        calls["agent"] += 1
        return {"messages": [ctx.step("model", model, state["messages"][-1])],
                "count": state["count"] + 1}

    g.add_edge(durkv.START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["count"] < n else durkv.END)
    return g, calls


# -- reducers ----------------------------------------------------------------------------------

def test_reducers_append_last_and_a_user_function_fold_in_task_order(store):
    g = durkv.Graph({"log": durkv.Append(), "last": durkv.Last("none"),
                     "total": lambda old, new: old + new, "seen": lambda a, b: a | b})
    for name in ("c", "a", "b"):        # added out of order: the barrier sorts by name
        g.add_node(name, lambda state, ctx, name=name: {
            "log": [name], "last": name, "total": 10, "seen": {name}})
        g.add_edge(durkv.START, name)
    res = g.compile(store).run({"total": 1, "seen": set()}, run_id="r")
    assert res.status == "finished" and res.step == 1
    assert res.state["log"] == ["a", "b", "c"]       # node name order, every run
    assert res.state["last"] == "c"                  # the last in task order wins
    assert res.state["total"] == 31                  # the input, then fn(old, new) per update
    assert res.state["seen"] == {"a", "b", "c"}
    assert g.compile(store).state("r").state == res.state      # read back from the store


def test_a_user_reducer_without_a_value_takes_the_first_update_as_is(store):
    g = durkv.Graph({"xs": lambda a, b: a + b})
    g.add_node("n", lambda s, ctx: {"xs": (1,)})
    g.add_edge(durkv.START, "n")
    assert g.compile(store).run({}, run_id="r").state["xs"] == (1,)


def test_append_channel_is_stored_as_deltas_o_n_bytes(tmp_path):
    item = "x" * 200
    n = 1500

    def grow(state, ctx):
        return {"log": [item + str(len(state["log"]))]}

    g = durkv.Graph({"log": durkv.Append()})
    g.add_node("grow", grow)
    g.add_edge(durkv.START, "grow")
    g.add_conditional_edges("grow", lambda s: "grow" if len(s["log"]) < n else durkv.END)
    with durkv.open(str(tmp_path / "a.durkv"), durability="exit") as store:
        res = g.compile(store, max_supersteps=n + 1).run({}, run_id="r")
        assert len(res.state["log"]) == n
        kinds = Counter(e.kind for e in store.channel_entries("r", "", "log"))
        assert kinds["append"] >= n - 2            # each superstep wrote only its new item
        store.flush()
        size = store.size_bytes()
    # O(N): a full copy per superstep would be ~n/2 times the payload
    assert size < 3 * n * len(item), size


def test_the_state_never_holds_the_callers_objects(store):
    given = ["a"]
    out = []

    def node(state, ctx):
        out.append(["b"])
        return {"log": out[-1]}

    g = durkv.Graph({"log": durkv.Append()})
    g.add_node("n", node)
    g.add_edge(durkv.START, "n")
    res = g.compile(store).run({"log": given}, run_id="r")
    given.append("caller edit")
    out[-1].append("node edit")
    assert res.state["log"] == ["a", "b"]
    assert g.compile(store).state("r").state["log"] == ["a", "b"]


# -- Send fan-out, parallel tasks ------------------------------------------------------------

def test_send_fan_out_runs_workers_in_parallel_and_folds_in_send_order(store):
    g = durkv.Graph({"results": durkv.Append(), "n": durkv.Last(0)})
    g.add_node("plan", lambda s, ctx: {"n": 6})
    threads = set()
    spans = []

    def worker(i, ctx):
        threads.add(threading.get_ident())
        t = time.monotonic()
        time.sleep(0.2 if i == 0 else 0.05)     # the first finishes last
        spans.append((t, time.monotonic()))
        return {"results": [ctx.step("work", lambda x: x * x, i)]}

    g.add_node("worker", worker)
    g.add_edge(durkv.START, "plan")
    g.add_conditional_edges("plan", lambda s: [durkv.Send("worker", i) for i in range(s["n"])])
    res = g.compile(store).run({}, run_id="fan")
    # not one after the other: some two workers were sleeping at the same time (a witness
    # that holds however loaded the machine is, unlike a bound on the wall clock)
    spans.sort()
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
    assert len(threads) > 1
    assert res.state["results"] == [0, 1, 4, 9, 16, 25]     # Send index order
    sids = [e.step_id for e in describe(store, "fan") if e.kind == "step"]
    assert sorted(sids) == [f"1:worker:{i}:0" for i in range(6)]


def test_a_failing_node_among_siblings_keeps_their_updates_and_resume_reruns_only_it(store):
    calls = Counter()
    flaky = {"fail": True}

    def make(name):
        def node(state, ctx):
            calls[name] += 1
            v = ctx.step("model", lambda: f"{name}-model")
            if name == "b" and flaky["fail"]:
                raise ConnectionError("model service down")
            return {"log": [v]}
        return node

    g = durkv.Graph({"log": durkv.Append()})
    for name in "abc":
        g.add_node(name, make(name))
        g.add_edge(durkv.START, name)
    app = g.compile(store)
    res = app.run({}, run_id="r")
    assert res.status == "failed" and isinstance(res.error, ConnectionError)
    assert "node 'b'" in res.message and "ConnectionError" in res.message
    assert app.state("r").status == "failed" and res.step == 0
    assert store.runs()[0].status == "failed"
    flaky["fail"] = False
    res = app.run(None, run_id="r")
    assert res.status == "finished"
    assert res.state["log"] == ["a-model", "b-model", "c-model"]
    assert calls == {"a": 1, "b": 2, "c": 1}       # only the failed task ran again
    steps = [r for r in store.journal("r") if r["e"] == E_STEP]
    assert len(steps) == 3                          # b's model call replayed, not re-made


def test_ids_are_the_same_on_every_execution_whatever_the_thread_timing(store):
    rounds = []
    for attempt in range(2):
        def worker(i, ctx, attempt=attempt):
            time.sleep(0.001 * ((i * 7 + attempt * 3) % 5))     # another order each time
            a = ctx.step("a", lambda: i)
            b = ctx.now()
            return {"out": [(a, b)]}
        g = durkv.Graph({"out": durkv.Append()})
        g.add_node("worker", worker)
        g.add_conditional_edges(durkv.START, lambda s: [durkv.Send("worker", i)
                                                        for i in range(8)])
        res = g.compile(store).run({}, run_id=f"r{attempt}")
        rounds.append((sorted(e.step_id for e in describe(store, f"r{attempt}")), res.state))
    assert rounds[0][0] == rounds[1][0]
    assert [a for a, _ in rounds[0][1]["out"]] == list(range(8))


# -- approvals, durable sleep ----------------------------------------------------------------

def test_approve_pauses_decide_from_anywhere_resume_reruns_only_the_paused_task(tmp_path):
    path = str(tmp_path / "a.durkv")
    calls = Counter()

    @durkv.tool(version="1")
    def send(body, *, idempotency_key):
        calls["send"] += 1
        return idempotency_key

    def agent(state, ctx):
        calls["agent"] += 1
        reply = ctx.step("model", lambda: calls.update(["model"]) or "draft")
        d = ctx.approve("send", {"body": reply})
        return {"sent": ctx.tool(send, reply) if d.approved else "rejected"}

    def side(state, ctx):
        calls["side"] += 1
        return {"side": "done"}

    g = durkv.Graph({"sent": durkv.Last(), "side": durkv.Last()})
    g.add_node("agent", agent)
    g.add_node("side", side)
    g.add_edge(durkv.START, "agent")
    g.add_edge(durkv.START, "side")
    with durkv.open(path) as store:
        app = g.compile(store)
        res = app.run({}, run_id="t")
        assert res.status == "waiting"
        p = res.interrupt
        assert (p.action, p.payload) == ("send", {"body": "draft"})
        assert app.run(None, run_id="t").status == "waiting"      # nothing decided yet
        assert calls == {"agent": 1, "model": 1, "side": 1}         # ... and nothing ran
        assert store.runs()[0].status == "waiting"
    with durkv.open(path) as other:                 # another handle decides
        other.decide("t", p.step_id, True, by="ops")
    with durkv.open(path) as store:
        res = g.compile(store).run(None, run_id="t")
        assert res.status == "finished"
        assert res.state == {"sent": f"t:{p.step_id[:-1]}2", "side": "done"}
        assert calls == {"agent": 2, "model": 1, "side": 1, "send": 1}
        assert g.compile(store).run(None, run_id="t").state == res.state
        assert calls["agent"] == 2                  # finished: nothing ran


def test_durable_sleep_pauses_the_run_and_resumes_after_its_wake_time(store):
    calls = Counter()

    def nap(state, ctx):
        calls["nap"] += 1
        ctx.step("before", lambda: calls.update(["before"]))
        ctx.sleep(2.0)      # long enough that a loaded host cannot pass the wake time below
        return {"done": True}

    g = durkv.Graph({"done": durkv.Last(False)})
    g.add_node("nap", nap)
    g.add_edge(durkv.START, "nap")
    app = g.compile(store)
    t0 = time.monotonic()
    res = app.run({}, run_id="s")
    assert time.monotonic() - t0 < 1.0              # paused, not blocked for the 2 s
    assert res.status == "sleeping" and res.until > time.time()
    assert store.runs()[0].status == "sleeping"
    assert app.run(None, run_id="s").status == "sleeping"
    assert calls == {"nap": 1, "before": 1}         # before the wake time: nothing ran
    assert app.recover()[0].status == "sleeping"
    time.sleep(max(0.0, res.until - time.time()) + 0.01)
    [res] = app.recover()
    assert res.status == "finished" and res.state == {"done": True}
    assert calls == {"nap": 2, "before": 1}


def test_wait_true_sleeps_in_process(store):
    g = durkv.Graph({"t": durkv.Last()})
    g.add_node("nap", lambda s, ctx: ctx.sleep(0.2) or {"t": "woke"})
    g.add_edge(durkv.START, "nap")
    t0 = time.monotonic()
    res = g.compile(store).run({}, run_id="w", wait=True)
    assert res.status == "finished" and time.monotonic() - t0 >= 0.2


# -- run ids, resume, fork -------------------------------------------------------------------

def test_finished_run_returns_its_result_and_other_input_conflicts(store):
    g, calls = loop_graph()
    app = g.compile(store)
    res = app.run({"messages": ["hi"]}, run_id="r")
    assert calls["agent"] == 3
    assert app.run({"messages": ["hi"]}, run_id="r").state == res.state
    assert app.run(None, run_id="r").state == res.state
    assert calls["agent"] == 3
    with pytest.raises(durkv.RunConflictError):
        app.run({"messages": ["other"]}, run_id="r")
    with pytest.raises(durkv.NotFoundError):
        app.run(None, run_id="nope")
    store.put("lg", "", "1", checkpoint={}, metadata={}, values={}, versions={})
    with pytest.raises(durkv.RunConflictError, match="no durkv.Graph"):
        app.run(None, run_id="lg")


def test_fork_starts_a_new_run_from_a_checkpoint(store):
    g, calls = loop_graph(n=4)
    app = g.compile(store)
    app.run({"messages": ["x"]}, run_id="r")
    snap = [s for s in app.history("r") if s.step == 2][0]
    assert snap.state["count"] == 2 and snap.next == [["agent"]]
    fork = app.fork("r", snap.checkpoint_id, "r2")
    assert fork.state == snap.state
    res = app.run(None, run_id="r2")
    assert res.status == "finished" and res.state == app.state("r").state
    assert calls["model"] == 4 + 2                  # the fork ran its two supersteps again
    with pytest.raises(durkv.RunConflictError):
        app.fork("r", snap.checkpoint_id, "r2")


def test_stream_state_and_history(store):
    g, _ = loop_graph()
    app = g.compile(store)
    steps = list(app.stream({"messages": ["a"]}, run_id="r"))
    assert [s.step for s in steps] == [1, 2, 3]
    assert steps[0].updates == [("agent", {"messages": ["a!"], "count": 1})]
    st = app.state("r")
    assert st.status == "finished" and st.step == 3 and st.checkpoint_id == steps[-1].checkpoint_id
    hist = list(app.history("r"))
    assert [h.step for h in hist] == [3, 2, 1, 0]
    assert hist[-1].state == {"messages": ["a"], "count": 0}
    assert hist[0].finished and not hist[1].finished


# -- bad graphs, bad updates, runaway loops --------------------------------------------------

def test_bad_graphs_are_refused_at_compile_time(store):
    def build(edges=(), routers=(), nodes=("a",)):
        g = durkv.Graph({"x": durkv.Last()})
        for n in nodes:
            g.add_node(n, lambda s, ctx: None)
        for e in edges:
            g.add_edge(*e)
        for src, r, pm in routers:
            g.add_conditional_edges(src, r, pm)
        return g

    with pytest.raises(durkv.GraphError, match="no entry"):
        build(edges=[("a", durkv.END)]).compile(store)
    with pytest.raises(durkv.GraphError, match="'zz', which is not a node"):
        build(edges=[(durkv.START, "a"), ("a", "zz")]).compile(store)
    with pytest.raises(durkv.GraphError, match="leaves 'ghost'"):
        build(edges=[(durkv.START, "a"), ("ghost", "a")]).compile(store)
    with pytest.raises(durkv.GraphError, match="b cannot be reached"):
        build(edges=[(durkv.START, "a")], nodes=("a", "b")).compile(store)
    with pytest.raises(durkv.GraphError, match="'nope', which is not a node"):
        build(edges=[(durkv.START, "a")],
              routers=[("a", lambda s: "a", ["a", "nope"])]).compile(store)
    with pytest.raises(durkv.GraphError, match="already in the graph"):
        build(nodes=("a", "a"))
    with pytest.raises(durkv.GraphError, match="part of step ids"):
        build(nodes=("a:b",))
    with pytest.raises(durkv.GraphError, match="not a reducer"):
        durkv.Graph({"x": 3})
    with pytest.raises(durkv.GraphError, match="use durkv.Append()"):
        durkv.Graph({"x": durkv.Append})
    # a router without a path_map may lead anywhere: b is not provably unreachable
    build(edges=[(durkv.START, "a")], routers=[("a", lambda s: durkv.END, None)],
          nodes=("a", "b")).compile(store)


def test_a_router_returning_an_unknown_name_names_the_router_and_the_value(store):
    g = durkv.Graph({"x": durkv.Last(0)})
    g.add_node("a", lambda s, ctx: {"x": 1})

    def pick_next(state):
        return "sumarize"

    g.add_edge(durkv.START, "a")
    g.add_conditional_edges("a", pick_next)
    app = g.compile(store)
    with pytest.raises(durkv.GraphError, match="router .*pick_next.* returned 'sumarize'"):
        app.run({}, run_id="r")
    st = app.state("r")
    assert st.step == 0 and st.status == "failed"       # the superstep is not committed
    assert "sumarize" in st.message
    assert store.runs()[0].status == "failed"


@pytest.mark.parametrize("update, match", [
    ({"nope": 1}, "node 'bad' has key 'nope'"),
    ({"log": "not a list"}, "node 'bad': channel 'log' is a durkv.Append"),
    ({"total": "x"}, "node 'bad': the reducer .* of channel 'total' refused"),
    (["log"], "node 'bad' returned list"),
])
def test_a_bad_update_names_node_and_key_and_commits_nothing(store, update, match):
    calls = Counter()

    def good(state, ctx):
        calls["good"] += 1
        return {"log": ["good"], "total": 1}

    g = durkv.Graph({"log": durkv.Append(), "total": lambda a, b: a + b})
    g.add_node("good", good)
    g.add_node("bad", lambda s, ctx: update)
    g.add_edge(durkv.START, "good")
    g.add_edge(durkv.START, "bad")
    app = g.compile(store)
    with pytest.raises(durkv.GraphError, match=match):
        app.run({"total": 0}, run_id="r")
    st = app.state("r")
    assert st.step == 0 and st.state == {"log": [], "total": 0} and st.status == "failed"
    assert len(list(store.history("r"))) == 1
    # the sibling's update was kept: fixing nothing and resuming does not run it again
    with pytest.raises(durkv.GraphError):
        app.run(None, run_id="r")
    assert calls["good"] == 1


def test_an_input_with_an_unknown_channel_is_refused_before_anything_is_written(store):
    g, _ = loop_graph()
    with pytest.raises(durkv.GraphError, match="the input has key 'msgs'"):
        g.compile(store).run({"msgs": ["hi"]}, run_id="r")
    assert store.threads() == []


def test_max_supersteps_ends_a_runaway_loop_naming_the_active_nodes(store):
    g = durkv.Graph({"n": durkv.Last(0)})
    g.add_node("spin", lambda s, ctx: {"n": s["n"] + 1})
    g.add_edge(durkv.START, "spin")
    # a router that never says END (a plain edge back is refused at compile)
    g.add_conditional_edges("spin", lambda s: "spin")
    app = g.compile(store, max_supersteps=50)
    with pytest.raises(durkv.GraphError, match="max_supersteps=50 with nodes spin"):
        app.run({}, run_id="r")
    st = app.state("r")
    assert st.state["n"] == 50 and st.status == "failed"    # the work so far is committed
    [res] = app.recover()                # failed: passed by, and the other runs would go on
    assert res.status == "failed" and app.state("r").state["n"] == 50
    with pytest.raises(durkv.GraphError, match="max_supersteps=60"):
        app.run(None, run_id="r", max_supersteps=60)
    assert app.state("r").state["n"] == 60


# -- async nodes -----------------------------------------------------------------------------

def _async_graph(calls):
    g = durkv.Graph({"out": durkv.Append(), "n": durkv.Last(0)})

    async def model(x):
        await asyncio.sleep(0.01)
        calls["model"] += 1
        return x * 10

    async def agent(state, ctx):
        a, b = await asyncio.gather(ctx.astep("m", model, 1), ctx.astep("m", model, 2))
        return {"out": [a, b], "n": state["n"] + 1}

    async def worker(i, ctx):
        return {"out": [await ctx.astep("w", model, i, key="w")]}

    g.add_node("agent", agent)
    g.add_node("worker", worker)
    g.add_edge(durkv.START, "agent")
    g.add_conditional_edges("agent", lambda s: [durkv.Send("worker", i) for i in range(3)]
                            + (["agent"] if s["n"] < 2 else []))
    return g


def test_async_nodes_under_run_and_arun(store):
    calls = Counter()
    g = _async_graph(calls)
    app = g.compile(store)
    res = app.run({}, run_id="sync-driver")
    expect = [10, 20, 10, 20, 0, 10, 20, 0, 10, 20]   # agent before its Sends, by name
    assert res.status == "finished" and res.state["out"] == expect
    res2 = asyncio.run(app.arun({}, run_id="async-driver"))
    assert res2.state == res.state
    ids = sorted(e.step_id for e in describe(store, "async-driver"))
    assert ids[:3] == ["0:agent:0:0", "0:agent:0:1", "1:agent:0:0"]
    assert "1:worker:0:w" in ids


# -- the store sees ordinary threads and journals --------------------------------------------

def test_runs_are_ordinary_threads_and_journals(tmp_path):
    path = str(tmp_path / "o.durkv")
    g, _ = loop_graph(n=20)
    with durkv.open(path) as store:
        app = g.compile(store)
        app.run({"messages": ["a"]}, run_id="r")
        assert store.threads() == ["r"]
        assert [r.status for r in store.runs()] == ["finished"]
        store.compact()
        assert app.state("r").state["count"] == 20
    assert durkv.log.verify(path, deep=True).ok
    runner = CliRunner()
    for args in (["ls", path], ["history", path, "r"], ["show", path, "r"],
                 ["verify", path]):
        out = runner.invoke(cli, [*args, "--json"])
        assert out.exit_code == 0, (args, out.output)
    hist = json.loads(runner.invoke(cli, ["history", path, "r", "--json"]).output)
    assert hist["checkpoints"][0]["checkpoint_id"] == "000000000020"
    assert hist["checkpoints"][0]["metadata"]["step"] == 20


def test_a_resume_reads_only_the_journal_since_its_checkpoint(store):
    """O(1) resume: the journal records of committed supersteps are not read again."""
    g = durkv.Graph({"n": durkv.Last(0)})

    def agent(state, ctx):
        ctx.step("model", lambda: 1)
        if state["n"] == 300:
            ctx.approve("go")
        return {"n": state["n"] + 1}

    g.add_node("agent", agent)
    g.add_edge(durkv.START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["n"] < 301 else durkv.END)
    app = g.compile(store, max_supersteps=1000)
    res = app.run({}, run_id="r")
    assert res.status == "waiting" and len(store.journal("r")) > 300
    store.decide("r", res.interrupt.step_id, True)
    read = []
    real = store.journal

    def counting(run_id, *, start=0):
        out = real(run_id, start=start)
        read.append(len(out))
        return out

    store.journal = counting
    assert app.run(None, run_id="r").status == "finished"
    assert 0 < sum(read) < 20, read


def test_one_driver_per_run_and_recover_skips_a_run_driven_elsewhere(store):
    inside, release = threading.Event(), threading.Event()

    def slow(state, ctx):
        inside.set()
        release.wait(10)
        return {"n": 1}

    g = durkv.Graph({"n": durkv.Last(0)})
    g.add_node("slow", slow)
    g.add_edge(durkv.START, "slow")
    app = g.compile(store)
    first = []
    t = threading.Thread(target=lambda: first.append(app.run({}, run_id="r")))
    t.start()
    assert inside.wait(10)
    with pytest.raises(durkv.RunBusyError):
        app.run(None, run_id="r")
    assert app.recover() == []              # driven by the thread: skipped
    release.set()
    t.join()
    assert first[0].status == "finished" and app.state("r").state == {"n": 1}


def test_the_journal_shows_the_graph_runs_status(store):
    g, _ = loop_graph()
    app = g.compile(store)
    app.run({"messages": ["a"]}, run_id="done")
    g2 = durkv.Graph({"n": durkv.Last(0)})
    g2.add_node("boom", lambda s, ctx: 1 / 0)
    g2.add_edge(durkv.START, "boom")
    res = g2.compile(store).run({}, run_id="failed")
    assert res.status == "failed" and isinstance(res.error, ZeroDivisionError)
    runs = {r.run_id: r for r in store.runs()}
    assert runs["done"].status == "finished"
    assert runs["failed"].status == "failed" and "ZeroDivisionError" in runs["failed"].message
    # a failed run is not re-run by recover (resume it explicitly)
    assert [r.status for r in g2.compile(store).recover()] == ["failed"]


def test_arun_runs_plain_nodes_off_the_loop(store):
    """Under app.arun a blocking plain node runs in a worker thread: two runs on one loop
    overlap instead of taking turns."""
    g = durkv.Graph({"n": durkv.Last(0)})
    inside: list[int] = [0]     # blocking nodes sleeping right now
    most = [0]
    count = threading.Lock()

    def blocking(state, ctx):
        with count:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.15)
        with count:
            inside[0] -= 1
        return {"n": state["n"] + 1}

    g.add_node("blocking", blocking)
    g.add_edge(durkv.START, "blocking")
    g.add_conditional_edges("blocking", lambda s: "blocking" if s["n"] < 2 else durkv.END)
    app = g.compile(store)

    async def both():
        return await asyncio.gather(app.arun({}, run_id="a"), app.arun({}, run_id="b"))

    a, b = asyncio.run(both())
    assert a.state == b.state == {"n": 2}
    assert most[0] == 2         # both runs' nodes slept at once (taking turns: never 2)


def test_ctx_compensate_undoes_this_tasks_tools_newest_first_once(store):
    undone = []
    flaky = {"fail": True}

    def undo(result, *, idempotency_key):
        undone.append((result, idempotency_key))

    @durkv.tool(version="1", compensate=undo)
    def book(what, *, idempotency_key):
        return {"booked": what}

    def trip(state, ctx):
        ctx.tool(book, "flight")
        ctx.tool(book, "hotel")
        ctx.compensate()                 # the trip is off: undo both, newest first
        if flaky["fail"]:
            raise RuntimeError("crash after the undos")
        return {"done": True}

    g = durkv.Graph({"done": durkv.Last(False)})
    g.add_node("trip", trip)
    g.add_edge(durkv.START, "trip")
    app = g.compile(store)
    assert app.run({}, run_id="t").status == "failed"
    assert undone == [({"booked": "hotel"}, "t:0:trip:0:1.undo"),
                      ({"booked": "flight"}, "t:0:trip:0:0.undo")]
    flaky["fail"] = False
    assert app.run(None, run_id="t").status == "finished"
    assert len(undone) == 2              # replayed from their receipts: not undone twice


def test_a_run_whose_next_node_the_graph_no_longer_has_is_refused(store):
    g = durkv.Graph({"n": durkv.Last(0)})
    g.add_node("old", lambda s, ctx: ctx.approve("go") and {"n": 1})
    g.add_edge(durkv.START, "old")
    assert g.compile(store, name="agent").run({}, run_id="r").status == "waiting"
    g2 = durkv.Graph({"n": durkv.Last(0)})
    g2.add_node("new", lambda s, ctx: {"n": 2})
    g2.add_edge(durkv.START, "new")
    with pytest.raises(durkv.GraphError, match="node\\(s\\) old next"):
        g2.compile(store, name="agent").run(None, run_id="r")
    with pytest.raises(durkv.RunConflictError, match="graph:new\\|n"):
        g2.compile(store).run(None, run_id="r")     # another name: not this graph's run


def test_the_default_name_tells_graphs_of_the_same_nodes_and_other_channels_apart(store):
    def build(channels):
        g = durkv.Graph(channels)
        g.add_node("a", lambda s, ctx: ctx.approve("go") and {})
        g.add_edge(durkv.START, "a")
        return g
    assert build({"n": durkv.Last(0)}).compile(store).run({}, run_id="r").status == "waiting"
    with pytest.raises(durkv.RunConflictError):
        build({"m": durkv.Last(0)}).compile(store).run(None, run_id="r")


def test_recover_goes_on_past_a_run_whose_graph_breaks_its_contract(store):
    def node(state, ctx):
        ctx.approve("go")
        return {"route": state["route"]}

    g = durkv.Graph({"route": durkv.Last(durkv.END)})
    g.add_node("n", node)
    g.add_edge(durkv.START, "n")
    g.add_conditional_edges("n", lambda s: s["route"])
    app = g.compile(store)
    for rid, route in (("bad", "nowhere"), ("good", durkv.END)):
        res = app.run({"route": route}, run_id=rid)
        store.decide(rid, res.interrupt.step_id, True)
    got = {r.run_id: r for r in app.recover()}
    assert got["good"].status == "finished"
    assert got["bad"].status == "failed" and isinstance(got["bad"].error, durkv.GraphError)
    assert "nowhere" in got["bad"].message
    assert app.state("bad").status == "failed"
