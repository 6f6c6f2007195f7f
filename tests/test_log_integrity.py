"""Whole-log integrity beyond frame checksums (docs/FORMAT.md sections 2a and 6): a deleted
tail, a missing first or middle segment, a copied segment, misnamed files, and a reader
left open across ``recover --skip-corrupt`` (issue 7, items 2, 4, 5, 6, 14).

Logs are built with the real segment log and damaged as files (``logtools``).
"""

from __future__ import annotations

import os
import shutil

import logtools as lt
import pytest
from click.testing import CliRunner
from durkv.cli import cli
from durkv.errors import ConfigError, CorruptionError, NotFoundError, StaleReaderError
from durkv.log import SegmentLog, recover, verify

PER_SEG, N_SEALED, TAIL = 4, 3, 4          # LSN 0..11 in 3 sealed segments, 12..15 active
N_FRAMES = PER_SEG * N_SEALED + TAIL


@pytest.fixture
def work(tmp_path):
    d = tmp_path / "log"
    payloads = lt.make_log(d, PER_SEG * N_SEALED, size=40, per_segment=PER_SEG, seal=True,
                           tail=TAIL)
    assert verify(str(d)).ok
    return d, payloads


def _open(d, **kw):
    kw.setdefault("durability", "sync")
    return SegmentLog.open(str(d), **kw)


def _lost(report_or_damage):
    return [(x.kind, x.lost_first_lsn, x.lost_last_lsn) for x in lt.damages(report_or_damage)]


def _cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


# ---- item 6: the newest segments deleted -------------------------------------------------------


@pytest.mark.parametrize("n_deleted", [1, 2])
def test_deleted_newest_segments_are_detected(work, n_deleted):
    """Deleting the active segment (and the sealed one before it) leaves an intact chain:
    only HEAD can tell. It is reported like a missing middle segment, with the lost range
    starting where the remaining log ends."""
    d, payloads = work
    for p in lt.segment_files(d)[-n_deleted:]:
        p.unlink()
    end = PER_SEG * (N_SEALED + 1 - n_deleted)
    rep = verify(str(d))
    assert not rep.ok
    assert _lost(rep) == [("missing_segment", end, None)], rep.to_dict()
    before = lt.snapshot(d)
    for mode in ("strict", "tolerate_tail"):
        with pytest.raises(CorruptionError) as ei:
            _open(d, recovery=mode)
        assert ei.value.kind == "missing_segment"
        assert ei.value.context["lost_first_lsn"] == end
    for mode in ("point_in_time", "salvage"):
        with _open(d, recovery=mode) as log:
            assert log.read_only and log.next_lsn == end
            assert _lost(log.recovery_damage) == [("missing_segment", end, None)]
            assert dict(log.scan()) == {i: payloads[i] for i in range(end)}
    with _open(d, read_only=True, recovery="point_in_time") as log:
        assert log.next_lsn == end
    assert lt.snapshot(d) == before, "opening must not change a damaged log"
    plan = recover(str(d), skip_corrupt=True, dry_run=True)
    assert _lost(plan) == [("missing_segment", end, None)] and plan.next_lsn == end
    assert lt.snapshot(d) == before
    with pytest.raises(CorruptionError):
        recover(str(d))                             # not a torn tail: needs skip_corrupt
    rep = recover(str(d), skip_corrupt=True)
    assert _lost(rep) == [("missing_segment", end, None)]
    assert verify(str(d)).ok
    with _open(d) as log:
        assert log.next_lsn == end
        assert log.append(b"after") == end
    assert verify(str(d)).ok


def test_cli_verify_reports_a_deleted_tail(work):
    d, _ = work
    lt.segment_files(d)[-1].unlink()
    r = _cli("verify", d)
    assert r.exit_code == 3, r.output
    assert "missing_segment" in r.output and "lsn 12 and later unreadable" in r.output


