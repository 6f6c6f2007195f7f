"""Compact step ids (docs/FORMAT.md 2 flag STEP_IDS, 5a "Compact step ids").

A LangGraph node's step id, ``<task_id>:<index>``, is written as 18 bytes of msgpack
extension 1 in place of 40 bytes of text, only into segments whose header says so; every
reader hands back the very str; an older durkv refuses such a segment instead of reading
the id as something else; a store an older durkv wrote keeps text ids until its next
segment. tests/test_recpack.py holds the C and Python packers to the same bytes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

import durkv
from durkv.errors import CorruptionError
from durkv.log import crc32c

U = "0a46480b-33fa-f0f3-b8f3-a45efaa708b5"
UB = bytes.fromhex(U.replace("-", ""))
FIXTURES = Path(__file__).parent / "fixtures"


def seg_flags(path: Path) -> list[int]:
    return [int.from_bytes(f.read_bytes()[12:16], "little") for f in sorted(path.glob("*.seg"))]


def step(sid: str, **more) -> dict:
    return {"e": 2, "t": 1.5, "s": sid, "k": "step", "n": "model", "fp": 7, "r": b"\x01",
            **more}


def test_a_new_store_writes_step_ids_compact_and_reads_them_as_given(tmp_path):
    path = tmp_path / "s.durkv"
    recs = [step(f"{U}:0", ir=[[-1], [f"{U}:0", 0, 1], [[f"{U}:12", 0]]]),
            step(f"{U}:12", note=f"{U}:12"), step("7"), step(f"{U.upper()}:0")]
    with durkv.open(str(path)) as s:
        lsns = [s.append_journal("run", r) for r in recs]
        raw = [s._b.read(lsn) for lsn in lsns]
        assert s.journal("run") == recs
    assert seg_flags(path) == [1]
    assert raw[0].count(b"\xd8\x01" + UB) == 2 and raw[0].count(b"\xc7\x11\x01" + UB + b"\x0c") == 1
    assert U.encode() not in raw[0] and U.encode() not in raw[1]
    assert f"{U.upper()}:0".encode() in raw[3]     # not the canonical text: a str
    # another process, read-only, and verify --deep
    code = (f"import durkv, sys; s = durkv.open({str(path)!r}, read_only=True); "
            f"print(repr(s.journal('run'))); assert s.verify(deep=True).ok")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert eval(out) == recs


def test_a_memory_store_keeps_text_ids():
    with durkv.open("memory://") as s:
        payload = s.pack_journal("run", step(f"{U}:0")).payload
    assert f"{U}:0".encode() in payload and b"\xd8\x01" not in payload


def test_a_store_an_older_durkv_wrote_keeps_text_ids_until_its_next_segment(tmp_path):
    path = tmp_path / "old.durkv"
    shutil.copytree(FIXTURES / "journal-2ea939e", path)
    assert set(seg_flags(path)) == {0}
    with durkv.open(str(path)) as s:
        before = s.journal("run-a") if "run-a" in s.journal_runs() else None
        a = s.append_journal("new", step(f"{U}:1"))
        assert f"{U}:1".encode() in s._b.read(a)            # the active segment: no flag
        s._b.roll()
        b = s.append_journal("new", step(f"{U}:2"))
        assert U.encode() not in s._b.read(b)               # a new segment has the flag
    assert seg_flags(path)[-1] == 1 and set(seg_flags(path)[:-1]) == {0}
    with durkv.open(str(path), read_only=True) as s:
        assert s.journal("new") == [step(f"{U}:1"), step(f"{U}:2")]
        if before is not None:
            assert s.journal("run-a") == before
        assert s.verify(deep=True).ok


def _set_flags(seg: Path, flags: int) -> None:
    b = bytearray(seg.read_bytes())
    b[12:16] = flags.to_bytes(4, "little")
    b[60:64] = crc32c(bytes(b[:60])).to_bytes(4, "little")
    seg.write_bytes(bytes(b))


def test_every_segment_the_log_makes_or_rewrites_keeps_the_flag(tmp_path):
    """A roll makes a flagged segment, and so does compaction's rewrite of an empty active
    segment's header with a new start (csrc/seglog.c dkv_seal): a segment that lost the
    flag would hold compact ids an older durkv reads as something else."""
    from durkv.log import SegmentLog
    with SegmentLog.open(tmp_path / "l", durability="exit") as log:
        log.append(b"a")
        log.seal()                              # a new, empty active segment
        log.seal(new_start_lsn=log.next_lsn)    # its header rewritten in place
        assert log.step_ids and log.start_lsn == 1
    assert seg_flags(tmp_path / "l") == [1]     # the sealed one removed below the start
    with SegmentLog.open(tmp_path / "l", durability="exit") as log:
        assert log.step_ids and log.start_lsn == 1


def test_a_segment_with_a_flag_this_version_does_not_know_is_refused(tmp_path):
    """What an older durkv does with a STEP_IDS segment, shown with the next bit: the
    store is refused (damage named), never read with a field taken for something else."""
    path = tmp_path / "s.durkv"
    with durkv.open(str(path)) as s:
        s.append_journal("run", step(f"{U}:0"))
    seg = sorted(path.glob("*.seg"))[0]
    _set_flags(seg, 3)
    with pytest.raises(CorruptionError, match="unknown header flags"):
        durkv.open(str(path), read_only=True)
    _set_flags(seg, 1)
    with durkv.open(str(path), read_only=True) as s:
        assert s.journal("run") == [step(f"{U}:0")]


def test_an_archive_reads_a_flagged_segment_header(tmp_path):
    from durkv.backends.s3.segfile import read_header
    path = tmp_path / "s.durkv"
    with durkv.open(str(path)) as s:
        s.append_journal("run", step(f"{U}:0"))
    seg = sorted(path.glob("*.seg"))[0]
    assert read_header(seg.read_bytes()).base_lsn == 0
    _set_flags(seg, 2)
    assert read_header(seg.read_bytes()) is None


def test_a_damaged_compact_id_is_named_not_guessed(tmp_path):
    """An extension 1 whose data no writer makes (an index with a leading zero byte) in a
    frame whose checksum is right: the store names the frame as damage at open, in this
    process and for the CLI; it never reads a str someone could take for a step id."""
    from durkv.store.records import K_JOURNAL
    path = tmp_path / "s.durkv"
    bad = msgpack.packb([K_JOURNAL, "run", {"e": 2, "s": msgpack.ExtType(1, UB + b"\x00")}])
    with durkv.open(str(path)) as s:
        s.append_journal("run", step(f"{U}:0"))
        s._b.append(len(bad).to_bytes(4, "little") + bad + bytes(4))
    with pytest.raises(CorruptionError, match="frame 1 .*compact step id of 17 bytes"):
        durkv.open(str(path), read_only=True)
    cli = subprocess.run([sys.executable, "-m", "durkv.cli", "journal", str(path), "run"],
                         capture_output=True, text=True)
    assert cli.returncode != 0 and "compact step id" in cli.stderr
    assert "Traceback" not in cli.stderr


def test_a_langgraph_agent_journals_compact_ids(tmp_path):
    """Through the user's path: a durable ReAct agent's model steps and tool calls are
    journaled with compact ids (a SIGKILLed agent resuming on them: test_langgraph_steps
    and the LangGraph kill tests, which run on local stores)."""
    pytest.importorskip("langgraph")
    sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
    try:
        from test_bench_react import react_graph
    finally:
        sys.path.pop(0)
    from langchain_core.messages import HumanMessage

    from durkv.langgraph import DurkvSaver
    path = tmp_path / "a.durkv"
    with DurkvSaver.open(str(path)) as saver:
        g = react_graph(9, True).compile(checkpointer=saver)
        g.invoke({"messages": [HumanMessage(content="go", id="h0")]},
                 {"configurable": {"thread_id": "t"}, "recursion_limit": 20})
        recs = saver.store.journal("t")
        raws = [saver.store._b.read(lsn) for lsn in saver.store._journal_lsns("t", 0)]
    steps = [(r, raw) for r, raw in zip(recs, raws) if r.get("e") in (2, 3, 4)]
    assert len(steps) == 13          # 5 model steps; 4 tool calls: an INTENT, a RECEIPT
    for r, raw in steps:
        sid = r["s"]
        assert len(sid) == 38 and sid.endswith(":0")
        assert sid.encode() not in raw and b"\xd8\x01" + bytes.fromhex(
            sid[:36].replace("-", "")) in raw


def test_compaction_copies_keep_the_compact_form(tmp_path):
    path = tmp_path / "s.durkv"
    recs = [step(f"{U}:{i}", ir=[[-1], [f"{U}:{i}", 0, 1], []]) for i in range(3)]
    with durkv.open(str(path)) as s:
        for r in recs:
            s.append_journal("run", r)
        s.compact()
        lsns = s._journal_lsns("run", 0)
        raws = [s._b.read(lsn) for lsn in lsns]
        assert s.journal("run") == recs
    assert min(lsns) > 2                        # the copies
    assert all(U.encode() not in raw for raw in raws)
    # the segments compaction made, and an empty active segment's header rewritten by a
    # second compaction with nothing appended since, still say what they may hold
    assert set(seg_flags(path)) == {1}
    with durkv.open(str(path)) as s:
        s.compact()
        s.append_journal("run", step(f"{U}:9"))
    assert set(seg_flags(path)) == {1}
    with durkv.open(str(path), read_only=True) as s:
        assert s.journal("run") == recs + [step(f"{U}:9")] and s.verify(deep=True).ok
