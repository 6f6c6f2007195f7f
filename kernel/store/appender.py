"""Appending store frames: the backend's next LSN, known without asking, and the policy.

Every writer of the store (checkpoints, pending writes, journal records, small
records, index snapshots) appends through one :class:`Appender`, under the store's
lock. A commit is only *queued* there (:meth:`Appender.queue`); the caller waits for
its write or its fsync after releasing the lock (:meth:`Appender.settle`), so that
concurrent committers share one write and one fsync (group commit). Waiting under
the lock -- as an ``async`` append must, behind a running fdatasync -- made other
threads' commits queue on the lock one fsync apart, never sharing one.
"""

from __future__ import annotations

from typing import Any

from ..payload import encode_commit
from .records import pack_head

__all__ = ["Appender"]

_SETTLED = frozenset(("sync", "async"))     # the policies Appender.settle waits for


class Appender:
    """The one way frames reach the backend (under the store's lock)."""

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
        """The backend's tail moves without this appender (compaction): ask it again."""
        self.next = -1

    def append(self, payload: bytes, durability: str | None) -> int:
        """Append ``payload``; ``sync`` is written, not waited for (see the module doc)."""
        self.next = -1
        lsn = self.backend.append(payload, "async" if durability == "sync" else durability)
        self.next = lsn + 1
        return lsn

    def queue(self, payload: bytes, durability: str) -> int:
        """Append ``payload`` without waiting: under ``sync`` or ``async`` it is only queued
        ("exit": no write, no wait) until :meth:`settle`, which the caller runs after
        releasing the lock."""
        self.next = -1
        lsn = self.backend.append(payload, "exit" if durability in _SETTLED else durability)
        self.next = lsn + 1
        return lsn

    def settle(self, lsn: int, durability: str) -> None:
        """Outside the lock: give frame ``lsn``, appended by :meth:`queue`, the promise of
        ``durability`` (``sync``: fdatasync'd; ``async``: written to the OS)."""
        if durability == "sync":
            self.backend.wait_durable(lsn)
        elif durability == "async":
            self.backend.wait_written(lsn)

    def commit_record(self, head: tuple) -> int:
        """Append a small record (delete, copy, remove) under the store's policy and wait
        for it to be durable (under the lock: these are rare)."""
        lsn = self.append(encode_commit(pack_head(head), ()), self.durability)
        if self.durability == "sync":
            self.backend.wait_durable(lsn)
        return lsn
