"""Repair notes: the durable witness of a cut, from before the cut until a store records it.

The log knows nothing of runs, so when ``recover --skip-corrupt`` cuts acknowledged
frames the store above must learn of it even if the process dies right after the cut.
A note in ``PATH/repairs/<id>.json`` (docs/FORMAT.md section 6a) is written durably
before the cut (``planned``), rewritten after it (``cut``: the quarantine files it made),
and marked ``recorded`` by the store once its REPAIR record is durable. Every rewrite is
tmp + fdatasync + rename + directory fsync, so a note is always one whole version.

Only file I/O here (json, fcntl): the store (durkv.store.repair) reads the cut bytes.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from contextlib import contextmanager
from typing import Any, Iterator

from .fsync import fsync_dir

__all__ = ["NOTES_DIR", "QUARANTINE_DIR", "PENDING", "begin", "finish", "void", "pending",
           "any_notes", "read", "write", "locked", "quarantine_names"]

NOTES_DIR = "repairs"
QUARANTINE_DIR = "quarantine"
PENDING = ("planned", "cut")        # states a store must still record
FORMAT = 1


def quarantine_names(path: str) -> list[str]:
    """The file names in ``path/quarantine/`` (sorted; none: [])."""
    q = os.path.join(path, QUARANTINE_DIR)
    try:
        return sorted(os.listdir(q))
    except FileNotFoundError:
        return []


def write(path: str, note: dict) -> None:
    """Replace the note ``note["id"]`` durably (tmp, fdatasync, rename, dir fsync)."""
    d = os.path.join(path, NOTES_DIR)
    if not os.path.isdir(d):
        os.makedirs(d, exist_ok=True)
        fsync_dir(path)
    final = os.path.join(d, note["id"] + ".json")
    tmp = final + ".tmp"
    with open(tmp, "w") as f:
        json.dump(note, f, sort_keys=True)
        f.flush()
        os.fdatasync(f.fileno())
    os.rename(tmp, final)
    fsync_dir(d)


def read(path: str, note_id: str) -> dict:
    with open(os.path.join(path, NOTES_DIR, note_id + ".json")) as f:
        return json.load(f)


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
    try:
        return any(n.endswith(".json") for n in os.listdir(os.path.join(path, NOTES_DIR)))
    except (FileNotFoundError, NotADirectoryError):
        return False


def pending(path: str) -> list[dict]:
    """The notes a store must still record, oldest first."""
    out = []
    try:
        names = sorted(os.listdir(os.path.join(path, NOTES_DIR)))
    except (FileNotFoundError, NotADirectoryError):
        return out
    for n in names:
        if n.endswith(".json"):
            note = read(path, n[:-5])
            if note.get("state") in PENDING:
                out.append(note)
    return out


@contextmanager
def locked(path: str, note_id: str) -> Iterator[dict]:
    """Hold an exclusive flock on the note while recording it; yields the note as it is
    now on disk (another process may have recorded it while we waited). The lock is on
    ``<id>.lock``, never renamed (a rewrite renames the note onto a new inode)."""
    fd = os.open(os.path.join(path, NOTES_DIR, note_id + ".lock"),
                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield read(path, note_id)
    finally:
        os.close(fd)        # releases the lock
