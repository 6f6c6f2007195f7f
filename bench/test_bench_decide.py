"""A decision from another process to a run waiting on a local store (issue 19).

An agent process (tests/decide_child.py) drives N runs, each waiting on its approval,
and polls their journals every ``POLL_S``. This process decides them one at a time and
the agent reports the wall-clock time at which the step after the approval began.
Measured side by side in one run, medians:

- ``decide``: ``store.decide`` on a handle of this process opened beside the agent
  (several writers): returns once the DECISION is fdatasync'd;
- round trip (API): from just before that ``decide`` to the agent's next step;
- round trip (CLI): from starting ``durkv approve STORE RUN STEP`` as a subprocess to the
  agent's next step (interpreter start-up, import, open, decide, close);
- the baselines: one ``append_journal(..., durable=True)`` on the same handle (what a
  decision must at least cost), and ``python -c "import durkv.cli"`` (the CLI's start-up).

Target: the API round trip stays within the agent's poll interval plus 10 durable
appends (the exchange adds no wait of its own beyond the poll).

Env: DURKV_BENCH_QUICK=1 (fewer rounds), DURKV_BENCH_DIR (the disk to measure).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import QUICK, record

import durkv

CHILD = str(Path(__file__).resolve().parents[1] / "tests" / "decide_child.py")
POLL_S = 0.005
ROUNDS = 6 if QUICK else 20


def _agent(path: str, outbox: Path, runs: list[str]) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, CHILD, "agent", path, str(outbox), ",".join(runs),
                          str(POLL_S)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    for _ in runs:
        line = p.stdout.readline().split()
        assert line and line[0] == "waiting", p.stderr.read()
    return p


def _next_step_at(agent: subprocess.Popen, rid: str) -> float:
    line = agent.stdout.readline().split()
    assert line[:2] == ["done", rid], (line, agent.stderr.read())
    return float(line[3])


def _ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


def test_decision_round_trip_local(benchmark, bench_root):
    path = str(bench_root / f"decide-{time.monotonic_ns()}")
    runs = [f"r{i}" for i in range(2 * ROUNDS)]

    def once():
        agent = _agent(path, bench_root / "outbox", runs)
        decide, api, cli, append, start = [], [], [], [], []
        try:
            with durkv.open(path, index_every=0) as s:
                for i in range(ROUNDS):
                    t0 = time.perf_counter()
                    s.append_journal("bench-append", {"i": i}, durable=True)
                    append.append(time.perf_counter() - t0)
                    rid = runs[i]
                    w0, t0 = time.time(), time.perf_counter()
                    s.decide(rid, "0", True, by="bench")
                    decide.append(time.perf_counter() - t0)
                    api.append(_next_step_at(agent, rid) - w0)
            for i in range(ROUNDS):
                rid = runs[ROUNDS + i]
                w0 = time.time()
                r = subprocess.run([sys.executable, "-m", "durkv.cli", "approve", path, rid,
                                    "0"], capture_output=True, text=True)
                assert r.returncode == 0, r.stderr
                cli.append(_next_step_at(agent, rid) - w0)
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-c", "import durkv.cli"], check=True)
                start.append(time.perf_counter() - t0)
            assert agent.wait(60) == 0
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        return {k: _ms(v) for k, v in (("decide", decide), ("api", api), ("cli", cli),
                                       ("append", append), ("start", start))}

    ms = benchmark.pedantic(once, rounds=1, iterations=1)
    print(f"\nmedian ms: decide {ms['decide']:.2f}, durable append {ms['append']:.2f}, "
          f"round trip API {ms['api']:.1f} (agent polls every {POLL_S * 1000:.0f} ms), "
          f"round trip CLI {ms['cli']:.1f}, CLI start-up alone {ms['start']:.1f}")
    budget = POLL_S * 1000 + 10 * ms["append"]
    record(benchmark, "decision round trip (API) vs poll + 10 durable appends",
           ratio=ms["api"] / budget, target="<= 1x", ok=ms["api"] <= budget,
           **{k: round(v, 2) for k, v in ms.items()})
