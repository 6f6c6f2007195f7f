"""Reader cases for the segment log, after LevelDB's ``db/log_test.cc``.

Each test builds a log through the API, damages it with the byte-surgery
helpers of ``logtools`` (which parse docs/FORMAT.md on their own) and checks
both what reads back and what is reported.
"""

from __future__ import annotations

import os
import struct

import logtools as lt
import pytest
from durkv.errors import (
    ConfigError,
    CorruptionError,
    DurkvError,
    NotFoundError,
    ReadOnlyError,
    StoreLockedError,
)
from durkv.log import FRAME_COMMIT, FRAME_DATA, SegmentLog, verify


def open_log(path, **kw):
    kw.setdefault("durability", "sync")
    return SegmentLog.open(str(path), **kw)


def assert_reads(log, payloads, upto=None):
    upto = len(payloads) if upto is None else upto
    for i in range(upto):
        assert log.read(i) == payloads[i], f"lsn {i}"
    assert [(lsn, p) for lsn, p in log.scan()] == list(enumerate(payloads[:upto]))


# ---- happy path ---------------------------------------------------------------------


def test_empty_log(log_dir):
    with open_log(log_dir) as log:
        assert log.next_lsn == 0
        assert log.start_lsn == 0
        assert list(log.scan()) == []
        with pytest.raises(NotFoundError):
            log.read(0)
    assert len(lt.segment_files(log_dir)) == 1
    with open_log(log_dir) as log:
        assert log.next_lsn == 0
        assert list(log.scan()) == []
    rep = verify(str(log_dir))
    assert rep.ok, rep.to_dict()
    assert rep.frames_ok == 0 and rep.next_lsn == 0


def test_read_write_including_empty_payload(log_dir):
    data = [b"foo", b"", b"bar", b"x" * 10000, b"\x00" * 7]
    with open_log(log_dir) as log:
        assert [log.append(p) for p in data] == list(range(len(data)))
        assert log.next_lsn == len(data)
        assert log.durable_lsn == len(data)
        assert_reads(log, data)
    with open_log(log_dir) as log:
        assert_reads(log, data)


def test_frame_types_round_trip(log_dir):
    with open_log(log_dir) as log:
        a = log.append(b"data")
        c = log.append(b"commit", frame_type=FRAME_COMMIT)
        assert log.read_frame(a) == (FRAME_DATA, b"data")
        assert log.read_frame(c) == (FRAME_COMMIT, b"commit")
    with open_log(log_dir) as log:
        assert log.read_frame(c) == (FRAME_COMMIT, b"commit")


def test_append_many_is_contiguous(log_dir):
    with open_log(log_dir) as log:
        log.append(b"first")
        lsns = log.append_many([b"a", b"b", b"c"])
        assert lsns == [1, 2, 3]
        assert log.read(3) == b"c"


def test_reopen_and_append(log_dir):
    payloads = lt.make_log(log_dir, 5, seal=False)
    with open_log(log_dir) as log:
        assert log.next_lsn == 5
        assert log.append(b"more") == 5
    with open_log(log_dir) as log:
        assert_reads(log, payloads + [b"more"])


def test_read_from_middle(log_dir):
    payloads = lt.make_log(log_dir, 12, per_segment=4, seal=False)
    with open_log(log_dir, read_only=True) as log:
        for k in (0, 3, 4, 5, 11):
            assert list(log.scan(from_lsn=k)) == list(enumerate(payloads))[k:]
        assert list(log.scan(from_lsn=12)) == []
        with pytest.raises(NotFoundError):
            log.read(12)
        with pytest.raises(NotFoundError):
            log.read(10**9)
        assert log.read(7) == payloads[7]


def test_read_only_refuses_writes(log_dir):
    lt.make_log(log_dir, 2, seal=False)
    with open_log(log_dir, read_only=True) as log, pytest.raises(ReadOnlyError):
        log.append(b"x")


def test_read_only_open_of_missing_log(tmp_path):
    with pytest.raises(NotFoundError):
        SegmentLog.open(str(tmp_path / "nope"), read_only=True)


