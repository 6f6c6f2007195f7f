"""Closing a log while other threads are in calls on it.

``SegmentLog.close`` on one thread while others append, read, wait and hold write
sections: close returns; every call on another thread either completes or raises
StoreClosedError; every append that returned its LSN is in the log when it is opened
again; no frame is written after close returned. On bbc3549 close destroyed the mutex
and condition variables under the waiting threads: a close hung in
``pthread_cond_destroy`` within a few trials under ``sync`` and ``exit``, and a thread that
woke after the free read freed memory.
"""

from __future__ import annotations

import gc
import os
import random
import threading
import time

import pytest

from durkv import log as dlog
from durkv.errors import StoreClosedError
from durkv.log import SegmentLog, verify

TRIALS = 25
CLOSE_WITHIN_S = 10.0


def _worker(log, k: int, acked: list, errors: list, rng: random.Random) -> None:
    """Mixed calls until the log is closed under it: each acknowledged frame is noted."""
    i = 0
    try:
        while True:
            payload = b"t%d-%d" % (k, i)
            kind = (k + i) % 5
            if kind == 0:
                log.write_begin()
                try:
                    lsn = log.append(payload, durability="exit")
                finally:
                    log.write_end_async()
                acked.append((lsn, payload))
            elif kind == 1:
                acked.append((log.append(payload), payload))
            elif kind == 2:
                lsn = log.append_one(payload, log.next_lsn)
                if lsn >= 0:
                    acked.append((lsn, payload))
            elif kind == 3 and acked:
                lsn, want = acked[rng.randrange(len(acked))]
                assert log.read(lsn) == want
            elif log.next_lsn:
                log.wait_durable(log.next_lsn - 1)
            i += 1
    except StoreClosedError:
        pass
    except BaseException as e:  # noqa: BLE001 - surfaced by the test
        errors.append(e)


def _busy(log) -> tuple[list, list, list]:
    """Three threads of mixed calls on ``log`` (_worker), started: (threads, acked, errors)."""
    acked: list[list] = [[] for _ in range(3)]
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_worker, args=(log, k, acked[k], errors,
                                                      random.Random(k)), daemon=True)
               for k in range(3)]
    for t in threads:
        t.start()
    return threads, acked, errors


def _check_closed(path, busy: tuple[list, list, list], trial: int) -> None:
    """Every thread left its call; none failed but by StoreClosedError; every frame
    acknowledged reads back."""
    threads, acked, errors = busy
    for t in threads:
        t.join(CLOSE_WITHIN_S)
        assert not t.is_alive(), f"a thread is stuck in a call after close (trial {trial})"
    assert not errors, errors
    with SegmentLog.open(path, read_only=True) as r:
        frames = dict(r.scan())
    for lsn, payload in (x for a in acked for x in a):
        assert frames.get(lsn) == payload, (trial, lsn)


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_close_under_busy_threads_returns_and_keeps_every_acknowledged_frame(
        tmp_path, durability):
    rng = random.Random(durability)
    for trial in range(TRIALS):
        path = tmp_path / f"l{trial}"
        log = SegmentLog.open(path, durability=durability, segment_bytes=64 << 10)
        busy = _busy(log)
        time.sleep(rng.uniform(0.001, 0.03))
        closer = threading.Thread(target=log.close, daemon=True)
        closer.start()
        closer.join(CLOSE_WITHIN_S)
        assert not closer.is_alive(), f"close hung (trial {trial})"
        _check_closed(path, busy, trial)
        assert verify(path).ok


def test_a_closed_log_refuses_every_call_and_a_second_close_is_a_no_op(tmp_path):
    log = SegmentLog.open(tmp_path / "l", durability="sync")
    lsn = log.append(b"x")
    log.close()
    log.close()
    for call in (lambda: log.append(b"y"), lambda: log.read(lsn), log.write_begin,
                 lambda: log.append_one(b"y", 1), log.flush, lambda: log.wait_durable(lsn)):
        with pytest.raises(StoreClosedError):
            call()


