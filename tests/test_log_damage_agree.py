"""open, verify and recover treat the same damage the same way (csrc/damage.c decides).

The torn-tail-versus-corruption decision, the chain check and the HEAD check used to be
written twice (open.c and verify.c) and had drifted: the same bytes got a different
offset or different words depending on who looked. For each kind of damage, the finding
``open`` reports (``recovery_damage`` under point_in_time, read-only so nothing is
repaired) must be verify's first finding: same segment, offset, kind and detail.
"""

from __future__ import annotations

import logtools as lt
import pytest
from durkv.log import SegmentLog, recover, verify

N_SEALED, PER_SEG, TAIL = 3, 4, 4          # LSN 0..11 in 3 sealed segments, 12..15 active


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    d = tmp_path_factory.mktemp("pristine") / "log"
    lt.make_log(d, N_SEALED * PER_SEG, size=40, per_segment=PER_SEG, seal=True, tail=TAIL)
    return d


def _torn_tail(d):
    active = lt.segments(d)[-1]
    lt.truncate(active.path, active.frames[-1].offset + 10)


def _active_corruption(d):
    active = lt.segments(d)[-1]
    lt.flip_byte(active.path, active.frames[1].offset + 30)


def _sealed_corruption(d):
    seg = lt.segments(d)[1]
    lt.flip_byte(seg.path, seg.frames[2].offset + 30)


def _missing_segment(d):
    lt.segments(d)[1].path.unlink()


def _foreign_head(d):
    h = lt.read_head(d)
    lt.write_head(d, lt.Head(bytes(16), h.segment_no, h.base_lsn, h.epoch))


def _head_names_missing_tail(d):
    lt.segments(d)[-1].path.unlink()


@pytest.mark.parametrize("damage", [_torn_tail, _active_corruption, _sealed_corruption,
                                    _missing_segment, _foreign_head, _head_names_missing_tail])
def test_open_and_verify_report_the_same_finding(pristine, tmp_path, damage):
    d = lt.copy_log(pristine, tmp_path / "log")
    damage(d)
    rep = verify(str(d))
    assert rep.damage, rep.to_dict()
    with SegmentLog.open(str(d), recovery="point_in_time", read_only=True) as log:
        found = log.recovery_damage
    assert found is not None
    first = rep.damage[0]
    assert (found.segment, found.offset, found.kind, found.detail) == \
        (first.segment, first.offset, first.kind, first.detail)


@pytest.mark.parametrize("head_names_it", [True, False])
def test_recover_moves_a_torn_segment_header_whole_as_open_does(tmp_path, head_names_it):
    """The newest segment torn within its header (a crash while creating it) is a torn tail.
    open (a writer) moves the file to quarantine/ whole; recover used to cut it to 0 bytes
    in place, which verify still reported as a torn tail, forever."""
    d = tmp_path / "log"
    lt.make_log(d, 2 * PER_SEG, size=40, per_segment=PER_SEG, seal=True)
    *sealed, newest = lt.segments(d)        # the seal created the newest, empty segment
    assert not newest.frames and sealed[-1].sealed
    newest.path.write_bytes(newest.path.read_bytes()[:30])
    h = lt.read_head(d)
    assert h.base_lsn == newest.header.base_lsn
    if not head_names_it:                   # the crash came before HEAD named the new file
        lt.name_newest_in_head(d, sealed[-1])
    before = verify(str(d))
    assert [x.kind for x in before.damage] == ["torn_tail"], before.to_dict()
    recover(str(d))
    assert verify(str(d)).ok, verify(str(d)).to_dict()
    assert not newest.path.exists()
    assert [q.name for q in lt.quarantine_files(d)] == [f"{newest.name}.0.torn"]
    assert lt.read_head(d).epoch == h.epoch       # no LSN changed: readers stay current
    with SegmentLog.open(str(d), durability="sync") as log:
        assert log.next_lsn == 2 * PER_SEG and log.append(b"x") == 2 * PER_SEG
    assert verify(str(d)).ok
