"""What a store holds and where its bytes go (``Store.stats``, ``durkv stats``).

Three passes, each streaming (memory grows with the number of channel entries the
live checkpoints reach, one small tuple each, never with the bytes stored):

1. the live index: threads, runs, checkpoints, pending-write records, journal records;
2. one scan of every frame in the log, live and dead alike (dead frames are what a
   compaction drops): payload bytes by record kind, a checkpoint frame split into its
   head and its channel entries by encoding (``FULL``, or ``DELTA``/``SNAP``: the
   delta encoding's), and what is left of the files (frame and segment headers, seals);
3. for every live checkpoint, the bytes its channel values would take stored whole:
   each value as one ``FULL`` entry of the very item bytes it reads back as
   (compression is per item, so whole entries would hold the same items). Sizes are
   computed from entry headers and item lengths along each chain, memoized per entry,
   without materializing a value.

``whole_states_bytes`` stores every channel of every checkpoint whole (no delta, no
sharing); ``whole_values_bytes`` stores each distinct value once (a checkpoint whose
channel did not change refers to its parent's, as the store does today): the saving of
the delta encoding itself is ``whole_values_bytes - channel_bytes``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..payload import DELTA, F_REFS, FULL, decode_commit, entry_at, unpack_ref
from .ckpthead import CkptHeads
from .records import (
    K_CKPT, K_COPY_CKPT, K_COPY_JOURNAL, K_COPY_WRITES, K_DEL_JOURNAL, K_JOURNAL, K_REPAIR,
    K_WRITES,
)
from .replay import LogIndex

__all__ = ["StoreStats", "collect"]

Ref = tuple[int, int]
Progress = Callable[[int, int], None]

# where every byte of the log's files goes (they sum to segment_bytes)
BYTE_KINDS = ("checkpoint_heads", "channel_full", "channel_delta", "pending_writes",
              "journal", "other_records", "framing")
_RECORD_KIND = {K_CKPT: "checkpoints", K_COPY_CKPT: "checkpoints",
                K_WRITES: "pending_writes", K_COPY_WRITES: "pending_writes",
                K_JOURNAL: "journal", K_COPY_JOURNAL: "journal", K_DEL_JOURNAL: "journal",
                K_REPAIR: "journal"}
_ENTRY_HEADER = 24
_PROGRESS_EVERY = 1024      # frames (or checkpoints) between two progress reports


@dataclass
class StoreStats:
    """The figures of one store; ``to_dict`` is ``durkv stats --json``."""

    url: str
    threads: int = 0
    runs: int = 0
    checkpoints: int = 0                    # live (the index's)
    pending_writes: int = 0                 # live pending-write records (one per task write)
    journal_records: int = 0                # live
    frames: int = 0                         # in the log, live and dead
    segments: int | None = None             # segment files (a local store's)
    segment_bytes: int = 0                  # the log's files (segments, or S3 objects)
    bytes_on_disk: int = 0                  # every file of a local store (quarantine too)
    bytes_by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BYTE_KINDS, 0))
    frames_by_kind: dict[str, int] = field(default_factory=dict)   # frames in the log
    channel_bytes: int = 0                  # channel entries in the log (FULL + DELTA/SNAP)
    whole_values_bytes: int = 0             # each distinct live value stored whole
    whole_states_bytes: int = 0             # every live checkpoint's every value whole

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Ticker:
    """Counts the work of passes 2 and 3 into one ``progress(done, total)``."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self) -> None:
        self.done += 1
        if self.progress is not None and self.done % _PROGRESS_EVERY == 0:
            self.progress(min(self.done, self.total), self.total)

    def finish(self) -> None:
        if self.progress is not None:
            self.progress(self.total, self.total)


def _kind(payload: bytes) -> int:
    """The record kind (first element of the head) read from the head's first bytes: a
    large head (an index snapshot) is not decoded to count it."""
    if len(payload) < 6:
        return -1
    first = payload[4]
    at = 5 if 0x91 <= first <= 0x9f else 7 if first == 0xdc else 9 if first == 0xdd else -1
    kind = payload[at] if 0 <= at < len(payload) else -1
    return kind if kind < 0x80 else -1


def _entry_bytes(items: list) -> int:
    return _ENTRY_HEADER + sum(4 + len(i) for i in items)


