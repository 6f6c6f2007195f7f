"""DurkvSaver against LangGraph's savers, side by side in one run.

Workload: an agent loop -- one node run N times, each superstep appending a
~1 KiB message (a dict) to ``messages: Annotated[list, operator.add]``.
Savers: SqliteSaver on a file, DurkvSaver on a local store, InMemorySaver,
and NullSaver (stores nothing: LangGraph's own checkpointing cost).

| group                   | measured                               | target (durkv vs ...)          |
|-------------------------|----------------------------------------|--------------------------------|
| supersteps-{mode}-{N}   | supersteps/s of one graph.invoke       | sqlite >= 2x (sync, async),    |
|                         |                                        | >= 0.95x (exit); memory >= 1x  |
|                         |                                        | (async); null >= 0.8x (async), |
|                         |                                        | >= 0.5x (sync)                 |
| bytes-{N}               | bytes on disk per thread (largest N)   | <= 1/300 sqlite; <= 1/5 sqlite |
|                         |                                        | with DeltaChannel              |
| get-state-{N}           | graph.get_state latency                | <= 0.2x sqlite; flat in N      |
| get-state-messages-{N}  | the same, state of LangChain messages  | <= 0.5x sqlite (issue 20)      |
| history-{N}             | full get_state_history listing         | >= 5x sqlite                   |
| threads-8               | 8 threads, 8 graphs, "sync", one store | >= 3x sqlite aggregate         |
| sync-added-{N}          | (durkv - null saver) per superstep     | <= 1.3x one write+fdatasync of |
|                         | under "sync", vs the C loop's          | the C loop (issue 20)          |
|                         | write+fdatasync, interleaved rounds    |                                |
| bytes-raw-{msg}-{N}     | durkv bytes / raw appended payload,    | <= 1.5x at N=2,000; N=4,000    |
|                         | dict messages and AIMessages           | <= 2.1x N=2,000                |
| resumed-turn-{N}        | a chat's next invoke on a thread of N  | sqlite >= 1x; bytes a turn     |
|                         | messages (read back, extended)         | <= 0.1x the thread's           |
| async-cpu-floor-{N}     | async vs null: a saver spinning as     | reported (why async >= 0.8x    |
|                         | long as durkv's commits take alone,    | null is missed: issue 20)      |
|                         | with 0 or 1 GIL hand-off a call; durkv |                                |

"Raw appended payload" is the sum of each message's serialized size (the bytes
LangGraph's serde makes of it), i.e. what storing each message once, as is,
would cost. Env: DURKV_BENCH_N (default "500,2000"; quick "100"), DURKV_BENCH_QUICK=1
(bounded smoke: small N, one round), DURKV_BENCH_DIR (disk to measure).
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
from typing import Annotated

import benchlib
import msgpack
import pytest
from benchlib import QUICK, frame_bytes, record

pytest.importorskip("langgraph.checkpoint.sqlite")

from langgraph.channels import DeltaChannel  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langchain_core.messages import AIMessage  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402
from typing_extensions import TypedDict  # noqa: E402

from durkv.cli.benchgraph import NullSaver, agent_graph, cfg  # noqa: E402
from durkv.cli.benchwork import message  # noqa: E402
from durkv.langgraph import DurkvSaver  # noqa: E402
from durkv.payload import decode_head  # noqa: E402
import durkv.log  # noqa: E402
import durkv.payload  # noqa: E402

N_LIST = [int(x) for x in os.environ.get("DURKV_BENCH_N", "100" if QUICK else "500,2000").split(",")]
N_MAX = max(N_LIST)
ROUNDS = 1 if QUICK else 3
MODES = ("sync", "async", "exit")
KINDS = ("sqlite", "memory", "null", "durkv")
THREADS = 8
N_THREADED = 50 if QUICK else 200


def _extend(state: list, writes: list) -> list:
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


class DeltaState(TypedDict):
    n: int
    messages: Annotated[list, DeltaChannel(_extend)]


class Savers:
    """Opens savers in the bench directory and closes them at the end."""

    def __init__(self, root) -> None:
        self.root = root
        self.closers = []
        self.names = itertools.count()

    def open(self, kind: str):
        name = f"{kind}-{next(self.names)}"
        if kind == "sqlite":
            path = self.root / f"{name}.sqlite"
            conn = sqlite3.connect(str(path), check_same_thread=False)
            self.closers.append(conn.close)
            return SqliteSaver(conn), [path, path.with_name(path.name + "-wal")]
        if kind == "durkv":
            path = self.root / f"{name}.durkv"
            saver = DurkvSaver.open(str(path))
            self.closers.append(saver.close)
            return saver, [path]
        return (InMemorySaver() if kind == "memory" else NullSaver()), []

    def close(self) -> None:
        for c in self.closers:
            c()


@pytest.fixture(scope="module")
def savers(bench_root):
    s = Savers(bench_root)
    yield s
    s.close()


def disk_bytes(paths) -> int:
    total = 0
    for p in paths:
        if p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        elif p.exists():
            total += p.stat().st_size
    return total


MEDIANS: dict[tuple, float] = {}  # median seconds by measurement, shared across tests
SIZES: dict[tuple, float] = {}
STORES: dict[tuple, tuple] = {}   # (kind, n) -> (saver, graph, thread) of a finished run


def run_supersteps(savers, kind: str, mode: str, n: int, benchmark=None) -> float:
    """Median seconds of one N-superstep invoke (fresh thread per round)."""
    key = ("steps", kind, mode, n)
    if key in MEDIANS:
        return MEDIANS[key]
    saver, paths = savers.open(kind)
    graph = agent_graph(n).compile(checkpointer=saver)
    threads = (f"{kind}-{mode}-{n}-{i}" for i in itertools.count())
    last = []

    def once():
        t = next(threads)
        graph.invoke({"n": 0, "messages": []}, cfg(t, n), durability=mode)
        last.append(t)

    rounds = 1 if (kind == "sqlite" and n > 1000 and mode != "exit") else ROUNDS
    if benchmark is not None:
        benchmark.pedantic(once, rounds=rounds, iterations=1)
        MEDIANS[key] = benchlib.bench_median(benchmark)
    else:
        MEDIANS[key] = benchlib.median_time(once, rounds)
    if hasattr(saver, "flush"):
        saver.flush()
    if mode == "async" and paths:
        SIZES[(kind, n)] = disk_bytes(paths) / len(last)
    if mode == "async":
        STORES[(kind, n)] = (saver, graph, last[-1])
    return MEDIANS[key]


# ---- supersteps/s ------------------------------------------------------------------------

TARGETS = {  # (mode, baseline kind) -> minimum durkv speed ratio
    ("sync", "sqlite"): 2.0, ("async", "sqlite"): 2.0, ("exit", "sqlite"): 0.95,
    ("async", "memory"): 1.0, ("async", "null"): 0.8, ("sync", "null"): 0.5,
}


def interleaved(savers, mode: str, n: int, kinds: list[str], rounds: int) -> dict[str, float]:
    """Median seconds per kind, measured in alternating rounds so that load drifting
    on a shared machine hits every saver alike (ratios come from these)."""
    graphs = {}
    for kind in kinds:
        saver, _ = savers.open(kind)
        graphs[kind] = agent_graph(n).compile(checkpointer=saver)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):
            t0 = time.perf_counter()
            graphs[kind].invoke({"n": 0, "messages": []}, cfg(f"il-{mode}-{r}", n),
                                durability=mode)
            times[kind].append(time.perf_counter() - t0)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


@pytest.mark.parametrize("n", N_LIST)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_supersteps(benchmark, savers, kind, mode, n):
    benchmark.group = f"supersteps-{mode}-{n}"
    secs = run_supersteps(savers, kind, mode, n, benchmark)
    benchmark.extra_info["supersteps_per_s"] = round(n / secs, 1)
    if kind != "durkv":
        return
    bases = [base for (m, base) in TARGETS if m == mode]
    # sqlite at large N in sync/async takes tens of seconds a run: its own median is used
    slow = {"sqlite"} if (n > 1000 and mode != "exit") else set()
    medians = interleaved(savers, mode, n, ["durkv"] + [b for b in bases if b not in slow],
                          1 if QUICK else 5)
    for b in slow:
        medians[b] = run_supersteps(savers, b, mode, n)
    checks = []
    for base in bases:
        minimum = TARGETS[(mode, base)]
        ratio = medians[base] / medians["durkv"]
        checks.append((base, ratio, minimum))
        record(benchmark, f"supersteps {mode} N={n} vs {base}", ratio=ratio,
               target=f">= {minimum}x {base}", ok=ratio >= minimum)
    benchmark.extra_info["checks"] = [
        {"vs": b, "ratio": round(r, 3), "target": f">= {m}x", "ok": r >= m} for b, r, m in checks]
    benchmark.extra_info["interleaved_supersteps_per_s"] = {
        k: round(n / v, 1) for k, v in medians.items()}


# ---- what durkv adds to a sync superstep, against one fdatasync (issue 20) ----------------


@pytest.mark.parametrize("n", N_LIST[:1])
def test_sync_added_vs_fsync(benchmark, savers, baseline, bench_root, n):
    """Per superstep under ``durability="sync"``: DurkvSaver's time minus the null
    saver's (what storing adds: the commit's Python, its fdatasync, the hand-offs to
    LangGraph's executor) over one 1 KiB write+fdatasync of the C loop (csrc/rawio.c),
    the three measured in alternating rounds of one run, medians compared."""
    benchmark.group = f"sync-added-{n}"
    graphs = {k: agent_graph(n).compile(checkpointer=savers.open(k)[0])
              for k in ("null", "durkv")}
    raw_path = str(bench_root / "raw-fsync-loop")
    times: dict[str, list[float]] = {"null": [], "durkv": [], "raw": []}
    rounds = itertools.count()

    def one_round():
        r = next(rounds)
        for kind in (("null", "durkv") if r % 2 == 0 else ("durkv", "null")):
            t0 = time.perf_counter()
            graphs[kind].invoke({"n": 0, "messages": []}, cfg(f"added-{r}", n),
                                durability="sync")
            times[kind].append((time.perf_counter() - t0) / n)
        t0 = time.perf_counter()
        baseline.raw_fsync_loop(raw_path, n, 1024)
        times["raw"].append((time.perf_counter() - t0) / n)

    benchmark.pedantic(one_round, rounds=3 if QUICK else 7, iterations=1)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    added = med["durkv"] - med["null"]
    benchmark.extra_info.update({f"{k}_us_per_superstep": round(v * 1e6, 1)
                                 for k, v in med.items()})
    benchmark.extra_info["added_us_per_superstep"] = round(added * 1e6, 1)
    record(benchmark, f"sync N={n}: durkv - null per superstep / one write+fdatasync",
           ratio=added / med["raw"], target="<= 1.3x", ok=added / med["raw"] <= 1.3)


# ---- a chat's next turn: a thread read back and extended ---------------------------------


@pytest.mark.parametrize("n", N_LIST[:1])
def test_resumed_thread_turn(benchmark, savers, n):
    """A chat thread of ``n`` LangChain messages; each turn is a new ``invoke`` that reads
    the thread back (new message objects) and adds a question and a reply. DurkvSaver
    compares the read-back messages with the stored ones as stored (class and fields,
    never ==: GUARANTEES 10) so the turn is a delta: bytes per turn must not grow with
    the thread. Times interleaved against SqliteSaver and InMemorySaver."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    benchmark.group = f"resumed-turn-{n}"

    def reply(state):
        return {"messages": [AIMessage(content="ok " * 100)]}

    g = StateGraph(MessagesState)
    g.add_node("reply", reply)
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    kinds = ("durkv", "sqlite", "memory")
    opened = {k: savers.open(k) for k in kinds}
    graphs = {k: g.compile(checkpointer=opened[k][0]) for k in kinds}
    conf = {"configurable": {"thread_id": "chat"}}
    history = [HumanMessage(content=f"question {i} " * 30) for i in range(n)]
    for k in kinds:
        graphs[k].invoke({"messages": history}, conf, durability="sync")
    turns = 3 if QUICK else 15
    times: dict[str, list[float]] = {k: [] for k in kinds}
    path = opened["durkv"][1][0]
    before = frame_bytes(path)      # the log's frames, without the zero slack

    def one_round():
        r = len(times["durkv"])
        for k in (kinds if r % 2 == 0 else kinds[::-1]):
            t0 = time.perf_counter()
            graphs[k].invoke({"messages": [HumanMessage(content=f"turn {r} " * 30)]}, conf,
                             durability="sync")
            times[k].append(time.perf_counter() - t0)

    benchmark.pedantic(one_round, rounds=turns, iterations=1)
    per_turn = (frame_bytes(path) - before) / turns
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    benchmark.extra_info.update({f"{k}_ms_per_turn": round(v * 1e3, 2) for k, v in med.items()})
    benchmark.extra_info["durkv_bytes_per_turn"] = round(per_turn)
    record(benchmark, f"resumed thread of {n} messages: a turn vs SqliteSaver's time",
           ratio=med["sqlite"] / med["durkv"], target=">= 1x", ok=med["sqlite"] >= med["durkv"])
    # two new messages of ~100-300 characters: a delta is a few KiB; a full copy of the
    # thread would be ~n * 300 bytes a turn
    record(benchmark, f"resumed thread of {n} messages: bytes a turn / bytes of the thread",
           ratio=per_turn / max(1, before), target="<= 0.1x", ok=per_turn <= 0.1 * before,
           bytes_per_turn=round(per_turn), thread_bytes=before)


