"""Point reads of the store: one checkpoint (the newest from memory, an older one from
its frame) and the merged pending writes of a checkpoint.

:class:`Reads` holds the backend, the :class:`~durkv.store.replay.LogIndex` (the index
it looks checkpoints up in: a compaction replaces it), the
:class:`~durkv.store.delta.ChannelEncoder` (the newest state) and the serde; the store calls
it under its lock. Streams of checkpoints are :mod:`durkv.store.history`.
"""

from __future__ import annotations

from typing import Any

from ..errors import CorruptionError
from ..payload import DELTA, F_REFS, F_VALUE, FULL, Codec, entry_at, unpack_jref
from .ckpthead import CkptHeads
from .delta import ChannelEncoder, list_loads
from .index import Lane
from .records import (
    K_CKPT, K_COPY_CKPT, K_COPY_JOURNAL, K_COPY_WRITES, K_JOURNAL, K_WRITES, Checkpoint,
    CkptHead, PendingWrite, WritesHead, read_head,
)
from .replay import LogIndex

__all__ = ["Reads", "checkpoint_fields"]

_CID = CkptHead._fields.index("cid")
_RESULTS_KEPT = 256     # journal results a reader keeps by LSN (a history walk's replies)
# the records whose list entries a journal record's `ir` may name (FORMAT.md 5a)
_LIST_RECORDS = (K_WRITES, K_CKPT, K_COPY_WRITES, K_COPY_CKPT)


def checkpoint_fields(heads: CkptHeads, read: Any, payload: bytes, cid: str, lsn: int,
                      url: str) -> list:
    """The head of the checkpoint frame at ``lsn``, which the index says holds ``cid``,
    as the list of ``CkptHead``'s fields (length checked: the history walk unpacks it;
    a delta head resolved against its keyframe by ``heads``, ``read`` reading it); a
    frame that is something else is never returned as it (a log cut and reused under a
    reader, FORMAT.md 2a)."""
    h = read_head(payload, lsn)
    if (h[0] == K_CKPT or h[0] == K_COPY_CKPT) and len(h) > _CID and h[_CID] == cid:
        return CkptHead.fields(heads.full(read, h, lsn), lsn)
    raise CorruptionError(
        f"store {url}: frame {lsn} does not hold checkpoint {cid!r}; the log changed "
        "under this handle (repaired by `durkv recover`?): refresh() or reopen the store",
        kind="bad_record", lsn=lsn)


class _WriteItems:
    """A pending write's list value as its stored items (decoded after the merge)."""

    __slots__ = ("items",)

    def __init__(self, items: list) -> None:
        self.items = items


