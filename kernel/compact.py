"""Compaction: copy the live data to the tail, then drop the prefix (crash-safe).

Protocol (a replay at open follows the same records, see ``Store._apply``):

1. roll the backend to a new segment, append ``COMPACT_BEGIN`` at LSN ``B``;
2. for each live checkpoint (per thread and namespace, oldest first) append a
   ``COPY_CKPT`` frame, then one ``COPY_WRITES`` frame per task with its pending
   writes merged (idempotency already resolved; a list value held as an entry is
   copied as an entry, which the next checkpoint's copy then refers to);
   then, per run, a ``COPY_JOURNAL`` frame for each journal record;
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
checkpoints read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .channels import (
    DELTA, F_REFS, FULL, SNAP, Entry, encode_commit, entry_at, pack_ref, unpack_ref,
)
from .ckpthead import CkptHeads
from .errors import BackendError
from .records import (
    K_COMPACT_BEGIN, K_COMPACT_END, K_COPY_CKPT, K_COPY_JOURNAL, K_COPY_WRITES, CkptHead,
    CompactBeginHead, CompactEndHead, JournalHead, WritesHead, read_head,
)

if TYPE_CHECKING:
    from .store import Store

__all__ = ["compact"]


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


def compact(store: "Store") -> dict[str, Any]:
    b = store._b
    b.flush()                       # exit policy: count (and keep) what is still buffered
    bytes_before = b.size_bytes()
    frames = _Frames(b.read)
    b.roll()
    # BEGIN and the copies are buffered ("exit"): the flush before END makes them durable
    begin = b.append(encode_commit(CompactBeginHead(K_COMPACT_BEGIN).pack(), ()), "exit")
    mapped: dict[tuple[int, int], tuple[int, int]] = {}
    kept = 0

    def needed(refs) -> list[tuple[tuple[int, int], Entry]]:
        """Old entries reachable from ``refs`` and not copied yet, in LSN order."""
        todo = [tuple(r) for r in refs]
        seen: dict[tuple[int, int], Entry] = {}
        while todo:
            r = todo.pop()
            if r in mapped or r in seen:
                continue
            e = seen[r] = entry_at(frames(r[0]), r[1])
            if e.kind == DELTA:
                todo.append((e.prev_lsn, e.prev_idx))
                if e.flags & F_REFS:
                    todo.extend(unpack_ref(x) for x in e.items)
            elif e.kind == SNAP:
                todo.extend(unpack_ref(x) for x in e.items)
        return sorted(seen.items())

    def copy_entries(refs, lsn: int, entries: list[Entry]) -> None:
        for r, e in needed(refs):
            new = (lsn, len(entries))
            if e.kind == FULL:
                entries.append(Entry(FULL, e.items, e.flags))
            elif e.kind == DELTA:
                p = mapped[(e.prev_lsn, e.prev_idx)]
                items = e.items
                if e.flags & F_REFS:
                    items = [pack_ref(*mapped[unpack_ref(x)]) for x in items]
                entries.append(Entry(DELTA, items, e.flags, e.depth, p[0], p[1]))
            else:
                items = [pack_ref(*mapped[unpack_ref(x)]) for x in e.items]
                entries.append(Entry(SNAP, items, e.flags))
            mapped[r] = new

    def copy_writes(t, n, cid, writes) -> None:
        """One frame per (task, path) with the merged writes (values copied as stored).
        A list value held as an entry is copied as the entry, so that a copied checkpoint
        referring to it (F_REFS) finds it copied already and refers to the copy."""
        by_task: dict[tuple[str, str], list] = {}
        for w in writes:
            by_task.setdefault((w.task_id, w.task_path), []).append(w)
        for (task, path), ws in by_task.items():
            new_lsn = b.next_lsn
            entries: list[Entry] = []
            recs = []
            for w in ws:
                v = w.value
                if type(v) is tuple:      # (lsn, idx) of the entry whose items are the list
                    if v not in mapped:
                        copy_entries([v], new_lsn, entries)
                    # in this frame: its index; copied into an earlier one already (the
                    # checkpoint's, a copied thread's writes): its reference
                    v = mapped[v][1] if mapped[v][0] == new_lsn else list(mapped[v])
                recs.append([w.idx, w.channel, v])
            hb = WritesHead(K_COPY_WRITES, t, n, cid, task, path, False, recs).pack()
            got = b.append(encode_commit(hb, entries), "exit")
            if got != new_lsn:
                raise BackendError(f"compaction of {store.url}: frame landed at LSN {got}, "
                                   f"expected {new_lsn}; nothing was lost, the copies are "
                                   "ignored")

    old_heads = {}
    copy_heads = CkptHeads()     # the copies' heads: deltas against keyframes among the copies
    for t, n, lane in list(store._ix.lanes()):
        if lane.head is not None:
            old_heads[(t, n)] = lane.head
        for cid, lsn in zip(lane.ids, lane.lsns):
            raw = store._ckh.full(frames, read_head(frames(lsn), lsn), lsn)   # a delta resolved
            h = CkptHead.of(raw, lsn)
            new_lsn = b.next_lsn
            entries: list[Entry] = []
            copy_entries(h.chans.values(), new_lsn, entries)
            h = h._replace(kind=K_COPY_CKPT, thread=t, ns=n, chans={
                ch: list(mapped[tuple(ref)]) for ch, ref in h.chans.items()})
            # fields a later version added after the known ones are copied as they are
            hb = copy_heads.pack([*h, *raw[len(h):]])
            got = b.append(encode_commit(hb, entries), "exit")
            if got != new_lsn:     # before END: the old data stays authoritative
                raise BackendError(f"compaction of {store.url}: frame landed at LSN {got}, "
                                   f"expected {new_lsn}; nothing was lost, the copies are "
                                   "ignored")
            copy_heads.written(got)
            kept += 1
            writes = store._read_writes(lane, lsn, raw=True)
            if writes:
                copy_writes(t, n, cid, writes)
        for cid in lane.orphan_writes():
            writes = store._read_writes(lane, -1, cid, raw=True)
            if writes:
                copy_writes(t, n, cid, writes)
    for run_id, lsns in list(store._ix.journals.items()):
        # each record again, under the run it is indexed by (a copied journal's frames
        # may name the source run)
        for lsn in lsns:
            h = JournalHead.of(read_head(frames(lsn), lsn), lsn)
            b.append(encode_commit(JournalHead(K_COPY_JOURNAL, run_id, h.rec).pack(), ()), "exit")
    b.flush()
    b.append(encode_commit(CompactEndHead(K_COMPACT_END, begin).pack(), ()), "sync")
    b.flush()
    # switch the index to the copies (the same replay a reopen does), then drop the prefix
    old_ix, old_pos = store._ix, store._scan_pos
    store._shadow = None
    store._scan_pos = begin
    try:
        store._replay()       # BEGIN .. END: ends with store._ix = the copies' index
    except BaseException:
        # the old frames are still there (nothing was removed): keep serving them
        store._ix, store._shadow, store._scan_pos = old_ix, None, old_pos
        raise
    _keep_heads(store, old_heads, mapped)
    b.remove_prefix(begin)
    store._scan_pos = max(store._scan_pos, b.start_lsn)
    if store._index_every:
        store._write_index()      # open then replays nothing of the copies
    return {"bytes_before": bytes_before, "bytes_after": b.size_bytes(),
            "checkpoints_kept": kept, "journal_records_kept": sum(
                len(v) for v in store._ix.journals.values())}


def _keep_heads(store, old_heads, mapped) -> None:
    """Carry each lane's materialized newest state over to the copies.

    Keeping the very objects that were put (not a reload from the log) keeps
    delta detection working for the next put of a running agent.
    """
    def remap(packed: bytes) -> bytes:
        return pack_ref(*mapped[unpack_ref(packed)])

    for (t, n), head in old_heads.items():
        lane = store._ix.lane(t, n)
        if lane is None or not lane.ids or lane.ids[-1] != head.cid:
            continue
        try:
            for c in head.chans.values():
                c.ref = mapped[tuple(c.ref)]
                if c.loaded:
                    c.base = remap(c.base)
                    c.deltas = [remap(d) for d in c.deltas]
        except KeyError:
            continue   # defensive: reload from the log instead
        head.lsn = lane.lsns[-1]
        lane.head = head
