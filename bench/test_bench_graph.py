"""durkv.Graph (the superstep scheduler) against LangGraph's loop and the disk, side by side.

| group            | durkv                                       | baseline                        | target          |
|------------------|---------------------------------------------|---------------------------------|-----------------|
| graph-loop-exit  | one-node loop, N supersteps, ``exit``       | LangGraph, same graph, no saver | >= 20x          |
| graph-loop-async | the same under ``async``                    | LangGraph, no saver             | >= 15x          |
| graph-loop-sync  | the same under ``sync`` (N_SYNC supersteps) | C write+fdatasync loop          | >= 0.9x         |
| graph-resume     | fresh process: open + resume a 100,000-     | the run's own time; a 100-      | <= 2%; <= +0.3 s|
|                  | superstep run paused at an approval         | superstep run's resume          |                 |
| graph-agent-loop | 20,000 supersteps appending ~1 KiB each     | the appended payload; the final | <= 1.3x bytes;  |
|                  |                                             | state's size                    | RSS <= 2x state |
| graph-threads    | 8 runs on 8 threads, ``sync``               | one run, ``sync``               | >= 3x           |

The trivial node returns ``{"count": count + 1}``; LangGraph's graph is the same
(a ``StateGraph`` of one node and a conditional edge, compiled without a checkpointer).
Env: DURKV_BENCH_QUICK=1 (small N, one round), DURKV_BENCH_DIR (the disk to measure).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import TypedDict

import pytest
from benchlib import QUICK, record

import durkv

pytest.importorskip("langgraph")

from langgraph.graph import END, START, StateGraph  # noqa: E402

N = 1000 if QUICK else 10_000
N_SYNC = 40 if QUICK else 300
N_RESUME = 5_000 if QUICK else 100_000
N_AGENT = 2_000 if QUICK else 20_000
ROUNDS = 1 if QUICK else 3
THREADS = 8
FRAME = 1048    # the raw loop's write: about what a commit frame of a small state costs


def durkv_loop(n: int) -> durkv.Graph:
    g = durkv.Graph({"count": durkv.Last(0)})
    g.add_node("agent", lambda s, ctx: {"count": s["count"] + 1})
    g.add_edge(durkv.START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["count"] < n else durkv.END)
    return g


class _S(TypedDict):
    count: int


def langgraph_loop(n: int):
    b = StateGraph(_S)
    b.add_node("agent", lambda s: {"count": s["count"] + 1})
    b.add_edge(START, "agent")
    b.add_conditional_edges("agent", lambda s: "agent" if s["count"] < n else END)
    return b.compile()


def _pair(durkv_fn, base_fn, rounds=ROUNDS):
    """Median seconds of each, alternating round by round (they share the machine)."""
    a, b = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        base_fn()
        b.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        durkv_fn()
        a.append(time.perf_counter() - t0)
    return sorted(a)[len(a) // 2], sorted(b)[len(b) // 2]


def _runner(store, n, prefix):
    app = durkv_loop(n).compile(store, max_supersteps=n + 1)
    ids = iter(range(1 << 30))
    return lambda: app.run({}, run_id=f"{prefix}-{next(ids)}")


@pytest.mark.parametrize("mode, target", [("exit", 20), ("async", 15)])
def test_graph_loop_vs_langgraph(benchmark, bench_root, mode, target):
    lg = langgraph_loop(N)
    with durkv.open(str(bench_root / f"loop-{mode}.durkv"), durability=mode) as store:
        run = _runner(store, N, mode)
        t, base = _pair(run, lambda: lg.invoke({"count": 0}, {"recursion_limit": N + 10}))
        benchmark.pedantic(run, rounds=1, iterations=1)
    ratio = base / t
    record(benchmark, f"graph loop {mode} vs LangGraph (no saver)", ratio=ratio,
           target=f">= {target}x", ok=ratio >= target, supersteps_per_s=round(N / t),
           langgraph_per_s=round(N / base))


def test_graph_loop_sync_vs_fdatasync(benchmark, bench_root, baseline):
    raw = str(bench_root / "raw-fsync").encode()
    with durkv.open(str(bench_root / "loop-sync.durkv"), durability="sync") as store:
        run = _runner(store, N_SYNC, "sync")
        t, base = _pair(run, lambda: baseline.raw_fsync_loop(raw, N_SYNC + 1, FRAME))
        benchmark.pedantic(run, rounds=1, iterations=1)
    ratio = base / t        # both make N_SYNC + 1 durable commits (the input is one)
    record(benchmark, "graph loop sync vs write+fdatasync", ratio=ratio, target=">= 0.9x",
           ok=ratio >= 0.9, supersteps_per_s=round(N_SYNC / t))


RESUME = """
import sys, time
t0 = time.perf_counter()
import durkv
from test_bench_graph import approval_loop
path, n = sys.argv[1], int(sys.argv[2])
t1 = time.perf_counter()
with durkv.open(path) as store:
    t_open = time.perf_counter() - t1
    res = approval_loop(n).compile(store, max_supersteps=n + 1).run(None, run_id="r")
    t2 = time.perf_counter()
    assert res.status == "finished" and res.state["n"] == n, res
