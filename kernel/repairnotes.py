"""Repair notes: the durable witness of a cut, from before the cut until a store records it.

The log knows nothing of runs, so when ``recover --skip-corrupt`` cuts acknowledged
frames the store above must learn of it even if the process dies right after the cut.
A note in ``PATH/repairs/<id>.json`` (docs/FORMAT.md section 6a) is written durably
before the cut (``planned``), rewritten after it (``cut``: the quarantine files it made),
and marked ``recorded`` by the store once its REPAIR record is durable. Every rewrite is
tmp + fdatasync + rename + directory fsync, so a note is always one whole version.

Errors are typed (docs/GUARANTEES.md sections 7, 12): a note that cannot be written or
read is :class:`LogFailedError` naming the file, the errno (``context["errno"]``) and what
fixes it; a note whose bytes are not a note (damaged) is :class:`CorruptionError` naming
the file and what the operator can do -- unless its text still shows it ``recorded`` (or
``void``): then nothing is left to record, and it is skipped with a warning.

Only file I/O here (json, fcntl): the store (durkv.store.repair) reads the cut bytes.
"""

from __future__ import annotations

import errno as _errno
import fcntl
import json
import logging
import os
import re
import secrets
import time
from contextlib import contextmanager
from typing import Any, Iterator

from .errors import CorruptionError, LogFailedError
from .fsync import fsync_dir

__all__ = ["NOTES_DIR", "QUARANTINE_DIR", "PENDING", "begin", "finish", "void", "pending",
           "any_notes", "read", "write", "locked", "quarantine_names", "problems"]

log = logging.getLogger("durkv")

NOTES_DIR = "repairs"
QUARANTINE_DIR = "quarantine"
PENDING = ("planned", "cut")        # states a store must still record
_STATES = PENDING + ("recorded", "void")
FORMAT = 1

# what fixes an errno, before the operation is tried again
_FIXES = {
    _errno.ENOSPC: "free space on its file system",
    _errno.EDQUOT: "free space or raise the disk quota",
    _errno.EMFILE: "raise the open-file limit (ulimit -n) or close files",
    _errno.ENFILE: "close files (the system's open-file table is full)",
    _errno.EROFS: "remount its file system read-write",
    _errno.EACCES: "give this user access to it",
    _errno.EPERM: "give this user access to it",
}


def _io_error(e: OSError, what: str, file: str, then: str, left: str = "") -> LogFailedError:
    """``<what> <file>: <strerror>[; <left>]; <fix>, then <then>``, the errno's name in
    the error's context (docs/GUARANTEES.md 12)."""
    fix = _FIXES.get(e.errno or 0)
    msg = (f"{what} {file}: {e.strerror or e}" + (f"; {left}" if left else "")
           + "; " + (f"{fix}, then {then}" if fix else then))
    return LogFailedError(msg, path=file,
                          errno=_errno.errorcode.get(e.errno or 0, str(e.errno)))


def _listdir(d: str) -> list[str]:
    """The names in ``d``, sorted (no such directory: [])."""
    try:
        return sorted(os.listdir(d))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise _io_error(e, "cannot list", d, "try again") from e


def quarantine_names(path: str) -> list[str]:
    """The file names in ``path/quarantine/`` (sorted; none: [])."""
    return _listdir(os.path.join(path, QUARANTINE_DIR))


def _note_file(path: str, note_id: str) -> str:
    return os.path.join(path, NOTES_DIR, note_id + ".json")


# a failed write of a note in each state: what it leaves, and what to do then
_WRITE_FAILED = {
    "planned": ("nothing was cut (the log is as it was)", "run recover again"),
    "cut": ("the log WAS cut (its bytes are in quarantine/) but the note still says "
            "`planned`", "open the store with a writer (durkv.open): it records the cut "
            "from the planned note"),
    "void": ("nothing was cut (the store was locked) but the note still says `planned`",
             "delete the note before a writer opens the store (that open would record "
             "an empty cut)"),
    "recorded": ("the REPAIR record is durable but the note still says it is not "
                 "recorded", "open the store again: a writer's open records it again "
                 "(the same repair id twice is one repair)"),
}


def write(path: str, note: dict) -> None:
    """Replace the note ``note["id"]`` durably (tmp, fdatasync, rename, dir fsync).

    A failure is LogFailedError naming the file and the errno, and what the note on disk
    (its previous version: the tmp file is removed) means now."""
    d = os.path.join(path, NOTES_DIR)
    final = _note_file(path, note["id"])
    tmp = final + ".tmp"
    at = d
    try:
        if not os.path.isdir(d):
            os.makedirs(d, exist_ok=True)
            fsync_dir(path)
        at = final
        with open(tmp, "w") as f:
            json.dump(note, f, sort_keys=True)
            f.flush()
            os.fdatasync(f.fileno())
        os.rename(tmp, final)
        fsync_dir(d)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        left, then = _WRITE_FAILED.get(note.get("state"), ("", "try again"))
        what = "cannot write the repair note" if at == final else "cannot create"
        raise _io_error(e, what, at, then, left) from e


# A note's text as json.dump(sort_keys=True) wrote it: `"state": "<state>"` can stand
# only as the key and its value (a quote inside a JSON string is escaped), so a damaged
# note whose bytes still hold it says which state it was written in.
_STATE_TEXT = re.compile(rb'"state": "([a-z]+)"')


