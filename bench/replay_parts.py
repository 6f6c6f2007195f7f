"""Where a replayed step's microseconds go (docs/BENCHMARKS.md, issue 20, branch replayc).

CPU time per step of each part of re-executing a 100,000-step run, best of 7, for the
durkv this Python imports: run it with two venvs one after the other to compare
versions. ``python bench/replay_parts.py STORE_PATH`` (the store is made if missing).
"""

import gc
import os
import sys
import time

import durkv
from durkv.runtime import journal
from durkv.serde import default_serde

RESULT = {"text": "x" * 200, "tokens": 57}
N = 100_000


def model(i):
    return RESULT


def best(f, k=7):
    ts = []
    for _ in range(k):
        gc.collect()
        t0 = time.process_time()
        f()
        ts.append(time.process_time() - t0)
    return min(ts) / N * 1e6


path = sys.argv[1]
if not os.path.exists(path):
    with durkv.open(path, durability="exit") as st, st.run("r") as run:
        for i in range(N):
            run.step("model", model, i)
out = {}
t0 = time.process_time()
for _ in range(3):
    durkv.open(path).close()
out["store open (durkv.open + close)"] = (time.process_time() - t0) / 3 / N * 1e6
with durkv.open(path) as st:
    out["read the run's heads (journal_heads)"] = best(lambda: st.journal_heads("r"))
    h = st.journal_heads("r")
    scan = getattr(journal, "index", None) or getattr(journal, "scan", None)
    out["index (scan before) of the heads (C)"] = best(lambda: scan(h))

    def fold():
        with journal.bulk_load():
            journal.fold_lazy("r", h)
    out["fold_lazy (the index + the other records)"] = best(fold)

    def open_close():
        with st.run("r"):
            pass
    out["open of the run, all in (with store.run, no step)"] = opened = best(open_close)

    def replay():
        with st.run("r") as run:
            for i in range(N):
                run.step("model", model, i)
    out["run.step, replayed (open + N steps, less the open)"] = best(replay) - opened

    def dumps():
        for i in range(N):
            default_serde.dumps([[i], {}])
    out["serde.dumps([[i], {}])"] = best(dumps)
    b = default_serde.dumps(RESULT)

    def loads():
        for _ in range(N):
            default_serde.loads(b)
    out["serde.loads(result)"] = best(loads)
    lazy = journal.fold_lazy("r", h).lazy
    if hasattr(lazy, "replay"):
        def index_replay():
            for i in range(N):
                lazy.replay(i, "model", (i,), {}, None, default_serde.loads)
        out["Index.replay (C: the compare and the decode)"] = best(index_replay)
for k, v in out.items():
    print(f"{k:55s} {v:6.2f}")