def test_refresh_sees_new_frames(log_dir):
    with open_log(log_dir) as w:
        w.append(b"0")
        with open_log(log_dir, read_only=True) as r:
            assert r.next_lsn == 1
            w.append(b"1")
            w.seal()
            w.append(b"2")
            r.refresh()
            assert r.next_lsn == 3
            assert [p for _, p in r.scan()] == [b"0", b"1", b"2"]


# ---- rolling: frames never span segments ------------------------------------------------


def test_frames_never_span_segments(log_dir):
    seg_bytes = 4096
    sizes = [100, 1500, 3000, 700, 2900, 50, 4000, 1, 9000, 300, 2000, 2000, 2000]
    with open_log(log_dir, segment_bytes=seg_bytes) as log:
        data = [lt.payload(i, s) for i, s in enumerate(sizes)]
        assert [log.append(p) for p in data] == list(range(len(data)))
        infos = log.segments()
        assert_reads(log, data)
    segs = lt.segments(log_dir)
    assert len(segs) >= 4, "small segment_bytes must roll"
    assert [s.name for s in segs] == [i.name for i in infos]
    lsn = 0
    for seg in segs[:-1]:
        assert seg.sealed, seg.name
        assert seg.name == f"{seg.header.base_lsn:016x}.seg"
        assert seg.header.base_lsn == lsn
        # every frame lies inside the data region (the parser stops at data_end)
        assert seg.trailer.frame_count == len(seg.frames) >= 1
        assert seg.frames[-1].end == seg.trailer.data_end
        # only a segment whose sole frame is oversized may exceed the threshold
        if seg.frames[-1].end > seg_bytes:
            assert len(seg.frames) == 1
        lsn += len(seg.frames)
    assert segs[-1].header.base_lsn == lsn
    lsn += len(segs[-1].frames)
    assert lsn == len(sizes)
    with open_log(log_dir) as log:
        assert_reads(log, data)
        assert log.append(b"after") == len(sizes)
    assert verify(str(log_dir)).ok


def test_segments_listing(log_dir):
    lt.make_log(log_dir, 6, per_segment=3, seal=True)
    with open_log(log_dir, read_only=True) as log:
        infos = log.segments()
    assert [i.base_lsn for i in infos] == [0, 3, 6]
    assert [i.sealed for i in infos] == [True, True, False]
    assert [i.frames for i in infos] == [3, 3, 0]
    assert [i.segment_no for i in infos] == [0, 1, 2]


# ---- torn tails -------------------------------------------------------------------------


def _tail_setup(tmp_path, n=4, size=24):
    src = tmp_path / "pristine"
    payloads = lt.make_log(src, n, size=size, seal=False)
    seg = lt.segments(src)[-1]
    assert not seg.sealed and len(seg.frames) == n
    return src, payloads, seg


def test_truncation_at_every_byte_of_last_frame(tmp_path):
    src, payloads, seg = _tail_setup(tmp_path)
    last = seg.frames[-1]
    original = seg.path.read_bytes()
    for cut in range(last.offset, last.end):
        d = lt.copy_log(src, tmp_path / f"cut{cut}")
        segpath = d / seg.name
        lt.truncate(segpath, cut)
        with open_log(d, recovery="tolerate_tail") as log:
            assert log.next_lsn == len(payloads) - 1, cut
            assert_reads(log, payloads, len(payloads) - 1)
            with pytest.raises(NotFoundError):
                log.read(len(payloads) - 1)
        # the removed bytes are kept, byte for byte
        removed = original[last.offset:cut]
        q = lt.quarantine_files(d)
        if removed:
            assert q, f"cut {cut}: nothing quarantined"
            assert any(p.read_bytes() == removed and p.name.startswith(seg.name) for p in q), cut
        assert segpath.stat().st_size == last.offset
        # appends continue gap-free, and survive a reopen
        with open_log(d) as log:
            assert log.append(b"new") == len(payloads) - 1
        with open_log(d) as log:
            assert_reads(log, payloads[:-1] + [b"new"])
        assert verify(str(d)).ok


