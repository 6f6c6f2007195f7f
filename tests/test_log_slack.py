"""Zero slack after the active segment's frames (FORMAT.md §3, §6, §9, §12).

The writer keeps zeros written ahead of its appends so that a commit's fdatasync finds
the file's size already synced. These tests pin what that must not change: the slack
is the clean end of data for every reader (nothing quarantined, nothing reported), a
torn write inside it is still a torn tail, damage to a synced frame before it is still
corruption, a kill -9 leaves a log that reopens clean, a failed zero-fill fails the
handle closed, a seal cuts the slack, and one fdatasync per commit is all a commit
costs. Real files, real fsyncs, a real SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import logtools as lt
import pytest
from durkv.errors import CorruptionError, LogFailedError
from durkv.log import SegmentLog, fdatasync_count, verify

SLACK_MIN = 64 << 10        # csrc/seglog.c: no slack below this much data
FRAME = 1024                # payload bytes per frame in these tests


def _open(path, **kw):
    kw.setdefault("durability", "sync")
    return SegmentLog.open(str(path), **kw)


def _payload(i: int) -> bytes:
    return lt.payload(i, FRAME)


def _fill(log, start: int, n: int) -> list[bytes]:
    out = [_payload(start + i) for i in range(n)]
    for p in out:
        log.append(p)
    return out


def _active(path):
    seg = lt.segments(path)[-1]
    assert not seg.sealed
    return seg


def _data_end(seg) -> int:
    return seg.frames[-1].end if seg.frames else lt.HEADER_LEN


def _with_slack(tmp_path, n=120):
    """A log whose active segment holds n frames of 1 KiB, then zero slack."""
    d = tmp_path / "log"
    with _open(d) as log:
        payloads = _fill(log, 0, n)
    seg = _active(d)
    end = _data_end(seg)
    assert end > SLACK_MIN and seg.size > end, "the writer left no slack"
    assert not any(seg.path.read_bytes()[end:])
    return d, payloads, seg


def test_size_changes_once_per_chunk_and_one_fdatasync_per_commit(tmp_path):
    d = tmp_path / "log"
    with _open(d) as log:
        _fill(log, 0, 70)                       # past SLACK_MIN: the slack starts
        path = d / log.segments()[-1].name
        sizes, n = [], 1000
        f0 = fdatasync_count()
        for i in range(n):
            log.append(_payload(70 + i))
            sizes.append(os.stat(path).st_size)
        syncs = fdatasync_count() - f0
        data_end = log.segments()[-1].bytes
    assert syncs == n, "the zero-fill must not add an fdatasync"
    changes = sum(a != b for a, b in zip(sizes, sizes[1:]))
    written = n * (FRAME + 24)
    # chunks are at least 64 KiB: a size change per chunk, not per commit
    assert 1 <= changes <= written // SLACK_MIN + 1, changes
    assert sizes[-1] > data_end
    assert sizes[-1] - data_end <= max(SLACK_MIN, data_end // 8) + 4096


@pytest.mark.parametrize("mode", ["strict", "tolerate_tail", "point_in_time", "salvage"])
def test_zero_slack_is_the_end_of_data_in_every_mode(tmp_path, mode):
    d, payloads, seg = _with_slack(tmp_path)
    with _open(d, read_only=True, recovery=mode) as log:
        assert log.next_lsn == len(payloads)
        assert log.recovery_damage is None
        assert log.read(len(payloads) - 1) == payloads[-1]
    rep = verify(str(d))
    assert rep.ok and not rep.damage
    if mode in ("strict", "tolerate_tail"):
        with _open(d, recovery=mode) as log:     # a writer: keeps the slack, appends into it
            assert log.recovery_damage is None
            assert log.append(b"next") == len(payloads)
    assert not lt.quarantine_files(d)
    assert _active(d).size >= seg.size


def test_recover_leaves_a_pure_zero_slack_alone(tmp_path):
    from durkv.log import recover

    d, payloads, seg = _with_slack(tmp_path)
    before = seg.path.read_bytes()
    recover(str(d))
    assert seg.path.read_bytes() == before
    assert not lt.quarantine_files(d)


def test_torn_write_inside_the_slack_is_a_torn_tail(tmp_path):
    d, payloads, seg = _with_slack(tmp_path)
    end = _data_end(seg)
    # half of a next frame reached the disk, the rest of the slack stayed zero
    torn = lt.pseudo_random(700, "torn")
    lt.set_bytes(seg.path, end, torn)
    rep = verify(str(d))
    assert [(x.kind, x.offset) for x in rep.damage] == [("torn_tail", end)]
    with _open(d) as log:
        assert log.recovery_damage.kind == "torn_tail"
        assert log.next_lsn == len(payloads)
        log.append(b"after")
    q = lt.quarantine_files(d)
    assert len(q) == 1 and q[0].name == f"{seg.name}.{end}.torn"
    assert q[0].read_bytes() == torn + b"\0" * (seg.size - end - len(torn)), "byte for byte"
    assert verify(str(d)).ok


def test_zeros_then_a_frame_after_the_slack_start_is_judged_as_before(tmp_path):
    """Bad bytes after zeros: not an all-zero remainder, so §6 judges the whole rest."""
    d, payloads, seg = _with_slack(tmp_path)
    end = _data_end(seg)
    lt.set_bytes(seg.path, end + 5000, b"\x01" * 10)
    rep = verify(str(d))
    assert [(x.kind, x.offset) for x in rep.damage] == [("torn_tail", end)]
    with _open(d) as log:
        assert log.next_lsn == len(payloads)
    (q,) = lt.quarantine_files(d)
    assert q.read_bytes() == b"\0" * 5000 + b"\x01" * 10 + b"\0" * (seg.size - end - 5010)


def test_flip_in_a_synced_frame_before_the_slack_is_corruption(tmp_path):
    d, payloads, seg = _with_slack(tmp_path)
    f = seg.frames[-3]              # later frames record it as synced (sync policy)
    lt.flip_byte(seg.path, f.offset + 30)
    rep = verify(str(d))
    assert rep.damage and rep.damage[0].kind == "checksum_mismatch"
    assert rep.damage[0].offset == f.offset
    with pytest.raises(CorruptionError) as ei:
        _open(d)
    assert ei.value.kind == "checksum_mismatch"
    assert not lt.quarantine_files(d)


def test_zeroed_synced_frame_before_later_frames_is_corruption(tmp_path):
    d, payloads, seg = _with_slack(tmp_path)
    f = seg.frames[-3]
    lt.zero_range(seg.path, f.offset, f.end - f.offset)
    with pytest.raises(CorruptionError):
        _open(d)
    assert not verify(str(d)).ok


def test_seal_cuts_the_slack(tmp_path):
    d = tmp_path / "log"
    with _open(d) as log:
        payloads = _fill(log, 0, 120)
        assert os.stat(d / log.segments()[-1].name).st_size > log.segments()[-1].bytes
        log.seal()
        log.append(b"next segment")
    sealed = lt.segments(d)[0]
    assert sealed.sealed and sealed.size == sealed.trailer.data_end + 8 * 120 + 48
    assert sealed.trailer.data_end == _data_end(sealed)
    rep = verify(str(d))
    assert rep.ok and not rep.damage
    with _open(d, read_only=True, recovery="strict") as log:
        assert log.read(119) == payloads[119]


def test_a_reader_follows_appends_into_the_slack(tmp_path):
    """The store's read-only handle: the file's size no longer moves per commit."""
    import durkv

    path = str(tmp_path / "store")
    w = durkv.open(path)
    try:
        for i in range(80):
            big = lt.pseudo_random(1500, i).hex()      # zstd cannot shrink it away
            w.put("t", "", f"{i:04d}", checkpoint={"i": i}, metadata={}, values={"big": big},
                  versions={"big": i + 1})
        r = durkv.open(path, read_only=True)
        try:
            assert r.get("t").checkpoint["i"] == 79
            seg = _active(path)
            size = seg.size
            assert size > _data_end(seg)
            for i in range(80, 83):
                w.put("t", "", f"{i:04d}", checkpoint={"i": i}, metadata={},
                      values={"big": "y"}, versions={"big": i + 1})
                assert os.stat(seg.path).st_size == size     # into the slack
                assert r.get("t").checkpoint["i"] == i       # and the reader sees it
        finally:
            r.close()
    finally:
        w.close()


def test_two_writers_share_the_slack(tmp_path):
    """Two write handles (FORMAT.md §12) appending in turn into one slack."""
    d = tmp_path / "log"
    a, b = _open(d), _open(d)
    try:
        want = []
        for i in range(300):
            h = a if i % 3 else b
            p = _payload(i)
            assert h.append(p) == i
            want.append(p)
        b.refresh()
        assert b.next_lsn == a.next_lsn == 300
        assert b.read(299) == want[299] and a.read(0) == want[0]
    finally:
        a.close()
        b.close()
    assert not lt.quarantine_files(d)
    rep = verify(str(d))
    assert rep.ok and not rep.damage
    seg = _active(d)
    assert [f.lsn for f in seg.frames] == list(range(300))
    assert seg.size > _data_end(seg)


_WRITER = r"""
import sys
from durkv.log import SegmentLog
log = SegmentLog.open(sys.argv[1], durability="sync")
i = 0
while True:
    lsn = log.append(bytes([i % 251]) * 1024)
    print(lsn, flush=True)
    i += 1