# ---- bytes on disk -----------------------------------------------------------------------


def delta_bytes(savers, kind: str, n: int) -> float:
    key = ("delta", kind, n)
    if key not in SIZES:
        saver, paths = savers.open(kind)
        graph = agent_graph(n, DeltaState).compile(checkpointer=saver)
        graph.invoke({"n": 0, "messages": []}, cfg("delta", n))
        if hasattr(saver, "flush"):
            saver.flush()
        SIZES[key] = disk_bytes(paths)
    return SIZES[key]


def test_bytes_on_disk(benchmark, savers):
    n = N_MAX
    benchmark.group = f"bytes-{n}"
    for kind in ("sqlite", "durkv"):
        if (kind, n) not in SIZES:
            run_supersteps(savers, kind, "async", n)
    durkv, sqlite = SIZES[("durkv", n)], SIZES[("sqlite", n)]
    sqlite_delta = benchmark.pedantic(delta_bytes, args=(savers, "sqlite", n), rounds=1,
                                      iterations=1)
    durkv_delta = delta_bytes(savers, "durkv", n)
    benchmark.extra_info.update(durkv_bytes=durkv, sqlite_bytes=sqlite,
                                sqlite_delta_bytes=sqlite_delta, durkv_delta_bytes=durkv_delta)
    record(benchmark, f"bytes N={n} sqlite/durkv", ratio=sqlite / durkv, target=">= 300x smaller",
           ok=sqlite / durkv >= 300)
    record(benchmark, f"bytes N={n} sqlite+DeltaChannel/durkv", ratio=sqlite_delta / durkv,
           target=">= 5x smaller", ok=sqlite_delta / durkv >= 5)


