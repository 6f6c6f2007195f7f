"""The run journal under hostile use (issue 15, items 2, 5, 12-17, 19).

Crash claims are made with a real SIGKILL of a child (hostile_agents.py); each runtime
test runs through a sync driver (``with store.run``) and an async one (``async with
store.arun``) where the verb has an async form.
"""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from hostile_agents import N_ITEMS, drive, fanout_agent, flaky_agent, pay_agent
from journal_agents import effects

import durkv
import durkv.log

AGENTS = Path(__file__).with_name("hostile_agents.py")
MODES = ["sync", "async"]


def _killed_child(path, work, agent: str, kill_at: str, mode: str) -> None:
    p = subprocess.run([sys.executable, str(AGENTS), str(path), str(work), agent, kill_at, mode],
                       capture_output=True, timeout=120)
    assert p.returncode == -9, f"the child was not killed at {kill_at}:\n{p.stderr.decode()}"


def _run(store, run_id, mode, agent, *args):
    return asyncio.run(drive(store, run_id, mode, agent, *args))


# -- item 2 (and 19): "not done" authorizes exactly one more call -----------------------------

@pytest.mark.parametrize("mode", MODES)
def test_not_done_authorizes_one_call_and_a_second_kill_is_in_doubt_again(tmp_path, mode):
    path, work = tmp_path / "s.durkv", str(tmp_path)
    _killed_child(path, work, "pay", "pay", mode)           # killed after the payment
    with durkv.open(str(path)) as s:
        with pytest.raises(durkv.InDoubtError) as ei:
            _run(s, "pay", mode, pay_agent, work)
        err = ei.value
        s.resolve("pay", "1", done=False, by="ops")         # the operator: it did not happen
    _killed_child(path, work, "pay", "pay", mode)           # the authorized call, killed again
    assert effects(work) == [("pay", "pay:1"), ("pay", "pay:1")]
    with durkv.open(str(path)) as s:
        for _ in range(2):      # in doubt again: never a third call without a new answer
            with pytest.raises(durkv.InDoubtError, match=r"store.resolve\('pay', '1'"):
                _run(s, "pay", mode, pay_agent, work)
        assert len(effects(work)) == 2
        assert [(r.status, r.step) for r in s.runs()] == [("in_doubt", "1")]
        s.resolve("pay", "1", done=True, result={"paid": 10}, by="ops")
        assert _run(s, "pay", mode, pay_agent, work) == {"paid": 10}
        assert len(effects(work)) == 2
        (_, pay) = s.run("pay").journal()
        assert (pay.state, pay.retry_count, pay.idempotency_key) == ("done", 1, "pay:1")
    assert durkv.log.verify(str(path), deep=True).ok
    assert (err.run_id, err.step_id, err.key) == ("pay", "1", "pay:1")    # item 19


# -- item 5: a decision and a resolution are final; a race has exactly one winner -------------

TRIALS = 200


def _race(*calls):
    """Run the calls in threads started together; each one's result or exception."""
    barrier = threading.Barrier(len(calls))
    out: list = [None] * len(calls)

    def go(i, fn):
        barrier.wait()
        try:
            out[i] = fn()
        except Exception as e:
            out[i] = e
    ts = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


@pytest.mark.parametrize("mode", MODES)
def test_two_racing_decisions_have_one_winner_and_the_run_acts_on_it(tmp_path, mode):
    with durkv.open(str(tmp_path / "s.durkv")) as s:
        runs = [f"r{i}" for i in range(TRIALS)]
        for rid in runs:
            with s.run(rid) as run:
                run.approve("send", {"to": rid})
        wins = Counter()
        for rid in runs:
            yes, no = _race(lambda: s.decide(rid, "0", True, by="ann"),
                            lambda: s.decide(rid, "0", False, by="bob"))
            won = [d for d in (yes, no) if isinstance(d, durkv.Decision)]
            lost = [e for e in (yes, no) if isinstance(e, Exception)]
            assert len(won) == 1 and len(lost) == 1, (yes, no)
            assert isinstance(lost[0], durkv.DecisionConflictError)
            assert "a decision is final" in str(lost[0])
            wins[won[0].approved] += 1

            async def approve(run):
                return await run.aapprove("send", {"to": rid})
            if mode == "async":
                async def ex():
                    async with s.arun(rid) as run:
                        return await approve(run)
                got = asyncio.run(ex())
            else:
                with s.run(rid) as run:
                    got = run.approve("send", {"to": rid})
            assert (got.approved, got.by) == (won[0].approved, won[0].by)
            # the loser's answer again is refused; the winner's again is the same decision
            with pytest.raises(durkv.DecisionConflictError):
                s.decide(rid, "0", not won[0].approved)
            assert s.decide(rid, "0", won[0].approved) == won[0]
        assert sum(wins.values()) == TRIALS


