"""The run journal's semantics (durkv.runtime): one test per promise in issue 9.

Real stores (memory and the local C log); crashes are simulated by abandoning a
run between two records where a kill -9 would (the chaos suite kills for real).
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

import durkv
from durkv.runtime.journal import E_INTENT
import rundrivers
from click.testing import CliRunner
from durkv.cli import cli

drive = rundrivers.drive      # the fixture: the protocol's tests run sync and async


class Model:
    """A 'model call' that counts how often it really ran."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompt):
        self.calls.append(prompt)
        return f"answer to {prompt}"


class Outbox:
    def __init__(self):
        self.keys = []

    def tool(self, **kw):
        @durkv.tool(**kw)
        def send(to, body, *, idempotency_key):
            self.keys.append(idempotency_key)
            return {"id": len(self.keys), "to": to}
        return send


def test_step_records_once_and_replays(url, drive):
    model = Model()

    async def first(v):
        return (await v.step("plan", model, "p1", prompt_version="v1"),
                await v.step("plan", model, "p2", prompt_version="v1"))

    async def second(v):
        got = await first(v)
        return got, await v.step("more", model, "p3")

    with durkv.open(url) as s:
        a, b = drive(s, "r", first, input={"q": 1})
        assert drive.run.status == "finished"
    with durkv.open(url) as s:
        (a2, b2), c = drive(s, "r", second, input={"q": 1})
        assert (a2, b2) == (a, b)
        assert model.calls == ["p1", "p2", "p3"] and c == "answer to p3"
        j = drive.run.journal()
        assert [(e.step_id, e.planned_action, e.inputs, e.result_receipt) for e in j] == [
            ("0", "plan", [["p1"], {}], a), ("1", "plan", [["p2"], {}], b),
            ("2", "more", [["p3"], {}], c)]
        assert j[0].prompt_version == "v1" and j[0].state == "done"
        assert j[0].started_at <= j[0].ended_at


def test_replayed_result_is_a_fresh_value(url):
    with durkv.open(url) as s:
        for _ in range(2):
            with s.run("r") as run:
                v = run.step("x", lambda: {"items": [1]})
                v["items"].append(2)       # the caller's mutation is not the journal's value
        with s.run("r") as run:
            assert run.step("x", lambda: None) == {"items": [1]}


def test_tool_intent_receipt_and_key(url, drive):
    box = Outbox()
    send = box.tool(version="3")

    async def scenario(v):
        return await v.tool(send, to="a@b", body="hi")

    with durkv.open(url) as s:
        for _ in range(3):
            r = drive(s, "t", scenario)
        assert box.keys == ["t:0"] and r == {"id": 1, "to": "a@b"}
        (e,) = drive.run.journal()
        assert (e.kind, e.idempotency_key, e.tool_version, e.retry_count, e.state) == (
            "tool", "t:0", "3", 0, "done")


class Killed(BaseException):
    """A kill -9 between the call and its receipt, as the run sees it: nothing after."""


def _crash_after_intent(s, drive, run_id, fn, **kw):
    """What a kill -9 between the call and its receipt leaves: a durable intent only."""
    async def scenario(v):
        v.run._receipt = lambda *a, **k: (_ for _ in ()).throw(Killed("killed"))
        await v.tool(fn, **kw)

    with pytest.raises(Killed):
        drive(s, run_id, scenario)


def _tool_once(fn, **kw):
    async def scenario(v):
        return await v.tool(fn, **kw)
    return scenario


def test_intent_without_receipt_is_called_again_with_the_same_key(url, caplog, drive):
    box = Outbox()
    send = box.tool()
    with durkv.open(url) as s:
        _crash_after_intent(s, drive, "t", send, to="a", body="b")
        assert box.keys == ["t:0"]
        with caplog.at_level(logging.WARNING, logger="durkv"):
            drive(s, "t", _tool_once(send, to="a", body="b"))
        assert box.keys == ["t:0", "t:0"]       # a duplicate by key, deduplicated by it
        assert "intent without receipt" in caplog.text
        (e,) = drive.run.journal()
        assert e.retry_count == 1 and e.state == "done"


