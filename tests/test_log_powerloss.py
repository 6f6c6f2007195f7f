"""Power loss vs corruption in the active segment (docs/FORMAT.md sections 3 and 6).

After a power loss the unsynced end of the active segment may come back with holes:
some pages of a group commit in flight (or of async's last flush_interval) persisted,
others not. Every frame records the durable watermark ``D`` its writer knew
(``sync_gap = lsn - D``); a bad frame ``k`` followed by valid frames is corruption
only when one of them has ``D > k`` (``k`` had been synced before it was written),
otherwise everything from ``k`` on is a torn tail that the default open quarantines.

The on-disk states are built with real writers and then damaged the way a power loss
could: a page (or a frame) of the last unsynced group zeroed or left as garbage, the
frames after it intact.
"""

from __future__ import annotations

import struct
import threading

import logtools as lt
import pytest
from durkv.errors import CorruptionError
from durkv.log import SegmentLog, recover, verify

REFUSE_KINDS = {"checksum_mismatch", "bad_header", "lsn_gap"}


def _open(d, **kw):
    kw.setdefault("durability", "sync")
    return SegmentLog.open(str(d), **kw)


def _frames(d) -> dict[int, lt.Frame]:
    return {f.lsn: f for f in lt.segments(d)[-1].frames}


def _damage(path, f: lt.Frame, how: str) -> None:
    if how == "zeros":
        lt.zero_range(path, f.offset, f.end - f.offset)
    elif how == "garbage":
        lt.set_bytes(path, f.offset, lt.pseudo_random(f.end - f.offset, f.lsn))
    else:                                   # one byte of the payload: a partial page
        lt.flip_byte(path, f.offset + lt.FRAME_HDR + 3)


# ---- what the writer records -----------------------------------------------------------


