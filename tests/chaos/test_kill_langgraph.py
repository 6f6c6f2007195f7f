"""kill -9 a LangGraph run on DurkvSaver at random, resume it, and check nothing was lost.

A child process (forked by ``langgraph_child.py --server``, so a kill cycle
costs no interpreter start) runs a long loop of supersteps, each with three
parallel ``Send`` workers, under ``durability="sync"`` on a local store. The
parent SIGKILLs it at random moments (50 times in the default run, ~10-20 s;
DURKV_SLOW_TESTS=1 for 500; DURKV_CHAOS_SEED to replay) and forks a new child
that resumes with ``graph.invoke(None, config)``. Checked after each run:

- every resume starts at or after the checkpoint of the last superstep the
  killed child announced (``TICK n`` -> ``RESUME >= n``);
- the final state equals an uninterrupted run's;
- no worker whose writes were committed ever started again (side file).

``test_finished_run_survives_kill``: once ``invoke`` returns under "async" or
"exit", a kill -9 of the still-running process loses nothing.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import langgraph_child  # noqa: E402

pytestmark = pytest.mark.chaos

KILLS = 500 if os.environ.get("DURKV_SLOW_TESTS") == "1" else 50
N_STEPS = 40


def reference_state(n_steps: int) -> dict:
    from langgraph.checkpoint.memory import InMemorySaver

    graph = langgraph_child.build_graph(n_steps).compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "ref"}, "recursion_limit": 10 * n_steps + 20}
    return graph.invoke({"step": 0, "results": []}, config)


def start_child(store: Path, thread_id: str, side: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(HERE / "langgraph_child.py"), str(store), thread_id, str(side),
         str(N_STEPS), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def read_line(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"child died: rc={proc.wait()} stderr={proc.stderr.read()[-2000:]}")
    return line.strip()


def check_side_file(side: Path) -> None:
    """A worker whose writes were saved never starts again."""
    saved: set[str] = set()
    for n, line in enumerate(side.read_text().splitlines()):
        kind, key = line.split()
        if kind == "saved":
            saved.add(key)
        else:
            assert key not in saved, f"worker {key} ran again after its writes were saved (line {n})"


class Server:
    """langgraph_child.py --server: forks one fresh child per run (no interpreter start)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "langgraph_child.py"), "--server"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.strip():
                self.lines.put(line.strip())
        self.lines.put(None)

    def line(self) -> str:
        line = self.lines.get(timeout=60)
        if line is None:
            raise AssertionError(f"chaos server died: rc={self.proc.wait()}")
        return line

    def run(self, *args: str) -> None:
        self.proc.stdin.write("run " + " ".join(args) + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def test_kill_and_resume_langgraph(tmp_path):
    rng = random.Random(int(os.environ.get("DURKV_CHAOS_SEED", time.time_ns() % 2**32)))
    expected = reference_state(N_STEPS)
    store = tmp_path / "chaos.durkv"
    server = Server()
    kills = runs = 0
    try:
        while kills < KILLS or runs == 0:
            runs += 1
            thread_id, side = f"run-{runs}", tmp_path / f"side-{runs}.log"
            last_tick = -1
            while True:
                server.run(str(store), thread_id, str(side), str(N_STEPS))
                kind, pid = server.line().split()
                assert kind == "READY"
                kind, step = server.line().split()
                assert kind == "RESUME"
                assert int(step) >= last_tick, f"resumed at step {step}, before TICK {last_tick}"
                if kills < KILLS:
                    time.sleep(rng.uniform(0.0, 0.25))
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass  # it finished first
                done = None
                while not (line := server.line()).startswith("EXIT "):
                    if line.startswith("TICK "):
                        last_tick = max(last_tick, int(line.split()[1]))
                    elif line.startswith("DONE "):
                        done = line
                rc = int(line.split()[1])
                if done is not None and rc == 0:
                    break
                assert rc == -signal.SIGKILL and kills < KILLS, f"child failed: exit {rc}"
                kills += 1
            assert json.loads(done[5:]) == expected, f"run {runs}: final state differs"
            if side.exists():
                check_side_file(side)
    finally:
        server.close()
    assert kills >= KILLS


@pytest.mark.parametrize("mode", ["exit", "async"])
def test_finished_run_survives_kill(tmp_path, mode):
    """Once invoke returns, its state survives kill -9 in every mode (exit commits async)."""
    store, side = tmp_path / "done.durkv", tmp_path / "side.log"
    proc = start_child(store, "t", side, mode, "hang")
    try:
        assert read_line(proc).startswith("READY ")
        assert read_line(proc) == "RESUME -1"
        while not (line := read_line(proc)).startswith("DONE "):
            pass
    finally:  # killed at once: invoke returned, so its commits are written

        proc.kill()
        proc.wait()
    proc = start_child(store, "t", side, mode)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "RESUME 41" in out.splitlines(), out[:500]
    done = [ln for ln in out.splitlines() if ln.startswith("DONE ")]
    assert json.loads(done[0][5:]) == json.loads(line[5:]) == reference_state(N_STEPS)


def test_toolnode_parallel_tool_calls_killed_and_resumed_take_effect_once(tmp_path):
    """The prebuilt ToolNode runs a message's tool calls in threads, and durkv.langgraph.tool
    without key= numbered them in the order the threads got there: a resume in another
    order failed with IdempotencyConflictError, or took a call's effect under another
    call's key. The id now names the tool call (its tool_call_id). Execution 1 is SIGKILLed
    after three of the six effects; execution 2 reaches durkv in the reverse order."""
    store, work = tmp_path / "agent.durkv", tmp_path / "work"
    work.mkdir()
    effects = work / "effects"
    child = [sys.executable, str(HERE / "langgraph_toolnode_child.py"), str(store), str(work)]
    proc = subprocess.Popen(child + ["1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        while not (effects.exists() and len(effects.read_text().splitlines()) >= 3):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no three effects within 60 s"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    first = effects.read_text().splitlines()
    assert 3 <= len(first) < 6, first
    done = subprocess.run(child + ["2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == repr(sorted(f"sent to user{i}@example.com"
                                              for i in range(6)))
    by_key: dict[str, set[str]] = {}
    for line in effects.read_text().splitlines():
        key, to = line.split()
        by_key.setdefault(key, set()).add(to)
    assert len(by_key) == 6, by_key                       # one key per tool call ...
    assert all(len(tos) == 1 for tos in by_key.values()), by_key    # ... for one recipient
    assert sorted(t for tos in by_key.values() for t in tos) == [
        f"user{i}@example.com" for i in range(6)]
    assert all(f":call_{to[4]}:" in key for key, (to,) in by_key.items()), by_key