def test_head_is_written_per_segment_not_per_commit(tmp_path):
    d = tmp_path / "log"
    with _open(d) as log:
        first = lt.read_head(d)
        ino = os.stat(d / "HEAD").st_ino
        for i in range(50):
            log.append(b"x%d" % i)
        assert os.stat(d / "HEAD").st_ino == ino, "HEAD was replaced by a commit"
        log.seal()
        head = lt.read_head(d)
        assert (head.segment_no, head.base_lsn) == (first.segment_no + 1, 50)
        assert head.log_uuid == lt.segments(d)[0].header.log_uuid and head.epoch == 0


def test_store_without_head_opens_and_gets_one(work):
    """Stores written before HEAD existed: readers open them as they are; the first
    writer's open creates HEAD naming the active segment."""
    d, payloads = work
    (d / "HEAD").unlink()
    assert verify(str(d)).ok
    with _open(d, read_only=True) as log:
        assert dict(log.scan()) == dict(enumerate(payloads))
    assert not (d / "HEAD").exists()
    with _open(d) as log:
        assert log.next_lsn == N_FRAMES
    head = lt.read_head(d)
    act = lt.segments(d)[-1]
    assert (head.segment_no, head.base_lsn) == (act.header.segment_no, act.header.base_lsn)


def test_crash_before_head_names_a_new_segment(work):
    """A crash after a segment was created but before HEAD named it: HEAD names the one
    before. Not damage (the newer segment holds no acknowledged frame); the next writer
    brings HEAD up to date."""
    d, payloads = work
    segs = lt.segments(d)
    lt.name_newest_in_head(d, segs[-2])
    assert verify(str(d)).ok
    with _open(d) as log:
        assert dict(log.scan()) == dict(enumerate(payloads))
    assert lt.read_head(d).base_lsn == segs[-1].header.base_lsn


def test_damaged_or_foreign_head_is_reported(work, tmp_path):
    d, _ = work
    lt.flip_byte(d / "HEAD", 30)
    rep = verify(str(d))
    assert [(x.segment, x.kind) for x in rep.damage] == [("HEAD", "bad_header")]
    with pytest.raises(CorruptionError):
        _open(d)
    recover(str(d), skip_corrupt=True)
    assert verify(str(d)).ok
    other = tmp_path / "other"
    lt.make_log(other, 2)
    shutil.copyfile(other / "HEAD", d / "HEAD")
    rep = verify(str(d))
    assert [(x.segment, x.kind) for x in rep.damage] == [("HEAD", "foreign_segment")]


def test_limit_head_deleted_with_the_tail_goes_unnoticed(work):
    """The documented limit (GUARANTEES.md section 5): HEAD and the newest segments deleted
    together leave a store that looks like one written before HEAD existed."""
    d, _ = work
    lt.segment_files(d)[-1].unlink()
    (d / "HEAD").unlink()
    assert verify(str(d)).ok


def test_all_segments_deleted_is_not_a_new_store(work):
    d, _ = work
    for p in lt.segment_files(d):
        p.unlink()
    rep = verify(str(d))
    assert not rep.ok and rep.damage[0].kind == "missing_segment"
    with pytest.raises(CorruptionError):
        _open(d)
    assert not lt.segment_files(d), "a writer must not start a new log over a lost one"


# ---- item 4: the lost range recover reports ----------------------------------------------------


def test_missing_middle_segment_recover_reports_exact_range(work):
    d, payloads = work
    lt.segment_files(d)[1].unlink()
    assert _lost(verify(str(d))) == [("missing_segment", PER_SEG, None)]
    plan = recover(str(d), skip_corrupt=True, dry_run=True)
    assert _lost(plan) == [("missing_segment", PER_SEG, None)] and plan.next_lsn == PER_SEG
    rep = recover(str(d), skip_corrupt=True)
    assert _lost(rep) == [("missing_segment", PER_SEG, None)] and rep.next_lsn == PER_SEG
    with _open(d) as log:
        assert log.next_lsn == PER_SEG
        assert dict(log.scan()) == {i: payloads[i] for i in range(PER_SEG)}


