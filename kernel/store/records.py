"""Store records: the msgpack heads of the store's COMMIT frames, and the result types.

Every store frame is a COMMIT frame (docs/FORMAT.md section 5) whose head is a
msgpack list; its first element is the record kind below. Checkpoint frames
carry the channel entries, pending-write frames one entry per list value (a
checkpoint's delta then refers to those items rather than storing them again:
FORMAT.md section 5); every other record has none. A reader skips kinds
it does not know. Item bytes (values, pending-write values) are serde output,
zstd-compressed when large (see :mod:`durkv.payload`).

Checkpoint record fields: ``ckpt_b``/``meta_b`` are the serde bytes of the
checkpoint record and metadata; ``versions`` is msgpack (str/int/float
values); the channel map gives, for every channel that has a value in this
checkpoint, the ``[lsn, idx]`` of the entry holding it -- an entry of this frame
for a changed channel, of an earlier frame for an unchanged one (so unchanged
channels cost a reference, and any checkpoint reads each channel with one
``read_channel``). A checkpoint head may be stored as a delta, ``[kind, thread, ns,
cid, base_lsn, z]`` (:class:`CkptDeltaHead`; :mod:`durkv.store.ckpthead` resolves it).
Pending-write records resolve in log order: ``replace``
false = a key (task_id, idx) already present keeps its first value (LangGraph's
INSERT OR IGNORE), true = it is overwritten (special channels only). A write's
value is its serde bytes, or (a list) the int index of the entry of this frame
holding its elements, or the ``[lsn, idx]`` of an earlier frame's entry holding
them (a checkpoint that stored them first).

Compaction writes ``COMPACT_BEGIN``, copies (``COPY_*``), then ``COMPACT_END``;
replay applies copies to a fresh index and switches to it at END, and ignores
copies that no END follows (see :mod:`durkv.store.compact`).

``K_INDEX`` is an index snapshot: the whole in-memory index that replaying every
frame before it builds (``state`` = :func:`durkv.store.index.dump_index`: per thread
and namespace the checkpoint ids with their frame LSNs, the pending-write LSNs
and the orphan writes; no channel values), the LSN it was written at and the
last compaction's BEGIN LSN (-1: none). The writer appends one at close, after a
compaction and every ``index_every`` frames; open reads the frames backwards for
the newest one that decodes and checks, and replays only the frames after it.
Version 2 adds the run journals' LSNs (``journals`` = :func:`durkv.store.index.dump_journals`);
version 3 is the same layout in a log that may hold delta checkpoint heads.
It changes nothing when replayed (like any record, it abandons an unfinished
compaction). It is only a shortcut: a bad one is skipped for an older one or a
full replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack

from ..durability import DURABILITIES  # noqa: F401 - re-exported (records.__all__)
from ..errors import ConfigError, CorruptionError
from ..payload import decode_head
from .stepids import unpackb

__all__ = ["Checkpoint", "PendingWrite", "ChannelEntry", "DURABILITIES",
           "SPECIAL_WRITE_CHANNELS", "check_id", "check_ids", "check_limit", "check_opt_id",
           "is_placed_item"]


def is_placed_item(x: Any) -> bool:
    """Whether a journal record's ``ir`` new item names a list item of the log by its
    place, ``[lsn, entry, index]`` (FORMAT.md 5a), rather than holding its bytes (bin)
    or naming a step's result (``[step id, generation]``)."""
    return type(x) is list and len(x) == 3 and all(type(v) is int and v >= 0 for v in x)

# record kinds: the first element of every frame head (part of the format: never renumber)
K_CKPT = 1          # [1, thread, ns, cid, parent, ckpt_b, meta_b, versions, {ch: [lsn, idx]}]
#                     or, a delta head: [1, thread, ns, cid, base_lsn, z] (durkv.store.ckpthead)
K_WRITES = 2        # [2, thread, ns, cid, task_id, task_path, replace, [[idx, ch, value]...]]
#                     value: bytes | entry k of this frame | [lsn, idx] (FORMAT.md s. 5)
K_DEL_THREAD = 3    # [3, thread]
K_COPY_THREAD = 4   # [4, src, dst]
K_REMOVE = 5        # [5, [[thread, ns, [cid, ...]], ...]]   (delete_runs, prune)
K_COMPACT_BEGIN = 6  # [6]
K_COMPACT_END = 7   # [7, begin_lsn]
K_COPY_CKPT = 8     # as K_CKPT, written by compact() between BEGIN and END
K_COPY_WRITES = 9   # as K_WRITES, written by compact()
K_INDEX = 10        # [10, 2, own_lsn, compacted_at, state, journals]  (index snapshot)
K_JOURNAL = 11      # [11, run_id, rec]  (one run-journal event, opaque to the store)
K_COPY_JOURNAL = 12  # as K_JOURNAL, written by compact()
K_DEL_JOURNAL = 13  # [13, [run_id, ...]]  (delete_runs)
K_REPAIR = 14       # [14, [run_id, ...], rec]  (a repair: rec is a journal record of each run)
# K_INDEX versions (docs/FORMAT.md section 5): 1 had no journals (passed over); 3 is 2's
# layout in a log that may hold delta checkpoint heads (older readers pass it over)
INDEX_VERSION = 3
INDEX_VERSIONS = (2, 3)     # the versions this reader accepts

