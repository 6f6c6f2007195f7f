"""File descriptors do not grow with the log (issue 7, item 10).

Sealed segments are opened on demand and at most a fixed number of their descriptors
stay open (csrc/segfd.c), so a store of more segments than ``ulimit -n`` opens, reads,
verifies and appends. Readers on other threads may pread an evicted descriptor: it is
closed only once no reader can hold it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading

import durkv
from durkv.errors import NotFoundError
from durkv.log import SegmentLog

SEGMENTS = 1150          # more than the 1,024 of the default `ulimit -n`
TINY = 160               # segment_bytes: one small frame per segment


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _payload(i: int) -> bytes:
    return f"frame-{i:06d}".encode() * 3


def _many_segment_log(path, n: int) -> None:
    with SegmentLog.open(str(path), durability="exit", segment_bytes=TINY) as log:
        for i in range(n):
            log.append(_payload(i))


def _segment_files(path) -> int:
    return sum(1 for f in os.listdir(path) if f.endswith(".seg"))


_CHILD = r"""
import json, os, resource, sys
import durkv
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
path, n = sys.argv[1], int(sys.argv[2])
out = {}
with durkv.open(path, segment_bytes=160) as s:
    out["latest"] = [s.get(f"t{k}", "").values["msgs"][-1] for k in range(7)]
    out["history"] = sum(1 for _ in s.history("t3"))
    out["verify_ok"] = s.verify().ok
    s.put("t0", "", f"{n:08d}", checkpoint={}, metadata={"step": n},
          values={"msgs": ["after"]}, versions={"msgs": n})
    out["fds_open"] = len(os.listdir("/proc/self/fd"))
with durkv.open(path, read_only=True) as r:
    out["reopened"] = r.get("t0", "").values["msgs"]
print(json.dumps(out))
"""


def test_store_of_more_segments_than_the_fd_limit_opens_reads_verifies_appends(tmp_path):
    path = tmp_path / "many.durkv"
    n = SEGMENTS
    with durkv.open(str(path), durability="exit", segment_bytes=TINY) as s:
        for i in range(n):
            s.put(f"t{i % 7}", "", f"{i:08d}", checkpoint={}, metadata={"step": i},
                  values={"msgs": [i]}, versions={"msgs": i})
    assert _segment_files(path) > 1100
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(n)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["latest"] == [max(range(k, n, 7)) for k in range(7)]
    assert out["history"] == len(range(3, n, 7))
    assert out["verify_ok"] is True
    assert out["reopened"] == ["after"]
    assert out["fds_open"] < 128, out


def test_log_reads_every_segment_with_bounded_fds(tmp_path):
    path = tmp_path / "log"
    n = 160
    _many_segment_log(path, n)
    before = _open_fds()
    with SegmentLog.open(str(path), segment_bytes=TINY) as log:
        assert _open_fds() - before < 80          # 64 sealed + active + lock, not 160
        order = list(range(n))
        random.Random(7).shuffle(order)
        for lsn in order:                          # misses everywhere: evict and reopen
            assert log.read(lsn) == _payload(lsn)
        assert [p for _, p in log.scan()] == [_payload(i) for i in range(n)]
        assert _open_fds() - before < 80
        log.append(b"tail")
        assert log.read(n) == b"tail"
    assert _open_fds() == before


def test_concurrent_readers_never_read_through_a_closed_fd(tmp_path):
    """Eight threads read random LSNs of 160 one-frame segments: every eviction happens
    while other threads are mid-pread, so an fd closed (and its number reused by the next
    open) under a reader would return another segment's frame or EBADF."""
    path = tmp_path / "log"
    n = 160
    _many_segment_log(path, n)
    errors: list[BaseException] = []
    with SegmentLog.open(str(path), read_only=True) as log:
        def reader(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for _ in range(1500):
                    lsn = rng.randrange(n)
                    got = log.read(lsn)
                    if got != _payload(lsn):
                        raise AssertionError(f"lsn {lsn}: read {got[:20]!r}")
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=reader, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[0]


def test_reader_of_a_segment_compacted_away_gets_its_frame_or_not_found(tmp_path):
    """A reader whose handle predates a compaction may find an old segment gone (its fd
    was not kept open): it gets the frame, or NotFoundError naming the file -- never
    another frame, never a bare I/O error."""
    path = tmp_path / "log"
    n = 100
    _many_segment_log(path, n)
    with SegmentLog.open(str(path), read_only=True) as reader, \
            SegmentLog.open(str(path), segment_bytes=TINY) as writer:
        writer.append(b"new")
        writer.seal(new_start_lsn=n)            # unlinks every segment below LSN n
        assert reader.read(n - 1) == _payload(n - 1)   # newest segments: fd still cached
        for lsn in range(n):
            try:
                assert reader.read(lsn) == _payload(lsn)
            except NotFoundError as e:
                assert f"{lsn:016x}.seg" in str(e) and "No such file" in str(e), e
                assert e.context.get("errno") == "ENOENT"
