"""Four LangGraph worker processes serve 40 threads of one graph through one local store
while the parent kills workers with -9 (issue 17; GUARANTEES.md section 18).

Each thread gets K invocations, one at a time, each sent to a random idle worker
(lg_worker_child.py). At random instants a worker that has started an invocation is
SIGKILLed; the invocation is sent again to another worker (the driving is idempotent:
a resume if the killed one got its input committed) and a fresh worker replaces the
dead one. Then:

- every thread's final state equals a single-process run of the same invocations;
- every tool effect was made under one idempotency key, and each key made one effect
  (a retry after a kill between the effect and its receipt repeats the SAME key);
- no worker ever met RunBusyError (a killed holder's thread claim is dropped by the
  kernel at once) or died of anything but a kill;
- ``verify --deep`` is clean.

CI: K=3 and >= 20 kills (~10-20 s); DURKV_SLOW_TESTS=1: K=25 and >= 250 kills.
DURKV_CHAOS_SEED replays a schedule.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("langgraph")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import lg_worker_child as child  # noqa: E402

from durkv.langgraph import DurkvSaver  # noqa: E402
from durkv.log import verify  # noqa: E402

pytestmark = pytest.mark.chaos

SLOW = os.environ.get("DURKV_SLOW_TESTS") == "1"
WORKERS, THREADS = 4, 40
K = 25 if SLOW else 3
MIN_KILLS = 250 if SLOW else 20
BUDGET = 1800 if SLOW else 120


def _gone(pid: int, timeout: float) -> bool:
    """Wait until process ``pid`` no longer exists (True) or ``timeout`` s pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.005)
    return False


class Spawner:
    """lg_worker_child.py --spawner: imports once, forks a worker per :meth:`worker`."""

    def __init__(self, store: Path, effects: Path, tmp: Path) -> None:
        self.tmp = tmp
        self.n = 0
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "lg_worker_child.py"), "--spawner", str(store),
             str(effects)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=open(tmp / "spawner.err", "wb"))
        assert self.proc.stdout.readline() == b"SPAWNER READY\n", (
            (tmp / "spawner.err").read_text()[-3000:])

    def worker(self) -> "Worker":
        self.n += 1
        fifo_in, fifo_out = self.tmp / f"w{self.n}.in", self.tmp / f"w{self.n}.out"
        err = self.tmp / f"w{self.n}.err"
        os.mkfifo(fifo_in)
        os.mkfifo(fifo_out)
        self.proc.stdin.write(f"FORK {fifo_in} {fifo_out} {err}\n".encode())
        self.proc.stdin.flush()
        word, pid = self.proc.stdout.readline().split()
        assert word == b"PID", (word, pid)
        return Worker(int(pid), open(fifo_in, "wb"), os.open(fifo_out, os.O_RDONLY), err)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class Worker:
    def __init__(self, pid: int, commands, out: int, err: Path) -> None:
        self.pid, self.commands, self.out, self.err = pid, commands, out, err
        self.buf = b""
        self.ready = False
        self.job: tuple[str, int] | None = None    # (thread, k) it was sent
        self.alive = True

    def fileno(self) -> int:
        return self.out

    def send(self, thread: str, k: int) -> None:
        self.job = (thread, k)
        self.commands.write(f"RUN {thread} {k}\n".encode())
        self.commands.flush()

    def lines(self) -> list[str]:
        chunk = os.read(self.out, 1 << 16)
        if not chunk:
            pytest.fail(f"worker {self.pid} died on its own:\n{self.err.read_text()[-3000:]}")
        self.buf += chunk
        *whole, self.buf = self.buf.split(b"\n")
        return [ln.decode() for ln in whole]

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        while os.read(self.out, 1 << 16):       # EOF: its FIFO is closed ...
            pass
        self.close()
        assert _gone(self.pid, 10), f"killed worker {self.pid} still exists"   # ... and all
        # its files with it, the thread claim's too (the spawner ignores SIGCHLD: reaped)

    def close(self) -> None:
        if self.alive:
            self.alive = False
            try:
                self.commands.close()
            except BrokenPipeError:
                pass
            os.close(self.out)


def _reference() -> dict[str, dict]:
    with DurkvSaver.open("memory://") as saver:
        graph = child.build(None).compile(checkpointer=saver)
        return {f"t{i}": json.loads(json.dumps(
                    [child.drive(graph, f"t{i}", k) for k in range(1, K + 1)][-1]))
                for i in range(THREADS)}


