"""COMMIT payloads (docs/FORMAT.md section 5): the commit-payload codec.

This module is the one Python codec of that format: pure Python on bytes, so
every backend (memory, local, s3) shares it. An *entry* (:class:`CommitEntry`) is
what one COMMIT frame holds for one channel, as FORMAT.md section 5 uses the word.
The C library decodes the same bytes (``dkv_read_channel``, ``verify --deep``);
the tests hold the two to each other. A frame is laid out by a small CPython
extension (``durkv._commitframe``, :func:`encode_commit`), not the cffi
library: it reads the entries' Python objects in place and keeps the GIL, where
cffi would copy them into arrays and drop the GIL on every call.

Item compression is per item and self-describing: an item is stored zstd
compressed when its serialized size is ``>= compress_min_bytes``, and it is
read back as compressed exactly when it starts with the zstd frame magic
(``28 b5 2f fd``). An item may also name a journal result instead of holding its
bytes (a ``jref``, magic ``c1 6a 72 66``, FORMAT.md section 5): :class:`Codec` reads
it back through the store's resolver. A serialized value that happens to begin with
either magic is always compressed, so the rule is unambiguous. An entry carries flag
``F_ZSTD`` when all of its items are compressed (as FORMAT.md defines the
flag); readers rely on the magic, never on the flag, because a DELTA/SNAP chain
can mix compressed and plain items while ``read_channel`` reports the flags of
the chain's FULL entry only.

>>> p = encode_commit(b"head", [CommitEntry(FULL, [b"a", b"b"])])
>>> decode_head(p)
b'head'
>>> resolve_channel({7: p}.__getitem__, 7, 0)
([b'a', b'b'], 0)
"""

from __future__ import annotations

import struct
import threading
from typing import Callable, NamedTuple

import msgpack
import zstandard

from ._zstdheld import Compressor as _HeldCompressor, available as _held_available
from ._commitframe import encode_commit as _encode_commit
from .errors import CorruptionError

__all__ = [
    "FULL", "DELTA", "SNAP", "F_ZSTD", "F_VALUE", "F_REFS", "CommitEntry", "encode_commit",
    "encode_record", "decode_commit", "decode_head", "entry_at", "entry_header", "snap_ref_at",
    "snap_refs", "resolve_channel", "pack_ref", "unpack_ref", "Codec", "JREF_MAGIC",
    "pack_jref", "unpack_jref", "zstd_compressor",
]

FULL, DELTA, SNAP = 1, 2, 3
F_ZSTD, F_VALUE, F_REFS = 1, 2, 4    # F_REFS: a DELTA whose items are 12-byte refs

_U32 = struct.Struct("<I")
_ENTRY = struct.Struct("<BBHIQII")   # kind flags reserved depth prev_lsn prev_idx n_items
_REF = struct.Struct("<QI")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZDICT_MAGIC = b"\x37\xa4\x30\xec"   # a formatted zstd dictionary's first bytes
JREF_MAGIC = b"\xc1\x6a\x72\x66"  # an item naming a journal result (FORMAT.md 5, `jref`)
_MAGICS = (_ZSTD_MAGIC, JREF_MAGIC)

pack_ref = _REF.pack
_pack_u32 = _U32.pack
_unpack_u32 = _U32.unpack_from


def unpack_ref(b: bytes) -> tuple[int, int]:
    return _REF.unpack(b)


class CommitEntry(NamedTuple):
    """One channel entry of a COMMIT frame (FORMAT.md section 5)."""

    kind: int
    items: list
    flags: int = 0
    depth: int = 0
    prev_lsn: int = 0
    prev_idx: int = 0


def encode_commit(head: bytes, entries: list | tuple) -> bytes:
    """Encode a COMMIT payload: ``head_len head n_entries entry*``. ``entries`` (a list or
    tuple) are :class:`CommitEntry` or plain 6-tuples in its field order (the commit path
    builds those), each entry's items a list or tuple of bytes.

    One C call (``csrc/commitframe.c``): every checkpoint and pending-write frame is laid
    out here, and the ``struct``-and-join version was ~3 us of a LangGraph superstep's
    ~150. ``tests/test_commitframe.py`` holds it to the layout of FORMAT.md section 5,
    written out with ``struct`` over many inputs. A field out of its range raises
    OverflowError; nothing is returned half-built."""
    return _encode_commit(head, entries)


