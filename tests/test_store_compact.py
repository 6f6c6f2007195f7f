"""compact(): crash-safety of the BEGIN / copies / END / remove-prefix protocol.

The chaos suite kills a real process during compact(); these tests stop a
compaction at each step deterministically, by making the backend fail there.
"""

from __future__ import annotations


import pytest

import durkv
from durkv.store import K_COMPACT_END, read_head
from storeinternals import backend_of, crash_store





class Crash(Exception):
    pass


def fill(s):
    msgs, parent, expect = [], None, {}
    for i in range(12):
        msgs = msgs + [f"item {i}" * 5]
        cid = f"{i:04d}"
        s.put("t", "", cid, checkpoint={"i": i}, metadata={}, values={"m": msgs, "n": i},
              versions={"m": i, "n": i}, parent_id=parent)
        s.put_writes("t", "", cid, "task", [(0, "w", i)])
        expect[cid] = list(msgs)
        parent = cid
    for i in range(5):
        s.put("dead", "", str(i), checkpoint={}, metadata={}, values={"x": "junk" * 50},
              versions={"x": i})
    s.delete_thread("dead")
    s.prune(["t"], keep_last=8)
    for cid in list(expect)[:4]:
        del expect[cid]
    return expect


def check(s, expect):
    assert s.threads() == ["t"]
    got = {c.checkpoint_id: c for c in s.history("t")}
    assert sorted(got) == sorted(expect)
    for cid, cp in got.items():
        assert cp.values["m"] == expect[cid]
        assert [w.value for w in cp.writes] == [int(cid)]



def test_crash_before_end_keeps_old_data(url, monkeypatch):
    s = durkv.open(url, snapshot_every=3)
    expect = fill(s)
    real = backend_of(s).append

    def append(payload, durability=None):
        if read_head(payload)[0] == K_COMPACT_END:
            raise Crash
        return real(payload, durability)

    monkeypatch.setattr(backend_of(s), "append", append)
    with pytest.raises(Crash):
        s.compact()
    crash_store(s)
    with durkv.open(url, snapshot_every=3) as s:
        check(s, expect)                       # the copies without END are ignored
        msgs = expect["0011"] + ["after"]
        s.put("t", "", "0012", checkpoint={"i": 12}, metadata={}, values={"m": msgs},
              versions={"m": 12, "n": 11}, parent_id="0011")
        s.put_writes("t", "", "0012", "task", [(0, "w", 12)])
        expect["0012"] = msgs
        check(s, expect)
    with durkv.open(url, snapshot_every=3) as s:
        check(s, expect)                       # a record after the dead copies: still ignored
        report = s.compact()
        assert report["checkpoints_kept"] == 9
        check(s, expect)
    with durkv.open(url, snapshot_every=3) as s:
        check(s, expect)


def test_crash_after_end_before_prefix_removal(url, monkeypatch):
    s = durkv.open(url, snapshot_every=3)
    expect = fill(s)

    def remove_prefix(lsn):
        raise Crash

    monkeypatch.setattr(backend_of(s), "remove_prefix", remove_prefix)
    with pytest.raises(Crash):
        s.compact()
    start_before = backend_of(s).start_lsn
    crash_store(s)
    monkeypatch.undo()
    with durkv.open(url, snapshot_every=3) as s:
        check(s, expect)                       # END is there: the copies are authoritative
        assert backend_of(s).start_lsn > start_before   # and the writer finished the prefix removal
    with durkv.open(url, snapshot_every=3) as s:
        check(s, expect)


def test_compact_twice_and_empty(url):
    with durkv.open(url) as s:
        assert s.compact()["checkpoints_kept"] == 0
        expect = fill(s)
        a = s.compact()
        b = s.compact()
        assert a["checkpoints_kept"] == b["checkpoints_kept"] == 8
        assert b["bytes_after"] <= a["bytes_after"] + 256
        check(s, expect)
        if not url.startswith("memory://"):
            report = s.verify(deep=True)      # every re-chained DELTA/SNAP ref resolves
            assert report.ok, report


