"""Delta-encoded channels: the materialized newest state and the commit-path encoder.

Delta-encoded channels
----------------------
A new list value of a channel is stored as a DELTA (only ``new[len(old):]`` is
serialized, one item per element) when the previous value of that channel in
the same (thread, ns) -- the newest checkpoint's, which must be the put's
parent -- was a list, ``len(new) >= len(old)`` and the old list is a prefix of
the new one. Only the new items are serialized: encoding costs O(new items).

How "is a prefix" is decided is the store option ``delta_check``:

- ``"prefix"`` (the default) compares the whole committed prefix: one memcmp of
  the two lists' item-pointer arrays (``durkv._listprefix``, ~0.15 ns per item),
  and, only for items that are not the same object, a compare as stored: plain
  data strictly (exact types, float bits, dict key order), anything else by the
  serde's bytes -- never ``==``, which takes ``1.0 == 1 == True``. Any replaced
  or edited item makes the entry FULL. LangGraph's ``add_messages`` replaces a
  message by id at its position, which is why this is the default.
- ``"identity"`` is O(1): ``new[0] is old[0]``, ``new[len(old)-1] is old[-1]``
  and the middle item. It is what the runtime's Append reducer and
  ``operator.add`` produce (a new list holding the same item objects). Its
  boundary: **an item already committed must not be replaced at a position
  other than the first, middle or last** -- such a change is not seen and the
  stored value keeps the old items. Choose it only when lists change by
  appending alone.

Both modes also run the exact compare when the new list is no longer than the
old one and when the checked items are immutable scalars (str, int, float,
bytes, bool, None: Python shares equal objects, so identity proves nothing).
Everything else is a FULL entry: lists one item per element (so later deltas
extend them), other values one item with flag VALUE. A put whose parent is not
the newest checkpoint (a fork, time travel) writes FULL entries. Every
``snapshot_every`` deltas a SNAP entry follows the DELTA in the same frame.

What the compare sees: the store keeps its **own** item array per list channel
(copied at a FULL put, extended by the new items at a delta: O(change)), never
the caller's list, so editing the list after a put -- replacing an item,
appending in place -- is seen by the next put and never shows in ``get``. The
items in it are the objects that were put, or a later put's objects that compared
the same as stored and took their place (that identity is what keeps the compare
at one memcmp: a thread read back is compared by value once); the one thing no compare short of re-serializing the
whole list can see is **an item object that was put, mutated in place and put
again** without a pending write naming it: its new content is not stored. A task's
write of an object the newest list state holds (``Writer.note_rewritten``) flags the
channel (``ChanState.rewritten``) and the next put stores it whole: a LangGraph node
that edits a state message in place and returns it, for ``add_messages`` to replace by
id with the same object, is stored (GUARANTEES section 10). Otherwise put a new object
(an edit of ``get()`` output is safe, as below).

Reads
-----
The newest checkpoint of each (thread, ns) keeps its ids, versions and channel
refs in memory: ``get`` of the latest is O(1) in the number of checkpoints.
Every value it returns is deserialized afresh from the serialized bytes kept
with the state (a list channel: each item's, next to the item objects the
compare uses; O(list length), in one serializer call where the serde has a
``loads_many``) -- so the caller owns it: an edit of it changes neither the
store nor the objects that were put (as with LangGraph's InMemorySaver). An
immutable scalar item (str, bytes, int, float, bool, None: exact types) is its
own copy: its bytes are not kept and it is handed out as itself, so a text
channel's newest state is held once. Under LangGraph's serializer a plain-data
item (dicts with str keys, lists, such scalars) is kept as durkv's own copy in
the form deserializing builds, and handed out as a fresh copy of that
(containers new, immutable leaves shared): the same value and types as
deserializing, without it (see ``_kept_items``); a LangChain message, once
decoded, is kept by its fields and built again without validation
(LangGraphSerde.loads_kept). ``get`` of an
older checkpoint reads it from the log (one ``read_channel`` per channel);
``history`` derives an older list from the newer one it just read when the
newer entry extends it (a prefix slice: see :mod:`durkv.store.history`).

The objects: :class:`ChanState` (one channel of a lane's newest checkpoint),
:class:`NewestCheckpoint` (that checkpoint: kept in ``Lane.newest``), and :class:`ChannelEncoder`,
which encodes a put's channels and loads/reads that state; the writer
(:mod:`durkv.store.writer`) and the reads (:mod:`durkv.store.reads`) hold one.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Sequence

from .._chanenc import ChanEncoder
from .._listprefix import decoded_copy, has_prefix, holds_any, join_tagged, strict
from ..errors import SerializationError
from ..payload import (
    DELTA, F_REFS, F_VALUE, F_ZSTD, FULL, JREF_MAGIC, SNAP, Codec, entry_at, pack_ref,
)
from .index import Lane
from .ckpthead import CkptHeads

__all__ = ["ChannelEncoder", "ChanState", "NewestCheckpoint", "flag_rewritten", "join_tagged",
           "kept_values", "list_loads"]

_SCALARS = frozenset((str, int, float, bytes, bool, type(None)))
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# serialized items that begin with either magic are always stored compressed (FORMAT.md 5)
_MAGICS = (_ZSTD_MAGIC, JREF_MAGIC)


def flag_rewritten(chans: dict, writes: Sequence, seen: dict) -> None:
    """Set ``rewritten`` on each list state of ``chans`` of which ``writes`` ``(idx,
    channel, value)`` hold one of the first ``seen[channel]`` items (all when unknown),
    by object: a pointer scan (``holds_any``). See Writer.note_rewritten."""
    for _idx, ch, value in writes:
        c = chans.get(ch)
        if (c is not None and c.is_list and c.obj is not None and not c.rewritten
                and holds_any(c.obj, min(c.n, seen.get(ch, c.n)), value)):
            c.rewritten = True


class ChanState:
    """Materialized state of one channel of a lane's newest checkpoint."""

    # class-level defaults keep construction cheap (it is on the commit path)
    is_list = False
    obj: list | None = None    # list channels: the items put (or read), the store's own
    raw: list | None = None    # array, and what it keeps of each (_kept_items): its
    #                            serialized bytes, None, a decoded-form copy, or (under
    #                            LangGraphSerde) a message's fields; the value is obj[:n]
    as_is = False              # some raw[i] is not serialized (None or a copy)
    n = 0
    first = last = mid = None  # fingerprint: obj[0], obj[n-1], obj[n//2] (references)
    vbytes = b""               # non-list channels: the serialized value
    base = b""                 # packed ref of the chain's FULL/SNAP
    deltas: list[bytes] = []   # packed refs of the DELTAs since base (never mutated in place)
    fresh: tuple | None = None  # ((lsn, idx), serialized items) of the DELTA of own items
    #                             this put wrote (a pending write arriving late refers to it)
    rewritten = False          # a task wrote one of obj's own items again since (perhaps
    #                            edited in place): the next put stores the channel whole

    def __init__(self, ref: tuple[int, int], loaded: bool = True) -> None:
        self.ref = ref              # (lsn, idx) of the entry holding the value
        self.loaded = loaded        # False: only ref is known (load from the log on demand)