def test_cli_recover_dry_run_names_the_first_lost_lsn(work):
    d, _ = work
    lt.segment_files(d)[1].unlink()
    r = _cli("recover", "--skip-corrupt", "--dry-run", d)
    assert r.exit_code == 0, r.output
    assert f"lsn {PER_SEG} and later unreadable" in r.output, r.output


def test_duplicated_segment_over_its_successor_is_not_over_reported(work):
    """Segment 1's file copied over segment 2's: the loss starts at segment 2 (LSN 8), and
    the intact segment 3 is not blamed for segment 1's LSNs."""
    d, payloads = work
    files = lt.segment_files(d)
    shutil.copyfile(files[1], files[2])
    rep = verify(str(d))
    assert [(x.segment, x.kind, x.lost_first_lsn) for x in rep.damage] == \
        [(files[2].name, "bad_header", 2 * PER_SEG)], rep.to_dict()
    plan = recover(str(d), skip_corrupt=True, dry_run=True)
    assert _lost(plan) == [("bad_header", 2 * PER_SEG, None)] and plan.next_lsn == 2 * PER_SEG
    recover(str(d), skip_corrupt=True)
    with _open(d) as log:
        assert dict(log.scan()) == {i: payloads[i] for i in range(2 * PER_SEG)}


# ---- item 5: the first segment missing ---------------------------------------------------------


def test_missing_first_segment_salvage_and_recover(work):
    d, payloads = work
    lt.segment_files(d)[0].unlink()
    rest = {i: payloads[i] for i in range(PER_SEG, N_FRAMES)}
    rep = verify(str(d))
    assert _lost(rep) == [("missing_segment", 0, PER_SEG - 1)]
    with pytest.raises(CorruptionError):
        _open(d)
    for mode in ("salvage", "point_in_time"):
        with _open(d, recovery=mode) as log:
            assert log.read_only and log.start_lsn == PER_SEG
            assert dict(log.scan()) == rest
            assert _lost(log.recovery_damage) == [("missing_segment", 0, PER_SEG - 1)]
            with pytest.raises(NotFoundError):
                log.read(0)
    plan = recover(str(d), skip_corrupt=True, dry_run=True)
    assert _lost(plan) == [("missing_segment", 0, PER_SEG - 1)]
    rep = recover(str(d), skip_corrupt=True)
    assert _lost(rep) == [("missing_segment", 0, PER_SEG - 1)]
    assert verify(str(d)).ok, verify(str(d)).to_dict()
    with _open(d) as log:
        assert log.start_lsn == PER_SEG and dict(log.scan()) == rest
        assert log.append(b"next") == N_FRAMES
    assert verify(str(d)).ok
    assert list(recover(str(d), skip_corrupt=True).damage) == []


def test_cli_recover_skip_corrupt_repairs_a_missing_first_segment(work):
    d, _ = work
    lt.segment_files(d)[0].unlink()
    r = _cli("recover", "--skip-corrupt", d)
    assert r.exit_code == 0, r.output
    assert f"lsn 0..{PER_SEG - 1} unreadable" in r.output
    assert _cli("verify", d).exit_code == 0


# ---- salvage reports the hole it reads past (item 15, log side) --------------------------------


def test_salvage_with_missing_middle_segment_reports_it(work):
    d, payloads = work
    lt.segment_files(d)[1].unlink()
    with _open(d, recovery="salvage") as log:
        assert _lost(log.recovery_damage) == [("missing_segment", PER_SEG, 2 * PER_SEG - 1)]
        got = dict(log.scan())
    assert got == {i: payloads[i] for i in range(N_FRAMES) if not PER_SEG <= i < 2 * PER_SEG}


