"""`durkv verify --deep` follows the references between records (FORMAT.md 5 `jref`, 5a
`ir` places): each must name what it says it names, or the frame holding it is reported
(`broken_chain`, with what it names). A compaction's copies may name copies written after
them -- checked once its END is there, passed over when it was abandoned (dead copies).

Real logs: frames written through the C log as a store would write them, and real agent
stores (tests/test_journal_shared.py runs the durable agent and its compactions under
SIGKILL with the same deep verify).
"""

from __future__ import annotations

import msgpack
import pytest
from click.testing import CliRunner

import durkv.log
from durkv.cli.main import cli
from durkv.payload import FULL, JREF_MAGIC, CommitEntry, encode_commit, pack_jref
from durkv.store.records import (K_COMPACT_BEGIN, K_COMPACT_END, K_COPY_CKPT, K_COPY_JOURNAL,
                                 K_JOURNAL, K_WRITES)

RESULT = b"0123456789"


def _frame(log, head: list, entries=()) -> int:
    return log.append(encode_commit(msgpack.packb(head, use_bin_type=True), entries),
                      frame_type=durkv.log.FRAME_COMMIT)


def _write(log, items: list) -> int:
    """A pending write of thread t whose list value is an entry of ``items``."""
    return _frame(log, [K_WRITES, "t", "", "c1", "task", "", False, [[0, "messages", 0]]],
                  [CommitEntry(FULL, items)])


def _journal(log, rec: dict, kind: int = K_JOURNAL, run="r") -> int:
    return _frame(log, [kind, run, rec])


def _details(path) -> list[str]:
    rep = durkv.log.verify(str(path), deep=True)
    assert rep.ok == (not rep.damage)
    return [d.detail for d in rep.damage if d.kind == "broken_chain"]


@pytest.fixture
def log_with_a_result(tmp_path):
    """A log whose frame 0 is a journal record with a 10-byte result, frame 1 one without,
    frame 2 a pending write of three items; returns (path, log)."""
    path = tmp_path / "l"
    log = durkv.log.SegmentLog.open(str(path))
    assert _journal(log, {"e": 2, "s": "0", "r": RESULT}) == 0
    assert _journal(log, {"e": 8, "st": "running"}) == 1
    assert _write(log, [b"a" * 8, b"b" * 8, b"c" * 8]) == 2
    yield path, log
    log.close()


JREFS = {
    "the whole result": (pack_jref(0), None),
    "a slice with bytes around it": (pack_jref(0, 2, 10, b"<", b">"), None),
    "an empty slice": (pack_jref(0, 10, 10, b"x", b""), None),
    "a record without a result": (pack_jref(1), "a journal record without a result"),
    "a pending write": (pack_jref(2), "which is not a journal record"),
    "no frame the log holds": (pack_jref(10 ** 9), "not an earlier one"),
    "a later frame": (pack_jref(4), "not an earlier one"),
    "past the result": (pack_jref(0, 2, 11, b"", b""), "slices [2:11] of frame 0's result"),
    "bytes that do not decode": (JREF_MAGIC + b"\x92\x01", "a jref item that does not decode"),
    "a slice that runs backwards": (pack_jref(0, 5, 3), "a jref item that does not decode"),
    "trailing bytes": (pack_jref(0) + b"\x00", "a jref item that does not decode"),
}


@pytest.mark.parametrize("case", JREFS)
def test_a_jref_item_must_name_a_journal_result(log_with_a_result, case):
    path, log = log_with_a_result
    item, problem = JREFS[case]
    at = _write(log, [b"plain item", item])
    _journal(log, {"e": 2, "s": "1", "r": b"later"})        # frame 4
    log.flush()
    got = _details(path)
    if problem is None:
        assert got == []
    else:
        assert len(got) == 1 and problem in got[0], got
        rep = durkv.log.verify(str(path), deep=True)
        assert rep.damage[0].lost_first_lsn == at
    assert durkv.log.verify(str(path)).ok        # without --deep: not looked at


PLACES = {
    "an item of a list entry": ([2, 0, 2], None),
    "past the entry's items": ([2, 0, 3], "names item 3 of entry 0 of frame 2, which has 3"),
    "an entry the frame lacks": ([2, 1, 0], "names entry 1 of frame 2, which is not a list"),
    "a journal record": ([0, 0, 0], "names entry 0 of frame 0, which is not a list"),
    "a later frame": ([9, 0, 0], "an ir place names frame 9, not an earlier one"),
}