@dataclass(slots=True, eq=False)
class NewestCheckpoint:
    """The newest checkpoint of a lane, materialized (``Lane.newest``): its ids, records,
    versions and the :class:`ChanState` of each channel with a value."""

    cid: str
    lsn: int
    parent: str | None
    ckpt_b: bytes               # the serialized checkpoint and metadata, as stored
    meta_b: bytes
    versions: dict
    chans: dict                 # channel -> ChanState


def _match_writes(pend: list, raws: list) -> tuple[list, int]:
    """Pending-write entries whose items, one after another, are a prefix of ``raws``
    (compared byte for byte, each used once): ``(their refs, items covered)``."""
    if len(pend) == 1 and raws and pend[0][1] == raws:
        return [pend[0][0]], len(raws)      # the agent loop: the task's one write, whole
    refs: list = []
    m = 0
    left = list(pend)
    while left and m < len(raws):
        for j, (wref, wraws) in enumerate(left):
            k = len(wraws)
            if k and m + k <= len(raws) and wraws == raws[m:m + k]:
                refs.append(wref)
                m += k
                del left[j]
                break
        else:
            break
    return refs, m


class ChannelEncoder:
    """Encode a put's channels; load and read the newest state of a lane.

    Holds the backend (to load state from the log), the serde and the item codec.
    Every method runs under the store's lock.
    """

    def __init__(self, backend: Any, serde: Any, codec: Codec, heads: CkptHeads, *,
                 snapshot_every: int, delta_check: str) -> None:
        self._b = backend
        self._heads = heads
        self._dumps = serde.dumps
        self._loads = serde.loads
        self._loads_list = list_loads(serde)     # many list items in one call
        # a serde's own reader of what the state keeps of a list's items (LangGraphSerde:
        # in C, keeping decoded messages by their fields): given the store's arrays, n
        self._loads_kept = getattr(serde, "loads_kept", None)
        # and how it keeps an object it decoded that is not plain data (a message), or None
        self._kept_form = getattr(serde, "kept_form", None)
        # a model's stored form, comparably, under any serializer it wraps, or None
        self._model_form = getattr(serde, "model_form", None)
        self._serde = serde
        self._codec = codec
        self._minb = codec.min_bytes
        self._compress = codec.compress      # the writer's compressor: under the lock
        self.snapshot_every = snapshot_every
        self._prefix_check = delta_check == "prefix"
        # encode_c(ch, v, prev, lsn, entries, pend): encode_py in one C call for its common
        # cases (csrc/chanenc.c: a non-list value; an exact list under "prefix" whose
        # previous state is loaded), else None, having done nothing
        # (the threshold clamped to a C ssize_t: no item is that long, so nothing changes)
        self.encode_c = ChanEncoder(self, self._dumps, self._compress,
                                    max(-sys.maxsize, min(self._minb, sys.maxsize)), ChanState,
                                    self._has_prefix, _serialization_error, serde)

    def encode(self, ch: str, v: Any, prev: ChanState | None, lsn: int, entries: list,
               pend: list | None = None) -> ChanState:
        """Append the entries of channel ``ch`` = ``v`` to ``entries``; return its new state
        (:meth:`encode_py`, in C where :attr:`encode_c` takes the case)."""
        c = self.encode_c(ch, v, prev, lsn, entries, pend)
        return self.encode_py(ch, v, prev, lsn, entries, pend) if c is None else c

    def encode_py(self, ch: str, v: Any, prev: ChanState | None, lsn: int, entries: list,
                  pend: list | None = None) -> ChanState:
        """:meth:`encode` in Python: the definition ``encode_c`` is held to.

        Entries are plain tuples ``(kind, items, flags, depth, prev_lsn, prev_idx)``.
        ``pend``: ``[(entry ref, serialized items)]`` of the list values the parent's
        pending writes stored to ``ch`` (FORMAT.md section 5): a delta whose items begin
        with theirs refers to those entries (an F_REFS DELTA) instead of storing them again.
        """
        if prev is not None and not prev.loaded:
            self.load(prev)           # log errors must not read as serialization errors
        c = ChanState((lsn, len(entries)))
        try:
            if type(v) is list:     # a subclass is a value: the serde keeps or refuses its type
                self._encode_list(c, v, prev if prev is not None and prev.is_list else None,
                                  entries, pend)
                return c
            raw = self._dumps(v)
        except Exception as e:
            raise _serialization_error(ch, e) from e
        # any other value: one item, FULL with flag VALUE
        b = raw
        flags = F_VALUE
        if len(b) >= self._minb or b[:4] in _MAGICS:
            b = self._compress(b)
            flags |= F_ZSTD
        entries.append((FULL, [b], flags, 0, 0, 0))
        c.vbytes = raw
        c.base = pack_ref(lsn, c.ref[1])
        return c

    def _encode_list(self, c: ChanState, v: list, prev: ChanState | None, entries: list,
                     pend: list | None) -> None:
        """A list value: DELTA entries when it extends the previous list ``prev`` (see the
        module docstring), else a FULL entry of one item per element."""
        start = self.delta_start(prev, v) if prev is not None else None
        raws, kept = self._serialize_items(v, start)
        wrefs: list = []     # pending-write entries holding raws[:m]
        m = 0
        if pend and start is not None:
            wrefs, m = _match_writes(pend, raws)
        own = raws[m:] if m else raws
        items, flags = self._stored_items(own)
        self._keep_items(c, v, prev, start, kept)
        if start is None:
            entries.append((FULL, items, flags, 0, 0, 0))
            c.base = pack_ref(*c.ref)
        else:
            self._append_deltas(c, prev, wrefs, items, flags, own, entries)

    def _plain_tag(self) -> int | None:
        """The tag byte of the items the serde reads back exactly as ``decoded_copy``
        copies plain data (LangGraphSerde's ``plain_tag``: its msgpack under LangGraph's
        own serializer), or None: such items are kept as copies (:func:`_kept_items`).
        Asked at every put: a serializer swapped in place is followed."""
        return getattr(self._serde, "plain_tag", None)

    def _serialize_items(self, v: list, start: int | None) -> tuple[list[bytes], list]:
        """The serde bytes of the items to store, ``v[start:]`` (a delta) or all of ``v``,
        and what the state keeps of each (see :func:`_kept_items`). A plain-data item's
        copy is taken first and serialized itself, so its bytes and copy are one value
        whatever another thread does to the item meanwhile."""
        dumps = self._dumps
        tag = self._plain_tag()
        raws: list[bytes] = []
        kept: list = []
        for i in range(start or 0, len(v)):
            x = v[i]
            # an immutable scalar is its own copy -- unless the serde reads it back as
            # another value (LangGraph's: a str with a surrogate, an int past 64 bits)
            if type(x) in _SCALARS and (tag is None or x is None or decoded_copy(x) is not None):
                raws.append(dumps(x))
                kept.append(None)
                continue
            cp = decoded_copy(x) if tag is not None else None
            b = dumps(x if cp is None else cp)
            raws.append(b)
            kept.append(cp if cp is not None and isinstance(b, bytes) and b[:1] == bytes((tag,))
                        else b)
        return raws, kept

    def _stored_items(self, raws: list[bytes]) -> tuple[list[bytes], int]:
        """The items as stored (each compressed when large) and the entry's flags."""
        minb = self._minb
        items = []
        zc = 0
        for b in raws:
            if len(b) >= minb or b[:4] in _MAGICS:
                b = self._compress(b)
                zc += 1
            items.append(b)
        return items, (F_ZSTD if zc and zc == len(items) else 0)

    @staticmethod
    def _keep_items(c: ChanState, v: list, prev: ChanState | None, start: int | None,
                    kept: list) -> None:
        """The store's own item arrays, never the caller's list: a later in-place edit of
        the caller's list can neither change the committed state nor hide from the next
        put's prefix compare. A delta extends the previous arrays in place when nothing
        else did (holders read [:their n])."""
        c.is_list = True
        if start is None:
            buf = list(v)
            raws = list(kept)
            c.as_is = _unserialized(raws)
        else:
            buf, raws_before = prev.obj, prev.raw
            if len(buf) != start or len(raws_before) != start:
                buf = buf[:start]
                raws_before = raws_before[:start]
            buf.extend(v[start:])
            raws_before.extend(kept)
            raws = raws_before
            c.as_is = prev.as_is or _unserialized(kept)
        c.obj = buf
        c.raw = raws
        n = c.n = len(v)
        if n:
            c.first = v[0]
            c.last = v[n - 1]
            c.mid = v[n >> 1]

    def _append_deltas(self, c: ChanState, prev: ChanState, wrefs: list, items: list,
                       flags: int, own: list[bytes], entries: list) -> None:
        """The DELTA entries of a list extending ``prev``: an F_REFS DELTA naming the
        entries of the parent's pending writes that hold its first items (``wrefs``),
        then a DELTA of the items of its own (``items``, serialized ``own``); a SNAP after
        them every ``snapshot_every`` deltas."""
        lsn, idx = c.ref
        pl, pi = prev.ref
        deltas = prev.deltas
        if wrefs:
            # the items the parent's pending writes stored: referred to, not copied
            deltas = deltas + [pack_ref(lsn, idx)]
            entries.append((DELTA, [pack_ref(*r) for r in wrefs], F_REFS, len(deltas), pl, pi))
            pl, pi = c.ref = (lsn, idx)
            idx += 1
        if items or not wrefs:
            deltas = deltas + [pack_ref(lsn, idx)]
            c.ref = (lsn, idx)
            entries.append((DELTA, items, flags, len(deltas), pl, pi))
            if items:
                c.fresh = ((lsn, idx), own)
        if len(deltas) >= self.snapshot_every:
            idx = len(entries)
            entries.append((SNAP, [prev.base] + deltas, 0, 0, 0, 0))
            c.ref = (lsn, idx)
            c.base = pack_ref(lsn, idx)
        else:
            c.base = prev.base
            c.deltas = deltas

    def _has_prefix(self, v: list, old: list, n: int, kept: list) -> bool:
        """Whether ``v[:n]`` holds the values of ``old[:n]`` (the store's items, ``kept``
        what it keeps of each), compared as stored: ``durkv._listprefix.has_prefix``, with
        the serde's bytes deciding what plain data cannot (:meth:`_same_item`)."""
        return has_prefix(v, old, n, kept, self._same_item)

    def _same_item(self, x: Any, kept: Any, old: Any) -> bool:
        """Whether item ``x`` would be stored as the stored item ``old`` (``kept``: what
        the state keeps of it, its bytes or its fields). == is not enough: 1.0 == 1, and
        equal Decimals of other precision or datetimes in other zones are stored apart.

        By the serde's bytes; where they differ each time for one value (LangGraph's
        EncryptedSerializer: a fresh nonce), by value instead (:func:`_same_value`) --
        else every read-back thread would be stored whole again at each turn."""
        try:
            if type(kept) is tuple and self._kept_form is not None:
                # a message the state keeps by its fields (a thread read back and extended,
                # LangGraph's serde): the same class and fields, strictly, is the same bytes
                mine = self._kept_form(x)
                if mine is not None:
                    return _same_forms(mine, kept)
            raw = self._dumps(x)
            if raw == (kept if isinstance(kept, bytes) else self._dumps(old)):
                return True
            if self._dumps(x) == raw:
                return False        # a serde that repeats itself: the values differ
            return _same_value(x, old, self._model_form)
        except Exception:
            return False        # not serializable: the FULL path raises the error

    def delta_start(self, prev: ChanState, v: list) -> int | None:
        """``len(old)`` if ``v`` extends the previous list value (then only ``v[n:]`` is
        stored), else None. See the module docstring for the two ``delta_check`` modes."""
        n = prev.n
        if len(v) < n or prev.rewritten:
            return None
        if n == 0:
            return 0
        old = prev.obj                     # the store's own array: never the caller's list
        if self._prefix_check:
            # exact: one memcmp of the item-pointer arrays (~0.15 ns/item, no allocation);
            # only items that are not the same object are compared, as stored
            try:
                return n if self._has_prefix(v, old, n, prev.raw) else None
            except Exception:
                return None
        first, last = prev.first, prev.last
        if v[0] is not first or v[n - 1] is not last:
            return None
        if n > 2 and v[n >> 1] is not prev.mid:
            return None
        if len(v) == n or type(first) in _SCALARS or type(last) in _SCALARS:
            try:
                if not self._has_prefix(v, old, n, prev.raw):
                    return None
            except Exception:
                return None
        return n

    def parent_state(self, lane: Lane, newest: NewestCheckpoint,
                     parent_id: str | None) -> tuple[dict[str, ChanState], dict[str, Any]]:
        """Channel states (unloaded refs) and versions of the parent checkpoint, for a
        non-linear put."""
        if parent_id is None or parent_id == newest.cid:
            return ({ch: ChanState(c.ref, False) for ch, c in newest.chans.items()},
                    newest.versions)
        pos = lane.find(parent_id)
        if pos < 0:
            return {}, {}
        lsn = lane.lsns[pos]
        h = self._heads.load(self._b.read, lsn)
        return {ch: ChanState(tuple(ref), False) for ch, ref in h.chans.items()}, h.versions

    # -- materialized latest state -----------------------------------------------------------

    def newest(self, lane: Lane) -> NewestCheckpoint | None:
        """The lane's newest checkpoint, materialized (loaded from the log on first use);
        None for an empty lane."""
        newest = lane.newest
        if newest is None and lane.ids:
            newest = self.load_newest(lane)
        return newest

    def load_newest(self, lane: Lane) -> NewestCheckpoint:
        lsn = lane.lsns[-1]
        h = self._heads.load(self._b.read, lsn)
        newest = NewestCheckpoint(h.cid, lsn, h.parent, h.ckpt_b, h.meta_b, h.versions,
                                  {ch: ChanState(tuple(ref), False)
                                   for ch, ref in h.chans.items()})
        lane.newest = newest
        return newest

    def load(self, c: ChanState) -> None:
        """Fill ``c`` (known by its ref only) from the log: its chain and its value."""
        read = self._b.read
        lsn, idx = c.ref
        e = entry_at(read(lsn), idx)
        deltas = []
        r = (lsn, idx)
        while e.kind == DELTA:
            deltas.append(pack_ref(*r))
            r = (e.prev_lsn, e.prev_idx)
            e = entry_at(read(r[0]), r[1])
        deltas.reverse()
        c.base = pack_ref(*r)
        c.deltas = deltas
        items, flags = self._b.read_channel(lsn, idx)
        unpack = self._codec.unpack
        if flags & F_VALUE:
            c.is_list = False
            c.vbytes = unpack(items[0])
        else:
            raws = [unpack(x) for x in items]
            obj = self._loads_list(raws)
            c.is_list = True
            c.obj = obj
            c.raw = _kept_items(obj, raws, self._plain_tag(), self._kept_form)
            c.as_is = _unserialized(c.raw)
            n = c.n = len(obj)
            if n:
                c.first, c.last, c.mid = obj[0], obj[n - 1], obj[n >> 1]
        c.loaded = True

    def value(self, c: ChanState) -> Any:
        """The committed value of a channel of the newest checkpoint, as new objects."""
        if not c.loaded:
            self.load(c)
        if not c.is_list:
            return self._loads(c.vbytes)
        # a list's items are new objects made from what the state keeps of each (its bytes,
        # or a copy: _kept_items), never the objects kept for the prefix compare: those
        # are the caller's (a LangGraph node's return value, already handed out), and an
        # edit of what get() returned must change neither them nor the committed state
        if self._loads_kept is not None:
            return self._loads_kept(c.raw, c.obj, c.n)
        raws = c.raw[:c.n]
        if c.as_is:             # items kept as themselves or as copies (see _kept_items)
            return kept_values(raws, c.obj, self._loads)
        return self._loads_list(raws)