def _serve(tmp_path: Path, rnd: random.Random) -> tuple[int, int]:
    """Drive every thread to its K-th invocation through killed workers: (kills, done)."""
    store, effects = tmp_path / "s.durkv", tmp_path / "effects"
    spawner = Spawner(store, effects, tmp_path)
    workers = [spawner.worker() for _ in range(WORKERS)]
    next_k = {f"t{i}": 1 for i in range(THREADS)}     # the thread's next invocation
    busy: set[str] = set()
    kills, done, kill_at = 0, 0, None                 # kill_at: (when, worker, job)
    # how long an invocation takes (START to DONE): a kill is aimed inside one, so the
    # harness lands its kills however fast the saver gets
    started: dict = {}
    took: list = []
    left = THREADS * K
    t_end = time.monotonic() + BUDGET
    try:
        while left:
            assert time.monotonic() < t_end, f"{left} invocations left after {BUDGET} s"
            for w in workers:                         # idle workers take idle threads
                free = [t for t, k in next_k.items() if k <= K and t not in busy]
                if w.ready and w.job is None and free:
                    t = rnd.choice(free)
                    busy.add(t)
                    w.send(t, next_k[t])
            wait = 1.0 if kill_at is None else max(0.0, kill_at[0] - time.monotonic())
            r, _, _ = select.select(workers, [], [], wait)
            for w in r:
                for ln in w.lines():
                    word, *rest = ln.split(" ", 3)
                    if word == "READY":
                        w.ready = True
                    elif word == "START":
                        started[w.pid] = time.monotonic()
                        # aimed at a few more than MIN_KILLS: some land after DONE
                        if kill_at is None and rnd.random() < 3 * (MIN_KILLS + 6 - kills) / left:
                            span = min(0.08, sorted(took)[len(took) // 2]) if took else 0.02
                            kill_at = (time.monotonic() + rnd.uniform(0, span), w, w.job)
                    elif word == "DONE":
                        t, k = rest[0], int(rest[1])
                        assert (t, k) == w.job, (ln, w.job)
                        state = json.loads(rest[2])
                        assert (state["inv"], state["step"]) == (k, child.STEPS), ln
                        busy.discard(t)
                        if w.pid in started:
                            took.append(time.monotonic() - started.pop(w.pid))
                        next_k[t] = k + 1
                        w.job = None
                        left -= 1
                        done += 1
            if kill_at is not None and time.monotonic() >= kill_at[0]:
                _, w, job = kill_at
                kill_at = None
                if w.job == job:                      # still inside that invocation
                    w.kill()
                    kills += 1
                    busy.discard(job[0])              # re-driven by another worker
                    workers[workers.index(w)] = spawner.worker()
    finally:
        for w in workers:                             # end of commands: they exit
            w.close()
        spawner.close()
        for w in workers:                             # each closed the store and exited
            if not _gone(w.pid, 60):
                os.kill(w.pid, signal.SIGKILL)
                pytest.fail(f"worker {w.pid} did not exit: {w.err.read_text()[-3000:]}")
        for w in workers:
            assert "Traceback" not in w.err.read_text(), w.err.read_text()[-3000:]
    return kills, done


def test_four_workers_forty_threads_kill_9(tmp_path):
    rnd = random.Random(int(os.environ.get("DURKV_CHAOS_SEED", "17")))
    kills, done = _serve(tmp_path, rnd)
    assert kills >= MIN_KILLS, f"only {kills} kills landed inside an invocation"

    expected = _reference()
    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:   # repairs a torn tail
        graph = child.build(None).compile(checkpointer=saver)
        got = {t: graph.get_state({"configurable": {"thread_id": t}}).values for t in expected}
    assert got == expected

    by_key: dict[str, set[str]] = {}
    by_what: dict[str, set[str]] = {}
    lines = (tmp_path / "effects").read_text().splitlines()
    for line in lines:
        key, what = line.split()
        by_key.setdefault(key, set()).add(what)
        by_what.setdefault(what, set()).add(key)
    assert all(len(v) == 1 for v in by_key.values()), "a key made two different effects"
    assert all(len(v) == 1 for v in by_what.values()), "an effect made under two keys"
    assert sorted(by_what) == sorted(f"t{i}:{k}:{s}" for i in range(THREADS)
                                     for k in range(1, K + 1) for s in range(child.STEPS))
    report = verify(tmp_path / "s.durkv", deep=True)
    assert report.ok, report.damage
    print(f"kills {kills}, invocations {done}, effects {len(lines)} "
          f"({len(lines) - len(by_key)} repeated under their key)")
