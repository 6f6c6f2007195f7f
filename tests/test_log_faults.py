"""I/O error injection: a failed write or fsync fails the handle closed.

``durkv.log.fault_inject(op, nth, err)`` makes the nth next call of ``op``
(process-wide) fail with ``err``. After the fault: the call raises
``LogFailedError``, every later call raises too (fsync is never retried), and a
reopen finds every frame acknowledged before the fault.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import logtools as lt
import pytest
from durkv.errors import DurkvError, LogFailedError
from durkv import open as durkv_open
from durkv.log import SegmentLog, recover, verify

ERRS = {errno.EIO: ("Input/output error", "EIO"), errno.ENOSPC: ("No space left", "ENOSPC")}


def _assert_failed_closed(log, excinfo, err):
    msg = str(excinfo.value)
    assert msg, "LogFailedError needs a message"
    assert any(s in msg for s in ERRS[err]), f"message does not name the error: {msg!r}"
    for call in (lambda: log.append(b"after"), lambda: log.append_many([b"a", b"b"]),
                 log.flush, lambda: log.seal()):
        with pytest.raises(LogFailedError):
            call()


def _close_quietly(log):
    try:
        log.close()
    except LogFailedError:
        pass


def _check_reopen(d, acked: dict[int, bytes], maybe: dict[int, bytes] | None = None):
    with SegmentLog.open(str(d), durability="sync") as log:
        got = dict(log.scan())
        assert set(got) == set(range(log.next_lsn)), "not a gap-free prefix"
        for lsn, p in acked.items():
            assert got.get(lsn) == p, f"acknowledged lsn {lsn} lost or wrong"
        for lsn in set(got) - set(acked):
            assert maybe and got[lsn] == maybe.get(lsn), f"unexpected frame {lsn}"
        n = log.next_lsn
        assert log.append(b"after reopen") == n
    assert verify(str(d)).ok


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC])
@pytest.mark.parametrize("op", ["write", "fdatasync"])
@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_append_fault(log_dir, no_faults, op, err, durability):
    acked = {}
    log = SegmentLog.open(str(log_dir), durability=durability)
    try:
        for i in range(5):
            p = lt.payload(i)
            acked[log.append(p)] = p
        log.flush()
        doomed = lt.payload(5)
        no_faults(op, 1, err)
        if durability == "sync" or (durability == "async" and op == "write"):
            with pytest.raises(LogFailedError) as ei:
                log.append(doomed)
        else:
            # exit buffers the frame; async writes it and fsyncs in the background:
            # the failure surfaces at the next flush at the latest
            try:
                log.append(doomed)
            except LogFailedError:
                pass
            with pytest.raises(LogFailedError) as ei:
                log.flush()
        _assert_failed_closed(log, ei, err)
    finally:
        no_faults(None)
        _close_quietly(log)
    _check_reopen(log_dir, acked, {5: doomed})


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC])
def test_async_flusher_fault_fails_the_handle(log_dir, no_faults, err):
    log = SegmentLog.open(str(log_dir), durability="async", flush_interval_ms=5)
    acked = {}
    try:
        p = lt.payload(0)
        acked[log.append(p)] = p
        log.wait_durable(0)
        no_faults("fdatasync", 1, err)
        p = lt.payload(1)
        acked[log.append(p)] = p      # written to the OS: survives a process crash
        with pytest.raises(LogFailedError) as ei:
            log.wait_durable(1)
        _assert_failed_closed(log, ei, err)
        assert log.durable_lsn <= 1, "a frame whose fsync failed must not be called durable"
    finally:
        no_faults(None)
        _close_quietly(log)
    _check_reopen(log_dir, acked)


def test_fault_on_nth_call_later_in_a_batch(log_dir, no_faults):
    log = SegmentLog.open(str(log_dir), durability="sync")
    acked = {}
    try:
        no_faults("fdatasync", 4, errno.EIO)
        with pytest.raises(LogFailedError) as ei:
            for i in range(10):
                p = lt.payload(i)
                acked[log.append(p)] = p
        assert 1 <= len(acked) <= 3
        _assert_failed_closed(log, ei, errno.EIO)
    finally:
        no_faults(None)
        _close_quietly(log)
    _check_reopen(log_dir, acked, {i: lt.payload(i) for i in range(10)})


def test_append_many_fault(log_dir, no_faults):
    log = SegmentLog.open(str(log_dir), durability="sync")
    try:
        acked = dict(zip(log.append_many([b"a", b"b"]), [b"a", b"b"], strict=True))
        no_faults("write", 1, errno.EIO)
        with pytest.raises(LogFailedError) as ei:
            log.append_many([b"c", b"d", b"e"])
        _assert_failed_closed(log, ei, errno.EIO)
    finally:
        no_faults(None)
        _close_quietly(log)
    _check_reopen(log_dir, acked, {2: b"c", 3: b"d", 4: b"e"})


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC])
def test_seal_dirfsync_fault(log_dir, no_faults, err):
    log = SegmentLog.open(str(log_dir), durability="sync")
    acked = {}
    try:
        for i in range(3):
            p = lt.payload(i)
            acked[log.append(p)] = p
        no_faults("dirfsync", 1, err)
        with pytest.raises(LogFailedError) as ei:
            log.seal()
        _assert_failed_closed(log, ei, err)
    finally:
        no_faults(None)
        _close_quietly(log)
    _check_reopen(log_dir, acked)


@pytest.mark.parametrize("op", ["dirfsync", "fdatasync", "write"])
def test_roll_fault(log_dir, no_faults, op):
    """A roll (seal + new segment + dir fsync) triggered by an append fails."""
    seg_bytes = 4096
    log = SegmentLog.open(str(log_dir), durability="sync", segment_bytes=seg_bytes)
    acked = {}
    try:
        i = 0
        frame = 500 + lt.FRAME_HDR
        # fill (rolling once on the way) until the next frame cannot fit the active segment
        while len(lt.segment_files(log_dir)) < 2 or \
                lt.segment_files(log_dir)[-1].stat().st_size + frame <= seg_bytes:
            p = lt.payload(i, 500)
            acked[log.append(p)] = p
            i += 1
            assert i < 100
        no_faults(op, 1, errno.EIO)
        with pytest.raises(LogFailedError) as ei:
            for _ in range(3):            # one of these rolls
                p = lt.payload(i, 500)
                acked[log.append(p)] = p
                i += 1
        _assert_failed_closed(log, ei, errno.EIO)
    finally:
        no_faults(None)
        _close_quietly(log)
    _check_reopen(log_dir, acked, {j: lt.payload(j, 500) for j in range(i + 1)})


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("op", ["write", "fdatasync"])
def test_a_segment_appears_with_its_header_whole(log_dir, no_faults, op, nth):
    """A roll that stops before the new segment's header is synced -- as a kill between
    creating the file and writing it would -- leaves no segment shorter than its header:
    the header is written and synced as <name>.tmp, then renamed (FORMAT.md section 1).
    verify then finds nothing to report, and the frames read back."""
    log = SegmentLog.open(str(log_dir), durability="sync", segment_bytes=4096)
    acked, i = {}, 0
    try:
        while len(lt.segment_files(log_dir)) < 2 or \
                lt.segment_files(log_dir)[-1].stat().st_size + 500 + lt.FRAME_HDR <= 4096:
            acked[log.append(lt.payload(i, 500))] = lt.payload(i, 500)
            i += 1
        no_faults(op, nth, errno.EIO)
        with pytest.raises(LogFailedError):
            for _ in range(3):            # one of these rolls
                acked[log.append(lt.payload(i, 500))] = lt.payload(i, 500)
                i += 1
    finally:
        no_faults(None)
        _close_quietly(log)
    assert all(f.stat().st_size >= 64 for f in lt.segment_files(log_dir))
    assert not list(log_dir.glob("*.seg.tmp"))     # a failed creation removes its .tmp
    rep = verify(str(log_dir))
    assert rep.ok, rep.damage
    _check_reopen(log_dir, acked, {j: lt.payload(j, 500) for j in range(i + 1)})


_ROLL_AND_DIE = """
import sys
sys.path.insert(0, {tests!r})
import logtools as lt
from durkv.log import SegmentLog, fault_inject
log = SegmentLog.open({d!r}, durability="sync", segment_bytes=4096)
i = 0
while len(lt.segment_files({d!r})) < 2 or (
        lt.segment_files({d!r})[-1].stat().st_size + 500 + lt.FRAME_HDR <= 4096):
    print(log.append(lt.payload(i, 500)), flush=True)
    i += 1
