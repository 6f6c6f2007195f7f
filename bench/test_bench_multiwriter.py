"""Several processes committing to one store (issue 17): aggregate commits/s.

Each worker process opens the store, waits at a start gate, then commits ``sync``
checkpoints (one small put each, single-threaded) for ``SECONDS`` and reports how many
it made. Compared:

- 4 processes on one durkv store vs 1 process alone (target >= 2x aggregate: their
  fdatasyncs run outside every lock and overlap, one fsync covering the others' writes);
- 4 processes on one durkv store vs 4 processes on one SQLite database in WAL mode with
  ``synchronous=FULL``, each commit one INSERT in its own transaction (target >= 1.5x:
  SQLite holds its write lock through the WAL's fsync).

And one process alone, side by side with the commit before issue 17
(``DURKV_BENCH_BASELINE=70cd864``: that commit is ``git archive``d into the temp dir and
built in a venv of its own, once; the same worker script then runs under both builds,
alternating), for ``sync``, ``async`` and ``exit`` (target: no slower).

Rounds alternate the configurations and the figures are medians: on a shared 2-core box
the disk's and the CPUs' load changes from second to second, so only side-by-side ratios
mean anything.

Env: DURKV_BENCH_QUICK=1 (short runs), DURKV_BENCH_DIR (the disk to measure),
DURKV_BENCH_BASELINE (a commit of this repository to compare one process with).
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from benchlib import QUICK, record

SECONDS = 1.0 if QUICK else 3.0
ROUNDS = 1 if QUICK else 3

_DURKV = r"""
import json, os, sys, time
import durkv
path, gate, k, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = durkv.open(path, durability="sync")
syncs = durkv.log.fdatasync_count
print("ready", flush=True)
while not os.path.exists(gate):
    time.sleep(0.001)
f0 = syncs()
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < secs:
    s.put(f"t{k}", "", f"{n:08d}", checkpoint={"n": n}, metadata={"step": n},
          values={"msg": "x" * 200}, versions={"msg": n + 1})
    n += 1
el = time.perf_counter() - t0
f = syncs() - f0
s.close()
print(json.dumps({"n": n, "s": el, "syncs": f}), flush=True)
"""

_SQLITE = r"""
import json, os, sqlite3, sys, time
path, gate, k, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
db = sqlite3.connect(path, timeout=60, isolation_level=None)    # WAL and table: _sqlite_db
db.execute("PRAGMA synchronous=FULL")
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


def _sqlite_db(path: str) -> str:
    """A new database in WAL mode with the workers' table, made before they start: four
    processes switching a new file to WAL at once get "database is locked" (the switch
    takes no busy timeout); the mode persists in the file, ``synchronous`` does not."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE ck (thread TEXT, id TEXT, meta BLOB, body BLOB, "
               "PRIMARY KEY (thread, id))")
    db.close()
    return path


def run_procs(code: str, path: str, nproc: int, root, stats: dict | None = None) -> float:
    """Aggregate commits/s of ``nproc`` workers started together (``stats``: also the
    commits and fdatasyncs they counted, summed)."""
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
        if stats is not None:
            stats["n"] = stats.get("n", 0) + r["n"]
            stats["syncs"] = stats.get("syncs", 0) + r.get("syncs", 0)
    return total


def test_four_processes_sync(benchmark, bench_root):
    def once():
        rounds = []
        stats: dict = {}
        for _ in range(ROUNDS):
            one = run_procs(_DURKV, str(bench_root / f"one-{time.monotonic_ns()}"), 1,
                            bench_root)
            four = run_procs(_DURKV, str(bench_root / f"four-{time.monotonic_ns()}"), 4,
                             bench_root, stats)
            lite_db = _sqlite_db(str(bench_root / f"lite-{time.monotonic_ns()}.db"))
            lite = run_procs(_SQLITE, lite_db, 4, bench_root)
            rounds.append((one, four, lite))
        return rounds, stats

    rounds, stats = benchmark.pedantic(once, rounds=1, iterations=1)
    for one, four, lite in rounds:
        print(f"\nsync commits/s: 1 process {one:.0f}, 4 processes {four:.0f}, "
              f"sqlite WAL 4 processes {lite:.0f}")
    per_commit = stats["syncs"] / stats["n"]
    print(f"4 processes: {per_commit:.2f} fdatasyncs per commit (1.0: none shared)")
    vs_one = statistics.median(f / o for o, f, _ in rounds)
    vs_lite = statistics.median(f / s for _, f, s in rounds)
    record(benchmark, "4 processes sync: aggregate vs 1 process", ratio=vs_one,
           target=">= 2x", ok=vs_one >= 2, fsyncs_per_commit=round(per_commit, 2))
    record(benchmark, "4 processes sync: durkv vs sqlite WAL (4 processes)", ratio=vs_lite,
           target=">= 1.5x", ok=vs_lite >= 1.5)


_ALONE = r"""
import json, os, sys, time
import durkv
path, pol, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = durkv.open(path, durability=pol)
for i in range(50):     # warm: caches, the first segment's pages
    s.put("w", "", f"w{i:08d}", checkpoint={"n": i}, metadata={"step": i},
          values={"msg": "x" * 200}, versions={"msg": i + 1})
