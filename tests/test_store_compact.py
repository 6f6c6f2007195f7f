"""compact(): crash-safety of the BEGIN / copies / END / remove-prefix protocol.

The chaos suite kills a real process during compact(); these tests stop a
compaction at each step deterministically, by making the backend fail there.
"""

from __future__ import annotations


import pytest

import durkv
from durkv.store import K_COMPACT_END, _head_of





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


def crash_store(s):
    """Abandon a store as a crash would (release the backend, keep what it wrote)."""
    s._closed = True
    s._b.close()


def test_crash_before_end_keeps_old_data(url, monkeypatch):
    s = durkv.open(url, snapshot_every=3)
    expect = fill(s)
    real = s._b.append

    def append(payload, durability=None):
        if _head_of(payload)[0] == K_COMPACT_END:
            raise Crash
        return real(payload, durability)

    monkeypatch.setattr(s._b, "append", append)
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

    monkeypatch.setattr(s._b, "remove_prefix", remove_prefix)
    with pytest.raises(Crash):
        s.compact()
    start_before = s._b.start_lsn
    crash_store(s)
    monkeypatch.undo()
    with durkv.open(url, snapshot_every=3) as s:
        check(s, expect)                       # END is there: the copies are authoritative
        assert s._b.start_lsn > start_before   # and the writer finished the prefix removal
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
