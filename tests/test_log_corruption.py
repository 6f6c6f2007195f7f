"""Corruption detection, recovery modes and ``recover`` (docs/FORMAT.md section 6).

The pristine logs are built once per module and copied per case; damage is
done with ``logtools`` byte surgery, located by parsing the files directly.
"""

from __future__ import annotations

import shutil
import struct

import logtools as lt
import pytest
from durkv.errors import (
    CorruptionError,
    DurkvError,
    NotFoundError,
    ReadOnlyError,
    StoreLockedError,
)
from durkv.log import SegmentLog, recover, verify

N_SEALED, PER_SEG, TAIL = 3, 4, 4          # LSN 0..11 in 3 sealed segments, 12..15 active
N_FRAMES = N_SEALED * PER_SEG + TAIL
REFUSE_KINDS = {"checksum_mismatch", "bad_header", "lsn_gap", "missing_segment",
                "foreign_segment", "bad_seal", "broken_chain"}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    d = tmp_path_factory.mktemp("pristine") / "log"
    payloads = lt.make_log(d, N_SEALED * PER_SEG, size=40, per_segment=PER_SEG, seal=True,
                           tail=TAIL)
    segs = lt.segments(d)
    assert [s.sealed for s in segs] == [True] * N_SEALED + [False]
    assert [len(s.frames) for s in segs] == [PER_SEG] * N_SEALED + [TAIL]
    rep = verify(str(d))
    assert rep.ok and rep.frames_ok == N_FRAMES and rep.next_lsn == N_FRAMES, rep.to_dict()
    return d, payloads


@pytest.fixture
def work(pristine, tmp_path):
    src, payloads = pristine
    return lt.copy_log(src, tmp_path / "log"), payloads


def _open(d, **kw):
    kw.setdefault("durability", "sync")
    return SegmentLog.open(str(d), **kw)


def _readable(log) -> dict[int, bytes]:
    return dict(log.scan())


# ---- every byte ---------------------------------------------------------------------------


def test_flip_every_byte_is_reported(tmp_path):
    src = tmp_path / "log"
    lt.make_log(src, 9, size=16, per_segment=3, seal=True, tail=3)
    segs = lt.segments(src)
    assert [s.sealed for s in segs] == [True, True, True, False]
    assert verify(str(src)).ok
    misses = []
    for si, seg in enumerate(segs):
        active = si == len(segs) - 1
        original = seg.path.read_bytes()
        for off in range(seg.size):
            lt.flip_byte(seg.path, off, 1 << (off % 8))
            try:
                rep = verify(str(src))
            finally:
                lt.set_bytes(seg.path, off, original[off:off + 1])
            start, end = seg.structure_at(off)
            mine = [d for d in rep.damage if d.segment == seg.name]
            in_last_frame = active and seg.frames and off >= seg.frames[-1].offset
            if not mine:
                misses.append((seg.name, off, "not reported", rep.to_dict()))
                continue
            if not in_last_frame and rep.ok:
                misses.append((seg.name, off, "ok is True", rep.to_dict()))
            if not any(start <= d.offset < end or d.offset <= off for d in mine):
                where = f"offsets {[d.offset for d in mine]} outside [{start},{end})"
                misses.append((seg.name, off, where, None))
            if (active and off >= lt.HEADER_LEN and not in_last_frame
                    and any(d.kind == "torn_tail" for d in mine)):
                misses.append((seg.name, off, "mid-segment damage called torn_tail", None))
            if active and not in_last_frame:
                # damage in the active segment is found at open, not just by verify
                lt.flip_byte(seg.path, off, 1 << (off % 8))
                try:
                    SegmentLog.open(str(src), read_only=True).close()
                    misses.append((seg.name, off, "read-only open accepted it", None))
                except CorruptionError:
                    pass
                finally:
                    lt.set_bytes(seg.path, off, original[off:off + 1])
    assert not misses, f"{len(misses)} undetected/misplaced flips, first: {misses[:5]}"


# ---- structural damage ---------------------------------------------------------------------


