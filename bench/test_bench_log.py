"""The C segment log against the hardware floor, side by side in one run.

Groups pair durkv with a baseline; each durkv benchmark records its ratio and
target in ``extra_info`` (``bench/report.py`` tabulates them):

| group          | durkv                       | baseline                        | target  |
|----------------|-----------------------------|---------------------------------|---------|
| sync-1k        | sync append, 1 writer       | C write+fdatasync loop          | >= 0.9x |
| sync-threads   | sync append, 8 threads      | durkv sync, 1 writer            | >= 4x   |
| async-1k       | async append                | C write(2) loop                 | >= 0.6x |
| exit-1k        | exit append                 | durkv async                     | >= 5x   |
| verify         | verify a 1 GiB sealed log   | cat the same files > /dev/null  | >= 0.5x |
| open           | open 1 GiB sealed           | open 64 MiB sealed              | <= 3x   |

Env: DURKV_BENCH_QUICK=1 (short smoke run), DURKV_BENCH_VERIFY_MB (default 1024,
quick 64), DURKV_BENCH_DIR (scratch directory on the disk to measure).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time

import benchlib
import pytest
from benchlib import QUICK, record
from durkv.log import SegmentLog, verify

SIZE = 1024
FRAME = SIZE + 24                   # what one frame puts on disk (header + payload)
PAYLOAD = bytes(range(256)) * (SIZE // 256)
N_SYNC = 40 if QUICK else 300
N_FAST = 2000 if QUICK else 20000
ROUNDS = 2 if QUICK else 5
THREADS = 8
VERIFY_MB = int(os.environ.get("DURKV_BENCH_VERIFY_MB", "64" if QUICK else "1024"))


def _paired(benchmark, fn, baseline_fn, *, rounds=ROUNDS, warmup=1):
    """Benchmark ``fn`` with ``baseline_fn`` timed in each round's setup, so the two
    alternate round by round and share whatever else the machine is doing.
    Returns (median seconds of fn, median seconds of baseline_fn)."""
    base: list[float] = []

    def setup():
        t0 = time.perf_counter()
        baseline_fn()
        base.append(time.perf_counter() - t0)

    benchmark.pedantic(fn, setup=setup, rounds=rounds, iterations=1, warmup_rounds=warmup)
    t = benchlib.bench_median(benchmark)
    b = statistics.median(base[-rounds:])
    benchmark.extra_info["baseline_median_s"] = b
    return t, b


@pytest.fixture
def log_factory(bench_root):
    opened = []

    def make(name, durability, **kw):
        log = SegmentLog.open(str(bench_root / name), durability=durability, **kw)
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()


def _appends(log, n):
    def run():
        append = log.append
        for _ in range(n):
            append(PAYLOAD)
    return run


# ---- sync -------------------------------------------------------------------------------


@pytest.mark.benchmark(group="sync-1k")
def test_raw_fsync_loop(benchmark, baseline, bench_root):
    path = str(bench_root / "raw-fsync").encode()
    benchmark.extra_info["ops_per_round"] = N_SYNC
    benchmark.pedantic(baseline.raw_fsync_loop, args=(path, N_SYNC, FRAME),
                       rounds=ROUNDS, iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group="sync-1k")
def test_sync_append(benchmark, baseline, bench_root, log_factory):
    log = log_factory("sync-1", "sync")
    benchmark.extra_info["ops_per_round"] = N_SYNC
    raw_path = str(bench_root / "raw-fsync").encode()
    t, raw = _paired(benchmark, _appends(log, N_SYNC),
                     lambda: baseline.raw_fsync_loop(raw_path, N_SYNC, FRAME))
    ratio = raw / t
    record(benchmark, "sync 1 KiB, 1 writer vs write+fdatasync", ratio=ratio,
           target=">= 0.9x raw", ok=ratio >= 0.9, commits_per_s=round(N_SYNC / t))


@pytest.mark.benchmark(group="sync-threads")
def test_sync_append_8_threads(benchmark, log_factory):
    log = log_factory("sync-8", "sync")

    def run():
        ts = [threading.Thread(target=_appends(log, N_SYNC)) for _ in range(THREADS)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()

    benchmark.extra_info["ops_per_round"] = N_SYNC * THREADS
    single_log = log_factory("sync-1b", "sync")
    t8, t1 = _paired(benchmark, run, _appends(single_log, N_SYNC))
    ratio = (N_SYNC * THREADS / t8) / (N_SYNC / t1)
    record(benchmark, "sync 1 KiB, 8 threads vs 1 writer", ratio=ratio,
           target=">= 4x single writer", ok=ratio >= 4,
           commits_per_s=round(N_SYNC * THREADS / t8))


# ---- async / exit --------------------------------------------------------------------------


@pytest.mark.benchmark(group="async-1k")
def test_raw_write_loop(benchmark, baseline, bench_root):
    path = str(bench_root / "raw-write").encode()
    benchmark.extra_info["ops_per_round"] = N_FAST
    benchmark.pedantic(baseline.raw_write_loop, args=(path, N_FAST, FRAME),
                       rounds=ROUNDS, iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group="async-1k")
def test_async_append(benchmark, baseline, bench_root, log_factory):
    log = log_factory("async", "async")
    benchmark.extra_info["ops_per_round"] = N_FAST
    raw_path = str(bench_root / "raw-write").encode()
    t, raw = _paired(benchmark, _appends(log, N_FAST),
                     lambda: baseline.raw_write_loop(raw_path, N_FAST, FRAME))
    ratio = raw / t
    record(benchmark, "async 1 KiB vs write(2) loop", ratio=ratio, target=">= 0.6x raw",
           ok=ratio >= 0.6, commits_per_s=round(N_FAST / t))


@pytest.mark.benchmark(group="exit-1k")
def test_exit_append(benchmark, log_factory):
    log = log_factory("exit", "exit")
    benchmark.extra_info["ops_per_round"] = N_FAST
    async_appends = _appends(log_factory("async-b", "async"), N_FAST)

    def async_then_flush():          # the exit log starts each round with nothing buffered
        log.flush()
        async_appends()

    t, t_async = _paired(benchmark, _appends(log, N_FAST), async_then_flush)
    ratio = t_async / t
    record(benchmark, "exit 1 KiB vs async", ratio=ratio, target=">= 5x async", ok=ratio >= 5,
           commits_per_s=round(N_FAST / t))


# ---- verify / open of big sealed logs ---------------------------------------------------------


def _build_sealed(path, mb, segment_bytes):
    chunk = bytes(range(256)) * 16          # 4 KiB frames
    n = mb * 256
    with SegmentLog.open(str(path), durability="exit", segment_bytes=segment_bytes) as log:
        for i in range(0, n, 256):
            log.append_many([chunk] * min(256, n - i))
        log.seal()
        log.flush()
    return sorted(str(p) for p in path.glob("*.seg"))


@pytest.fixture(scope="module")
def big_log(bench_root):
    seg = (64 << 20) if VERIFY_MB >= 1024 else max(1 << 20, (VERIFY_MB << 20) // 16)
    path = bench_root / "big"
    files = _build_sealed(path, VERIFY_MB, seg)
    small = bench_root / "small"
    _build_sealed(small, max(1, seg >> 20), seg)     # one sealed segment
    yield path, files, small
    # bench_root is removed at session end


@pytest.mark.benchmark(group="verify")
def test_cat_baseline(benchmark, big_log):
    _, files, _ = big_log
    cat = ["cat", *files]
    subprocess.run(cat, stdout=subprocess.DEVNULL, check=True)     # warm the page cache
    benchmark.extra_info["mb"] = VERIFY_MB
    benchmark.pedantic(subprocess.run, args=(cat,), kwargs={"stdout": subprocess.DEVNULL,
                       "check": True}, rounds=3, iterations=1)


@pytest.mark.benchmark(group="verify")
def test_verify_sealed(benchmark, big_log):
    path, files, _ = big_log
    cat = ["cat", *files]
    subprocess.run(cat, stdout=subprocess.DEVNULL, check=True)
    benchmark.extra_info["mb"] = VERIFY_MB
    assert verify(str(path)).ok
    t, t_cat = _paired(benchmark, lambda: verify(str(path)),
                       lambda: subprocess.run(cat, stdout=subprocess.DEVNULL, check=True),
                       rounds=3, warmup=0)
    ratio = t_cat / t
    record(benchmark, f"verify {VERIFY_MB} MiB sealed vs cat", ratio=ratio,
           target=">= 0.5x cat", ok=ratio >= 0.5, gib_per_s=round(VERIFY_MB / 1024 / t, 2))


class _Opener:
    """Times SegmentLog.open alone: the handle is closed in the next round's setup."""

    def __init__(self, path):
        self.path, self.held = str(path), []

    def __call__(self):
        self.held.append(SegmentLog.open(self.path, durability="sync"))

    def release(self):
        while self.held:
            self.held.pop().close()


@pytest.mark.benchmark(group="open")
def test_open_small_sealed(benchmark, big_log):
    _, _, small = big_log
    op = _Opener(small)
    benchmark.pedantic(op, setup=op.release, rounds=15, iterations=1, warmup_rounds=1)
    op.release()


@pytest.mark.benchmark(group="open")
def test_open_big_sealed(benchmark, big_log):
    path, files, small = big_log
    benchmark.extra_info["segments"] = len(files)
    big, base = _Opener(path), []

    def setup():
        big.release()
        t0 = time.perf_counter()
        h = SegmentLog.open(str(small), durability="sync")
        base.append(time.perf_counter() - t0)
        h.close()

    benchmark.pedantic(big, setup=setup, rounds=15, iterations=1, warmup_rounds=1)
    big.release()
    t, t_small = benchlib.bench_median(benchmark), statistics.median(base[-15:])
    benchmark.extra_info["baseline_median_s"] = t_small
    ratio = t / t_small
    record(benchmark, f"open {VERIFY_MB} MiB sealed vs one segment", ratio=ratio,
           target="<= 3x", ok=ratio <= 3, ms=round(t * 1000, 3))
