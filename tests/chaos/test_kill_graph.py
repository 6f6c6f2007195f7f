"""kill -9 a durkv.Graph agent at random instants, restarting it until it finishes.

The child (``graph_child.py``) runs a 500-superstep graph: each superstep the agent
makes a recorded model call and a mutating tool call, and fans out with ``Send`` to two
workers that call the tool; every 100 supersteps it asks an approval, which this test
decides between executions. After the restarts:

- every tool effect exists once by key, and a raw duplicate only where the journal
  shows a retry (an intent with retry_count + 1);
- every model call was paid once, plus at most one per kill (and only by an execution
  killed right after it);
- every approval was asked once and decided once;
- the final state equals an uninterrupted run's, and ``durkv verify`` passes.

50 kills per mode by default (plain nodes; async nodes under ``app.arun``), 1,000 with
``DURKV_SLOW_TESTS=1`` (of a 1,200-superstep graph). A second test kills 50 runs
driven at once in one process, then ``app.recover()`` finishes them all.
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
from chaos.harness import ForkServer, kill_and_collect, read_until

import durkv
import durkv.log
from durkv.runtime.journal import E_APPROVAL, E_DECISION
from durkv.runtime.view import describe

SLOW = os.environ.get("DURKV_SLOW_TESTS") == "1"
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(3600 if SLOW else 300)]

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))      # the children's modules
from graph_child import EVERY, RUN, STEPS, decision_for, drive  # noqa: E402


def _decide(store, step_id):
    e = [x for x in describe(store, RUN) if x.step_id == step_id][0]
    store.decide(RUN, step_id, decision_for(e.inputs), by="parent")


def _reference(tmp_path, mode, steps):
    """The same graph, uninterrupted, in this process: (digest, effect keys)."""
    work = tmp_path / f"ref-{mode}"
    work.mkdir()
    with durkv.open("memory://") as store:
        while True:
            what, arg = drive(store, str(work), 0, mode, steps)
            if what == "DONE":
                return arg, (work / "effects.log").read_text().split()
            _decide(store, arg)


def _model_calls(models_log: Path, steps: int, killed: set) -> int:
    """Each model call made once, again only after a kill right behind it; returns the
    number of repeated calls."""
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
        for ex in execs[:-1]:
            assert ex in killed and last_of_exec[ex] == i, \
                f"model call {i} made again though exec {ex} went on after it"
    return sum(seen.values()) - steps


@pytest.mark.parametrize("mode", ["plain", "async"])
def test_kill_graph_agent_at_random_instants(tmp_path, mode):
    kills_wanted, steps, window = (1000, 1200, 0.015) if SLOW else (50, STEPS, 0.03)
    rnd = random.Random(f"graph-{mode}-{os.getpid()}")
    digest_ref, keys_ref = _reference(tmp_path, mode, steps)
    path, work = tmp_path / "graph.durkv", tmp_path / "work"
    work.mkdir()
    kills, killed, exe, digest = 0, set(), 0, None
    started = time.monotonic()
    with ForkServer("graph_child") as server:
        while digest is None:
            exe += 1
            wait = rnd.uniform(0, window) if kills < kills_wanted else 120
            lines = server.run_child([str(path), str(work), str(exe), mode, str(steps)],
                                     str(tmp_path / "child.err"), wait)
            end = [ln for ln in lines if ln.startswith("END ")]
            if not end:
                assert kills < kills_wanted, f"the child did not finish: {lines}"
                kills += 1
                killed.add(exe)
                continue
            _, what, arg = end[0].split()
            if what == "WAITING":
                with durkv.open(str(path)) as store:
                    _decide(store, arg)
            else:
                digest = arg
    elapsed = time.monotonic() - started
    assert kills == kills_wanted, f"the graph finished after only {kills} kills"

    assert digest == digest_ref                     # the final state of an uninterrupted run
    with durkv.open(str(path)) as store:
        journal = describe(store, RUN)
        records = store.journal(RUN)
    raw = Counter((work / "effects.log").read_text().split())
    assert set(raw) == set(keys_ref) and len(keys_ref) == len(set(keys_ref))
    retries = {e.idempotency_key: e.retry_count for e in journal if e.kind == "tool"}
    for key, n in raw.items():
        assert n - 1 <= retries[key], f"{key} happened {n} times, journal retried {retries[key]}"
    repeated = _model_calls(work / "models.log", steps, killed)
    assert repeated <= kills
    approvals = Counter(r["s"] for r in records if r["e"] == E_APPROVAL)
    decisions = Counter(r["s"] for r in records if r["e"] == E_DECISION)
    assert len(approvals) == steps // EVERY and set(approvals.values()) == {1}
    assert decisions == approvals
    report = durkv.log.verify(str(path), deep=True)
    assert report.ok, report
    print(f"{mode}: {kills} kills in {elapsed:.1f}s over {exe} executions; "
          f"{sum(n - 1 for n in raw.values())} raw duplicate effects, {repeated} repeated "
          "model calls")


RECOVER_CHILD = """
import sys, time, threading, durkv
sys.path.insert(0, {here!r})
from graph_recover import make_graph
path, n = sys.argv[1], int(sys.argv[2])
with durkv.open(path, durability="async") as store:
    app = make_graph({work!r}, 0.05).compile(store)
    threads = [threading.Thread(target=app.run, args=({{"log": ["start"]}},),
                                kwargs={{"run_id": f"run-{{i}}"}}) for i in range(n)]
    for t in threads:
        t.start()
    while len(store.threads()) < n:     # every run has committed its input
        time.sleep(0.005)
    print("GO", flush=True)
    for t in threads:
        t.join()
    print("END", flush=True)
    time.sleep(600)
"""


def test_recover_resumes_every_run_killed_mid_flight(tmp_path):
    """50 runs driven at once by one process, SIGKILLed mid-flight; app.recover() in a
    new process finishes every one with each effect once by key and each run's state
    equal to an uninterrupted run's."""
    from graph_recover import STEPS as R_STEPS, expected_state, make_graph
    n = 50
    work = tmp_path / "work"
    work.mkdir()
    path = str(tmp_path / "runs.durkv")
    code = RECOVER_CHILD.format(here=str(HERE), work=str(work))
    proc = subprocess.Popen([sys.executable, "-c", code, path, str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    buf = bytearray()
    assert read_until(proc.stdout.fileno(), buf, b"GO\n", time.monotonic() + 60), \
        proc.stderr.read().decode()[-2000:]
    time.sleep(0.4)
    lines, _ = kill_and_collect(proc, buf)
    assert "END" not in lines, "every run finished before the kill: make them longer"
    with durkv.open(path) as store:
        app = make_graph(str(work)).compile(store)
        before = {r.run_id: r.status for r in store.runs()}
        results = app.recover()
        assert len(results) == sum(1 for s in before.values() if s != "finished") > 0
        assert all(r.status == "finished" for r in results)
        for i in range(n):
            assert app.state(f"run-{i}").state == expected_state(), i
        assert app.recover() == []
    raw = Counter((work / "effects.log").read_text().split())
    assert set(raw) == {f"run-{i}:{k}:step:0:1" for i in range(n) for k in range(R_STEPS)}
    with durkv.open(path) as store:
        retries = {(r.run_id, e.idempotency_key): e.retry_count
                   for r in store.runs() for e in describe(store, r.run_id) if e.kind == "tool"}
    for key, c in raw.items():
        assert c - 1 <= retries[(key.split(":")[0], key)]
