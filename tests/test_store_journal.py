"""The store side of the run journal: K_JOURNAL records indexed by run (docs/FORMAT.md 5a).

Reads by LSN without a scan, restored from index snapshots, carried by delete,
copy, delete_runs and compaction, and durable=True fsync'd under any policy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import msgpack
import pytest

import durkv
import durkv.log
from durkv.backends.local import LocalBackend
from durkv.backends.memory import MemoryBackend
from durkv.payload import encode_commit, encode_record
from durkv.store.records import K_COMPACT_BEGIN, K_COMPACT_END, K_COPY_JOURNAL, K_INDEX, read_head

import logtools as lt
from storeinternals import backend_of, index_of


def _fill(s, run, n, start=0):
    for i in range(start, start + n):
        s.append_journal(run, {"e": 2, "s": str(i), "i": i})


def _steps(s, run):
    return [r["i"] for r in s.journal(run)]


def test_records_read_back_in_order_and_after_reopen(url):
    with durkv.open(url) as s:
        _fill(s, "a", 5)
        _fill(s, "b", 3)
        s.put("a", "", "1", checkpoint={}, metadata={}, values={}, versions={})
        _fill(s, "a", 2, 5)
        assert _steps(s, "a") == list(range(7))
        assert s.journal_runs() == ["a", "b"]
        assert s.journal("nobody") == []
    for every in (0, 10 ** 6):      # a full replay, and from the close snapshot
        with durkv.open(url, index_every=every) as s:
            assert _steps(s, "a") == list(range(7)) and _steps(s, "b") == [0, 1, 2]


def test_journal_reads_by_lsn_without_a_scan(url, monkeypatch):
    with durkv.open(url) as s:
        _fill(s, "a", 50)
        _fill(s, "b", 50)
    cls = MemoryBackend if url.startswith("memory") else LocalBackend
    with durkv.open(url) as s:
        calls = []
        real = cls.read_heads
        monkeypatch.setattr(cls, "read_heads",
                            lambda self, lsns: calls.append(list(lsns)) or real(self, lsns))
        monkeypatch.setattr(cls, "scan", lambda self, f=0: pytest.fail("journal() scanned"))
        assert _steps(s, "b") == list(range(50))
        assert len(calls) == 1 and len(calls[0]) == 50     # one batched read of b's records


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_snapshot_restores_journals(url, durability):
    # async: the records are appended in sections of their own (one backend call each),
    # which hand the snapshot that falls due to a write section
    with durkv.open(url, index_every=7, durability=durability) as s:
        _fill(s, "a", 40)
        _fill(s, "b", 3)
        last = index_of(s).index_lsn
    assert last > 0
    with durkv.open(url) as s:
        assert index_of(s).index_lsn >= last      # opened from a snapshot
        assert _steps(s, "a") == list(range(40)) and _steps(s, "b") == [0, 1, 2]


def test_version_1_snapshot_is_passed_over(url):
    """An older durkv's snapshot knows no journals: trusting it would hide them."""
    with durkv.open(url, index_every=0) as s:
        _fill(s, "a", 4)
        head = msgpack.packb([K_INDEX, 1, backend_of(s).next_lsn, -1, []], use_bin_type=True)
        backend_of(s).append(encode_commit(head, ()))
    with durkv.open(url, index_every=0) as s:
        assert _steps(s, "a") == [0, 1, 2, 3]


def test_delete_thread_copy_thread_delete_runs(url):
    with durkv.open(url) as s:
        _fill(s, "a", 3)
        _fill(s, "b", 2)
        _fill(s, "c", 2)
        s.copy_thread("a", "a2")           # a run with a journal and no checkpoint
        s.delete_thread("b")
        s.delete_runs(["c"])
        want = {"a": [0, 1, 2], "a2": [0, 1, 2], "b": [], "c": []}
        assert {r: _steps(s, r) for r in want} == want
        _fill(s, "a2", 1, 3)              # the copy goes on alone
        assert _steps(s, "a") == [0, 1, 2]
        want["a2"] = [0, 1, 2, 3]
    for every in (0, 10 ** 6):
        with durkv.open(url, index_every=every) as s:
            assert {r: _steps(s, r) for r in want} == want
            assert s.journal_runs() == ["a", "a2"]