def _damaged(path: str, note_id: str, why: str) -> CorruptionError:
    file = _note_file(path, note_id)
    stub = json.dumps({"format": FORMAT, "id": note_id, "state": "planned",
                       "lost_first_lsn": 0, "before": []})
    return CorruptionError(
        f"repair note {file} is damaged ({why}): durkv cannot tell whether the cut it "
        "witnesses was recorded, so a writer does not open the store. If `durkv runs "
        f"{path}` lists runs damaged by repair {note_id}, it was: move the file out of "
        f"{NOTES_DIR}/ (into {QUARANTINE_DIR}/). If not, replace its content with {stub}: "
        f"the next writer open records it as a cut of everything in {QUARANTINE_DIR}/ "
        "(more runs held than the cut touched, none missed)",
        kind="bad_repair_note", path=file)


def _parse(path: str, note_id: str, data: bytes) -> dict:
    """The note in ``data``, checked enough for a store to record it; else
    CorruptionError (:func:`_damaged`)."""
    try:
        note = json.loads(data.decode("utf-8"))
    except ValueError as e:     # UnicodeDecodeError, JSONDecodeError
        raise _damaged(path, note_id, f"not JSON: {e}") from None
    if type(note) is not dict:
        raise _damaged(path, note_id, "not a JSON object")
    if note.get("id") != note_id:
        raise _damaged(path, note_id, f"its id is {note.get('id')!r}")
    state = note.get("state")
    if state not in _STATES:
        raise _damaged(path, note_id, f"unknown state {state!r}")
    if state in PENDING and type(note.get("lost_first_lsn")) is not int:
        raise _damaged(path, note_id, "no lost_first_lsn")
    return note


def _read_bytes(path: str, note_id: str) -> bytes:
    file = _note_file(path, note_id)
    try:
        with open(file, "rb") as f:
            return f.read()
    except OSError as e:
        raise _io_error(e, "cannot read the repair note", file, "open the store again") from e


def read(path: str, note_id: str) -> dict:
    """The note ``note_id``: LogFailedError when it cannot be read (not found included),
    CorruptionError when it is damaged."""
    return _parse(path, note_id, _read_bytes(path, note_id))


def begin(path: str, plan: Any) -> dict | None:
    """Before a cut: the durable ``planned`` note of the plan (a :class:`durkv.log.Report`
    of a dry run), or None when the plan cuts nothing acknowledged (no damage, or only a
    torn tail)."""
    if not any(d.kind != "torn_tail" for d in plan.damage):
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    note = {"format": FORMAT, "id": f"{stamp}-{secrets.token_hex(4)}", "state": "planned",
            "lost_first_lsn": plan.next_lsn, "damage": [vars(d) for d in plan.damage],
            "before": quarantine_names(path)}
    write(path, note)
    return note


def finish(path: str, note: dict, report: Any) -> dict:
    """After the cut: the note again, ``cut``, with the files the cut put in quarantine/."""
    before = set(note["before"])
    note = dict(note, state="cut", lost_first_lsn=report.next_lsn,
                damage=[vars(d) for d in report.damage],
                files=[n for n in quarantine_names(path) if n not in before])
    write(path, note)
    return note


def void(path: str, note: dict, why: str) -> None:
    """The cut never happened (nothing changed): the note stays, marked ``void``."""
    write(path, dict(note, state="void", why=why))


def any_notes(path: str) -> bool:
    """Whether ``path`` ever had a repair note (one listing: the cost of a store open)."""
    return any(n.endswith(".json") for n in _listdir(os.path.join(path, NOTES_DIR)))


def _notes(path: str) -> Iterator[tuple[str, dict | None, CorruptionError | None]]:
    """(id, note, None) of every note, oldest first; (id, None, error) of a damaged one."""
    for n in _listdir(os.path.join(path, NOTES_DIR)):
        if n.endswith(".json"):
            data = _read_bytes(path, n[:-5])
            try:
                yield n[:-5], _parse(path, n[:-5], data), None
            except CorruptionError as e:
                m = _STATE_TEXT.search(data)
                e.context["state"] = m.group(1).decode() if m else None
                yield n[:-5], None, e


def _skipped(e: CorruptionError) -> str:
    return (f"{e.context['path']} is damaged, but its text still says "
            f"`{e.context['state']}`: nothing is left to record, it is skipped; move it out "
            f"of {NOTES_DIR}/ (into {QUARANTINE_DIR}/) to end this warning")


def pending(path: str) -> list[dict]:
    """The notes a store must still record, oldest first. A damaged note is
    CorruptionError unless its text still says ``recorded`` or ``void`` (skipped, with a
    warning)."""
    out = []
    for _, note, err in _notes(path):
        if err is not None:
            if err.context["state"] not in ("recorded", "void"):
                raise err
            log.warning("durkv: repair note %s", _skipped(err))
        elif note is not None and note["state"] in PENDING:
            out.append(note)
    return out


def problems(path: str) -> list[dict]:
    """Each repair note of the store at ``path`` that cannot be read, for ``verify`` (a
    damaged note is found before a writer's open refuses): ``{"file", "blocks_writers",
    "message"}``, the message saying what to do."""
    out = []
    for _, _, err in _notes(path):
        if err is not None:
            skipped = err.context["state"] in ("recorded", "void")
            out.append({"file": err.context["path"], "blocks_writers": not skipped,
                        "message": f"repair note {_skipped(err)}" if skipped
                        else err.message})
    return out


@contextmanager
def locked(path: str, note_id: str) -> Iterator[dict]:
    """Hold an exclusive flock on the note while recording it; yields the note as it is
    now on disk (another process may have recorded it while we waited). The lock is on
    ``<id>.lock``, never renamed (a rewrite renames the note onto a new inode)."""
    lock = os.path.join(path, NOTES_DIR, note_id + ".lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise _io_error(e, "cannot open the lock of a repair note", lock,
                        "open the store again") from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            raise _io_error(e, "cannot lock", lock, "open the store again") from e
        yield read(path, note_id)
    finally:
        os.close(fd)        # releases the lock