def _same_forms(a: tuple, b: tuple) -> bool:
    """Two pydantic models' kept forms (``LangGraphSerde.kept_form``/``model_form``: class, fields,
    fields set, extras) store the same: the same class, fields and extras, strictly.
    The fields set is not compared: LangGraph's serializer stores ``model_dump()``, every
    field, and a decoded model has them all set, the model a node made only its own."""
    return a[0] is b[0] and strict(a[1], b[1]) is True and strict(a[3], b[3]) is True


def _same_value(x: Any, old: Any, model_form: Any) -> bool:
    """``x`` is ``old``'s value, as a serializer that keeps types would store it: plain
    data strictly (exact types at every level, float bits, dict order), a pydantic model
    (a LangChain message) by its class and fields (``model_form``: the serde's, None when
    it has none); anything else is taken as changed (a full entry: never a wrong value,
    only bytes)."""
    if type(x) is not type(old):
        return False
    same = strict(x, old)
    if same is not None:
        return same
    if model_form is None:
        return False
    fx, fo = model_form(x), model_form(old)
    return fx is not None and fo is not None and _same_forms(fx, fo)


def _serialization_error(ch: str, e: Exception) -> SerializationError:
    """What a put raises when channel ``ch``'s value cannot be encoded (``e``: why)."""
    err = SerializationError(f"cannot serialize channel {ch!r}: {e}", channel=ch)
    err.__cause__ = e
    return err


