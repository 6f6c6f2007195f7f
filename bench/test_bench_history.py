"""Full history listings of a long agent loop (``Store.history``, ``DurkvSaver.list``).

Agent loop as in test_bench_store.py: one thread, N supersteps, each appending one
1 KiB message to a list channel and updating a scalar channel. Listing the whole
history materializes every checkpoint's list: done naively (each checkpoint's
delta chain read and deserialized) that is O(N^2); ``history`` derives each older
list from the newer one (a prefix slice), so it is O(N) reads and O(N) item
deserializations plus the O(N^2) pointer copies of the returned lists.

| benchmark                 | measures                                             | target        |
|---------------------------|------------------------------------------------------|---------------|
| history-{backend}         | full ``history()`` of N=2,000: s, checkpoints/s;     | <= 2.5x       |
|                           | time(N=2,000) / time(N=1,000) (linear: 2, quadratic: 4)|             |
| history-headers           | ``history(values=False)`` vs the full listing, N=2,000 | >= 2x faster |
| channel-entries           | full ``channel_entries(messages)`` of N=2,000, local: | <= 2.5x       |
|                           | entries/s; time(N=2,000) / time(N=1,000)              |               |
| history-saver-vs-sqlite   | full ``checkpointer.list`` of a 2,000-superstep graph  | >= 5x sqlite |
|                           | run, DurkvSaver vs SqliteSaver (LangGraph installed)  |               |

Figures on one (shared, 2-core) machine, N=2,000:

| benchmark                | before (chain walk per checkpoint) | after (derived)             |
|--------------------------|------------------------------------|-----------------------------|
| history, local           | 11.1-13.0 s (~170 ckpt/s), 4.65x   | 0.055 s (36,000 ckpt/s), 2.17x |
| history, memory          | 13.4 s                             | 0.046 s (43,000 ckpt/s)     |
| history(values=False)    | --                                 | 0.013 s (150,000 ckpt/s)    |
| DurkvSaver.list          | 9.6 s (1.9x SqliteSaver)           | 0.14 s (57-63x SqliteSaver) |

``durkv history -n 0`` of a 3,000-step thread: 48 s before (14-17 s on an idle
machine), 0.25 s after (headers only).

``channel_entries`` of N=2,000, local: 0.033 s (~60,000 entries/s, ratio 2.0-2.1) when a
checkpoint's own entry was told by its frame; 0.039-0.041 s (~50,000 entries/s, ratio
2.1) since it is told from its parent's entry, which also holds after a compaction
(the parent's head is read once, as the walk's next checkpoint: ~3 us more per entry).

Env: DURKV_BENCH_QUICK=1 (N=500 and one round), DURKV_BENCH_DIR.
"""

from __future__ import annotations

import operator
import sqlite3
import time
from typing import Annotated

import pytest
from benchlib import QUICK, record
from test_bench_store import AgentLoop

import durkv

N = 500 if QUICK else 2000
ROUNDS = 1 if QUICK else 3


def _listing(store, thread="t", **kw) -> float:
    t0 = time.perf_counter()
    count = sum(1 for _ in store.history(thread, **kw))
    dt = time.perf_counter() - t0
    assert count > 0
    return dt


def _best(fn, rounds: int = ROUNDS) -> float:
    return min(fn() for _ in range(rounds))