"""


def test_kill9_mid_run_leaves_slack_that_reopens_clean(tmp_path):
    d = tmp_path / "log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(d)], stdout=subprocess.PIPE,
                             text=True, env=env)
    acked = -1
    try:
        deadline = time.monotonic() + 60
        while acked < 150 and time.monotonic() < deadline:      # well past SLACK_MIN
            line = child.stdout.readline()
            if not line:
                break
            acked = int(line)
        child.send_signal(signal.SIGKILL)
        for line in child.stdout:       # what it printed before dying was acknowledged too
            acked = int(line)
    finally:
        child.kill()
        child.wait()
    assert acked >= 150
    seg = _active(d)
    # the slack was in play (a kill between a frame that crossed its end and the next
    # chunk of zeros leaves none, legitimately: the file then ends with that frame)
    assert _data_end(seg) > SLACK_MIN
    rep = verify(str(d))
    assert not [x for x in rep.damage if x.kind != "torn_tail"]
    with _open(d) as log:
        assert log.next_lsn > acked
        assert log.read(acked) == bytes([acked % 251]) * 1024
    # a frame cut mid-write may be quarantined (with the slack after it), never zeros alone
    for q in lt.quarantine_files(d):
        assert any(q.read_bytes())
    assert verify(str(d)).ok


def test_a_failed_zero_fill_fails_the_handle_closed(tmp_path, no_faults):
    d = tmp_path / "log"
    log = _open(d)
    payloads = []
    # up to just below SLACK_MIN: no zero-fill yet
    while log.segments()[-1].bytes + FRAME + 24 < SLACK_MIN:
        payloads.append(_payload(len(payloads)))
        log.append(payloads[-1])
    no_faults("write", 2)           # this append's frames are write 1, its zero-fill write 2
    with pytest.raises(LogFailedError):
        log.append(_payload(len(payloads)))
    with pytest.raises(LogFailedError):
        log.append(b"after the failure")
    try:
        log.close()         # raises if the failed append's frame was written, not synced
    except LogFailedError as e:
        assert "not made durable before close" in str(e)
    no_faults(None)
    with _open(d) as log:           # reopen recovers from what is on disk
        assert log.next_lsn in (len(payloads), len(payloads) + 1)
        for i, p in enumerate(payloads):
            assert log.read(i) == p
        assert log.append(b"again") == log.next_lsn - 1
    assert verify(str(d)).ok


_TAGGED_WRITER = r"""
import sys
from durkv.log import SegmentLog
log = SegmentLog.open(sys.argv[1], durability="sync")
tag = sys.argv[2]
i = 0
while True:
    p = f"{tag}:{i}:".encode() + bytes([i % 251]) * 1000
    print(log.append(p), i, flush=True)
    i += 1