# ---- reads -------------------------------------------------------------------------------


def _finished(savers, kind, n):
    if (kind, n) not in STORES:
        run_supersteps(savers, kind, "async", n)
    return STORES[(kind, n)]


@pytest.mark.parametrize("n", N_LIST)
@pytest.mark.parametrize("kind", ("sqlite", "durkv"))
def test_get_state(benchmark, savers, kind, n):
    benchmark.group = f"get-state-{n}"
    _saver, graph, thread = _finished(savers, kind, n)
    config = cfg(thread, n)
    state = benchmark.pedantic(graph.get_state, args=(config,), rounds=20 if not QUICK else 5,
                               iterations=1, warmup_rounds=1)
    assert len(state.values["messages"]) == n
    MEDIANS[("get_state", kind, n)] = benchlib.bench_median(benchmark)
    if kind == "durkv" and ("get_state", "sqlite", n) in MEDIANS:
        ratio = MEDIANS[("get_state", kind, n)] / MEDIANS[("get_state", "sqlite", n)]
        record(benchmark, f"get_state N={n} durkv/sqlite latency", ratio=ratio,
               target="<= 0.2x sqlite; issue 20: <= 0.5x", ok=ratio <= 0.2,
               issue20_ok=ratio <= 0.5)
        small = min(N_LIST)
        if n != small and ("get_state", kind, small) in MEDIANS:
            flat = MEDIANS[("get_state", kind, n)] / MEDIANS[("get_state", kind, small)]
            benchmark.extra_info["flat_vs_smallest_n"] = round(flat, 3)
            print(f"\nget_state durkv N={n} vs N={small}: {flat:.2f}x (flat = ~1x; "
                  f"N ratio {n / small:.1f}x)")


