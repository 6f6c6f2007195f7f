"""Compaction and stats of a store with N threads, half of them deleted (issue 19).

| benchmark         | measures                                                   | target       |
|-------------------|------------------------------------------------------------|--------------|
| compact-half      | `durkv compact` (Store.compact) of the store, seconds,     | <= 1x write  |
|                   | vs writing the same store (every put and put_writes,       | bytes after  |
|                   | durability exit) and vs copying its files (the I/O floor); | <= 0.55x     |
|                   | bytes on disk before and after                             |              |
| stats             | Store.stats() of the same store (read-only), vs the copy   | (recorded)   |
| compact-forks     | bytes of the journal copies after compacting a run copied  | <= 1.1x      |
|                   | to FORKS threads (copy_thread), vs the journal never       |              |
|                   | copied; the whole store's bytes before and after           | (recorded)   |

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
from durkv.log import SegmentLog
from durkv.store.records import K_COPY_JOURNAL, read_head

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


FORKS = 4


def _journal_store(path, forks: int, steps: int) -> None:
    """One run of ``steps`` steps (a ~300-byte result each), ``forks`` copies of its thread
    (copy_thread, as a LangGraph fork does), each going on with one step of its own."""
    with durkv.open(str(path), durability="exit") as s:
        with s.run("agent") as run:
            for i in range(steps):
                run.step(f"s{i}", lambda i=i: f"step {i}: " + "r" * 290)
        for f in range(forks):
            s.copy_thread("agent", f"fork{f}")
        for f in range(FORKS):      # the same records of their own in both stores
            s.append_journal(f"fork{f}", {"e": 8, "st": "running", "t": 0.0})


def _journal_copy_bytes(path) -> int:
    """Bytes of the K_COPY_JOURNAL frames (headers included) in the log at ``path``."""
    with SegmentLog.open(str(path), read_only=True) as log:
        return sum(len(p) + 24 for lsn, p in log.scan(log.start_lsn)
                   if read_head(p, lsn)[0] == K_COPY_JOURNAL)


@pytest.mark.benchmark(group="compact")
def test_compact_forked_journals(benchmark, bench_root):
    """A thread's journal shared by FORKS copies is compacted into one copy of each record
    (FORMAT.md 5a), not one per run: the journal copies' bytes vs those of the store whose
    journal was never copied (the target), and the whole store's, before and after."""
    steps = 200 if QUICK else 2000
    before, after, copies = {}, {}, {}
    for forks in (0, FORKS):
        path = bench_root / f"compact-forks-{forks}"
        _journal_store(path, forks, steps)
        before[forks] = _disk(path)
        with durkv.open(str(path)) as s:
            report = s.compact()
        after[forks], copies[forks] = _disk(path), _journal_copy_bytes(path)
    benchmark.pedantic(lambda: None, rounds=1)            # figures are in extra_info
    ratio = copies[FORKS] / copies[0]
    print(f"\ncompact a {steps}-step journal copied to {FORKS} forks: journal copies "
          f"{copies[FORKS]:,} B ({copies[0]:,} B never copied); store {before[FORKS]:,} -> "
          f"{after[FORKS]:,} B ({before[0]:,} -> {after[0]:,} B never copied)")
    record(benchmark, "compact-forks-journal-bytes", ratio=ratio, target="<= 1.1x",
           ok=ratio <= 1.1, steps=steps, forks=FORKS, copies_forked=copies[FORKS],
           copies_unforked=copies[0], store_before={str(k): v for k, v in before.items()},
           store_after={str(k): v for k, v in after.items()},
           journal_records_kept=report["journal_records_kept"])