def scan(backend: Any, st: StoreStats, start: int, end: int, tick: _Ticker) -> None:
    """Pass 2: every frame of the log in ``[start, end)``."""
    by, frames = st.bytes_by_kind, st.frames_by_kind
    payload_bytes = 0
    for lsn, payload in backend.scan(start):
        if lsn >= end:
            break       # a writer appended since: the figures are those of the start
        payload_bytes += len(payload)
        what = _RECORD_KIND.get(_kind(payload), "other_records")
        frames[what] = frames.get(what, 0) + 1
        if what == "checkpoints":
            head, entries = decode_commit(payload)
            by["checkpoint_heads"] += 8 + len(head)
            for e in entries:
                n = _entry_bytes(e.items)
                by["channel_full" if e.kind == FULL else "channel_delta"] += n
        else:
            by[what] += len(payload)
        st.frames += 1
        tick()
    st.channel_bytes = by["channel_full"] + by["channel_delta"]
    by["framing"] = max(0, st.segment_bytes - payload_bytes)


class _ValueSizes:
    """The item bytes of a channel value (``4 + len`` per item, as a FULL entry holds
    them) at each entry, memoized: ``(whole, own)`` where ``own`` is what the entry adds
    to the value before it (a SNAP's: what its deltas add)."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self._memo: dict[Ref, tuple[int, int]] = {}

    def __call__(self, ref: Ref) -> int:
        memo = self._memo
        stack = [ref]
        while stack:        # iterative: a chain of SNAPs is as long as the thread
            r = stack[-1]
            if r in memo:
                stack.pop()
                continue
            e = entry_at(self._read(r[0]), r[1])
            deps = self._deps(e)
            todo = [d for d in deps if d not in memo]
            if todo:
                stack.extend(todo)
                continue
            memo[r] = self._sizes(e, deps)
            stack.pop()
        return memo[ref][0]

    @staticmethod
    def _deps(e: Any) -> list[Ref]:
        if e.kind == FULL:
            return []
        refs = [unpack_ref(i) for i in e.items] if e.kind != DELTA or e.flags & F_REFS else []
        return [(e.prev_lsn, e.prev_idx), *refs] if e.kind == DELTA else refs

    def _sizes(self, e: Any, deps: list[Ref]) -> tuple[int, int]:
        memo = self._memo
        if e.kind == FULL:
            n = sum(4 + len(i) for i in e.items)
            return n, n
        if e.kind == DELTA:
            own = (sum(memo[d][0] for d in deps[1:]) if e.flags & F_REFS
                   else sum(4 + len(i) for i in e.items))
            return memo[deps[0]][0] + own, own
        own = sum(memo[d][1] for d in deps[1:])        # SNAP: its base, then its deltas
        return memo[deps[0]][0] + own, own


def whole_sizes(backend: Any, index: LogIndex, heads: CkptHeads, st: StoreStats,
                tick: _Ticker) -> None:
    """Pass 3: what every live checkpoint's channel values would take stored whole."""
    read = backend.read
    sizes = _ValueSizes(read)
    seen: set[Ref] = set()
    for _t, _n, lane in list(index.ix.lanes()):
        for lsn in lane.lsns:
            for ref in heads.load(read, lsn).chans.values():
                r = (ref[0], ref[1])
                n = _ENTRY_HEADER + sizes(r)
                st.whole_states_bytes += n
                if r not in seen:
                    seen.add(r)
                    st.whole_values_bytes += n
            tick()


def count_live(index: LogIndex, st: StoreStats) -> None:
    """Pass 1: the live index."""
    ix = index.ix
    threads = set()
    for t, _n, lane in ix.lanes():
        if lane.ids:
            threads.add(t)
        st.checkpoints += len(lane.ids)
        st.pending_writes += len(lane.wv) + sum(map(len, lane.orphan_writes().values()))
    st.threads = len(threads)
    st.runs = len(ix.journals)
    st.journal_records = sum(len(v) for v in ix.journals.values())


def disk_usage(path: str, st: StoreStats) -> None:
    """Segment files and every file of a local store's directory."""
    total = segments = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                n = os.path.getsize(os.path.join(root, name))
            except OSError:
                continue        # a lock file or a segment gone meanwhile
            total += n
            segments += root == path and name.endswith(".seg")
    st.segments, st.bytes_on_disk = segments, total


def collect(backend: Any, index: LogIndex, heads: CkptHeads, url: str, path: str | None,
            progress: Progress | None = None, whole_values: bool = True) -> StoreStats:
    """The statistics of the store over ``backend`` whose index is ``index`` (``path``:
    a local store's directory, else None), at the log's tail when it starts;
    ``whole_values=False`` skips pass 3 (its figures stay 0)."""
    st = StoreStats(url=url, segment_bytes=backend.size_bytes())
    if path is not None:
        disk_usage(path, st)
    else:
        st.bytes_on_disk = st.segment_bytes
    count_live(index, st)
    start, end = backend.start_lsn, backend.next_lsn
    tick = _Ticker(progress, (end - start) + (st.checkpoints if whole_values else 0))
    scan(backend, st, start, end, tick)
    if whole_values:
        whole_sizes(backend, index, heads, st, tick)
    tick.finish()
    return st