# -- channel_entries across a compaction: what each checkpoint wrote, wherever its copy is ----


def _entries(s, t: str, ch: str = "m") -> list:
    return [(e.checkpoint_id, e.kind, e.value) for e in s.channel_entries(t, "", ch)]


def _loop(s, t: str, n: int, start: int = 0, parent: str | None = None,
          msgs: list | None = None) -> list:
    """``n`` checkpoints, each appending one item to ``m`` (and setting ``n``)."""
    msgs = list(msgs or [])
    for i in range(start, start + n):
        msgs = msgs + [f"{t} {i}"]
        cid = f"{i:04d}"
        s.put(t, "", cid, checkpoint={}, metadata={"run_id": f"run-{i // 3}"},
              values={"m": msgs, "n": i}, versions={"m": i + 1, "n": i + 1}, parent_id=parent)
        parent = cid
    return msgs


def _same_after_compact_and_reopen(url, s, threads, **open_kw):
    """channel_entries of each thread reads the same before and after a compaction, and
    after a reopen; returns what it read."""
    before = {t: _entries(s, t) for t in threads}
    s.compact()
    assert {t: _entries(s, t) for t in threads} == before
    s.close()
    with durkv.open(url, **open_kw) as s2:
        assert {t: _entries(s2, t) for t in threads} == before
    return before


def test_channel_entries_of_a_copied_thread_survive_compaction(url):
    """A copy_thread target refers to the same entries as its source; a compaction copies
    each entry once, into the source's frames, and the target's entries used to vanish."""
    s = durkv.open(url, snapshot_every=4)
    _loop(s, "a", 10)
    s.copy_thread("a", "b")
    assert _entries(s, "b") == _entries(s, "a")
    got = _same_after_compact_and_reopen(url, s, ("a", "b"))
    assert got["b"] == got["a"]
    assert [k for _c, k, _v in got["b"]] == ["append"] * 9 + ["full"]
    assert got["b"][0] == ("0009", "append", ["a 9"])


def test_channel_entries_after_prune_start_with_the_whole_value(url):
    """The oldest kept checkpoint's parent is gone: its entry is its whole value ("full"),
    before a compaction, after it and after a reopen -- never the pruned checkpoints'
    items reported as appended by it (what a compaction used to make of it)."""
    s = durkv.open(url, snapshot_every=4)
    msgs = _loop(s, "t", 10)
    s.prune(["t"], keep_last=4)
    want = [("0009", "append", ["t 9"]), ("0008", "append", ["t 8"]),
            ("0007", "append", ["t 7"]), ("0006", "full", msgs[:7])]
    assert _entries(s, "t") == want
    assert _same_after_compact_and_reopen(url, s, ("t",))["t"] == want


def test_channel_entries_after_delete_runs_and_compaction(url):
    """A checkpoint whose parent a delete_runs removed reports its whole value."""
    s = durkv.open(url, snapshot_every=4)
    msgs = _loop(s, "t", 9)          # runs 0..2 of three checkpoints each
    s.delete_runs(["run-1"])         # 0003..0005
    want = [("0008", "append", ["t 8"]), ("0007", "append", ["t 7"]),
            ("0006", "full", msgs[:7]), ("0002", "append", ["t 2"]),
            ("0001", "append", ["t 1"]), ("0000", "full", ["t 0"])]
    assert _entries(s, "t") == want
    assert _same_after_compact_and_reopen(url, s, ("t",))["t"] == want


