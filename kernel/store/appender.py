"""Appending store frames: the one door to the backend's log, its verbs named for what they
promise, and the backend's next LSN, known without asking.

Every frame the store writes -- checkpoints, pending writes, journal records, small
records, index snapshots, compaction's copies -- reaches the backend through one
:class:`Appender`, under the store's lock, by one of these verbs:

- :meth:`queue` promises nothing yet: the frame is queued (no write, no wait), and the
  caller gives it its promise after releasing the lock with :meth:`settle`, or a
  :meth:`flush` does (checkpoints, pending writes, journal records owed an fdatasync,
  the REPAIR record, compaction's copies);
- :meth:`settle`, outside the lock, gives a queued frame ``sync`` (fdatasync'd) or
  ``async`` (written to the OS) with every frame queued before it, so that concurrent
  committers share one write and one fsync (group commit);
- :meth:`write` keeps the store's policy without its fdatasync: written to the OS
  (``sync``, ``async``) or buffered (``exit``) (index snapshots, journal records not owed
  an fdatasync); :meth:`write_alone` the same in a write section of its own, one backend
  call (a journal record appended outside any section);
- :meth:`commit` keeps the store's policy before it returns, an fdatasync waited for under
  the lock (deletes, copies, prunes: rare);
- :meth:`flush` makes every frame appended so far durable, whatever the policy
  (``Store.flush``, compaction).

Waiting under the lock -- as an ``async`` append must, behind a running fdatasync --
made other threads' commits queue on the lock one fsync apart, never sharing one: so a
commit is only queued under the lock and settled after it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Appender"]


class Appender:
    """The one way frames reach the backend (see the module docstring)."""

    __slots__ = ("backend", "durability", "max_commit_bytes", "next")

    def __init__(self, backend: Any, durability: str, max_commit_bytes: int) -> None:
        self.backend = backend
        self.durability = durability          # the store's policy
        self.max_commit_bytes = max_commit_bytes
        self.next = -1    # LSN of the next append when known (saves a backend call per put)

    def next_lsn(self) -> int:
        n = self.next
        return n if n >= 0 else self.backend.next_lsn

    def forget(self) -> None:
        """The backend's tail may have moved without this appender (another process's
        frames, a compaction): ask it again."""
        self.next = -1

    def queue(self, payload: bytes) -> int:
        """Append ``payload`` with no write and no wait (the backend's ``exit``); returns
        its LSN. :meth:`settle`, outside the lock, or :meth:`flush` gives it its promise."""
        self.next = -1       # unknown if the append raises
        lsn = self.backend.append(payload, "exit")     # every commit's path: no more calls
        self.next = lsn + 1
        return lsn

    def write(self, payload: bytes) -> int:
        """Append ``payload`` under the store's policy, never waiting for its fdatasync
        (``sync`` is written as ``async``: the flusher syncs it soon after)."""
        d = self.durability
        self.next = -1
        lsn = self.backend.append(payload, "async" if d == "sync" else d)
        self.next = lsn + 1
        return lsn

    def write_alone(self, payload: bytes, expect: int) -> int:
        """:meth:`write` in a write section of its own, for a caller under the store's lock
        that holds none: the section's begin, the append and its end in one backend call
        (``append_one``), provided the backend's log is where the caller's index stands
        -- its next LSN is ``expect``. Returns the LSN, or -1: another process appended
        since, nothing was appended (take those frames in, in a section, then write)."""
        d = self.durability
        self.next = -1
        lsn = self.backend.append_one(payload, expect, "async" if d == "sync" else d)
        if lsn >= 0:
            self.next = lsn + 1
        return lsn

    def commit(self, payload: bytes) -> int:
        """Append ``payload`` and keep the store's policy before returning: under ``sync``
        its fdatasync is waited for here, under the lock (delete, copy, remove: rare)."""
        lsn = self.write(payload)
        if self.durability == "sync":
            self.backend.wait_durable(lsn)
        return lsn

    def settle(self, lsn: int, durability: str) -> None:
        """Outside the lock: give frame ``lsn``, appended by :meth:`queue`, the promise of
        ``durability`` (``sync``: fdatasync'd; ``async``: written to the OS; ``exit``:
        none), with every frame before it."""
        if durability == "sync":
            self.backend.wait_durable(lsn)
        elif durability == "async":
            self.backend.wait_written(lsn)

    def flush(self) -> None:
        """Make every frame appended so far durable, whatever the policy."""
        self.backend.flush()