@pytest.mark.parametrize("cut_into", [1, 4, 8, 19, 20, 23, 24, 29])
def test_torn_tail_modes(tmp_path, cut_into):
    src, payloads, seg = _tail_setup(tmp_path)
    last = seg.frames[-1]
    lt.truncate(seg.path, last.offset + cut_into)
    before = lt.snapshot(src)
    if not any(seg.path.read_bytes()[last.offset:]):
        # the torn prefix is all zero (cut_into=1 leaves the crc's first byte, 0x00 for 1
        # seed in 256): FORMAT.md section 3 reads that as zero slack, the clean end of data
        with open_log(src, recovery="strict") as log:
            assert log.next_lsn == len(payloads) - 1
            assert_reads(log, payloads, len(payloads) - 1)
        assert verify(str(src)).ok
        return
    # strict refuses, naming the place
    with pytest.raises(CorruptionError) as ei:
        open_log(src, recovery="strict")
    assert ei.value.segment == seg.name
    assert ei.value.offset == last.offset
    assert ei.value.kind == "torn_tail"
    # a reader ignores the tail and changes nothing
    with open_log(src, read_only=True) as log:
        assert log.next_lsn == len(payloads) - 1
        assert_reads(log, payloads, len(payloads) - 1)
    assert lt.snapshot(src) == before
    rep = verify(str(src))
    assert [d.kind for d in rep.damage] == ["torn_tail"]
    assert rep.damage[0].segment == seg.name and rep.damage[0].offset == last.offset
    assert rep.next_lsn == len(payloads) - 1
    assert lt.snapshot(src) == before


def test_bad_length_in_middle_is_corruption(tmp_path):
    src, payloads, seg = _tail_setup(tmp_path)
    f = seg.frames[1]
    lt.set_bytes(seg.path, f.offset + 4, struct.pack("<I", 0x3FFFFFFF))
    with pytest.raises(CorruptionError) as ei:
        open_log(src, recovery="tolerate_tail")
    assert ei.value.segment == seg.name
    assert ei.value.offset == f.offset
    assert ei.value.kind != "torn_tail"
    # salvage resyncs on the next valid frame
    with open_log(src, recovery="salvage") as log:
        got = dict(log.scan())
    assert got == {i: p for i, p in enumerate(payloads) if i != 1}


def test_payload_bytes_counts_what_reads_return_across_segments_and_pending_frames(log_dir):
    sizes = [100, 1500, 3000, 0, 700, 2900, 50, 4000, 1, 9000, 300]
    with open_log(log_dir, segment_bytes=4096, durability="exit") as log:
        for i, s in enumerate(sizes):
            log.append(lt.payload(i, s))        # exit: the newest frames are still queued
        n = len(sizes)
        everything = list(range(n))
        assert log.payload_bytes(everything) == sum(sizes)
        picked = [9, 0, 3, 3, 10]               # any order, repeats, the queued tail
        assert log.payload_bytes(picked) == sum(len(log.read(i)) for i in picked)
        assert log.payload_bytes([]) == 0
        with pytest.raises(NotFoundError):
            log.payload_bytes([0, n])           # as read(n) would
    with open_log(log_dir, read_only=True) as log:     # sealed segments' offsets loaded lazily
        assert log.payload_bytes(list(range(len(sizes)))[::-1]) == sum(sizes)


def test_payload_bytes_reads_a_frame_whose_neighbour_was_lost(tmp_path):
    src, payloads, seg = _tail_setup(tmp_path)
    lt.set_bytes(seg.path, seg.frames[1].offset + 4, struct.pack("<I", 0x3FFFFFFF))
    with open_log(src, recovery="salvage") as log:
        kept = [i for i in range(len(payloads)) if i != 1]
        assert log.payload_bytes(kept) == sum(len(payloads[i]) for i in kept)
        with pytest.raises(NotFoundError):
            log.payload_bytes([1])


