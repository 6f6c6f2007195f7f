"""A final flush that fails at interpreter exit is said on stderr (issue 7, item 11).

Under ``exit`` durability the commits are not made durable until close/flush/exit; losing
them when that last flush fails is within the policy's promise, saying nothing is not.
Each test runs a real process whose final flush really fails: a file-size limit
(RLIMIT_FSIZE, the kernel answers EFBIG) on frames still buffered in a write section, or
the log's own fault hook on the final fdatasync (outside a section a frame is written when
its section ends, FORMAT.md 12: only its fsync waits for the exit).
"""

from __future__ import annotations

import subprocess
import sys

import durkv

_STORE_CHILD = r"""
import resource, signal, sys
import durkv
path, n = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
s = durkv.open(path, durability="exit")
log = s._b._log
log.write_begin()       # frames wait in memory until the section ends (FORMAT.md 12)
for i in range(n):
    s.put("t", "", f"{i:08d}", checkpoint={}, metadata={"step": i},
          values={"msg": "x" * 500}, versions={"msg": i})
# no close: the interpreter's exit makes the commits durable, or says it could not
"""

_LOG_CHILD = r"""
import errno, sys
from durkv.log import SegmentLog, fault_inject
log = SegmentLog.open(sys.argv[1], durability="exit")
for i in range(7):
    log.append(b"frame %d" % i)     # written by its own write section, not yet synced
fault_inject("fdatasync", 1, errno.ENOSPC)
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=60)


def test_failed_exit_flush_names_the_store_and_the_lost_commits(tmp_path):
    path = tmp_path / "agent.durkv"
    proc = _run(_STORE_CHILD, str(path), "59")
    assert proc.returncode == 0, proc.stderr         # the loss is within exit's promise
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("durkv: 59 commits to ") and str(path) in line, line
    assert "not made durable at exit" in line and "File too large" in line, line
    with durkv.open(str(path)) as s:                  # the store still opens (tail repaired)
        assert len(list(s.history("t"))) < 59


def test_failed_exit_flush_of_a_log_with_the_fault_hook(tmp_path):
    path = tmp_path / "log"
    proc = _run(_LOG_CHILD, str(path))
    assert proc.returncode == 0
    assert proc.stderr.splitlines() == [
        f"durkv: 7 commits to {path} not made durable at exit: log failed: fdatasync failed on "
        f"{path}/0000000000000000.seg: No space left on device; free space on its file "
        "system, then reopen the store to recover"]


def test_clean_exit_says_nothing(tmp_path):
    path = tmp_path / "agent.durkv"
    proc = _run(_STORE_CHILD.replace("16384, 16384", "1 << 30, 1 << 30"), str(path), "59")
    assert proc.returncode == 0 and proc.stderr == ""
    with durkv.open(str(path), read_only=True) as s:
        assert len(list(s.history("t"))) == 59