@pytest.mark.parametrize("kind", ("sqlite", "durkv"))
def test_get_state_messages(benchmark, savers, kind):
    """graph.get_state of a graph whose state holds LangChain messages (add_messages, the
    shape most agents have): each message is a pydantic object to build."""
    n = min(N_LIST)
    benchmark.group = f"get-state-messages-{n}"
    key = ("messages", kind, n)
    if key not in STORES:
        saver, _paths = savers.open(kind)
        graph = message_graph(n, "ai").compile(checkpointer=saver)
        graph.invoke({"n": 0, "messages": []}, cfg(f"gsm-{kind}", n), durability="async")
        STORES[key] = (saver, graph, f"gsm-{kind}")
    _saver, graph, thread = STORES[key]
    config = cfg(thread, n)
    state = benchmark.pedantic(graph.get_state, args=(config,), rounds=20 if not QUICK else 5,
                               iterations=1, warmup_rounds=1)
    assert len(state.values["messages"]) == n and isinstance(state.values["messages"][0],
                                                              AIMessage)
    MEDIANS[("get_state_messages", kind, n)] = benchlib.bench_median(benchmark)
    if kind == "durkv" and ("get_state_messages", "sqlite", n) in MEDIANS:
        ratio = MEDIANS[("get_state_messages", kind, n)] / MEDIANS[
            ("get_state_messages", "sqlite", n)]
        record(benchmark, f"get_state N={n} AIMessages durkv/sqlite latency", ratio=ratio,
               target="issue 20: <= 0.5x", ok=ratio <= 0.5)


