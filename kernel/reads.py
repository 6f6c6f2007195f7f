"""Reads of the store: get, history, channel entries, pending writes, listings.

A mixin of :class:`durkv.store.Store` (it uses the store's lock, index, backend,
serde and codec).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from typing import Iterator

from .channels import DELTA, F_VALUE, SNAP, entry_at
from .errors import NotFoundError
from .index import Lane
from .records import ChannelEntry, Checkpoint, PendingWrite, _check_id, _head_of

__all__ = ["Reads"]


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
            h = _head_of(self._b.read(w))
            task, path, replace = h[4], h[5], h[6]
            for idx, ch, vb in h[7]:
                key = (task, idx)
                if replace or key not in merged:
                    merged[key] = PendingWrite(task, ch, vb, idx, path)
        out = sorted(merged.values(), key=lambda p: (p.task_path, p.task_id, p.idx))
        if raw:
            return out
        for p in out:
            p.value = loads(unpack(p.value))
        return out

    # -- reads -------------------------------------------------------------------------------

    def get(self, thread_id: str, checkpoint_ns: str = "",
            checkpoint_id: str | None = None) -> Checkpoint | None:
        """A checkpoint with its values and pending writes; ``None`` id = the newest.

        Returns None when there is no such checkpoint.
        """
        _check_id("thread_id", thread_id)
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
            return self._read_checkpoint(thread_id, checkpoint_ns, lane, lane.lsns[pos])

    def _read_checkpoint(self, thread_id: str, ns: str, lane: Lane, lsn: int,
                         h: list | None = None, metadata: dict | None = None) -> Checkpoint:
        if h is None:
            h = _head_of(self._b.read(lsn))
        loads = self._loads
        unpack = self._codec.unpack
        values = {}
        for ch, (rl, ri) in h[8].items():
            items, flags = self._b.read_channel(rl, ri)
            if flags & F_VALUE:
                values[ch] = loads(unpack(items[0]))
            else:
                values[ch] = [loads(unpack(x)) for x in items]
        return Checkpoint(thread_id, ns, h[3], h[4], loads(h[5]),
                          metadata if metadata is not None else loads(h[6]), h[7], values,
                          self._read_writes(lane, lsn))

    def _walk(self, lane: Lane, before: str | None, chunk: int = 64):
        """``(cid, lsn)`` of a lane newest first, below ``before``; O(what is consumed):
        takes ``chunk`` entries at a time under the lock and finds its place again by
        id, so concurrent puts and removals never break the walk."""
        upper = before
        while True:
            with self._lock:
                ids = lane.ids
                hi = len(ids) if upper is None else bisect_left(ids, upper)
                lo = max(0, hi - chunk)
                part = list(zip(ids[lo:hi], lane.lsns[lo:hi]))
            if not part:
                return
            yield from reversed(part)
            upper = part[0][0]
            chunk = min(chunk * 2, 4096)

    def history(self, thread_id: str | None = None, checkpoint_ns: str | None = None, *,
                before: str | None = None, limit: int | None = None,
                filter: dict | None = None) -> Iterator[Checkpoint]:  # noqa: A002
        """Checkpoints newest first (by id, across threads too), streamed.

        Args:
            thread_id: one thread, or None for all.
            checkpoint_ns: one namespace, or None for all.
            before: only checkpoints with an id lower than this.
            limit: at most this many.
            filter: metadata keys that must equal the given values.
        """
        if thread_id is not None:
            _check_id("thread_id", thread_id)
        if limit is not None and limit <= 0:
            return
        with self._lock:
            self._check_open()
            lanes = list(self._ix.lanes(thread_id, checkpoint_ns))
        if len(lanes) == 1:
            t, n, lane = lanes[0]
            stream = ((cid, t, n, lane, lsn) for cid, lsn in self._walk(lane, before))
        else:
            def one(t, n, lane):
                for cid, lsn in self._walk(lane, before):
                    yield cid, t, n, lane, lsn
            stream = heapq.merge(*(one(*x) for x in lanes), key=lambda r: r[0], reverse=True)
        count = 0
        for _cid, t, n, lane, lsn in stream:
            with self._lock:
                self._check_open()
                try:
                    h = _head_of(self._b.read(lsn))
                except NotFoundError:
                    continue    # removed by a compaction since the listing started
                meta = None
                if filter:
                    meta = self._loads(h[6])
                    if not all(k in meta and meta[k] == v for k, v in filter.items()):
                        continue
                cp = self._read_checkpoint(t, n, lane, lsn, h, meta)
            yield cp
            count += 1
            if limit is not None and count >= limit:
                return

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
        _check_id("thread_id", thread_id)
        with self._lock:
            lane = self._ix.lane(thread_id, checkpoint_ns)
        if lane is None:
            return
        count = 0
        loads = self._loads
        unpack = self._codec.unpack
        for cid, lsn in self._walk(lane, before):
            if limit is not None and count >= limit:
                return
            with self._lock:
                try:
                    payload = self._b.read(lsn)
                except NotFoundError:
                    continue    # removed by a compaction since the walk started
                ref = _head_of(payload)[8].get(channel)
                if ref is None or ref[0] != lsn:
                    continue
                e = entry_at(payload, ref[1])
                if e.kind == SNAP:
                    last = e.items[-1]
                    rl, ri = int.from_bytes(last[:8], "little"), int.from_bytes(last[8:], "little")
                    e = entry_at(payload if rl == lsn else self._b.read(rl), ri)
                if e.kind == DELTA:
                    out = ChannelEntry(cid, "append", [loads(unpack(x)) for x in e.items])
                elif e.flags & F_VALUE:
                    out = ChannelEntry(cid, "value", loads(unpack(e.items[0])))
                else:
                    out = ChannelEntry(cid, "full", [loads(unpack(x)) for x in e.items])
            yield out
            count += 1

    def threads(self) -> list[str]:
        """Ids of the threads that have at least one checkpoint, sorted."""
        with self._lock:
            return sorted(t for t, nss in self._ix.threads.items()
                          if any(lane.ids for lane in nss.values()))

    def namespaces(self, thread_id: str) -> list[str]:
        """Namespaces of a thread that have at least one checkpoint, sorted."""
        _check_id("thread_id", thread_id)
        with self._lock:
            nss = self._ix.threads.get(thread_id, {})
            return sorted(n for n, lane in nss.items() if lane.ids)