def encode_record(head: bytes) -> bytes:
    """A COMMIT payload with no entries -- ``head_len head n_entries=0`` -- as every record
    but a checkpoint or a pending write is (a journal record, an index snapshot, a delete,
    a compaction marker): the bytes of ``encode_commit(head, ())``, built without the
    entry loop (a journal record's hot path).

    >>> encode_record(b"hd") == encode_commit(b"hd", ())
    True
    """
    return b"".join((_pack_u32(len(head)), head, b"\0\0\0\0"))


def _bad(msg: str, lsn: int | None = None) -> CorruptionError:
    where = f"frame {lsn}: " if lsn is not None else ""
    return CorruptionError(f"{where}malformed COMMIT payload: {msg}", kind="bad_commit",
                           lsn=-1 if lsn is None else lsn)


def decode_head(payload: bytes, lsn: int | None = None) -> bytes:
    """The head bytes of a COMMIT payload (no entry is decoded), bounds checked: the one
    place that finds the head (:func:`durkv.store.records.read_head` decodes it)."""
    n = len(payload)
    if n >= 8:
        hl = _unpack_u32(payload)[0]
        if 8 + hl <= n:
            return payload[4:4 + hl]
    raise _bad("shorter than 8 bytes" if n < 8 else "head length past the end", lsn)


def _entries_offset(payload: bytes) -> tuple[int, int]:
    (hl,) = _U32.unpack_from(payload, 0)
    off = 4 + hl
    if off + 4 > len(payload):
        raise _bad("head length past the end")
    (n,) = _U32.unpack_from(payload, off)
    return off + 4, n


def _check_entry(kind: int, flags: int, reserved: int) -> None:
    if (kind not in (FULL, DELTA, SNAP) or reserved or flags & ~(F_ZSTD | F_VALUE | F_REFS)
            or (flags & F_REFS and (kind != DELTA or flags & F_VALUE))):
        raise _bad(f"bad entry header (kind {kind}, flags {flags}, reserved {reserved})")


def _read_entry(payload: bytes, off: int) -> tuple[CommitEntry, int]:
    end = len(payload)
    if off + 24 > end:
        raise _bad("entry header past the end")
    kind, flags, reserved, depth, prev_lsn, prev_idx, n = _ENTRY.unpack_from(payload, off)
    _check_entry(kind, flags, reserved)
    off += 24
    items = []
    unpack_u32 = _U32.unpack_from
    for _ in range(n):
        if off + 4 > end:
            raise _bad("item length past the end")
        (ln,) = unpack_u32(payload, off)
        off += 4
        if off + ln > end:
            raise _bad("item past the end")
        items.append(payload[off:off + ln])
        off += ln
    return CommitEntry(kind, items, flags, depth, prev_lsn, prev_idx), off


def decode_commit(payload: bytes) -> tuple[bytes, list[CommitEntry]]:
    """Decode a whole COMMIT payload into ``(head, entries)``."""
    head = decode_head(payload)
    off, n = _entries_offset(payload)
    entries = []
    for _ in range(n):
        e, off = _read_entry(payload, off)
        entries.append(e)
    if off != len(payload):
        raise _bad("trailing bytes after the last entry")
    return head, entries


def _entry_offset(payload: bytes, idx: int) -> int:
    off, n = _entries_offset(payload)
    if idx >= n:
        raise _bad(f"entry {idx} of {n}")
    unpack_u32 = _U32.unpack_from
    for _ in range(idx):
        n_items = _ENTRY.unpack_from(payload, off)[6]
        off += 24
        for _ in range(n_items):
            off += 4 + unpack_u32(payload, off)[0]
    return off


def entry_at(payload: bytes, idx: int) -> CommitEntry:
    """CommitEntry ``idx`` of a COMMIT payload (skips the entries before it)."""
    return _read_entry(payload, _entry_offset(payload, idx))[0]


def entry_header(payload: bytes, idx: int) -> tuple[int, int, int, int, int, int, int]:
    """``(kind, flags, depth, prev_lsn, prev_idx, n_items, items_offset)`` of entry
    ``idx``, copying no item (the history walk reads only headers)."""
    off = _entry_offset(payload, idx)
    if off + 24 > len(payload):
        raise _bad("entry header past the end")
    kind, flags, reserved, depth, prev_lsn, prev_idx, n = _ENTRY.unpack_from(payload, off)
    _check_entry(kind, flags, reserved)
    return kind, flags, depth, prev_lsn, prev_idx, n, off + 24


def snap_ref_at(payload: bytes, items_offset: int, k: int) -> tuple[int, int]:
    """Reference ``k`` of a SNAP entry whose items start at ``items_offset``."""
    off = items_offset + 16 * k
    if _U32.unpack_from(payload, off)[0] != 12:
        raise _bad(f"SNAP reference {k} is not 12 bytes")
    return _REF.unpack_from(payload, off + 4)


