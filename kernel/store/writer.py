"""The write path: checkpoints (``put``), pending writes (``put_writes``), journal records.

A :class:`Writer` holds the :class:`~durkv.store.appender.Appender`, the
:class:`~durkv.store.replay.LogIndex` it keeps current, the
:class:`~durkv.store.delta.ChannelEncoder` that encode a checkpoint's channels, and two
memories of recent frames: the list items a checkpoint and its pending writes share
(:class:`SharedItems`, docs/FORMAT.md section 5) and the fingerprints that make a
retried identical ``put_writes`` a no-op. The store checks the arguments (the
``check_*`` functions here) and calls the writer under its lock; a commit is only
queued there, and waited for after the lock is released (group commit).

The heads are packed as lists in the order of their typed definitions
(:mod:`durkv.store.records`; ``tests/test_records.py`` holds the two to each other):
packing a plain list is cheaper than building and packing the NamedTuple, and these
are the commit paths.
"""

from __future__ import annotations

from typing import Any, Sequence

import msgpack
import xxhash

from ..durability import STRENGTH
from .._commitpath import encode_writes as _encode_writes
from .._commitpath import put_args_ok as _put_args_ok
from .._recpack import journal_payload
from .stepids import with_step_ids
from ..errors import ConfigError, FrameTooLargeError, SerializationError
from ..payload import F_ZSTD, FULL, JREF_MAGIC, Codec, encode_commit, encode_record, pack_jref
from .appender import Appender
from .ckpthead import CkptHeads
from .delta import ChannelEncoder, ChanState, NewestCheckpoint, flag_rewritten
from .index import Lane
from .records import K_CKPT, K_JOURNAL, K_WRITES, SPECIAL_WRITE_CHANNELS, check_id
from .replay import LogIndex

__all__ = ["Writer", "PackedRecord", "SharedItems", "check_put", "check_writes"]

_VERSION_TYPES = frozenset((str, int, float))   # what the frame head (msgpack) holds
_MEMORY = 4096      # entries kept by each memory of recent frames before it is cleared
_LENS_KEPT = 64     # recent checkpoints whose list lengths note_rewritten looks up
_LATE = 4           # checkpoints per lane whose items a late pending write may refer to
# journal results a pending write's list item may name (FORMAT.md 5, `jref`): the newest
# _JREF_RECENT of _JREF_MIN to _JREF_MAX bytes, whole or inside an item with at most
# _JREF_AROUND bytes around them (a ToolNode's parallel calls: one result in each of its
# ToolMessages). _JREF_MAX bounds what the two memories below hold (16 results and 64
# items: at most 20 MiB)
_JREF_MIN, _JREF_MAX, _JREF_RECENT, _JREF_AROUND = 64, 256 << 10, 16, 1024
_E_STEP, _E_RECEIPT = 2, 4      # the journal events with a result `r` (FORMAT.md 5a)
_ITEMS_RECENT = 64  # pending-write items a journal record's inputs may name (FORMAT.md 5a)


# -- arguments -------------------------------------------------------------------------------

def _check_text(what: str, s: str) -> None:
    """Refuse text UTF-8 cannot hold (a lone surrogate), naming the argument."""
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{what} holds a lone surrogate, which UTF-8 cannot store: "
                              "pass valid Unicode text") from None


def check_put(thread_id: Any, checkpoint_ns: Any, checkpoint_id: Any, parent_id: Any,
              values: Any, versions: Any, all_values: Any) -> None:
    """The arguments of ``Store.put``, checked (the common case in a few type tests, in one
    C call: ``_put_args_ok`` is True only where every test below passes)."""
    if _put_args_ok(thread_id, checkpoint_ns, checkpoint_id, parent_id, values, versions,
                    all_values):
        return
    if type(thread_id) is not str or not thread_id:
        check_id("thread_id", thread_id)
    if type(checkpoint_ns) is not str:
        check_id("checkpoint_ns", checkpoint_ns, allow_empty=True)
    if type(checkpoint_id) is not str or not checkpoint_id:
        check_id("checkpoint_id", checkpoint_id)
    if parent_id is not None and type(parent_id) is not str:
        raise ConfigError(f"parent_id must be a string or None, got {parent_id!r}")
    if type(values) is not dict or type(versions) is not dict:
        if not isinstance(values, dict) or not isinstance(versions, dict):
            raise ConfigError("values and versions must be dicts keyed by channel name, got "
                              f"{type(values).__name__} and {type(versions).__name__}")
    # Refuse what the frame head cannot hold or readers cannot list: channel names that
    # are not strings, versions that are not a str, an int of at most 64 bits or a float
    # (a bad one used to commit, and then ``durkv ls`` failed for the whole store).
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
    for ch, v in versions.items():
        _check_text(f"channel name {ch!r}", ch)
        if isinstance(v, str):
            _check_text(f"the version of channel {ch!r}", v)
    for ch in values:
        _check_text(f"channel name {ch!r}", ch)
    if all_values is not None and not isinstance(all_values, dict):
        raise ConfigError(f"all_values must be a dict or None, got {type(all_values).__name__}")