def test_bad_length_at_end_is_torn_tail(tmp_path):
    src, payloads, seg = _tail_setup(tmp_path)
    f = seg.frames[-1]
    lt.set_bytes(seg.path, f.offset + 4, struct.pack("<I", 0x3FFFFFFF))
    with open_log(src, recovery="tolerate_tail") as log:
        assert log.next_lsn == len(payloads) - 1
        assert_reads(log, payloads, len(payloads) - 1)


def test_checksum_mismatch_in_middle(tmp_path):
    src, _, seg = _tail_setup(tmp_path)
    f = seg.frames[2]
    lt.flip_byte(seg.path, f.offset + lt.FRAME_HDR + 3)
    with pytest.raises(CorruptionError) as ei:
        open_log(src)
    assert (ei.value.segment, ei.value.offset, ei.value.kind) == (
        seg.name, f.offset, "checksum_mismatch")
    rep = verify(str(src))
    assert not rep.ok
    assert rep.damage[0].kind == "checksum_mismatch"
    assert rep.damage[0].offset == f.offset
    assert rep.damage[0].lost_first_lsn == 2


@pytest.mark.parametrize("field,value", [
    ("type", 7),            # unknown frame type, checksum fixed
    ("flags", 0x80),        # unknown flag bit, checksum fixed
    ("reserved", 1),        # reserved must be zero, checksum fixed
])
def test_bad_header_fields_with_valid_checksum(tmp_path, field, value):
    src, _, seg = _tail_setup(tmp_path)
    f = seg.frames[1]
    off = {"type": 16, "flags": 17, "reserved": 18}[field]
    lt.set_bytes(seg.path, f.offset + off, bytes([value]))
    lt.fix_frame_crc(seg.path, f.offset)
    with pytest.raises(CorruptionError) as ei:
        open_log(src)
    assert ei.value.kind == "bad_header"
    assert ei.value.offset == f.offset


def test_wrong_lsn_with_valid_checksum(tmp_path):
    src, _, seg = _tail_setup(tmp_path)
    f = seg.frames[1]
    lt.set_bytes(seg.path, f.offset + 8, struct.pack("<Q", 99))
    lt.fix_frame_crc(seg.path, f.offset)
    with pytest.raises(CorruptionError) as ei:
        open_log(src)
    assert ei.value.kind in ("lsn_gap", "bad_header")
    assert ei.value.offset == f.offset


def test_zero_tail_is_end_of_data(tmp_path):
    src, payloads, seg = _tail_setup(tmp_path)
    lt.append_garbage(seg.path, 4096, zeros=True)
    with open_log(src, read_only=True) as log:
        assert log.next_lsn == len(payloads)
        assert_reads(log, payloads)
    with open_log(src, recovery="tolerate_tail") as log:
        assert log.next_lsn == len(payloads)
        assert log.append(b"after zeros") == len(payloads)
    with open_log(src) as log:
        assert_reads(log, payloads + [b"after zeros"])
    assert verify(str(src)).ok


def test_garbage_tail(tmp_path):
    src, payloads, seg = _tail_setup(tmp_path)
    end = seg.size
    junk = lt.append_garbage(seg.path, 333, seed=7)
    with pytest.raises(CorruptionError):
        open_log(src, recovery="strict")
    with open_log(src, recovery="tolerate_tail") as log:
        assert_reads(log, payloads)
        assert log.append(b"z") == len(payloads)
    assert any(p.read_bytes() == junk for p in lt.quarantine_files(src))
    assert any(p.name == f"{seg.name}.{end}.torn" for p in lt.quarantine_files(src))
    with open_log(src) as log:
        assert_reads(log, payloads + [b"z"])


def test_partial_header_after_valid_frames(tmp_path):
    """A frame header cut short (< 24 bytes) at the end is a torn tail."""
    src, payloads, seg = _tail_setup(tmp_path)
    lt.truncate(seg.path, seg.frames[-1].offset + 10)
    with open_log(src) as log:
        assert log.next_lsn == len(payloads) - 1