@pytest.mark.parametrize("case", PLACES)
def test_an_ir_place_must_name_an_item_of_a_list_entry(log_with_a_result, case):
    path, log = log_with_a_result
    place, problem = PLACES[case]
    _journal(log, {"e": 2, "s": "2", "ir": [[1], None, [place, b"\x01\x80", ["0", 0]]]})
    log.flush()
    got = _details(path)
    assert got == [] if problem is None else len(got) == 1 and problem in got[0], got


def _compaction(log, end: bool) -> None:
    """A compaction's copies as compact() writes them: a checkpoint copy whose item names
    the journal record's copy, written after it; END only if ``end``."""
    begin = _frame(log, [K_COMPACT_BEGIN])
    journal_copy = begin + 2
    _frame(log, [K_COPY_CKPT, "t", "", "c1", None, b"", b"", {}, {"messages": [begin + 1, 0]}],
           [CommitEntry(FULL, [pack_jref(journal_copy)])])
    assert _journal(log, {"e": 2, "s": "0", "r": RESULT}, K_COPY_JOURNAL, ["r", "r2"]) \
        == journal_copy
    if end:
        _frame(log, [K_COMPACT_END, begin])


def test_a_finished_compaction_may_name_its_later_copies(log_with_a_result):
    path, log = log_with_a_result
    _compaction(log, end=True)
    log.flush()
    assert _details(path) == []


def test_an_abandoned_compactions_copies_are_not_read(log_with_a_result):
    """A crash before END leaves dead copies whose forward references name LSNs the log
    then gives to other records: not damage (nothing reads them)."""
    path, log = log_with_a_result
    _compaction(log, end=False)
    # the copy's jref named frame begin + 2; after a crash the next writer's frames take
    # the LSNs after: here a pending write where the copy expected its journal record
    _frame(log, [K_COMPACT_BEGIN])                    # a new compaction abandons the first
    _write(log, [b"x" * 8])
    log.flush()
    assert _details(path) == []


def test_a_forward_reference_outside_a_compaction_is_damage(log_with_a_result):
    path, log = log_with_a_result
    _write(log, [pack_jref(4)])                      # frame 3 names frame 4
    _journal(log, {"e": 2, "s": "1", "r": RESULT})  # frame 4: a result, but written after
    log.flush()
    got = _details(path)
    assert len(got) == 1 and "names frame 4, not an earlier one" in got[0]


def test_cli_verify_deep_reports_a_broken_reference(log_with_a_result):
    path, log = log_with_a_result
    _write(log, [pack_jref(2)])
    log.flush()
    res = CliRunner().invoke(cli, ["verify", "--deep", str(path)])
    assert res.exit_code == 3 and "which is not a journal record" in res.output, res.output
    assert CliRunner().invoke(cli, ["verify", str(path)]).exit_code == 0


def test_hostile_heads_and_items_are_reported_or_passed_never_misread(tmp_path):
    """Journal heads and jref items with random bytes flipped or cut (CRC-valid frames, as a
    buggy writer would write them): verify reads each in bounds and returns a report."""
    import random
    rnd = random.Random(7)
    rec = {"e": 2, "s": "0", "r": RESULT, "ir": [[1, -1], ["0", 0, 1], [[0, 0, 0], b"\x01"]]}
    good_head = msgpack.packb([K_JOURNAL, "r", rec], use_bin_type=True)
    good_item = pack_jref(0, 1, 5, b"pre", b"post")
    path = tmp_path / "l"
    with durkv.log.SegmentLog.open(str(path)) as log:
        _journal(log, {"e": 2, "s": "0", "r": RESULT})
        for _ in range(400):
            head, item = bytearray(good_head), bytearray(good_item)
            for b in (head, item):
                for _ in range(rnd.randint(1, 3)):
                    b[rnd.randrange(len(b))] = rnd.randrange(256)
            item[:4] = JREF_MAGIC
            cut = rnd.randrange(len(head) + 1)
            log.append(encode_commit(bytes(head[:cut] if rnd.random() < 0.3 else head), ()),
                       frame_type=durkv.log.FRAME_COMMIT)
            _write(log, [bytes(item[:rnd.randrange(4, len(item) + 1)])])
    rep = durkv.log.verify(str(path), deep=True)
    assert rep.frames_ok == 801 and rep.damage       # found, each named by its frame
    assert all(d.kind == "broken_chain" and d.lost_first_lsn is not None for d in rep.damage)