def test_at_most_once_in_doubt_then_resolve(url, drive):
    box = Outbox()
    pay = box.tool(at_most_once=True)
    once = _tool_once(pay, to="a", body="b")
    with durkv.open(url) as s:
        _crash_after_intent(s, drive, "p", pay, to="a", body="b")
        with pytest.raises(durkv.InDoubtError, match="store.resolve"):
            drive(s, "p", once)
        assert box.keys == ["p:0"]
        assert [(r.status, r.step) for r in s.runs()] == [("in_doubt", "0")]
        assert drive.run.journal()[0].state == "in_doubt"
        s.resolve("p", "0", done=True, result={"id": 99})
        assert drive(s, "p", once) == {"id": 99}
        assert box.keys == ["p:0"] and s.runs()[0].status == "finished"
        # resolved as not done: the next execution calls it, same key
        _crash_after_intent(s, drive, "q", pay, to="a", body="b")
        s.resolve("q", "0", done=False, by="ops")
        drive(s, "q", once)
        assert box.keys == ["p:0", "q:0", "q:0"]
        with pytest.raises(durkv.ConfigError, match="has a receipt"):
            s.resolve("q", "0", done=True)


def test_resolve_refuses_a_call_a_live_driver_is_making(tmp_path):
    # an intent without a receipt is in flight while its run is driven: "not done" then
    # would have the next execution wire the money a second time
    started, go, calls = threading.Event(), threading.Event(), []

    @durkv.tool(at_most_once=True, name="wire")
    def wire(amount, *, idempotency_key):
        calls.append(idempotency_key)
        if amount == 200:
            started.set()
            assert go.wait(10)
        return "T-1"

    def drive(s):
        with s.run("pay") as run:
            with pytest.raises(durkv.InDoubtError):
                run.tool(wire, 100)
            # in doubt, found so by this execution: resolvable while it goes on
            s.resolve("pay", "0", done=True, result="T-0")
            run.tool(wire, 200)

    path = str(tmp_path / "s")
    with durkv.open(path) as s:
        with pytest.raises(Killed), s.run("pay") as run:   # a kill inside the call
            run._receipt = lambda *a, **k: (_ for _ in ()).throw(Killed("killed"))
            run.tool(wire, 100)
        t = threading.Thread(target=drive, args=(s,))
        t.start()
        assert started.wait(10)
        with pytest.raises(durkv.RunBusyError, match="in flight, not in doubt"):
            s.resolve("pay", "1", done=False)
        r = CliRunner().invoke(cli, ["resolve", path, "pay", "1", "--not-done"])
        assert r.exit_code == 1 and "in flight, not in doubt" in r.stderr, r.output
        go.set()
        t.join()
        assert calls == ["pay:0", "pay:1"]
        assert [e.state for e in durkv.Run(s, "pay").journal()] == ["done", "done"]


def test_same_step_different_input_conflicts(url, drive):
    box = Outbox()
    send = box.tool()
    model = Model()

    def scenario(prompt, to):
        async def go(v):
            await v.step("plan", model, prompt)
            await v.tool(send, to=to, body="1")
        return go

    with durkv.open(url) as s:
        drive(s, "r", scenario("a", "x"))
        with pytest.raises(durkv.IdempotencyConflictError) as ei:
            drive(s, "r", scenario("CHANGED", "x"))
        assert "run 'r' step 0" in str(ei.value) and ei.value.context["recorded"] != \
            ei.value.context["given"]
        with pytest.raises(durkv.IdempotencyConflictError):
            drive(s, "r", scenario("a", "y"))
        assert model.calls == ["a"] and box.keys == ["r:1"]


def test_non_determinism(url, drive):
    model = Model()

    def scenario(name):
        async def go(v):
            await v.step(name, model, "a")
        return go

    with durkv.open(url) as s:
        drive(s, "r", scenario("plan"))
        with pytest.raises(durkv.NonDeterminismError) as ei:
            drive(s, "r", scenario("search"))
        msg = str(ei.value)
        assert "step 0" in msg and "'plan'" in msg and "'search'" in msg
        assert model.calls == ["a"]