def check_writes(thread_id: Any, checkpoint_ns: Any, checkpoint_id: Any, task_id: Any,
                 writes: Any, task_path: Any) -> None:
    """The ids and the container of ``Store.put_writes`` (each write: :func:`check_write`)."""
    if (type(writes) is list and type(thread_id) is str and type(checkpoint_ns) is str
            and type(checkpoint_id) is str and type(task_id) is str and type(task_path) is str
            and thread_id and checkpoint_id and task_id and thread_id.isascii()
            and checkpoint_ns.isascii() and checkpoint_id.isascii() and task_id.isascii()
            and task_path.isascii()):
        return      # the common case (LangGraph's ids), in a few O(1) tests
    check_id("thread_id", thread_id)
    check_id("checkpoint_ns", checkpoint_ns, allow_empty=True)
    check_id("checkpoint_id", checkpoint_id)
    check_id("task_id", task_id)
    check_id("task_path", task_path, allow_empty=True)
    if isinstance(writes, (str, bytes, dict)) or not hasattr(writes, "__iter__"):
        raise ConfigError(f"writes must be a list of (idx, channel, value), got "
                          f"{type(writes).__name__}")


def check_write(w: Any) -> None:
    """One ``(idx, channel, value)`` of ``put_writes`` (the fast test inline, then this)."""
    if not (type(w) is tuple and len(w) == 3 and type(w[0]) is int
            and -(1 << 63) <= w[0] < (1 << 63) and type(w[1]) is str
            and w[1].isascii() and w[1]):
        if not isinstance(w, (tuple, list)) or len(w) != 3:
            raise ConfigError(f"each write must be (idx: int, channel: str, value), got {w!r}")
        idx, ch, _v = w
        if (not isinstance(idx, int) or isinstance(idx, bool)
                or not -(1 << 63) <= idx < (1 << 63)):
            raise ConfigError(f"the idx of a write must be an int of at most 64 bits, "
                              f"got {idx!r}")
        check_id("channel", ch)


# -- the items a checkpoint and its pending writes share ---------------------------------------

class SharedItems:
    """List items written once and referred to by the other record (FORMAT.md section 5).

    A pending write of list value stores its items as an entry; the next checkpoint
    of the task's checkpoint refers to those items instead of storing them again
    (``from_writes``, by (thread, ns, checkpoint), popped by that put). The other way round, a pending
    write that arrives after the checkpoint that folded it in refers to the items that
    checkpoint stored (``from_checkpoint``: the newest checkpoint's of each (thread, ns),
    by its parent -- the one whose writes arrive late. The newest ``_LATE`` of each lane,
    not every recent checkpoint's: each holds its new items' serialized bytes, and
    LangGraph's async executor delivers a task's writes at most a few checkpoints late
    (one was not enough: the first superstep's write can land after two later puts), so a
    memory of thousands of supersteps would hold their items for nothing. A write that
    misses stores its items).
    """

    __slots__ = ("from_writes", "from_checkpoint")

    def __init__(self) -> None:
        # (thread, ns, checkpoint) -> {channel: [((lsn, entry idx), serialized items)]}
        self.from_writes: dict[tuple[str, str, str], dict[str, list]] = {}
        # (thread, ns) -> {parent checkpoint: {channel: ((lsn, idx), serialized items)}},
        # the newest _LATE parents in put order
        self.from_checkpoint: dict[tuple[str, str], dict[str, dict[str, tuple]]] = {}

    def clear(self) -> None:
        self.from_writes.clear()
        self.from_checkpoint.clear()

    def add_writes(self, key: tuple[str, str, str], lsn: int, lists: list) -> None:
        pend = self.from_writes
        if len(pend) >= _MEMORY:
            pend.clear()
        by_ch = pend.setdefault(key, {})
        for rec, ch, _items, raws, _flags in lists:
            by_ch.setdefault(ch, []).append(((lsn, rec[2]), raws))

    def add_checkpoint(self, key: tuple[str, str, str], fresh: dict[str, tuple]) -> None:
        """The DELTA items a checkpoint stored of its own, for a pending write of its
        parent ``key`` that arrives later (LangGraph's async executor)."""
        lanes = self.from_checkpoint
        lane = lanes.get(key[:2])
        if lane is None:
            if len(lanes) >= _MEMORY:
                lanes.clear()
            lane = lanes[key[:2]] = {}
        elif len(lane) >= _LATE:
            del lane[next(iter(lane))]      # the oldest parent's
        lane[key[2]] = fresh

    def checkpoint_items(self, key: tuple[str, str, str]) -> dict[str, tuple] | None:
        """The items :meth:`add_checkpoint` kept for parent ``key``, if still kept."""
        lane = self.from_checkpoint.get(key[:2])
        return None if lane is None else lane.get(key[2])