def list_loads(serde: Any) -> Any:
    """``f(raws) -> [serde.loads(b) for b in raws]``: the serde's batch form when it has one
    (LangGraphSerde's ``loads_many``: a list channel's items in one call), each a new
    object either way."""
    many = getattr(serde, "loads_many", None)
    if many is not None:
        return many
    loads = serde.loads
    return lambda raws: [loads(b) for b in raws]


def kept_values(kept: list, objs: list, loads: Any) -> list:
    """A list channel's items from what the state keeps of each (:func:`_kept_items`), each
    a new object but for an immutable scalar (``objs[i]``, itself): a copy of a kept copy,
    ``loads(k)`` of anything else."""
    return [objs[i] if k is None else decoded_copy(k) if type(k) in _COPIES else loads(k)
            for i, k in enumerate(kept)]


_COPIES = (dict, list)      # the types of a decoded-form copy the state keeps


def _kept_items(items: list, raws: list[bytes], tag: int | None,
                kept_form: Any = None) -> list:
    """What the state keeps of ``items`` (serialized ``raws``) to hand each out again:

    - None for an immutable scalar (str, bytes, int, float, bool, None; exact types),
      handed out as itself -- no edit of it can reach the committed state, and keeping its
      bytes too would hold a text channel's newest state twice in memory;
    - under a serde that names a ``plain_tag``, for plain data (dicts with str keys,
      lists, such scalars) whose bytes carry that tag: durkv's own copy in the form
      decoding builds (``durkv._listprefix.decoded_copy``: containers copied, immutable
      leaves shared), handed out as a copy of it -- the value decoding the bytes gives,
      without decoding (a list of 500 1 KiB messages: ~3x faster);
    - ``kept_form(x)`` when it is not None (LangGraphSerde: a LangChain message by its
      fields), for an object that is what decoding its bytes builds;
    - else the bytes, deserialized afresh each time.

    ``items`` must be the objects a load decoded from ``raws``, the store's own (the put
    path takes its copies in :meth:`ChannelEncoder._serialize_items`)."""
    out: list = []
    for x, b in zip(items, raws):
        if type(x) in _SCALARS:
            out.append(None)
            continue
        cp = None
        if tag is not None and b[:1] == bytes((tag,)):
            cp = decoded_copy(x)
            if cp is None and kept_form is not None:
                cp = kept_form(x)
        out.append(b if cp is None else cp)
    return out


def _unserialized(kept: list) -> bool:
    """Whether some item is kept as itself or as a copy (ChanState.as_is)."""
    return any(k is None or type(k) in _COPIES for k in kept)
