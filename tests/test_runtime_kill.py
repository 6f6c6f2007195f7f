"""A real SIGKILL inside a tool call, then the run executed again (issue 9's Tests).

The child (journal_agents.py) kills itself at a chosen instant inside a tool: the
only thing that survives is what the journal made durable before the call (the
intent) and what the tool did to the outside world (WORKDIR/effects.log).

- an at-most-once tool killed between intent and receipt: the next execution
  raises InDoubtError and marks the run in doubt, without calling the tool;
  ``store.resolve`` records what happened (done, with its result; or not done),
  and the run goes on from there;
- a kill during compensation does not undo anything twice: the undo that has a
  receipt replays, the one in flight is called again with the same key;
- a kill during a durable sleep leaves the run listed as sleeping until its wake
  time, and the next execution sleeps only what is left.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from journal_agents import effects, nap_agent, pay_agent, trip_agent

import durkv
import durkv.log

AGENTS = Path(__file__).with_name("journal_agents.py")


def _killed_child(path, work, agent: str, kill_at: str) -> None:
    p = subprocess.run([sys.executable, str(AGENTS), str(path), str(work), agent, kill_at],
                       capture_output=True, timeout=120)
    assert p.returncode == -9, f"the child was not killed at {kill_at}:\n{p.stderr.decode()}"


@pytest.mark.parametrize("done", [True, False])
def test_at_most_once_tool_killed_between_intent_and_receipt(tmp_path, done):
    path, work = tmp_path / "s.durkv", str(tmp_path)
    # done=True: the payment went through, then the kill; done=False: killed before it
    _killed_child(path, work, "pay", "after-pay" if done else "before-pay")
    assert effects(work) == ([("pay", "pay:1")] if done else [])

    with durkv.open(str(path)) as s:
        for _ in range(2):     # in doubt until resolved, however often it is executed
            with pytest.raises(durkv.InDoubtError, match=r"store.resolve\('pay', '1'") as ei:
                with s.run("pay") as run:
                    pay_agent(run, work)
            assert ei.value.context["key"] == "pay:1"
            assert [(r.run_id, r.status, r.step) for r in s.runs()] == [("pay", "in_doubt", "1")]
        assert len(effects(work)) == (1 if done else 0)       # never called while in doubt
        (plan, pay) = run.journal()
        assert plan.state == "done" and pay.state == "in_doubt" and pay.idempotency_key == "pay:1"

        if done:      # the operator checked the service: it happened; record its result
            s.resolve("pay", "1", done=True, result={"paid": 10}, by="ops", note="seen in PSP")
        else:         # it did not happen: the next execution calls it, with the same key
            s.resolve("pay", "1", done=False, by="ops")
        with s.run("pay") as run:
            assert pay_agent(run, work) == "shipped"
        assert run.status == "finished" and s.runs()[0].status == "finished"
        assert effects(work) == [("pay", "pay:1"), ("ship-10", "pay:2")]
        j = run.journal()
        assert [(e.planned_action, e.state) for e in j] == [
            ("plan", "done"), ("pay", "done"), ("ship", "done")]
        assert j[1].result_receipt == {"paid": 10}
        assert j[1].retry_count == (0 if done else 1)
        # done=True: the resolution is final; done=False: the call it authorized has a receipt
        with pytest.raises(durkv.DecisionConflictError if done else durkv.ConfigError,
                           match="already resolved as done" if done else "has a receipt"):
            s.resolve("pay", "1", done=False)
        with s.run("pay") as run:      # finished: a replay calls nothing
            assert pay_agent(run, work) == "shipped"
        assert len(effects(work)) == 2
    assert durkv.log.verify(str(path), deep=True).ok


def test_a_kill_during_compensation_does_not_undo_twice(tmp_path):
    path, work = tmp_path / "s.durkv", str(tmp_path)
    _killed_child(path, work, "trip", "flight")      # killed inside the second undo
    reserved = [("reserve-hotel", "trip:0"), ("reserve-flight", "trip:1"),
                ("reserve-car", "trip:2")]
    assert effects(work) == reserved + [("release-car", "trip:3"), ("release-flight", "trip:4")]

    with durkv.open(str(path)) as s:
        with s.run("trip") as run:
            out = trip_agent(run, work)
        assert out == ["released car", "released flight", "released hotel"]
        # car's undo has a receipt: not called again; flight's was in flight: called again
        # with the same key (the service deduplicates it); hotel's is new
        assert effects(work) == reserved + [
            ("release-car", "trip:3"), ("release-flight", "trip:4"),
            ("release-flight", "trip:4"), ("release-hotel", "trip:5")]
        j = run.journal()
        assert [(e.planned_action, e.idempotency_key, e.compensates, e.retry_count)
                for e in j[3:]] == [("release", "trip:3", "2", 0), ("release", "trip:4", "1", 1),
                                    ("release", "trip:5", "0", 0)]
        with s.run("trip") as run:       # a third execution replays every undo
            assert trip_agent(run, work) == out
        assert len(effects(work)) == 7
    assert durkv.log.verify(str(path), deep=True).ok


def test_a_kill_during_a_sleep_leaves_the_run_sleeping(tmp_path):
    path, work = tmp_path / "s.durkv", str(tmp_path)
    t0 = time.time()
    _killed_child(path, work, "nap", "sleep")
    with durkv.open(str(path)) as s:
        (info,) = s.runs()
        assert (info.run_id, info.status, info.step) == ("nap", "sleeping", "1")
        assert t0 + 3600 <= info.until <= time.time() + 3600
        slept = []
        later = info.until - 600          # executed again 50 minutes into the hour
        with s.run("nap", clock=lambda: later, sleep=slept.append) as run:
            assert nap_agent(run, work) == "b"
        assert slept == [pytest.approx(600)] and s.runs()[0].status == "finished"
