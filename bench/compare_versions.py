"""Two versions of durkv side by side, alternating runs in one script (issue 16 item 5).

    python bench/compare_versions.py OLD_PYTHON [OTHER_PYTHON...] NEW_PYTHON [--rounds 5]

Each PYTHON is an interpreter whose ``import durkv`` is one version (e.g. a venv with an
editable install of a worktree at 70cd864, and this worktree's). Every round runs each
workload once in a fresh process of each version, in turn (the order reverses every
round), so the machine's load drifts over all alike; the report is each version's
median and the ratio of the last (the new one) to each other (below 1: it is faster).

Workloads (time per operation, lower is better):
    step-record   run.step of a new step (async policy): the live hot path
    step-replay   run.step of a recorded step (a re-execution): the replay hot path
    tool          run.tool (intent + receipt, each fdatasync'd)
    replay-100k   re-executing a finished 100,000-step run: open + fold + replay
    put           store.put of a checkpoint (async policy)
    langgraph     one superstep of a LangGraph agent loop checkpointed by DurkvSaver
    log-sync      SegmentLog.append of 1 KiB under `sync` (one fdatasync each): the commit
                  path the zero slack serves (FORMAT.md §9), past its 64 KiB threshold
    put-sync      store.put of a 1 KiB message under `sync`
    langgraph-sync  the langgraph workload under `sync` (one fdatasync a superstep)
    get-state     graph.get_state of the langgraph workload's thread after 500 supersteps
                  (500 ~1 KiB messages; median of 50 calls, a fresh decode each)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOADS = ("step-record", "step-replay", "tool", "replay-100k", "put", "langgraph",
             "log-sync", "put-sync", "langgraph-sync", "get-state")


def _steps(store, run_id, n):
    result = {"text": "x" * 200, "tokens": 57}
    with store.run(run_id) as run:
        t0 = time.perf_counter()
        for i in range(n):
            run.step("model", lambda i: result, i)
        return (time.perf_counter() - t0) / n


def measure(workload: str, root: Path, quick: bool) -> float:
    """Seconds per operation of ``workload`` in a new store under ``root``."""
    import durkv

    n = 2_000 if quick else 20_000
    if workload == "get-state":
        return _get_state(root, 100 if quick else 500)
    if workload.startswith("langgraph"):
        sync = workload == "langgraph-sync"
        return _langgraph(root, 50 if quick else 300, "sync" if sync else "async")
    if workload == "log-sync":
        return _log_sync(root, 200 if quick else 1_000)
    if workload == "put-sync":
        with durkv.open(str(root / "s"), durability="sync") as store:
            _puts(store, 100)                       # warm: past the slack's threshold
            return _puts(store, 200 if quick else 1_000)
    with durkv.open(str(root / "s"), durability="async") as store:
        if workload == "step-record":
            return _steps(store, "r", n)
        if workload == "step-replay":
            _steps(store, "r", n)
            return _steps(store, "r", n)
        if workload == "replay-100k":
            big = 10_000 if quick else 100_000
            _steps(store, "r", big)
        if workload == "tool":
            return _tools(durkv, store, 50 if quick else 200)
        if workload == "put":
            return _puts(store, n)
    with durkv.open(str(root / "s"), durability="async") as store:   # replay-100k: reopened
        t0 = time.perf_counter()
        _steps(store, "r", big)
        return time.perf_counter() - t0


def _log_sync(root, n):
    from durkv.log import SegmentLog

    payload = b"x" * 1024
    log = SegmentLog.open(str(root / "l"), durability="sync")
    try:
        for _ in range(100):                        # warm: past the slack's threshold
            log.append(payload)
        t0 = time.perf_counter()
        for _ in range(n):
            log.append(payload)
        return (time.perf_counter() - t0) / n
    finally:
        log.close()


def _tools(durkv, store, n):
    @durkv.tool(name="effect")
    def effect(i, *, idempotency_key):
        return i

    with store.run("t") as run:
        t0 = time.perf_counter()
        for i in range(n):
            run.tool(effect, i)
        return (time.perf_counter() - t0) / n


def _puts(store, n):
    msg = {"role": "ai", "content": "y" * 1000}
    t0 = time.perf_counter()
    parent = None
    for i in range(n):
        cid = f"{i:08d}"
        store.put("t", "", cid, checkpoint={"id": cid}, metadata={"step": i},
                  values={"messages": msg}, versions={"messages": i + 1}, parent_id=parent)
        parent = cid
    return (time.perf_counter() - t0) / n


def _agent_graph(n):
    """The agent loop: one ~1 KiB message appended a superstep until there are ``n``."""
    import operator
    from typing import Annotated

    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    State = TypedDict("State", {"messages": Annotated[list, operator.add]})

    def agent(state):
        return {"messages": [{"role": "ai", "content": "y" * 1000}]}

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: END if len(s["messages"]) >= n else "agent")
    return g


def _langgraph(root, n, durability="async"):
    from durkv.langgraph import DurkvSaver

    saver = DurkvSaver.open(str(root / "g"), durability=durability)
    try:
        graph = _agent_graph(n).compile(checkpointer=saver)
        t0 = time.perf_counter()
        graph.invoke({"messages": []}, {"configurable": {"thread_id": "g"},
                                        "recursion_limit": n + 10})
        return (time.perf_counter() - t0) / n
    finally:
        saver.close()


def _get_state(root, n, calls=50):
    from durkv.langgraph import DurkvSaver

    saver = DurkvSaver.open(str(root / "g"))
    try:
        graph = _agent_graph(n).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "g"}, "recursion_limit": n + 10}
        graph.invoke({"messages": []}, config)
        graph.get_state(config)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            graph.get_state(config)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        saver.close()


def _child(python: str, workload: str, quick: bool) -> float:
    with tempfile.TemporaryDirectory(prefix="durkv-cmp-") as d:
        out = subprocess.run([python, __file__, "--child", workload, "--dir", d]
                             + (["--quick"] if quick else []),
                             check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pythons", nargs="*")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", default=list(WORKLOADS))
    ap.add_argument("--child")
    ap.add_argument("--dir")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(measure(a.child, Path(a.dir), a.quick)))
        return
    if len(a.pythons) < 2 or not all(Path(p).exists() for p in a.pythons):
        ap.error("give two interpreters or more: OLD_PYTHON ... NEW_PYTHON")
    pys = a.pythons
    print("us per op, median of", a.rounds, "alternating rounds; versions:",
          ", ".join(f"v{i}={p}" for i, p in enumerate(pys)))
    print(f"{'workload':<12}" + "".join(f"{f'v{i}':>12}" for i in range(len(pys)))
          + "".join(f"{f'v{len(pys) - 1}/v{i}':>10}" for i in range(len(pys) - 1)))
    for w in a.only:
        got: list[list[float]] = [[] for _ in pys]
        for r in range(a.rounds):
            order = list(enumerate(pys))
            for i, py in order if r % 2 == 0 else order[::-1]:
                got[i].append(_child(py, w, a.quick))
        med = [statistics.median(g) for g in got]
        print(f"{w:<12}" + "".join(f"{m * 1e6:>12.2f}" for m in med)
              + "".join(f"{med[-1] / m:>10.3f}" for m in med[:-1]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