class Reads:
    """Checkpoints and pending writes read back (under the store's lock)."""

    def __init__(self, backend: Any, index: LogIndex, encoder: ChannelEncoder, heads: CkptHeads,
                 serde: Any, codec: Codec, url: str) -> None:
        self._b = backend
        self._index = index
        self._heads = heads
        self._encoder = encoder
        self.loads = serde.loads     # the serde's and the codec's decoders (History's too)
        self.loads_list = list_loads(serde)     # a list's items, in one call where it can
        self.codec = codec
        self.url = url
        # a jref item's journal result by frame LSN: stored bytes, never a decoded value
        # (GUARANTEES 10); a repair may reuse LSNs, so the store clears it on every reload
        self._results: dict[int, bytes] = {}
        codec.resolve = self.journal_item

    def forget_results(self) -> None:
        self._results.clear()

    def write_item(self, lsn: int, entry: int, i: int) -> bytes:
        """The serialized bytes of item ``i`` of list entry ``entry`` (a FULL entry, or a
        DELTA's own items) of the pending-write or checkpoint record at frame ``lsn`` (zstd
        and ``jref`` undone): what a journal record's ``ir``
        item ``[lsn, entry, i]`` names (FORMAT.md 5a)."""
        payload = self._b.read(lsn)
        h = read_head(payload, lsn)
        e = entry_at(payload, entry) if h[0] in _LIST_RECORDS and entry >= 0 else None
        if e is None or not 0 <= i < len(e.items) or not (
                (e.kind == FULL and not e.flags & F_VALUE)
                or (e.kind == DELTA and not e.flags & F_REFS)):
            raise CorruptionError(
                f"store {self.url}: a journal record names item {i} of entry {entry} of "
                f"frame {lsn}, which holds no such list item; run `durkv verify --deep`",
                kind="bad_record", lsn=lsn)
        return self.codec.unpack(e.items[i])

    def journal_item(self, item: bytes) -> bytes:
        """The bytes a ``jref`` item stands for (FORMAT.md section 5): the result ``r`` of
        the journal record it names, or ``pre + r[start:end] + post``."""
        try:
            lsn, start, end, pre, post = unpack_jref(item)
        except ValueError as e:
            raise CorruptionError(f"store {self.url}: an item names a journal result, and "
                                  f"{e}; run `durkv verify --deep`", kind="bad_record") from None
        r = self._results.get(lsn)
        if r is None:
            h = read_head(self._b.read(lsn), lsn)
            rec = h[2] if (h[0] == K_JOURNAL or h[0] == K_COPY_JOURNAL) and len(h) > 2 else None
            r = rec.get("r") if type(rec) is dict else None
            if type(r) is not bytes:
                raise CorruptionError(
                    f"store {self.url}: an item names the journal result of frame {lsn}, "
                    "which is not a journal record with a result; run `durkv verify --deep`",
                    kind="bad_record", lsn=lsn)
            if len(self._results) >= _RESULTS_KEPT:
                self._results.clear()
            self._results[lsn] = r
        if end is None:
            return r
        if end > len(r):
            raise CorruptionError(
                f"store {self.url}: an item names bytes {start}..{end} of the journal result "
                f"of frame {lsn}, which has {len(r)}; run `durkv verify --deep`",
                kind="bad_record", lsn=lsn)
        return b"".join((pre, r[start:end], post))

    def get(self, thread_id: str, ns: str, checkpoint_id: str | None) -> Checkpoint | None:
        """A checkpoint with its values and pending writes (``None`` id: the newest), or
        None when there is no such checkpoint."""
        lane = self._index.ix.lane(thread_id, ns)
        if lane is None or not lane.ids:
            return None
        newest = lane.newest
        if checkpoint_id is None or (newest is not None and checkpoint_id == newest.cid):
            return self._newest(thread_id, ns, lane)
        pos = lane.find(checkpoint_id)
        if pos < 0:
            return None
        lsn = lane.lsns[pos]
        h = CkptHead.of(self.fields_of(self._b.read(lsn), checkpoint_id, lsn))
        return self.checkpoint(thread_id, ns, lane, lsn, h)

    def fields_of(self, payload: bytes, cid: str, lsn: int) -> list:
        """:func:`checkpoint_fields` of frame ``lsn`` (``payload``), said to hold ``cid``."""
        return checkpoint_fields(self._heads, self._b.read, payload, cid, lsn, self.url)

    def head_at(self, lsn: int, payload: bytes | None = None) -> CkptHead:
        """The full typed head of the checkpoint frame at ``lsn`` (``payload`` if at hand)."""
        return self._heads.load(self._b.read, lsn, payload)

    def metadata_at(self, lsn: int) -> Any:
        """The metadata of the checkpoint frame at ``lsn``, deserialized."""
        return self.loads(self.head_at(lsn).meta_b)

    def _newest(self, thread_id: str, ns: str, lane: Lane) -> Checkpoint:
        """The newest checkpoint of ``lane``, from its materialized state (no frame read)."""
        encoder = self._encoder
        newest = encoder.newest(lane)
        loads = self.loads
        return Checkpoint(
            thread_id, ns, newest.cid, newest.parent, loads(newest.ckpt_b), loads(newest.meta_b),
            dict(newest.versions), {ch: encoder.value(c) for ch, c in newest.chans.items()},
            self.pending_writes(lane, newest.lsn))

    def checkpoint(self, thread_id: str, ns: str, lane: Lane, lsn: int,
                   h: CkptHead) -> Checkpoint:
        """The checkpoint of head ``h`` (frame ``lsn``): one ``read_channel`` per channel."""
        loads = self.loads
        unpack = self.codec.unpack
        values = {}
        for ch, (rl, ri) in h.chans.items():
            items, flags = self._b.read_channel(rl, ri)
            if flags & F_VALUE:
                values[ch] = loads(unpack(items[0]))
            else:
                values[ch] = self.loads_list([unpack(x) for x in items])
        return Checkpoint(thread_id, ns, h.cid, h.parent, loads(h.ckpt_b), loads(h.meta_b),
                          h.versions, values, self.pending_writes(lane, lsn))

    def pending_writes(self, lane: Lane, ckpt_lsn: int, cid: str | None = None,
                       raw: bool = False) -> list[PendingWrite]:
        """The merged pending writes of the checkpoint at ``ckpt_lsn`` (-1: the orphan writes
        to ``cid``); ``raw``: values left as stored (bytes, or the ``(lsn, idx)`` of the
        entry holding a list's items), as compaction copies them."""
        wl = lane.writes_of(ckpt_lsn) if ckpt_lsn >= 0 else lane.orphan_writes().get(cid, [])
        if not wl:
            return []
        merged: dict[tuple[str, int], PendingWrite] = {}
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
        if not raw:
            self._decode_values(out)
        return out

    def _decode_values(self, writes: list[PendingWrite]) -> None:
        unpack = self.codec.unpack
        loads = self.loads
        for p in writes:
            v = p.value
            if type(v) is _WriteItems:
                p.value = self.loads_list([unpack(x) for x in v.items])
            else:
                p.value = loads(unpack(v))
