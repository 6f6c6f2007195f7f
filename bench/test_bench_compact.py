"""Compaction and stats of a store with N threads, half of them deleted (issue 19).

| benchmark         | measures                                                   | target       |
|-------------------|------------------------------------------------------------|--------------|
| compact-half      | `durkv compact` (Store.compact) of the store, seconds,     | <= 1x write  |
|                   | vs writing the same store (every put and put_writes,       | bytes after  |
|                   | durability exit) and vs copying its files (the I/O floor); | <= 0.55x     |
|                   | bytes on disk before and after                             |              |
| stats             | Store.stats() of the same store (read-only), vs the copy   | (recorded)   |

Workload: N threads x 100 checkpoints, each a growing message list (one ~300-byte
message per step, delta-encoded) after the pending write that hands it the message (as
LangGraph does: the checkpoint refers to the write's items); then every other thread is
deleted. N = 100 (DURKV_BENCH_QUICK=1: 20). Each figure is the median of 3 rounds, each
round on a fresh copy of the store, all in one run.
"""

from __future__ import annotations

import shutil
import time

import pytest
from benchlib import QUICK, record

import durkv

STEPS = 100


def _write(path, n_threads: int) -> float:
    t0 = time.perf_counter()
    with durkv.open(str(path), durability="exit") as s:
        for t in range(n_threads):
            msgs: list[str] = []
            parent = None
            for i in range(STEPS):
                new = f"thread {t} step {i}: " + "m" * 280
                if parent is not None:    # the node's output, as LangGraph hands it over
                    s.put_writes(f"t{t}", "", parent, "task", [(0, "messages", [new])])
                msgs = msgs + [new]
                cid = f"{i:08d}"
                s.put(f"t{t}", "", cid, checkpoint={"i": i}, metadata={"step": i},
                      values={"messages": msgs, "step": i}, versions={"messages": i, "step": i},
                      parent_id=parent)
                parent = cid
    return time.perf_counter() - t0


def _disk(path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@pytest.mark.benchmark(group="compact")
def test_compact_half_deleted(benchmark, bench_root):
    n = 20 if QUICK else 100
    src = bench_root / "compact-src"
    t_write = _write(src, n)
    with durkv.open(str(src)) as s:
        for t in range(0, n, 2):
            s.delete_thread(f"t{t}")
    before = _disk(src)

    rounds = []
    for r in range(3):
        copy = bench_root / f"compact-{r}"
        t_copy = _timed(lambda: shutil.copytree(src, copy))
        with durkv.open(str(copy), read_only=True) as s:
            t_stats = _timed(s.stats)
        with durkv.open(str(copy)) as s:
            t_compact = _timed(s.compact)
        rounds.append((t_compact, t_copy, t_stats, _disk(copy)))
        shutil.rmtree(copy)
    rounds.sort()
    t_compact, t_copy, t_stats, after = rounds[1]          # the median round by compact time

    benchmark.pedantic(lambda: None, rounds=1)            # figures are in extra_info
    ratio = t_compact / t_write
    print(f"\ncompact {n} threads x {STEPS} (half deleted): write {t_write:.3f} s, "
          f"copy {t_copy:.3f} s, stats {t_stats:.3f} s, compact {t_compact:.3f} s; "
          f"{before / 1e6:.2f} MB -> {after / 1e6:.2f} MB ({after / before:.2f}x)")
    record(benchmark, "compact-half-vs-write", ratio=ratio, target="<= 1x the write",
           ok=ratio <= 1.0, threads=n, steps=STEPS, write_s=round(t_write, 4),
           copy_s=round(t_copy, 4), stats_s=round(t_stats, 4), compact_s=round(t_compact, 4),
           bytes_before=before, bytes_after=after)
    record(benchmark, "compact-half-bytes", ratio=after / before, target="<= 0.55x",
           ok=after / before <= 0.55)