@pytest.mark.parametrize("policy", ["warn", "fail", "rerun"])
def test_version_drift(url, policy, caplog, drive):
    box = Outbox()
    model = Model()

    def scenario(pv, tv):
        async def go(v):
            await v.step("plan", model, "a", prompt_version=pv)
            await v.tool(box.tool(version=tv), to="x", body="b")
        return go

    with durkv.open(url) as s:
        drive(s, "r", scenario("p1", "1"))
        with caplog.at_level(logging.WARNING, logger="durkv"):
            if policy == "fail":
                with pytest.raises(durkv.VersionDriftError, match="'p1', running 'p2'"):
                    drive(s, "r", scenario("p2", "2"), on_drift=policy)
                return
            drive(s, "r", scenario("p2", "2"), on_drift=policy)
        j = drive.run.journal()
        if policy == "warn":
            assert model.calls == ["a"] and box.keys == ["r:1"]
            assert "version drift" in j[0].warnings[0] and "warn" in caplog.text
            assert len(j) == 2
        else:
            assert model.calls == ["a", "a"] and box.keys == ["r:1", "r:1#1"]
            assert [(e.step_id, e.generation) for e in j] == [("0", 0), ("1", 0), ("0", 1),
                                                                ("1", 1)]
            # the default key is left out of the INTENT and read back; a new key is kept
            intents = [r for r in s.journal("r") if r["e"] == 3]
            assert [r.get("key") for r in intents] == [None, "r:1#1"]
            assert [e.idempotency_key for e in j if e.kind == "tool"] == ["r:1", "r:1#1"]
            drive(s, "r", scenario("p2", "2"), on_drift="fail")   # the rerun is the record


def test_retries_with_backoff_on_a_fake_clock(url, drive):
    slept = []
    fails = {"n": 2}

    def flaky(x):
        if fails["n"]:
            fails["n"] -= 1
            raise ConnectionError(f"down {fails['n']}")
        return x * 2

    retry = durkv.Retry(5, backoff=1.0, max_delay=1.5, jitter=0.5, sleep=slept.append,
                        random=lambda: 0.5)

    async def scenario(v):
        return await v.step("f", flaky, 21, retry=retry)

    with durkv.open(url) as s:
        assert drive(s, "r", scenario) == 42
        assert slept == [0.75, 1.5 * 0.75]       # 1*2^0, then capped at 1.5; jitter 0.5*0.5
        (e,) = drive.run.journal()
        assert e.retry_count == 2 and [t[0] for t in e.attempt_errors] == [
            "builtins.ConnectionError"] * 2


def test_recorded_final_failure_replays_as_the_same_exception(url, drive):
    model = Model()

    def boom(x):
        model.calls.append(x)
        raise KeyError(x)

    async def scenario(v):
        await v.step("b", boom, "k1", retry=durkv.Retry(2, backoff=0, jitter=0))

    async def again(v):
        return await v.step("b", lambda x: "ok", "k1", retry_failed=True)

    with durkv.open(url) as s:
        for _ in range(2):
            with pytest.raises(KeyError, match="k1"):
                drive(s, "r", scenario)
        assert model.calls == ["k1", "k1"]           # two attempts, once
        assert s.runs()[0].status == "failed"
        assert drive(s, "r", again) == "ok"
        e = drive.run.journal()
        assert [x.state for x in e] == ["failed", "done"]
        assert e[0].error_state == "builtins.KeyError: 'k1'"


def test_compensation_runs_undos_newest_first(url, drive):
    undone = []

    @durkv.tool
    def release(receipt, *, idempotency_key):
        undone.append((receipt, idempotency_key))

    @durkv.tool(compensate=release)
    def reserve(what, *, idempotency_key):
        return f"res-{what}"

    @durkv.tool
    def notify(*, idempotency_key):
        return None

    async def scenario(v):
        await v.tool(reserve, "a")
        await v.tool(notify)
        await v.tool(reserve, "b")
        return await v.compensate()

    with durkv.open(url) as s:
        for _ in range(2):          # the second execution replays every undo
            assert drive(s, "r", scenario) == [None, None]
        assert undone == [("res-b", "r:3"), ("res-a", "r:4")]
        j = drive.run.journal()
        assert [e.compensates for e in j[3:]] == ["2", "0"]


