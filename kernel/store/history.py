"""History: streams of checkpoints newest first, and what each wrote to a channel.

:class:`History` holds the store's lock (a walk takes it per chunk and per
checkpoint, never across a ``yield``), a check that the store is still open, the
backend, the :class:`~durkv.store.replay.LogIndex` and the
:class:`~durkv.store.reads.Reads` (for pending writes).

History derives older list values from newer ones
-------------------------------------------------
``get`` of an older checkpoint reads each list channel with one ``read_channel``
(every delta back to the base) and deserializes every item: O(list length).
Doing that for every checkpoint of an N-step agent loop costs O(N^2) frame reads
and deserializations. :meth:`History.checkpoints` streams newest first instead and
keeps, for the entries it met, ``value(entry ref) == master[:n]`` (a
:class:`_Memo`): when a newer checkpoint's entry for a channel is a DELTA whose
``prev`` is the older checkpoint's entry (or a SNAP whose last DELTA has that
``prev``; or the very same entry: the value did not change), the older value is
a prefix of the newer one -- ``master[:n - own items of the DELTA]``: no read,
no deserialization. Entry refs are never reused (an LSN is written once), so the
memo is keyed by ref alone and shared by every lane of one walk (copied threads
share frames). Anything else -- a fork's FULL entries, a chain the walk has not
met, an unexpected shape -- falls back to ``read_channel``.
"""

from __future__ import annotations

import heapq
import struct
from bisect import bisect_left
from typing import Any, Callable, Iterator

from ..errors import CorruptionError, DurkvError, NotFoundError
from ..payload import (
    DELTA, F_REFS, F_VALUE, FULL, SNAP, entry_at, entry_header, snap_ref_at, snap_refs,
    unpack_ref,
)
from .index import Lane
from .reads import Reads
from .records import ChannelEntry, Checkpoint
from .replay import LogIndex

__all__ = ["History"]

# values that are safe to hand out to several checkpoints (cannot be mutated)
_IMMUTABLE = frozenset((str, int, float, bool, bytes, complex, type(None)))
_MISS = object()


class _Memo:
    """Channel values met during one history walk, by entry ref (see the module docstring).

    ``lists[ref] = (master, n)``: the value of entry ``ref`` is ``master[:n]``.
    ``master`` is never handed out (callers get slices: new lists), so a caller
    mutating its list cannot change another checkpoint's value. Bounded (LRU):
    a linear walk needs a couple of live refs, one per branch when forks
    interleave.
    ``vals[ref] = (shared, x)``: a non-list value, ``x`` itself when immutable
    (``shared``), else its serialized bytes (deserialized afresh per checkpoint).
    ``seen``: refs whose entry was already decoded to derive its ``prev``.
    """

    __slots__ = ("lists", "vals", "seen")
    MAX_LISTS = 32
    MAX_VALS = 256

    def __init__(self) -> None:
        self.lists: dict[tuple[int, int], tuple[list, int]] = {}
        self.vals: dict[tuple[int, int], tuple[bool, Any]] = {}
        self.seen: set[tuple[int, int]] = set()

    def put_list(self, ref: tuple[int, int], master: list, n: int) -> None:
        lists = self.lists
        lists.pop(ref, None)
        if len(lists) >= self.MAX_LISTS:
            del lists[next(iter(lists))]
        lists[ref] = (master, n)

    def get_list(self, ref: tuple[int, int]) -> tuple[list, int] | None:
        hit = self.lists.pop(ref, None)
        if hit is not None:
            self.lists[ref] = hit      # most recently used last
        return hit

    def put_val(self, ref: tuple[int, int], shared: bool, x: Any) -> None:
        vals = self.vals
        if len(vals) >= self.MAX_VALS:
            del vals[next(iter(vals))]
        vals[ref] = (shared, x)

    def mark(self, ref: tuple[int, int]) -> None:
        seen = self.seen
        if len(seen) >= 8192:
            seen.clear()
        seen.add(ref)


