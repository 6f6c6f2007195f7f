"""The local backend: the C segment log (``durkv.log.SegmentLog``) in a directory.

Store frames are COMMIT frames; frames of other types (DATA) are skipped by
``scan`` and are not the store's to keep (compaction drops them).
"""

from __future__ import annotations

import errno
import os
from typing import Any, Iterator

from durkv.backends.base import VerifyReport
from durkv.errors import BackendError, DurkvError, StaleReaderError
from durkv.fsync import fsync_dir

__all__ = ["LocalBackend"]


def _make_parents(path: str) -> None:
    """Create the missing parent directories of a new store (``./data/agent.durkv``).

    Each new directory's entry is fsync'd in its parent, so that after a power
    loss the store directory (which the log creates and fsyncs) has a path to it.
    """
    parent = os.path.dirname(os.path.abspath(path))
    missing = []
    while not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for d in reversed(missing):
        os.mkdir(d)
        fsync_dir(os.path.dirname(d))


_FRAME_HEADER = 24      # bytes of a frame header (FORMAT.md §3)


class LocalBackend:
    def __init__(self, url: str, path: str, *, durability: str = "sync", read_only: bool = False,
                 segment_bytes: int | None = None, flush_interval_ms: int = 10,
                 recovery: str = "tolerate_tail") -> None:
        from durkv import log as _log  # the compiled log; only needed for local stores

        self._mod = _log
        self._commit = _log.FRAME_COMMIT
        self.url = url
        self.path = path
        self.read_only = read_only
        self.recovery = recovery
        kw: dict[str, Any] = dict(durability=durability, flush_interval_ms=flush_interval_ms,
                                  recovery=recovery, read_only=read_only)
        if segment_bytes:
            kw["segment_bytes"] = segment_bytes
        self._kw = kw
        try:
            if not read_only:
                _make_parents(path)
            self._log = _log.SegmentLog.open(path, **kw)
        except DurkvError:
            raise
        except OSError as e:
            raise BackendError(f"cannot open store at {path}: {e}", path=path) from e
        # salvage / point_in_time recovery can open a writer's log read-only
        self.read_only = bool(self._log.read_only)
        self._closed = False
        # read-only: (active segment file, its size before the last refresh read it, the
        # end of the frames that refresh read), or None: not known (no refresh yet, or the
        # last segment was sealed): see tail_moved
        self._tail: tuple[str, int, int] | None = None
        self._tail_fd: tuple[str, int] | None = None    # (path, fd) to look past the frames

    @property
    def next_lsn(self) -> int:
        return self._log.next_lsn

    @property
    def start_lsn(self) -> int:
        return self._log.start_lsn

    def append(self, payload: bytes, durability: str | None = None) -> int:
        return self._log.append(payload, frame_type=self._commit, durability=durability)

    def journal_fast_path(self, durability: str) -> tuple | None:
        """What run.step's C entry needs to append a record as :meth:`append_one` would,
        under the store's policy ``durability`` (written as ``Appender.write_alone``
        writes it): ``(log, frame type, policy code)``, or None for a read-only log."""
        if self.read_only:
            return None
        d = "async" if durability == "sync" else durability
        return self._log, self._commit, self._mod.DURABILITY_CODES[d]

    def append_one(self, payload: bytes, expect: int, durability: str | None = None) -> int:
        """A frame in a write section of its own, if the log's next LSN is ``expect``
        (else -1, nothing appended): ``SegmentLog.append_one``."""
        return self._log.append_one(payload, expect, frame_type=self._commit,
                                    durability=durability)

    def flush(self) -> None:
        self._log.flush()

    def wait_durable(self, lsn: int) -> None:
        self._log.wait_durable(lsn)

    def wait_written(self, lsn: int) -> None:
        self._log.wait_written(lsn)

    def read(self, lsn: int) -> bytes:
        return self._log.read(lsn)

    def scan(self, from_lsn: int = 0) -> Iterator[tuple[int, bytes]]:
        commit = self._commit
        for lsn, ftype, payload in self._log.scan_frames(from_lsn):
            if ftype == commit:
                yield lsn, payload

    def payload_bytes(self, lsns: list[int]) -> int:
        return self._log.payload_bytes(lsns)

    def read_heads(self, lsns: list[int]) -> Any:
        return self._log.read_heads(lsns)

    def read_channel(self, lsn: int, idx: int) -> tuple[list[bytes], int]:
        return self._log.read_channel(lsn, idx)

    def refresh(self) -> bool:
        size = self._tail_size()       # before the log reads: it reads at least this much
        try:
            self._log.refresh()
        except StaleReaderError:
            # `durkv recover` cut the log under this reader and LSNs may have been reused:
            # map the log again from scratch; the caller drops every LSN it held.
            return self._reopen()
        segs = self._log.segments() if self.read_only else None
        last = segs[-1] if segs else None
        if last is not None and last.sealed and not os.path.exists(
                os.path.join(self.path, last.name)):
            # the newest segment this reader knows was sealed and unlinked, and the ones
            # after it too (two compactions since the last refresh): its chain to the
            # present is gone, so the refresh above found nothing new
            return self._reopen()
        if last is None or last.sealed:
            self._tail = None      # a roll in progress (or a writer handle): look each time
        else:
            path = os.path.join(self.path, last.name)
            same = self._tail is not None and self._tail[0] == path and size is not None
            # -1: read the new segment once more
            self._tail = (path, size if same else -1, last.bytes)
        return False

    def _reopen(self) -> bool:
        """Map the log again from scratch (the caller drops every LSN it held)."""
        fresh = self._mod.SegmentLog.open(self.path, **self._kw)
        old, self._log = self._log, fresh
        old.close()
        self._tail = None
        self._close_tail_fd()
        return True

    def _tail_size(self) -> int | None:
        try:
            return os.stat(self._tail[0]).st_size if self._tail is not None else None
        except OSError:
            return None

    def tail_moved(self) -> bool:
        """Read-only handles: whether a writer may have appended since the last
        :meth:`refresh` -- the active segment's size changed (an append, a seal when the
        writer rolls, a repair's cut) or the file is gone. One ``stat``, whatever the
        log's length."""
        if self._tail is None:
            return True
        size = self._tail_size()
        if size is None or size != self._tail[1]:
            return True
        # Zero slack after the frames (FORMAT.md §3) keeps the size while frames are
        # appended into it: then the next frame's header, where the last refresh stopped,
        # says it (a frame or a seal's footer is never all zero there).
        return size > self._tail[2] and self._next_header_written(self._tail[0], self._tail[2])

    def _next_header_written(self, path: str, data_end: int) -> bool:
        try:
            if self._tail_fd is None or self._tail_fd[0] != path:
                self._close_tail_fd()
                self._tail_fd = (path, os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            return any(os.pread(self._tail_fd[1], _FRAME_HEADER, data_end))
        except OSError:
            return True         # gone or unreadable: let refresh find out

    def _close_tail_fd(self) -> None:
        if self._tail_fd is not None:
            fd, self._tail_fd = self._tail_fd[1], None
            os.close(fd)

    # several writers (FORMAT.md "Several writers"): the store brackets its writes

    def write_begin(self) -> None:
        self._log.write_begin()

    def write_end(self) -> None:
        self._log.write_end()

    def write_end_async(self) -> bool:
        return self._log.write_end_async()

    @property
    def step_ids(self) -> bool:
        """Whether journal records appended now may hold compact step ids (FORMAT.md 5a):
        the active segment's header has flag ``STEP_IDS`` (section 2)."""
        return not self.read_only and self._log.step_ids

    def exclusive(self, on: bool) -> None:
        self._log.exclusive(on)

    def roll(self) -> None:
        self._log.seal()

    def remove_prefix(self, new_start_lsn: int) -> None:
        self._log.seal(new_start_lsn=new_start_lsn)

    def size_bytes(self) -> int:
        """The bytes of the store's segment files. An I/O failure is BackendError naming
        the file and the errno (a segment removed meanwhile, by a compaction, counts 0)."""
        total = 0
        at = self.path
        try:
            for name in os.listdir(self.path):
                if name.endswith(".seg"):
                    at = os.path.join(self.path, name)
                    try:
                        total += os.path.getsize(at)
                    except FileNotFoundError:
                        pass
        except OSError as e:
            raise BackendError(
                f"cannot {'list' if at == self.path else 'stat'} {at}: {e.strerror or e}",
                path=at, errno=errno.errorcode.get(e.errno or 0, str(e.errno))) from e
        return total

    def verify(self, deep: bool = False) -> VerifyReport:
        r = self._log.verify(deep)
        damage = tuple(f"{d.segment}@{d.offset}: {d.kind}"
                       + (f" (lost LSN {d.lost_first_lsn}..{d.lost_last_lsn})"
                          if d.lost_first_lsn is not None else "")
                       + (f": {d.detail}" if d.detail else "") for d in r.damage)
        return VerifyReport(url=self.url, ok=r.ok, frames=r.frames_ok, start_lsn=self.start_lsn,
                            next_lsn=r.next_lsn, damage=damage,
                            details={"segments": len(r.segments)})

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close_tail_fd()
            self._log.close()