class Cut(BaseException):
    """Ends a tool call without a receipt (as a crash would): the call is in doubt."""


CALLS: dict = {}     # run id -> the keys wire was called with


@durkv.tool(at_most_once=True, name="wire")
def wire(rid, *, idempotency_key):
    calls = CALLS.setdefault(rid, [])
    calls.append(idempotency_key)
    if len(calls) == 1:
        raise Cut()
    return "wired"


def _in_doubt(s, rid):
    CALLS.pop(rid, None)
    with pytest.raises(Cut), s.run(rid) as run:
        run.tool(wire, rid)


@pytest.mark.parametrize("mode", MODES)
def test_two_racing_resolutions_have_one_winner_and_the_run_acts_on_it(mode):
    with durkv.open("memory://") as s:
        for i in range(TRIALS):
            rid = f"r{i}"
            _in_doubt(s, rid)
            a, b = _race(lambda: s.resolve(rid, "0", done=True, result="seen", by="ann"),
                         lambda: s.resolve(rid, "0", done=False, by="bob"))
            errs = [x for x in (a, b) if isinstance(x, Exception)]
            assert len(errs) == 1 and isinstance(errs[0], durkv.DecisionConflictError), (a, b)
            done = b is not None      # resolve returns None: the winner is the one that did
            if mode == "async":
                async def ex():
                    async with s.arun(rid) as run:
                        return await run.atool(wire, rid)
                got = asyncio.run(ex())
            else:
                with s.run(rid) as run:
                    got = run.tool(wire, rid)
            # done: the recorded result, no call; not done: exactly one more call
            assert (got, len(CALLS[rid])) == (("seen", 1) if done else ("wired", 2))


def test_a_resolution_is_final_and_the_same_answer_again_is_a_no_op():
    with durkv.open("memory://") as s:
        _in_doubt(s, "r")
        s.resolve("r", "0", done=True, result={"id": 7})
        s.resolve("r", "0", done=True, result={"id": 7})        # the same: a no-op
        for other in ({"done": False}, {"done": True, "result": {"id": 8}}):
            with pytest.raises(durkv.DecisionConflictError, match="already resolved"):
                s.resolve("r", "0", **other)
        assert sum(1 for r in s.journal("r") if r["e"] == 7) == 1
        with s.run("r") as run:
            assert run.tool(wire, "r") == {"id": 7}
        assert len(CALLS["r"]) == 1


# -- item 12: asyncio.gather of per-item pipelines replays --------------------------------------

def test_gathered_pipelines_replay_in_a_fresh_execution(tmp_path):
    work = str(tmp_path)
    with durkv.open(str(tmp_path / "s.durkv")) as s:
        first = _run(s, "fanout", "async", fanout_agent, work)
        for _ in range(3):        # other completion orders: everything replays
            assert _run(s, "fanout", "async", fanout_agent, work) == first
        assert len(effects(work)) == N_ITEMS
        ids = [e.step_id for e in s.run("fanout").journal()]
        # the run's own task keeps "0"; each pipeline's task its own "k/n"
        assert ids[0] == "0" and sorted(ids[1:]) == sorted(
            f"{k}/{n}" for k in range(N_ITEMS) for n in range(3))


