"""What issue 9's Tests list asks of the runtime beyond tests/test_runtime.py: bad input,
a hostile caller, tool retries and drift, and stores whose journals were compacted.

Each test names the promise it holds; real stores (memory and the local C log).
"""

from __future__ import annotations

import asyncio

import pytest

import durkv


class Service:
    """A mutating service that records every call by its idempotency key."""

    def __init__(self, result=None):
        self.keys = []
        self.fail = 0
        self.result = result

    def tool(self, **kw):
        @durkv.tool(name="call", **kw)
        def call(*args, idempotency_key, **kwargs):
            self.keys.append(idempotency_key)
            if self.fail:
                self.fail -= 1
                raise ConnectionError(f"down ({self.fail} more)")
            return self.result if self.result is not None else {"n": len(self.keys)}
        return call


# ---- a hostile caller --------------------------------------------------------------------


def test_a_dict_mutated_after_a_step_is_a_new_input(url):
    """The fingerprint is of the value at the call, not of the object: passing the same
    dict again after changing it is a new input (and a changed input on replay conflicts)."""
    seen = []

    def model(d):
        seen.append(dict(d))
        return d["q"] * 2

    with durkv.open(url) as s:
        with s.run("r") as run:
            d = {"q": 1}
            assert run.step("m", model, d) == 2
            d["q"] = 5                   # the same object, another value
            assert run.step("m", model, d) == 10
            j = run.journal()
        assert seen == [{"q": 1}, {"q": 5}]
        assert [e.inputs for e in j] == [[[{"q": 1}], {}], [[{"q": 5}], {}]]
        assert j[0].inputs_fingerprint != j[1].inputs_fingerprint
        with s.run("r") as run:
            d = {"q": 1}
            assert run.step("m", model, d) == 2          # replayed
            d["q"] = 6                   # not what step 1 was called with
            with pytest.raises(durkv.IdempotencyConflictError, match="step 1"):
                run.step("m", model, d)
        assert len(seen) == 2


def test_a_dict_mutated_after_a_tool_call_is_a_new_input(url):
    svc = Service()
    call = svc.tool()
    with durkv.open(url) as s:
        with s.run("r") as run:
            order = {"items": ["a"]}
            run.tool(call, order)
            order["items"].append("b")
            run.tool(call, order)
            j = run.journal()
        assert [e.inputs[0][0] for e in j] == [{"items": ["a"]}, {"items": ["a", "b"]}]
        with s.run("r") as run:
            order = {"items": ["a"]}
            run.tool(call, order)
            with pytest.raises(durkv.IdempotencyConflictError):
                run.tool(call, order)          # step 1 was recorded with ["a", "b"]
        assert svc.keys == ["r:0", "r:1"]


def test_retry_on_must_be_exception_types():
    """``on=`` takes an exception class or a tuple of them; a bare string (or a list) used
    to pass, then failed with a raw TypeError at the first retried failure."""
    for bad in ("ConnectionError", ["ConnectionError"], 3, int, (ValueError, "KeyError")):
        with pytest.raises(durkv.ConfigError, match="on="):
            durkv.Retry(3, on=bad)
    r = durkv.Retry(3, on=[ConnectionError, TimeoutError])     # a list of classes is fine
    assert r.retries(TimeoutError(), 0) and not r.retries(ValueError(), 0)


def test_retry_on_is_honoured_and_checked_before_a_call(url):
    calls = []

    def flaky():
        calls.append(1)
        raise ValueError("not retried")

    with durkv.open(url) as s:
        with pytest.raises(ValueError), s.run("r") as run:
            run.step("f", flaky, retry=durkv.Retry(5, backoff=0, on=ConnectionError))
        assert len(calls) == 1
        assert run.journal()[0].error_state == "builtins.ValueError: not retried"


def test_delete_runs_with_a_bare_string_is_one_run(url):
    with durkv.open(url) as s:
        for rid in ("ab", "a", "b"):
            with s.run(rid) as run:
                run.step("x", lambda: 1)
        s.delete_runs("ab")            # one run id, never its characters
        assert sorted(r.run_id for r in s.runs()) == ["a", "b"]
        with s.run("ab") as run:       # a new run under the old id
            assert run.step("x", lambda: 2) == 2