def test_a_section_holder_sees_the_close_and_other_waiters_leave(tmp_path):
    """One thread holds a write section; others wait for it. close() flushes the holder's
    frames, the waiters return StoreClosedError at once, and so does the holder's next
    call -- nobody waits for a section that will never end."""
    log = SegmentLog.open(tmp_path / "l", durability="sync")
    log.write_begin()
    first = log.append(b"held", durability="exit")
    outcome: list = []

    def waiter():
        try:
            log.append(b"waits")
            outcome.append("appended")
        except StoreClosedError:
            outcome.append("closed")
    waiters = [threading.Thread(target=waiter, daemon=True) for _ in range(3)]
    for t in waiters:
        t.start()
    time.sleep(0.05)
    closer = threading.Thread(target=log.close, daemon=True)
    closer.start()
    closer.join(CLOSE_WITHIN_S)
    assert not closer.is_alive()
    for t in waiters:
        t.join(CLOSE_WITHIN_S)
        assert not t.is_alive()
    assert outcome == ["closed"] * 3
    with pytest.raises(StoreClosedError):
        log.append(b"after")
    with pytest.raises(StoreClosedError):
        log.write_end()
    with SegmentLog.open(tmp_path / "l", read_only=True) as r:
        assert [p for _, p in r.scan()] == [b"held"] and first == 0


def test_close_while_threads_wait_for_another_writers_lock(tmp_path):
    """A second handle on the log (another process, as far as the write lock goes) holds
    its write section for milliseconds at a time; the closed handle's threads wait for the
    lock in a poll that sees the close, not for the lock's timeout."""
    path = tmp_path / "l"
    rival = SegmentLog.open(path, durability="async", lock_timeout_ms=60_000)
    stop = threading.Event()

    def hold():
        while not stop.is_set():
            rival.write_begin()
            rival.append(b"rival", durability="exit")
            time.sleep(0.005)
            rival.write_end_async()
            time.sleep(0.001)
    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        for trial in range(8):
            log = SegmentLog.open(path, durability="sync", lock_timeout_ms=60_000)
            busy = _busy(log)
            time.sleep(0.05)
            t0 = time.monotonic()
            log.close()
            assert time.monotonic() - t0 < CLOSE_WITHIN_S
            _check_closed(path, busy, trial)
    finally:
        stop.set()
        holder.join()
        rival.close()
    assert verify(path).ok


def test_a_batch_under_way_when_close_starts_is_appended_whole(tmp_path):
    """An append_many that must roll the segment between its frames, its roll waiting for
    the flusher's slow fdatasync, when close() starts: close waits for the whole batch and
    flushes it; the call returns its LSNs. (Before: the roll refused on the close, the
    call raised StoreClosedError, and close's flush kept the frame already queued.)"""
    payload = b"x" * 1000
    seg = 64 << 10
    path = tmp_path / "l"
    with SegmentLog.open(tmp_path / "probe", durability="async", segment_bytes=seg) as probe:
        fit = 0
        while len(probe.segments()) == 1:
            probe.append(payload)
            fit += 1
    log = SegmentLog.open(path, durability="async", segment_bytes=seg, flush_interval_ms=20)
    log.append_many([payload] * (fit - 2))      # room for exactly one more frame
    log.flush()
    out: dict = {}

    def batch():
        try:
            out["lsns"] = log.append_many([b"batch-%d" % i + payload for i in range(3)])
        except StoreClosedError as e:
            out["error"] = e
    try:
        dlog.fault_inject("fdatasync", 1, pause_ms=600)     # the flusher's next one
        log.append(payload)
        time.sleep(0.1)                 # the flusher is in its fdatasync
        t = threading.Thread(target=batch, daemon=True)
        t.start()
        time.sleep(0.1)                 # the batch's first frame is queued, its roll waits
        log.close()
        t.join(CLOSE_WITHIN_S)
    finally:
        dlog.fault_inject(None)
    with SegmentLog.open(path, read_only=True) as r:
        got = {lsn: p[:7] for lsn, p in r.scan() if p.startswith(b"batch")}
    assert "error" not in out, out
    assert got == {lsn: b"batch-%d" % i for i, lsn in enumerate(out["lsns"])}