# ---- item 14: things that are not a log --------------------------------------------------------


def test_only_a_misnamed_segment_does_not_verify_ok(tmp_path):
    d = tmp_path / "log"
    d.mkdir()
    (d / "1.seg").write_bytes(b"\0" * 100)
    rep = verify(str(d))
    assert not rep.ok
    assert [(x.segment, x.kind) for x in rep.damage] == [("1.seg", "bad_header")]
    assert "not a segment file name" in rep.damage[0].detail
    r = _cli("verify", d)
    assert r.exit_code == 3 and "1.seg" in r.output and "not a segment file name" in r.output
    assert "--skip-corrupt" not in r.output
    with pytest.raises(NotFoundError):
        recover(str(d), skip_corrupt=True)


def test_opening_a_plain_file_says_so(tmp_path):
    f = tmp_path / "store"
    f.write_text("not a store")
    for ro in (False, True):
        with pytest.raises((ConfigError, NotFoundError), match="is a file, not a store directory"):
            SegmentLog.open(str(f), read_only=ro)
    assert f.read_text() == "not a store"


# ---- item 2: a reader open across a repair -----------------------------------------------------


@pytest.mark.parametrize("where", ["sealed", "active"])
def test_reader_across_recover_never_returns_a_reused_lsn(work, where):
    """A reader stays open while recover cuts the log and a writer appends new frames at
    the cut LSNs: refresh() refuses (the log is not the one it indexed), and no read of the
    old handle returns a new frame as the old LSN."""
    d, payloads = work
    reader = _open(d, read_only=True)
    assert reader.read(PER_SEG + 2) == payloads[PER_SEG + 2]
    seg = lt.segments(d)[1 if where == "sealed" else -1]
    victim = seg.frames[1]
    lt.flip_byte(seg.path, victim.offset + lt.FRAME_HDR + 3)
    recover(str(d), skip_corrupt=True)
    assert lt.read_head(d).epoch == 1
    with _open(d) as w:
        new = {w.append(b"new-%d" % i): b"new-%d" % i for i in range(N_FRAMES)}
    assert min(new) == victim.lsn
    with pytest.raises(StaleReaderError, match="repaired"):
        reader.refresh()
    for lsn in range(N_FRAMES):
        try:
            got = reader.read(lsn)
        except (CorruptionError, NotFoundError):
            continue
        assert got == payloads[lsn], f"lsn {lsn}: a frame of the repaired log came back"
    reader.close()
    with _open(d, read_only=True) as fresh:
        assert fresh.read(victim.lsn) == new[victim.lsn]


def test_reader_whose_fd_was_evicted_never_reads_a_replaced_segment(tmp_path):
    """A reader's sealed-segment fds are closed and reopened by name (at most 64 stay
    open). After recover moves a segment to quarantine/ and a writer makes a new file of
    the same name, a reopen finds another file: the read refuses (StaleReaderError) instead
    of returning the new file's frame as the old LSN."""
    d = tmp_path / "log"
    n_segs = 80
    payloads = lt.make_log(d, 2 * n_segs, size=40, per_segment=2, seal=True, tail=2)
    reader = _open(d, read_only=True)
    assert reader.read(2) == payloads[2]          # segment 1's fd is opened and cached
    for lsn in range(4, 2 * n_segs, 2):            # > 64 other segments: it is evicted
        assert reader.read(lsn) == payloads[lsn]
    seg1 = lt.segments(d)[1]
    lt.flip_byte(seg1.path, seg1.frames[0].offset + lt.FRAME_HDR + 3)
    recover(str(d), skip_corrupt=True)             # segment 1 onwards go to quarantine/
    with _open(d) as w:                            # the same name again, same-sized frames
        assert w.append(lt.payload(2, 40, "new")) == 2
        w.seal()
    assert seg1.path.exists()
    with pytest.raises(StaleReaderError, match="replaced"):
        reader.read(2)
    reader.close()