class JournalResults:
    """The newest results this process journaled (STEP and RECEIPT ``r``, FORMAT.md 5a),
    each with its frame's LSN: a pending write's list item whose serialized bytes are
    one of them, or hold one, is stored as a ``jref`` naming it (FORMAT.md section 5), so
    a model's reply and a tool's result are stored once. Kept under the store's lock;
    cleared whenever LSNs may move or be reused (compaction, a reload of the index)."""

    __slots__ = ("recent", "on")

    def __init__(self) -> None:
        # result bytes -> (LSN, the result without its first byte), oldest first
        self.recent: dict[bytes, tuple[int, bytes]] = {}
        # results are remembered once this handle stored a pending write (a LangGraph
        # saver's store): a store that only runs journals pays nothing per record
        self.on = False

    def add(self, lsn: int, result: bytes) -> None:
        recent = self.recent
        recent.pop(result, None)
        recent[result] = (lsn, result[1:])
        if len(recent) > _JREF_RECENT:
            del recent[next(iter(recent))]

    def item(self, raw: bytes, stored: bytes) -> bytes:
        """What to store for the serialized item ``raw`` (``stored``: its bytes by the usual
        rule): a ``jref`` when it names a recent result in fewer bytes, else ``stored``."""
        recent = self.recent
        hit = recent.get(raw)
        if hit is not None:
            ref = pack_jref(hit[0])
            return ref if len(ref) < len(stored) else stored
        # the newest result held inside: whole, or without its first byte (a serde's type
        # tag, durkv's LangGraph serde, is not repeated inside a value that holds the
        # result); the tail's search rules a result out with one pass over the item
        for r, (lsn, tail) in reversed(list(recent.items())):
            p = raw.find(tail)
            if p < 0:
                continue
            whole = raw.find(r)
            start, at = (0, whole) if whole >= 0 else (1, p)
            end = at + len(r) - start
            if len(raw) - (end - at) <= _JREF_AROUND:
                ref = pack_jref(lsn, start, len(r), raw[:at], raw[end:])
                if len(ref) < len(stored):
                    return ref
        return stored

    def clear(self) -> None:
        self.recent.clear()


class WrittenItems:
    """The list items of the newest pending writes this process stored, by their
    serialized bytes, each with its place ``[lsn, entry, item]``: a run's journal record
    whose inputs hold such an item (a tool node's ToolMessage, handed to the next model
    step) names it there instead of journaling it again (FORMAT.md 5a, ``ir``). Kept only
    once a run has asked (``wanted``); under the store's lock; cleared with the LSNs."""

    __slots__ = ("recent", "wanted")

    def __init__(self) -> None:
        self.recent: dict[bytes, list[int]] = {}    # serialized item -> [lsn, entry, item]
        self.wanted = False

    def add(self, lsn: int, entry: int, raws: list) -> None:
        """The serialized items ``raws`` are the own items of entry ``entry`` of frame
        ``lsn``."""
        recent = self.recent
        for i, raw in enumerate(raws):
            if _JREF_MIN <= len(raw) <= _JREF_MAX:
                recent.pop(raw, None)
                recent[raw] = [lsn, entry, i]
        while len(recent) > _ITEMS_RECENT:
            del recent[next(iter(recent))]

    def clear(self) -> None:
        self.recent.clear()