@pytest.fixture(scope="module")
def loops(bench_root):
    """Stores with a finished N-step and N/2-step agent loop, per backend."""
    out = {}
    for backend in ("local", "memory"):
        url = "memory://" if backend == "memory" else str(bench_root / "history.durkv")
        s = durkv.open(url, durability="exit")
        AgentLoop(s, "t").run(N)
        AgentLoop(s, "half").run(N // 2)
        s.flush()
        out[backend] = s
    yield out
    for s in out.values():
        s.close()


@pytest.mark.benchmark(group="history")
@pytest.mark.parametrize("backend", ["local", "memory"])
def test_history_full_listing(benchmark, loops, backend):
    s = loops[backend]
    count = benchmark.pedantic(lambda: sum(1 for _ in s.history("t")), rounds=ROUNDS,
                               iterations=1, warmup_rounds=0)
    assert count == N
    full = _best(lambda: _listing(s, "t"))
    half = _best(lambda: _listing(s, "half"))
    ratio = full / half
    record(benchmark, f"history N={N} ({backend}): time vs N={N // 2}", ratio=ratio,
           value=round(N / full), target="<= 2.5 (linear)", ok=ratio <= 2.5,
           seconds=round(full, 4), checkpoints_per_s=round(N / full),
           seconds_half=round(half, 4), ops_per_round=N)


@pytest.mark.benchmark(group="history")
def test_history_headers(benchmark, loops):
    s = loops["local"]
    count = benchmark.pedantic(lambda: sum(1 for _ in s.history("t", values=False)),
                               rounds=ROUNDS, iterations=1)
    assert count == N
    heads = _best(lambda: _listing(s, "t", values=False))
    full = _best(lambda: _listing(s, "t"))
    ratio = full / heads
    record(benchmark, f"history(values=False) N={N}: speed vs full listing", ratio=ratio,
           value=round(N / heads), target=">= 2x", ok=ratio >= 2,
           seconds=round(heads, 4), checkpoints_per_s=round(N / heads),
           full_seconds=round(full, 4), ops_per_round=N)


def _entries(store, thread: str) -> float:
    t0 = time.perf_counter()
    count = sum(1 for _ in store.channel_entries(thread, "", "messages"))
    dt = time.perf_counter() - t0
    assert count > 0
    return dt


@pytest.mark.benchmark(group="history")
def test_channel_entries_full_listing(benchmark, loops):
    """Each checkpoint's append read from its own entries, told from its parent's:
    O(N) for the whole listing (a head per checkpoint, its parent's kept for the next)."""
    s = loops["local"]
    count = benchmark.pedantic(lambda: sum(1 for _ in s.channel_entries("t", "", "messages")),
                               rounds=ROUNDS, iterations=1, warmup_rounds=0)
    assert count == N
    full = _best(lambda: _entries(s, "t"))
    half = _best(lambda: _entries(s, "half"))
    ratio = full / half
    record(benchmark, f"channel_entries N={N} (local): time vs N={N // 2}", ratio=ratio,
           value=round(N / full), target="<= 2.5 (linear)", ok=ratio <= 2.5,
           seconds=round(full, 4), entries_per_s=round(N / full),
           seconds_half=round(half, 4), ops_per_round=N)


# ---- DurkvSaver.list vs SqliteSaver.list (what get_state_history sits on) -----------------


def _graph(n: int):
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict):
        n: int
        messages: Annotated[list, operator.add]

    text = ("agent tool call result plan step observe think answer " * 20)[:1000]

    def agent(st) -> dict:
        return {"n": st["n"] + 1,
                "messages": [{"role": "assistant", "id": f"m{st['n']}", "content": text}]}

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda st: "agent" if st["n"] < n else END)
    return g


@pytest.mark.benchmark(group="history-saver")
def test_saver_list_vs_sqlite(benchmark, bench_root):
    pytest.importorskip("langgraph.checkpoint.sqlite")
    from langgraph.checkpoint.sqlite import SqliteSaver

    from durkv.langgraph import DurkvSaver

    config = {"configurable": {"thread_id": "t"}, "recursion_limit": N + 10}
    conn = sqlite3.connect(str(bench_root / "history.sqlite"), check_same_thread=False)
    sqlite = SqliteSaver(conn)
    ours = DurkvSaver.open(str(bench_root / "history-saver.durkv"))
    try:
        for saver in (sqlite, ours):
            _graph(N).compile(checkpointer=saver).invoke({"n": 0, "messages": []}, config,
                                                         durability="async")

        def listing(saver):
            t0 = time.perf_counter()
            count = sum(1 for _ in saver.list(config))
            return time.perf_counter() - t0, count

        t_sqlite, n_sqlite = listing(sqlite)        # seconds: one round is enough
        count = benchmark.pedantic(lambda: listing(ours)[1], rounds=ROUNDS, iterations=1)
        assert count == n_sqlite == N + 2
        t_ours = _best(lambda: listing(ours)[0])
    finally:
        ours.close()
        conn.close()
    ratio = t_sqlite / t_ours
    record(benchmark, f"checkpointer.list N={N}: speed vs SqliteSaver", ratio=ratio,
           value=round(ratio, 2), target=">= 5x sqlite", ok=ratio >= 5,
           seconds=round(t_ours, 4), checkpoints_per_s=round(count / t_ours),
           sqlite_seconds=round(t_sqlite, 4), ops_per_round=count)
