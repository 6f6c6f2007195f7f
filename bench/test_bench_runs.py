"""`store.runs()` (what `durkv runs` lists) over long journals, side by side with the eager
fold of the same journals -- what it cost before it read them lazily (GUARANTEES 16.11).

| benchmark  | measures                                                   | target       |
|------------|------------------------------------------------------------|--------------|
| runs-list  | store.runs() + each run's size, vs eager fold + frame reads | (reported)   |

Env: DURKV_BENCH_QUICK=1 (N = 10,000 steps instead of 100,000), DURKV_BENCH_DIR.
"""

from __future__ import annotations

import time

import pytest
from benchlib import QUICK, median_time, record

import durkv
from durkv.log import SegmentLog
from durkv.runtime.journal import fold

N_STEPS = 10_000 if QUICK else 100_000
RUNS = 4
RESULT = {"text": "x" * 200, "tokens": 57}


@pytest.mark.benchmark(group="runs-list")
def test_listing_runs_vs_the_eager_fold(benchmark, bench_root):
    path = str(bench_root / "runs.durkv")
    with durkv.open(path, durability="exit") as store:
        for r in range(RUNS):
            with store.run(f"r{r}") as run:
                for i in range(N_STEPS // RUNS):
                    run.step("model", lambda i: RESULT, i)

    def listing():
        with durkv.open(path, read_only=True) as store:
            return [(i.steps, store.journal_bytes(i.run_id)) for i in store.runs()]

    def eager():        # the listing as it was: every record decoded, every frame read
        with durkv.open(path, read_only=True) as store, \
                SegmentLog.open(path, read_only=True) as log:
            out = []
            for rid in store.journal_runs():
                n = len(fold(rid, store.journal(rid)).order)
                out.append((n, sum(24 + len(log.read(lsn))
                                   for lsn in store._index.ix.journals[rid])))
            return out

    assert listing() == eager()
    rounds = 3
    t_eager = median_time(eager, rounds)
    t0 = time.perf_counter()
    benchmark.pedantic(listing, rounds=rounds, iterations=1)
    t_lazy = (time.perf_counter() - t0) / rounds
    record(benchmark, "store.runs() + sizes vs the eager fold (time ratio)",
           ratio=t_lazy / t_eager, target="(reported)", ok=True,
           ms_listing=round(t_lazy * 1e3, 1), ms_eager=round(t_eager * 1e3, 1),
           steps=N_STEPS, runs=RUNS)
