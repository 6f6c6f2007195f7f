"""Helpers for the benchmark suites: the C baseline and ratio records.

Every benchmark that has a target stores ``{"target", "ratio", "ok"}`` in
``benchmark.extra_info`` (see :func:`record`), which ``bench/report.py`` turns
into the table of ratios vs targets.
"""

from __future__ import annotations

import os
import statistics
import time
from types import SimpleNamespace

from durkv.log import raw_write_loop

QUICK = os.environ.get("DURKV_BENCH_QUICK") == "1"

RESULTS: list[dict] = []          # printed by conftest's terminal summary


def baseline() -> SimpleNamespace:
    """The C floor, the same loop ``durkv bench`` times (csrc/rawio.c, through
    :func:`durkv.log.raw_write_loop`): ``raw_fsync_loop(path, n, size)`` is n x
    (write + fdatasync), the floor under a sync commit; ``raw_write_loop(path, n, size)``
    is n x write, the floor under an async one. Both raise OSError on a failed call."""
    return SimpleNamespace(
        raw_fsync_loop=lambda path, n, size: raw_write_loop(path, n, size, sync=True),
        raw_write_loop=lambda path, n, size: raw_write_loop(path, n, size, sync=False))


def median_time(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_median(benchmark) -> float:
    return benchmark.stats.stats.median


def record(benchmark, name: str, *, ratio: float, target: str, ok: bool, **extra) -> None:
    """Store the ratio vs target in the benchmark's extra_info and for the summary."""
    info = {"target": target, "ratio": round(ratio, 3), "ok": bool(ok), **extra}
    benchmark.extra_info.update(info)
    RESULTS.append({"name": name, **info})
    print(f"\n{name}: ratio {ratio:.3f} (target {target}) -> {'ok' if ok else 'MISSED'}")


def frame_bytes(path) -> int:
    """The store's segment bytes without the active segment's zero slack (FORMAT.md
    section 3): space written ahead of the appends, between 0 and 1/8 of the data, a
    sawtooth that moves the file sizes of two stores by up to 12% apart from what they
    hold. Sealed segments count whole; the active one up to its first all-zero header."""
    segs = sorted(path.glob("*.seg"))
    total = sum(f.stat().st_size for f in segs[:-1])
    data = segs[-1].read_bytes()
    off = 64
    while off + 24 <= len(data) and any(data[off:off + 24]):
        off += 24 + int.from_bytes(data[off + 4:off + 8], "little")
    return total + off