fault_inject({op!r}, {nth}, kill=True)      # dies in the next roll: the segment, HEAD
for _ in range(3):
    print(log.append(lt.payload(i, 500)), flush=True)
    i += 1
"""


def test_recover_removes_what_a_writer_killed_mid_roll_left(tmp_path):
    """A writer SIGKILLed at each write and sync of a roll (a crash at an exact point, the
    fault hook's kill) can leave a <segment>.tmp or HEAD.tmp, which no reader lists
    (FORMAT.md section 1). The store opens and verifies clean, and recover removes them;
    every acknowledged frame reads back."""
    tests = os.path.dirname(__file__)
    left = set()
    # each kill point of a roll: the seal's, the segment's .tmp, its rename, HEAD's
    for op, nth in [*((op, n) for op in ("write", "fdatasync") for n in (1, 2, 3, 4)),
                    ("dirfsync", 1), ("dirfsync", 2)]:
        d = str(tmp_path / f"{op}{nth}")
        out = subprocess.run([sys.executable, "-c", _ROLL_AND_DIE.format(
            tests=tests, d=d, op=op, nth=nth)], capture_output=True, text=True, timeout=60)
        assert out.returncode == -9, out.stderr
        acked = {int(x): lt.payload(j, 500) for j, x in enumerate(out.stdout.split())}
        tmps = sorted(p.name for p in (tmp_path / f"{op}{nth}").glob("*.tmp"))
        left.update(t if t == "HEAD.tmp" else "<segment>.tmp" for t in tmps)
        assert verify(d).ok
        assert recover(d, dry_run=True).transients == len(tmps)     # told, and left
        assert sorted(p.name for p in (tmp_path / f"{op}{nth}").glob("*.tmp")) == tmps
        assert recover(d).transients == len(tmps)
        assert not list((tmp_path / f"{op}{nth}").glob("*.tmp")), (op, nth, tmps)
        assert recover(d).transients == 0
        _check_reopen(d, acked, {j: lt.payload(j, 500) for j in range(len(acked) + 3)})
    assert left == {"<segment>.tmp", "HEAD.tmp"}      # the kills did leave both kinds


def test_dirfsync_fault_creating_a_log(tmp_path, no_faults):
    no_faults("dirfsync", 1, errno.EIO)
    with pytest.raises(Exception) as ei:
        SegmentLog.open(str(tmp_path / "new"), durability="sync")
    assert isinstance(ei.value, (LogFailedError, OSError)) or "Input/output" in str(ei.value)
    no_faults(None)
    with SegmentLog.open(str(tmp_path / "new")) as log:
        assert log.append(b"x") == 0


def test_fault_hook_disarms(log_dir, no_faults):
    no_faults("write", 1, errno.EIO)
    no_faults(None)
    with SegmentLog.open(str(log_dir)) as log:
        assert log.append(b"fine") == 0


def test_close_after_failure_releases_lock(log_dir, no_faults):
    log = SegmentLog.open(str(log_dir))
    no_faults("fdatasync", 1, errno.EIO)
    with pytest.raises(LogFailedError):
        log.append(b"x")
    no_faults(None)
    _close_quietly(log)
    with SegmentLog.open(str(log_dir)) as again:
        assert again.next_lsn in (0, 1)
    assert os.path.exists(log_dir / "LOCK")


# ---- a fault at every position (SQLite testvfs countdown style) ---------------------------------


def _workload(d, durability, acked):
    """Open (repairing a torn tail), append across rolls, seal, append, close."""
    log = SegmentLog.open(str(d), durability=durability, segment_bytes=4096)
    try:
        for i in range(30):
            p = lt.payload(100 + i, 300)
            acked[log.append(p)] = p
            if durability != "sync" and i % 10 == 9:
                log.flush()
        log.seal()
        p = lt.payload(999, 10)
        acked[log.append(p)] = p
        log.flush()
    finally:
        log.close()


@pytest.fixture(scope="module")
def torn_template(tmp_path_factory):
    d = tmp_path_factory.mktemp("tpl") / "log"
    payloads = lt.make_log(d, 5, size=100, seal=False)
    seg = lt.segments(d)[-1]
    lt.truncate(seg.path, seg.frames[-1].offset + 30)      # frame 4 is torn
    return d, payloads[:4]


@pytest.mark.parametrize("durability", ["sync", "async"])
@pytest.mark.parametrize("op", ["write", "fdatasync", "dirfsync"])
def test_fault_at_every_position(tmp_path, torn_template, no_faults, op, durability):
    tpl, base = torn_template
    limit = 200
    for nth in range(1, limit):
        d = lt.copy_log(tpl, tmp_path / f"{op}-{nth}")
        acked = dict(enumerate(base))          # on disk and intact before the run
        err = errno.EIO if nth % 2 else errno.ENOSPC
        no_faults(op, nth, err)
        hit = False
        try:
            _workload(d, durability, acked)
        except LogFailedError:
            hit = True
        except DurkvError as e:                # a fault inside open: must say so clearly
            hit = True
            assert any(s in str(e) for s in ERRS[err]), f"nth={nth}: unclear error {e!r}"
        finally:
            no_faults(None)
        with SegmentLog.open(str(d), durability="sync") as log:
            got = dict(log.scan())
            assert set(got) == set(range(log.next_lsn)), f"{op} nth={nth}: not gap-free"
            for lsn, p in acked.items():
                assert got.get(lsn) == p, f"{op} nth={nth}: acknowledged lsn {lsn} lost"
            assert log.append(b"after") == log.next_lsn - 1
        assert any(q.read_bytes() for q in lt.quarantine_files(d)), \
            f"{op} nth={nth}: the torn tail was dropped without a copy"
        rep = verify(str(d))
        assert rep.ok, (op, nth, rep.to_dict())
        if not hit:
            break
    else:
        pytest.fail(f"the workload still hit the {op} fault at nth={limit}")
    assert nth > 1, f"no {op} call was ever made"


@pytest.mark.parametrize("op", ["write", "fdatasync"])
def test_a_failed_quarantine_copy_leaves_no_empty_file_and_names_no_dead_writer(
        log_dir, no_faults, op):
    """A full disk while a writer copies a torn tail to quarantine/: each failed try
    left an empty `.torn` file (an operator found 8 empty "copies" beside the real one),
    and the error said the tail was left by a writer that died when none had."""
    from durkv.log import fault_inject

    with SegmentLog.open(str(log_dir)) as log:
        for _ in range(5):
            log.append(b"x" * 100)
    act = lt.segments(str(log_dir))[-1]
    lt.truncate(act.path, act.frames[-1].end - 4)
    q = log_dir / "quarantine"
    for _ in range(3):
        fault_inject(op, 1, err=errno.ENOSPC)
        with pytest.raises(LogFailedError, match="No space left") as ei:
            SegmentLog.open(str(log_dir)).close()
        fault_inject(None)
        assert "that died" not in str(ei.value)
        assert not q.exists() or not list(q.iterdir())
    with SegmentLog.open(str(log_dir)) as log:
        assert log.next_lsn == 4
    assert [f.stat().st_size for f in q.iterdir()] == [act.frames[-1].end - 4
                                                        - act.frames[-1].offset]


_OPEN_ON_FULL_DISK = r"""
import sys, durkv
try:
    durkv.open(sys.argv[1]).close()
except durkv.LogFailedError as e:
    print("refused:", e)
"""


def test_a_first_open_on_a_full_disk_fails_with_enospc_not_sigbus(tmp_path):
    """WSHM was sized with ftruncate (a hole) and written through its mapping: on a full
    file system the first store to it killed the process with SIGBUS. A real full tmpfs
    (root only: the test mounts one)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        (mnt / "old.durkv").mkdir()         # a store dir made before the disk filled
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        for store in ("new.durkv", "old.durkv"):
            p = subprocess.run([sys.executable, "-c", _OPEN_ON_FULL_DISK, str(mnt / store)],
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, (p.returncode, p.stderr)     # -7: SIGBUS
            assert "refused:" in p.stdout and "No space left" in p.stdout, p.stdout
        os.unlink(mnt / "filler")
        durkv_open(str(mnt / "old.durkv")).close()      # space freed: it opens
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


@pytest.mark.parametrize("durability", ["async", "exit"])
@pytest.mark.parametrize("level", ["log", "store"])
def test_close_says_when_what_it_acknowledged_was_never_made_durable(
        log_dir, no_faults, durability, level):
    """Commits returned under `async`/`exit`, then every fdatasync fails (at close, or in
    the background flusher where no call sees it): close returned normally, the program
    was never told, and the atexit line was skipped because the log was closed."""
    d = str(log_dir)
    h = (SegmentLog.open(d, durability=durability, flush_interval_ms=60_000) if level == "log"
         else durkv_open(d, durability=durability, flush_interval_ms=60_000))
    for i in range(5):
        if level == "log":
            h.append(b"commit %d" % i)
        else:
            h.put("t", "", f"{i}", checkpoint={}, metadata={}, values={"n": i},
                  versions={"n": i})
    no_faults("fdatasync", 1, errno.EIO)
    with pytest.raises(LogFailedError, match="not made durable before close") as ei:
        h.close()
    assert "Input/output error" in str(ei.value) and ei.value.context.get("errno") == "EIO"
    no_faults(None)
    h.close()                                   # closed already: a no-op
    with SegmentLog.open(d) as log:             # what reached the file reads back
        assert log.next_lsn >= 5
