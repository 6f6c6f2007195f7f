"""kill -9 a 300-step agent driven through the run journal at random instants.

The child (``journal_child.py``) makes a recorded model call per step, a mutating
tool call that appends its key to a file and fsyncs, an approval every 50 steps
(decided here, between executions) and one sleep. We SIGKILL it at random
moments, restarting until it finishes, then check the journal's promises:

- every logical tool effect exists once when deduplicated by key, and every raw
  duplicate is matched by a journal retry (an intent with retry_count + 1);
- a model call was only made again when the execution that made it first was
  killed right after it (before its result was recorded);
- every approval was requested once and decided once;
- the final result and the journal equal an uninterrupted run's.

50 kills by default (about 5 s each here), 1,000 (of a 1,200-step agent) with
``DURKV_SLOW_TESTS=1``. Each
execution is a fork of one server process that imported the child once
(forkserver.py): a restart costs milliseconds, not an interpreter start.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from chaos.harness import ForkServer

import durkv
import durkv.log
from durkv.runtime.journal import E_APPROVAL, E_DECISION
from durkv.runtime.view import describe

SLOW = os.environ.get("DURKV_SLOW_TESTS") == "1"
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(3600 if SLOW else 300)]

sys.path.insert(0, str(Path(__file__).parent))      # the children's modules
from journal_child import RUN, STEPS, decision_for, drive  # noqa: E402


def _shape(journal):
    """What must not depend on the kills (a sleep's result is its wall-clock wake time)."""
    return [(e.step_id, e.kind, e.planned_action,
             None if e.kind == "sleep" else e.result_receipt, e.approval_status)
            for e in journal]


def _reference(tmp_path, mode, steps):
    """The same agent, uninterrupted, in this process."""
    work = tmp_path / "ref"
    work.mkdir()
    with durkv.open("memory://") as store:
        while True:
            what, arg = drive(store, str(work), 0, mode, steps)
            if what == "WAITING":
                e = [x for x in describe(store, RUN) if x.step_id == arg][0]
                store.decide(RUN, arg, decision_for(e.inputs), by="parent")
            else:
                return arg, _shape(describe(store, RUN)), work


def _decide(path, step_id):
    with durkv.open(str(path)) as store:
        e = [x for x in describe(store, RUN) if x.step_id == step_id][0]
        store.decide(RUN, step_id, decision_for(e.inputs), by="parent")


def _model_calls_lost_only_to_kills(models_log: Path, steps: int, killed_execs: set) -> int:
    """Every model call was recorded, and one was made again only when the execution
    that made it was killed right after it (before its result was recorded). Returns
    the number of repeated calls."""
    calls = [tuple(map(int, ln.split())) for ln in models_log.read_text().split("\n") if ln]
    last_of_exec = {}
    for ex, i in calls:
        last_of_exec[ex] = i
    seen = Counter(i for _, i in calls)
    assert set(seen) == set(range(steps))
    by_step: dict[int, list[int]] = {}
    for ex, i in calls:
        by_step.setdefault(i, []).append(ex)
    for i, execs in by_step.items():
        for ex in execs[:-1]:      # every call but the last was lost: killed right after it
            assert ex in killed_execs and last_of_exec[ex] == i, \
                f"model call {i} made again though exec {ex} went on after it"
    return sum(seen.values()) - steps


@pytest.mark.parametrize("mode", ["plain", "async"])
def test_kill_agent_at_random_instants(tmp_path, mode):
    # a kill lands U(0, window) after GO: a small share of the agent's work (~10 ms a
    # step), so that it is still running when the last wanted kill lands. 1,000 kills
    # need more steps than 300 (with a 2 ms window, under 2% of them came after a
    # model call: the rest hit the replay and the first call, again and again).
    kills_wanted, steps, window = (1000, 1200, 0.01) if SLOW else (50, STEPS, 0.03)
    base, killed_order = window, []
    rnd = random.Random(f"journal-{mode}-{os.getpid()}")
    digest_ref, journal_ref, ref_work = _reference(tmp_path, mode, steps)
    path = tmp_path / "agent.durkv"
    work = tmp_path / "work"
    work.mkdir()
    kills, killed_execs, exe, digest = 0, set(), 0, None
    started = time.monotonic()
    with ForkServer("journal_child") as server:
        while digest is None:
            exe += 1
            # the kill clock starts at GO: a random instant of the work, not of the replay
            wait = rnd.uniform(0, window) if kills < kills_wanted else 120
            lines = server.run_child([str(path), str(work), str(exe), mode, str(steps)],
                                     str(tmp_path / "child.err"), wait)
            end = [ln for ln in lines if ln.startswith("END ")]
            if not end:
                assert kills < kills_wanted, f"the child did not finish: {lines}"
                kills += 1
                killed_execs.add(exe)
                killed_order.append(exe)
                window = _widened(window, base, kills, work / "models.log", killed_order)
                continue
            _, what, arg = end[0].split()
            if what == "WAITING":
                _decide(path, arg)
            else:
                digest = arg
    elapsed = time.monotonic() - started
    assert kills == kills_wanted, f"the agent finished after only {kills} kills"

    with durkv.open(str(path)) as store:
        journal = describe(store, RUN)
        records = store.journal(RUN)
    # the final state equals an uninterrupted run's
    assert digest == digest_ref
    assert _shape(journal) == journal_ref
    # every effect once by key; raw duplicates only where the journal retried
    raw = Counter((work / "effects.log").read_text().split())
    ref_keys = (ref_work / "effects.log").read_text().split()
    assert set(raw) == set(ref_keys) and len(ref_keys) == len(set(ref_keys))
    retries = {e.idempotency_key: e.retry_count for e in journal if e.kind == "tool"}
    for key, n in raw.items():
        assert n - 1 <= retries[key], f"{key} happened {n} times, journal retried {retries[key]}"
    dup_effects = sum(n - 1 for n in raw.values())
    # a model call was repeated only after a kill right behind it
    repeated = _model_calls_lost_only_to_kills(work / "models.log", steps, killed_execs)
    in_work = _kills_in_the_work(work / "models.log", killed_execs)
    assert in_work, "every kill landed before the agent's work began: widen the window"
    # every approval requested once and decided once
    approvals = Counter(r["s"] for r in records if r["e"] == E_APPROVAL)
    decisions = Counter(r["s"] for r in records if r["e"] == E_DECISION)
    assert len(approvals) == steps // 50 and set(approvals.values()) == {1}
    assert decisions == approvals
    report = durkv.log.verify(str(path), deep=True)
    assert report.ok, report
    print(f"{mode}: {kills} kills ({in_work} in the agent's work) in {elapsed:.1f}s over "
          f"{exe} executions, window {window * 1e3:.0f} ms; "
          f"{dup_effects} raw duplicate effects, {repeated} repeated model calls")


def _kills_in_the_work(models_log: Path, killed_execs: set) -> int:
    """How many killed executions had made a model call (the kill landed in the agent's
    work, not in its start)."""
    if not models_log.exists():
        return 0
    made = {int(ln.split()[0]) for ln in models_log.read_text().split("\n") if ln}
    return len(made & killed_execs)


def _widened(window: float, base: float, kills: int, models_log: Path, killed: list) -> float:
    """The kill window, steered every 5 kills so that about half of them land in the work:
    x1.25 (up to 2 s) when none of the last 5 did, back towards ``base`` when 4 or more
    did. On a loaded machine a child's start can outlast ``base``, and then every kill
    would hit the start and the test would check nothing; a window left wide lets each
    kill in the work run many supersteps, and the graph would finish too soon."""
    if kills % 5:
        return window
    in_work = _kills_in_the_work(models_log, set(killed[-5:]))
    if in_work == 0:
        return min(window * 1.25, 2.0)
    if in_work >= 4:
        return max(window / 1.25, base)
    return window


def _lg_shape(journal):
    """The journal without its step ids (they carry LangGraph's task ids, which derive
    from checkpoint ids: time-based, so another run has others)."""
    return [(e.kind, e.planned_action, e.result_receipt, e.state, e.generation)
            for e in journal]


def test_kill_langgraph_agent_at_random_instants(tmp_path):
    """The same for a LangGraph graph whose node calls durkv.langgraph.step/tool: a node
    that LangGraph re-runs after a kill meets its recorded receipt.

    A fresh process would spend 1.5-3 s importing LangGraph per restart, so each
    execution is a fork of a server that imported it once (forkserver.py); the child
    opens the store after the fork, and is SIGKILLed by its pid."""
    pytest.importorskip("langgraph")
    import journal_lg_child as lg

    # each execution spends 15-80 ms after GO before its first new model call (a fork's
    # first invoke; ~70 ms where no bytecode is written, as in CI): a kill lands U(0, 100
    # ms) after GO, so some land in the work, the rest in the resume. A kill lets ~1.3
    # supersteps (~14 ms each) through on average: 1,000 kills need ~1,300 of work (at
    # 1,200 the graph finished after 938).
    kills_wanted, steps = (1000, 3000) if SLOW else (50, lg.STEPS)
    window = base = 0.1
    killed_order = []
    rnd = random.Random(f"journal-lg-{os.getpid()}")
    ref = tmp_path / "ref"
    ref.mkdir()
    from durkv.langgraph import DurkvSaver

    with DurkvSaver.open("memory://") as saver:
        digest_ref = lg.drive(saver, str(ref), 0, steps)
        journal_ref = _lg_shape(describe(saver.store, lg.THREAD))
    path, work = tmp_path / "lg.durkv", tmp_path / "work"
    work.mkdir()
    kills, killed_execs, exe, digest = 0, set(), 0, None
    started = time.monotonic()
    with ForkServer("journal_lg_child") as server:
        while digest is None:
            exe += 1
            wait = rnd.uniform(0, window) if kills < kills_wanted else 120
            lines = server.run_child([str(path), str(work), str(exe), str(steps)],
                                     str(tmp_path / "child.err"), wait)
            end = [ln for ln in lines if ln.startswith("END ")]
            if not end:
                assert kills < kills_wanted, f"the child did not finish: {lines}"
                kills += 1
                killed_execs.add(exe)
                killed_order.append(exe)
                window = _widened(window, base, kills, work / "models.log", killed_order)
                continue
            digest = end[0].split()[2]
    elapsed = time.monotonic() - started
    assert kills == kills_wanted, f"the graph finished after only {kills} kills"
    # the final state equals an uninterrupted run's
    assert digest == digest_ref
    with DurkvSaver.open(str(path)) as saver:      # journal values use LangGraph's serde
        journal = describe(saver.store, lg.THREAD)
    assert _lg_shape(journal) == journal_ref
    retries = {e.idempotency_key: e.retry_count for e in journal if e.kind == "tool"}
    # one logical effect per superstep (keys carry LangGraph's task ids), each in the journal
    done = [e for e in journal if e.kind == "tool" and e.state == "done"]
    assert sorted(e.result_receipt for e in done) == sorted(f"r{i}" for i in range(steps))
    # LangGraph re-runs a killed node under the same task id: the same keys, no new
    # effects; every raw duplicate is matched by a journal retry
    raw = Counter((work / "effects.log").read_text().split())
    assert set(raw) == {e.idempotency_key for e in done}
    for key, n in raw.items():
        assert n - 1 <= retries[key], f"{key} happened {n} times, journal retried {retries[key]}"
    repeated = _model_calls_lost_only_to_kills(work / "models.log", steps, killed_execs)
    in_work = _kills_in_the_work(work / "models.log", killed_execs)
    assert in_work, "every kill landed before the graph's work began: widen the window"
    report = durkv.log.verify(str(path), deep=True)
    assert report.ok, report
    print(f"langgraph: {kills} kills ({in_work} in the graph's work) in {elapsed:.1f}s over "
          f"{exe} executions, window {window * 1e3:.0f} ms; "
          f"{sum(n - 1 for n in raw.values())} raw duplicate effects, {repeated} repeated "
          "model calls")