def test_channel_entries_of_a_fork_within_a_thread_survive_compaction(url):
    """Checkpoints put out of id order (a fork, time travel) refer to entries of a newer
    id's frame; a compaction copies each entry into the first frame (in id order) that
    needs it, which used to move another checkpoint's entry into their frame."""
    s = durkv.open(url)
    _loop(s, "t", 4)                                         # 0000..0003
    # 0001a follows 0003 (an older id put later): it keeps 0003's entry of m
    s.put("t", "", "0001a", checkpoint={}, metadata={}, values={"n": -1},
          versions={"m": 4, "n": 99}, parent_id="0003")
    # a fork of 0001 with its own list, and a checkpoint on it
    s.put("t", "", "0005", checkpoint={}, metadata={}, values={"m": ["t 0", "t 1", "x"]},
          versions={"m": 9, "n": 2}, parent_id="0001")
    s.put("t", "", "0006", checkpoint={}, metadata={}, values={"m": ["t 0", "t 1", "x", "y"]},
          versions={"m": 10, "n": 2}, parent_id="0005")
    want = [("0006", "append", ["y"]), ("0005", "full", ["t 0", "t 1", "x"]),
            ("0003", "append", ["t 3"]), ("0002", "append", ["t 2"]),
            ("0001", "append", ["t 1"]), ("0000", "full", ["t 0"])]
    assert _entries(s, "t") == want
    assert _same_after_compact_and_reopen(url, s, ("t",))["t"] == want


def test_channel_entries_when_a_pending_write_arrived_after_its_checkpoint(url):
    """A pending write put after the checkpoint that folded it in refers to that
    checkpoint's items; a compaction copies them into the write's frame, and the
    checkpoint's entry used to vanish."""
    s = durkv.open(url)
    s.put("t", "", "0000", checkpoint={}, metadata={}, values={"m": ["a"]}, versions={"m": 1})
    s.put("t", "", "0001", checkpoint={}, metadata={}, values={"m": ["a", "b"]},
          versions={"m": 2}, parent_id="0000")
    s.put_writes("t", "", "0000", "task", [(0, "m", ["b"])])     # LangGraph's async order
    want = [("0001", "append", ["b"]), ("0000", "full", ["a"])]
    assert _entries(s, "t") == want
    assert _same_after_compact_and_reopen(url, s, ("t",))["t"] == want
    with durkv.open(url) as s2:
        assert [w.value for w in s2.get("t", "", "0000").writes] == [["b"]]


def test_channel_entries_of_items_shared_with_pending_writes_survive_compaction(url):
    """A checkpoint whose first items are its parent's pending write's (an F_REFS DELTA
    naming the write's entry, then a DELTA of its own) appended both, before and after a
    compaction (which copies the write's entry into the write's frame)."""
    s = durkv.open(url)
    s.put("t", "", "0000", checkpoint={}, metadata={}, values={"m": ["a"]}, versions={"m": 1})
    s.put_writes("t", "", "0000", "task", [(0, "m", ["b"])])
    s.put("t", "", "0001", checkpoint={}, metadata={}, values={"m": ["a", "b", "c"]},
          versions={"m": 2}, parent_id="0000")
    s.put_writes("t", "", "0001", "task", [(0, "m", ["d"])])
    s.put("t", "", "0002", checkpoint={}, metadata={}, values={"m": ["a", "b", "c", "d"]},
          versions={"m": 3}, parent_id="0001")
    want = [("0002", "append", ["d"]), ("0001", "append", ["b", "c"]), ("0000", "full", ["a"])]
    assert _entries(s, "t") == want
    assert _same_after_compact_and_reopen(url, s, ("t",))["t"] == want


def test_channel_entries_without_a_parent_id_are_whole_values(url):
    """A checkpoint put without a parent_id has no parent to tell its own items from: it
    reports its whole value (the writer stored a delta on the newest, but which one that
    was is not recorded), the same after a compaction."""
    s = durkv.open(url)
    s.put("t", "", "0000", checkpoint={}, metadata={}, values={"m": ["a"]}, versions={"m": 1})
    s.put("t", "", "0001", checkpoint={}, metadata={}, values={"m": ["a", "b"]},
          versions={"m": 2})
    s.put("t", "", "0002", checkpoint={}, metadata={}, values={"m": ["a", "b", "c"]},
          versions={"m": 3}, parent_id="0001")
    want = [("0002", "append", ["c"]), ("0001", "full", ["a", "b"]), ("0000", "full", ["a"])]
    assert _entries(s, "t") == want
    assert _same_after_compact_and_reopen(url, s, ("t",))["t"] == want
