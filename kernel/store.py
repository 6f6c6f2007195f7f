"""The checkpoint store: threads, checkpoints, delta-encoded channels, pending writes.

Every change is ONE log frame (a COMMIT payload, docs/FORMAT.md section 5)
whose head is a msgpack list starting with a record kind; deletes, copies and
prunes are small records too, so a reopen replays them. The index
(:mod:`durkv.index`) is rebuilt at open from the frame heads only: from the
newest ``K_INDEX`` snapshot on, when the log has one (``index_every``).

>>> import durkv
>>> with durkv.open("memory://") as store:
...     store.put("t", "", "1", checkpoint={}, metadata={}, values={"msgs": ["hi"]},
...               versions={"msgs": 1})
...     store.put("t", "", "2", checkpoint={}, metadata={}, values={"msgs": ["hi", "yo"]},
...               versions={"msgs": 2}, parent_id="1")
...     [c.values["msgs"] for c in store.history("t")]
[['hi', 'yo'], ['hi']]

See :mod:`durkv.delta` for how channels are delta-encoded and what ``get``
returns, :mod:`durkv.records` for the frame heads, :mod:`durkv.compact`.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Sequence

import msgpack
import xxhash

from .channels import F_ZSTD, FULL, Codec, encode_commit
from .ckpthead import CkptHeads
from .delta import ChannelState, _Chan, _Head
from .durability import STRENGTH
from .errors import (
    ConfigError, CorruptionError, FrameTooLargeError, ReadOnlyError, RunConflictError,
    SerializationError,
)
from .index import Index, dump_index, dump_journals, load_index, load_journals
from .reads import Reads
from .records import (  # noqa: F401 - re-exported: the store's public types and record kinds
    DURABILITIES, INDEX_VERSION, INDEX_VERSIONS, K_CKPT, K_COMPACT_BEGIN, K_COMPACT_END,
    K_COPY_CKPT, K_COPY_JOURNAL, K_COPY_THREAD, K_COPY_WRITES, K_DEL_JOURNAL, K_DEL_THREAD, K_INDEX,
    K_JOURNAL, K_REMOVE, K_WRITES,
    SPECIAL_WRITE_CHANNELS, ChannelEntry, Checkpoint, PendingWrite, check_id, check_ids,
)
from .records import (
    CkptHead, CompactEndHead, CopyThreadHead, DelJournalHead, DelThreadHead, IndexHead,
    JournalHead, RemoveHead, WritesHead, ckpt_view, heads_of, pack_head, read_head,
)
from .serde import Serde, default_serde

__all__ = ["Store", "Checkpoint", "PendingWrite", "ChannelEntry", "open_store"]

# the names the store's tests have always used for the head decoder and encoder
_head_of = read_head
_packb = pack_head

_VERSION_TYPES = frozenset((str, int, float))   # what the frame head (msgpack) holds


def _check_channels(values: dict, versions: dict) -> None:
    """Refuse what the frame head cannot hold or readers cannot list: channel names
    that are not strings, versions that are not a str, an int of at most 64 bits or a
    float (a bad one used to commit, and then ``durkv ls`` failed for the whole store)."""
    for ch, v in versions.items():
        if type(ch) is not str or type(v) not in _VERSION_TYPES or (
                type(v) is int and not -(1 << 63) <= v < (1 << 64)):
            if not isinstance(ch, str):
                raise ConfigError(f"channel names must be strings, got {type(ch).__name__} "
                                  f"{ch!r} in versions")
            if (not isinstance(v, (str, int, float)) or isinstance(v, bool)
                    or (isinstance(v, int) and not -(1 << 63) <= v < (1 << 64))):
                raise ConfigError(f"the version of channel {ch!r} must be a str, an int of "
                                  f"at most 64 bits or a float, got {type(v).__name__} {v!r}")
    for ch in values:
        if not isinstance(ch, str):
            raise ConfigError(f"channel names must be strings, got {type(ch).__name__} {ch!r} "
                              "in values")


class Store(ChannelState, Reads):
    """A checkpoint store over one backend. Create with :func:`durkv.open`."""

    def __init__(self, backend: Any, *, url: str, durability: str = "sync",
                 read_only: bool = False, serde: Serde | None = None, snapshot_every: int = 64,
                 compress_min_bytes: int = 1024, max_commit_bytes: int = 256 << 20,
                 delta_check: str = "prefix", index_every: int = 50_000) -> None:
        self._b = backend
        self.url = url
        self.durability = durability
        self.read_only = read_only = bool(read_only or backend.read_only)
        self.serde = serde if serde is not None else default_serde
        self._dumps = self.serde.dumps
        self._loads = self.serde.loads
        # optional batch form (LangGraphSerde has one): many list items in one call
        self._loads_many = getattr(self.serde, "loads_many", None)
        self.snapshot_every = snapshot_every
        self.delta_check = delta_check
        self._prefix_check = delta_check == "prefix"
        self.max_commit_bytes = max_commit_bytes
        self._codec = Codec(compress_min_bytes)
        self._minb = compress_min_bytes
        self._compress = self._codec._c.compress
        self._hpack = msgpack.Packer(use_bin_type=True)    # frame heads, under self._lock
        self._lock = threading.RLock()
        self._next_lsn = -1       # LSN of the next append when known (saves a call per put)
        self._wfp: dict[int, tuple[int, int]] = {}   # xxh3 of recent write frames -> lsn, rank
        # list values of recent pending writes, by (thread, ns, checkpoint): {channel:
        # [((lsn, entry idx), serialized items)]}, for the next checkpoint to refer to
        self._wpend: dict[tuple[str, str, str], dict[str, list]] = {}
        # the reverse, for a pending write that arrives after the checkpoint that folded
        # it in: (thread, ns, parent checkpoint) -> {channel: ((lsn, idx), serialized items)}
        self._cpend: dict[tuple[str, str, str], dict[str, tuple]] = {}
        self._closed = False
        self._index_every = index_every   # frames between K_INDEX snapshots (0: never write one)
        self._load_index()
        if not read_only:
            self._shadow = None     # a compaction cut short by a crash: its copies are dead
            if self._compacted_at > backend.start_lsn:
                # a compaction finished (END is durable) but its old frames were not removed
                backend.remove_prefix(self._compacted_at)

    def _load_index(self) -> None:
        """Build the index from the log: the newest snapshot, then the frames after it."""
        self._ix = Index()
        self._shadow: Index | None = None    # compaction being replayed (BEGIN seen, no END yet)
        self._shadow_begin = -1
        self._compacted_at = -1
        self._scan_pos = self._b.start_lsn
        self._index_lsn = self._b.start_lsn - 1   # LSN of the newest K_INDEX known
        self._ckh = CkptHeads()   # checkpoint heads: keyframes, delta bases (FORMAT.md 5)
        self._restore_index()
        self._replay()

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else self.durability
        return f"<durkv.Store {self.url} {mode}{' closed' if self._closed else ''}>"

    def flush(self) -> None:
        """Make every commit so far durable, under any policy."""
        with self._lock:
            self._check_open()
            self._b.flush()

    def close(self) -> None:
        """Flush and release the backend. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if (not self.read_only and self._index_every
                        and self._b.next_lsn - 1 > self._index_lsn):
                    self._write_index()
            except Exception:
                pass    # a snapshot is only a shortcut; the log is intact without it
            finally:
                self._b.close()

    def verify(self, deep: bool = False) -> Any:
        """Check the stored bytes (local: the log's verify report)."""
        return self._b.verify(deep)

    def refresh(self) -> None:
        """See frames a concurrent writer committed since open (read-only handles; a
        writer's index is always current, so this is a no-op for it)."""
        with self._lock:
            self._check_open()
            if self.read_only:
                if self._b.refresh():
                    self._load_index()      # the log was repaired under us: remap from scratch
                else:
                    self._replay()

    def size_bytes(self) -> int:
        return self._b.size_bytes()

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError(f"store {self.url} is closed; open it again with durkv.open()")

    def _check_write(self) -> None:
        self._check_open()
        if self.read_only:
            raise ReadOnlyError(f"store {self.url} is open read-only; "
                                "open it without read_only=True to write")

    def _durability(self, durability: str | None) -> str | None:
        if durability is not None and durability not in DURABILITIES:
            raise ConfigError(f"unknown durability {durability!r}; use one of "
                              + ", ".join(DURABILITIES))
        return durability

    # -- replay ------------------------------------------------------------------------------

    def _replay(self) -> None:
        """Apply the heads of frames from the scan position on (open, refresh)."""
        pos = self._scan_pos
        for lsn, payload in self._b.scan(pos):
            try:
                h = read_head(payload, lsn)
                kind = h[0]
            except CorruptionError as e:
                if len(payload) > 5 and 0x91 <= payload[4] <= 0x9f and payload[5] == K_INDEX:
                    pos = lsn + 1     # a snapshot that does not decode: only a lost shortcut
                    continue
                raise CorruptionError(f"store {self.url}: {e}", kind="bad_record",
                                      lsn=lsn) from e
            if type(kind) is int:
                try:
                    self._apply(lsn, h)
                except CorruptionError as e:
                    raise CorruptionError(f"store {self.url}: {e}", kind="bad_record",
                                          lsn=lsn) from e
            pos = lsn + 1
        self._scan_pos = pos

    def _restore_index(self) -> None:
        """Start from the newest K_INDEX snapshot that decodes and checks: read the frames
        backwards from the tail (only the kind of each head) down to ``start_lsn``. With
        none, the replay starts at ``start_lsn`` (a full replay)."""
        b = self._b
        lo = b.start_lsn
        lsn = b.next_lsn - 1
        while lsn >= lo:
            try:
                p = b.read(lsn)
                # the head's msgpack list header, then its first element (the kind)
                if len(p) > 5 and 0x91 <= p[4] <= 0x9f and p[5] == K_INDEX:
                    h = IndexHead.of(read_head(p, lsn), lsn)
                    if (h.kind != K_INDEX or h.version not in INDEX_VERSIONS or h.lsn != lsn
                            or type(h.compacted_at) is not int
                            or not -1 <= h.compacted_at < lsn):
                        raise ValueError("bad K_INDEX header")
                    ix = load_index(h.state, lo, lsn)
                    load_journals(ix, h.journals, lo, lsn)
                else:
                    lsn -= 1
                    continue
            except Exception:
                lsn -= 1       # unreadable or not a valid snapshot: look further back
                continue
            self._ix = ix
            self._compacted_at = h.compacted_at
            self._shadow = None
            self._scan_pos = lsn + 1
            self._index_lsn = lsn
            return

    def _write_index(self) -> None:
        """Append a K_INDEX snapshot of the index (under the lock; writer only). Never
        raises: a snapshot is only a shortcut, and the commit that triggered it is done
        (a failing backend reports itself on the next call)."""
        if self._shadow is not None:
            return
        try:
            lsn = self._next_lsn if self._next_lsn >= 0 else self._b.next_lsn
            payload = encode_commit(IndexHead(K_INDEX, INDEX_VERSION, lsn, self._compacted_at,
                                              dump_index(self._ix),
                                              dump_journals(self._ix)).pack(), ())
            if len(payload) > self.max_commit_bytes:
                self._index_lsn = lsn      # too big to keep: try again index_every frames later
                return
            # under the store's policy, but never waited for: losing it only costs open time
            self._index_lsn = self._append(payload, self.durability)
        except Exception:
            pass

    def _maybe_index(self, lsn: int) -> None:
        """After the index took in frame ``lsn``: snapshot it every ``index_every`` frames."""
        if self._index_every and lsn - self._index_lsn >= self._index_every:
            self._write_index()

    def _apply(self, lsn: int, h: list) -> None:
        """Take the record head ``h`` of frame ``lsn`` into the index (a head too short for
        its kind: CorruptionError). The typed view is built only for the fields used."""
        kind = h[0]
        if kind == K_JOURNAL:    # the hot record of a running agent: first, and no shadow
            if self._shadow is None:
                self._ix.add_journal(JournalHead.of(h, lsn).run_id, lsn)
                return
        if kind in (K_COPY_CKPT, K_COPY_WRITES, K_COPY_JOURNAL):
            ix = self._shadow
            if ix is None:
                return     # copies of an abandoned compaction: dead
        else:
            if kind == K_COMPACT_END:
                if (self._shadow is not None
                        and CompactEndHead.of(h, lsn).begin_lsn == self._shadow_begin):
                    self._ix = self._shadow
                    self._compacted_at = self._shadow_begin
                self._shadow = None
                return
            self._shadow = None   # anything else after BEGIN: that compaction was abandoned
            if kind == K_COMPACT_BEGIN:
                self._shadow = Index()
                self._shadow_begin = lsn
                return
            ix = self._ix
        if kind == K_CKPT or kind == K_COPY_CKPT:
            c = ckpt_view(h, lsn)     # full or delta head: ids at the same places
            ix.add_checkpoint(c.thread, c.ns, c.cid, lsn)
        elif kind == K_WRITES or kind == K_COPY_WRITES:
            w = WritesHead.of(h, lsn)
            ix.add_write(w.thread, w.ns, w.cid, lsn)
        elif kind == K_DEL_THREAD:
            ix.delete_thread(DelThreadHead.of(h, lsn).thread)
        elif kind == K_COPY_THREAD:
            c = CopyThreadHead.of(h, lsn)
            ix.copy_thread(c.src, c.dst)
        elif kind == K_REMOVE:
            for t, n, cids in RemoveHead.of(h, lsn).doomed:
                ix.remove(t, n, cids)
        elif kind == K_JOURNAL or kind == K_COPY_JOURNAL:
            ix.add_journal(JournalHead.of(h, lsn).run_id, lsn)
        elif kind == K_DEL_JOURNAL:
            for r in DelJournalHead.of(h, lsn).run_ids:
                ix.journals.pop(r, None)
        # K_INDEX (a snapshot of what was replayed so far) changes nothing, and unknown
        # kinds are skipped: a newer writer's record this reader does not know

    # -- put ---------------------------------------------------------------------------------

    def put(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, *, checkpoint: dict,
            metadata: dict, values: dict[str, Any], versions: dict[str, Any],
            parent_id: str | None = None, durability: str | None = None,
            all_values: dict[str, Any] | None = None) -> None:
        """Commit one checkpoint as one frame.

        Args:
            checkpoint: opaque record (LangGraph: its checkpoint dict minus channel_values).
            metadata: metadata dict (``history(filter=...)`` matches on it).
            values: new values of the channels whose version changed.
            versions: ALL channel versions of this checkpoint. A channel in ``versions``
                but not in ``values`` keeps its entry of the base -- the parent (or
                newest) checkpoint -- when ``all_values`` is None; a channel absent from
                both has no value.
            parent_id: the checkpoint this one follows (None: the newest of the thread+ns).
            durability: override the store's policy for this commit.
            all_values: every value of the checkpoint (LangGraph: ``channel_values``).
                Given, a channel in ``versions`` but not in ``values`` keeps the base's
                entry only when the base holds it at the same version (a version names
                one value, as LangGraph's savers key blobs by it); otherwise it is
                stored from ``all_values`` (or has no value if absent there). A copy or
                fork -- saved whole with nothing in ``values`` -- then reads back its
                own values, never its base's; a linear put still costs only its change.

        Raises:
            ConfigError: missing/empty ids. SerializationError: a value the serde
                cannot encode (nothing is committed). FrameTooLargeError: the commit
                exceeds ``max_commit_bytes``.
        """
        if type(thread_id) is not str or not thread_id:
            check_id("thread_id", thread_id)
        if type(checkpoint_ns) is not str:
            check_id("checkpoint_ns", checkpoint_ns, allow_empty=True)
        if type(checkpoint_id) is not str or not checkpoint_id:
            check_id("checkpoint_id", checkpoint_id)
        if parent_id is not None and type(parent_id) is not str:
            raise ConfigError(f"parent_id must be a string or None, got {parent_id!r}")
        if durability is not None:
            self._durability(durability)
        if type(values) is not dict or type(versions) is not dict:
            if not isinstance(values, dict) or not isinstance(versions, dict):
                raise ConfigError("values and versions must be dicts keyed by channel name, got "
                                  f"{type(values).__name__} and {type(versions).__name__}")
        _check_channels(values, versions)
        if all_values is not None and not isinstance(all_values, dict):
            raise ConfigError(f"all_values must be a dict or None, got "
                              f"{type(all_values).__name__}")
        dumps = self._dumps
        try:
            ckpt_b = dumps(checkpoint)
            meta_b = dumps(metadata)
        except Exception as e:
            raise SerializationError(f"cannot serialize the checkpoint record or metadata of "
                                     f"{checkpoint_id!r}: {e}", thread_id=thread_id) from e
        with self._lock:
            if self._closed or self.read_only:
                self._check_write()
            lane = self._ix.lane(thread_id, checkpoint_ns)
            head = None if lane is None else lane.head
            if head is None and lane is not None and lane.ids:
                head = self._load_head(lane)
            lsn = self._next_lsn
            if lsn < 0:
                lsn = self._b.next_lsn
            fast = head is not None and checkpoint_id > head.cid and (
                parent_id is None or parent_id == head.cid)
            if fast:
                base, base_versions = head.chans, head.versions
            elif head is None:
                base, base_versions = {}, {}
            else:
                base, base_versions = self._parent_chans(lane, head, parent_id)
            entries: list = []
            chans: dict[str, _Chan] = {}
            refs: dict[str, tuple[int, int]] = {}
            encode = self._encode
            # list items the parent's pending writes stored (FORMAT.md section 5)
            pend = self._wpend.pop((thread_id, checkpoint_ns, head.cid), None) if fast else None
            for ch, v in values.items():
                c = encode(ch, v, base.get(ch) if fast else None, lsn, entries,
                           pend.get(ch) if pend else None)
                chans[ch] = c
                refs[ch] = c.ref
            for ch in versions:
                if ch not in chans:
                    c = base.get(ch)
                    if c is not None and (all_values is None
                                          or base_versions.get(ch, c) == versions[ch]):
                        chans[ch] = c
                        refs[ch] = c.ref
                    elif all_values is not None and ch in all_values:
                        # the base holds another version: this checkpoint's own value
                        c = encode(ch, all_values[ch], c if fast else None, lsn, entries)
                        chans[ch] = c
                        refs[ch] = c.ref
            try:
                hb = self._ckh.pack(CkptHead(K_CKPT, thread_id, checkpoint_ns, checkpoint_id,
                                             parent_id, ckpt_b, meta_b, versions, refs))
            except Exception as e:
                # the types were checked: what is left is text msgpack cannot encode
                for name, x in (("thread_id", thread_id), ("checkpoint_ns", checkpoint_ns),
                                ("checkpoint_id", checkpoint_id), ("parent_id", parent_id),
                                *(("channel", ch) for ch in versions)):
                    if x is not None:
                        check_id(name, x, allow_empty=True)
                raise SerializationError(f"cannot serialize the head of {checkpoint_id!r}: {e}",
                                         thread_id=thread_id) from e
            payload = encode_commit(hb, entries)
            if len(payload) > self.max_commit_bytes:
                raise FrameTooLargeError(
                    f"checkpoint {checkpoint_id!r} of thread {thread_id!r} is {len(payload)} "
                    f"bytes, over max_commit_bytes={self.max_commit_bytes}; store big values "
                    "elsewhere or raise max_commit_bytes", thread_id=thread_id,
                    size=len(payload))
            self._next_lsn = -1
            wait = (durability or self.durability) == "sync"
            got = self._b.append(payload, "async" if wait else durability)
            if got != lsn:
                raise ConfigError(f"store {self.url}: frame landed at LSN {got}, expected {lsn}; "
                                  "is another writer appending to this log?")
            self._next_lsn = got + 1
            self._ckh.written(got)     # a full head becomes the lane's keyframe
            if lane is None:
                lane = self._ix.lane(thread_id, checkpoint_ns, True)
            ids = lane.ids
            if ids and checkpoint_id > ids[-1]:
                ids.append(checkpoint_id)
                lane.lsns.append(lsn)
                if lane.orphans:
                    lane.add_orphans(checkpoint_id, lsn)
            else:
                lane.add(checkpoint_id, lsn)
            if fast and parent_id is not None:
                # a pending write of the parent that arrives after this commit (LangGraph's
                # async executor may run it later) refers to these items, FORMAT.md s. 5
                fresh = None
                for ch in values:
                    c = chans[ch]
                    if c.fresh is not None:
                        if fresh is None:
                            fresh = {}
                        fresh[ch] = c.fresh
                        c.fresh = None
                if fresh is not None:
                    if len(self._cpend) >= 4096:
                        self._cpend.clear()
                    self._cpend[(thread_id, checkpoint_ns, parent_id)] = fresh
            if fast or head is None or checkpoint_id > head.cid:
                lane.head = _Head(checkpoint_id, lsn, parent_id, ckpt_b, meta_b, dict(versions),
                                  chans)
            elif checkpoint_id == head.cid:
                lane.head = None   # the newest was replaced: reload on demand
            if self._index_every and got - self._index_lsn >= self._index_every:
                self._write_index()
        if wait:
            # outside the lock, so that concurrent committers share one fsync (group commit)
            self._b.wait_durable(got)

    # -- pending writes ----------------------------------------------------------------------

    def put_writes(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str,
                   writes: Sequence[tuple[int, str, Any]], *, task_path: str = "",
                   durability: str | None = None) -> None:
        """Store pending writes ``(idx, channel, value)`` of a task against a checkpoint.

        Idempotent on (thread, ns, checkpoint, task, idx), as LangGraph's savers: a
        later write to an existing key is ignored, unless every write of the call
        is to a special channel (``__error__``, ``__interrupt__``, ...), which
        overwrite. Default durability: written to the OS (``async``) -- they ride
        on the next commit's fsync and survive a process kill -- or buffered under
        the ``exit`` policy.
        """
        check_id("thread_id", thread_id)
        check_id("checkpoint_ns", checkpoint_ns, allow_empty=True)
        check_id("checkpoint_id", checkpoint_id)
        check_id("task_id", task_id)
        dur = self._durability(durability)
        if dur is None:
            dur = "exit" if self.durability == "exit" else "async"
        check_id("task_path", task_path, allow_empty=True)
        if isinstance(writes, (str, bytes, dict)) or not hasattr(writes, "__iter__"):
            raise ConfigError(f"writes must be a list of (idx, channel, value), got "
                              f"{type(writes).__name__}")
        if not writes:
            return
        recs = []
        lists = []      # (rec, channel, stored items, serialized items, flags) of list values
        replace = True
        pack = self._codec.pack
        dumps = self._dumps
        for w in writes:
            if not (type(w) is tuple and len(w) == 3 and type(w[0]) is int
                    and -(1 << 63) <= w[0] < (1 << 63) and type(w[1]) is str
                    and w[1].isascii() and w[1]):
                _check_write(w)
            idx, ch, v = w
            try:
                if type(v) is list:
                    # element by element: the items a channel delta of the next checkpoint
                    # can refer to instead of storing them again (FORMAT.md section 5)
                    raws = [dumps(x) for x in v]
                    rec = [idx, ch, 0]
                    items = []
                    zc = 0
                    for r in raws:
                        b, z = pack(r)
                        items.append(b)
                        zc += z
                    lists.append((rec, ch, items, raws, F_ZSTD if zc and zc == len(raws) else 0))
                else:
                    rec = [idx, ch, pack(dumps(v))[0]]
            except Exception as e:
                raise SerializationError(f"cannot serialize pending write to channel {ch!r} "
                                         f"of task {task_id!r}: {e}", channel=ch) from e
            recs.append(rec)
            if ch not in SPECIAL_WRITE_CHANNELS:
                replace = False
        rank = STRENGTH[dur]
        with self._lock:
            self._check_write()
            # under the lock: a checkpoint committing concurrently either registered the
            # items it stored (then this write refers to them) or will find this write's
            entries = []
            if lists:
                late = self._cpend.get((thread_id, checkpoint_ns, checkpoint_id))
                kept = []
                for x in lists:
                    rec, ch, items, raws, flags = x
                    got = late.get(ch) if late else None
                    if got is not None and got[1] == raws:
                        rec[2] = list(got[0])   # stored by the checkpoint already: refer to it
                        continue
                    rec[2] = len(entries)       # the value is the items of this entry
                    entries.append((FULL, items, flags, 0, 0, 0))
                    kept.append(x)
                lists = kept
            hb = WritesHead(K_WRITES, thread_id, checkpoint_ns, checkpoint_id, task_id,
                            task_path, replace, recs).pack()
            payload = encode_commit(hb, entries)
            if len(payload) > self.max_commit_bytes:
                raise FrameTooLargeError(f"pending writes of task {task_id!r} are "
                                         f"{len(payload)} bytes, over max_commit_bytes="
                                         f"{self.max_commit_bytes}", thread_id=thread_id,
                                         size=len(payload))
            # a retried identical call (LangGraph re-puts writes on resume) is a no-op in
            # ignore mode: skip the frame when an identical one was appended at least as
            # durably
            fp = None if replace else xxhash.xxh3_64_intdigest(payload)
            seen = self._wfp.get(fp) if fp is not None else None
            if seen is not None and seen[1] >= rank:
                lsn = seen[0]
            else:
                lsn = self._append(payload, dur)
                self._ix.add_write(thread_id, checkpoint_ns, checkpoint_id, lsn)
                if lists:
                    # the next checkpoint refers to these items instead of storing them again
                    wpend = self._wpend
                    if len(wpend) >= 4096:
                        wpend.clear()
                    pend = wpend.setdefault((thread_id, checkpoint_ns, checkpoint_id), {})
                    for rec, ch, _items, raws, _flags in lists:
                        pend.setdefault(ch, []).append(((lsn, rec[2]), raws))
                self._maybe_index(lsn)
                if fp is not None:
                    if len(self._wfp) >= 4096:
                        self._wfp.clear()
                    self._wfp[fp] = (lsn, rank)
        if dur == "sync":
            self._b.wait_durable(lsn)

    # -- deletes, copies, prunes -------------------------------------------------------------

    def _append(self, payload: bytes, durability: str | None) -> int:
        """Append under ``self._lock``; a ``sync`` append is only written here -- the
        caller waits for durability after releasing the lock (group commit)."""
        self._next_lsn = -1
        lsn = self._b.append(payload, "async" if durability == "sync" else durability)
        self._next_lsn = lsn + 1
        return lsn

    def _commit_record(self, head: tuple) -> int:
        """Append a small record (delete, copy, remove) under the store's policy and wait
        for it to be durable (called under the lock: these are rare)."""
        self._check_write()
        lsn = self._append(encode_commit(pack_head(head), ()), self.durability)
        if self.durability == "sync":
            self._b.wait_durable(lsn)
        return lsn

    def delete_thread(self, thread_id: str) -> None:
        """Remove a thread: every namespace, checkpoint and pending write."""
        check_id("thread_id", thread_id)
        with self._lock:
            self._check_write()
            if thread_id not in self._ix.threads and thread_id not in self._ix.journals:
                return
            lsn = self._commit_record(DelThreadHead(K_DEL_THREAD, thread_id))
            self._ix.delete_thread(thread_id)
            self._wfp.clear()
            self._maybe_index(lsn)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every namespace, checkpoint and pending write of a thread to another
        (merged into the target if it exists). The copy shares the source's frames.

        Raises:
            RunConflictError: both threads have a run journal. Two journals merged in
                log order would make the target replay the source's recorded results
                (and effects) as its own; nothing is written.
        """
        check_id("thread_id", source_thread_id)
        check_id("thread_id", target_thread_id)
        with self._lock:
            self._check_write()
            if source_thread_id == target_thread_id or (
                    source_thread_id not in self._ix.threads
                    and source_thread_id not in self._ix.journals):
                return
            if self._ix.journals.get(source_thread_id) and self._ix.journals.get(target_thread_id):
                raise RunConflictError(
                    f"copy_thread({source_thread_id!r}, {target_thread_id!r}): both are runs "
                    "with a journal, and merged journals would replay one run's results in "
                    f"the other; copy to a new id, or delete_thread({target_thread_id!r}) "
                    "first", run_id=target_thread_id)
            lsn = self._commit_record(
                CopyThreadHead(K_COPY_THREAD, source_thread_id, target_thread_id))
            self._ix.copy_thread(source_thread_id, target_thread_id)
            self._maybe_index(lsn)

    def _remove(self, doomed: list) -> None:
        if not doomed:
            return
        lsn = self._commit_record(RemoveHead(K_REMOVE, doomed))
        self._wfp.clear()
        for t, n, cids in doomed:
            self._ix.remove(t, n, cids)
        self._maybe_index(lsn)

    def delete_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints (and their writes) whose ``metadata["run_id"]`` is in
        ``run_ids``. Reads every checkpoint's metadata: O(checkpoints). A bare string
        is one run id (``delete_runs("run-1")``), never a set of characters."""
        runs = set(check_ids("run_ids", run_ids))    # a bare string is one run id
        if not runs:
            return
        with self._lock:
            self._check_write()
            doomed = []
            for t, n, lane in list(self._ix.lanes()):
                cids = []
                for cid, lsn in zip(lane.ids, lane.lsns):
                    meta = self._loads(self._ckh.load(self._b.read, lsn).meta_b)
                    if isinstance(meta, dict) and meta.get("run_id") in runs:
                        cids.append(cid)
                if cids:
                    doomed.append([t, n, cids])
            self._remove(doomed)
            gone = sorted(r for r in runs if r in self._ix.journals)
            if gone:     # the runs' journals go too (a run id is also a journal's key)
                lsn = self._commit_record(DelJournalHead(K_DEL_JOURNAL, gone))
                for r in gone:
                    del self._ix.journals[r]
                self._maybe_index(lsn)

    def prune(self, thread_ids: Sequence[str], *, keep_last: int = 1) -> None:
        """Per (thread, ns) of the given threads keep only the newest ``keep_last``
        checkpoints (0: remove all). Kept checkpoints still read correctly: their
        delta chains stay in the log until :meth:`compact` copies what they need."""
        thread_ids = check_ids("thread_ids", thread_ids)    # a bare string is one id
        if not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 0:
            raise ConfigError(f"keep_last must be an int >= 0, got {keep_last!r}")
        with self._lock:
            self._check_write()
            doomed = []
            for t in thread_ids:
                for _t, n, lane in list(self._ix.lanes(t)):
                    cut = len(lane.ids) - keep_last
                    if cut > 0:
                        doomed.append([t, n, lane.ids[:cut]])
            self._remove(doomed)

    # -- run journals (the records of durkv.runtime; docs/FORMAT.md section 5a) -------------

    def append_journal(self, run_id: str, record: dict, *, durable: bool = False) -> int:
        """Append one journal record of ``run_id``; return its LSN.

        ``record`` is a msgpack-able dict (user values already serde bytes). With
        ``durable=True`` it is fdatasync'd before this returns whatever the store's
        policy (concurrent callers share one fsync); otherwise the store's policy applies.
        """
        if type(run_id) is not str or not run_id:
            check_id("run_id", run_id)
        wait = durable or self.durability == "sync"
        with self._lock:
            if self._closed or self.read_only:
                self._check_write()
            try:
                hb = self._hpack.pack(JournalHead(K_JOURNAL, run_id, record))
            except Exception as e:
                raise SerializationError(f"cannot encode a journal record of run {run_id!r}: "
                                         f"{e}", run_id=run_id) from e
            # a COMMIT payload with no entries: head_len head n_entries=0 (FORMAT.md 5)
            payload = b"".join((len(hb).to_bytes(4, "little"), hb, b"\0\0\0\0"))
            if len(payload) > self.max_commit_bytes:
                raise FrameTooLargeError(
                    f"a journal record of run {run_id!r} is {len(payload)} bytes, over "
                    f"max_commit_bytes={self.max_commit_bytes}; keep big values elsewhere and "
                    "journal a reference, or raise max_commit_bytes", run_id=run_id,
                    size=len(payload))
            self._next_lsn = -1      # as _append(), inline: this is a running agent's hot path
            # A record to be waited for is only queued here ("exit": no write, no wait):
            # the wait below, outside the lock, writes and fdatasyncs it with whatever
            # other threads queued meanwhile -- one write and one fsync per group. ("async"
            # waited here for its own write, behind a running fsync and under this lock,
            # so concurrent durable records each got a write and an fsync of their own.)
            lsn = self._b.append(payload, "exit" if wait else self.durability)
            self._next_lsn = lsn + 1
            self._ix.add_journal(run_id, lsn)
            if self._index_every and lsn - self._index_lsn >= self._index_every:
                self._write_index()
        if wait:
            self._b.wait_durable(lsn)      # outside the lock: group commit
        return lsn

    def journal(self, run_id: str) -> list[dict]:
        """The journal records of ``run_id`` in log order (read by LSN, no scan)."""
        with self._lock:
            self._check_open()
            lsns = self._ix.journals.get(run_id)
            if not lsns:
                return []
            # one read of every record's head and one decode (not one binding call each)
            return [JournalHead.of(h, lsn).rec
                    for h, lsn in zip(heads_of(self._b.read_heads(lsns)), lsns)]

    def journal_length(self, run_id: str) -> int:
        """How many journal records ``run_id`` has (O(1): a reader's staleness check)."""
        lsns = self._ix.journals.get(run_id)
        return len(lsns) if lsns is not None else 0

    def journal_runs(self) -> list[str]:
        """Ids of the runs that have a journal, sorted."""
        with self._lock:
            self._check_open()
            return sorted(self._ix.journals)

    def compact(self) -> dict:
        """Copy live data to the tail and drop everything older (crash-safe).

        Returns ``{"bytes_before", "bytes_after", "checkpoints_kept"}``.
        """
        from .compact import compact

        with self._lock:
            self._check_write()
            self._next_lsn = -1
            self._wfp.clear()
            self._wpend.clear()     # their LSNs are about to move
            self._cpend.clear()
            self._ckh.forget()      # so are the keyframes
            return compact(self)

    def archive(self, url: str, *, seal: bool = False, **options: Any) -> Any:
        """Archive this (local) store's sealed segments to ``s3://bucket/prefix``; with
        ``seal``, seal the active segment first so that every commit so far goes too.
        Options and result: :func:`durkv.backends.s3.archive` (needs ``durkv[s3]``)."""
        from durkv.backends.s3 import archive_backend

        with self._lock:
            self._check_open()
        # the lock is held only to seal: commits go on while sealed segments upload
        return archive_backend(self._b, url, seal=seal, lock=self._lock, **options)