def test_zeroed_page_mid_active_segment_is_corruption(tmp_path):
    """make_log syncs frame by frame: the frames after the zeroed page record (sync_gap)
    that it had been synced before they were written, so it is not a torn write
    (FORMAT.md section 6; the power-loss counterpart is in test_log_powerloss.py)."""
    d = tmp_path / "log"
    payloads = lt.make_log(d, 4, size=100, seal=True, tail=150, tag="z")
    act = lt.segments(d)[-1]
    assert act.size > 3 * 4096
    lt.zero_range(act.path, 4096, 4096)
    victim = next(f for f in act.frames if f.offset <= 4096 < f.end)
    rep = verify(str(d))
    assert not rep.ok
    assert rep.damage[0].kind != "torn_tail"
    assert rep.damage[0].segment == act.name
    assert rep.damage[0].offset == victim.offset
    with pytest.raises(CorruptionError) as ei:
        _open(d, recovery="tolerate_tail")
    assert ei.value.kind != "torn_tail"
    assert (ei.value.segment, ei.value.offset) == (act.name, victim.offset)
    # the reader must not have truncated anything
    assert act.path.stat().st_size == act.size
    with _open(d, recovery="salvage") as log:
        got = _readable(log)
    assert all(got[k] == payloads[k] for k in got)
    assert got.keys() >= {f.lsn for f in act.frames if f.offset >= 8192}


def test_zeroed_page_in_sealed_segment(tmp_path):
    d = tmp_path / "log"
    lt.make_log(d, 60, size=200, per_segment=30, seal=True)
    seg = lt.segments(d)[0]
    lt.zero_range(seg.path, 2048, 1024)
    victim = next(f for f in seg.frames if f.offset <= 2048 < f.end)
    rep = verify(str(d))
    assert not rep.ok and rep.damage[0].segment == seg.name
    assert rep.damage[0].kind in REFUSE_KINDS
    assert rep.damage[0].offset == victim.offset
    try:
        log = _open(d)
    except CorruptionError as e:
        assert e.segment == seg.name
    else:
        with log, pytest.raises(CorruptionError) as ei:
            log.read(victim.lsn)
        assert (ei.value.segment, ei.value.offset) == (seg.name, victim.offset)


def test_foreign_segment(tmp_path, pristine):
    src, _ = pristine
    a = lt.copy_log(src, tmp_path / "a")
    b = tmp_path / "b"
    lt.make_log(b, N_SEALED * PER_SEG, size=40, per_segment=PER_SEG, seal=True, tail=TAIL)
    name = lt.segment_files(a)[1].name
    assert (b / name).exists()
    shutil.copyfile(b / name, a / name)
    rep = verify(str(a))
    assert not rep.ok
    assert any(d.kind == "foreign_segment" and d.segment == name for d in rep.damage), \
        rep.to_dict()
    with pytest.raises(CorruptionError) as ei:
        _open(a)
    assert ei.value.kind == "foreign_segment" and ei.value.segment == name


def test_missing_middle_segment(work):
    d, _ = work
    gone = lt.segment_files(d)[1]
    gone.unlink()
    rep = verify(str(d))
    assert not rep.ok
    assert rep.damage[0].kind in ("missing_segment", "lsn_gap"), rep.to_dict()
    assert rep.damage[0].lost_first_lsn == PER_SEG
    with pytest.raises(CorruptionError) as ei:
        _open(d)
    assert ei.value.kind in ("missing_segment", "lsn_gap")


def test_missing_first_segment(work):
    d, _ = work
    lt.segment_files(d)[0].unlink()
    assert not verify(str(d)).ok
    with pytest.raises(CorruptionError):
        _open(d)


def test_swapped_segments(work):
    d, _ = work
    s1, s2 = lt.segment_files(d)[1:3]
    tmp = d / "swap.tmp"
    s1.rename(tmp)
    s2.rename(s1)
    tmp.rename(s2)
    rep = verify(str(d))
    assert not rep.ok
    assert rep.damage[0].segment in (s1.name, s2.name)
    with pytest.raises(CorruptionError):
        _open(d)


def test_truncated_sealed_segment(work):
    d, _ = work
    seg = lt.segments(d)[1]
    lt.truncate(seg.path, seg.frames[2].offset + 7)
    rep = verify(str(d))
    assert not rep.ok and rep.damage[0].segment == seg.name
    with pytest.raises(CorruptionError) as ei:
        _open(d, recovery="tolerate_tail")
    assert ei.value.segment == seg.name


