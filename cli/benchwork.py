"""The workloads ``durkv bench`` times, and the side-by-side runner that times them.

The agent loop: N steps, each adding one ~1 KiB message. durkv runs it as checkpoints
(``store.put`` of the whole growing message list, one commit a step) and as journal
steps (``run.step`` recording a model call's ~1 KiB result), under each durability
policy. Under them lies the floor: the raw C loop of N writes of 1 KiB, each
fdatasync'd (what a ``sync`` commit cannot beat) or not (``async`` and ``exit``).
``durkv.cli.benchgraph`` adds the same loop as a LangGraph graph.

A workload times only its N steps: opening, flushing and closing the store are outside
the clock, and its bytes on disk are counted after the flush. :func:`measure` runs every
workload for each N in alternating rounds, so that load drifting on a shared machine
hits them alike, and keeps the median: compare rows by their ratios.
"""

from __future__ import annotations

import gc
import random
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import open as open_store
from ..durability import ASYNC, DURABILITIES, SYNC
from ..log import raw_write_loop

MESSAGE_BYTES = 1024
WARMUP_STEPS = 5
RAW_FSYNC = "raw write+fdatasync"
RAW_WRITE = "raw write"
CHECKPOINTS = "durkv checkpoints"
JOURNAL = "durkv journal steps"

_WORDS = ("agent tool call result plan step observe think answer retry search read write "
          "file shell patch test pass fail error fix deploy review").split()


def _text(seed: int) -> str:
    rnd = random.Random(seed)
    return " ".join(rnd.choice(_WORDS) for _ in range(200))[:1000]


_TEXTS = [_text(i) for i in range(64)]


def message(i: int) -> dict:
    """Step ``i``'s new ~1 KiB message: chat-like text (it compresses about as well as
    a model's output does), the same for every workload and every run."""
    return {"role": "assistant", "id": f"msg-{i}", "content": _TEXTS[i % 64]}


# A workload does n steps in a directory of its own and returns (seconds the n steps
# took, bytes on disk afterwards, or None when it keeps nothing on disk).
Run = Callable[[Path, int], "tuple[float, int | None]"]


@dataclass(frozen=True)
class Workload:
    name: str
    policy: str
    run: Run
    baseline: tuple[str, str]   # (name, policy) of the row its ratio is taken against


@dataclass
class Row:
    """One workload at one N: its median time and what it left on disk."""

    name: str
    policy: str
    n: int
    seconds: float
    steps_per_s: float
    bytes: int | None
    bytes_per_step: float | None
    baseline: str
    baseline_policy: str
    ratio: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def filesystem(path: Path) -> str | None:
    """The file system type under ``path`` (Linux: the longest mount point in
    /proc/mounts that holds it), or None where that cannot be told."""
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split()[1:3] for line in f]
    except OSError:
        return None
    path = path.resolve()
    best = None
    for point, kind in mounts:
        p = Path(point)
        if (p == path or p in path.parents) and (best is None or len(point) > len(best[0])):
            best = (point, kind)
    return None if best is None else best[1]


def floor_for(policy: str) -> tuple[str, str]:
    """The raw loop a durkv policy is compared to: fdatasync'd for sync, write-only for
    async and exit (neither waits for the disk when a commit returns)."""
    return (RAW_FSYNC, SYNC) if policy == SYNC else (RAW_WRITE, ASYNC)


def raw_loop(sync: bool) -> Run:
    def run(where: Path, n: int) -> tuple[float, int | None]:
        path = where / "raw.bin"
        t0 = time.perf_counter()
        raw_write_loop(path, n, MESSAGE_BYTES, sync=sync)
        took = time.perf_counter() - t0
        return took, path.stat().st_size
    return run


