"""The index as the log builds it: replay of frame heads, index snapshots (``K_INDEX``).

A :class:`LogIndex` owns the in-memory :class:`~durkv.store.index.Index` and where it
stands in the log. At open it starts from the newest ``K_INDEX`` snapshot that
decodes and checks (:meth:`LogIndex.restore`), then replays the heads of the frames
after it (:meth:`LogIndex.replay`); a read-only handle replays again on
``refresh()``. The writer takes each commit into the index itself and asks
:meth:`LogIndex.maybe_snapshot` afterwards. A compaction is replayed as a shadow
index built from its copies, switched to at its END record (docs/FORMAT.md
section 5, :mod:`durkv.store.compact`).
"""

from __future__ import annotations

from typing import Any

from ..errors import CorruptionError
from ..payload import encode_record
from .appender import Appender
from .index import Index, dump_index, dump_journals, load_index, load_journals
from .records import (
    INDEX_VERSION, INDEX_VERSIONS, K_CKPT, K_COMPACT_BEGIN, K_COMPACT_END, K_COPY_CKPT, K_COPY_JOURNAL,
    K_COPY_THREAD, K_COPY_WRITES, K_DEL_JOURNAL, K_DEL_THREAD, K_INDEX, K_JOURNAL, K_REMOVE,
    K_REPAIR, K_WRITES, CkptDeltaHead, CkptHead, CompactEndHead, CopyThreadHead, DelJournalHead,
    DelThreadHead, IndexHead, JournalHead, RemoveHead, RepairHead, WritesHead, copy_runs,
    heads_of, read_head,
)

__all__ = ["LogIndex"]

_COPIES = frozenset((K_COPY_CKPT, K_COPY_WRITES, K_COPY_JOURNAL))
# the records applied to the live index as they are when no compaction is being replayed
_PLAIN = frozenset((K_CKPT, K_WRITES, K_DEL_THREAD, K_COPY_THREAD, K_REMOVE, K_JOURNAL,
                    K_DEL_JOURNAL, K_REPAIR))


def _is_index_frame(p: bytes) -> bool:
    """The head's msgpack list header, then its first element (the kind): a K_INDEX
    frame is recognised without decoding its (large) head."""
    return len(p) > 5 and 0x91 <= p[4] <= 0x9f and p[5] == K_INDEX