def test_sync_gap_records_the_durable_watermark(tmp_path):
    d = tmp_path / "log"
    with _open(d, durability="exit") as log:
        for i in range(3):
            log.append(lt.payload(i))          # one unsynced run: D = 0
        log.flush()
        log.append_many([lt.payload(i) for i in range(3, 6)], durability="sync")  # D = 3
        log.append(lt.payload(6), durability="sync")                           # D = 6
    fr = _frames(d)
    assert [fr[i].durable for i in range(7)] == [0, 0, 0, 3, 3, 3, 6]
    assert [fr[i].sync_gap for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    # a reopened writer syncs what it found and starts from D = next_lsn
    with _open(d, durability="exit") as log:
        log.append(lt.payload(7))
        log.append(lt.payload(8))
    fr = _frames(d)
    assert [fr[i].durable for i in (7, 8)] == [7, 7]


def test_async_frames_share_the_flushers_watermark(tmp_path):
    d = tmp_path / "log"
    with _open(d, durability="async", flush_interval_ms=60_000) as log:
        log.append_many([lt.payload(i) for i in range(4)])
        log.flush()
        for i in range(4, 9):
            log.append(lt.payload(i))
        assert log.durable_lsn == 4
    fr = _frames(d)
    assert [fr[i].durable for i in range(4, 9)] == [4] * 5


# ---- a hole in the unsynced end: torn tail, automatic restart -------------------------------


def _async_power_loss(tmp_path, n_synced=5, n_unsynced=8, size=64):
    """A copy of an async log taken while its last frames are written but not synced:
    the bytes a power loss could leave (before any damage). Returns (dir, payloads,
    durable_lsn at the time of the copy)."""
    src = tmp_path / "live"
    payloads = [lt.payload(i, size) for i in range(n_synced + n_unsynced)]
    with _open(src, durability="async", flush_interval_ms=60_000) as log:
        for p in payloads[:n_synced]:
            log.append(p)
            log.flush()
        for p in payloads[n_synced:]:
            log.append(p)                       # written (async), not synced
        durable = log.durable_lsn
        assert durable == n_synced and log.next_lsn == len(payloads)
        copy = lt.copy_log(src, tmp_path / "crashed")
    return copy, payloads, durable


@pytest.mark.parametrize("how", ["zeros", "garbage", "flip"])
@pytest.mark.parametrize("victim", [0, 3])          # index into the unsynced frames
def test_hole_in_unsynced_async_tail_is_torn(tmp_path, how, victim):
    d, payloads, durable = _async_power_loss(tmp_path)
    k = durable + victim
    fr = _frames(d)
    seg = lt.segments(d)[-1]
    f = fr[k]
    _damage(seg.path, f, how)
    assert fr[len(payloads) - 1].offset > f.offset     # valid frames follow the hole
    size_before = seg.size
    tail_bytes = seg.path.read_bytes()[f.offset:]

    rep = verify(str(d))
    assert [(x.kind, x.offset) for x in rep.damage] == [("torn_tail", f.offset)]
    with pytest.raises(CorruptionError) as ei:
        _open(d, recovery="strict")
    assert ei.value.kind == "torn_tail" and ei.value.offset == f.offset

    with _open(d) as log:                               # default: tolerate_tail
        dmg = log.recovery_damage
        assert dmg is not None and dmg.kind == "torn_tail"
        assert (dmg.segment, dmg.offset) == (seg.name, f.offset)
        assert log.next_lsn == k
        got = dict(log.scan())
        assert got == {i: payloads[i] for i in range(k)}
        assert all(i in got for i in range(durable))   # every acknowledged-durable frame
        assert log.append(b"after") == k                 # the agent resumes
    assert seg.path.stat().st_size == f.offset + lt.FRAME_HDR + 5
    q = lt.quarantine_files(d)
    assert len(q) == 1 and q[0].name == f"{seg.name}.{f.offset}.torn"
    assert q[0].read_bytes() == tail_bytes
    assert f.offset + len(tail_bytes) == size_before
    assert verify(str(d)).ok


@pytest.mark.parametrize("how", ["zeros", "garbage"])
def test_page_hole_in_last_sync_group_is_torn(tmp_path, how):
    """A sync group commit in flight: a 4 KiB page in its middle lost, later pages kept."""
    d = tmp_path / "log"
    first = [lt.payload(i, 200) for i in range(10)]
    group = [lt.payload(i, 200, tag="g") for i in range(10, 60)]
    with _open(d) as log:
        for p in first:
            log.append(p)
        acked = log.durable_lsn
        log.append_many(group)                  # one group: one write, one fdatasync
    fr = _frames(d)
    assert {fr[i].durable for i in range(10, 60)} == {acked}
    seg = lt.segments(d)[-1]
    page = (fr[20].offset // 4096 + 1) * 4096
    assert fr[10].offset < page and page + 4096 < fr[59].offset
    if how == "zeros":
        lt.zero_range(seg.path, page, 4096)
    else:
        lt.set_bytes(seg.path, page, lt.pseudo_random(4096, "page"))
    k = next(f.lsn for f in fr.values() if f.offset <= page < f.end)
    with _open(d) as log:
        assert log.recovery_damage.kind == "torn_tail"
        assert log.recovery_damage.offset == fr[k].offset
        assert log.next_lsn == k
        assert dict(log.scan()) == {i: p for i, p in enumerate(first + group) if i < k}
    assert verify(str(d)).ok


def test_two_holes_in_unsynced_tail_cut_at_the_first(tmp_path):
    d, payloads, durable = _async_power_loss(tmp_path, n_unsynced=10)
    fr = _frames(d)
    seg = lt.segments(d)[-1]
    _damage(seg.path, fr[durable + 2], "zeros")
    _damage(seg.path, fr[durable + 6], "garbage")
    with _open(d) as log:
        assert log.recovery_damage.kind == "torn_tail"
        assert log.recovery_damage.offset == fr[durable + 2].offset
        assert log.next_lsn == durable + 2


def test_reader_and_point_in_time_ignore_the_torn_tail(tmp_path):
    d, payloads, durable = _async_power_loss(tmp_path)
    fr = _frames(d)
    seg = lt.segments(d)[-1]
    _damage(seg.path, fr[durable + 1], "zeros")
    before = lt.snapshot(d)
    with _open(d, read_only=True) as log:
        assert log.next_lsn == durable + 1
    with _open(d, recovery="salvage") as log:      # salvage still reads past the hole
        got = dict(log.scan())
        assert durable + 1 not in got
        assert all(got[i] == payloads[i] for i in got)
        assert set(range(durable + 2, len(payloads))) <= set(got)
    assert lt.snapshot(d) == before
    with _open(d, recovery="point_in_time") as log:
        assert log.recovery_damage.kind == "torn_tail"
        assert log.next_lsn == durable + 1
        log.append(b"x")                            # a torn tail leaves it writable


def test_recover_cuts_an_unsynced_hole_without_skip_corrupt(tmp_path):
    d, payloads, durable = _async_power_loss(tmp_path)
    fr = _frames(d)
    _damage(lt.segments(d)[-1].path, fr[durable + 2], "garbage")
    rep = recover(str(d))
    assert rep.next_lsn == durable + 2
    assert verify(str(d)).ok


def test_saturated_or_invalid_sync_gap_reads_as_unknown(tmp_path):
    """A later frame whose sync_gap is 0xFFFFFFFF (or claims D < 0) vouches for nothing."""
    d = tmp_path / "log"
    payloads = lt.make_log(d, 6, size=40, seal=False)      # synced frame by frame
    seg = lt.segments(d)[-1]
    fr = {f.lsn: f for f in seg.frames}
    for lsn, gap in ((3, 0xFFFFFFFF), (4, 0xFFFFFFFF), (5, 99)):
        lt.set_bytes(seg.path, fr[lsn].offset + 20, struct.pack("<I", gap))
        lt.fix_frame_crc(seg.path, fr[lsn].offset)
    assert all(f.durable == 0 for f in lt.segments(d)[-1].frames[3:])
    _damage(seg.path, fr[2], "flip")
    with _open(d) as log:
        assert log.recovery_damage.kind == "torn_tail"
        assert dict(log.scan()) == {i: payloads[i] for i in range(2)}


# ---- damage to synced bytes is still corruption ---------------------------------------------


@pytest.mark.parametrize("how", ["zeros", "garbage", "flip"])
def test_damage_to_a_synced_frame_is_corruption(tmp_path, how):
    d = tmp_path / "log"
    with _open(d) as log:
        for i in range(4):
            log.append(lt.payload(i))            # each synced before the next is written
        log.append_many([lt.payload(i) for i in range(4, 8)])
    fr = _frames(d)
    seg = lt.segments(d)[-1]
    assert fr[7].durable == 4 > 1
    _damage(seg.path, fr[1], how)
    size = seg.path.stat().st_size
    rep = verify(str(d))
    assert rep.damage[0].kind in REFUSE_KINDS and rep.damage[0].offset == fr[1].offset
    for mode in ("tolerate_tail", "strict"):
        with pytest.raises(CorruptionError) as ei:
            _open(d, recovery=mode)
        assert ei.value.kind != "torn_tail"
        assert (ei.value.segment, ei.value.offset) == (seg.name, fr[1].offset)
    assert seg.path.stat().st_size == size and not lt.quarantine_files(d)
    with pytest.raises(CorruptionError):
        recover(str(d))                            # needs --skip-corrupt


@pytest.mark.parametrize("victim,torn", [(2, False), (5, False), (8, True), (11, True)])
def test_group_boundary_decides(tmp_path, victim, torn):
    """Groups A (0..5) and B (6..11) under sync: B was written after A's fdatasync, so
    damage in A with B intact is corruption; damage in B, the last group, is torn."""
    d = tmp_path / "log"
    with _open(d) as log:
        log.append_many([lt.payload(i) for i in range(6)])
        log.append_many([lt.payload(i) for i in range(6, 12)])
    fr = _frames(d)
    assert {fr[i].durable for i in range(6)} == {0}
    assert {fr[i].durable for i in range(6, 12)} == {6}
    _damage(lt.segments(d)[-1].path, fr[victim], "flip")
    if torn:
        with _open(d) as log:
            assert log.recovery_damage.kind == "torn_tail"
            assert log.next_lsn == victim
    else:
        with pytest.raises(CorruptionError) as ei:
            _open(d)
        assert ei.value.kind != "torn_tail" and ei.value.offset == fr[victim].offset


def test_sealed_segment_damage_stays_corruption_whatever_sync_gap_says(tmp_path):
    d = tmp_path / "log"
    lt.make_log(d, 8, size=40, per_segment=4, seal=True, tail=2, synced=False)
    sealed = lt.segments(d)[0]
    assert sealed.sealed and {f.durable for f in sealed.frames} == {0}
    _damage(sealed.path, sealed.frames[1], "zeros")
    rep = verify(str(d))
    assert rep.damage[0].kind in REFUSE_KINDS and rep.damage[0].segment == sealed.name
    with pytest.raises(CorruptionError) as ei:
        _open(d, recovery="strict")
    assert ei.value.kind != "torn_tail"


def test_concurrent_sync_writers_record_monotone_watermarks(tmp_path):
    """Group commit with 8 threads: D never decreases along the log, never exceeds the
    frame's own LSN, and a thread's next frame always vouches for its previous one
    (it was acknowledged durable before the next was appended)."""
    d = tmp_path / "log"
    mine: dict[int, list[int]] = {}
    with _open(d) as log:
        def work(t):
            mine[t] = [log.append(lt.payload(i, 50, tag=f"t{t}-")) for i in range(60)]
        ts = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    fr = _frames(d)
    ds = [fr[i].durable for i in range(len(fr))]
    assert ds == sorted(ds) and all(x <= i for i, x in enumerate(ds))
    for lsns in mine.values():
        assert all(fr[b].durable > a for a, b in zip(lsns, lsns[1:]))
