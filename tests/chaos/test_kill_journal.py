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

50 kills by default (about 20-40 s), 1,000 with ``DURKV_SLOW_TESTS=1``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from chaos.harness import kill_and_collect, read_until

import durkv
import durkv.log
from durkv.runtime.journal import E_APPROVAL, E_DECISION
from durkv.runtime.view import describe

SLOW = os.environ.get("DURKV_SLOW_TESTS") == "1"
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(3600 if SLOW else 300)]

CHILD = Path(__file__).with_name("journal_child.py")

sys.path.insert(0, str(CHILD.parent))
from journal_child import RUN, decision_for, drive  # noqa: E402


def _shape(journal):
    """What must not depend on the kills (a sleep's result is its wall-clock wake time)."""
    return [(e.step_id, e.kind, e.planned_action,
             None if e.kind == "sleep" else e.result_receipt, e.approval_status)
            for e in journal]


def _reference(tmp_path, mode):
    """The same agent, uninterrupted, in this process."""
    work = tmp_path / "ref"
    work.mkdir()
    with durkv.open("memory://") as store:
        while True:
            what, arg = drive(store, str(work), 0, mode)
            if what == "WAITING":
                e = [x for x in describe(store, RUN) if x.step_id == arg][0]
                store.decide(RUN, arg, decision_for(e.inputs), by="parent")
            else:
                return arg, _shape(describe(store, RUN)), work


def _decide(path, step_id):
    with durkv.open(str(path)) as store:
        e = [x for x in describe(store, RUN) if x.step_id == step_id][0]
        store.decide(RUN, step_id, decision_for(e.inputs), by="parent")


@pytest.mark.parametrize("mode", ["plain", "async"])
def test_kill_agent_at_random_instants(tmp_path, mode):
    kills_wanted = 1000 if SLOW else 50
    rnd = random.Random(f"journal-{mode}-{os.getpid()}")
    digest_ref, journal_ref, ref_work = _reference(tmp_path, mode)
    path = tmp_path / "agent.durkv"
    work = tmp_path / "work"
    work.mkdir()
    kills, killed_execs, exe, digest = 0, set(), 0, None
    started = time.monotonic()
    # the kill window shrinks as kills accumulate, so that the agent is still running
    # when the last wanted kill lands
    window = 0.03 if not SLOW else 0.002
    while digest is None:
        exe += 1
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(path), str(work), str(exe), mode],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        buf = bytearray()
        fd = proc.stdout.fileno()
        try:
            # kill at a random instant of the work, not of the replay before it
            if not read_until(fd, buf, b"GO\n", time.monotonic() + 30):
                proc.kill()
                proc.wait()
                pytest.fail(f"child never became ready: {proc.stderr.read().decode()[-3000:]}")
            wait = rnd.uniform(0, window) if kills < kills_wanted else 120
            if read_until(fd, buf, b"END ", time.monotonic() + wait):
                tail = bytearray(buf[buf.index(b"END "):])    # then the whole END line
                read_until(fd, tail, b"\n", time.monotonic() + 5)
                buf[buf.index(b"END "):] = tail
        finally:
            lines, err = kill_and_collect(proc, buf)
        end = [ln for ln in lines if ln.startswith("END ")]
        if not end:
            assert kills < kills_wanted, f"the child did not finish:\n{err[-3000:]}"
            kills += 1
            killed_execs.add(exe)
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
    calls = [tuple(map(int, ln.split())) for ln in (work / "models.log").read_text().split("\n")
             if ln]
    last_of_exec = {}
    for ex, i in calls:
        last_of_exec[ex] = i
    seen = Counter(i for _, i in calls)
    assert set(seen) == set(range(300))
    by_step: dict[int, list[int]] = {}
    for ex, i in calls:
        by_step.setdefault(i, []).append(ex)
    for i, execs in by_step.items():
        for ex in execs[:-1]:      # every call but the last was lost: killed right after it
            assert ex in killed_execs and last_of_exec[ex] == i, \
                f"model call {i} made again though exec {ex} went on after it"
    # every approval requested once and decided once
    approvals = Counter(r["s"] for r in records if r["e"] == E_APPROVAL)
    decisions = Counter(r["s"] for r in records if r["e"] == E_DECISION)
    assert len(approvals) == 6 and set(approvals.values()) == {1}
    assert decisions == approvals
    report = durkv.log.verify(str(path), deep=True)
    assert report.ok, report
    print(f"{mode}: {kills} kills in {elapsed:.1f}s over {exe} executions; "
          f"{dup_effects} raw duplicate effects, {sum(seen.values()) - 300} repeated model calls")