def test_interrupted_is_not_swallowed_in_async_code(url):
    async def agent(s):
        async with s.arun("r") as run:
            try:
                await run.aapprove("send", {"to": "a"})
            except Exception:
                pytest.fail("Interrupted was caught as an Exception")
            return "went on"
        return run

    with durkv.open(url) as s:
        run = asyncio.run(agent(s))
        assert run.status == "waiting" and run.interrupt.action == "send"


def test_a_payload_mutated_after_the_request_is_a_mismatch(url):
    """The request binds the payload's value when it was asked: the same dict edited
    before anyone decided is another question, not the pending one."""
    with durkv.open(url) as s:
        payload = {"to": "a@b", "body": "v1"}
        with s.run("r") as run:
            run.approve("send", payload)
        payload["body"] = "v2"
        with s.run("r") as run, pytest.raises(durkv.ApprovalMismatchError, match="requested"):
            run.approve("send", payload)
        (e,) = run.journal()
        assert e.inputs == {"to": "a@b", "body": "v1"} and e.approval_status == "pending"


# ---- bad input ---------------------------------------------------------------------------


def test_a_tool_result_that_cannot_be_encoded_is_called_again_with_its_key(url):
    svc = Service(result=object())
    bad = svc.tool()
    with durkv.open(url) as s:
        with pytest.raises(durkv.SerializationError, match="no receipt"):
            with s.run("r") as run:
                run.tool(bad, 1)
        assert run.journal()[0].state == "in_doubt"
        good = Service(result="ok")
        with s.run("r") as run:
            assert run.tool(good.tool(), 1) == "ok"
        assert svc.keys == ["r:0"] and good.keys == ["r:0"]        # the same key
        assert run.journal()[0].retry_count == 1


def test_oversized_tool_inputs_are_refused_before_the_call(url):
    """An intent larger than max_commit_bytes: a clear error, no call, nothing journaled."""
    big = "x" * 8000           # below the 64 KiB inline limit: the intent carries it
    with durkv.open(url, max_commit_bytes=4096) as s:
        svc = Service()
        with pytest.raises(durkv.FrameTooLargeError, match="max_commit_bytes"):
            with s.run("r") as run:
                run.tool(svc.tool(), big)
        assert svc.keys == [] and run.journal() == []
        with pytest.raises(durkv.FrameTooLargeError, match="max_commit_bytes"):
            with s.run("r") as run:
                run.approve("publish", {"body": big})
        assert run.journal() == [] and s.runs()[0].status == "failed"


def test_unencodable_inputs_and_payloads_are_refused_before_anything(url):
    svc = Service()
    with durkv.open(url) as s:
        with s.run("r") as run:
            with pytest.raises(durkv.SerializationError, match="plain data"):
                run.tool(svc.tool(), object())
            with pytest.raises(durkv.SerializationError, match="payload"):
                run.approve("send", {"client": object()})
            with pytest.raises(durkv.SerializationError, match="input"):
                with s.run("r2", input={"conn": object()}):
                    pass
        assert svc.keys == [] and run.journal() == []
        assert [r.run_id for r in s.runs()] == ["r"]


def test_bad_arguments_are_config_errors():
    with durkv.open("memory://") as s:
        for kw in ({"on_drift": "ignore"}, {"on_drift": None}):
            with pytest.raises(durkv.ConfigError, match="on_drift"):
                s.run("r", **kw)
        for rid in ("", None, 42, ["r"]):
            with pytest.raises(durkv.ConfigError, match="run_id"):
                s.run(rid)
        with s.run("r") as run:
            # NaN used to be recorded and slept not at all; inf was recorded, then raised
            # OverflowError from time.sleep
            for bad in (-1, "5", float("nan"), float("inf"), 10 ** 400, True):
                with pytest.raises(durkv.ConfigError, match="sleep"):
                    run.sleep(bad)
            assert run.journal() == []
        with pytest.raises(durkv.ConfigError, match="approved"):
            s.decide("r", "0", "yes")
        with pytest.raises(durkv.ConfigError, match="done"):
            s.resolve("r", "0", done="yes")
    with pytest.raises(durkv.ConfigError, match="attempts"):
        durkv.Retry(0)
    with pytest.raises(durkv.ConfigError, match="compensation"):
        @durkv.tool(compensate=lambda receipt: None)
        def reserve(*, idempotency_key):
            pass


