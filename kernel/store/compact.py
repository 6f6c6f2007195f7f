"""Compaction: copy the live data to the tail, then drop the prefix (crash-safe).

Protocol (a replay at open follows the same records, see
:meth:`durkv.store.replay.LogIndex.apply`):

1. roll the backend to a new segment, append ``COMPACT_BEGIN`` at LSN ``B``;
2. for each live checkpoint (per thread and namespace, oldest first) a ``COPY_CKPT``
   frame, then one ``COPY_WRITES`` frame per task with its pending writes merged
   (idempotency already resolved; a list value held as an entry is copied as an entry,
   which the next checkpoint's copy then refers to); then a ``COPY_JOURNAL`` frame for
   each journal record, in LSN order, naming every run that indexes it. The lanes' frames are counted first, so each journal
   copy's LSN is known before the lanes are copied: an item naming a journal result
   names its copy (or holds its bytes when the run was deleted), and a record's ``ir``
   item named by its place names the copy of that entry (or holds its bytes when no
   live checkpoint needed it);
3. flush, append ``COMPACT_END(B)`` durably;
4. ``remove_prefix(B)``: the log records ``start_lsn = B`` and unlinks the old
   segments.

A crash before END leaves the old records authoritative: replay ignores
copies without an END, and any later ordinary record abandons them. A crash
after END but before the unlink: replay switches to the copies at END, and the
next writer finishes the unlink.

Channel entries are copied **re-chained**, not flattened: every entry a live
checkpoint needs (its head entry and, transitively, the DELTA ``prev``/SNAP
references behind it) is copied once, in LSN order, with its references
rewritten. Bytes stay linear in the live data (flattening every checkpoint's
list into a FULL entry would be quadratic), entries that only dead checkpoints
used are dropped, and a pruned thread keeps exactly the items its kept
checkpoints read. Each entry lands in the first copy that needs it (a pruned
checkpoint's in the oldest kept one's frame, a ``copy_thread`` target's in its
source's, a late pending write's in the write's), so after a compaction the frame
that holds an entry does not tell which checkpoint wrote it: readers tell that
from the chains (:meth:`durkv.store.history.History.channel_entries`).

:class:`Compaction` is one run of it, over the backend (rolled, and its prefix removed),
the store's :class:`~durkv.store.appender.Appender` (the copies' frames), the
:class:`~durkv.store.replay.LogIndex` (the live data, and the replay that switches
to the copies) and the :class:`~durkv.store.reads.Reads` (the merged pending
writes); the store calls it under its lock.
"""

from __future__ import annotations

import heapq
import itertools
from operator import itemgetter
from typing import Any, Callable, Iterable, Iterator

from ..errors import BackendError
from ..payload import (
    DELTA, F_REFS, FULL, SNAP, CommitEntry, encode_commit, encode_record, entry_at, pack_ref,
    unpack_ref,
)
from .appender import Appender
from .ckpthead import CkptHeads
from .delta import NewestCheckpoint
from .index import Lane
from .reads import Reads
from .records import (
    K_COMPACT_BEGIN, K_COMPACT_END, K_COPY_CKPT, K_COPY_JOURNAL, K_COPY_WRITES, CkptHead,
    CompactBeginHead, CompactEndHead, JournalHead, PendingWrite, WritesHead, is_placed_item,
    read_head,
)
from .replay import LogIndex
from .stepids import with_step_ids

__all__ = ["Compaction"]

Ref = tuple[int, int]


class _Frames:
    """A small cache of old payloads (one frame is read for several entries)."""

    def __init__(self, read, cap: int = 512) -> None:
        self._read = read
        self._cap = cap
        self._d: dict[int, bytes] = {}

    def __call__(self, lsn: int) -> bytes:
        p = self._d.get(lsn)
        if p is None:
            if len(self._d) >= self._cap:
                self._d.pop(next(iter(self._d)))
            p = self._d[lsn] = self._read(lsn)
        return p