def test_approval_pause_decide_resume(url, drive):
    box = Outbox()
    send = box.tool()

    async def scenario(v):
        if (await v.approve("send", {"to": "a"})).approved:
            await v.tool(send, to="a", body="x")

    def agent(s):
        drive(s, "r", scenario, input={"t": 1})
        return drive.run

    with durkv.open(url) as s:
        run = agent(s)
        assert run.status == "waiting" and run.interrupt.step_id == "0"
        assert [(r.status, r.step) for r in s.runs()] == [("waiting", "0")]
        run = agent(s)                      # not decided yet: still waiting, nothing sent
        assert run.status == "waiting" and box.keys == []
        d = s.decide("r", "0", True, by="ann", note="ok")
        assert d.approved and s.decide("r", "0", True).by == "ann"    # idempotent
        with pytest.raises(durkv.DecisionConflictError, match="already approved"):
            s.decide("r", "0", False)
    with durkv.open(url) as s:
        agent(s)
        agent(s)
        assert box.keys == ["r:1"]
        j = s.run("r").journal()
        assert (j[0].approval_status, j[0].result_receipt) == ("approved", True)


def test_interrupted_is_not_swallowed_by_except_exception(url):
    with durkv.open(url) as s:
        with s.run("r") as run:
            try:
                run.approve("x", 1)
            except Exception:      # user code that catches everything
                pytest.fail("Interrupted was caught as an Exception")
        assert run.status == "waiting"
        assert issubclass(durkv.Interrupted, BaseException)


def test_rejection_is_a_result_and_mismatch_is_refused(url, drive):
    def scenario(body):
        async def go(v):
            return await v.approve("send", {"body": body})
        return go

    with durkv.open(url) as s:
        drive(s, "r", scenario("v1"))
        s.decide("r", "0", False, by="bob")
        d = drive(s, "r", scenario("v1"))
        assert d.approved is False and d.by == "bob"
        with pytest.raises(durkv.ApprovalMismatchError, match="decided"):
            drive(s, "r", scenario("v2 edited after the human looked"))
        with pytest.raises(durkv.NotFoundError):
            s.decide("r", "9", True)


def test_run_id_conflict_and_two_drivers(url):
    with durkv.open(url) as s:
        with s.run("r", input={"job": 1}):
            pass
        with pytest.raises(durkv.RunConflictError, match="another input"):
            with s.run("r", input={"job": 2}):
                pass
        with s.run("r", input={"job": 1}) as run:
            with pytest.raises(durkv.RunBusyError):
                with s.run("r"):
                    pass
            run.step("x", lambda: 1)
        with s.run("r"):       # released after the block
            pass


def test_sleep_records_its_wake_time(drive):
    now = [1000.0]
    slept = []

    def sleep(d):
        slept.append(d)
        now[0] += d

    async def scenario(v):
        await v.sleep(60)

    with durkv.open("memory://") as s:
        # "killed" during the sleep: nothing advanced
        drive(s, "r", scenario, clock=lambda: now[0], sleep=lambda d: None)
        assert s.runs()[0].status == "finished"
        now[0] += 45
        drive(s, "r", scenario, clock=lambda: now[0], sleep=sleep)
        assert slept == [15.0]
        drive(s, "r", scenario, clock=lambda: now[0], sleep=sleep)
        assert slept == [15.0]


def test_now_random_uuid_are_recorded(url, drive):
    async def scenario(v):
        return (await v.now(), await v.random(), await v.uuid())

    with durkv.open(url) as s:
        first = drive(s, "r", scenario)
        assert drive(s, "r", scenario) == first


