"""Errors by code, with the file and the errno (issue 7 item 12, issue 8 item 4).

The C log returns a distinct code for each kind of failure and keeps the errno of an
I/O error; durkv.log maps codes to classes through one table, and the message names the
file and says strerror. The command line turns each into one line and exit 1, never
click's usage text.

Permission cases run in a child process that obeys file modes: as root, the child drops
CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its bounding set before exec (so it is root
that chmod binds), as anyone else it is simply that user.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import sys
import threading

import logtools as lt
import pytest
from durkv import errors
from durkv.log import ERROR_CLASSES, SegmentLog, lib, verify

_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


def _obey_file_modes() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0):
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _run(args: list[str]) -> subprocess.CompletedProcess:
    """Run ``python args...`` in a child bound by file permissions."""
    pre = _obey_file_modes if os.geteuid() == 0 else None
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60,
                          preexec_fn=pre)


_API_CHILD = r"""
import json, sys
import durkv
from durkv.errors import DurkvError
from durkv.log import SegmentLog, recover, verify
what, path = sys.argv[1], sys.argv[2]
calls = {
    "verify": lambda: verify(path),
    "recover": lambda: recover(path),
    "open": lambda: SegmentLog.open(path),
    "open_read_only": lambda: SegmentLog.open(path, read_only=True),
    "store_read_only": lambda: durkv.open(path, read_only=True),
}
try:
    calls[what]()
except DurkvError as e:
    print(json.dumps({"class": type(e).__name__, "message": e.message,
                      "errno": e.context.get("errno")}))
else:
    print(json.dumps({"class": None}))