class Compaction:
    """One compaction of a store (see the module docstring); :meth:`run` once."""

    def __init__(self, backend: Any, appender: Appender, index: LogIndex, reads: Reads,
                 heads: CkptHeads, url: str) -> None:
        self._b = backend
        self._ap = appender
        self._index = index
        self._reads = reads
        self._heads = heads                 # resolves the old heads (deltas included)
        self._copy_heads = CkptHeads()      # the copies: deltas of keyframes among the copies
        self.url = url
        self._frames = _Frames(backend.read)
        self._mapped: dict[Ref, Ref] = {}    # old entry -> its copy
        self._moved: dict[int, int] = {}     # old journal record's LSN -> its copy's
        self._journals_at = 0                # the LSN of the first journal record's copy

    def run(self, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """Copy the live data after a BEGIN, end it durably, switch the index to the
        copies and drop the old prefix; returns the figures of ``Store.compact``.
        ``progress(done, total)``: checkpoints copied, after each lane."""
        b = self._b
        self._ap.flush()            # exit policy: count (and keep) what is still buffered
        bytes_before = b.size_bytes()
        newest = self._materialized_newest()
        begin = self._begin()
        lanes = list(self._index.ix.lanes())
        total = sum(len(lane.ids) for _t, _n, lane in lanes)
        kept = 0
        # the journals are copied after the lanes, at LSNs known before (the lanes' frames
        # counted first): a copied item that names a journal result (a jref) names the
        # result's copy, and a copied record's `ir` place the copy of its list entry
        if self._index.ix.journals:     # (a store without journals has nothing to name)
            self._plan_journals(begin + 1 + self._lane_frames(lanes))
        for t, n, lane in lanes:
            kept += self._copy_lane(t, n, lane)
            if progress is not None:
                progress(kept, total)
        self._copy_journals()
        self._end(begin)
        self._index.replay_compaction(begin)
        self._keep_newest(newest)
        b.remove_prefix(begin)
        self._index.scan_pos = max(self._index.scan_pos, b.start_lsn)
        if self._index.index_every:
            self._index.write_snapshot()     # open then replays nothing of the copies
        return {"bytes_before": bytes_before, "bytes_after": b.size_bytes(),
                "checkpoints_kept": kept, "journal_records_kept": sum(
                    len(v) for v in self._index.ix.journals.values())}

    # -- the steps ---------------------------------------------------------------------------

    def _materialized_newest(self) -> dict[tuple[str, str], NewestCheckpoint]:
        return {(t, n): lane.newest for t, n, lane in self._index.ix.lanes()
                if lane.newest is not None}

    def _begin(self) -> int:
        self._b.roll()
        # BEGIN and the copies are only queued: the flush before END makes them durable
        return self._ap.queue(encode_record(CompactBeginHead(K_COMPACT_BEGIN).pack()))

    def _end(self, begin: int) -> None:
        """END, durable, once every copy is: never a durable END before its copies."""
        ap = self._ap
        ap.flush()
        ap.queue(encode_record(CompactEndHead(K_COMPACT_END, begin).pack()))
        ap.flush()

    def _copy_lane(self, t: str, n: str, lane: Lane) -> int:
        """Copy every checkpoint of the lane with its pending writes, then the writes to
        checkpoint ids the lane does not hold; returns how many checkpoints were copied."""
        pending = self._reads.pending_writes
        for cid, lsn in zip(lane.ids, lane.lsns):
            self._copy_checkpoint(t, n, lsn)
            self._copy_writes(t, n, cid, pending(lane, lsn, raw=True))
        for cid in lane.orphan_writes():
            self._copy_writes(t, n, cid, pending(lane, -1, cid, raw=True))
        return len(lane.ids)

    def _copy_checkpoint(self, t: str, n: str, lsn: int) -> None:
        frames = self._frames
        raw = self._heads.full(frames, read_head(frames(lsn), lsn), lsn)   # a delta resolved
        h = CkptHead.of(raw, lsn)
        new_lsn = self._ap.next_lsn()
        entries: list[CommitEntry] = []
        self._copy_entries(h.chans.values(), new_lsn, entries)
        mapped = self._mapped
        h = h._replace(kind=K_COPY_CKPT, thread=t, ns=n, chans={
            ch: list(mapped[tuple(ref)]) for ch, ref in h.chans.items()})
        # fields a later version added after the known ones are copied as they are
        self._append_copy(self._copy_heads.pack([*h, *raw[len(h):]]), entries, new_lsn)
        self._copy_heads.written(new_lsn)

    def _copy_writes(self, t: str, n: str, cid: str, writes: list[PendingWrite]) -> None:
        """One frame per (task, path) with the merged writes (values copied as stored).
        A list value held as an entry is copied as the entry, so that a copied checkpoint
        referring to it (F_REFS) finds it copied already and refers to the copy."""
        by_task: dict[tuple[str, str], list] = {}
        for w in writes:
            by_task.setdefault((w.task_id, w.task_path), []).append(w)
        mapped = self._mapped
        for (task, path), ws in by_task.items():
            new_lsn = self._ap.next_lsn()
            entries: list[CommitEntry] = []
            recs = []
            for w in ws:
                v = w.value
                if type(v) is tuple:      # (lsn, idx) of the entry whose items are the list
                    if v not in mapped:
                        self._copy_entries([v], new_lsn, entries)
                    # in this frame: its index; copied into an earlier one already (the
                    # checkpoint's, a copied thread's writes): its reference
                    v = mapped[v][1] if mapped[v][0] == new_lsn else list(mapped[v])
                recs.append([w.idx, w.channel, v])
            hb = WritesHead(K_COPY_WRITES, t, n, cid, task, path, False, recs).pack()
            self._append_copy(hb, entries, new_lsn)

    def _lane_frames(self, lanes: list) -> int:
        """How many frames :meth:`_copy_lane` will write for ``lanes``: one a checkpoint,
        one a (task, path) of its pending writes and of the orphan writes."""
        pending = self._reads.pending_writes

        def tasks(writes: list[PendingWrite]) -> int:
            return len({(w.task_id, w.task_path) for w in writes})

        frames = 0
        for _t, _n, lane in lanes:
            frames += len(lane.ids) + sum(tasks(pending(lane, lsn, raw=True))
                                          for lsn in lane.lsns)
            frames += sum(tasks(pending(lane, -1, cid, raw=True))
                          for cid in lane.orphan_writes())
        return frames

    def _journal_order(self) -> Iterator[tuple[int, str | list[str]]]:
        """(old LSN, the run or runs that index it) of every journal record, in the order
        :meth:`_copy_journals` copies them, once each (a record that copy_thread shared, or
        a repair's, under every run that indexes it: FORMAT.md 5a). Each run's journal is in
        LSN order and must stay so among the copies: run by run when no record is shared,
        else in LSN order (runs may share some records and not others: a repair's)."""
        journals = list(self._index.ix.journals.items())
        if sum(map(len, (lsns for _r, lsns in journals))) == len(
                set().union(*(lsns for _r, lsns in journals))):
            for run_id, lsns in journals:       # nothing shared (the common case)
                yield from zip(lsns, itertools.repeat(run_id))
            return
        merged = heapq.merge(*(zip(lsns, itertools.repeat(run_id)) for run_id, lsns in journals))
        for lsn, group in itertools.groupby(merged, key=itemgetter(0)):
            ids = [run_id for _lsn, run_id in group]
            yield lsn, ids[0] if len(ids) == 1 else ids

    def _plan_journals(self, first: int) -> None:
        """The LSN each journal record's copy will land at, from ``first`` on."""
        self._journals_at = first
        for j, (lsn, _runs) in enumerate(self._journal_order()):
            self._moved[lsn] = first + j

    def _copy_journals(self) -> None:
        """Each journal record again, under the runs it is indexed by (a copied journal's
        frames may name the source run), at the LSN :meth:`_plan_journals` gave it."""
        queue = self._ap.queue
        # step ids compact as the writer packs them (FORMAT.md 5a): the copies land in the
        # active segment or in later ones, which all have the flag once it has
        ids = bool(getattr(self._b, "step_ids", False))
        for j, (lsn, runs) in enumerate(self._journal_order()):  # none: nothing planned
            h = JournalHead.of(read_head(self._frames(lsn), lsn), lsn)
            rec = self._placed_moved(h.rec)
            if ids:
                rec = with_step_ids(rec)
            got = queue(encode_record(JournalHead(K_COPY_JOURNAL, runs, rec).pack()))
            if got != self._journals_at + j:    # before END: the old data stays the store
                raise BackendError(f"compaction of {self.url}: journal copy landed at LSN "
                                   f"{got}, expected {self._journals_at + j}; nothing was "
                                   "lost, the copies are ignored")

    def _placed_moved(self, rec: Any) -> Any:
        """``rec`` with every ``ir`` item named by its place in the old log (``[lsn,
        entry, index]``, FORMAT.md 5a) naming that entry's copy, or, when nothing live
        needed the entry (its checkpoint pruned or deleted), replaced by its bytes."""
        ir = rec.get("ir") if type(rec) is dict else None
        if type(ir) is not list or len(ir) != 3 or type(ir[2]) is not list or not any(
                is_placed_item(x) for x in ir[2]):
            return rec
        read, mapped = self._reads.write_item, self._mapped
        new = []
        for x in ir[2]:
            if is_placed_item(x):
                to = mapped.get((x[0], x[1]))
                x = read(*x) if to is None else [to[0], to[1], x[2]]
            new.append(x)
        return {**rec, "ir": [ir[0], ir[1], new]}

    def _append_copy(self, hb: bytes, entries: list[CommitEntry], new_lsn: int) -> None:
        got = self._ap.queue(encode_commit(hb, entries))
        if got != new_lsn:     # before END: the old data stays authoritative
            raise BackendError(f"compaction of {self.url}: frame landed at LSN {got}, "
                               f"expected {new_lsn}; nothing was lost, the copies are ignored")

    # -- channel entries, re-chained ---------------------------------------------------------

    def _needed(self, refs: Iterable) -> list[tuple[Ref, CommitEntry]]:
        """Old entries reachable from ``refs`` and not copied yet, in LSN order."""
        mapped = self._mapped
        todo = [tuple(r) for r in refs]
        seen: dict[Ref, CommitEntry] = {}
        while todo:
            r = todo.pop()
            if r in mapped or r in seen:
                continue
            e = seen[r] = entry_at(self._frames(r[0]), r[1])
            if e.kind == DELTA:
                todo.append((e.prev_lsn, e.prev_idx))
                if e.flags & F_REFS:
                    todo.extend(unpack_ref(x) for x in e.items)
            elif e.kind == SNAP:
                todo.extend(unpack_ref(x) for x in e.items)
        return sorted(seen.items())

    def _copy_entries(self, refs: Iterable, lsn: int, entries: list[CommitEntry]) -> None:
        """Append to ``entries`` (of the frame at ``lsn``) the copies of every entry
        ``refs`` need, their references rewritten to the copies."""
        mapped = self._mapped
        # an item naming a journal result names the result's copy, or, when the record is
        # dropped here (a deleted run), is copied as the bytes it stands for (FORMAT.md 5)
        moved = self._moved
        stored = self._reads.codec.stored
        for r, e in self._needed(refs):
            new = (lsn, len(entries))
            if e.kind == FULL:
                entries.append(CommitEntry(FULL, *stored(e.items, e.flags, moved)))
            elif e.kind == DELTA:
                p = mapped[(e.prev_lsn, e.prev_idx)]
                if e.flags & F_REFS:
                    items, flags = [pack_ref(*mapped[unpack_ref(x)]) for x in e.items], e.flags
                else:
                    items, flags = stored(e.items, e.flags, moved)
                entries.append(CommitEntry(DELTA, items, flags, e.depth, p[0], p[1]))
            else:
                items = [pack_ref(*mapped[unpack_ref(x)]) for x in e.items]
                entries.append(CommitEntry(SNAP, items, e.flags))
            mapped[r] = new

    def _keep_newest(self, newest: dict[tuple[str, str], NewestCheckpoint]) -> None:
        """Carry each lane's materialized newest state over to the copies.

        Keeping the very objects that were put (not a reload from the log) keeps
        delta detection working for the next put of a running agent.
        """
        mapped = self._mapped

        def remap(packed: bytes) -> bytes:
            return pack_ref(*mapped[unpack_ref(packed)])

        for (t, n), kept in newest.items():
            lane = self._index.ix.lane(t, n)
            if lane is None or not lane.ids or lane.ids[-1] != kept.cid:
                continue
            try:
                for c in kept.chans.values():
                    c.ref = mapped[tuple(c.ref)]
                    if c.loaded:
                        c.base = remap(c.base)
                        c.deltas = [remap(d) for d in c.deltas]
            except KeyError:
                continue   # defensive: reload from the log instead
            kept.lsn = lane.lsns[-1]
            lane.newest = kept