def _check_write(w: Any) -> None:
    """The slow path of put_writes' check of one ``(idx, channel, value)``."""
    if not isinstance(w, (tuple, list)) or len(w) != 3:
        raise ConfigError(f"each write must be (idx: int, channel: str, value), got {w!r}")
    idx, ch, _v = w
    if not isinstance(idx, int) or isinstance(idx, bool) or not -(1 << 63) <= idx < (1 << 63):
        raise ConfigError(f"the idx of a write must be an int of at most 64 bits, got {idx!r}")
    check_id("channel", ch)


def _check_url(url: Any) -> str:
    """A store URL as a string; a NUL in it is refused, as ``os`` refuses it in a path
    (the C layer would cut the path there: '/w/d3\\0A' opened /w/d3)."""
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str):
        raise ConfigError(f"store URL must be a string or path, got {type(url).__name__}")
    if "\0" in url:
        raise ConfigError(f"store URL {url!r} contains a NUL character, which no path can "
                          "hold; pass the path without it")
    try:
        url.encode()
    except UnicodeEncodeError:
        raise ConfigError(f"store URL {url!r} is not valid Unicode text") from None
    return url


def open_store(url: str, *, durability: str = "sync", read_only: bool = False,
               serde: Serde | None = None, snapshot_every: int = 64,
               compress_min_bytes: int = 1024, segment_bytes: int | None = None,
               flush_interval_ms: int = 10, recovery: str = "tolerate_tail",
               max_commit_bytes: int = 256 << 20, delta_check: str = "prefix",
               index_every: int = 50_000, takeover: bool = False) -> Store:
    """Open (creating if needed) a store.

    Args:
        url: a path or ``file://path`` (local C log), ``memory://`` (private) or
            ``memory://name`` (shared within the process).
        durability: ``sync`` | ``async`` | ``exit`` (see DESIGN.md).
        read_only: a reader: no lock, no writes; call ``refresh()`` to see new commits.
        serde: an object with ``dumps``/``loads``; default msgpack with extension types.
        snapshot_every: deltas between SNAP entries of a list channel (K).
        compress_min_bytes: zstd-compress serialized items at least this large.
        segment_bytes, flush_interval_ms, recovery: passed to the local log.
        max_commit_bytes: refuse (FrameTooLargeError) a commit larger than this.
        delta_check: how a new list is recognised as the old one plus appended items:
            ``"prefix"`` (the default; exact: the whole committed prefix is compared,
            one memcmp of item pointers, ~0.15 ns per item, and any difference writes a
            FULL entry) or
            ``"identity"`` (O(1): first/middle/last items must be the same objects; only
            for callers whose lists change by appending alone -- a replacement at another
            position plus an append in one step is NOT seen). See :mod:`durkv.delta`.
        index_every: append an index snapshot (``K_INDEX``) every this many frames, and
            at close and after a compaction when anything was committed since the last
            one, so that open replays only the frames after it. 0: write none (open
            still uses the snapshots already in the log).
        takeover: ``s3://`` only: take the store over from a writer that died; that
            writer is fenced (its next commit fails with ``FencedError``).

    >>> import durkv
    >>> store = durkv.open("memory://")
    >>> store.put("t", "", "1", checkpoint={}, metadata={}, values={"x": 1}, versions={"x": 1})
    >>> store.get("t").values
    {'x': 1}
    """
    from durkv.backends import open_backend

    url = _check_url(url)
    if segment_bytes is not None and (type(segment_bytes) is not int
                                      or not 0 < segment_bytes < (1 << 48)):
        raise ConfigError(f"segment_bytes must be a positive int (bytes), got {segment_bytes!r}")
    if type(flush_interval_ms) is not int or not 0 < flush_interval_ms < (1 << 31):
        raise ConfigError(f"flush_interval_ms must be a positive int, got {flush_interval_ms!r}")
    if not isinstance(recovery, str):
        raise ConfigError(f"recovery must be a string such as 'tolerate_tail', got {recovery!r}")
    if not isinstance(durability, str) or durability not in DURABILITIES:
        raise ConfigError(f"unknown durability {durability!r}; use one of "
                          + ", ".join(DURABILITIES))
    if not isinstance(snapshot_every, int) or snapshot_every < 1:
        raise ConfigError(f"snapshot_every must be an int >= 1, got {snapshot_every!r}")
    if not isinstance(compress_min_bytes, int) or compress_min_bytes < 0:
        raise ConfigError(f"compress_min_bytes must be an int >= 0, got {compress_min_bytes!r}")
    if type(index_every) is not int or index_every < 0:
        raise ConfigError(f"index_every must be an int >= 0, got {index_every!r}")
    if delta_check not in ("identity", "prefix"):
        raise ConfigError(f"delta_check must be 'identity' or 'prefix', got {delta_check!r}")
    if not isinstance(max_commit_bytes, int) or not 0 < max_commit_bytes < (1 << 30):
        raise ConfigError("max_commit_bytes must be between 1 and 1 GiB - 1, "
                          f"got {max_commit_bytes!r}")
    if serde is not None and not (callable(getattr(serde, "dumps", None))
                                  and callable(getattr(serde, "loads", None))):
        raise ConfigError("serde must have dumps(obj) -> bytes and loads(bytes) -> obj")
    backend = open_backend(url, durability=durability, read_only=read_only,
                           segment_bytes=segment_bytes, flush_interval_ms=flush_interval_ms,
                           recovery=recovery, takeover=takeover)
    try:
        return Store(backend, url=str(url), durability=durability, read_only=read_only,
                     serde=serde, snapshot_every=snapshot_every,
                     compress_min_bytes=compress_min_bytes, max_commit_bytes=max_commit_bytes,
                     delta_check=delta_check, index_every=index_every)
    except BaseException:
        backend.close()
        raise
