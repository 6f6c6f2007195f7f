"""The active segment's scan at open, in chunks (csrc/open.c `scan_active_chunked`).

A writer's open checks every frame of the active segment and takes its running digest for
the seal (FORMAT.md 3-4). It reads the file in 1 MiB chunks rather than whole; these tests
pin what that must not change: frames across chunk ends and frames larger than a chunk are
indexed and read back, the digest the next seal writes is the file's (verify checks it),
and damage past the first chunk is judged as a whole-file read judged it (a torn tail cut,
a flipped synced frame refused). Real files, real fsyncs.
"""

from __future__ import annotations

import random

import logtools as lt
import pytest
from durkv.errors import CorruptionError
from durkv.log import SegmentLog, verify

CHUNK = 1 << 20             # csrc/open.c SCAN_CHUNK


def _payloads(seed: int) -> list[bytes]:
    """~4.5 MiB of frames: small ones of random sizes (every chunk end falls inside one)
    with two larger than a chunk between them."""
    rng = random.Random(seed)
    out = [lt.pseudo_random(rng.randrange(1, 3000), seed * 100_000 + i) for i in range(1200)]
    out.insert(400, lt.pseudo_random(CHUNK + 12_345, seed))
    out.insert(900, lt.pseudo_random(2 * CHUNK + 7, seed + 1))
    return out


def _write(d, payloads, **kw):
    with SegmentLog.open(str(d), durability="sync", **kw) as log:
        for p in payloads:
            log.append(p)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_multi_chunk_active_segment_reopens_with_its_frames_and_seals_with_its_digest(
        tmp_path, seed):
    d = tmp_path / "log"
    payloads = _payloads(seed)
    _write(d, payloads)
    (seg,) = lt.segments(d)
    assert not seg.sealed and seg.frames[-1].end > 4 * CHUNK
    with SegmentLog.open(str(d)) as log:          # the chunked scan; its digest is kept
        assert log.recovery_damage is None
        assert log.next_lsn == len(payloads)
        assert [p for _, p in log.scan()] == payloads
        assert log.append(b"after the reopen") == len(payloads)
        log.seal()                                # the seal writes the running digest
    rep = verify(str(d))
    assert rep.ok and rep.frames_ok == len(payloads) + 1, rep
    sealed = lt.segments(d)[0]
    assert sealed.sealed and len(sealed.frames) == len(payloads) + 1
    with SegmentLog.open(str(d), read_only=True) as r:
        assert r.read(len(payloads)) == b"after the reopen"


def test_a_small_active_segment_without_slack_reopens_and_seals_with_its_digest(tmp_path):
    d = tmp_path / "log"
    payloads = [lt.payload(i, 200) for i in range(50)]     # under the slack's 64 KiB floor
    _write(d, payloads)
    (seg,) = lt.segments(d)
    assert seg.size == seg.frames[-1].end, "no slack: the file ends at its last frame"
    with SegmentLog.open(str(d)) as log:
        assert log.next_lsn == len(payloads)
        log.append(b"one more")
        log.seal()
    rep = verify(str(d))
    assert rep.ok and rep.frames_ok == len(payloads) + 1, rep


def test_a_torn_tail_past_the_first_chunk_is_cut_as_before(tmp_path):
    d = tmp_path / "log"
    payloads = _payloads(3)
    _write(d, payloads)
    (seg,) = lt.segments(d)
    last = seg.frames[-1]
    # a torn write of the last frame: its second half is gone, zeros follow (the slack)
    lt.zero_range(seg.path, last.offset + (last.end - last.offset) // 2,
                  (last.end - last.offset) - (last.end - last.offset) // 2)
    with SegmentLog.open(str(d)) as log:
        dmg = log.recovery_damage
        assert dmg is not None and dmg.kind == "torn_tail" and dmg.offset == last.offset
        assert log.next_lsn == len(payloads) - 1
        assert log.append(b"again") == len(payloads) - 1
        log.seal()
    assert len(lt.quarantine_files(d)) == 1
    rep = verify(str(d))
    assert rep.ok and rep.frames_ok == len(payloads), rep


def test_a_flipped_synced_frame_past_the_first_chunk_is_refused(tmp_path):
    d = tmp_path / "log"
    payloads = _payloads(4)
    _write(d, payloads)
    (seg,) = lt.segments(d)
    f = next(f for f in seg.frames if f.offset > 3 * CHUNK)
    lt.flip_byte(seg.path, f.offset + 30)
    for read_only in (False, True):
        with pytest.raises(CorruptionError) as ei:
            SegmentLog.open(str(d), read_only=read_only)
        assert ei.value.kind == "checksum_mismatch" and ei.value.offset == f.offset
    assert not lt.quarantine_files(d)


def test_garbage_in_the_slack_after_the_first_chunk_is_not_the_end_of_data(tmp_path):
    d = tmp_path / "log"
    payloads = _payloads(5)
    _write(d, payloads)
    (seg,) = lt.segments(d)
    end = seg.frames[-1].end
    assert seg.size - end > 5000, "the writer keeps zero slack after its frames"
    lt.set_bytes(seg.path, end + 4000, b"\x01" * 10)
    with SegmentLog.open(str(d)) as log:            # the whole-file judgement: a torn tail
        dmg = log.recovery_damage
        assert dmg is not None and dmg.kind == "torn_tail" and dmg.offset == end
        assert log.next_lsn == len(payloads)
    assert verify(str(d)).ok
