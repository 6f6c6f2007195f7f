"""Helpers for the benchmark suites: the compiled C baseline and ratio records.

Every benchmark that has a target stores ``{"target", "ratio", "ok"}`` in
``benchmark.extra_info`` (see :func:`record`), which ``bench/report.py`` turns
into the table of ratios vs targets.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
QUICK = os.environ.get("DURKV_BENCH_QUICK") == "1"

RESULTS: list[dict] = []          # printed by conftest's terminal summary


def baseline():
    """The C baseline (bench/baseline.c), compiled once with cffi and cached by source hash."""
    src = (HERE / "baseline.c").read_text()
    tag = hashlib.sha256(src.encode()).hexdigest()[:12]
    modname = f"_durkv_baseline_{tag}"
    cache = Path(os.environ.get("DURKV_BENCH_CACHE", Path(tempfile.gettempdir()) / "durkv-bench"))
    cache.mkdir(parents=True, exist_ok=True)
    if str(cache) not in sys.path:
        sys.path.insert(0, str(cache))
    try:
        return importlib.import_module(modname)
    except ImportError:
        pass
    from cffi import FFI

    ffi = FFI()
    ffi.cdef("int raw_fsync_loop(const char *path, int n, int size);\n"
             "int raw_write_loop(const char *path, int n, int size);")
    ffi.set_source(modname, src, extra_compile_args=["-O2"])
    ffi.compile(tmpdir=str(cache), verbose=False)
    importlib.invalidate_caches()
    return importlib.import_module(modname)


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
