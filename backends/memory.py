"""The memory backend: payloads in a Python list, for tests and ephemeral runs.

``memory://`` is private to one store; ``memory://name`` is shared by every
open of that name in the process (so tests can reopen and replay), with one
writer at a time like the local log. Durability policies are accepted and
mean nothing: the data lives as long as the process.
"""

from __future__ import annotations

import threading
from typing import Iterator

from durkv.backends.base import ReadsByPayload, VerifyReport
from durkv.errors import (
    ConfigError, NotFoundError, ReadOnlyError, StoreClosedError, StoreLockedError,
)

__all__ = ["MemoryBackend"]


class _Log:
    """One named in-memory log: frames[i] is the payload at LSN start + i."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.start = 0
        self.writer = False
        self.lock = threading.Lock()


_NAMED: dict[str, _Log] = {}
_NAMED_LOCK = threading.Lock()


class MemoryBackend(ReadsByPayload):
    def __init__(self, url: str, *, read_only: bool = False, **_options: object) -> None:
        self.url = url
        self.read_only = read_only
        name = url[len("memory://"):]
        if name:
            with _NAMED_LOCK:
                log = _NAMED.get(name)
                if log is None:
                    if read_only:
                        raise NotFoundError(f"no store at {url}; open it for writing first")
                    log = _NAMED[name] = _Log()
                if not read_only:
                    if log.writer:
                        raise StoreLockedError(
                            f"store {url} is already open for writing in this process; "
                            "close it or open read_only=True")
                    log.writer = True
        else:
            if read_only:
                raise ConfigError("memory:// without a name cannot be opened read-only; "
                                  "use memory://NAME")
            log = _Log()
            log.writer = True
        self._log = log
        self._closed = False

    @classmethod
    def drop(cls, name: str) -> None:
        """Forget the named log ``memory://name`` (tests)."""
        with _NAMED_LOCK:
            _NAMED.pop(name, None)

    @property
    def next_lsn(self) -> int:
        return self._log.start + len(self._log.frames)

    @property
    def start_lsn(self) -> int:
        return self._log.start

    def _check_write(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"{self.url} is open read-only; reopen without read_only=True")
        if self._closed:
            raise StoreClosedError(f"{self.url} is closed; open it again")

    def append(self, payload: bytes, durability: str | None = None) -> int:
        self._check_write()
        log = self._log
        with log.lock:
            log.frames.append(bytes(payload))
            return log.start + len(log.frames) - 1

    def flush(self) -> None:
        pass

    def wait_durable(self, lsn: int) -> None:
        pass

    def wait_written(self, lsn: int) -> None:
        pass

    def read(self, lsn: int) -> bytes:
        log = self._log
        i = lsn - log.start
        if i < 0 or lsn >= log.start + len(log.frames):
            raise NotFoundError(f"{self.url}: no frame at LSN {lsn}", lsn=lsn)
        return log.frames[i]

    def scan(self, from_lsn: int = 0) -> Iterator[tuple[int, bytes]]:
        log = self._log
        lsn = max(from_lsn, log.start)
        while True:
            with log.lock:
                i = lsn - log.start
                if i < 0:
                    # a compaction removed the frames under us: continue at the new start
                    lsn, i = log.start, 0
                if i >= len(log.frames):
                    return
                payload = log.frames[i]
            yield lsn, payload
            lsn += 1

    def refresh(self) -> None:
        pass

    def roll(self) -> None:
        pass

    def remove_prefix(self, new_start_lsn: int) -> None:
        self._check_write()
        log = self._log
        with log.lock:
            n = new_start_lsn - log.start
            if n > 0:
                del log.frames[:n]
                log.start = new_start_lsn

    def size_bytes(self) -> int:
        return sum(len(f) + 24 for f in self._log.frames)   # as if framed by the log (§3)

    def verify(self, deep: bool = False) -> VerifyReport:
        # frames live in this process's memory, never torn: nothing can be damaged
        return VerifyReport(url=self.url, ok=True, frames=self.next_lsn - self.start_lsn,
                            start_lsn=self.start_lsn, next_lsn=self.next_lsn)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if not self.read_only:
                self._log.writer = False