class History:
    """Newest-first walks over the index (see the module docstring)."""

    def __init__(self, lock: Any, check_open: Callable[[], None], backend: Any,
                 index: LogIndex, reads: Reads) -> None:
        self._lock = lock
        self._check_open = check_open
        self._b = backend
        self._index = index
        self._reads = reads      # heads, and the serde's and the codec's decoders

    def _walk(self, t: str, n: str, lane: Lane, before: str | None, chunk: int = 64):
        """``(cid, lsn, lane)`` of lane (t, n) newest first, below ``before``; O(what is
        consumed): takes ``chunk`` entries at a time under the lock and finds its place
        again by id, so concurrent puts and removals never break the walk. The lane is
        looked up again for every chunk: a compaction replaces the index (and every
        LSN), a deleted thread ends the walk."""
        upper = before
        while True:
            with self._lock:
                cur = self._index.ix.lane(t, n)
                if cur is None:
                    return
                lane = cur
                ids = lane.ids
                hi = len(ids) if upper is None else bisect_left(ids, upper)
                lo = max(0, hi - chunk)
                part = list(zip(ids[lo:hi], lane.lsns[lo:hi]))
            if not part:
                return
            for cid, lsn in reversed(part):
                yield cid, lsn, lane
            upper = part[0][0]
            chunk = min(chunk * 2, 4096)

    def _frame(self, t: str, n: str, lane: Lane, cid: str, lsn: int):
        """``(lane, lsn, payload)`` of checkpoint ``cid`` (under the lock); a checkpoint
        whose frame a compaction moved since the walk listed it is found again by id.
        None if it is gone."""
        try:
            return lane, lsn, self._b.read(lsn)
        except NotFoundError:
            cur = self._index.ix.lane(t, n)
            pos = cur.find(cid) if cur is not None else -1
            if pos < 0:
                return None     # removed since the walk listed it
            lsn = cur.lsns[pos]
            return cur, lsn, self._b.read(lsn)

    def checkpoints(self, thread_id: str | None, checkpoint_ns: str | None, before: str | None,
                    limit: int | None, filter: dict | None,  # noqa: A002
                    values: bool) -> Iterator[Checkpoint]:
        """The checkpoints of :meth:`durkv.store.Store.history` (arguments checked)."""
        if limit is not None and limit <= 0:
            return
        memo = _Memo() if values else None
        salvage = getattr(self._b, "recovery", None) == "salvage"
        count = 0
        for cid, t, n, lane, lsn in self._newest_first(thread_id, checkpoint_ns, before):
            with self._lock:
                self._check_open()
                cp = self._checkpoint(t, n, lane, cid, lsn, filter, memo, salvage)
            if cp is None:
                continue
            yield cp
            count += 1
            if limit is not None and count >= limit:
                return

    def _newest_first(self, thread_id: str | None, ns: str | None, before: str | None):
        """``(cid, thread, ns, lane, lsn)`` of every matching lane, merged newest first."""
        with self._lock:
            self._check_open()
            lanes = list(self._index.ix.lanes(thread_id, ns))
        if len(lanes) == 1:
            t, n, lane = lanes[0]
            return ((cid, t, n, ln, lsn) for cid, lsn, ln in self._walk(t, n, lane, before))

        def one(t, n, lane):
            for cid, lsn, ln in self._walk(t, n, lane, before):
                yield cid, t, n, ln, lsn
        return heapq.merge(*(one(*x) for x in lanes), key=lambda r: r[0], reverse=True)

    def _checkpoint(self, t: str, n: str, lane: Lane, cid: str, lsn: int,
                    filter: dict | None, memo: _Memo | None,  # noqa: A002
                    salvage: bool) -> Checkpoint | None:
        """Checkpoint ``cid`` of the walk (under the lock): None when it is gone or its
        metadata does not match ``filter``; headers only when there is no ``memo``.

        ``salvage`` reads what still verifies: a checkpoint whose frame is lost, or whose
        values cross the damage (a delta chain into a lost segment), is skipped (None),
        and the walk goes on to older ones (the log reports the damage)."""
        try:
            got = self._frame(t, n, lane, cid, lsn)
        except (NotFoundError, CorruptionError):
            if not salvage:
                raise
            return None
        if got is None:
            return None
        lane, lsn, payload = got
        _k, _t, _n, cid, parent, ckpt_b, meta_b, versions, chans = self._reads.fields_of(
            payload, cid, lsn)
        loads = self._reads.loads
        meta = loads(meta_b)
        # a missing key reads as None, as LangGraph's InMemorySaver and SqliteSaver match
        if filter and not (isinstance(meta, dict)
                           and all(meta.get(k) == v for k, v in filter.items())):
            return None
        if memo is None:
            return Checkpoint(t, n, cid, parent, loads(ckpt_b), meta, versions, {}, [])
        try:
            vals = self._history_values(lsn, payload, chans, memo)
            writes = self._reads.pending_writes(lane, lsn)
        except (NotFoundError, CorruptionError):
            if not salvage:
                raise
            return None
        return Checkpoint(t, n, cid, parent, loads(ckpt_b), meta, versions, vals, writes)

    def _history_values(self, lsn: int, payload: bytes, refs: dict, memo: _Memo) -> dict:
        """The channel values of the checkpoint at ``lsn`` (its frame ``payload``, channel
        map ``refs``), derived from ``memo`` where possible; records what it learns."""
        loads = self._reads.loads
        unpack = self._reads.codec.unpack
        out = {}
        for ch, ref in refs.items():
            r = (ref[0], ref[1])
            hit = memo.get_list(r)
            if hit is not None:
                master, n = hit
                out[ch] = master[:n]
                if r not in memo.seen:
                    self._derive(r, master, n, lsn, payload, memo)
                continue
            got = memo.vals.get(r, _MISS)
            if got is not _MISS:
                shared, x = got
                out[ch] = x if shared else loads(x)
                continue
            e = entry_at(payload, r[1]) if r[0] == lsn else None
            if e is not None and e.kind == FULL:
                items, flags = e.items, e.flags     # in the frame at hand: no read
            else:
                items, flags = self._b.read_channel(r[0], r[1])
            if flags & F_VALUE:
                raw = unpack(items[0])
                v = loads(raw)
                shared = type(v) in _IMMUTABLE
                memo.put_val(r, shared, v if shared else raw)
                out[ch] = v
            else:
                master = self._reads.loads_list([unpack(x) for x in items])
                n = len(master)
                memo.put_list(r, master, n)
                out[ch] = master[:]
                self._derive(r, master, n, lsn, payload, memo)
        return out

    def _derive(self, r: tuple[int, int], master: list, n: int, lsn: int, payload: bytes,
                memo: _Memo) -> None:
        """Given ``value(r) == master[:n]``, record the value of the entry ``r`` extends:
        a DELTA's ``prev`` is ``master[:n - own items]``; a SNAP is a pointer copy of
        its last DELTA (checked: that DELTA's ``prev`` is the SNAP's previous reference).
        Anything unexpected records nothing (the reader then falls back to the log)."""
        memo.mark(r)
        read = self._b.read
        try:
            p = payload if r[0] == lsn else read(r[0])
            kind, _f, _d, pl, pi, k, off = entry_header(p, r[1])
            if kind == SNAP:
                if k == 0:
                    return
                if k == 1:
                    base = snap_ref_at(p, off, 0)
                    if base < r:
                        memo.put_list(base, master, n)
                    return
                last = snap_ref_at(p, off, k - 1)
                before = snap_ref_at(p, off, k - 2)
                if not before < last < r:
                    return
                q = p if last[0] == r[0] else read(last[0])
                kind, _f, _d, pl, pi, k, _off = entry_header(q, last[1])
                if kind != DELTA or (pl, pi) != before:
                    return
                if _f & F_REFS:
                    k = self._refs_count(q, _off, k)
            elif kind != DELTA:
                return
            elif _f & F_REFS:
                k = self._refs_count(p, off, k)
            prev = (pl, pi)
            if k <= n and prev < r:
                memo.put_list(prev, master, n - k)
        except (DurkvError, struct.error, IndexError):
            return

    def _refs_count(self, payload: bytes, items_offset: int, n_refs: int) -> int:
        """How many items an F_REFS DELTA appends: those of the entries it names."""
        read = self._b.read
        return sum(entry_header(read(rl), ri)[5] for rl, ri in
                   (snap_ref_at(payload, items_offset, j) for j in range(n_refs)))

    def channel_entries(self, thread_id: str, checkpoint_ns: str, channel: str,
                        before: str | None, limit: int | None) -> Iterator[ChannelEntry]:
        """The entries of :meth:`durkv.store.Store.channel_entries` (arguments checked).

        What a checkpoint wrote is told by the entry chains alone, never by which frame
        holds an entry: a compaction copies each entry once, into the first copy that
        needs it (a pruned checkpoint's into the oldest kept one's frame, a copied
        thread's into the source's, a late pending write's into the write's), so after
        one the frame says nothing about who wrote an entry. A checkpoint wrote the
        channel when its entry is not its parent's; what it appended are the DELTAs one
        commit writes (an F_REFS DELTA naming the parent's pending writes, then one of
        its own items, behind a SNAP when one follows them) between its entry and its
        parent's. Without that parent in the lane (none, pruned, deleted) or a chain of
        that shape, its whole value is reported. O(what is consumed): a head per
        checkpoint (its parent's is usually the next one of the walk, so kept) and the
        entries of one commit."""
        with self._lock:
            lane = self._index.ix.lane(thread_id, checkpoint_ns)
        if lane is None:
            return
        count = 0
        heads = _Heads()
        salvage = getattr(self._b, "recovery", None) == "salvage"
        for cid, lsn, lane in self._walk(thread_id, checkpoint_ns, lane, before):
            if limit is not None and count >= limit:
                return
            with self._lock:
                try:
                    out = self._checkpoint_entry(thread_id, checkpoint_ns, channel, lane, cid,
                                                 lsn, heads, salvage)
                except (NotFoundError, CorruptionError):
                    if not salvage:
                        raise
                    continue        # salvage: what crosses the damage is skipped, as in history
            if out is None:
                continue
            yield out
            count += 1

    def _checkpoint_entry(self, t: str, n: str, channel: str, lane: Lane, cid: str, lsn: int,
                          heads: _Heads, salvage: bool) -> ChannelEntry | None:
        """What checkpoint ``cid`` of the walk wrote to ``channel`` (under the lock); None
        when it is gone, has no value or left it as its parent had it."""
        cur = self._index.ix.lane(t, n)
        if cur is None:
            return None         # the thread was deleted since the walk listed it
        got = heads.get(lsn)
        if got is not None and cur is lane:
            payload, h = got     # read as its child's parent (no compaction since)
        else:
            got = self._frame(t, n, lane, cid, lsn)
            if got is None:
                return None
            lane, lsn, payload = got
            h = self._reads.head_at(lsn, payload)
        ref = h.chans.get(channel)
        if ref is None:
            return None
        ref = (ref[0], ref[1])
        base = self._parent_ref(cur, h.parent, channel, heads, salvage)
        if base == ref:
            return None         # left unchanged since its parent
        return self._entry(cid, ref, base, lsn, payload)

    def _parent_ref(self, cur: Lane, parent: str | None, channel: str,
                    heads: _Heads, salvage: bool) -> tuple[int, int] | None:
        """The entry of ``channel`` in checkpoint ``parent`` of the current lane ``cur``
        (under the lock); None when it has none or the lane does not hold that
        checkpoint (nor, in salvage mode, a frame of it that still reads: its child then
        reports its whole value, as for any checkpoint whose parent is gone)."""
        if parent is None:
            return None
        pos = cur.find(parent)
        if pos < 0:
            return None
        plsn = cur.lsns[pos]
        got = heads.get(plsn)
        if got is None:
            try:
                payload = self._b.read(plsn)
                got = heads.put(plsn, (payload, self._reads.head_at(plsn, payload)))
            except (NotFoundError, CorruptionError):
                if not salvage:
                    raise
                return None
        r = got[1].chans.get(channel)
        return None if r is None else (r[0], r[1])

    def _entry(self, cid: str, ref: tuple[int, int], base: tuple[int, int] | None, lsn: int,
               payload: bytes) -> ChannelEntry:
        """What checkpoint ``cid`` (frame ``lsn``) wrote to a channel whose entry is
        ``ref``, its parent's ``base`` (see :meth:`channel_entries`)."""
        loads = self._reads.loads
        unpack = self._reads.codec.unpack
        read = self._b.read
        head = e = entry_at(payload if ref[0] == lsn else read(ref[0]), ref[1])
        if e.kind == SNAP and e.items:
            rl, ri = unpack_ref(e.items[-1])    # the SNAP follows the DELTA it ends with
            e = entry_at(payload if rl == lsn else read(rl), ri)
        if e.kind == DELTA and base is not None:
            seg = [e]
            prev = (e.prev_lsn, e.prev_idx)
            if prev != base and not e.flags & F_REFS:
                # its own items follow the DELTA naming the parent's pending writes
                e2 = entry_at(payload if prev[0] == lsn else read(prev[0]), prev[1])
                if e2.kind == DELTA and e2.flags & F_REFS:
                    seg.insert(0, e2)
                    prev = (e2.prev_lsn, e2.prev_idx)
            if prev == base:
                items = [x for d in seg for x in self._own_items(d)]
                return ChannelEntry(cid, "append", [loads(unpack(x)) for x in items])
        # a FULL entry, or no parent to tell its own items from: the whole value
        if head.kind == FULL:
            items, flags = head.items, head.flags       # in hand: no read
        else:
            items, flags = self._b.read_channel(ref[0], ref[1])
        if flags & F_VALUE:
            return ChannelEntry(cid, "value", loads(unpack(items[0])))
        return ChannelEntry(cid, "full", [loads(unpack(x)) for x in items])

    def _own_items(self, e: Any) -> list[bytes]:
        """A DELTA's own items; with F_REFS, the items of the entries it names."""
        if not e.flags & F_REFS:
            return e.items
        read = self._b.read
        out: list[bytes] = []
        for rl, ri in snap_refs(e):
            out.extend(entry_at(read(rl), ri).items)
        return out


class _Heads(dict):
    """``{lsn: (payload, head)}`` of the last few checkpoint frames a channel-entries walk
    read as a parent (an LSN is written once): the parent is usually the walk's next
    checkpoint, which then needs neither a read nor a decode."""

    __slots__ = ()
    CAP = 4

    def put(self, lsn: int, got: tuple[bytes, Any]) -> tuple[bytes, Any]:
        if len(self) >= self.CAP:
            del self[next(iter(self))]
        self[lsn] = got
        return got
