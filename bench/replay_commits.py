"""What DurkvSaver's two commit calls cost, without LangGraph's threads around them.

    python bench/replay_commits.py [--n 500] [--rounds 5] [--mode async]

Runs the agent loop of ``bench/test_bench_langgraph.py`` once on a recording saver, then
replays the recorded ``put``/``put_writes`` arguments (the same objects, as LangGraph
passes them) on one thread into fresh stores, ``--rounds`` times, and prints each call's
thread CPU per superstep (min and median over the rounds). Thread CPU, not wall: on a
shared machine it moves far less with the load (docs/BENCHMARKS.md, "Issue 20:
DurkvSaver's commit path").

Instructions, which do not move at all with the load:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/replay_commits.py --n 200 --rounds 0    # then --rounds 2

and (total of the second - total of the first) / (2 * 200) is the instructions of one
superstep's two calls.

``--graph`` measures what the calls cost inside LangGraph instead: the process CPU of
whole N-superstep runs of the agent graph on a saver that stores nothing and on
DurkvSaver, interleaved ``--rounds`` times in this process, and their ratio -- the
``async`` target's ratio (0.8x the null saver) as CPU, which a loaded machine moves far
less than it moves wall time (the graph is CPU-bound under the GIL).

``--split`` says where what DurkvSaver adds goes, across threads: null saver and DurkvSaver
graph runs interleaved with replays of the recorded calls, each round printing, per
superstep, the process CPU (user, system), the loop thread's CPU (``RUSAGE_THREAD``), the
other threads' (LangGraph's executor threads and the log's flusher), the context switches,
the garbage collector's time, and ``put``/``put_writes``' thread CPU inside the graph next
to the same calls replayed alone on one thread.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import tempfile
import time
from pathlib import Path

from durkv.cli.benchgraph import NullSaver, agent_graph, cfg
from durkv.langgraph import DurkvSaver


def record(root: Path, n: int, mode: str) -> list[tuple[str, tuple]]:
    """The (method, arguments) of every put and put_writes of one N-superstep run."""
    calls: list[tuple[str, tuple]] = []

    class Recording(DurkvSaver):
        def put(self, *args):
            calls.append(("put", args))
            return super().put(*args)

        def put_writes(self, *args):
            calls.append(("put_writes", args))
            return super().put_writes(*args)

    with Recording.open(str(root / "recorded.durkv")) as saver:
        graph = agent_graph(n).compile(checkpointer=saver)
        graph.invoke({"n": 0, "messages": []}, cfg("recorded", n), durability=mode)
    return calls


def replay(path: Path, calls: list[tuple[str, tuple]]) -> dict[str, float]:
    """Thread CPU seconds spent in each method, replaying ``calls`` into a new store."""
    spent = {"put": 0.0, "put_writes": 0.0}
    with DurkvSaver.open(str(path)) as saver:
        for name, args in calls:
            method = getattr(saver, name)
            t0 = time.thread_time()
            method(*args)
            spent[name] += time.thread_time() - t0
    return spent


def graph_cpu(root: Path, n: int, mode: str, saver_kind: str, r: int) -> float:
    """Process CPU seconds of one N-superstep run of the agent graph on a saver."""
    if saver_kind == "null":
        saver, path = NullSaver(), None
    else:
        path = str(root / f"graph-{r}.durkv")
        saver = DurkvSaver.open(path)
    try:
        graph = agent_graph(n).compile(checkpointer=saver)
        t0 = time.process_time()
        graph.invoke({"n": 0, "messages": []}, cfg(f"g{r}", n), durability=mode)
        return time.process_time() - t0
    finally:
        if path is not None:
            saver.close()


def graph_main(n: int, rounds: int, mode: str) -> None:
    cpu: dict[str, list[float]] = {"null": [], "durkv": []}
    with tempfile.TemporaryDirectory() as tmp:
        graph_cpu(Path(tmp), n, mode, "durkv", -1)      # warm: imports, first-call caches
        for r in range(rounds):
            for kind in (("null", "durkv") if r % 2 == 0 else ("durkv", "null")):
                cpu[kind].append(graph_cpu(Path(tmp), n, mode, kind, r) / n * 1e6)
    for kind, per in cpu.items():
        print(f"{kind:6s} process CPU min {min(per):7.1f} us  median "
              f"{statistics.median(per):7.1f} us a superstep ({rounds} runs of {n}, {mode})")
    print(f"null/durkv CPU (the {mode} ratio as CPU): min-based "
          f"{min(cpu['null']) / min(cpu['durkv']):.3f}x, median-based "
          f"{statistics.median(cpu['null']) / statistics.median(cpu['durkv']):.3f}x; durkv adds "
          f"{statistics.median(cpu['durkv']) - statistics.median(cpu['null']):.1f} us")


class _Timed:
    """Thread CPU of every put/put_writes of a DurkvSaver (on whichever thread runs it), and
    the garbage collector's time, for --split."""

    def __init__(self) -> None:
        self.spent = {"put": 0.0, "put_writes": 0.0, "gc": 0.0}
        self._gc_start = 0.0

    def saver(self, path: str) -> DurkvSaver:
        spent = self.spent

        class Timed(DurkvSaver):
            def put(self, *args):
                t0 = time.thread_time()
                try:
                    return super().put(*args)
                finally:
                    spent["put"] += time.thread_time() - t0

            def put_writes(self, *args):
                t0 = time.thread_time()
                try:
                    return super().put_writes(*args)
                finally:
                    spent["put_writes"] += time.thread_time() - t0
        return Timed.open(path)

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.thread_time()
        else:
            self.spent["gc"] += time.thread_time() - self._gc_start