def test_sealed_segment_truncated_to_zero(work):
    d, _ = work
    seg = lt.segment_files(d)[1]
    lt.truncate(seg, 0)
    assert not verify(str(d)).ok
    with pytest.raises(CorruptionError):
        _open(d)


def test_bad_seal_magic(work):
    d, _ = work
    seg = lt.segments(d)[0]
    lt.flip_byte(seg.path, seg.trailer.offset)
    rep = verify(str(d))
    assert not rep.ok and rep.damage[0].segment == seg.name
    with pytest.raises(CorruptionError):
        _open(d)


def test_chain_mismatch_between_intact_segments(work):
    """Segment 1 replaced by a same-UUID segment of different content: each file is
    internally valid, only the digest chain can tell."""
    d, _ = work
    seg = lt.segments(d)[1]
    data = bytearray(seg.path.read_bytes())
    # rewrite one payload byte and fix the frame CRC, the digest and the trailer CRC
    f = seg.frames[0]
    data[f.offset + lt.FRAME_HDR] ^= 0x20
    seed = seg.header.seed
    body = bytes(data[f.offset + 4:f.end])
    struct.pack_into("<I", data, f.offset, lt.crc32c(seed, body))
    tr = seg.trailer
    struct.pack_into("<I", data, tr.offset + 40, lt.crc32c(seed, bytes(data[:tr.data_end])))
    struct.pack_into("<I", data, tr.offset + 44,
                     lt.crc32c(seed, bytes(data[tr.data_end:tr.offset + 44])))
    seg.path.write_bytes(bytes(data))
    assert lt.read_segment(seg.path).frames[0].crc == lt.crc32c(seed, body)
    rep = verify(str(d))
    assert not rep.ok, "a rewritten sealed segment must break the digest chain"
    assert any(x.kind in ("broken_chain", "foreign_segment", "bad_header", "bad_seal")
               for x in rep.damage), rep.to_dict()
    with pytest.raises(CorruptionError):
        _open(d)


def test_stale_frame_from_earlier_log_at_same_path(tmp_path):
    d = tmp_path / "log"
    lt.make_log(d, 6, size=40, seal=False, tag="old")
    _, stale = lt.frame_at(d, 3)
    stale_bytes = (lt.segment_files(d)[0]).read_bytes()[stale.offset:stale.end]
    shutil.rmtree(d)
    new = lt.make_log(d, 3, size=40, seal=False, tag="new")
    seg = lt.segment_files(d)[0]
    with open(seg, "ab") as fh:
        fh.write(stale_bytes)          # right offset, right LSN (3), old log's bytes
    rep = verify(str(d))
    assert rep.next_lsn == 3 and rep.frames_ok == 3
    with _open(d) as log:
        assert log.next_lsn == 3
        with pytest.raises(NotFoundError):
            log.read(3)
        assert log.append(b"fresh") == 3
    with _open(d) as log:
        assert _readable(log) == {0: new[0], 1: new[1], 2: new[2], 3: b"fresh"}


def test_stale_frame_from_other_segment_of_same_log(work):
    """A valid frame of segment 0 copied into segment 2 at the slot of its own LSN
    fails the segment-seeded checksum (misdirected write)."""
    d, _ = work
    s0, _, s2 = lt.segments(d)[:3]
    src = s0.frames[1]
    dst = s2.frames[1]
    raw = bytearray(s0.path.read_bytes()[src.offset:src.end])
    struct.pack_into("<Q", raw, 8, dst.lsn)        # the LSN it would need ...
    lt.set_bytes(s2.path, dst.offset, bytes(raw))  # ... but segment 0's seed
    rep = verify(str(d))
    assert not rep.ok
    assert rep.damage[0].segment == s2.name and rep.damage[0].offset == dst.offset


# ---- recovery modes x damage x position -----------------------------------------------------

POSITIONS = {"first": (0, 1), "middle": (1, 2), "last": (3, 1)}   # (segment index, frame index)