def test_gathered_pipelines_replay_after_a_kill(tmp_path):
    path, work = tmp_path / "s.durkv", str(tmp_path)
    _killed_child(path, work, "fanout", "fanout", "async")
    before = effects(work)
    assert len(before) >= 4
    with durkv.open(str(path)) as s:
        assert len(s.run("fanout").journal()) < 1 + 3 * N_ITEMS      # killed mid-run
        out = _run(s, "fanout", "async", fanout_agent, work)
        assert out == ["m-1", *(f"noted m{i}:{i}" for i in range(N_ITEMS))]
        assert _run(s, "fanout", "async", fanout_agent, work) == out
    # each item's tool took effect under one key (a call in flight at the kill is called
    # again with its same key, which the service deduplicates), and none after the replay
    keys = {}
    for what, key in effects(work):
        keys.setdefault(what, set()).add(key)
    assert sorted(keys) == sorted(f"deliver-{i}" for i in range(N_ITEMS))
    assert all(len(k) == 1 for k in keys.values())
    assert len({k for ks in keys.values() for k in ks}) == N_ITEMS
    assert effects(work)[:len(before)] == before


def test_the_task_factory_chains_the_loops_and_is_restored_and_runs_can_overlap():
    made = []

    def mine(loop, coro, **kw):
        made.append(1)
        return asyncio.Task(coro, loop=loop, **kw)

    async def one(s, rid, delay):
        async with s.arun(rid) as run:
            async def item(i):
                await asyncio.sleep(delay * (3 - i))
                return await run.astep("m", lambda i=i: i)
            await asyncio.gather(*(item(i) for i in range(3)))
            await asyncio.sleep(delay)
        return [e.step_id for e in run.journal()]

    async def main(s):
        loop = asyncio.get_running_loop()
        loop.set_task_factory(mine)
        # two runs in two tasks, entered and exited in different orders
        a, b = await asyncio.gather(one(s, "a", 0.01), one(s, "b", 0.002))
        assert loop.get_task_factory() is mine          # restored
        return a, b
    with durkv.open("memory://") as s:
        a, b = asyncio.run(main(s))
        assert sorted(a) == sorted(b) == ["0/0", "1/0", "2/0"] and made
        assert asyncio.run(main(s)) == (a, b)           # replayed with the same ids


def test_a_key_that_looks_like_a_task_id_is_refused():
    with durkv.open("memory://") as s, s.run("r") as run:
        with pytest.raises(durkv.ConfigError, match="N/N"):
            run.step("x", lambda: 1, key="0/1")
        assert run.step("x", lambda: 1, key="a/1") == 1


# -- item 13: the retry budget and every attempt are durable -----------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("what", ["tool", "step"])
def test_retry_budget_goes_on_across_a_kill(tmp_path, mode, what):
    path, work = tmp_path / "s.durkv", str(tmp_path)
    _killed_child(path, work, f"flaky-{what}", "attempt2", mode)
    assert len(effects(work)) == 2
    with durkv.open(str(path)) as s:
        with pytest.raises(ConnectionError):
            _run(s, f"flaky-{what}", mode, flaky_agent, work, None, what)
        # Retry(3): 3 failed attempts in all; the one cut by the kill is completed by its
        # re-issue (same key for a tool), not counted twice, and not given 3 new attempts
        assert len(effects(work)) == 4
        (e,) = s.run(f"flaky-{what}").journal()
        assert e.state == "failed" and e.attempt_errors == [
            ["builtins.ConnectionError", f"{what} down"]] * 3
        assert e.retry_count == 3
        with pytest.raises(ConnectionError):        # final: replays, calls nothing
            _run(s, f"flaky-{what}", mode, flaky_agent, work, None, what)
        assert len(effects(work)) == 4


# -- item 14: async undos and async tools -------------------------------------------------------

@durkv.tool(name="unbook")
async def unbook(result, *, idempotency_key):
    await asyncio.sleep(0)
    UNDONE.append(result)
    return f"unbooked {result}"


UNDONE: list = []


@durkv.tool(name="book", compensate=unbook)
def book(what, *, idempotency_key):
    return what


