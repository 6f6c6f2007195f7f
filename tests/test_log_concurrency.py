"""Many threads appending to one log: group commit hands out unique, gap-free LSNs."""

from __future__ import annotations

import os
import threading
import time

import logtools as lt
import pytest
from durkv.log import SegmentLog, fault_inject, fdatasync_count, verify

SLOW = os.environ.get("DURKV_SLOW_TESTS") == "1"


def _hammer(log, n_threads, per_thread, size, *, mixed=False, many=False):
    results: list[list[tuple[int, bytes]]] = [[] for _ in range(n_threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(n_threads)

    def worker(t):
        try:
            start.wait()
            for i in range(per_thread):
                p = lt.payload(t * 1_000_000 + i, size + (i * 7 + t) % 64, tag=f"t{t}-")
                if many and i % 5 == 0:
                    batch = [p, p + b"+1", p + b"+2"]
                    lsns = log.append_many(batch)
                    assert lsns == list(range(lsns[0], lsns[0] + 3)), lsns
                    results[t].extend(zip(lsns, batch, strict=True))
                    continue
                dur = None
                if mixed:
                    dur = ("sync", "async", "exit", None)[(t + i) % 4]
                lsn = log.append(p, durability=dur)
                results[t].append((lsn, p))
        except BaseException as e:  # noqa: BLE001 - surfaced by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    allr = [x for r in results for x in r]
    for r in results:                 # each thread sees its own appends in order
        lsns = [lsn for lsn, _ in r]
        assert lsns == sorted(lsns)
    return allr


def _check(log, allr):
    lsns = sorted(lsn for lsn, _ in allr)
    assert len(set(lsns)) == len(lsns), "duplicate LSN handed out"
    assert lsns == list(range(len(lsns))), "LSNs are not gap-free"
    assert log.next_lsn == len(lsns)
    for lsn, p in allr:
        assert log.read(lsn) == p, f"lsn {lsn}"


@pytest.mark.parametrize("segment_bytes", [64 << 20, 16 << 10])
def test_eight_threads_sync(log_dir, segment_bytes):
    per = 2000 if SLOW else 150
    with SegmentLog.open(str(log_dir), durability="sync", segment_bytes=segment_bytes) as log:
        allr = _hammer(log, 8, per, 100)
        assert log.durable_lsn == log.next_lsn, "sync append returned before durable"
        _check(log, allr)
    with SegmentLog.open(str(log_dir), read_only=True) as log:
        _check(log, allr)
        assert dict(log.scan()) == dict(allr)
    assert verify(str(log_dir)).ok


def test_threads_mixed_durability_and_batches(log_dir):
    per = 1000 if SLOW else 100
    with SegmentLog.open(str(log_dir), durability="async", segment_bytes=32 << 10) as log:
        allr = _hammer(log, 8, per, 60, mixed=True, many=True)
        log.flush()
        assert log.durable_lsn == log.next_lsn
        _check(log, allr)
    with SegmentLog.open(str(log_dir), read_only=True) as log:
        _check(log, allr)
    assert verify(str(log_dir)).ok


def test_reader_refresh_while_writing(log_dir):
    with SegmentLog.open(str(log_dir), durability="async", segment_bytes=16 << 10) as log:
        log.append(b"seed")
        stop = threading.Event()
        seen: list[int] = []
        errors: list[BaseException] = []

        def reader():
            try:
                with SegmentLog.open(str(log_dir), read_only=True) as r:
                    while not stop.is_set():
                        r.refresh()
                        n = r.next_lsn
                        got = [lsn for lsn, _ in r.scan()]
                        assert got[:n] == list(range(n)), "reader saw a gap"
                        seen.append(n)
            except BaseException as e:  # noqa: BLE001 - surfaced by the main thread
                errors.append(e)

        th = threading.Thread(target=reader)
        th.start()
        for i in range(400):
            log.append(lt.payload(i, 120))
            if i % 50 == 0:
                log.flush()
        log.flush()
        stop.set()
        th.join()
        assert not errors, errors
        assert seen == sorted(seen)


def test_sync_waiters_share_fsyncs_and_all_return(log_dir):
    """wait_durable from many threads on one async log returns for everyone."""
    with SegmentLog.open(str(log_dir), durability="async", flush_interval_ms=2) as log:
        lsns = [log.append(lt.payload(i)) for i in range(50)]
        errs: list[BaseException] = []

        def w(lsn):
            try:
                log.wait_durable(lsn)
                assert log.durable_lsn > lsn
            except BaseException as e:  # noqa: BLE001 - surfaced by the main thread
                errs.append(e)

        ts = [threading.Thread(target=w, args=(lsn,)) for lsn in lsns[::5]]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errs, errs


def test_a_section_writes_its_frames_while_another_threads_fdatasync_runs(log_dir):
    """A thread's `sync` append leads an fdatasync, paused here (a slow disk). Another
    thread, inside a write section (as the store appends a keyed tool's intent, holding
    its lock), appends `async`: its frame is written while that fdatasync runs, and the
    append returns before it -- the disk holds up only the thread that waits for it.
    (It waited for the fsync: eight threads' tool calls ran at one thread's rate.)"""
    # the flusher kept out (a minute): every fdatasync here is a's, so the durable
    # position is exact -- the power-loss witness that a's fsync claims no frame written
    # after it began
    with SegmentLog.open(str(log_dir), durability="sync", flush_interval_ms=60000) as log:
        log.append(b"before")
        seg = os.path.join(str(log_dir), "0000000000000000.seg")
        size = os.path.getsize(seg)
        fault_inject("fdatasync", 1, pause_ms=1500)
        try:
            a = threading.Thread(target=log.append, args=(b"a" * 100,))
            a.start()
            deadline = time.monotonic() + 10
            while os.path.getsize(seg) == size and time.monotonic() < deadline:
                time.sleep(0.005)           # a's frame is written; its fsync comes next
            time.sleep(0.2)                 # ... and is paused now
            syncs = fdatasync_count()
            log.write_begin()
            lsn = log.append(b"b", durability="async")
            log.write_end()
            assert fdatasync_count() == syncs, "the async append waited for a's fdatasync"
            assert a.is_alive()
            assert log.durable_lsn == lsn - 1   # a's frame is written, not yet durable
            a.join()
        finally:
            fault_inject(None)
        assert log.read(lsn) == b"b" and log.read(lsn - 1) == b"a" * 100
        # a's fsync covers a's frame, not b's, written while it ran
        assert log.durable_lsn == lsn
    assert verify(str(log_dir)).ok