def test_an_append_waiting_for_its_fsync_when_close_starts_is_acknowledged(tmp_path):
    """Sync appends queued behind a slow fdatasync when close() starts: close's flush makes
    each one durable, and each returns its LSN -- an append raises StoreClosedError only
    when nothing of it is in the log. (Before: some raised although they were durable.)"""
    path = tmp_path / "l"
    log = SegmentLog.open(path, durability="sync")
    log.append(b"warm")
    out: dict = {}

    def append(i):
        try:
            out[i] = log.append(b"inflight-%d" % i)
        except StoreClosedError:
            out[i] = None
    threads = []
    try:
        dlog.fault_inject("fdatasync", 1, pause_ms=400)
        for i in range(4):
            threads.append(threading.Thread(target=append, args=(i,), daemon=True))
            threads[-1].start()
            time.sleep(0.02)
        time.sleep(0.1)
        log.close()
        for t in threads:
            t.join(CLOSE_WITHIN_S)
    finally:
        dlog.fault_inject(None)
    with SegmentLog.open(path, read_only=True) as r:
        frames = {p: lsn for lsn, p in r.scan()}
    for i in range(4):
        assert out[i] == frames.get(b"inflight-%d" % i), (i, out)
    assert all(out[i] is not None for i in range(4))   # queued before close: all flushed


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def test_a_closed_log_still_referenced_holds_no_index_and_no_descriptor(tmp_path):
    """close() releases the frame indexes (8 bytes a frame) and the descriptors at once,
    not when the object is collected: a closed log some code still references costs
    almost nothing. (Before this test: 32 MiB a closed handle of 4 million frames.)"""
    path = tmp_path / "l"
    n = 2_000_000
    with SegmentLog.open(path, durability="exit", segment_bytes=256 << 20) as log:
        log.append_many([b""] * n)
    fds = len(os.listdir("/proc/self/fd"))
    closed = []
    for _ in range(3):
        log = SegmentLog.open(path, durability="exit")
        assert log.read(n - 1) == b""       # loads the segment's index
        log.close()
        closed.append(log)
    assert len(os.listdir("/proc/self/fd")) == fds
    referenced = _rss_mib()
    del closed, log
    gc.collect()
    held = referenced - _rss_mib()
    assert held < 4, f"3 closed handles of {n:,} frames held {held:.0f} MiB until collected"


def test_a_second_close_returns_only_after_the_first_close_has_flushed(tmp_path):
    """Two threads close one `exit` log: the first flushes (its fdatasync held 400 ms),
    the second must not return before that flush is durable -- a caller that exits
    after its close() returns would otherwise lose the frames. (Before: the second
    close returned at once, with the fdatasync still paused.)"""
    log = SegmentLog.open(tmp_path / "l", durability="exit")
    for i in range(10):
        log.append(b"frame-%d" % i)
    assert log.durable_lsn == 0             # `exit`: nothing synced before close
    before = dlog.fdatasync_count()
    seen: dict = {}
    try:
        dlog.fault_inject("fdatasync", 1, pause_ms=400)
        first = threading.Thread(target=log.close, daemon=True)
        first.start()
        time.sleep(0.1)                     # the first close is in its paused fdatasync
        log.close()
        seen["syncs"] = dlog.fdatasync_count() - before
        first.join(CLOSE_WITHIN_S)
    finally:
        dlog.fault_inject(None)
    assert seen["syncs"] >= 1, "the second close returned before the first one's flush"
    with SegmentLog.open(tmp_path / "l", read_only=True) as r:
        assert [p for _, p in r.scan()] == [b"frame-%d" % i for i in range(10)]


def test_an_exit_waits_for_a_close_under_way_on_another_thread(tmp_path):
    """A daemon thread closes an `exit` log, its flush's fdatasync held 1.5 s, while the
    main thread returns: the interpreter's exit waits for that close (the process ends
    after the fdatasync), and every frame is in the log. (Before: the exit skipped a log
    already being closed and the process ended ~0.1 s in, its frames never synced.)"""
    import subprocess
    import sys
    import textwrap

    path = tmp_path / "l"
    child = textwrap.dedent(f"""
        import threading, time
        from durkv import log as dlog
        log = dlog.SegmentLog.open({str(path)!r}, durability="exit")
        for i in range(10):
            log.append(b"frame-%d" % i)
        dlog.fault_inject("fdatasync", 1, pause_ms=1500)
        print("START", flush=True)
        threading.Thread(target=log.close, daemon=True).start()
        time.sleep(0.1)
        """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "START"
        started = time.monotonic()
        assert proc.stdout.read() == ""             # EOF: the process has ended
        ran = time.monotonic() - started
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert ran >= 1.2, f"the process ended {ran:.2f} s in, inside the close's fdatasync"
    with SegmentLog.open(path, read_only=True) as r:
        assert [p for _, p in r.scan()] == [b"frame-%d" % i for i in range(10)]