def snap_refs(entry: CommitEntry) -> list[tuple[int, int]]:
    """The ``(lsn, idx)`` references of a SNAP entry."""
    return [_REF.unpack(i) for i in entry.items]


def resolve_channel(read_payload: Callable[[int], bytes], lsn: int, idx: int,
                    max_steps: int = 1 << 20) -> tuple[list[bytes], int]:
    """A channel's item list at entry ``(lsn, idx)``, walking DELTA/SNAP refs.

    Returns ``(items, flags of the chain's FULL entry)``; the pure-Python twin
    of ``dkv_read_channel``. References must point strictly backwards.
    """
    cache: dict[int, bytes] = {}

    def entry(ref_lsn: int, ref_idx: int) -> CommitEntry:
        p = cache.get(ref_lsn)
        if p is None:
            p = cache[ref_lsn] = read_payload(ref_lsn)
        return entry_at(p, ref_idx)

    def own_items(e: CommitEntry, ref_lsn: int, ref_idx: int) -> list[bytes]:
        """A DELTA's own items: with F_REFS, those of the FULL list entries it names."""
        if not e.flags & F_REFS:
            return e.items
        out: list[bytes] = []
        for r in snap_refs(e):
            if r >= (ref_lsn, ref_idx):
                raise _bad("item reference does not point backwards", ref_lsn)
            t = entry(*r)
            if t.kind != FULL or t.flags & F_VALUE:
                raise _bad("item reference is not a FULL list entry", ref_lsn)
            out.extend(t.items)
        return out

    def value(ref_lsn: int, ref_idx: int) -> tuple[list[bytes], int]:
        tails: list[list[bytes]] = []
        steps = 0
        while True:
            e = entry(ref_lsn, ref_idx)
            steps += 1
            if steps > max_steps:
                raise _bad("channel chain too long (a reference cycle?)", ref_lsn)
            if e.kind == FULL:
                base, flags = list(e.items), e.flags
                break
            if e.kind == DELTA:
                tails.append(own_items(e, ref_lsn, ref_idx))
                if (e.prev_lsn, e.prev_idx) >= (ref_lsn, ref_idx):
                    raise _bad("DELTA reference does not point backwards", ref_lsn)
                ref_lsn, ref_idx = e.prev_lsn, e.prev_idx
                continue
            if e.kind == SNAP:
                refs = snap_refs(e)
                if not refs:
                    raise _bad("SNAP without references", ref_lsn)
                for r in refs:
                    if r >= (ref_lsn, ref_idx):
                        raise _bad("SNAP reference does not point backwards", ref_lsn)
                base, flags = value(*refs[0])
                for r in refs[1:]:
                    base.extend(own_items(entry(*r), *r))
                break
            raise _bad(f"unknown entry kind {e.kind}", ref_lsn)
        for t in reversed(tails):
            base.extend(t)
        return base, flags

    return value(lsn, idx)


def _packb(v: list) -> bytes:
    return msgpack.packb(v, use_bin_type=True)


def _unpackb(b: bytes) -> object:
    return msgpack.unpackb(b, raw=False)


def pack_jref(lsn: int, start: int = 0, end: int | None = None, pre: bytes = b"",
              post: bytes = b"") -> bytes:
    """A ``jref`` item: the journal result ``R`` of frame ``lsn`` (``end`` None), or
    ``pre + R[start:end] + post`` (FORMAT.md section 5)."""
    if end is None:
        return JREF_MAGIC + _packb([lsn])
    return JREF_MAGIC + _packb([lsn, start, end, pre, post])


def unpack_jref(item: bytes) -> tuple[int, int, int | None, bytes, bytes]:
    """``(lsn, start, end, pre, post)`` of a ``jref`` item (``end`` None: the whole
    result). Raises ValueError for bytes that are not one."""
    if item[:4] != JREF_MAGIC:
        raise ValueError("not a jref item")
    try:
        v = _unpackb(item[4:])
    except Exception as e:
        raise ValueError(f"a jref that does not decode ({type(e).__name__}: {e})") from None
    if type(v) is list and len(v) == 1 and type(v[0]) is int and v[0] >= 0:
        return v[0], 0, None, b"", b""
    if (type(v) is list and len(v) == 5 and all(type(x) is int and x >= 0 for x in v[:3])
            and v[1] <= v[2] and type(v[3]) is bytes and type(v[4]) is bytes):
        return v[0], v[1], v[2], v[3], v[4]
    raise ValueError(f"a malformed jref {v!r:.80}")