def test_compaction_carries_journals(url):
    with durkv.open(url) as s:
        _fill(s, "a", 5)
        s.copy_thread("a", "z")
        _fill(s, "gone", 5)
        s.delete_thread("gone")
        report = s.compact()
        assert report["journal_records_kept"] == 10
        assert _steps(s, "a") == _steps(s, "z") == list(range(5))
        _fill(s, "a", 1, 5)
    for every in (0, 10 ** 6):
        with durkv.open(url, index_every=every) as s:
            assert _steps(s, "a") == list(range(6)) and _steps(s, "z") == list(range(5))
            assert s.journal("gone") == []


def _journal_copies(s) -> list:
    """The run (or runs) of each K_COPY_JOURNAL frame the store's log holds, in LSN order."""
    b = backend_of(s)
    heads = (read_head(p, lsn) for lsn, p in b.scan(b.start_lsn))
    return [h[1] for h in heads if h[0] == K_COPY_JOURNAL]


def test_compaction_copies_a_record_that_runs_share_once(url):
    """A copy_thread target shares its source's records: a compaction copies each once,
    naming both runs (FORMAT.md 5a), and each run's journal reads as before, in order --
    also after a reopen, and after the source is deleted and the store compacted again."""
    with durkv.open(url) as s:
        _fill(s, "a", 5)
        s.copy_thread("a", "z")
        _fill(s, "z", 2, 5)
        _fill(s, "a", 1, 5)
        _fill(s, "solo", 1)
        before = {r: s.journal(r) for r in ("a", "z", "solo")}
        report = s.compact()
        assert report["journal_records_kept"] == 6 + 7 + 1      # records each run keeps
        assert _journal_copies(s) == [["a", "z"]] * 5 + ["z", "z", "a", "solo"]
        assert {r: s.journal(r) for r in before} == before
    for every in (0, 10 ** 6):
        with durkv.open(url, index_every=every) as s:
            assert {r: s.journal(r) for r in before} == before
    with durkv.open(url) as s:
        _fill(s, "z", 1, 7)
        s.delete_runs(["a"])
        s.compact()
        assert sorted(_journal_copies(s)) == ["solo"] + ["z"] * 8
        assert _steps(s, "z") == list(range(8)) and s.journal("a") == []
        assert s.journal("solo") == before["solo"]


@pytest.mark.parametrize("runs", [[], [1], ["a", None]])
def test_a_journal_copy_naming_no_run_is_refused(tmp_path, runs):
    """A K_COPY_JOURNAL whose run list is empty or not all str ids indexes nothing right:
    opening the store says which frame, rather than dropping or misfiling the record."""
    url = str(tmp_path / "s.durkv")
    with durkv.open(url, index_every=0) as s:
        _fill(s, "a", 2)
    rec = msgpack.packb({"e": 2, "s": "0", "i": 0})
    C = durkv.log.FRAME_COMMIT
    with durkv.log.SegmentLog.open(url) as log:    # a compaction as a buggy writer wrote it
        begin = log.append(encode_record(msgpack.packb([K_COMPACT_BEGIN])), frame_type=C)
        log.append(encode_record(msgpack.packb([K_COPY_JOURNAL, runs, rec])), frame_type=C)
        log.append(encode_record(msgpack.packb([K_COMPACT_END, begin])), frame_type=C)
    with pytest.raises(durkv.CorruptionError, match=rf"frame {begin + 1} .*names the runs"):
        with durkv.open(url, index_every=0) as s:   # (the open or the first read replays)
            s.journal("a")


def test_async_record_outside_a_section_is_one_backend_call(tmp_path, monkeypatch):
    """The hot path of a running agent (async, no section open): one ``append_one``
    call in place of write_begin + append + write_end, and the record reads back."""
    calls = []
    for name in ("write_begin", "append", "append_one"):
        real = getattr(LocalBackend, name)
        monkeypatch.setattr(LocalBackend, name, lambda self, *a, _n=name, _r=real, **k:
                            calls.append(_n) or _r(self, *a, **k))
    with durkv.open(str(tmp_path / "s.durkv"), durability="async") as s:
        s.append_journal("r", {"i": 0})      # the first catches the index up: any path
        calls.clear()
        _fill(s, "r", 5, start=1)
        assert calls == ["append_one"] * 5
        assert _steps(s, "r") == list(range(6))