def checkpoints(policy: str) -> Run:
    """The agent loop as checkpoints: each step puts the whole message list (a new list
    holding the same message objects, as LangGraph's ``operator.add`` builds it)."""
    def run(where: Path, n: int) -> tuple[float, int | None]:
        with open_store(str(where / "agent.durkv"), durability=policy) as store:
            put = store.put
            messages: list = []
            parent = None
            t0 = time.perf_counter()
            for i in range(n):
                messages = messages + [message(i)]
                cid = f"{i:012d}"
                put("agent", "", cid, checkpoint={}, metadata={"step": i},
                    values={"messages": messages, "step": i},
                    versions={"messages": i + 1, "step": i + 1}, parent_id=parent)
                parent = cid
            took = time.perf_counter() - t0
            store.flush()
        return took, dir_bytes(where)
    return run


def journal_steps(policy: str) -> Run:
    """The agent loop as a run journal: each step records a model call's ~1 KiB result."""
    def run(where: Path, n: int) -> tuple[float, int | None]:
        with open_store(str(where / "agent.durkv"), durability=policy) as store:
            with store.run("agent") as agent:
                step = agent.step
                t0 = time.perf_counter()
                for i in range(n):
                    step("model", message, i)
                took = time.perf_counter() - t0
            store.flush()
        return took, dir_bytes(where)
    return run


def durkv_workloads() -> list[Workload]:
    """The raw floors first, then durkv's checkpoints and journal under every policy."""
    out = [Workload(RAW_FSYNC, SYNC, raw_loop(True), (RAW_FSYNC, SYNC)),
           Workload(RAW_WRITE, ASYNC, raw_loop(False), (RAW_WRITE, ASYNC))]
    for name, make in ((CHECKPOINTS, checkpoints), (JOURNAL, journal_steps)):
        out += [Workload(name, p, make(p), floor_for(p)) for p in DURABILITIES]
    return out


def measure(workloads: Sequence[Workload], sizes: Sequence[int], rounds: int, root: Path,
            progress: Callable[[int, int], None] = lambda done, total: None) -> list[Row]:
    """Run every workload ``rounds`` times for each N in ``sizes``, in ``root``: in each
    round all workloads one after another (in reverse order every other round), each in a
    fresh directory deleted right after. ``progress(steps done, steps in all)``."""
    total = sum(sizes) * rounds * len(workloads)
    done = 0
    rows = []
    # Everything alive now (LangGraph's modules...) is kept out of the collections that
    # start each run: they then cost only the garbage runs leave, not a full heap walk.
    gc.collect()
    gc.freeze()
    try:
        for i, w in enumerate(workloads):     # warm up: first-call costs (imports, caches)
            _timed(w, root / f"warmup-{i}", WARMUP_STEPS)
        for n in sizes:
            times: dict[Workload, list[float]] = {w: [] for w in workloads}
            sizes_on_disk: dict[Workload, int | None] = {}
            for r in range(rounds):
                for i, w in enumerate(workloads if r % 2 == 0 else workloads[::-1]):
                    took, on_disk = _timed(w, root / f"{r}-{i}-{n}", n)
                    times[w].append(took)
                    sizes_on_disk[w] = on_disk
                    done += n
                    progress(done, total)
            rows += _rows(workloads, n, times, sizes_on_disk)
    finally:
        gc.unfreeze()
    return rows


def _timed(w: Workload, where: Path, n: int) -> tuple[float, int | None]:
    """One run of ``w`` in a new directory ``where``, removed afterwards."""
    where.mkdir()
    gc.collect()     # the previous run's garbage is not this one's cost
    try:
        return w.run(where, n)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _rows(workloads: Sequence[Workload], n: int, times: dict[Workload, list[float]],
          on_disk: dict[Workload, int | None]) -> list[Row]:
    seconds = {(w.name, w.policy): statistics.median(times[w]) for w in workloads}
    rows = []
    for w in workloads:
        secs = seconds[(w.name, w.policy)]
        b = on_disk[w]
        rows.append(Row(
            name=w.name, policy=w.policy, n=n, seconds=secs, steps_per_s=n / secs, bytes=b,
            bytes_per_step=None if b is None else b / n, baseline=w.baseline[0],
            baseline_policy=w.baseline[1], ratio=seconds[w.baseline] / secs))
    return rows
