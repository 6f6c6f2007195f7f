"""Several processes committing to one store (issue 17): aggregate commits/s.

Each worker process opens the store, waits at a start gate, then commits ``sync``
checkpoints (one small put each, single-threaded) for ``SECONDS`` and reports how many
it made. Compared:

- 4 processes on one durkv store vs 1 process alone (target >= 2x aggregate: their
  fdatasyncs run outside every lock and overlap, one fsync covering the others' writes);
- 4 processes on one durkv store vs 4 processes on one SQLite database in WAL mode with
  ``synchronous=FULL``, each commit one INSERT in its own transaction (target >= 1.5x:
  SQLite holds its write lock through the WAL's fsync).

Env: DURKV_BENCH_QUICK=1 (short runs), DURKV_BENCH_DIR (the disk to measure).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from benchlib import QUICK, record

SECONDS = 1.0 if QUICK else 3.0

_DURKV = r"""
import json, os, sys, time
import durkv
path, gate, k, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = durkv.open(path, durability="sync")
print("ready", flush=True)
while not os.path.exists(gate):
    time.sleep(0.001)
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < secs:
    s.put(f"t{k}", "", f"{n:08d}", checkpoint={"n": n}, metadata={"step": n},
          values={"msg": "x" * 200}, versions={"msg": n + 1})
    n += 1
el = time.perf_counter() - t0
s.close()
print(json.dumps({"n": n, "s": el}), flush=True)
"""

_SQLITE = r"""
import json, os, sqlite3, sys, time
path, gate, k, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
db = sqlite3.connect(path, timeout=60, isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE IF NOT EXISTS ck (thread TEXT, id TEXT, meta BLOB, body BLOB, "
           "PRIMARY KEY (thread, id))")
print("ready", flush=True)
while not os.path.exists(gate):
    time.sleep(0.001)
n, t0 = 0, time.perf_counter()
body = json.dumps({"checkpoint": {"n": 0}, "values": {"msg": "x" * 200}}).encode()
while time.perf_counter() - t0 < secs:
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO ck VALUES (?, ?, ?, ?)", (f"t{k}", f"{n:08d}", b"{}", body))
    db.execute("COMMIT")
    n += 1
el = time.perf_counter() - t0
db.close()
print(json.dumps({"n": n, "s": el}), flush=True)
"""


def run_procs(code: str, path: str, nproc: int, root) -> float:
    """Aggregate commits/s of ``nproc`` workers started together."""
    gate = str(root / f"gate-{time.monotonic_ns()}")
    procs = [subprocess.Popen([sys.executable, "-c", code, path, gate, str(k), str(SECONDS)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(nproc)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    open(gate, "w").close()
    total = 0.0
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        r = json.loads(out.strip().splitlines()[-1])
        total += r["n"] / r["s"]
    return total


def test_four_processes_sync(benchmark, bench_root):
    def once():
        one = run_procs(_DURKV, str(bench_root / f"one-{time.monotonic_ns()}"), 1, bench_root)
        four = run_procs(_DURKV, str(bench_root / f"four-{time.monotonic_ns()}"), 4, bench_root)
        lite = run_procs(_SQLITE, str(bench_root / f"lite-{time.monotonic_ns()}.db"), 4,
                         bench_root)
        return one, four, lite

    one, four, lite = benchmark.pedantic(once, rounds=1, iterations=1)
    print(f"\nsync commits/s: 1 process {one:.0f}, 4 processes {four:.0f}, "
          f"sqlite WAL 4 processes {lite:.0f}")
    record(benchmark, "4 processes sync: aggregate vs 1 process", ratio=four / one,
           target=">= 2x", ok=four / one >= 2, one=round(one), four=round(four))
    record(benchmark, "4 processes sync: durkv vs sqlite WAL (4 processes)", ratio=four / lite,
           target=">= 1.5x", ok=four / lite >= 1.5, durkv=round(four), sqlite=round(lite))
