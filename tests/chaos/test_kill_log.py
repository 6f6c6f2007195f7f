"""kill -9 the writer at random moments; each durability policy keeps its promise.

A child (``writer_child.py``) appends and prints each acknowledged LSN with the
payload's digest. The parent SIGKILLs it after a random 5-60 ms (sometimes
during start-up, i.e. during open-time recovery), then checks:

- ``verify`` finds nothing worse than a torn tail;
- ``open(recovery="tolerate_tail")`` succeeds, the log is a gap-free LSN range;
- every acknowledged LSN (sync, async) / every LSN up to the last ``FLUSHED``
  (exit) reads back with the right bytes;
- a frame seen after one crash never changes or disappears after a later one;
- ``recover`` then ``verify`` is clean.

Bounded by default; ``DURKV_SLOW_TESTS=1`` runs ten times more kills.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import logtools as lt
import pytest
from chaos.harness import kill_and_collect, read_until
from durkv.log import SegmentLog, recover, verify

CHILD = Path(__file__).with_name("writer_child.py")
SLOW = os.environ.get("DURKV_SLOW_TESTS") == "1"
LOG_EVERY = 100                      # kills per log directory
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(3600 if SLOW else 300)]


def _spawn(d, policy, run, threads, compact_every=0):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(d), policy, str(run), "--threads", str(threads),
         "--segment-bytes", str(16 << 10), "--flush-every", "7",
         "--compact-every", str(compact_every)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def _one_kill(d, policy, run, rnd, threads, compact_every=0):
    """Spawn, kill, return (acked {lsn: digest}, last flushed lsn or -1)."""
    proc = _spawn(d, policy, run, threads, compact_every)
    buf = bytearray()
    try:
        if rnd.random() < 0.1:
            time.sleep(rnd.uniform(0.0, 0.15))       # may land in import / open recovery
        elif not read_until(proc.stdout.fileno(), buf, b"\n", time.monotonic() + 20):
            proc.kill()
            proc.wait()
            pytest.fail(f"child never became ready: {proc.stderr.read().decode()[-2000:]}")
        else:
            time.sleep(rnd.uniform(0.005, 0.060))
    finally:
        lines, _err = kill_and_collect(proc, buf)
    acked, flushed = {}, -1
    for line in lines:
        a, b = line.split(" ")
        if a == "FLUSHED":
            flushed = max(flushed, int(b))
        elif a.isdigit():
            acked[int(a)] = b
    return acked, flushed


def _chaos(tmp_path, policy, kills, threads=1, seed=1, compact_every=0):
    rnd = random.Random(seed)
    total_acked = 0
    for run in range(kills):
        if run % LOG_EVERY == 0:     # a fresh log now and then keeps each check O(1)
            d = tmp_path / f"log{run // LOG_EVERY}"
            must: dict[int, str] = {}    # lsn -> digest that must be there from now on
            start = 0                    # the log's start_lsn (prefix removal moves it up)
        acked, flushed = _one_kill(d, policy, run, rnd, threads, compact_every)
        total_acked += len(acked)
        if not d.exists():
            continue                 # killed before the log was created
        rep = verify(str(d))
        bad = [x for x in rep.damage if x.kind != "torn_tail"]
        assert not bad, f"run {run}: a kill left more than a torn tail: {rep.to_dict()}"
        if run % 2:
            r = recover(str(d))
            assert all(x.kind == "torn_tail" for x in r.damage), r.to_dict()
            v = verify(str(d))
            assert v.ok and not list(v.damage), v.to_dict()
        with SegmentLog.open(str(d), durability="sync", recovery="tolerate_tail") as log:
            n = log.next_lsn
            assert log.start_lsn >= start, f"run {run}: start_lsn went back"
            start = log.start_lsn
            got = {lsn: lt.digest(p) for lsn, p in log.scan()}
        assert sorted(got) == list(range(start, n)), f"run {run}: LSNs not gap-free"
        if policy in ("sync", "async"):
            for lsn, dg in acked.items():
                assert lsn < n, f"run {run}: acknowledged lsn {lsn} lost ({policy}), next={n}"
                if lsn >= start:
                    assert got[lsn] == dg, f"run {run}: lsn {lsn} has the wrong bytes"
        else:
            assert flushed < n, f"run {run}: flushed lsn {flushed} lost, next={n}"
            for lsn, dg in acked.items():
                if start <= lsn < n:
                    assert got[lsn] == dg, f"run {run}: lsn {lsn} has the wrong bytes"
        for lsn, dg in must.items():
            if lsn >= start:
                assert got.get(lsn) == dg, f"run {run}: lsn {lsn} changed or vanished"
        # what is on disk now survives any later process kill (the page cache does)
        must = got
        r = recover(str(d))
        assert list(r.damage) == [], r.to_dict()     # open already repaired the tail
        v = verify(str(d))
        assert v.ok and v.next_lsn == n, v.to_dict()
    assert total_acked > kills, "the child hardly appended anything: kills too early?"
    return start


def test_kill_sync(tmp_path):
    _chaos(tmp_path, "sync", 1000 if SLOW else 100)


def test_kill_sync_threads(tmp_path):
    _chaos(tmp_path, "sync", 200 if SLOW else 20, threads=4, seed=2)


def test_kill_async(tmp_path):
    _chaos(tmp_path, "async", 300 if SLOW else 30, seed=3)


def test_kill_exit(tmp_path):
    _chaos(tmp_path, "exit", 300 if SLOW else 30, seed=4)


def test_kill_sync_compacting(tmp_path):
    """Kills land inside seal(new_start_lsn=...): roll, then unlink the dead prefix."""
    start = _chaos(tmp_path, "sync", 300 if SLOW else 30, seed=5, compact_every=10)
    assert start > 0, "no prefix removal ever happened"