print(t2 - t1, t_open)
"""


def approval_loop(n: int) -> durkv.Graph:
    """n supersteps, each a recorded step; an approval at the last one."""
    g = durkv.Graph({"n": durkv.Last(0)})

    def agent(state, ctx):
        ctx.step("model", int, state["n"])
        if state["n"] == n - 1:
            ctx.approve("finish")
        return {"n": state["n"] + 1}

    g.add_node("agent", agent)
    g.add_edge(durkv.START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["n"] < n else durkv.END)
    return g


def _paused_run(path: str, n: int) -> float:
    t0 = time.perf_counter()
    with durkv.open(path, durability="exit") as store:
        res = approval_loop(n).compile(store, max_supersteps=n + 1).run({}, run_id="r")
        assert res.status == "waiting"
        store.decide("r", res.interrupt.step_id, True)
    return time.perf_counter() - t0


def _fresh_resume(path: str, n: int) -> tuple[float, float]:
    """Seconds a new process takes to open the store and resume the run (imports
    excluded), and of them the store's open."""
    out = subprocess.run([sys.executable, "-c", RESUME, path, str(n)], capture_output=True,
                         text=True, cwd=os.path.dirname(__file__), check=True)
    total, opened = map(float, out.stdout.split())
    return total, opened


def test_graph_resume_at_any_step_count(benchmark, bench_root):
    big, small = str(bench_root / "resume-big.durkv"), str(bench_root / "resume-small.durkv")
    took = _paused_run(big, N_RESUME)
    _paused_run(small, 100)
    t_small, open_small = _fresh_resume(small, 100)
    t_big, open_big = _fresh_resume(big, N_RESUME)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    share = t_big / took
    record(benchmark, f"graph resume of a {N_RESUME}-superstep run (share of its run)",
           ratio=share, target="<= 0.02", ok=share <= 0.02, resume_s=round(t_big, 4),
           open_s=round(open_big, 4), run_s=round(took, 2))
    record(benchmark, f"graph resume {N_RESUME} vs 100 supersteps (extra seconds)",
           ratio=t_big - t_small, target="<= 0.3", ok=t_big - t_small <= 0.3,
           resume_100_s=round(t_small, 4), open_100_s=round(open_small, 4))


AGENT = """
import sys
import durkv
from test_bench_graph import agent_loop, rss
path, n = sys.argv[1], int(sys.argv[2])
with durkv.open(path, durability="async") as store:
    before = rss("VmRSS")
    res = agent_loop(n).compile(store, max_supersteps=n + 1).run({}, run_id="r")
    peak = rss("VmHWM")     # the peak over the run (ru_maxrss would carry the parent's)
    payload = sum(len(m) for m in res.state["messages"])
print(peak - before, payload)
"""


def rss(field: str) -> int:
    """Bytes of ``field`` (VmRSS: now, VmHWM: the peak) of this process (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def agent_loop(n: int) -> durkv.Graph:
    """n supersteps, each appending a ~1 KiB text message."""
    words = ("agent tool call result plan step observe think answer retry search read "
             "write file shell patch test pass fail error fix deploy review").split()

    def agent(state, ctx):
        i = len(state["messages"])
        text = " ".join(words[(i * 7 + k) % len(words)] + str(i) for k in range(160))[:1024]
        return {"messages": [text]}

    g = durkv.Graph({"messages": durkv.Append()})
    g.add_node("agent", agent)
    g.add_edge(durkv.START, "agent")
    g.add_conditional_edges("agent",
                            lambda s: "agent" if len(s["messages"]) < n else durkv.END)
    return g


def test_graph_agent_loop_bytes_and_memory(benchmark, bench_root):
    path = str(bench_root / "agent.durkv")
    out = subprocess.run([sys.executable, "-c", AGENT, path, str(N_AGENT)], capture_output=True,
                         text=True, cwd=os.path.dirname(__file__), check=True)
    rss_growth, payload = map(int, out.stdout.split())
    disk = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    record(benchmark, f"graph agent loop {N_AGENT} x 1 KiB: bytes on disk / payload",
           ratio=disk / payload, target="<= 1.3x", ok=disk <= 1.3 * payload, disk=disk,
           payload=payload)
    record(benchmark, f"graph agent loop {N_AGENT} x 1 KiB: RSS growth / final state",
           ratio=rss_growth / payload, target="<= 2x", ok=rss_growth <= 2 * payload,
           rss_growth=rss_growth)


def test_graph_threads_sync(benchmark, bench_root):
    n = N_SYNC
    with durkv.open(str(bench_root / "threads.durkv"), durability="sync") as store:
        one = _runner(store, n, "one")
        many = [_runner(store, n, f"t{i}") for i in range(THREADS)]

        def eight():
            ts = [threading.Thread(target=r) for r in many]
            for th in ts:
                th.start()
            for th in ts:
                th.join()

        t8, t1 = _pair(eight, one)
        benchmark.pedantic(eight, rounds=1, iterations=1)
    ratio = (THREADS * n / t8) / (n / t1)
    record(benchmark, "graph 8 runs on 8 threads vs 1 run (sync)", ratio=ratio,
           target=">= 3x", ok=ratio >= 3, supersteps_per_s=round(THREADS * n / t8))