"""


def test_writer_processes_killed_while_sharing_the_slack(tmp_path):
    """Three writer processes in one slack, one of them kill -9'd again and again: every
    acknowledged frame is at its LSN, the survivors go on, the log reopens clean."""
    d = tmp_path / "log"
    _open(d).close()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))

    def start(tag):
        return subprocess.Popen([sys.executable, "-c", _TAGGED_WRITER, str(d), tag],
                                stdout=subprocess.PIPE, text=True, env=env)

    acked: dict[int, bytes] = {}

    def take(tag, line):
        if not line.endswith("\n"):
            return      # a killed writer's last line, cut by the kill: not an acknowledgement
        lsn, i = map(int, line.split())
        assert lsn not in acked, f"lsn {lsn} acknowledged twice"
        acked[lsn] = f"{tag}:{i}:".encode() + bytes([i % 251]) * 1000

    steady = {t: start(t) for t in ("a", "b")}
    try:
        for k in range(4):
            tag = f"v{k}"
            victim = start(tag)
            for _ in range(30 + 17 * k):        # then die at a different instant each time
                line = victim.stdout.readline()
                if not line:
                    break
                take(tag, line)
            victim.send_signal(signal.SIGKILL)
            for line in victim.stdout:
                take(tag, line)
            victim.wait()
        for t, p in steady.items():
            p.send_signal(signal.SIGKILL)
            for line in p.stdout:
                take(t, line)
            p.wait()
    finally:
        for p in steady.values():
            p.kill()
            p.wait()
    seg = _active(d)
    assert _data_end(seg) > SLACK_MIN       # the slack was in play (see the test above)
    with _open(d) as log:
        for lsn, p in acked.items():
            assert log.read(lsn) == p, lsn
    for q in lt.quarantine_files(d):
        assert any(q.read_bytes())
    rep = verify(str(d))
    assert rep.ok and not rep.damage


@contextlib.contextmanager
def _two_writers_on_100_frames(d):
    """Two write handles of one log; one appended 100 frames of 1 KiB, the other has
    caught up, and both leases have lapsed (1 ms): the next section of either catches up."""
    a, b = _open(d), _open(d)
    try:
        payloads = _fill(a, 0, 100)
        b.refresh()
        time.sleep(0.05)
        yield a, b, payloads
    finally:
        a.close()
        b.close()


def test_a_dead_writers_torn_bytes_in_the_slack_are_cut_by_the_next_section(tmp_path):
    """Another writer's catch-up finds them with its one-pread probe (FORMAT.md §12)."""
    d = tmp_path / "log"
    with _two_writers_on_100_frames(d) as (a, b, payloads):
        end = b.segments()[-1].bytes
        torn = lt.pseudo_random(300, "dead")     # a writer killed mid-write(2) left these
        lt.set_bytes(d / b.segments()[-1].name, end, torn)
        assert b.append(b"after") == 100
        assert a.append(b"and a") == 101
        assert a.read(100) == b"after" and b.read(99) == payloads[99]
    (q,) = lt.quarantine_files(d)
    assert q.name.endswith(f".{end}.torn") and q.read_bytes().startswith(torn)
    rep = verify(str(d))
    assert rep.ok and not rep.damage


def test_an_active_segment_cut_under_a_writer_is_reported_not_written_over(tmp_path):
    d = tmp_path / "log"
    with _two_writers_on_100_frames(d) as (_a, b, _payloads):
        seg = _active(d)
        lt.truncate(seg.path, seg.frames[-1].offset + 10)
        with pytest.raises(CorruptionError, match="shrank"):
            b.append(b"x")