def _damage(d, how, pos):
    si, fi = POSITIONS[pos]
    seg = lt.segments(d)[si]
    f = seg.frames[fi]
    if how == "flip":
        lt.flip_byte(seg.path, f.offset + lt.FRAME_HDR + 5)
    elif how == "zero":
        lt.zero_range(seg.path, f.offset, lt.FRAME_HDR)
    elif how == "garbage":
        lt.set_bytes(seg.path, f.offset + 2, lt.pseudo_random(30, 3))
    elif how == "truncate":
        lt.truncate(seg.path, f.offset + 9)
    return seg, f


def _lost(how, pos, f) -> set[int]:
    si, _ = POSITIONS[pos]
    if how == "truncate":
        last = (si + 1) * PER_SEG if si < N_SEALED else N_FRAMES
        return set(range(f.lsn, last))
    return {f.lsn}


CASES = [(h, p) for h in ("flip", "zero", "garbage") for p in POSITIONS] + \
        [("truncate", "first"), ("truncate", "middle")]


def _deferred(how, pos) -> bool:
    """Frame damage inside a sealed segment: open reads only the trailers (FORMAT.md
    section 4), so the damage may be found at the first read instead of at open."""
    return POSITIONS[pos][0] < N_SEALED and how in ("flip", "zero", "garbage")


def _assert_caught_on_read(log, seg, f, payloads):
    """Open accepted the log: every frame before the damage reads, the damaged one
    raises CorruptionError naming the place, and a scan stops there with an error."""
    for i in range(f.lsn):
        assert log.read(i) == payloads[i]
    with pytest.raises(CorruptionError) as ei:
        log.read(f.lsn)
    assert (ei.value.segment, ei.value.offset) == (seg.name, f.offset)
    assert ei.value.kind in REFUSE_KINDS
    seen = []
    with pytest.raises(CorruptionError):
        for lsn, p in log.scan():
            assert p == payloads[lsn]
            seen.append(lsn)
    assert seen == list(range(f.lsn))


@pytest.mark.parametrize("how,pos", CASES)
@pytest.mark.parametrize("mode", ["strict", "tolerate_tail", "point_in_time", "salvage"])
def test_recovery_modes(work, how, pos, mode):
    d, payloads = work
    seg, f = _damage(d, how, pos)
    before = lt.snapshot(d)
    k = f.lsn
    if mode in ("strict", "tolerate_tail"):
        try:
            log = _open(d, recovery=mode)
        except CorruptionError as e:
            assert e.segment == seg.name
            assert e.kind in REFUSE_KINDS
            assert e.offset <= f.end
        else:
            with log:
                assert _deferred(how, pos), f"{mode} open accepted a corrupt log"
                _assert_caught_on_read(log, seg, f, payloads)
        assert lt.snapshot(d) == before, "opening a corrupt log must not touch the files"
        return
    with _open(d, recovery=mode) as log:
        if mode == "point_in_time" and _deferred(how, pos) and log.next_lsn == N_FRAMES:
            _assert_caught_on_read(log, seg, f, payloads)
        else:
            got = _readable(log)
            assert all(got[i] == payloads[i] for i in got), "wrong bytes returned"
            if mode == "point_in_time":
                assert got.keys() == set(range(k)), "point_in_time must be a gap-free prefix"
                assert log.next_lsn == k
                dmg = lt.damages(log.recovery_damage)
                assert dmg and dmg[0].lost_first_lsn == k
                assert dmg[0].segment == seg.name
                assert dmg[0].lost_last_lsn is None or dmg[0].lost_last_lsn >= k
            else:
                assert got.keys() == set(range(N_FRAMES)) - _lost(how, pos, f)
            with pytest.raises(DurkvError):
                log.read(k)
            with pytest.raises(ReadOnlyError):
                log.append(b"no")
    assert lt.snapshot(d) == before, f"{mode} open of a corrupt log changed bytes"


@pytest.mark.parametrize("how,pos", CASES)
def test_damage_is_not_blamed_on_other_segments(work, how, pos):
    """One damaged segment yields findings about that segment only: the intact
    segments after it must not be reported as missing or out of sequence."""
    d, _ = work
    seg, f = _damage(d, how, pos)
    rep = verify(str(d))
    assert not rep.ok
    assert {x.segment for x in rep.damage} == {seg.name}, rep.to_dict()["damage"]
    first = rep.damage[0]
    assert first.lost_first_lsn == f.lsn, "frames before the damage are intact"