def test_explicit_keys_for_threads(url):
    box = Outbox()
    send = box.tool()
    with durkv.open(url) as s:
        for _ in range(2):
            with s.run("r") as run:
                ts = [threading.Thread(target=run.tool, args=(send,),
                                       kwargs=dict(to=str(i), body="b", key=f"mail-{i}"))
                      for i in range(4)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
        assert sorted(box.keys) == [f"r:mail-{i}" for i in range(4)]
        with s.run("r") as run, pytest.raises(durkv.ConfigError, match="not a number"):
            run.step("x", lambda: 1, key="7")


def test_tool_without_idempotency_key_fails_at_decoration():
    with pytest.raises(durkv.ConfigError, match="idempotency_key"):
        @durkv.tool(version="1")
        def send(to, body):
            pass
    with durkv.open("memory://") as s, s.run("r") as run:
        with pytest.raises(durkv.ConfigError, match="not a @durkv.tool"):
            run.tool(print, "x")


def test_unencodable_result_records_nothing_and_runs_again(url, drive):
    model = Model()

    def bad(p):
        model.calls.append(p)
        return object()

    def scenario(fn, arg):
        async def go(v):
            return await v.step("b", fn, arg)
        return go

    with durkv.open(url) as s:
        with pytest.raises(durkv.SerializationError, match="nothing was recorded"):
            drive(s, "r", scenario(bad, "x"))
        assert drive.run.journal() == []
        assert drive(s, "r", scenario(lambda p: "fine", "x")) == "fine"
        with pytest.raises(durkv.SerializationError, match="plain data"):
            drive(s, "r2", scenario(bad, object()))
    assert model.calls == ["x"]


def test_oversized_and_secret_inputs(url, drive):
    big = "x" * (200 << 10)

    def scenario(pw):
        async def go(v):
            await v.step("big", len, big)
            await v.step("pw", len, pw, secret=True)
        return go

    with durkv.open(url) as s:
        drive(s, "r", scenario("hunter2"))
        with pytest.raises(durkv.IdempotencyConflictError):
            drive(s, "r", scenario("hunter3"))
        j = drive.run.journal()
        assert j[0].inputs is None and j[1].inputs is None     # fingerprints only
        assert j[0].inputs_fingerprint != j[1].inputs_fingerprint

    async def huge(v):
        with pytest.raises(durkv.FrameTooLargeError, match="max_commit_bytes"):
            await v.step("huge", lambda: "y" * 10_000)
        assert v.run.journal() == []

    with durkv.open("memory://", max_commit_bytes=4096) as s:
        drive(s, "r", huge)


def test_intent_is_durable_before_the_call_under_exit_policy(tmp_path):
    """Under `exit` the intent is written before the call: a kill keeps it (a local store
    writes its frames when their section ends; docs/GUARANTEES.md 16.9)."""
    path = str(tmp_path / "s.durkv")
    seen = []

    with durkv.open(path, durability="exit") as s:
        @durkv.tool
        def check(*, idempotency_key):
            with durkv.open(path, read_only=True) as r:      # what a crash would leave
                seen.extend(rec["e"] for rec in r.journal("r"))
        with s.run("r") as run:
            run.tool(check)
    assert E_INTENT in seen


def test_a_block_error_is_not_masked_by_a_closed_store(url):
    s = durkv.open(url)
    with pytest.raises(ZeroDivisionError):
        with s.run("r") as run:
            run.step("x", lambda: 1)
            s.close()
            1 / 0


class QuotaError(Exception):
    pass


def test_recorded_failure_types_are_rebuilt_and_a_missing_class_is_named(url, drive):
    from durkv.runtime.values import Values

    def quota():
        raise QuotaError("over quota", 3)

    async def scenario(v):
        await v.step("q", quota)

    with durkv.open(url) as s:
        for _ in range(2):
            with pytest.raises(QuotaError) as ei:
                drive(s, "r", scenario)
            assert ei.value.args == ("over quota", 3)
    e = Values(durkv.open("memory://").serde).rebuild(
        ["not_imported_anywhere.Boom", "boom", None], "run 'r' step 0 ('q')")
    assert isinstance(e, durkv.StepFailedError)
    assert "not_imported_anywhere.Boom: boom" in str(e) and "cannot be found" in str(e)


def test_one_run_object_executed_twice(url):
    model = Model()
    with durkv.open(url) as s:
        run = s.run("r")
        for _ in range(2):
            with run:
                run.step("a", model, 1)
                run.step("b", model, 2)
        assert model.calls == [1, 2]


def test_compensation_gets_the_recorded_result_not_the_callers_mutated_object(url, drive):
    """The caller may mutate a tool's result after it returns; the undo must still get the
    result as recorded (the same value a replay passes), or the undo acts on the wrong
    thing and a re-execution meets an IdempotencyConflictError at the undo step."""
    undone = []

    @durkv.tool
    def cancel(booking, *, idempotency_key):
        undone.append(dict(booking))

    @durkv.tool(compensate=cancel)
    def book(*, idempotency_key):
        return {"id": "B1"}

    async def scenario(v):
        got = await v.tool(book)
        got["id"] = "mutated by the caller"
        await v.compensate()

    with durkv.open(url) as s:
        for _ in range(2):          # the second execution replays the tool and the undo
            drive(s, "r", scenario)
        assert undone == [{"id": "B1"}]


def test_a_failed_undo_keeps_it_and_the_older_ones_for_the_next_compensate(url, drive):
    """The middle undo of a saga fails once. Before, the undos older than it vanished:
    the next compensate() returned [] in the same execution, and every later execution
    replayed the failure and never reached them; the hotel was never released."""
    down = {"car": 1}
    undone = []

    def undo_of(name):
        @durkv.tool(name=f"undo_{name}")
        def undo(result, *, idempotency_key):
            if down.get(name):
                down[name] -= 1
                raise ConnectionError(f"undo {name}: service down")
            undone.append(result)
            return f"undid {result}"
        return undo

    def booking(name):
        @durkv.tool(name=name, compensate=undo_of(name))
        def book(x, *, idempotency_key):
            return f"{name}-{x}"
        return book

    hotel, car, flight = booking("hotel"), booking("car"), booking("flight")

    async def saga(v):
        await v.tool(hotel, 1)
        await v.tool(car, 2)
        await v.tool(flight, 3)
        try:
            return await v.compensate()
        except ConnectionError:
            return await v.compensate()          # once the service is back

    with durkv.open(url) as s:
        for _ in range(2):          # the second execution replays it all, calling nothing
            assert drive(s, "r", saga) == ["undid car-2", "undid hotel-1"]
        assert undone == ["flight-3", "car-2", "hotel-1"]


class ApiError(Exception):
    """A replayed exception's class must be importable: at module level."""

    def __str__(self):
        return "%s: %s" % self.args         # given one arg: a TypeError


def test_an_exception_whose_str_fails_is_recorded_and_replays_as_its_class(url, drive):
    """A library's exception with a format string of the wrong arity: str() raises. The
    journal's own str() of it escaped as a TypeError, nothing was recorded, and the
    next execution called the step and the tool again."""
    calls = []

    @durkv.tool
    def send(*, idempotency_key):
        calls.append("send")
        raise ApiError("quota")

    def step():
        calls.append("step")
        raise ApiError("quota")

    async def scenario(v):
        out = []
        for call in (lambda: v.step("s", step), lambda: v.tool(send)):
            try:
                await call()
            except ApiError as e:
                out.append((type(e).__name__, e.args))
        return out

    with durkv.open(url) as s:
        for _ in range(2):
            assert drive(s, "r", scenario) == [("ApiError", ("quota",))] * 2
        assert calls == ["step", "send"]


def test_a_generator_function_tool_is_refused_before_its_intent(tmp_path):
    # its body runs only when iterated: the intent recorded a call that never began, and
    # an at-most-once one was then found in doubt
    ran = []

    @durkv.tool(at_most_once=True, name="stream_sms")
    def stream_sms(to, *, idempotency_key):
        ran.append(to)
        yield "sent"

    @durkv.tool(name="astream_sms")
    async def astream_sms(to, *, idempotency_key):
        ran.append(to)
        yield "sent"

    async def agent(store):
        async with store.arun("a") as run:
            await run.atool(astream_sms, "x")

    with durkv.open(str(tmp_path / "s")) as s:
        with pytest.raises(durkv.ConfigError, match="generator function"):
            with s.run("r") as run:
                run.tool(stream_sms, "x")
        with pytest.raises(durkv.ConfigError, match="generator function"):
            asyncio.run(agent(s))
        assert ran == [] and s.journal("r")[-1]["e"] != E_INTENT
        assert all(r["e"] != E_INTENT for r in s.journal("a"))
