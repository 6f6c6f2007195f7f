"""Open from an index snapshot (K_INDEX): the same index as a full replay, fewer reads.

Every scenario compares, structurally, the index a snapshot-based open builds
with the one a full replay of the log builds (and with the live writer's).
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import pytest

import durkv
from durkv.backends.local import LocalBackend
from durkv.backends.memory import MemoryBackend
from durkv.payload import encode_commit
from durkv.errors import ConfigError
from durkv.store.index import dump_index
from durkv.store import K_COMPACT_END, K_INDEX, Store, read_head, pack_head
from storeinternals import append_frame, backend_of, crash_store, index_of

_names = itertools.count()




class Crash(Exception):
    pass



def state(s):
    """Everything replay builds, structurally (materialized heads excluded: they are lazy)."""
    shadow = None if index_of(s).shadow is None else (dump_index(index_of(s).shadow), index_of(s).shadow_begin)
    return dump_index(index_of(s).ix), index_of(s).compacted_at, shadow, index_of(s).scan_pos


@contextmanager
def full_replay(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(Store, "_restore_index", lambda self: None)
        yield


def reader_states(url, monkeypatch):
    """(snapshot-based, full-replay) states of two read-only opens; asserts they are equal."""
    with durkv.open(url, read_only=True) as r:
        snap = state(r)
        used = index_of(r).index_lsn
    with full_replay(monkeypatch), durkv.open(url, read_only=True) as r:
        full = state(r)
    assert snap == full
    return snap, used


def writer_states(url, monkeypatch):
    """The same for writer opens (which drop an unfinished compaction); writes nothing."""
    s = durkv.open(url, index_every=0)
    snap = state(s)
    crash_store(s)
    with full_replay(monkeypatch):
        s = durkv.open(url, index_every=0)
        full = state(s)
        crash_store(s)
    assert snap == full
    return snap


def put(s, t, cid, i, ns="", run="r0", parent=None):
    s.put(t, ns, cid, checkpoint={"i": i}, metadata={"run_id": run, "step": i},
          values={"m": [f"item {j}" for j in range(i + 1)], "n": i},
          versions={"m": i + 1, "n": i + 1}, parent_id=parent)


def workload(s, base=0):
    """puts, orphan writes (before their checkpoint), writes, copies, deletes, prunes."""
    for t in ("a", "b", "c"):
        for i in range(base, base + 6):
            cid = f"{i:04d}"
            if i % 3 == 0:
                s.put_writes(t, "", cid, "early", [(0, "w", i)])      # an orphan, for now
            put(s, t, cid, i, run=f"r{i % 3}")
            s.put_writes(t, "", cid, "task", [(0, "w", i), (1, "x", -i)])
            if i % 2:
                put(s, t, cid, i, ns="sub")
        s.put_writes(t, "", f"{base + 99:04d}", "ghost", [(0, "w", 1)])  # stays an orphan
    s.copy_thread("a", "d")
    s.copy_thread("b", "a")           # merged into an existing thread
    s.delete_thread("c")
    s.delete_runs(["r1"])
    s.prune(["b"], keep_last=2)
    s.put_writes("d", "", f"{base:04d}", "__err", [(0, "__error__", "boom")])


def test_equivalence_across_ops_and_reopens(url, monkeypatch):
    with durkv.open(url, index_every=7) as s:
        workload(s)
        live = state(s)
        assert index_of(s).index_lsn >= 0                     # periodic snapshots were written
    snap, used = reader_states(url, monkeypatch)
    assert snap[0] == live[0]
    assert used >= 0
    for cycle in range(3):
        with durkv.open(url, index_every=5 + cycle) as s:
            assert state(s)[0] == snap[0]
            workload(s, base=10 * (cycle + 1))
            live = state(s)
        snap, used = reader_states(url, monkeypatch)
        assert snap[0] == live[0]
        assert writer_states(url, monkeypatch)[0] == live[0]


def test_equivalence_with_a_tail_after_the_snapshot(url, monkeypatch):
    """A crash leaves frames after the newest snapshot: they are replayed."""
    s = durkv.open(url, index_every=4)
    workload(s)
    put(s, "a", "0500", 500)
    live = state(s)
    crash_store(s)
    snap, used = reader_states(url, monkeypatch)
    assert 0 <= used < snap[3] - 1
    assert snap[0] == live[0]
    assert writer_states(url, monkeypatch)[0] == live[0]


def test_compact_and_crash_mid_compaction(url, monkeypatch):
    with durkv.open(url, index_every=6) as s:
        workload(s)
        s.compact()
        assert index_of(s).index_lsn == backend_of(s).next_lsn - 1     # a snapshot right after END
        live = state(s)
    snap, used = reader_states(url, monkeypatch)
    assert snap[0] == live[0] and snap[1] >= 0
    with durkv.open(url, index_every=6) as s:
        workload(s, base=20)
        s.compact()
        workload(s, base=40)
        live = state(s)
    assert reader_states(url, monkeypatch)[0][0] == live[0]

    # a snapshot, then BEGIN + copies and no END (a crash mid-compaction)
    s = durkv.open(url, index_every=6)
    workload(s, base=60)
    index_of(s).write_snapshot()
    live = state(s)
    real = backend_of(s).append

    def append(payload, durability=None):
        if read_head(payload)[0] == K_COMPACT_END:
            raise Crash
        return real(payload, durability)

    monkeypatch.setattr(backend_of(s), "append", append)
    with pytest.raises(Crash):
        s.compact()
    crash_store(s)
    snap, used = reader_states(url, monkeypatch)
    assert snap[2] is not None            # a reader sees the unfinished compaction
    assert snap[0] == live[0]
    w = writer_states(url, monkeypatch)
    assert w[2] is None and w[0] == live[0]
    with durkv.open(url, index_every=3) as s:    # records after the dead copies
        workload(s, base=80)
        live = state(s)
    assert reader_states(url, monkeypatch)[0][0] == live[0]
    with durkv.open(url) as s:
        s.compact()
        live = state(s)
    assert reader_states(url, monkeypatch)[0][0] == live[0]


def test_crash_after_end_before_prefix_removal(url, monkeypatch):
    s = durkv.open(url, index_every=5)
    workload(s)

    def remove_prefix(lsn):
        raise Crash

    monkeypatch.setattr(backend_of(s), "remove_prefix", remove_prefix)
    with pytest.raises(Crash):
        s.compact()
    crash_store(s)
    snap, _ = reader_states(url, monkeypatch)
    assert snap[1] > 0
    w = writer_states(url, monkeypatch)
    assert w[0] == snap[0]


def count_reads(monkeypatch, cls):
    n = {"read": 0, "scan": 0}
    real_read, real_scan = cls.read, cls.scan

    def read(self, lsn):
        n["read"] += 1
        return real_read(self, lsn)

    def scan(self, from_lsn=0):
        for x in real_scan(self, from_lsn):
            n["scan"] += 1
            yield x

    monkeypatch.setattr(cls, "read", read)
    monkeypatch.setattr(cls, "scan", scan)
    return n


def test_open_reads_only_the_frames_after_the_snapshot(url, monkeypatch):
    with durkv.open(url, durability="exit", index_every=10 ** 6) as s:   # at close only
        for i in range(300):
            put(s, "t", f"{i:05d}", i % 5)
    s = durkv.open(url, durability="exit", index_every=0)    # opens from the close snapshot
    assert index_of(s).index_lsn == backend_of(s).next_lsn - 1
    for i in range(300, 310):
        put(s, "t", f"{i:05d}", i % 5)
    live = state(s)
    crash_store(s)
    n = count_reads(monkeypatch, MemoryBackend if url.startswith("memory") else LocalBackend)
    with durkv.open(url, read_only=True) as r:
        assert (n["read"], n["scan"]) == (11, 10)     # probe: the tail and the snapshot
        assert state(r)[:3] == live[:3]
        assert r.get("t").checkpoint_id == "00309"
    n["read"] = n["scan"] = 0
    with full_replay(monkeypatch), durkv.open(url, read_only=True) as r:
        assert state(r)[:3] == live[:3]
    assert n["scan"] == 311


def test_no_snapshot_is_a_full_replay(url, monkeypatch):
    with durkv.open(url, index_every=0) as s:
        workload(s)
        live = state(s)
        end = backend_of(s).next_lsn
    with durkv.open(url, read_only=True) as r:
        assert index_of(r).index_lsn == backend_of(r).start_lsn - 1
        assert backend_of(r).next_lsn == end                  # index_every=0 wrote nothing
        assert state(r)[:3] == live[:3]


def test_close_writes_a_snapshot_only_after_commits(url):
    with durkv.open(url) as s:
        put(s, "t", "0001", 1)
    with durkv.open(url) as s:
        end = backend_of(s).next_lsn
        assert index_of(s).index_lsn == end - 1
    with durkv.open(url) as s:
        assert backend_of(s).next_lsn == end                  # nothing committed: no new snapshot
        assert read_head(backend_of(s).read(end - 1))[0] == K_INDEX


def _u64(*lsns):
    return b"".join(n.to_bytes(8, "little") for n in lsns)


def _bad_snapshots(s):
    """Append K_INDEX records that must all be rejected."""
    good = index_of(s).index_lsn
    lsn = backend_of(s).next_lsn
    ix = dump_index(index_of(s).ix)
    bad = [
        [K_INDEX, 1, lsn - 5, -1, ix],                  # claims another LSN
        [K_INDEX, 99, lsn + 1, -1, ix],                 # unknown version
        [K_INDEX, 1, lsn + 2, -1, "garbage"],           # state does not decode
        [K_INDEX, 1, lsn + 3, -1, [["t", [["", ["b", "a"], b"\0" * 16, b"", b"", None]]]]],
        [K_INDEX, 1, lsn + 4, -1, [["t", [["", ["a"], (10 ** 9).to_bytes(8, "little"),
                                           b"", b"", None]]]]],   # an LSN from the future
        [K_INDEX, 1, lsn + 5, lsn + 9, ix],             # compacted_at from the future
        # a version the reader takes, whose arrays fail their checks (FORMAT.md 5)
        [K_INDEX, 3, lsn + 6, -1, ix, [["r", _u64(2, 1)]]],           # a journal out of order
        [K_INDEX, 3, lsn + 7, -1, ix, [["r", _u64(1, 1)]]],           # ... an LSN twice
        [K_INDEX, 3, lsn + 8, -1, ix, [["r", _u64(1, 10 ** 9)]]],     # ... one from the future
        [K_INDEX, 3, lsn + 9, -1, [["t", [["", ["a", "b"], _u64(1, 2), _u64(2, 1), _u64(1, 2),
                                           None]]]], []],            # write keys unsorted
        [K_INDEX, 3, lsn + 10, -1, [["t", [["", ["a"], _u64(10 ** 9), b"", b"", None]]]],
         []],                                                        # a lane LSN from the future
    ]
    for h in bad:
        append_frame(s, encode_commit(pack_head(h), ()), "exit")
    append_frame(s, encode_commit(b"\x95\x0a\xc1\xc1", ()), "exit")   # a head that does not decode
    return good


def test_bad_snapshots_fall_back(url, monkeypatch):
    s = durkv.open(url, index_every=0)
    workload(s)
    index_of(s).write_snapshot()
    put(s, "a", "0777", 7)
    good = _bad_snapshots(s)
    live = state(s)[:2]
    crash_store(s)
    snap, used = reader_states(url, monkeypatch)
    assert used == good                              # the older, valid snapshot
    assert snap[:2] == live

    # no valid snapshot at all: a full replay
    url2 = url + "-2" if url.startswith("memory") else url + "2"
    s = durkv.open(url2, index_every=0)
    workload(s)
    _bad_snapshots(s)
    live = state(s)[:2]
    crash_store(s)
    snap, used = reader_states(url2, monkeypatch)
    assert used == -1 and snap[:2] == live
    if url.startswith("memory"):
        MemoryBackend.drop(url2[len("memory://"):])


def test_corrupted_snapshot_bytes_fall_back(monkeypatch):
    name = f"test-open-{next(_names)}"
    url = f"memory://{name}"
    try:
        s = durkv.open(url, index_every=4)
        workload(s)
        index_of(s).write_snapshot()
        good = index_of(s).index_lsn
        index_of(s).write_snapshot()
        newest = index_of(s).index_lsn
        live = state(s)[:2]
        crash_store(s)
        log = backend_of(s)._log
        p = bytearray(log.frames[newest - log.start])
        p[len(p) // 2] ^= 0xFF                       # flip a byte in the state
        p[-12:] = b"\xc1" * 12
        log.frames[newest - log.start] = bytes(p)
        snap, used = reader_states(url, monkeypatch)
        assert used == good and snap[:2] == live
    finally:
        MemoryBackend.drop(name)


def test_reader_refresh_replays_forward(url, monkeypatch):
    with durkv.open(url, index_every=3) as s:
        workload(s)
    w = durkv.open(url, index_every=3)
    r = durkv.open(url, read_only=True)
    try:
        workload(w, base=30)
        w.compact()
        workload(w, base=50)
        w.flush()
        r.refresh()
        assert state(r)[0] == state(w)[0]
        assert r.get("a").checkpoint_id == w.get("a").checkpoint_id
    finally:
        r.close()
        w.close()
    reader_states(url, monkeypatch)


def test_index_every_option():
    with pytest.raises(ConfigError):
        durkv.open("memory://", index_every=-1)
    with pytest.raises(ConfigError):
        durkv.open("memory://", index_every=1.5)
    with durkv.open("memory://", index_every=1) as s:
        put(s, "t", "0001", 1)
        assert read_head(backend_of(s).read(backend_of(s).next_lsn - 1))[0] == K_INDEX
        put(s, "t", "0002", 2)
        assert backend_of(s).next_lsn == 4