class LogIndex:
    """The index, the scan position and the compaction/snapshot state of one store."""

    def __init__(self, backend: Any, appender: Appender, url: str, index_every: int) -> None:
        self._b = backend
        self._appender = appender
        self.url = url
        self.index_every = index_every   # frames between K_INDEX snapshots (0: never write one)
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next :meth:`replay` starts at the log's first frame."""
        start = self._b.start_lsn
        self.ix = Index()
        self.shadow: Index | None = None   # compaction being replayed (BEGIN seen, no END yet)
        self.shadow_begin = -1
        self.compacted_at = -1             # BEGIN LSN of the last finished compaction
        self.scan_pos = start              # the next frame to replay
        self.index_lsn = start - 1         # LSN of the newest K_INDEX known

    # -- replay ------------------------------------------------------------------------------

    def replay(self) -> None:
        """Apply the heads of frames from the scan position on (open, refresh)."""
        pos = self.scan_pos
        for lsn, payload in self._b.scan(pos):
            try:
                h = read_head(payload, lsn)
                kind = h[0]
            except CorruptionError as e:
                if _is_index_frame(payload):
                    pos = lsn + 1     # a snapshot that does not decode: only a lost shortcut
                    continue
                raise self._bad_record(e, lsn) from e
            if type(kind) is int:
                try:
                    self.apply(lsn, h)
                except CorruptionError as e:
                    raise self._bad_record(e, lsn) from e
            pos = lsn + 1
        self.scan_pos = pos

    def catch_up(self) -> None:
        """Replay the frames other processes appended (several writers, FORMAT.md 12): a
        few frames, their heads read in one backend call and decoded at once. Anything
        unusual (a long gap, a head that does not decode, a backend without
        ``read_heads``) takes the plain :meth:`replay`, which says what is wrong."""
        pos, end = self.scan_pos, self._b.next_lsn
        read_heads = getattr(self._b, "read_heads", None)
        if end - pos > 512 or read_heads is None:
            self.replay()
            return
        lsns = list(range(pos, end))
        try:
            heads = heads_of(read_heads(lsns))
            if type(heads) is not list or len(heads) != len(lsns):
                raise ValueError("not one head per frame")
        except Exception:
            self.replay()
            return
        for lsn, h in zip(lsns, heads):
            if type(h) is not list or not h:
                self.scan_pos = lsn
                self.replay()           # names the bad record
                return
            if type(h[0]) is int:
                try:
                    self.apply(lsn, h)
                except CorruptionError as e:
                    raise self._bad_record(e, lsn) from e
            self.scan_pos = lsn + 1

    def _bad_record(self, e: CorruptionError, lsn: int) -> CorruptionError:
        return CorruptionError(f"store {self.url}: {e}", kind="bad_record", lsn=lsn)

    def apply(self, lsn: int, h: list) -> None:
        """Take the record head ``h`` of frame ``lsn`` into the index (a head too short for
        its kind: CorruptionError). Each head is unpacked into the names of its typed
        definition (``fields``: the same length check as ``of``, no tuple per frame)."""
        kind = h[0]
        if kind == K_JOURNAL and self.shadow is None:
            # the hot record of a running agent: first
            _k, run_id, _rec = JournalHead.fields(h, lsn)
            self.ix.add_journal(run_id, lsn)
            return
        if self.shadow is None and kind in _PLAIN:
            ix = self.ix
        else:
            ix = self._target(lsn, kind, h)
            if ix is None:
                return
        if kind == K_CKPT or kind == K_COPY_CKPT:
            # a delta head (element 4 an int, its base: FORMAT.md 5) holds the ids at the
            # same places as a full one: replay never decompresses it
            if len(h) > 4 and type(h[4]) is int:
                _k, thread, ns, cid, _b, _z = CkptDeltaHead.fields(h, lsn)
            else:
                _k, thread, ns, cid, _p, _c, _m, _v, _ch = CkptHead.fields(h, lsn)
            ix.add_checkpoint(thread, ns, cid, lsn)
        elif kind == K_WRITES or kind == K_COPY_WRITES:
            _k, thread, ns, cid, _t, _tp, _r, _w = WritesHead.fields(h, lsn)
            ix.add_write(thread, ns, cid, lsn)
        elif kind == K_JOURNAL:
            _k, run_id, _rec = JournalHead.fields(h, lsn)
            ix.add_journal(run_id, lsn)
        elif kind == K_COPY_JOURNAL:    # of one run, or of several (FORMAT.md 5a)
            runs = copy_runs(JournalHead.fields(h, lsn)[1], lsn)
            for r in runs if type(runs) is list else (runs,):
                ix.add_journal(r, lsn)
        elif kind == K_DEL_THREAD:
            ix.delete_thread(DelThreadHead.of(h, lsn).thread)
        elif kind == K_COPY_THREAD:
            c = CopyThreadHead.of(h, lsn)
            ix.copy_thread(c.src, c.dst)
        elif kind == K_REMOVE:
            for t, n, cids in RemoveHead.of(h, lsn).doomed:
                ix.remove(t, n, cids)
        elif kind == K_DEL_JOURNAL:
            for r in DelJournalHead.of(h, lsn).run_ids:
                ix.journals.pop(r, None)
        elif kind == K_REPAIR:          # one record of each run it names (FORMAT.md 6a)
            for r in RepairHead.of(h, lsn).run_ids:
                ix.add_journal(r, lsn)
        # K_INDEX (a snapshot of what was replayed so far) changes nothing, and unknown
        # kinds are skipped: a newer writer's record this reader does not know

    def _target(self, lsn: int, kind: int, h: list) -> Index | None:
        """The index a record of ``kind`` goes to, after what it does to a compaction being
        replayed: copies go to the shadow (none: an abandoned compaction's, dead); BEGIN
        starts a shadow, END switches to it; any other record abandons it."""
        if kind in _COPIES:
            return self.shadow
        if kind == K_COMPACT_END:
            if (self.shadow is not None
                    and CompactEndHead.of(h, lsn).begin_lsn == self.shadow_begin):
                self.ix = self.shadow
                self.compacted_at = self.shadow_begin
            self.shadow = None
            return None
        self.end_shadow()
        if kind == K_COMPACT_BEGIN:
            self.shadow = Index()
            self.shadow_begin = lsn
            return None
        return self.ix

    def end_shadow(self) -> None:
        """A compaction being replayed meets another record, or a writer opens the store
        with its END missing: cut short by a crash, its copies are dead -- unless the log
        begins with it. Its old records are gone then, which happens only once its END was
        durable: a repair cut the END (and the copies after the damage), and the copies
        left are the store (dropping them lost every run and thread they held; the
        repair names the ones it cut)."""
        if self.shadow is not None and self.shadow_begin <= self._b.start_lsn:
            self.ix = self.shadow
            self.compacted_at = self.shadow_begin
        self.shadow = None

    def replay_compaction(self, begin: int) -> None:
        """Switch to the copies of the compaction that began at ``begin`` (the same replay
        a reopen does, of BEGIN .. END). On failure the index is left as it was."""
        old_ix, old_pos = self.ix, self.scan_pos
        self.shadow = None
        self.scan_pos = begin
        try:
            self.replay()       # BEGIN .. END: ends with self.ix = the copies' index
        except BaseException:
            # the old frames are still there (nothing was removed): keep serving them
            self.ix, self.shadow, self.scan_pos = old_ix, None, old_pos
            raise

    # -- snapshots ---------------------------------------------------------------------------

    def restore(self) -> None:
        """Start from the newest K_INDEX snapshot that decodes and checks: read the frames
        backwards from the tail (only the kind of each head) down to ``start_lsn``. With
        none, the replay starts at ``start_lsn`` (a full replay)."""
        b = self._b
        lo = b.start_lsn
        for lsn in range(b.next_lsn - 1, lo - 1, -1):
            try:
                p = b.read(lsn)
                if not _is_index_frame(p):
                    continue
                h = IndexHead.of(read_head(p, lsn), lsn)
                if (h.kind != K_INDEX or h.version not in INDEX_VERSIONS or h.lsn != lsn
                        or type(h.compacted_at) is not int
                        or not -1 <= h.compacted_at < lsn):
                    raise ValueError("bad K_INDEX header")
                ix = load_index(h.state, lo, lsn)
                load_journals(ix, h.journals, lo, lsn)
            except Exception:
                continue       # unreadable or not a valid snapshot: look further back
            self.ix = ix
            self.compacted_at = h.compacted_at
            self.shadow = None
            self.scan_pos = lsn + 1
            self.index_lsn = lsn
            return

    def maybe_snapshot(self, lsn: int) -> None:
        """After the index took in frame ``lsn``: snapshot it every ``index_every`` frames."""
        if self.index_every and lsn - self.index_lsn >= self.index_every:
            self.write_snapshot()

    def stale(self) -> bool:
        """Frames were committed since the newest snapshot (close writes one then)."""
        return bool(self.index_every) and self._b.next_lsn - 1 > self.index_lsn

    def write_snapshot(self) -> None:
        """Append a K_INDEX snapshot of the index (under the lock; writer only). Never
        raises: a snapshot is only a shortcut, and the commit that triggered it is done
        (a failing backend reports itself on the next call)."""
        if self.shadow is not None:
            return
        try:
            ap = self._appender
            lsn = ap.next_lsn()
            payload = encode_record(IndexHead(K_INDEX, INDEX_VERSION, lsn, self.compacted_at,
                                              dump_index(self.ix),
                                              dump_journals(self.ix)).pack())
            if len(payload) > ap.max_commit_bytes:
                self.index_lsn = lsn       # too big to keep: try again index_every frames later
                return
            # under the store's policy, but never waited for: losing it only costs open time
            self.index_lsn = ap.write(payload)
        except Exception:
            pass