def test_async_records_of_two_writers_stay_in_log_order(tmp_path):
    """Two handles (as two processes) append to one run's journal in turn under async:
    each one's record after the other's must come after it in the index too -- the one
    backend call appends nothing when the log moved past the index (DKV_MOVED), and the
    record goes through a write section that first takes the other's frames in."""
    path = str(tmp_path / "s.durkv")
    with durkv.open(path, durability="async") as a, durkv.open(path, durability="async") as b:
        for i in range(12):
            (a if i % 3 else b).append_journal("r", {"i": i})
            (b if i % 2 else a).append_journal(f"other{i % 2}", {"i": i})
            assert _steps(a, "r") == _steps(b, "r") == list(range(i + 1))
    with durkv.open(path, read_only=True) as s:
        assert _steps(s, "r") == list(range(12))
        lsns = list(index_of(s).ix.journals["r"])
        assert lsns == sorted(lsns)
    assert durkv.log.verify(path, deep=True).ok


def test_bad_run_id_and_unencodable_record(url):
    with durkv.open(url) as s:
        with pytest.raises(durkv.ConfigError, match="run_id"):
            s.append_journal("", {"e": 1})
        with pytest.raises(durkv.SerializationError, match="run 'a'"):
            s.append_journal("a", {"e": object()})
        with pytest.raises(durkv.FrameTooLargeError, match="max_commit_bytes"):
            durkv.open("memory://", max_commit_bytes=100).append_journal("a", {"x": b"0" * 200})
        assert s.journal("a") == []


def test_bytes_are_not_a_record_and_a_packed_record_keeps_its_run(url):
    """Only what pack_journal made is appended as packed bytes, and only to its own run: a
    caller's bytes would be a frame no read could take for a record."""
    with durkv.open(url) as s:
        s.append_journal("a", {"e": 2, "s": "0", "i": 0})
        for bad in (b"garbage", bytearray(b"\x93\x01"), "text", 7):
            with pytest.raises(durkv.ConfigError, match="a dict or a typed record"):
                s.append_journal("a", bad)
        packed = s.pack_journal("a", {"e": 2, "s": "1", "i": 1})
        with pytest.raises(durkv.ConfigError, match="packed for run 'a'.*run 'b'"):
            s.append_journal("b", packed)
        s.append_journal("a", packed)
        assert _steps(s, "a") == [0, 1] and s.journal("b") == []
        assert [r.run_id for r in s.runs()] == ["a"]


CHILD = textwrap.dedent("""
    import os, sys
    import durkv
    s = durkv.open(sys.argv[1], durability="exit")
    s.append_journal("r", {"e": 3, "i": 0}, durable=True)   # an INTENT: fsync'd anyway
    s.append_journal("r", {"e": 2, "i": 1})                 # not fsync'd under exit
    os.kill(os.getpid(), 9)
""")


def test_durable_record_survives_kill_under_exit_policy(tmp_path):
    path = str(tmp_path / "s.durkv")
    p = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True)
    assert p.returncode == -9, p.stderr.decode()
    with durkv.open(path) as s:
        # the exit record too: a store's frames are written when their write section ends
        # (several writers, FORMAT.md 12); only a power loss could still take it
        assert _steps(s, "r") == [0, 1]
    assert os.path.isdir(path)


def test_verify_covers_journal_frames(tmp_path):
    import durkv.log

    path = str(tmp_path / "s.durkv")
    with durkv.open(path) as s:
        _fill(s, "a", 20)
    assert durkv.log.verify(path, deep=True).ok
    seg = sorted(p for p in os.listdir(path) if p.endswith(".seg"))[-1]
    with open(os.path.join(path, seg), "r+b") as f:     # a flipped byte in a journal record
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 0xFF]))
    assert not durkv.log.verify(path, deep=True).ok