def test_torn_tail_in_active_segment_after_sealed_ones(tmp_path):
    src = tmp_path / "l"
    payloads = lt.make_log(src, 6, per_segment=3, seal=True, tail=3)
    act = lt.segments(src)[-1]
    lt.truncate(act.path, act.frames[-1].offset + 5)
    with open_log(src) as log:
        assert log.next_lsn == 8
        assert_reads(log, payloads, 8)


# ---- handles ------------------------------------------------------------------------------


def test_second_writer_shares_and_exclusive_is_refused(log_dir):
    with open_log(log_dir) as log:
        log.append(b"a")
        with open_log(log_dir) as other:                   # several writers (FORMAT.md 12)
            with pytest.raises(StoreLockedError, match="other processes"):
                log.exclusive(True)                        # compaction needs it alone
            other.append(b"b")
        log.exclusive(True)                                # alone now
        log.exclusive(False)
        assert log.append(b"c") == 2
        with open_log(log_dir, read_only=True) as r:      # readers take no lock
            assert [r.read(i) for i in range(3)] == [b"a", b"b", b"c"]
    with open_log(log_dir) as log:                         # released at close
        assert log.next_lsn == 3


@pytest.mark.parametrize("kw", [{"durability": "fast"}, {"recovery": "yolo"},
                                {"segment_bytes": 10}])
def test_bad_options(log_dir, kw):
    with pytest.raises(ConfigError):
        SegmentLog.open(str(log_dir), **kw)


def test_closed_handle_refuses(log_dir):
    log = open_log(log_dir)
    log.append(b"x")
    log.close()
    log.close()                                            # idempotent
    with pytest.raises(DurkvError):
        log.append(b"y")


# ---- prefix removal (FORMAT.md section 7) ----------------------------------------------------


def test_seal_with_new_start_drops_dead_segments(log_dir):
    payloads = lt.make_log(log_dir, 12, per_segment=4, seal=False)
    with open_log(log_dir) as log:
        log.seal(new_start_lsn=8)
        assert log.start_lsn == 8
        assert [p for _, p in log.scan()] == payloads[8:]
        with pytest.raises(NotFoundError):
            log.read(7)
        assert log.append(b"next") == 12
    assert [p.name for p in lt.segment_files(log_dir)] == [
        "0000000000000008.seg", "000000000000000c.seg"]
    with open_log(log_dir) as log:
        assert log.start_lsn == 8 and log.next_lsn == 13
        want = {i: p for i, p in enumerate(payloads) if i >= 8}
        assert dict(log.scan()) == {**want, 12: b"next"}
    assert verify(str(log_dir)).ok


def test_crash_between_roll_and_unlink_leaves_dead_segments(tmp_path):
    """The dead segments a crash left behind are removed by the next writer (or at
    least never read as live data); verify does not call them damage."""
    d = tmp_path / "log"
    payloads = lt.make_log(d, 12, per_segment=4, seal=False)
    saved = {p.name: p.read_bytes() for p in lt.segment_files(d)[:2]}
    with open_log(d) as log:
        log.seal(new_start_lsn=8)
    for name, data in saved.items():          # as if the unlinks never happened
        (d / name).write_bytes(data)
    rep = verify(str(d))
    assert rep.ok, rep.to_dict()
    with open_log(d) as log:
        assert log.start_lsn == 8
        assert dict(log.scan()) == {i: p for i, p in enumerate(payloads) if i >= 8}
    assert [p.name for p in lt.segment_files(d)][0] == "0000000000000008.seg"


def test_missing_live_segment_after_prefix_removal(tmp_path):
    d = tmp_path / "log"
    lt.make_log(d, 12, per_segment=4, seal=False)
    with open_log(d) as log:
        log.seal(new_start_lsn=4)
        log.append(b"x")
    (d / "0000000000000004.seg").unlink()
    rep = verify(str(d))
    assert not rep.ok
    assert rep.damage[0].kind in ("missing_segment", "lsn_gap")
    with pytest.raises(CorruptionError):
        open_log(d)


# ---- crash states of a roll: seal footer, then the next segment's header --------------------