"""


def _api_error(what: str, path) -> dict:
    proc = _run(["-c", _API_CHILD, what, str(path)])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _cli(*args) -> subprocess.CompletedProcess:
    return _run(["-m", "durkv.cli", *(str(a) for a in args)])


def _assert_one_error_line(proc, *needles: str, code: int = 1) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Usage:" not in proc.stderr and "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture
def store_dir(tmp_path):
    """A small log (two sealed segments and an active one), restored to 0755 afterwards."""
    d = tmp_path / "agent.durkv"
    lt.make_log(d, 8, size=40, per_segment=4, seal=True, tail=2)
    yield d
    os.chmod(d, 0o755)


# ---- the mapping is a table of codes -------------------------------------------------------


def test_every_error_code_maps_to_a_class():
    assert ERROR_CLASSES[lib.DKV_ETOOBIG] is errors.FrameTooLargeError
    assert ERROR_CLASSES[lib.DKV_ENOLSN] is errors.NotFoundError
    assert ERROR_CLASSES[lib.DKV_EINVAL] is errors.ConfigError
    codes = {getattr(lib, n) for n in dir(lib) if n.startswith("DKV_E") and getattr(lib, n) < 0}
    handled = set(ERROR_CLASSES) | {lib.DKV_ECORRUPT, lib.DKV_ECLOSED, lib.DKV_ENOMEM}
    assert codes == handled
    names = {lib.dkv_strerror(c) for c in codes}
    assert len(names) == len(codes)         # every code has its own name


def test_lsn_errors_are_not_found_by_code(log_dir):
    with SegmentLog.open(str(log_dir)) as log:
        log.append(b"x")
        with pytest.raises(errors.NotFoundError, match="lsn 5 is not in the log"):
            log.read(5)
        with pytest.raises(errors.NotFoundError, match="has not been appended"):
            log.wait_durable(9)
        with pytest.raises(errors.ConfigError):       # a bad option stays a ConfigError
            log.seal(new_start_lsn=99)


# ---- verify racing a compaction that unlinks a segment -------------------------------------


def test_verify_of_a_segment_gone_since_the_listing_names_it_and_the_errno(store_dir):
    """A listed segment that is gone when verify opens it (what a writer's compaction does
    between verify's listing and its open): a dangling name makes the window permanent."""
    gone = store_dir / "00000000000000ff.seg"
    os.symlink(store_dir / "nowhere", gone)
    with pytest.raises(errors.LogFailedError) as ei:
        verify(str(store_dir))
    e = ei.value
    assert e.message.startswith(f"segment {gone} is gone since verify listed the directory")
    assert "run verify again" in e.message
    assert e.message.endswith("cannot open it: No such file or directory")
    assert e.context["errno"] == "ENOENT" and e.context["path"] == str(store_dir)
    _assert_one_error_line(_cli("verify", store_dir), str(gone), "No such file or directory")


def test_verify_racing_real_compactions_reports_files_not_bare_io_errors(tmp_path):
    """A writer compacts (unlinks old segments) in a loop while verify runs: verify either
    succeeds or names the segment it lost and the errno."""
    d = tmp_path / "log"
    stop = threading.Event()
    seen: list[str] = []
    with SegmentLog.open(str(d), durability="async", segment_bytes=4096) as log:
        def compact() -> None:
            while not stop.is_set():
                for _ in range(20):
                    log.append(b"z" * 300)
                log.seal(new_start_lsn=log.next_lsn)

        t = threading.Thread(target=compact)
        t.start()
        try:
            for _ in range(300):
                try:
                    verify(str(d))
                except errors.DurkvError as e:
                    seen.append(e.message)
        finally:
            stop.set()
            t.join()
    for msg in seen:
        assert ".seg" in msg and "No such file or directory" in msg, msg


# ---- an unreadable store -------------------------------------------------------------------


@pytest.mark.parametrize("what", ["verify", "open_read_only", "store_read_only"])
def test_unreadable_store_error_names_the_directory_and_strerror(store_dir, what):
    os.chmod(store_dir, 0o000)
    got = _api_error(what, store_dir)
    assert got["class"] == "LogFailedError", got
    assert got["message"] == f"cannot list {store_dir}: Permission denied", got
    assert got["errno"] == "EACCES"


@pytest.mark.parametrize("command", [["verify"], ["recover"], ["ls"], ["history", "t"],
                                     ["show", "t"]])
def test_unreadable_path_is_one_line_exit_1_not_a_usage_error(store_dir, command):
    os.chmod(store_dir, 0o000)
    proc = _cli(command[0], store_dir, *command[1:])
    _assert_one_error_line(proc, str(store_dir), "Permission denied")


# ---- recover on a read-only directory ------------------------------------------------------


def test_recover_on_a_read_only_directory_names_the_file_and_strerror(store_dir):
    """A torn tail to repair, in a directory nobody may write: recover cannot create
    quarantine/; it says so, with the segment, the directory and EACCES."""
    act = lt.segments(store_dir)[-1]
    lt.truncate(act.path, act.frames[-1].end - 4)
    os.chmod(store_dir, 0o555)
    got = _api_error("recover", store_dir)
    assert got["class"] == "LogFailedError", got
    assert got["message"] == (f"cannot move the damaged part of {store_dir}/{act.path.name} "
                              f"to {store_dir}/quarantine/: Permission denied"), got
    assert got["errno"] == "EACCES"
    _assert_one_error_line(_cli("recover", store_dir), act.path.name, "Permission denied")
    os.chmod(store_dir, 0o755)
    assert lt.segments(store_dir)[-1].path.stat().st_size == act.path.stat().st_size


def test_recover_when_the_lock_file_cannot_be_opened(store_dir):
    os.chmod(store_dir / "LOCK", 0o444)        # left by the writer that made the log
    try:
        got = _api_error("recover", store_dir)
        assert got["class"] == "LogFailedError", got
        assert got["message"].startswith(f"cannot open {store_dir}/LOCK"), got
        assert got["message"].endswith(": Permission denied") and got["errno"] == "EACCES"
    finally:
        os.chmod(store_dir / "LOCK", 0o644)


def test_errno_survives_a_write_failure(log_dir, no_faults):
    log = SegmentLog.open(str(log_dir))
    no_faults("fdatasync", 1, errno.EIO)
    with pytest.raises(errors.LogFailedError) as ei:
        log.append(b"x")
    assert ei.value.context["errno"] == "EIO"
    assert ei.value.message.endswith("Input/output error; reopen the store to recover")
    with pytest.raises(errors.LogFailedError) as again:      # every later call: same errno
        log.append(b"y")
    assert again.value.context["errno"] == "EIO"
    no_faults(None)
    try:
        log.close()
    except errors.DurkvError:
        pass


def test_a_store_path_too_long_for_its_files_is_enametoolong_not_a_cut_path(tmp_path):
    """A store directory that can be made but whose files' paths pass PATH_MAX: the open
    fails with the errno and the path, and creates nothing anywhere (every path the C
    log builds is length-checked: a path cut at its buffer's size could name another
    file or directory)."""
    parent = str(tmp_path)
    while len(parent) < 3900:
        parent = os.path.join(parent, "d" * min(200, 3900 - len(parent)))
    os.makedirs(parent)
    store = os.path.join(parent, "s" * (4085 - len(parent) - 1))    # its segment: > 4096
    with pytest.raises(errors.LogFailedError, match="File name too long") as ei:
        SegmentLog.open(store, durability="sync")
    assert ei.value.context["errno"] == "ENAMETOOLONG"
    assert os.listdir(parent) in ([], [os.path.basename(store)])   # nothing cut short
    if os.path.isdir(store):
        assert not [n for n in os.listdir(store) if n.endswith(".seg")]


def test_the_package_version_is_written_once():
    """pyproject.toml reads the version from durkv.__version__ (kernel/__init__.py, the
    one place it is written): the installed package's metadata says the same."""
    from importlib.metadata import version

    import durkv

    assert version("durkv") == durkv.__version__