def test_compensate_refuses_an_async_undo_and_acompensate_awaits_it():
    UNDONE.clear()
    with durkv.open("memory://") as s:
        with s.run("r") as run:
            run.tool(book, "hotel")
            n = s.journal_length("r")
            with pytest.raises(durkv.ConfigError, match="acompensate"):
                run.compensate()
            assert s.journal_length("r") == n and UNDONE == []     # no intent, no call

        async def ex():
            async with s.arun("r") as run:
                await run.atool(book, "hotel")
                return await run.acompensate()
        assert asyncio.run(ex()) == ["unbooked hotel"] and UNDONE == ["hotel"]
        assert asyncio.run(ex()) == ["unbooked hotel"] and UNDONE == ["hotel"]   # replayed
        assert [e.state for e in s.run("r").journal()] == ["done", "done"]


def test_acompensate_runs_sync_undos_too():
    @durkv.tool(name="free")
    def free(result, *, idempotency_key):
        return f"freed {result}"

    @durkv.tool(name="take", compensate=free)
    def take(what, *, idempotency_key):
        return what

    async def ex(s):
        async with s.arun("r") as run:
            await run.atool(take, "a")
            run.tool(take, "b")
            return await run.acompensate()
    with durkv.open("memory://") as s:
        assert asyncio.run(ex(s)) == ["freed b", "freed a"]


def test_an_async_tool_or_step_in_a_sync_verb_is_refused_before_anything_is_recorded():
    calls = []
    UNDONE.clear()

    async def model():
        calls.append(1)
        return "m"
    with durkv.open("memory://") as s:
        with s.run("r") as run:
            with pytest.raises(durkv.ConfigError, match="await run.atool"):
                run.tool(unbook, "x")
            with pytest.raises(durkv.ConfigError, match="await run.astep"):
                run.step("model", model)
        assert [r["e"] for r in s.journal("r")] == [1, 8]   # RUN, STATUS: nothing recorded
        assert calls == [] and UNDONE == []

        async def ex():
            async with s.arun("r") as run:
                return await run.astep("model", model)
        assert asyncio.run(ex()) == "m" and calls == [1]


# -- item 15: deleting a run that is being driven ------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_delete_of_a_driven_run_is_refused(mode):
    with durkv.open("memory://") as s:
        def body(run):
            run.step("a", lambda: 1)
            with pytest.raises(durkv.RunBusyError, match="'r' is being driven"):
                s.delete_runs(["other", "r"])
            with pytest.raises(durkv.RunBusyError):
                s.delete_runs("r")
            run.step("b", lambda: 2)
        if mode == "async":
            async def ex():
                async with s.arun("r", input=1) as run:
                    body(run)
            asyncio.run(ex())
        else:
            with s.run("r", input=1) as run:
                body(run)
        assert s.journal("r")[0]["e"] == 1 and s.runs()[0].status == "finished"
        s.delete_runs(["r"])           # no longer driven
        assert s.journal("r") == []
        with s.run("r", input=2) as run:         # a new run, nothing replayed
            assert run.step("a", lambda: 3) == 3


# -- item 16: key= for time and chance; sleep lengths; prompt versions ------------------------

@pytest.mark.parametrize("mode", MODES)
def test_threads_use_now_random_uuid_sleep_with_key(mode):
    t = [1000.0]
    slept: list = []

    def work(run, i):
        return (run.now(key=f"now-{i}"), run.random(key=f"rnd-{i}"), run.uuid(key=f"id-{i}"))

    def execute(s, order):
        out = {}
        with s.run("r", clock=lambda: t[0], sleep=slept.append) as run:
            ts = [threading.Thread(target=lambda i=i: out.__setitem__(i, work(run, i)))
                  for i in order]
            for th in ts:
                th.start()
            for th in ts:
                th.join()
            if mode == "async":
                asyncio.run(run.asleep(5, key="nap"))
            else:
                run.sleep(5, key="nap")
        return out
    with durkv.open("memory://") as s:
        first = execute(s, range(6))
        t[0] = 1001.0
        assert execute(s, reversed(range(6))) == first      # another thread order: replayed
        assert slept == [5, 4.0]
        assert {e.step_id for e in s.run("r").journal()} >= {"now-0", "rnd-5", "id-3", "nap"}