def test_batched_journal_read_checks_every_frame(tmp_path):
    """journal() reads a run's records in one C call (dkv_read_heads); a damaged record
    among them is a CorruptionError, not a wrong or short journal."""
    path = str(tmp_path / "s.durkv")
    with durkv.open(path) as s:
        _fill(s, "a", 20)
        _fill(s, "b", 1)         # the index snapshot at close follows; a's records precede
    seg = sorted(p for p in os.listdir(path) if p.endswith(".seg"))[-1]
    with durkv.open(path) as s:       # open checks the frames; this damage comes later
        assert len(s.journal("a")) == 20
        with open(os.path.join(path, seg), "r+b") as f:
            f.seek(200)
            b = f.read(1)
            f.seek(200)
            f.write(bytes([b[0] ^ 0xFF]))
        with pytest.raises(durkv.CorruptionError):
            s.journal("a")
        assert s.journal("b")[0]["i"] == 0      # the other run's record still reads


def test_concurrent_durable_records_share_fsyncs(tmp_path):
    """Durable records of threads on different runs ride one write + fdatasync (group
    commit). When each append waited for its own write under the store's lock (behind
    the running fsync), every record got a write and an fsync of its own, and 8
    threads ran no faster than one."""
    path = str(tmp_path / "s.durkv")
    per, threads = 60, 8
    with durkv.open(path, durability="sync") as s:
        first = backend_of(s).next_lsn
        syncs = backend_of(s)._log.commit_syncs

        def work(k):
            for i in range(per):
                s.append_journal(f"run-{k}", {"e": 2, "s": str(i), "i": i}, durable=True)

        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        syncs = backend_of(s)._log.commit_syncs - syncs
        for k in range(threads):
            assert [r["i"] for r in s.journal(f"run-{k}")] == list(range(per))
    n = per * threads
    # one fsync per record (480) is no group commit; a write section per commit (several
    # writers, FORMAT.md section 12) groups a little less than one write per group did,
    # and a loaded 2-core machine measured 293 (0.61)
    assert syncs <= n * 0.75, f"{syncs} fdatasyncs for {n} durable records: no group commit"
    frames = [f for seg in lt.segments(path) for f in seg.frames if first <= f.lsn < first + n]
    assert len(frames) == n
    assert any(f.durable < f.lsn for f in frames)     # written in a group after another


def test_batched_journal_read_of_written_and_pending_records(tmp_path):
    """Under `exit` a run's records are partly in the segment file, partly still in the
    writer's buffers: one journal() returns them all, in order, interleaved with
    another run's (runs of neighbouring LSNs are read with one pread each)."""
    with durkv.open(str(tmp_path / "s.durkv"), durability="exit") as s:
        for i in range(700):
            s.append_journal("a", {"e": 2, "s": str(i), "i": i})
            if i % 97 == 0:
                s.append_journal("b", {"e": 2, "s": str(i), "i": i})
            if i == 400:
                s.flush()           # 0..400 in the file, the rest buffered
        assert [r["i"] for r in s.journal("a")] == list(range(700))
        assert [r["i"] for r in s.journal("b")] == list(range(0, 700, 97))


def test_copy_thread_between_two_runs_with_journals_is_refused(url):
    """Merged journals would make the target replay the source's results as its own:
    copy_thread refuses, writes nothing, and both runs replay their own results."""
    with durkv.open(url) as s:
        with s.run("b", input={"q": 1}) as run:
            assert run.step("s", lambda: "B0") == "B0"
        with s.run("a", input={"q": 1}) as run:
            assert run.step("s", lambda: "A0") == "A0"
        before = s.size_bytes()
        with pytest.raises(durkv.RunConflictError, match="both are runs with a journal"):
            s.copy_thread("a", "b")
        assert s.size_bytes() == before
        s.copy_thread("a", "c")                     # a new id: the journal is carried
        for run_id, want in (("b", "B0"), ("a", "A0"), ("c", "A0")):
            with s.run(run_id, input={"q": 1}) as run:
                assert run.step("s", lambda: "called again") == want