ts = []
for i in range(n):
    t = time.perf_counter()
    s.put("t", "", f"{i:08d}", checkpoint={"n": i}, metadata={"step": i},
          values={"msg": "x" * 200}, versions={"msg": i + 1})
    ts.append(time.perf_counter() - t)
s.close()
ts.sort()
print(json.dumps({"median_us": ts[n // 2] * 1e6, "mean_us": sum(ts) / n * 1e6}), flush=True)
"""


def baseline_python(rev: str) -> str:
    """A python whose ``durkv`` is commit ``rev`` of this repository, built once in the
    temp dir (``git archive`` + a venv of its own sharing this one's site packages)."""
    root = Path(tempfile.gettempdir()) / "durkv-bench" / f"base-{rev}"
    py = root / "venv" / "bin" / "python"
    built = root / "built"
    if built.exists():
        return str(py)
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(root / "venv")],
                   check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(src)],
                   check=True, cwd=str(src))
    where = subprocess.run([str(py), "-c", "import durkv; print(durkv.__file__)"], check=True,
                           capture_output=True, text=True, cwd=str(root)).stdout
    assert where.startswith(str(src)), f"the baseline venv imports durkv from {where}"
    built.touch()
    return str(py)


@pytest.mark.parametrize("policy", ["sync", "async", "exit"])
def test_one_process_alone_vs_before_issue_17(benchmark, bench_root, policy):
    rev = os.environ.get("DURKV_BENCH_BASELINE")
    if not rev:
        pytest.skip("set DURKV_BENCH_BASELINE=70cd864 to compare with the build before issue 17")
    base = baseline_python(rev)
    n = {"sync": 300, "async": 3000, "exit": 3000}[policy] // (5 if QUICK else 1)

    def run(py: str) -> float:
        path = str(bench_root / f"alone-{time.monotonic_ns()}")
        out = subprocess.run([py, "-c", _ALONE, path, policy, str(n)], check=True,
                             capture_output=True, text=True, timeout=600, cwd=str(bench_root))
        return json.loads(out.stdout.strip().splitlines()[-1])["median_us"]

    def once():
        pairs = []
        for _ in range(max(ROUNDS, 3)):
            pairs.append((run(base), run(sys.executable)))      # alternating, same script
        return pairs

    pairs = benchmark.pedantic(once, rounds=1, iterations=1)
    for b, m in pairs:
        print(f"\n{policy} alone, median us/commit: {rev} {b:.1f}, this build {m:.1f}")
    ratio = statistics.median(m / b for b, m in pairs)
    record(benchmark, f"1 process {policy}: this build vs {rev} (time per commit)", ratio=ratio,
           target="<= 1.1x", ok=ratio <= 1.1)