def _no_resolver(item: bytes) -> bytes:
    raise CorruptionError("an item names a journal result, and this reader has no store "
                          "to read it from", kind="bad_record")


# libzstd.so.1 bound by durkv._zstdheld: compress through it (the GIL held) when True
HELD_ZSTD = _held_available


def zstd_compressor(level: int, dict_data: bytes | None = None,
                    checksum: bool = False) -> Callable[[bytes], bytes]:
    """``compress(data) -> bytes``: one zstd frame of ``data`` at ``level``, its content
    size written, a checksum when ``checksum``; with ``dict_data``, compressed against those
    bytes as a raw-content dictionary and naming no dictionary id. Through the system's
    libzstd with the GIL held (csrc/zstdheld.c: a release on a commit's thread wakes a
    graph's loop thread) when it is there, else ``zstandard``; any zstd reader reads
    either's frames. Not thread-safe: one thread at a time, as a zstandard compressor."""
    # libzstd's stable API reads a dictionary that begins with its magic as a formatted
    # one: such bytes go to zstandard, which is told they are raw content
    if HELD_ZSTD and (dict_data is None or dict_data[:4] != _ZDICT_MAGIC):
        return _HeldCompressor(level, dict_data, checksum).compress
    if dict_data is None:
        return zstandard.ZstdCompressor(level=level, write_checksum=checksum).compress
    n = len(dict_data)
    params = zstandard.ZstdCompressionParameters.from_level(
        level, source_size=n, dict_size=n, write_checksum=int(checksum), write_dict_id=0,
        write_content_size=1)
    d = zstandard.ZstdCompressionDict(dict_data, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    d.precompute_compress(compression_params=params)
    return zstandard.ZstdCompressor(dict_data=d, compression_params=params).compress


class Codec:
    """Per-item compression with a size threshold (see the module docstring).

    zstd level 1: the items are small (a ~1 KiB message), where each frame's cost is
    mostly its own setup and entropy tables; level 1 compresses a LangGraph message in
    ~10 us where level 3 took ~15.5 us, for 1.8% more bytes on the item (0.2-1% of a
    store; docs/BENCHMARKS.md, "Issue 20: the commit path in C"). The level is the
    writer's choice alone: any zstd frame reads back the same."""

    __slots__ = ("min_bytes", "_level", "compress", "_local", "resolve")

    def __init__(self, compress_min_bytes: int = 1024, level: int = 1) -> None:
        self.min_bytes = compress_min_bytes
        self._level = level
        # compress(data) -> bytes: one compressor, for the one thread that holds the store's
        # write lock (the commit path: no thread-local lookup per item)
        self.compress = zstd_compressor(level)
        self._local = threading.local()     # pack()/unpack() run on any thread: one each
        # resolve(jref item) -> the bytes it stands for: the store's (Reads.journal_item)
        self.resolve: Callable[[bytes], bytes] = _no_resolver

    def pack(self, data: bytes) -> tuple[bytes, bool]:
        """Maybe compress one serialized item; returns ``(stored, compressed)``."""
        if len(data) >= self.min_bytes or data[:4] in _MAGICS:
            c = getattr(self._local, "c", None)
            if c is None:
                c = self._local.c = zstd_compressor(self._level)
            return c(data), True
        return data, False

    def unpack(self, data: bytes) -> bytes:
        head = data[:4]
        if head == _ZSTD_MAGIC:
            d = getattr(self._local, "d", None)
            if d is None:
                d = self._local.d = zstandard.ZstdDecompressor()
            return d.decompress(data)
        if head == JREF_MAGIC:
            return self.resolve(data)
        return data

    def stored(self, items: list[bytes], flags: int,
               moved: dict[int, int]) -> tuple[list[bytes], int]:
        """``items`` of an entry as compaction copies them (FORMAT.md section 5): a ``jref``
        naming a journal record in ``moved`` (its copy's LSN by its old one) names the
        copy, any other is replaced by the bytes it stands for, stored by the usual rule;
        and the entry's ``flags`` with ``F_ZSTD`` set again from them."""
        if not any(x[:4] == JREF_MAGIC for x in items):
            return items, flags
        out = []
        for x in items:
            if x[:4] == JREF_MAGIC:
                lsn, start, end, pre, post = unpack_jref(x)
                to = moved.get(lsn)
                x = (self.pack(self.unpack(x))[0] if to is None
                     else pack_jref(to, start, end, pre, post))
            out.append(x)
        zstd = all(x[:4] == _ZSTD_MAGIC for x in out)
        return out, (flags & ~F_ZSTD) | (F_ZSTD if zstd else 0)