@pytest.mark.parametrize("mode", MODES)
def test_a_changed_sleep_length_is_a_conflict(mode):
    slept: list = []

    def execute(s, seconds):
        with s.run("r", clock=lambda: 100.0, sleep=slept.append) as run:
            if mode == "async":
                asyncio.run(run.asleep(seconds))
            else:
                run.sleep(seconds)
    with durkv.open("memory://") as s:
        execute(s, 10)
        execute(s, 10.0)          # the same length (int or float): replayed
        with pytest.raises(durkv.IdempotencyConflictError, match="step 0"):
            execute(s, 20)
        assert slept == [10, 10.0]


@pytest.mark.parametrize("mode", MODES)
def test_prompt_versions_compare_as_recorded_and_bad_ones_are_refused_before_the_call(mode):
    calls = []

    def model(x):
        calls.append(x)
        return x

    def step(s, x, pv):
        with s.run("r", on_drift="fail") as run:
            if mode == "async":
                return asyncio.run(run.astep("model", model, x, prompt_version=pv))
            return run.step("model", model, x, prompt_version=pv)
    with durkv.open("memory://") as s:
        assert step(s, 1, ("p", 2)) == 1
        assert step(s, 1, ("p", 2)) == 1 and step(s, 1, ["p", 2]) == 1   # no drift
        assert calls == [1]
    for bad in (datetime.date(2026, 1, 1), {"a", "b"}, ("p", object())):
        with durkv.open("memory://") as s:
            with pytest.raises(durkv.ConfigError, match="prompt_version must be plain data"):
                step(s, 2, bad)
    assert calls == [1]       # refused before the model was called


# -- item 17: a result too large to journal ------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_a_result_too_large_to_journal_says_the_call_happened_and_what_to_do(mode):
    calls = []

    @durkv.tool(at_most_once=True, name="fetch")
    def fetch(*, idempotency_key):
        calls.append(idempotency_key)
        return "x" * 10_000

    async def ex(s):
        async with s.arun("r") as run:
            return await run.atool(fetch)
    with durkv.open("memory://", max_commit_bytes=4096) as s:
        with pytest.raises(durkv.FrameTooLargeError) as ei:
            if mode == "async":
                asyncio.run(ex(s))
            else:
                with s.run("r") as run:
                    run.tool(fetch)
        msg = str(ei.value)
        assert "was called" in msg and "key r:0" in msg and "reference" in msg
        assert "store.resolve('r', '0', done=True" in msg and calls == ["r:0"]
        with pytest.raises(durkv.InDoubtError), s.run("r") as run:
            run.tool(fetch)
        with pytest.raises(durkv.FrameTooLargeError, match="resolve with a reference"):
            s.resolve("r", "0", done=True, result="x" * 10_000)
        s.resolve("r", "0", done=True, result={"ref": "s3://bucket/r-0"})
        with s.run("r") as run:
            assert run.tool(fetch) == {"ref": "s3://bucket/r-0"}
        assert calls == ["r:0"]


def test_in_doubt_error_carries_run_step_and_key():
    e = durkv.InDoubtError("m", run_id="r", step_id="3", key="r:3")
    assert (e.run_id, e.step_id, e.key, e.context["key"]) == ("r", "3", "r:3", "r:3")


def test_decide_and_resolve_refuse_a_step_id_that_is_not_text(tmp_path):
    """store.decide("r", 1, ...) said 'nothing at step 1' with an approval at "1"."""
    with durkv.open(str(tmp_path / "s")) as s:
        with s.run("r") as run:
            run.approve("publish")              # pauses the run: the with ends it
        assert s.runs()[0].status == "waiting"
        for call in (lambda: s.decide("r", 0, True), lambda: s.resolve("r", 0, done=False),
                     lambda: s.decide(("r",), "0", True)):
            with pytest.raises(durkv.ConfigError, match="must be a str"):
                call()
        assert s.decide("r", "0", True).approved


def test_a_run_id_with_a_lone_surrogate_is_a_config_error():
    """store.run("ticket-\\udce9") raised a raw UnicodeEncodeError from the driver claim."""
    with durkv.open("memory://") as s:
        with pytest.raises(durkv.ConfigError, match="lone surrogate"):
            with s.run("ticket-\udce9"):
                pass
