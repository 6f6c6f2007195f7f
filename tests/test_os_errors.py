"""OS errors reach the caller as durkv errors naming the file and the errno, and saying what
fixes them (docs/GUARANTEES.md sections 7, 12; a fault-injection review, s20).

Each test failed before its fix with a raw OSError / JSONDecodeError, or with a message
that named the wrong file or the wrong fix:

- a repair note (FORMAT.md 6a) that cannot be written, or is damaged;
- ``store.run()``'s driver claim on a full disk (``drivers/`` not creatable, its pid not
  writable as the claim file's size);
- ``size_bytes()`` without a free descriptor;
- the message of a failed handle: after a failed fdatasync while other writers are attached
  (a reopen alone cannot help), on ENOSPC / EMFILE, and a HEAD or directory failure
  naming HEAD or the directory instead of a segment.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys

import logtools as lt
import pytest
from click.testing import CliRunner

import durkv
import durkv.log
from durkv import repairnotes
from durkv.cli.main import cli
from durkv.errors import BackendError, CorruptionError, LogFailedError
from durkv.log import SegmentLog


# -- repair notes ----------------------------------------------------------------------------

def _damaged_store(d) -> None:
    """A store of 20 checkpoints with one byte flipped mid-log (a cut for --skip-corrupt)."""
    with durkv.open(str(d)) as s:
        for i in range(20):
            s.put("t", "", f"{i:03d}", checkpoint={}, metadata={}, values={"n": i},
                  versions={"n": i})
    seg = lt.segments(d)[-1]
    lt.flip_byte(seg.path, seg.frames[5].offset + 30, 0x10)


def _only_note(d):
    [note] = (d / "repairs").glob("*.json")
    return note


@pytest.fixture
def notes_full(monkeypatch):
    """fdatasync of a file under repairs/ fails with ENOSPC (the log's own, in C, does not)."""
    real = os.fdatasync

    def fdatasync(fd):
        if f"{os.sep}{repairnotes.NOTES_DIR}{os.sep}" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return monkeypatch


def test_a_repair_note_that_cannot_be_written_before_the_cut_is_log_failed_naming_it(
        tmp_path, notes_full):
    d = tmp_path / "s.durkv"
    _damaged_store(d)
    with pytest.raises(LogFailedError) as ei:
        durkv.log.recover(str(d), skip_corrupt=True)
    e = ei.value
    assert e.context["errno"] == "ENOSPC" and "No space left on device" in e.message
    assert f"{d}/repairs/" in e.message and e.message.split(":")[0].startswith("cannot write")
    assert "nothing was cut" in e.message and "free space" in e.message
    assert list((d / "repairs").iterdir()) == []            # no tmp file left behind
    assert not durkv.log.verify(str(d)).ok                  # true: nothing was cut
    res = CliRunner().invoke(cli, ["recover", "--skip-corrupt", str(d)])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"error: cannot write the repair note {d}/repairs/" in res.output, res.output
    notes_full.undo()
    assert durkv.log.recover(str(d), skip_corrupt=True).repair      # space again: it cuts


@pytest.fixture
def cut_not_recorded(tmp_path):
    d = tmp_path / "s.durkv"
    _damaged_store(d)
    return d, durkv.log.recover(str(d), skip_corrupt=True).repair


def test_a_repair_note_that_cannot_be_marked_recorded_fails_the_open_naming_it(
        cut_not_recorded, notes_full):
    d, rid = cut_not_recorded
    with pytest.raises(LogFailedError) as ei:
        durkv.open(str(d))
    e = ei.value
    assert e.context["errno"] == "ENOSPC" and e.context["path"] == f"{d}/repairs/{rid}.json"
    assert f"{d}/repairs/{rid}.json: No space left on device" in e.message
    assert "REPAIR record is durable" in e.message and "free space" in e.message
    notes_full.undo()
    assert repairnotes.read(str(d), rid)["state"] == "cut"
    with durkv.open(str(d)):                                  # records it (again)
        pass
    assert repairnotes.read(str(d), rid)["state"] == "recorded"


def test_a_damaged_recorded_note_does_not_stop_writers(cut_not_recorded, caplog):
    """8 zero bytes over a `recorded` note: every writer open raised JSONDecodeError,
    `durkv compact` and `recover --ack` printed a traceback."""
    d, _ = cut_not_recorded
    durkv.open(str(d)).close()                       # records the cut
    note = _only_note(d)
    lt.set_bytes(note, 0, b"\0" * 8)
    with caplog.at_level(logging.WARNING, logger="durkv"):
        with durkv.open(str(d)) as s:
            s.put("t", "", "new", checkpoint={}, metadata={}, values={"n": 99},
                  versions={"n": 99})
    assert any(str(note) in r.getMessage() and "`recorded`" in r.getMessage()
               for r in caplog.records), caplog.text
    [found] = repairnotes.problems(str(d))            # what verify says of it
    assert found["blocks_writers"] is False and "move it out of repairs/" in found["message"]
    res = CliRunner().invoke(cli, ["verify", str(d)])
    assert res.exit_code == 0 and f"warning: repair note {note} is damaged" in res.output
    res = CliRunner().invoke(cli, ["compact", str(d)])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output


def test_a_damaged_note_not_known_recorded_is_corruption_naming_it_and_what_to_do(
        cut_not_recorded):
    """A `cut` note zeroed whole: no writer can know whether its cut was recorded. Before:
    a raw JSONDecodeError at every writer open, tracebacks in the CLI."""
    d, rid = cut_not_recorded
    note = _only_note(d)
    note.write_bytes(b"\0" * len(note.read_bytes()))
    with pytest.raises(CorruptionError) as ei:
        durkv.open(str(d))
    e = ei.value
    assert e.kind == "bad_repair_note" and e.context["path"] == str(note)
    assert str(note) in e.message and "move the file out of repairs/" in e.message
    assert repairnotes.problems(str(d)) == [
        {"file": str(note), "blocks_writers": True, "message": e.message}]
    for args in (["compact", str(d)], ["recover", str(d), "--ack", "x"], ["recover", str(d)]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 3 and "Traceback" not in res.output, (args, res.output)
        assert f"error: repair note {note} is damaged" in res.output, res.output
        assert "Try: durkv verify" not in res.output    # a cut mends no note
    # verify finds it before a writer's open does (exit 3, named, in --json too)
    res = CliRunner().invoke(cli, ["verify", str(d)])
    assert res.exit_code == 3 and f"damage: repair note {note} is damaged" in res.output
    doc = json.loads(CliRunner().invoke(cli, ["verify", "--json", str(d)]).stdout)
    assert doc["ok"] is False and doc["repair_notes"][0]["blocks_writers"] is True
    with durkv.open(str(d), read_only=True) as s:     # readers are not concerned
        assert s.get("t").checkpoint_id
    # what the message says to do when the cut was not recorded: the stub it gives
    stub = e.message.split("replace its content with ")[1].split(": the next")[0]
    assert json.loads(stub)["id"] == rid
    note.write_text(stub)
    with durkv.open(str(d)):
        pass
    assert repairnotes.read(str(d), rid)["state"] == "recorded"
    assert repairnotes.problems(str(d)) == []


# -- the driver claim and size_bytes ---------------------------------------------------------

def test_store_run_on_a_full_disk_is_a_backend_error_naming_the_file(tmp_path, monkeypatch):
    """A real full tmpfs (no inode left: drivers/ cannot be made), then a claim whose pid
    cannot be recorded (ftruncate fails). Root only: the test mounts one."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=64", "tmpfs",
                       str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        s = durkv.open(str(mnt / "agent.durkv"))
        try:
            n = 0
            try:
                while True:
                    (mnt / f"f{n}").touch()
                    n += 1
            except OSError as e:
                assert e.errno == errno.ENOSPC
            with pytest.raises(BackendError) as ei:
                with s.run("r1"):
                    pass
            assert ei.value.context["errno"] == "ENOSPC", ei.value.context
            assert f"{mnt}/agent.durkv/drivers: No space left on device" in ei.value.message
            for i in range(n):
                (mnt / f"f{i}").unlink()
            with s.run("r1") as run:                        # inodes again: it runs
                assert run.step("a", lambda: 1) == 1
            monkeypatch.setattr(os, "ftruncate", lambda fd, n: (_ for _ in ()).throw(
                OSError(errno.ENOSPC, "No space left on device")))
            with pytest.raises(BackendError) as ei:
                with s.run("r2"):
                    pass
            assert ei.value.context["errno"] == "ENOSPC"
            assert f"{mnt}/agent.durkv/drivers/" in ei.value.message
            monkeypatch.undo()
            assert os.listdir(mnt / "agent.durkv" / "drivers") == []   # no claim left held
            with s.run("r2") as run:
                assert run.step("a", lambda: 2) == 2
        finally:
            s.close()
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


_NO_FD = r"""
import os, resource, sys, durkv
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
s = durkv.open(sys.argv[1])
s.put("t", "", "1", checkpoint={}, metadata={}, values={"n": 1}, versions={"n": 1})
held = []
while True:
    try:
        held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
try:
    s.size_bytes()
    print("ok")
except durkv.DurkvError as e:
    print(type(e).__name__, e.context.get("errno"), e)
except OSError as e:
    print("RAW", e)
for fd in held:
    os.close(fd)
s.close()
"""


def test_size_bytes_without_a_free_descriptor_is_a_backend_error(tmp_path):
    d = tmp_path / "s.durkv"
    p = subprocess.run([sys.executable, "-c", _NO_FD, str(d)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"BackendError EMFILE cannot list {d}: Too many open files"), \
        p.stdout


# -- what a failed handle's message says helps -----------------------------------------------

_FAILER = r"""
import sys
from durkv.errors import DurkvError
from durkv.log import SegmentLog, fault_inject
log = SegmentLog.open(sys.argv[1], durability="sync")
fault_inject("fdatasync", 1)
try:
    log.append(b"failer")
    print("acked", flush=True)
except DurkvError as e:
    print(e.message, flush=True)
"""


def test_after_a_failed_fsync_the_message_says_every_writer_must_close(tmp_path):
    """A failed fdatasync marks a shared store (GUARANTEES 18): every writer's next wait
    fails until every handle is closed. The message said "reopen the store to recover",
    which does not help while another writer stays attached; it names the writers now."""
    path = str(tmp_path / "log")
    mine = SegmentLog.open(path, durability="sync")
    idle = SegmentLog.open(path, durability="sync")     # another writer, attached and idle
    try:
        out = subprocess.run([sys.executable, "-c", _FAILER, path], capture_output=True,
                             text=True, timeout=60).stdout
        assert "fdatasync failed on" in out and "EVERY handle" in out, out
        assert f"{os.getpid()}," in out or f"{os.getpid()})" in out, out   # names us
        with pytest.raises(LogFailedError) as ei:
            mine.append(b"mine")
        m = ei.value.message
        assert "in another process writing this store" in m, m
        assert "reopen the store to recover" not in m and "every other writer" in m, m
        assert f"{os.getpid()} (this process)" in m, m
        idle.close()
        with pytest.raises(LogFailedError) as ei:        # alone now: a reopen clears it
            mine.append(b"mine")
        assert ei.value.message.endswith("; reopen the store to recover"), ei.value.message
    finally:
        idle.close()
        try:
            mine.close()
        except LogFailedError:
            pass
    with SegmentLog.open(path, durability="sync") as log:
        log.append(b"again")
    assert durkv.log.verify(path).ok


@pytest.mark.parametrize("err, fix", [
    (errno.ENOSPC, "No space left on device; free space on its file system, then reopen"),
    (errno.EMFILE, "Too many open files; raise the open-file limit (ulimit -n) or close "
                   "files, then reopen"),
])
def test_a_full_disk_or_fd_table_names_the_fix_not_only_a_reopen(log_dir, no_faults, err, fix):
    log = SegmentLog.open(str(log_dir))
    no_faults("write", 1, err)
    with pytest.raises(LogFailedError) as ei:
        log.append(b"x")
    assert fix in ei.value.message, ei.value.message
    with pytest.raises(LogFailedError) as again:         # every later call says it too
        log.append(b"y")
    assert fix in again.value.message
    no_faults(None)
    try:
        log.close()
    except LogFailedError:
        pass


def test_a_roll_failure_names_the_file_that_failed(log_dir, no_faults):
    """HEAD's update failing said "HEAD update failed on .../0000000000000001.seg"; a
    directory fsync named a segment too; the new segment's creation named the old one."""
    seen = {}
    for op in ("write", "fdatasync", "dirfsync"):
        for nth in range(1, 6):
            d = log_dir.parent / f"{op}{nth}"
            log = SegmentLog.open(str(d))
            log.append(b"x")
            no_faults(op, nth, errno.EIO)
            try:
                log.seal()
            except LogFailedError as e:
                what, _, rest = e.message.removeprefix("log failed: ").partition(" failed on ")
                seen.setdefault(what, set()).add(rest.split(": ")[0].removeprefix(str(d)))
            no_faults(None)
            try:
                log.close()
            except LogFailedError:
                pass
    assert seen["HEAD update"] == {"/HEAD"}, seen
    assert seen["directory fsync"] == {""}, seen         # the directory itself
    assert seen["write"] == {"/0000000000000000.seg", "/0000000000000001.seg"}, seen
