"""The appender is the store's one door to its log (issue 16, item 3).

Every frame the store writes, every wait for a write or an fdatasync and every flush
reaches the backend from :mod:`durkv.store.appender` -- checkpoints, pending writes,
journal records, deletes, copies, prunes, index snapshots and compaction's copies
alike. A spy on the backend's writing verbs names the module each call came from.
"""

from __future__ import annotations

import os
import sys

import pytest

import durkv
from durkv.payload import encode_commit, encode_record
from storeinternals import backend_of

WRITING_VERBS = ("append", "append_many", "flush", "wait_durable", "wait_written")


def _spy(backend) -> list[tuple[str, str]]:
    """Record ``(verb, calling file)`` of every writing call made on ``backend``."""
    calls: list[tuple[str, str]] = []
    for name in WRITING_VERBS:
        real = getattr(backend, name, None)
        if real is None:
            continue

        def spied(*args, _real=real, _name=name, **kwargs):
            calls.append((_name, os.path.basename(sys._getframe(1).f_code.co_filename)))
            return _real(*args, **kwargs)
        setattr(backend, name, spied)
    return calls


def _every_kind_of_write(s) -> None:
    for i, dur in enumerate(("sync", "async", "exit", None)):
        s.put("t", "", str(i), checkpoint={}, metadata={"run_id": "r0" if i == 0 else None},
              values={"msgs": ["m"] * (i + 1)}, versions={"msgs": i + 1},
              parent_id=str(i - 1) if i else None, durability=dur)
        s.put_writes("t", "", str(i), "task", [(0, "msgs", ["w", i]), (1, "x", i)],
                     durability=dur)
    s.append_journal("r1", {"e": 1, "t": 0.0})
    s.append_journal("r1", {"e": 2, "t": 0.0}, durable=True)
    s.wait_journal(s.append_journal("r1", {"e": 2, "t": 0.0}, durable=True, defer=True))
    s.append_journal_if("r1", lambda recs: {"e": 3, "n": len(recs)})
    s.copy_thread("t", "u")
    s.prune(["u"], keep_last=1)
    s.delete_runs(["r0"])
    s.delete_thread("u")
    s.flush()
    s.compact()


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@pytest.mark.parametrize("kind", ["memory", "local"])
def test_every_frame_wait_and_flush_goes_through_the_appender(tmp_path, kind, durability):
    url = "memory://" if kind == "memory" else str(tmp_path / "s.durkv")
    s = durkv.open(url, durability=durability, index_every=3)   # index snapshots too
    calls = _spy(backend_of(s))
    _every_kind_of_write(s)
    kept = s.get("t")
    assert kept is not None and kept.values["msgs"] == ["m"] * 4
    assert {verb for verb, _f in calls} >= {"append", "flush"}
    assert [c for c in calls if c[1] != "appender.py"] == []
    s.close()
    if kind == "local":     # and what went through the door reads back
        with durkv.open(url, read_only=True) as r:
            assert r.get("t").values["msgs"] == ["m"] * 4
            assert [x["e"] for x in r.journal("r1")] == [1, 2, 2, 3]


def test_an_entry_less_payload_is_an_empty_commit():
    """The one builder of a record's payload writes the bytes of a COMMIT without entries
    (FORMAT.md section 5: head_len, head, n_entries = 0)."""
    for head in (b"", b"\x91\x05", b"h" * 70_000):
        p = encode_record(head)
        assert p == encode_commit(head, ())
        assert p == len(head).to_bytes(4, "little") + head + bytes(4)