def _usage() -> tuple[float, ...]:
    me = resource.getrusage(resource.RUSAGE_THREAD)
    us = resource.getrusage(resource.RUSAGE_SELF)
    return (us.ru_utime, us.ru_stime, me.ru_utime, me.ru_stime, us.ru_nvcsw, us.ru_nivcsw)


def split_main(n: int, rounds: int, mode: str) -> None:
    timed = _Timed()
    gc.callbacks.append(timed.on_gc)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        calls = record(root, n, mode)
        print("saver  proc usr  sys | loop usr  sys | others usr  sys | vcs  ivcs |   gc | "
              "put + put_writes in graph | replayed alone   (us and switches a superstep)")
        for r in range(rounds):
            for kind in (("null", "durkv") if r % 2 == 0 else ("durkv", "null")):
                saver = NullSaver() if kind == "null" else timed.saver(str(root / f"s{r}.durkv"))
                for k in timed.spent:
                    timed.spent[k] = 0.0
                graph = agent_graph(n).compile(checkpointer=saver)
                u0 = _usage()
                graph.invoke({"n": 0, "messages": []}, cfg(f"g{r}", n), durability=mode)
                u = [(b - a) / n for a, b in zip(u0, _usage())]
                line = (f"{kind:6s} {u[0] * 1e6:8.0f} {u[1] * 1e6:4.0f} | {u[2] * 1e6:8.0f} "
                        f"{u[3] * 1e6:4.0f} | {(u[0] - u[2]) * 1e6:10.0f} "
                        f"{(u[1] - u[3]) * 1e6:4.0f} | {u[4]:4.2f} {u[5]:4.2f} | "
                        f"{timed.spent['gc'] / n * 1e6:4.0f} |")
                if kind == "durkv":
                    saver.close()
                    alone = replay(root / f"r{r}.durkv", calls)
                    line += (f" {timed.spent['put'] / n * 1e6:5.0f} + "
                             f"{timed.spent['put_writes'] / n * 1e6:5.0f}"
                             f"{'':13s}| {alone['put'] / n * 1e6:5.0f} + "
                             f"{alone['put_writes'] / n * 1e6:5.0f}")
                print(line, flush=True)
    gc.callbacks.remove(timed.on_gc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=500, help="supersteps of the recorded run")
    ap.add_argument("--rounds", type=int, default=5, help="replays (0: record only)")
    ap.add_argument("--mode", default="async", choices=("sync", "async"),
                    help="LangGraph's durability= of the run (and of the replayed calls)")
    ap.add_argument("--graph", action="store_true",
                    help="process CPU of whole graph runs, null saver vs DurkvSaver")
    ap.add_argument("--split", action="store_true",
                    help="per-thread CPU of graph runs, null saver vs DurkvSaver, with the "
                         "calls' CPU in the graph and replayed alone")
    args = ap.parse_args()
    if args.split:
        split_main(args.n, max(args.rounds, 1), args.mode)
        return
    if args.graph:
        graph_main(args.n, max(args.rounds, 1), args.mode)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        calls = record(root, args.n, args.mode)
        rounds = [replay(root / f"replay-{r}.durkv", calls) for r in range(args.rounds)]
    if not rounds:
        return
    for name in ("put", "put_writes"):
        per = [r[name] / args.n * 1e6 for r in rounds]
        print(f"{name:11s} min {min(per):7.1f} us  median {statistics.median(per):7.1f} us "
              f"a superstep ({args.rounds} replays of {args.n}, {args.mode})")
    total = [(r["put"] + r["put_writes"]) / args.n * 1e6 for r in rounds]
    print(f"{'both':11s} min {min(total):7.1f} us  median {statistics.median(total):7.1f} us")


if __name__ == "__main__":
    main()