@pytest.fixture
def rolled(tmp_path):
    """A log whose last roll is complete: 2 sealed segments + an empty active one."""
    d = tmp_path / "rolled"
    payloads = lt.make_log(d, 8, size=50, per_segment=4, seal=True)
    segs = lt.segments(d)
    assert [s.sealed for s in segs] == [True, True, False] and not segs[-1].frames
    return d, payloads, segs


def _check_after_crash(d, payloads, tag):
    rep = verify(str(d))
    assert all(x.kind == "torn_tail" for x in rep.damage), (tag, rep.to_dict())
    with open_log(d) as log:
        assert log.next_lsn == len(payloads), tag
        assert_reads(log, payloads)
        assert log.append(b"after") == len(payloads)
    with open_log(d) as log:
        assert log.read(len(payloads)) == b"after"
    assert verify(str(d)).ok, tag


def test_crash_while_creating_next_segment(tmp_path, rolled):
    src, payloads, segs = rolled
    for k in range(lt.HEADER_LEN):
        d = lt.copy_log(src, tmp_path / f"h{k}")
        lt.truncate(d / segs[-1].name, k)
        _check_after_crash(d, payloads, f"header cut at {k}")


def test_crash_while_writing_seal_footer(tmp_path, rolled):
    src, payloads, segs = rolled
    sealed = segs[-2]
    for k in range(sealed.trailer.data_end, sealed.size + 1):
        d = lt.copy_log(src, tmp_path / f"f{k}")
        (d / segs[-1].name).unlink()               # the next segment was never created,
        lt.name_newest_in_head(d, sealed)          # so HEAD still names the sealed one
        lt.truncate(d / sealed.name, k)
        _check_after_crash(d, payloads, f"footer cut at {k}")


# ---- random operations against a model ------------------------------------------------------


@pytest.mark.parametrize("seed", range(40 if os.environ.get("DURKV_SLOW_TESTS") == "1" else 8))
def test_random_ops_match_model(tmp_path, seed):
    import random

    rnd = random.Random(seed)
    d = tmp_path / "log"
    model: dict[int, bytes] = {}
    start = nxt = 0
    pol = rnd.choice(["sync", "async", "exit"])
    log = open_log(d, durability=pol, segment_bytes=rnd.choice([2048, 8192, 1 << 20]))
    try:
        for step in range(150):
            op = rnd.random()
            if op < 0.5:
                p = lt.payload(step, rnd.choice([0, 1, 20, 300, 1500, 5000]), tag=f"s{seed}-")
                lsn = log.append(p, durability=rnd.choice([None, "sync", "async", "exit"]))
                assert lsn == nxt
                model[lsn] = p
                nxt += 1
            elif op < 0.6:
                batch = [lt.payload(step * 10 + j, rnd.randint(0, 800), tag=f"m{seed}-")
                         for j in range(rnd.randint(1, 6))]
                lsns = log.append_many(batch)
                assert lsns == list(range(nxt, nxt + len(batch)))
                model.update(zip(lsns, batch, strict=True))
                nxt += len(batch)
            elif op < 0.66:
                log.seal()
            elif op < 0.7:
                new = rnd.randint(start, nxt)
                log.seal(new_start_lsn=new)
                start = max(start, new)
                model = {k: v for k, v in model.items() if k >= start}
            elif op < 0.78:
                log.close()
                log = open_log(d, durability=pol,
                               segment_bytes=rnd.choice([2048, 8192, 1 << 20]))
            elif op < 0.85:
                with open_log(d, read_only=True) as r:
                    log.flush()
                    r.refresh()
                    assert dict(r.scan()) == model
            elif model:
                k = rnd.choice(list(model))
                assert log.read(k) == model[k]
                assert list(log.scan(from_lsn=k)) == sorted((i, v) for i, v in model.items()
                                                            if i >= k)
            assert (log.start_lsn, log.next_lsn) == (start, nxt)
    finally:
        log.close()
    with open_log(d, read_only=True) as r:
        assert (r.start_lsn, r.next_lsn) == (start, nxt)
        assert dict(r.scan()) == model
    assert verify(str(d)).ok
