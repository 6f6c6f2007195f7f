"""Reads of the store: get, history, channel entries, pending writes, listings.

A mixin of :class:`durkv.store.Store` (it uses the store's lock, index, backend,
serde and codec).

History derives older list values from newer ones
-------------------------------------------------
``get`` of an older checkpoint reads each list channel with one ``read_channel``
(every delta back to the base) and deserializes every item: O(list length).
Doing that for every checkpoint of an N-step agent loop costs O(N^2) frame reads
and deserializations. :meth:`Reads.history` streams newest first instead and
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
from typing import Any, Iterator

from .channels import (
    DELTA, F_REFS, F_VALUE, FULL, SNAP, entry_at, entry_header, snap_ref_at, snap_refs,
)
from .ckpthead import CkptHeads
from .errors import ConfigError, CorruptionError, DurkvError, NotFoundError
from .index import Lane
from .records import (
    K_CKPT, K_COPY_CKPT, ChannelEntry, Checkpoint, PendingWrite, check_id, check_limit,
    CkptHead, WritesHead, check_opt_id, read_head,
)

__all__ = ["Reads"]

# values that are safe to hand out to several checkpoints (cannot be mutated)
_IMMUTABLE = frozenset((str, int, float, bool, bytes, complex, type(None)))
_MISS = object()


def _checkpoint_head(heads: CkptHeads, read: Any, payload: bytes, cid: str, lsn: int,
                     url: str) -> CkptHead:
    """The head of the checkpoint frame at ``lsn``, which the index says holds ``cid``;
    a frame that is something else is never returned as it (a log cut and reused under
    a reader, FORMAT.md 2a). A delta head is resolved against its base (``heads``)."""
    h = read_head(payload, lsn)
    if (h[0] == K_CKPT or h[0] == K_COPY_CKPT) and len(h) > 3 and h[3] == cid:
        return CkptHead.of(heads.full(read, h, lsn), lsn)
    raise CorruptionError(
        f"store {url}: frame {lsn} does not hold checkpoint {cid!r}; the log changed "
        "under this handle (repaired by `durkv recover`?): refresh() or reopen the store",
        kind="bad_record", lsn=lsn)


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


class _WriteItems:
    """A pending write's list value as its stored items (decoded after the merge)."""

    __slots__ = ("items",)

    def __init__(self, items: list) -> None:
        self.items = items