LG_CHILD = Path(__file__).with_name("journal_lg_child.py")


def test_kill_langgraph_agent_at_random_instants(tmp_path):
    """The same for a LangGraph graph whose node calls durkv.langgraph.step/tool: a node
    that LangGraph re-runs after a kill meets its recorded receipt."""
    pytest.importorskip("langgraph")
    import journal_lg_child as lg

    kills_wanted = 100 if SLOW else 12
    window = 0.004 if SLOW else 0.05      # a kill's share of the graph's ~0.5 s of work
    rnd = random.Random(f"journal-lg-{os.getpid()}")
    ref = tmp_path / "ref"
    ref.mkdir()
    from durkv.langgraph import DurkvSaver

    with DurkvSaver.open("memory://") as saver:
        digest_ref = lg.drive(saver, str(ref), 0)
    path, work = tmp_path / "lg.durkv", tmp_path / "work"
    work.mkdir()
    kills, killed_execs, exe, digest = 0, set(), 0, None
    while digest is None:
        exe += 1
        proc = subprocess.Popen([sys.executable, str(LG_CHILD), str(path), str(work), str(exe)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        buf = bytearray()
        fd = proc.stdout.fileno()
        try:
            if not read_until(fd, buf, b"GO\n", time.monotonic() + 60):
                proc.kill()
                proc.wait()
                pytest.fail(f"child never became ready: {proc.stderr.read().decode()[-3000:]}")
            wait = rnd.uniform(0, window) if kills < kills_wanted else 120
            if read_until(fd, buf, b"END ", time.monotonic() + wait):
                tail = bytearray(buf[buf.index(b"END "):])
                read_until(fd, tail, b"\n", time.monotonic() + 5)
                buf[buf.index(b"END "):] = tail
        finally:
            lines, err = kill_and_collect(proc, buf)
        end = [ln for ln in lines if ln.startswith("END ")]
        if not end:
            assert kills < kills_wanted, f"the child did not finish:\n{err[-3000:]}"
            kills += 1
            killed_execs.add(exe)
            continue
        digest = end[0].split()[2]
    assert kills == kills_wanted, f"the graph finished after only {kills} kills"
    assert digest == digest_ref
    raw = Counter((work / "effects.log").read_text().split())
    with DurkvSaver.open(str(path)) as saver:      # journal values use LangGraph's serde
        journal = describe(saver.store, lg.THREAD)
    retries = {e.idempotency_key: e.retry_count for e in journal if e.kind == "tool"}
    # one logical effect per superstep (keys carry LangGraph's task ids), each in the journal
    done = [e for e in journal if e.kind == "tool" and e.state == "done"]
    assert sorted(e.result_receipt for e in done) == sorted(f"r{i}" for i in range(lg.STEPS))
    # LangGraph re-runs a killed node under the same task id: the same keys, no new effects
    assert set(raw) == {e.idempotency_key for e in done}
    for key, n in raw.items():
        assert n - 1 <= retries[key], f"{key} happened {n} times, journal retried {retries[key]}"
    print(f"langgraph: {kills} kills over {exe} executions; "
          f"{sum(n - 1 for n in raw.values())} raw duplicate effects")
