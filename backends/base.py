"""The Backend protocol: what the store needs from storage.

A backend is an append-only sequence of COMMIT payloads addressed by LSN
(0, 1, 2, ... with no gaps; a prefix may be removed by compaction). The store
owns every byte inside a payload; a backend only keeps payloads, makes them
durable under a policy, and hands them back. Nothing in the store knows which
backend it talks to, so an object-store backend (s3) fits the same protocol.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Mapping, Protocol

from durkv.durability import DURABILITIES
from durkv.payload import resolve_channel

__all__ = ["Backend", "DURABILITIES", "VerifyReport", "ReadsByPayload"]


@dataclass(frozen=True)
class VerifyReport:
    """What ``Store.verify`` found: one shape for every backend.

    Attributes:
        url: the store's URL.
        ok: no damage at all (on a local store a torn tail counts: a writer's open, or
            ``durkv recover``, repairs it).
        frames: the frames that read back (``next_lsn - start_lsn`` when ``ok``).
        start_lsn: the first LSN the backend holds (compaction removes a prefix).
        next_lsn: the LSN the next frame gets.
        damage: one line per finding, where and what (empty when ``ok``).
        details: what only this backend knows (local: ``segments``; s3: ``objects``,
            ``batches``, ``writer_epoch``); for the C log's full report with byte offsets,
            ``durkv.log.verify(path)`` or ``durkv verify PATH``.

    >>> r = VerifyReport(url="memory://", ok=True, frames=2, start_lsn=0, next_lsn=2)
    >>> r.ok, r.to_dict()["damage"]
    (True, [])
    """

    url: str
    ok: bool
    frames: int
    start_lsn: int
    next_lsn: int
    damage: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["damage"], d["details"] = list(self.damage), dict(self.details)
        return d


class ReadsByPayload:
    """``read_heads`` and ``read_channel`` of a backend whose ``read(lsn)`` hands back a
    whole payload from memory (the memory backend; s3's pending frames and cached
    segments): both composed from ``read``. (The local backend's C log does them in C.)"""

    read: Callable[[int], bytes]

    def payload_bytes(self, lsns: list[int]) -> int:
        """The summed length of the payloads at ``lsns``."""
        read = self.read
        return sum(len(read(lsn)) for lsn in lsns)

    def read_heads(self, lsns: list[int]) -> bytes:
        """Each COMMIT payload's head (FORMAT.md section 5: ``head_len:u32`` then the
        head) in one msgpack array."""
        read = self.read
        parts = [b"\xdd" + len(lsns).to_bytes(4, "big")]      # msgpack array 32
        for lsn in lsns:
            p = read(lsn)
            parts.append(p[4:4 + int.from_bytes(p[0:4], "little")])
        return b"".join(parts)

    def read_channel(self, lsn: int, idx: int) -> tuple[list[bytes], int]:
        return resolve_channel(self.read, lsn, idx)


class Backend(Protocol):
    """Append/read/scan of COMMIT payloads, with durability policies.

    Attributes:
        url: the URL the backend was opened with.
        read_only: True for a reader (no lock, no writes).
    """

    url: str
    read_only: bool

    @property
    def next_lsn(self) -> int:
        """LSN the next append gets (single writer: the store predicts it)."""

    @property
    def start_lsn(self) -> int:
        """Lowest live LSN (everything below was removed by compaction)."""

    def append(self, payload: bytes, durability: str | None = None) -> int:
        """Append one COMMIT payload; returns its LSN once ``durability`` holds
        (``None``: the backend's policy)."""

    def flush(self) -> None:
        """Make everything appended so far durable."""

    def wait_durable(self, lsn: int) -> None:
        """Block until frame ``lsn`` and every frame before it are durable (concurrent
        waiters share one fsync)."""

    def wait_written(self, lsn: int) -> None:
        """Block until frame ``lsn`` and every frame before it hold as an ``async`` append
        would have returned them: a frame appended under ``exit`` (only queued) then gets
        the ``async`` promise without its caller holding a lock meanwhile."""

    def read(self, lsn: int) -> bytes:
        """The payload at ``lsn`` (``NotFoundError`` if there is none)."""

    def payload_bytes(self, lsns: list[int]) -> int:
        """The summed length of the payloads at ``lsns`` (a run's size in ``durkv runs``),
        without reading them where the backend knows their sizes."""

    def read_heads(self, lsns: list[int]) -> Any:
        """The heads of the COMMIT payloads at ``lsns`` (FORMAT.md section 5), in that
        order, as one msgpack array (bytes-like): a run's journal in one read and one
        decode."""

    def scan(self, from_lsn: int = 0) -> Iterator[tuple[int, bytes]]:
        """``(lsn, payload)`` of every COMMIT frame at or after ``from_lsn``, in order."""

    def read_channel(self, lsn: int, idx: int) -> tuple[list[bytes], int]:
        """A channel's items at entry ``(lsn, idx)`` (FORMAT.md section 5) and the
        flags of its chain's FULL entry."""

    def refresh(self) -> bool | None:
        """Read-only handles: make frames appended by a writer since open visible.
        True when the storage had to be mapped again from scratch (a repair replaced
        the frames the handle had seen): every LSN the caller holds is then stale."""

    def remove_prefix(self, new_start_lsn: int) -> None:
        """Drop every frame below ``new_start_lsn`` (compaction), crash-safely."""

    def roll(self) -> None:
        """Start a new segment/object so that a later ``remove_prefix`` frees whole files."""

    def size_bytes(self) -> int:
        """Bytes the backend holds (what compaction reports)."""

    def verify(self, deep: bool = False) -> VerifyReport:
        """Check the stored bytes (``deep``: decode every frame too)."""

    def close(self) -> None:
        """Flush and release (locks, files). Idempotent."""

    # Optional: ``step_ids`` (a bool attribute), true when journal records appended now may
    # hold compact step ids (FORMAT.md 5a): only a local log whose active segment has flag
    # STEP_IDS says so; a backend without it gets text ids.