class Reads:
    """Mixin: the read side of :class:`durkv.store.Store`."""

    def _read_writes(self, lane: Lane, ckpt_lsn: int, cid: str | None = None,
                     raw: bool = False) -> list[PendingWrite]:
        """The merged pending writes of a checkpoint (``raw``: values left as stored bytes)."""
        wl = lane.writes_of(ckpt_lsn) if ckpt_lsn >= 0 else lane.orphan_writes().get(cid, [])
        if not wl:
            return []
        merged: dict[tuple[str, int], PendingWrite] = {}
        unpack = self._codec.unpack
        loads = self._loads
        for w in wl:
            payload = self._b.read(w)
            h = WritesHead.of(read_head(payload, w), w)
            task, path, replace = h.task_id, h.task_path, h.replace
            for idx, ch, vb in h.writes:
                key = (task, idx)
                if replace or key not in merged:
                    if type(vb) is int:
                        # a list held as entry vb of this frame (FORMAT.md section 5)
                        vb = (w, vb) if raw else _WriteItems(entry_at(payload, vb).items)
                    elif type(vb) is list:
                        # ... or as the items of an entry of an earlier frame
                        vb = (vb[0], vb[1]) if raw else _WriteItems(
                            entry_at(self._b.read(vb[0]), vb[1]).items)
                    merged[key] = PendingWrite(task, ch, vb, idx, path)
        out = sorted(merged.values(), key=lambda p: (p.task_path, p.task_id, p.idx))
        if raw:
            return out
        for p in out:
            v = p.value
            if type(v) is _WriteItems:
                p.value = [loads(unpack(x)) for x in v.items]
            else:
                p.value = loads(unpack(v))
        return out

    # -- reads -------------------------------------------------------------------------------

    def get(self, thread_id: str, checkpoint_ns: str = "",
            checkpoint_id: str | None = None) -> Checkpoint | None:
        """A checkpoint with its values and pending writes; ``None`` id = the newest.

        Returns None when there is no such checkpoint.
        """
        check_id("thread_id", thread_id)
        check_id("checkpoint_ns", checkpoint_ns, allow_empty=True)
        check_opt_id("checkpoint_id", checkpoint_id)
        with self._lock:
            self._check_open()
            lane = self._ix.lane(thread_id, checkpoint_ns)
            if lane is None or not lane.ids:
                return None
            head = lane.head
            if checkpoint_id is None or (head is not None and checkpoint_id == head.cid):
                if head is None:
                    head = self._load_head(lane)
                loads = self._loads
                return Checkpoint(
                    thread_id, checkpoint_ns, head.cid, head.parent, loads(head.ckpt_b),
                    loads(head.meta_b), dict(head.versions),
                    {ch: self._chan_value(c) for ch, c in head.chans.items()},
                    self._read_writes(lane, head.lsn))
            pos = lane.find(checkpoint_id)
            if pos < 0:
                return None
            lsn = lane.lsns[pos]
            h = _checkpoint_head(self._ckh, self._b.read, self._b.read(lsn), checkpoint_id, lsn,
                                 self.url)
            return self._read_checkpoint(thread_id, checkpoint_ns, lane, lsn, h)

    def _read_checkpoint(self, thread_id: str, ns: str, lane: Lane, lsn: int,
                         h: CkptHead | None = None, metadata: dict | None = None) -> Checkpoint:
        if h is None:
            h = self._ckh.load(self._b.read, lsn)
        loads = self._loads
        unpack = self._codec.unpack
        values = {}
        for ch, (rl, ri) in h.chans.items():
            items, flags = self._b.read_channel(rl, ri)
            if flags & F_VALUE:
                values[ch] = loads(unpack(items[0]))
            else:
                values[ch] = [loads(unpack(x)) for x in items]
        return Checkpoint(thread_id, ns, h.cid, h.parent, loads(h.ckpt_b),
                          metadata if metadata is not None else loads(h.meta_b), h.versions,
                          values,
                          self._read_writes(lane, lsn))

    def _walk(self, t: str, n: str, lane: Lane, before: str | None, chunk: int = 64):
        """``(cid, lsn, lane)`` of lane (t, n) newest first, below ``before``; O(what is
        consumed): takes ``chunk`` entries at a time under the lock and finds its place
        again by id, so concurrent puts and removals never break the walk. The lane is
        looked up again for every chunk: a compaction replaces the index (and every
        LSN), a deleted thread ends the walk."""
        upper = before
        while True:
            with self._lock:
                cur = self._ix.lane(t, n)
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
            cur = self._ix.lane(t, n)
            pos = cur.find(cid) if cur is not None else -1
            if pos < 0:
                return None     # removed since the walk listed it
            lsn = cur.lsns[pos]
            return cur, lsn, self._b.read(lsn)

    def history(self, thread_id: str | None = None, checkpoint_ns: str | None = None, *,
                before: str | None = None, limit: int | None = None,
                filter: dict | None = None,  # noqa: A002
                values: bool = True) -> Iterator[Checkpoint]:
        """Checkpoints newest first (by id, across threads too), streamed.

        Args:
            thread_id: one thread, or None for all.
            checkpoint_ns: one namespace, or None for all.
            before: only checkpoints with an id lower than this.
            limit: at most this many.
            filter: metadata keys that must equal the given values.
            values: False yields headers only -- ids, parent, checkpoint record,
                metadata and versions, with ``values == {}`` and ``writes == []``:
                one frame read per checkpoint, no channel read, no deserialized value.

        Each yielded checkpoint has its own ``values`` dict and, for a list channel,
        its own list object (mutating it changes no other checkpoint), as ``get``
        returns; non-list values are deserialized afresh per checkpoint (immutable
        scalars may be shared). The **items** of list channels may be shared
        between the checkpoints of one walk: an older checkpoint's list is a prefix
        slice of a newer one's whenever the newer entry extends the older (the
        agent-loop case), which makes a full listing O(total items) rather than
        O(N^2) reads and deserializations (see the module docstring). Do not mutate
        the items in place if you keep several checkpoints' values.
        """
        if thread_id is not None:
            check_id("thread_id", thread_id)
        if checkpoint_ns is not None:
            check_id("checkpoint_ns", checkpoint_ns, allow_empty=True)
        check_opt_id("before", before)
        check_limit(limit)
        if filter is not None and not isinstance(filter, dict):
            raise ConfigError(f"filter must be a dict of metadata keys and values, got "
                              f"{type(filter).__name__}")
        return self._history(thread_id, checkpoint_ns, before, limit, filter, values)

    def _history(self, thread_id: str | None, checkpoint_ns: str | None, before: str | None,
                 limit: int | None, filter: dict | None,  # noqa: A002
                 values: bool) -> Iterator[Checkpoint]:
        if limit is not None and limit <= 0:
            return
        with self._lock:
            self._check_open()
            lanes = list(self._ix.lanes(thread_id, checkpoint_ns))
        if len(lanes) == 1:
            t, n, lane = lanes[0]
            stream = ((cid, t, n, ln, lsn) for cid, lsn, ln in self._walk(t, n, lane, before))
        else:
            def one(t, n, lane):
                for cid, lsn, ln in self._walk(t, n, lane, before):
                    yield cid, t, n, ln, lsn
            stream = heapq.merge(*(one(*x) for x in lanes), key=lambda r: r[0], reverse=True)
        memo = _Memo() if values else None
        loads = self._loads
        count = 0
        salvage = getattr(self._b, "recovery", None) == "salvage"
        for cid, t, n, lane, lsn in stream:
            with self._lock:
                self._check_open()
                try:
                    got = self._frame(t, n, lane, cid, lsn)
                except (NotFoundError, CorruptionError):
                    if not salvage:
                        raise
                    continue        # its frame is lost (salvage: skip it, see below)
                if got is None:
                    continue
                lane, lsn, payload = got
                h = _checkpoint_head(self._ckh, self._b.read, payload, cid, lsn, self.url)
                meta = None
                if filter:
                    meta = loads(h.meta_b)
                    if not (isinstance(meta, dict)
                            and all(k in meta and meta[k] == v for k, v in filter.items())):
                        continue
                if meta is None:
                    meta = loads(h.meta_b)
                if memo is None:
                    cp = Checkpoint(t, n, h.cid, h.parent, loads(h.ckpt_b), meta, h.versions,
                                    {}, [])
                else:
                    try:
                        vals = self._history_values(lsn, payload, h.chans, memo)
                        writes = self._read_writes(lane, lsn)
                    except (NotFoundError, CorruptionError):
                        # salvage reads what still verifies: a checkpoint whose values
                        # cross the damage (a delta chain into a lost segment) is skipped,
                        # and the walk goes on to older ones (the log reports the damage)
                        if not salvage:
                            raise
                        continue
                    cp = Checkpoint(t, n, h.cid, h.parent, loads(h.ckpt_b), meta, h.versions,
                                    vals, writes)
            yield cp
            count += 1
            if limit is not None and count >= limit:
                return

    def _history_values(self, lsn: int, payload: bytes, refs: dict, memo: _Memo) -> dict:
        """The channel values of the checkpoint at ``lsn`` (its frame ``payload``, channel
        map ``refs``), derived from ``memo`` where possible; records what it learns."""
        loads = self._loads
        unpack = self._codec.unpack
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
                master = [loads(unpack(x)) for x in items]
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

    def channel_entries(self, thread_id: str, checkpoint_ns: str, channel: str, *,
                        before: str | None = None,
                        limit: int | None = None) -> Iterator[ChannelEntry]:
        """What each checkpoint wrote to ``channel``, newest first.

        Yields a :class:`ChannelEntry` per checkpoint of (thread, ns) whose commit
        wrote the channel (checkpoints that left it unchanged or have no value are
        skipped): ``"append"`` with only the appended items for a delta, ``"full"``
        with the whole list, or ``"value"`` for a non-list value. Reading the
        appends back to the nearest ``"full"`` rebuilds the list without reading
        it whole at every step (LangGraph's ``get_delta_channel_history``).
        """
        check_id("thread_id", thread_id)
        check_id("checkpoint_ns", checkpoint_ns, allow_empty=True)
        check_id("channel", channel)
        check_opt_id("before", before)
        check_limit(limit)
        return self._channel_entries(thread_id, checkpoint_ns, channel, before, limit)

    def _channel_entries(self, thread_id: str, checkpoint_ns: str, channel: str,
                         before: str | None, limit: int | None) -> Iterator[ChannelEntry]:
        with self._lock:
            lane = self._ix.lane(thread_id, checkpoint_ns)
        if lane is None:
            return
        count = 0
        loads = self._loads
        unpack = self._codec.unpack
        for cid, lsn, lane in self._walk(thread_id, checkpoint_ns, lane, before):
            if limit is not None and count >= limit:
                return
            with self._lock:
                got = self._frame(thread_id, checkpoint_ns, lane, cid, lsn)
                if got is None:
                    continue
                lane, lsn, payload = got
                ref = self._ckh.load(self._b.read, lsn, payload).chans.get(channel)
                if ref is None or ref[0] != lsn:
                    continue
                e = entry_at(payload, ref[1])
                if e.kind == SNAP:
                    last = e.items[-1]
                    rl, ri = int.from_bytes(last[:8], "little"), int.from_bytes(last[8:], "little")
                    e = entry_at(payload if rl == lsn else self._b.read(rl), ri)
                    ref = (rl, ri)
                if e.kind == DELTA:
                    # this commit's DELTAs (items of its own, or F_REFS naming the items
                    # the parent's pending writes stored) chain within its frame
                    items = self._own_items(e, ref[0])
                    while e.prev_lsn == lsn and ref[0] == lsn:
                        e = entry_at(payload, e.prev_idx)
                        if e.kind != DELTA:
                            break
                        items = self._own_items(e, lsn) + items
                    out = ChannelEntry(cid, "append", [loads(unpack(x)) for x in items])
                elif e.flags & F_VALUE:
                    out = ChannelEntry(cid, "value", loads(unpack(e.items[0])))
                else:
                    out = ChannelEntry(cid, "full", [loads(unpack(x)) for x in e.items])
            yield out
            count += 1

    def _own_items(self, e: Any, lsn: int) -> list[bytes]:
        """A DELTA's own items; with F_REFS, the items of the entries it names."""
        if not e.flags & F_REFS:
            return e.items
        read = self._b.read
        out: list[bytes] = []
        for rl, ri in snap_refs(e):
            out.extend(entry_at(read(rl), ri).items)
        return out

    def threads(self) -> list[str]:
        """Ids of the threads that have at least one checkpoint, sorted."""
        with self._lock:
            return sorted(t for t, nss in self._ix.threads.items()
                          if any(lane.ids for lane in nss.values()))

    def namespaces(self, thread_id: str) -> list[str]:
        """Namespaces of a thread that have at least one checkpoint, sorted."""
        check_id("thread_id", thread_id)
        with self._lock:
            nss = self._ix.threads.get(thread_id, {})
            return sorted(n for n, lane in nss.items() if lane.ids)