@pytest.mark.parametrize("kind", ("sqlite", "durkv"))
def test_history(benchmark, savers, kind):
    n = N_MAX
    benchmark.group = f"history-{n}"
    _saver, graph, thread = _finished(savers, kind, n)
    config = cfg(thread, n)

    def listing():
        return sum(1 for _ in graph.get_state_history(config))

    count = benchmark.pedantic(listing, rounds=1, iterations=1)
    assert count == n + 2
    MEDIANS[("history", kind)] = benchlib.bench_median(benchmark)
    if kind == "durkv" and ("history", "sqlite") in MEDIANS:
        ratio = MEDIANS[("history", "sqlite")] / MEDIANS[("history", kind)]
        record(benchmark, f"history N={n} speed vs sqlite", ratio=ratio, target=">= 5x sqlite",
               ok=ratio >= 5)


# ---- how far the saves trail an `async` loop ----------------------------------------------

N_LAG = 200 if QUICK else 2000


def _rss() -> int:
    """The process's resident bytes now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("kind", ("null", "sqlite", "durkv"))
def test_async_saves_behind(benchmark, savers, kind):
    """Under LangGraph's ``durability="async"`` each checkpoint is saved in its executor
    while the loop goes on: how many checkpoints the loop has made that are not saved yet
    (what a kill at that superstep loses), looked at every 100 supersteps of an N_LAG-
    superstep run, and the growth of the process's resident memory meanwhile (each
    queued checkpoint holds its own state). Reported side by side; the test suite holds
    durkv's bound (tests/test_langgraph_async_saves.py)."""
    benchmark.group = f"async-saves-behind-{N_LAG}"
    saver, _ = savers.open(kind)
    saved = [0]
    put = saver.put

    def counting_put(*args, **kwargs):
        out = put(*args, **kwargs)
        saved[0] += 1
        return out

    saver.put = counting_put
    behind: list[int] = []
    rss: list[int] = []

    def make(i):        # the agent loop's message i, looked around first
        if i % 100 == 0:
            behind.append(i + 1 - saved[0])
            rss.append(_rss())
        return message(i)

    graph = agent_graph(N_LAG, make=make).compile(checkpointer=saver)

    def once():
        saved[0] = 0
        behind.clear()
        rss[:] = [_rss()]
        graph.invoke({"n": 0, "messages": []}, cfg("lag", N_LAG), durability="async")

    benchmark.pedantic(once, rounds=1, iterations=1)
    benchmark.extra_info.update(max_behind=max(behind), last_behind=behind[-1],
                                supersteps=N_LAG,
                                rss_growth_mib=round((max(rss) - rss[0]) / 2**20, 1))
    print(f"\nasync saves behind, {kind}: at most {max(behind)} of {N_LAG} checkpoints "
          f"unsaved; resident memory +{(max(rss) - rss[0]) / 2**20:.1f} MiB")