def test_a_caller_given_idempotency_key_is_refused_before_anything(url):
    """The key is durkv's to give: a caller's own ``idempotency_key=`` used to reach the
    call as a TypeError (after a durable intent), journaled as the tool's final failure."""
    svc = Service()
    call = svc.tool()

    async def agent(run):
        return await run.atool(call, "a", idempotency_key="mine")

    with durkv.open(url) as s:
        with s.run("r") as run:
            with pytest.raises(durkv.ConfigError, match="durkv gives the key"):
                run.tool(call, "a", idempotency_key="mine")
            with pytest.raises(durkv.ConfigError, match="durkv gives the key"):
                asyncio.run(agent(run))
            assert run.journal() == [] and svc.keys == []
            assert run.tool(call, "a") == {"n": 1}      # the step id was not used up
        assert svc.keys == ["r:0"]


# ---- tools: retries and drift ------------------------------------------------------------


def test_tool_retries_keep_the_key_and_journal_every_attempt(url):
    """Each attempt is an intent with the same key and retry_count + 1; the delays follow
    the backoff on a fake clock; a recorded final failure replays as the same exception,
    without a call, until the caller asks for a retry."""
    slept = []
    svc = Service()
    svc.fail = 3
    call = svc.tool()
    retry = durkv.Retry(3, backoff=2.0, max_delay=3.0, jitter=0.5, sleep=slept.append,
                        random=lambda: 1.0, on=ConnectionError)
    with durkv.open(url) as s:
        for _ in range(2):
            with pytest.raises(ConnectionError, match="down"), s.run("r") as run:
                run.tool(call, "x", retry=retry)
        assert svc.keys == ["r:0"] * 3             # three attempts, one key, once
        assert slept == [1.0, 1.5]                 # 2*2^0*(1-0.5), min(3, 2*2)*(1-0.5)
        (e,) = run.journal()
        assert (e.state, e.retry_count, e.idempotency_key) == ("failed", 2, "r:0")
        assert [t[0] for t in e.attempt_errors] == ["builtins.ConnectionError"] * 3
        with s.run("r") as run:
            assert run.tool(call, "x", retry_failed=True) == {"n": 4}
        assert svc.keys == ["r:0"] * 3 + ["r:0#1"]     # a new call after a failure: new key
        assert [x.state for x in run.journal()] == ["failed", "done"]


def test_tool_drift_fail_and_warn(url, caplog):
    svc = Service()
    with durkv.open(url) as s:
        with s.run("r") as run:
            run.tool(svc.tool(version="1"), "x")
        with s.run("r", on_drift="fail") as run:
            with pytest.raises(durkv.VersionDriftError, match="tool version '1', running '2'"):
                run.tool(svc.tool(version="2"), "x")
        with s.run("r") as run:                     # warn (the default): replay
            assert run.tool(svc.tool(version="2"), "x") == {"n": 1}
        assert svc.keys == ["r:0"]
        (e,) = run.journal()
        assert e.tool_version == "1" and "version drift" in e.warnings[0]
        with s.run("r") as run:                     # the warning is journaled once
            run.tool(svc.tool(version="2"), "x")
        assert len(run.journal()[0].warnings) == 1


def test_non_determinism_between_a_step_and_a_tool(url):
    svc = Service()
    with durkv.open(url) as s:
        with s.run("r") as run:
            run.step("call", lambda: 1)
        with s.run("r") as run, pytest.raises(durkv.NonDeterminismError, match="step 'call'"):
            run.tool(svc.tool(), "x")          # a tool named like the recorded step
        with s.run("r") as run, pytest.raises(durkv.NonDeterminismError):
            run.approve("call")
        assert svc.keys == []


# ---- journals through compaction and copies ----------------------------------------------


def test_a_run_replays_after_compaction_and_in_a_copy(url):
    svc = Service()
    call = svc.tool()
    with durkv.open(url) as s:
        with s.run("r", input={"job": 1}) as run:
            a = run.step("plan", lambda: "p")
            b = run.tool(call, a)
        with s.run("gone") as run:
            run.tool(call, "g")
        s.delete_runs(["gone"])
        s.compact()
        s.copy_thread("r", "r2")
    with durkv.open(url) as s:
        for rid in ("r", "r2"):
            with s.run(rid, input={"job": 1}) as run:
                assert (run.step("plan", lambda: "other"), run.tool(call, "p")) == (a, b)
                run.tool(call, "next")
        with pytest.raises(durkv.RunConflictError):
            with s.run("r2", input={"job": 2}):
                pass
        assert sorted(r.run_id for r in s.runs()) == ["r", "r2"]
    assert svc.keys == ["r:1", "gone:0", "r:2", "r2:2"]