# LangGraph's WRITES_IDX_MAP channels: a put_writes made only of these overwrites
SPECIAL_WRITE_CHANNELS = frozenset(("__error__", "__scheduled__", "__interrupt__", "__resume__"))


@dataclass
class PendingWrite:
    """A pending write of a task against a checkpoint (see :meth:`Store.put_writes`)."""

    task_id: str
    channel: str
    value: Any
    idx: int
    task_path: str = ""


@dataclass
class Checkpoint:
    """A checkpoint as read back: ids, the opaque record, metadata, ALL channel
    versions, the values of every channel that has one, and its pending writes."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    checkpoint: dict
    metadata: dict
    versions: dict
    values: dict
    writes: list[PendingWrite] = field(default_factory=list)


@dataclass
class ChannelEntry:
    """What one checkpoint wrote to a channel (see :meth:`Store.channel_entries`).

    ``kind`` is ``"append"`` (``value`` = the list of items the checkpoint appended
    to its parent's value), ``"full"`` (``value`` = the whole list) or ``"value"``
    (``value`` = a whole non-list value).
    """

    checkpoint_id: str
    kind: str
    value: Any


# str as str, arrays as lists: msgpack's defaults (raw=False, use_list=True); a compact
# step id (FORMAT.md 5a) as its str
_unpackb = unpackb


def read_head(payload: bytes, lsn: int = -1) -> list:
    """The record head of a COMMIT payload, checked: a msgpack list whose first element
    is the kind. Anything else is a :class:`CorruptionError` naming frame ``lsn``
    (never an IndexError/TypeError). The one decoder of record heads."""
    hb = decode_head(payload, lsn)
    try:
        h = _unpackb(hb)
    except Exception as e:
        raise _bad_head(lsn, f"head is not msgpack ({e})") from None
    if type(h) is list and h:
        return h
    raise _bad_head(lsn, f"head is {type(h).__name__}, not a non-empty list")


def _bad_head(lsn: int, msg: str) -> CorruptionError:
    return CorruptionError(f"frame {lsn} is a COMMIT frame whose head is not a store record: "
                           f"{msg}; run `durkv verify` on the store",
                           kind="bad_record", lsn=lsn)


def pack_head(fields: Any) -> bytes:
    """The head bytes of a record (a list, or one of the typed heads below: msgpack packs a
    tuple as the same array, so the bytes are those of the list)."""
    return msgpack.packb(fields, use_bin_type=True)


def _typed_views(cls: Any) -> tuple[Any, Any]:
    """``cls.of`` and ``cls.fields`` of a typed head: closures over the field count (no
    classmethod binding, no second length check in ``_make``).

    ``of(h, lsn)`` is the typed view; ``fields(h, lsn)`` the decoded list itself, length
    checked the same way, for the hot paths (replay reads every frame) to unpack into
    names in the definition's order without building a tuple per frame."""
    n = len(cls._fields)
    new = tuple.__new__
    name = cls.__name__

    def fields(h: list, lsn: int = -1) -> list:
        if len(h) == n:
            return h
        if len(h) < n:
            raise _bad_head(lsn, f"{name} head has {len(h)} fields, needs {n}")
        return h[:n]        # a later version's longer head: the fields this one knows

    def of(h: list, lsn: int = -1) -> Any:
        if len(h) != n:
            h = fields(h, lsn)
        return new(cls, h)

    return of, fields


def _pack(self: Any) -> bytes:
    return msgpack.packb(self, use_bin_type=True)


class CkptHead(NamedTuple):
    """K_CKPT / K_COPY_CKPT: ``chans`` maps each channel with a value to ``[lsn, idx]``."""

    kind: int
    thread: str
    ns: str
    cid: str
    parent: str | None
    ckpt_b: bytes
    meta_b: bytes
    versions: dict
    chans: dict


class CkptDeltaHead(NamedTuple):
    """K_CKPT / K_COPY_CKPT stored as a delta: ``z`` is the head's fields after ``cid``,
    zstd-compressed against the head of frame ``base`` (see :mod:`durkv.store.ckpthead`).
    A full head's ``parent`` (element 4) is a str or None, a delta's ``base`` an int."""

    kind: int
    thread: str
    ns: str
    cid: str
    base: int
    z: bytes


class WritesHead(NamedTuple):
    """K_WRITES / K_COPY_WRITES: ``writes`` is ``[[idx, channel, value], ...]``."""

    kind: int
    thread: str
    ns: str
    cid: str
    task_id: str
    task_path: str
    replace: bool
    writes: list


class DelThreadHead(NamedTuple):
    kind: int
    thread: str


class CopyThreadHead(NamedTuple):
    kind: int
    src: str
    dst: str


class RemoveHead(NamedTuple):
    """K_REMOVE: ``[[thread, ns, [cid, ...]], ...]``."""

    kind: int
    doomed: list


class CompactBeginHead(NamedTuple):
    kind: int


class CompactEndHead(NamedTuple):
    kind: int
    begin_lsn: int


class IndexHead(NamedTuple):
    """K_INDEX: version, the LSN it was written at, the last compaction's BEGIN (-1: none),
    :func:`durkv.store.index.dump_index` and :func:`durkv.store.index.dump_journals`."""

    kind: int
    version: int
    lsn: int
    compacted_at: int
    state: Any
    journals: Any


class JournalHead(NamedTuple):
    """K_JOURNAL / K_COPY_JOURNAL: one run-journal event, opaque to the store. A
    K_COPY_JOURNAL's ``run_id`` may be a list: the copy is a record of each run listed
    (a record that several runs indexed, copied once: FORMAT.md 5a)."""

    kind: int
    run_id: str | list
    rec: Any


def copy_runs(run_id: Any, lsn: int) -> list[str] | str:
    """The run (or runs) a K_COPY_JOURNAL of frame ``lsn`` is a record of; a list that is
    empty or not all str is CorruptionError (it could index nothing right)."""
    if type(run_id) is not list:
        return run_id
    if not run_id or any(type(r) is not str for r in run_id):
        raise _bad_head(lsn, f"a journal copy names the runs {run_id!r}")
    return run_id


class RepairHead(NamedTuple):
    """K_REPAIR: one journal record (``rec``) of every run in ``run_ids``, in one frame
    (docs/FORMAT.md 6a). The layout of :class:`JournalHead` with a list of run ids, so a
    journal read of this frame's LSN gets ``rec`` like any journal record's."""

    kind: int
    run_ids: list
    rec: Any


class DelJournalHead(NamedTuple):
    kind: int
    run_ids: list


def heads_of(array_b: Any) -> list[list]:
    """The heads of a backend's ``read_heads`` answer (one msgpack array, one decode)."""
    return _unpackb(array_b)


def check_id(name: str, value: Any, *, allow_empty: bool = False) -> None:
    if type(value) is str and value.isascii() and (value or allow_empty):
        return      # the common case, in O(1) (CPython flags an ASCII string)
    if isinstance(value, str) and (value or allow_empty):
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ConfigError(f"{name} {value!r} is not valid Unicode text (a lone surrogate?); "
                              "ids are stored as UTF-8") from None
        return
    if not isinstance(value, str) or (not value and not allow_empty):
        got = "an empty string" if value == "" else f"{type(value).__name__} {value!r}"
        raise ConfigError(f"{name} is required and must be a non-empty string, got {got}; "
                          f"pass e.g. {name}='thread-1'"
                          if name == "thread_id" else
                          f"{name} must be a {'string' if allow_empty else 'non-empty string'}, "
                          f"got {got}")


def check_opt_id(name: str, value: Any) -> None:
    """None or an id string (``checkpoint_id``, ``before``...)."""
    if value is not None:
        check_id(name, value)


def check_limit(limit: Any) -> None:
    """None or an int >= 0 (a bool, a string such as '2' or a negative int is refused: a
    negative limit silently listed nothing)."""
    if limit is not None and (type(limit) is not int and (
            not isinstance(limit, int) or isinstance(limit, bool))):
        raise ConfigError(f"limit must be an int or None, got {type(limit).__name__} {limit!r}")
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0 or None (None: no limit), got {limit}")


def check_ids(name: str, ids: Any) -> list[str]:
    """A collection of ids as a list. A bare string is ONE id (never its characters)."""
    if isinstance(ids, str):
        ids = [ids]
    try:
        out = list(ids)
    except TypeError:
        raise ConfigError(f"{name} must be a list of strings, got {type(ids).__name__}") from None
    for x in out:
        check_id(name, x)
    return out


# Each typed head: ``of(h, lsn)`` is the typed view of a decoded head, its length checked (a
# longer head, from a later version, keeps its known prefix); only the length, since replay
# decodes every record and has dispatched on the kind already. ``fields(h, lsn)`` is the
# same check returning the list (the hot paths unpack it). ``pack()`` is its bytes.
# (A NamedTuple cannot take a mixin base, so the two methods are attached here.)
for _cls in (CkptHead, CkptDeltaHead, WritesHead, DelThreadHead, CopyThreadHead, RemoveHead,
             CompactBeginHead, CompactEndHead, IndexHead, JournalHead, DelJournalHead,
             RepairHead):
    _of, _fields_of = _typed_views(_cls)
    _cls.of = staticmethod(_of)
    _cls.fields = staticmethod(_fields_of)
    _cls.pack = _pack
del _cls, _of, _fields_of