# ---- what a saver of durkv's CPU cost can reach under "async" (issue 20) ------------------


class _RecordingSaver(NullSaver):
    """Stores nothing; keeps every put/put_writes call, to be replayed into a real saver."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []

    def put(self, config, checkpoint, metadata, new_versions):
        self.calls.append(("put", (config, checkpoint, metadata, new_versions)))
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config, writes, task_id, task_path=""):
        self.calls.append(("put_writes", (config, writes, task_id, task_path)))


def _spin(seconds: float, handoffs: int) -> None:
    """Hold the GIL and one CPU for ``seconds`` (a pure-Python loop), handing the GIL to
    a waiting thread ``handoffs`` times midway (``time.sleep(0)`` always lets it run; a
    short C call that releases the GIL only sometimes does)."""
    for i in range(handoffs + 1):
        end = time.perf_counter() + seconds / (handoffs + 1)
        while time.perf_counter() < end:
            pass
        if i < handoffs:
            time.sleep(0)


class _SpinSaver(NullSaver):
    """Stores nothing, but spends ``put_s``/``writes_s`` of CPU in each call: a saver
    exactly as costly as durkv's commits measured alone, handing the GIL over
    ``handoffs`` times a call (durkv's commit releases it in up to four short C calls:
    three into the C log and a zstd compress)."""

    def __init__(self, put_s: float, writes_s: float, handoffs: int) -> None:
        super().__init__()
        self.put_s, self.writes_s, self.handoffs = put_s, writes_s, handoffs

    def put(self, config, checkpoint, metadata, new_versions):
        _spin(self.put_s, self.handoffs)
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config, writes, task_id, task_path=""):
        _spin(self.writes_s, self.handoffs)


def _commit_costs(savers, calls: list, rounds: int) -> tuple[float, float]:
    """Median seconds of one DurkvSaver ``put`` and one ``put_writes``, the agent loop's
    calls replayed on one thread (no executor, no GIL contention) into a fresh thread
    of a local store, per round."""
    saver, _ = savers.open("durkv")
    per: dict[str, list[float]] = {"put": [], "put_writes": []}
    for r in range(rounds + 1):             # round 0 warms the store and the caches
        spent = {"put": 0.0, "put_writes": 0.0}
        for name, args in calls:
            conf = args[0]
            args = ({**conf, "configurable": {**conf["configurable"],
                                              "thread_id": f"replay-{r}"}},) + args[1:]
            t0 = time.perf_counter()
            getattr(saver, name)(*args)
            spent[name] += time.perf_counter() - t0
        if r:
            for name, s in spent.items():
                per[name].append(s / sum(1 for c in calls if c[0] == name))
    return tuple(sorted(v)[len(v) // 2] for v in per.values())     # type: ignore[return-value]


def _held(on: bool) -> None:
    """Make the commit path's log calls and compresses keep the GIL (durkv's default) or
    hand it over as cffi's calls and zstandard's compress do (``durkv-cffi``)."""
    durkv.log.HELD_CALLS = on
    durkv.payload.HELD_ZSTD = on and HELD_ZSTD


HELD_ZSTD = durkv.payload.HELD_ZSTD     # libzstd.so.1 was found


@pytest.mark.parametrize("n", N_LIST[:1])
def test_async_cpu_floor(benchmark, savers, n):
    """Why ``async >= 0.8x null`` is missed, measured. The agent loop under LangGraph's
    ``durability="async"``, in alternating rounds of one run, on: the null saver; a saver
    that stores nothing but spins (GIL held) for as long as DurkvSaver's ``put`` and
    ``put_writes`` take when replayed alone on one thread; the same spinning saver handing
    the GIL over once a call; and DurkvSaver. The first spinning saver's ratio is the best
    any saver of durkv's commit cost reaches here; the second shows what one GIL hand-off
    a call costs when LangGraph's loop runs on while the executor's thread saves.
    ``durkv-cffi`` is DurkvSaver with its commit's GIL releases back (the log's calls
    through cffi, compresses through zstandard): what the GIL-held path gained."""
    benchmark.group = f"async-cpu-floor-{n}"
    recording = _RecordingSaver()
    agent_graph(n).compile(checkpointer=recording).invoke(
        {"n": 0, "messages": []}, cfg("recorded", n), durability="async")
    put_s, writes_s = _commit_costs(savers, recording.calls, 1 if QUICK else 3)
    _held(False)                # the store's Codec takes its compressor at open
    cffi_saver = savers.open("durkv")[0]
    _held(True)
    kinds = {"null": NullSaver(), "spin": _SpinSaver(put_s, writes_s, 0),
             "spin-1-handoff": _SpinSaver(put_s, writes_s, 1), "durkv": savers.open("durkv")[0],
             "durkv-cffi": cffi_saver}
    graphs = {k: agent_graph(n).compile(checkpointer=s) for k, s in kinds.items()}
    times: dict[str, list[float]] = {k: [] for k in graphs}
    rounds = itertools.count()

    def one_round():
        r = next(rounds)
        for kind in (list(graphs) if r % 2 == 0 else list(graphs)[::-1]):
            _held(kind != "durkv-cffi")
            try:
                t0 = time.perf_counter()
                graphs[kind].invoke({"n": 0, "messages": []}, cfg(f"floor-{r}", n),
                                    durability="async")
                times[kind].append(time.perf_counter() - t0)
            finally:
                _held(True)

    benchmark.pedantic(one_round, rounds=1 if QUICK else 7, iterations=1)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    vs_null = {k: round(med["null"] / v, 3) for k, v in med.items() if k != "null"}
    benchmark.extra_info.update(
        put_alone_us=round(put_s * 1e6, 1), put_writes_alone_us=round(writes_s * 1e6, 1),
        us_per_superstep={k: round(v / n * 1e6, 1) for k, v in med.items()}, vs_null=vs_null)
    print(f"\nasync N={n}: put {put_s * 1e6:.1f} us + put_writes {writes_s * 1e6:.1f} us "
          f"alone; vs null: " + ", ".join(f"{k} {r:.3f}x" for k, r in vs_null.items()))


# ---- 8 threads, 8 graphs, one store ------------------------------------------------------


@pytest.mark.parametrize("kind", ("sqlite", "durkv"))
def test_threads(benchmark, savers, kind):
    benchmark.group = "threads-8"
    saver, _paths = savers.open(kind)
    graph = agent_graph(N_THREADED).compile(checkpointer=saver)
    rounds = itertools.count()

    def run_all():
        r = next(rounds)
        errors = []

        def one(i):
            try:
                graph.invoke({"n": 0, "messages": []}, cfg(f"{kind}-{r}-{i}", N_THREADED),
                             durability="sync")
            except BaseException as e:  # surfaced below
                errors.append(e)
        ts = [threading.Thread(target=one, args=(i,)) for i in range(THREADS)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors[0]
        return time.perf_counter() - t0

    benchmark.pedantic(run_all, rounds=ROUNDS, iterations=1)
    secs = MEDIANS[("threads", kind)] = benchlib.bench_median(benchmark)
    benchmark.extra_info["aggregate_supersteps_per_s"] = round(THREADS * N_THREADED / secs, 1)
    if kind == "durkv" and ("threads", "sqlite") in MEDIANS:
        ratio = MEDIANS[("threads", "sqlite")] / secs
        record(benchmark, "8 threads sync aggregate vs sqlite", ratio=ratio,
               target=">= 3x sqlite", ok=ratio >= 3)


# ---- bytes vs the raw appended payload -----------------------------------------------------


class MessagesState(TypedDict):
    n: int
    messages: Annotated[list, add_messages]


def ai_message(i: int) -> AIMessage:
    return AIMessage(content=message(i)["content"], id=f"msg-{i}")


def message_graph(n: int, msg: str):
    return agent_graph(n) if msg == "dict" else agent_graph(n, MessagesState, ai_message)


RAW_N = (100, 200) if QUICK else (2000, 4000)


def raw_ratio(savers, msg: str, n: int) -> tuple[float, dict]:
    """durkv's bytes on disk / the serialized messages, and the split by frame kind."""
    key = ("raw", msg, n)
    if key not in SIZES:
        saver, paths = savers.open("durkv")
        message_graph(n, msg).compile(checkpointer=saver).invoke(
            {"n": 0, "messages": []}, cfg(f"raw-{msg}-{n}", n), durability="async")
        saver.flush()
        dumps = saver.serde.dumps_typed
        make = message if msg == "dict" else ai_message
        raw = sum(len(dumps(make(i))[1]) for i in range(n))
        split: dict[str, list[int]] = {}
        b = saver.store._b
        for _lsn, p in b.scan(b.start_lsn):
            head = msgpack.unpackb(decode_head(p), raw=False, strict_map_key=False)
            kind = {1: "checkpoint", 2: "pending-write"}.get(head[0], "other")
            got = split.setdefault(kind, [0, 0])
            got[0] += 1
            got[1] += len(p)
        SIZES[key] = (disk_bytes(paths) / raw, {
            "disk_bytes": disk_bytes(paths), "raw_bytes": raw,
            **{f"{k}_frames": v[0] for k, v in split.items()},
            **{f"{k}_bytes_per_frame": round(v[1] / v[0]) for k, v in split.items()}})
    return SIZES[key]