def test_point_in_time_on_torn_tail_is_a_writer(work):
    d, _ = work
    act = lt.segments(d)[-1]
    lt.truncate(act.path, act.frames[-1].offset + 3)
    with _open(d, recovery="point_in_time") as log:
        assert log.next_lsn == N_FRAMES - 1
        assert log.append(b"ok") == N_FRAMES - 1


# ---- recover ------------------------------------------------------------------------------------


def test_recover_torn_tail_quarantines_truncates_idempotent(work):
    d, _ = work
    act = lt.segments(d)[-1]
    last = act.frames[-1]
    original = act.path.read_bytes()
    lt.truncate(act.path, last.end - 4)
    total = lt.total_bytes(d)
    before = lt.snapshot(d)
    plan = recover(str(d), dry_run=True)
    assert [x.kind for x in plan.damage] == ["torn_tail"]
    assert lt.snapshot(d) == before, "dry_run changed bytes"
    rep = recover(str(d))
    assert [x.kind for x in rep.damage] == ["torn_tail"]
    assert rep.damage[0].offset == last.offset
    assert act.path.stat().st_size == last.offset
    assert [p.read_bytes() for p in lt.quarantine_files(d)] == [original[last.offset:last.end - 4]]
    assert lt.total_bytes(d) >= total
    assert verify(str(d)).ok
    after = lt.snapshot(d)
    again = recover(str(d))
    assert again.damage == [] or list(again.damage) == []
    assert lt.snapshot(d) == after, "second recover changed bytes"
    with _open(d) as log:
        assert log.next_lsn == N_FRAMES - 1
        assert log.append(b"next") == N_FRAMES - 1


def test_recover_clean_log_is_noop(work):
    d, _ = work
    before = lt.snapshot(d)
    rep = recover(str(d))
    assert rep.ok and list(rep.damage) == []
    assert lt.snapshot(d) == before


@pytest.mark.parametrize("pos", list(POSITIONS))
def test_recover_refuses_mid_log_corruption(work, pos):
    d, _ = work
    _damage(d, "flip", pos)
    before = lt.snapshot(d)
    try:
        rep = recover(str(d))
    except CorruptionError:
        pass
    else:
        assert not rep.ok, "recover without skip_corrupt must not pass mid-log damage"
    assert lt.snapshot(d) == before


@pytest.mark.parametrize("how,pos", CASES)
def test_recover_skip_corrupt(work, how, pos):
    d, payloads = work
    seg, f = _damage(d, how, pos)
    total = lt.total_bytes(d)
    before = lt.snapshot(d)
    plan = recover(str(d), skip_corrupt=True, dry_run=True)
    assert plan.damage and plan.damage[0].segment == seg.name
    assert lt.snapshot(d) == before, "dry_run changed bytes"
    rep = recover(str(d), skip_corrupt=True)
    assert rep.damage and rep.damage[0].segment == seg.name
    assert lt.total_bytes(d) >= total, "recover dropped bytes without a copy"
    assert lt.quarantine_files(d)
    assert verify(str(d)).ok, verify(str(d)).to_dict()
    after = lt.snapshot(d)
    again = recover(str(d), skip_corrupt=True)
    assert list(again.damage) == []
    assert lt.snapshot(d) == after
    with _open(d) as log:
        got = _readable(log)
        n = log.next_lsn
        assert n >= f.lsn
        assert got.keys() == set(range(n)), "after recover the log is a gap-free prefix"
        assert all(got[i] == payloads[i] for i in got)
        assert log.append(b"continues") == n
    with _open(d) as log:
        assert log.read(n) == b"continues"
    assert verify(str(d)).ok


def test_recover_refuses_while_a_writer_holds_the_lock(work):
    d, _ = work
    with _open(d) as log:
        log.append(b"live")
        before = lt.snapshot(d)
        with pytest.raises(StoreLockedError):
            recover(str(d))
        assert lt.snapshot(d) == before
        assert verify(str(d)).ok          # verify takes no lock


def test_recover_missing_directory(tmp_path):
    with pytest.raises(NotFoundError):
        recover(str(tmp_path / "nope"))