# -- the writer -------------------------------------------------------------------------------


class PackedRecord:
    """A journal record as :meth:`Writer.pack_journal` packed it for ``run_id``: the COMMIT
    payload the log is given. A typed wrapper, so that no caller's bytes are ever taken
    for a record."""

    __slots__ = ("run_id", "payload", "result")

    def __init__(self, run_id: str, payload: bytes, result: bytes | None = None) -> None:
        self.run_id = run_id
        self.payload = payload
        self.result = result    # its `r`, when a later pending write may name it (jref)

class Writer:
    """The store's commit paths (see the module docstring); every method under the lock."""

    def __init__(self, appender: Appender, index: LogIndex, encoder: ChannelEncoder,
                 heads: CkptHeads, serde: Any, codec: Codec, url: str) -> None:
        self._ap = appender
        self._heads = heads        # checkpoint heads stored as deltas of a keyframe
        self._index = index
        self._encoder = encoder
        self._dumps = serde.dumps
        self._codec = codec
        self.url = url
        self._hpack = msgpack.Packer(use_bin_type=True)    # frame heads, under the lock
        self.shared = SharedItems()
        self.results = JournalResults()
        self.items = WrittenItems()
        self._wfp: dict[int, tuple[int, int]] = {}   # xxh3 of recent write frames -> lsn, rank
        # (thread, ns, cid) of recent checkpoints -> {list channel: its length}: a late
        # pending write's task saw those items (note_rewritten)
        self._list_lens: dict[tuple[str, str, str], dict[str, int]] = {}
        self._step_ids = False      # the log's active segment has flag STEP_IDS (once true,
                                    # every later segment has it: FORMAT.md section 2)

    def forget_retries(self) -> None:
        """A record changed what an identical put_writes would mean (delete, remove)."""
        self._wfp.clear()

    def forget_frames(self) -> None:
        """Every LSN is about to move (compaction): nothing recent may be referred to."""
        self._ap.forget()
        self._wfp.clear()
        self.shared.clear()
        self.results.clear()
        self.items.clear()
        self._heads.forget()      # the keyframes move too

    # -- put -------------------------------------------------------------------------------

    def serialize(self, checkpoint: dict, metadata: dict, checkpoint_id: str,
                  thread_id: str) -> tuple[bytes, bytes]:
        """The checkpoint record and metadata as serde bytes (before the lock)."""
        dumps = self._dumps
        try:
            return dumps(checkpoint), dumps(metadata)
        except Exception as e:
            raise SerializationError(f"cannot serialize the checkpoint record or metadata of "
                                     f"{checkpoint_id!r}: {e}", thread_id=thread_id) from e

    def put(self, thread_id: str, ns: str, cid: str, parent_id: str | None, ckpt_b: bytes,
            meta_b: bytes, values: dict, versions: dict, all_values: dict | None) -> int:
        """Commit checkpoint ``cid`` as one frame; returns its LSN (queued: the caller
        settles it outside the lock, :meth:`Appender.settle`)."""
        lane = self._index.ix.lane(thread_id, ns)
        newest = None if lane is None else (lane.newest or self._encoder.newest(lane))
        lsn = self._ap.next
        if lsn < 0:
            lsn = self._ap.next_lsn()
        # linear: the put follows the newest checkpoint (an agent loop): deltas on its state
        linear = newest is not None and cid > newest.cid and (
            parent_id is None or parent_id == newest.cid)
        entries: list = []
        chans, refs, fresh = self._encode_channels(lane, newest, linear, thread_id, ns,
                                                   parent_id, values, versions, all_values,
                                                   lsn, entries)
        if fresh is not None and (self.results.recent or self.items.wanted):
            self._fresh_items(lsn, fresh, entries)
        hb = self._pack_checkpoint_head(thread_id, ns, cid, parent_id, ckpt_b, meta_b,
                                        versions, refs)
        self._append_checkpoint(encode_commit(hb, entries), lsn, thread_id, cid)
        if lane is None:
            lane = self._index.ix.lane(thread_id, ns, True)
        lane.add(cid, lsn)
        if fresh is not None and parent_id is not None:
            self.shared.add_checkpoint((thread_id, ns, parent_id), fresh)
        if linear or newest is None or cid > newest.cid:
            # the newest checkpoint: its state stays materialized for the next put and get
            lane.newest = NewestCheckpoint(cid, lsn, parent_id, ckpt_b, meta_b, dict(versions),
                                           chans)
            lens = self._list_lens
            if len(lens) >= _LENS_KEPT:         # late writes trail by a few checkpoints
                del lens[next(iter(lens))]
            lens[(thread_id, ns, cid)] = {ch: c.n for ch, c in chans.items() if c.is_list}
        elif cid == newest.cid:
            lane.newest = None   # the newest was replaced: reload on demand
        self._index.maybe_snapshot(lsn)
        return lsn

    def _encode_channels(self, lane: Lane | None, newest: NewestCheckpoint | None,
                         linear: bool, thread_id: str, ns: str, parent_id: str | None, values: dict,
                         versions: dict, all_values: dict | None, lsn: int,
                         entries: list) -> tuple[dict[str, ChanState], dict[str, tuple],
                                                 dict | None]:
        """Append the entries of the put's channels to ``entries``; return every channel's
        state, ``{channel: (lsn, idx)}`` of the entry holding its value, and the items of
        the DELTAs of its own it stored, ``{channel: ((lsn, idx), serialized items)}``
        (None: no such DELTA), for a late pending write of the parent to refer to.

        A channel in ``values`` is encoded (a delta on the base's state when linear); one
        only in ``versions`` keeps the base's entry -- the parent's, or the newest's --
        unless ``all_values`` says the base holds another version (then its own value
        from ``all_values`` is stored)."""
        encoder = self._encoder
        if linear:
            base, base_versions = newest.chans, newest.versions
            # list items the parent's pending writes stored (FORMAT.md section 5)
            pend = self.shared.from_writes.pop((thread_id, ns, newest.cid), None)
        elif newest is None:
            base, base_versions, pend = {}, {}, None
        else:
            base, base_versions = encoder.parent_state(lane, newest, parent_id)
            pend = None
        # the loops below in one C call (csrc/chanenc.c), for exact dicts; None: here
        got = encoder.encode_c.channels(values, versions, all_values, base, base_versions,
                                        linear, pend, lsn, entries, encoder.encode_py)
        if got is not None:
            return got
        encode, encode_py = encoder.encode_c, encoder.encode_py    # C, or None: Python
        chans: dict[str, ChanState] = {}
        refs: dict[str, tuple] = {}
        fresh = None
        for ch, v in values.items():
            prev = base.get(ch) if linear else None
            p = pend.get(ch) if pend else None
            c = encode(ch, v, prev, lsn, entries, p)
            if c is None:
                c = encode_py(ch, v, prev, lsn, entries, p)
            chans[ch] = c
            refs[ch] = c.ref
            if c.fresh is not None:
                if fresh is None:
                    fresh = {}
                fresh[ch] = c.fresh
                c.fresh = None
        for ch in versions:
            if ch not in chans:
                c = base.get(ch)
                if c is not None and (all_values is None
                                      or base_versions.get(ch, c) == versions[ch]):
                    chans[ch] = c
                    refs[ch] = c.ref
                elif all_values is not None and ch in all_values:
                    # the base holds another version: this checkpoint's own value
                    c = chans[ch] = encoder.encode(ch, all_values[ch], c if linear else None,
                                                   lsn, entries)
                    refs[ch] = c.ref
        return chans, refs, fresh

    def _fresh_items(self, lsn: int, fresh: dict[str, tuple], entries: list) -> None:
        """A node's write that reached the checkpoint before its pending write did
        (LangGraph's async executor): the checkpoint's own DELTA items, which the late
        write will refer to, name the journal results they hold (FORMAT.md 5, ``jref``)
        and are remembered for a run's next record (5a), as a pending write's would be."""
        for (_lsn, idx), raws in fresh.values():
            kind, items, flags, *chain = entries[idx]
            if self.results.recent:
                items, flags = self._name_results(items, raws, flags)
                entries[idx] = (kind, items, flags, *chain)
            if self.items.wanted:
                self.items.add(lsn, idx, raws)

    def _pack_checkpoint_head(self, thread_id: str, ns: str, cid: str, parent_id: str | None,
                              ckpt_b: bytes, meta_b: bytes, versions: dict,
                              refs: dict) -> bytes:
        """The head of a K_CKPT frame: the fields of ``CkptHead``, in order, stored whole
        or as a delta of the lane's keyframe (FORMAT.md section 5)."""
        try:
            return self._heads.pack((K_CKPT, thread_id, ns, cid, parent_id, ckpt_b, meta_b,
                                     versions, refs))
        except Exception as e:
            # the types were checked: what is left is text msgpack cannot encode
            for name, x in (("thread_id", thread_id), ("checkpoint_ns", ns),
                            ("checkpoint_id", cid), ("parent_id", parent_id),
                            *(("channel", ch) for ch in versions)):
                if x is not None:
                    check_id(name, x, allow_empty=True)
            raise SerializationError(f"cannot serialize the head of {cid!r}: {e}",
                                     thread_id=thread_id) from e

    def _append_checkpoint(self, payload: bytes, lsn: int, thread_id: str, cid: str) -> None:
        """Queue the frame, which must land at ``lsn`` (the LSN its entries refer to)."""
        if len(payload) > self._ap.max_commit_bytes:
            raise FrameTooLargeError(
                f"checkpoint {cid!r} of thread {thread_id!r} is {len(payload)} "
                f"bytes, over max_commit_bytes={self._ap.max_commit_bytes}; store big values "
                "elsewhere or raise max_commit_bytes", thread_id=thread_id, size=len(payload))
        got = self._ap.queue(payload)
        if got != lsn:
            raise ConfigError(f"store {self.url}: frame landed at LSN {got}, expected {lsn}; "
                              "is another writer appending to this log?")
        self._heads.written(got)      # a full head becomes the lane's keyframe

    # -- pending writes ----------------------------------------------------------------------

    def encode_writes(self, task_id: str, writes: Sequence) -> tuple[list, list, bool]:
        """Serialize the writes (before the lock): ``(records, list values, replace)``.

        A list value is stored element by element, as the items a channel delta of the
        next checkpoint can refer to (FORMAT.md section 5): its record's value is set
        when the frame is built (:meth:`put_writes`). ``replace``: every write is to a
        special channel (they overwrite; others keep the first value of a key).

        The common case -- LangGraph's plain ``(int, str, value)`` tuples -- runs in one C
        call (``csrc/commitpath.c``) to the same output; it leaves any other shape to the
        loop below, and so does a value its serializer or codec raises on: the loop calls
        them again and raises the typed error naming the channel."""
        codec = self._codec
        try:
            got = _encode_writes(writes, self._dumps, codec.pack, codec.min_bytes,
                                 SPECIAL_WRITE_CHANNELS, F_ZSTD)
        except Exception:   # noqa: BLE001 - the loop below raises the typed error
            got = None
        if got is not None:
            return got
        return self.encode_writes_py(task_id, writes)

    def encode_writes_py(self, task_id: str, writes: Sequence) -> tuple[list, list, bool]:
        """:meth:`encode_writes` in Python: the definition the C call is held to, and the
        path of every write it leaves alone."""
        recs = []
        lists = []      # (rec, channel, stored items, serialized items, flags) of list values
        replace = True
        pack = self._codec.pack
        dumps = self._dumps
        for w in writes:
            check_write(w)
            idx, ch, v = w
            try:
                if type(v) is list:
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
        return recs, lists, replace

    def note_rewritten(self, thread_id: str, ns: str, cid: str, writes: Sequence) -> None:
        """Flag each list state of the lane's newest checkpoint of which a task's
        ``writes`` ``(idx, channel, value)`` hold an item, by object: the task may have
        edited it in place (a LangGraph node that edits a message of the state and returns
        it, for add_messages to replace by id with the same object). The next put's prefix
        compare would take it for unchanged; it stores that channel whole instead.

        A task of checkpoint ``cid`` saw the items of cid's lists; later puts serialized
        the items they added after it ran. So when its writes come late (LangGraph's
        ``async`` saves them behind the next checkpoints), only items that were in cid's
        list may hide an edit (as many as cid held, when it is a recent checkpoint)."""
        lane = self._index.ix.lane(thread_id, ns)
        newest = None if lane is None else lane.newest
        if newest is None:      # not loaded: its items are the store's, no task holds them
            return
        flag_rewritten(newest.chans, writes, self._list_lens.get((thread_id, ns, cid), {}))

    def put_writes(self, thread_id: str, ns: str, cid: str, task_id: str, task_path: str,
                   recs: list, lists: list, replace: bool, durability: str) -> int:
        """Commit the pending writes of a task as one frame (none when an identical frame
        was appended at least as durably: a retry); returns its LSN (queued: the caller
        settles it outside the lock)."""
        key = (thread_id, ns, cid)
        entries: list = []
        self.results.on = True
        if lists:
            lists = self._place_lists(key, lists, entries)
        hb = self._hpack.pack([K_WRITES, thread_id, ns, cid, task_id, task_path, replace,
                               recs])               # the fields of WritesHead, in order
        payload = encode_commit(hb, entries)
        if len(payload) > self._ap.max_commit_bytes:
            raise FrameTooLargeError(f"pending writes of task {task_id!r} are "
                                     f"{len(payload)} bytes, over max_commit_bytes="
                                     f"{self._ap.max_commit_bytes}", thread_id=thread_id,
                                     size=len(payload))
        # a retried identical call (LangGraph re-puts writes on resume) is a no-op in
        # ignore mode: skip the frame when an identical one was appended at least as durably
        rank = STRENGTH[durability]
        fp = None if replace else xxhash.xxh3_64_intdigest(payload)
        seen = self._wfp.get(fp) if fp is not None else None
        if seen is not None and seen[1] >= rank:
            return seen[0]
        lsn = self._ap.queue(payload)
        self._index.ix.add_write(thread_id, ns, cid, lsn)
        if lists:     # the next checkpoint refers to these items instead of storing them
            self.shared.add_writes(key, lsn, lists)
            if self.items.wanted:   # ... and a run's next journal record may, too
                for rec, _ch, _items, raws, _flags in lists:
                    self.items.add(lsn, rec[2], raws)
        self._index.maybe_snapshot(lsn)
        if fp is not None:
            if len(self._wfp) >= _MEMORY:
                self._wfp.clear()
            self._wfp[fp] = (lsn, rank)
        return lsn

    def _place_lists(self, key: tuple[str, str, str], lists: list, entries: list) -> list:
        """Give each list value its place: the items a checkpoint committed concurrently
        already stored (referred to), or an entry of this frame (appended to ``entries``);
        returns the lists stored here. Under the lock: that checkpoint either registered
        its items (then this write refers to them) or will find this write's."""
        late = self.shared.checkpoint_items(key)
        kept = []
        for x in lists:
            rec, ch, items, raws, flags = x
            got = late.get(ch) if late else None
            if got is not None and got[1] == raws:
                rec[2] = list(got[0])   # stored by the checkpoint already: refer to it
                continue
            rec[2] = len(entries)       # the value is the items of this entry
            if self.results.recent:     # a reply or a tool's result, journaled: named
                items, flags = self._name_results(items, raws, flags)
            entries.append((FULL, items, flags, 0, 0, 0))
            kept.append(x)
        return kept

    def _name_results(self, items: list, raws: list, flags: int) -> tuple[list, int]:
        """``items`` with each that holds a recent journal result stored as a ``jref``,
        and the entry's flags (F_ZSTD only when every item is still compressed)."""
        item = self.results.item
        out = [item(raw, b) if len(raw) >= _JREF_MIN else b for b, raw in zip(items, raws)]
        if out == items:
            return items, flags
        return out, flags & ~F_ZSTD if any(b[:4] == JREF_MAGIC for b in out) else flags

    # -- run journals ------------------------------------------------------------------------

    def append_journal(self, run_id: str, record: Any, wait: bool) -> int:
        """Append one journal record (a running agent's hot path); returns its LSN. A
        record to be ``wait``-ed for is only queued: the caller settles it as ``sync``."""
        packed = self._packed(run_id, record)
        ap = self._ap
        payload = packed.payload
        # A record to be waited for is only queued here: the caller's wait, outside the
        # lock, writes and fdatasyncs it with whatever other threads queued meanwhile --
        # one write and one fsync per group. (Written here, it waited for its own write,
        # behind a running fsync and under this lock, so concurrent durable records each
        # got a write and an fsync of their own.)
        lsn = ap.queue(payload) if wait else ap.write(payload)
        self._index.ix.add_journal(run_id, lsn)
        if packed.result is not None:
            self.results.add(lsn, packed.result)
        self._index.maybe_snapshot(lsn)
        return lsn

    def append_journal_alone(self, run_id: str, record: Any) -> int:
        """:meth:`append_journal` of a record not waited for, by a caller under the lock
        that holds no write section: the record is appended in a section of its own, one
        backend call (``Appender.write_alone``) where a section and an append were three.
        Returns its LSN, or -1 when that does not hold -- another process appended since
        the index's last look, or an index snapshot is due (it needs a section): nothing
        was appended; the caller appends in a write section (:meth:`append_journal`)."""
        packed = self._packed(run_id, record)
        index = self._index
        pos = index.scan_pos
        if index.index_every and pos - index.index_lsn >= index.index_every:
            return -1
        lsn = self._ap.write_alone(packed.payload, pos)
        if lsn >= 0:
            index.scan_pos = lsn + 1    # as a section's end: the frame is this process's
            index.ix.add_journal(run_id, lsn)
            if packed.result is not None:
                self.results.add(lsn, packed.result)
        return lsn

    def _packed(self, run_id: str, record: Any) -> "PackedRecord":
        """The :class:`PackedRecord` to append for ``record``: itself (of this run only),
        else the record packed now."""
        if type(record) is PackedRecord:
            if record.run_id != run_id:
                raise ConfigError(f"a record packed for run {record.run_id!r} cannot be "
                                  f"appended to run {run_id!r}: pack it for that run")
            return record
        return self.pack_journal(run_id, record)

    def _check_step_ids(self) -> bool:
        """Whether journal records may hold compact step ids now (FORMAT.md 5a): the
        backend's log is local and its active segment has flag ``STEP_IDS``."""
        self._step_ids = bool(getattr(self._ap.backend, "step_ids", False))
        return self._step_ids

    def pack_journal(self, run_id: str, record: Any) -> "PackedRecord":
        """The COMMIT payload of a journal record: ``record`` is its map, or a typed record
        (a tuple whose type has ``E``, ``KEYS``, ``KEEP`` and ``pack()``:
        durkv.runtime.records), packed from its fields. csrc/recpack.c packs either in one
        call, the bytes msgpack's packing of the map gives here (tests/test_recpack.py); a
        value it leaves alone (a subclass, an int out of range...) takes this path.
        The append methods take the :class:`PackedRecord` as their ``record`` too: a
        caller that keeps the bytes the log got (a Run's live steps) packs them here first.
        Bare bytes are not a record (they would be a frame nothing could read back)."""
        result = None
        ids = self._step_ids or self._check_step_ids()
        if type(record) is dict:
            payload = journal_payload(K_JOURNAL, run_id, record, ids)
            if self.results.on and record.get("e") in (_E_STEP, _E_RECEIPT):
                result = record.get("r")
        else:
            cls = type(record)
            e = getattr(cls, "E", None)
            if e is None:
                raise ConfigError(f"a journal record is a dict or a typed record "
                                  f"(durkv.runtime.records), got {cls.__name__}")
            payload = journal_payload(K_JOURNAL, run_id, record, e, cls.KEYS, cls.KEEP, ids)
            if self.results.on and (e == _E_STEP or e == _E_RECEIPT):
                result = record[cls.RESULT]
            if payload is None:
                record = record.pack()
        if payload is None:
            try:
                if ids:
                    record = with_step_ids(record)
                hb = self._hpack.pack([K_JOURNAL, run_id, record])   # JournalHead's fields
            except Exception as e:
                raise SerializationError(f"cannot encode a journal record of run "
                                         f"{run_id!r}: {e}", run_id=run_id) from e
            payload = encode_record(hb)
        if len(payload) > self._ap.max_commit_bytes:
            raise FrameTooLargeError(
                f"a journal record of run {run_id!r} is {len(payload)} bytes, over "
                f"max_commit_bytes={self._ap.max_commit_bytes}; keep big values elsewhere "
                "and journal a reference, or raise max_commit_bytes", run_id=run_id,
                size=len(payload))
        if result is not None and (type(result) is not bytes
                                   or not _JREF_MIN <= len(result) <= _JREF_MAX):
            result = None       # nothing a pending write's item would gain by naming
        return PackedRecord(run_id, payload, result)