@pytest.mark.parametrize("n", RAW_N)
@pytest.mark.parametrize("msg", ("dict", "aimessage"))
def test_bytes_vs_raw(benchmark, savers, msg, n):
    benchmark.group = f"bytes-raw-{msg}"
    ratio, info = benchmark.pedantic(raw_ratio, args=(savers, msg, n), rounds=1, iterations=1)
    benchmark.extra_info.update(info)
    record(benchmark, f"bytes N={n} {msg} / raw payload", ratio=ratio, target="<= 1.5x raw",
           ok=ratio <= 1.5)
    small = min(RAW_N)
    if n != small and ("raw", msg, small) in SIZES:
        growth = info["disk_bytes"] / SIZES[("raw", msg, small)][1]["disk_bytes"]
        record(benchmark, f"bytes N={n} / N={small} {msg}", ratio=growth,
               target=f"<= {2.1 * n / small / 2:.2f}x", ok=growth <= 2.1 * n / small / 2)


# ---- the thread claim (issue 17): its cost per invocation ---------------------------------

CLAIM_INVOKES = 50 if QUICK else 300


class OneStep(TypedDict):
    n: int


def test_thread_claim(benchmark, savers, monkeypatch):
    """invoke of a 1-node graph (the smallest invocation: one input checkpoint, one loop
    checkpoint) on a local store, with the thread claim (durkv.langgraph_claim) and with
    it switched off, in alternating rounds; the ratio is unclaimed time / claimed time."""
    from langgraph.graph import END, START, StateGraph

    import durkv.langgraph as dlg

    benchmark.group = "thread-claim"
    saver, _ = savers.open("durkv")
    g = StateGraph(OneStep)
    g.add_node("agent", lambda s: {"n": s["n"] + 1})
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    graph = g.compile(checkpointer=saver)
    claim = dlg.claim_for_loop
    times: dict[bool, list[float]] = {True: [], False: []}

    def batch(claimed: bool, r: int) -> None:
        monkeypatch.setattr(dlg, "claim_for_loop", claim if claimed else
                            (lambda *a: None))
        t0 = time.perf_counter()
        for i in range(CLAIM_INVOKES):
            graph.invoke({"n": 0}, {"configurable": {"thread_id": f"claim-{claimed}-{r}-{i % 8}"}})
        times[claimed].append((time.perf_counter() - t0) / CLAIM_INVOKES)

    def rounds():
        for r in range(ROUNDS * 2 + 1):
            for claimed in ((True, False) if r % 2 == 0 else (False, True)):
                batch(claimed, r)

    benchmark.pedantic(rounds, rounds=1, iterations=1)
    t0 = time.perf_counter()                  # the claim alone: flock file made, unlinked
    for i in range(CLAIM_INVOKES):
        saver.store.claim_driver("thread", f"bare-{i % 8}").release()
    benchmark.extra_info["claim_release_us"] = round(
        (time.perf_counter() - t0) / CLAIM_INVOKES * 1e6, 1)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    benchmark.extra_info["invoke_us"] = {"claimed": round(med[True] * 1e6, 1),
                                         "unclaimed": round(med[False] * 1e6, 1)}
    benchmark.extra_info["claim_us_per_invoke"] = round((med[True] - med[False]) * 1e6, 1)
    record(benchmark, "invoke 1-node graph, claimed vs unclaimed", ratio=med[False] / med[True],
           target=">= 0.9x unclaimed", ok=med[False] / med[True] >= 0.9)
