"""Checkpoint heads stored whole (keyframes) or as a zstd delta against one.

Consecutive checkpoints of a thread repeat most of their head: the checkpoint
record's keys and timestamp, ``versions_seen``, metadata, versions, the channel
map. A head is therefore stored as ``[kind, thread, ns, cid, base_lsn, z]``: its
fields after ``cid`` (msgpack) compressed with zstd, using as a raw-content
dictionary the head bytes of an earlier *full* checkpoint head of the same
thread and namespace -- the lane's keyframe. A keyframe is never a delta, so a
head is read with at most two frame reads. docs/FORMAT.md section 5 ("Checkpoint
heads") is the format; this module is its one encoder and its one decoder.

>>> from durkv.store.records import CkptHead, K_CKPT, read_head
>>> from durkv.payload import encode_record
>>> frames = {}
>>> heads = CkptHeads()
>>> for i in range(3):
...     h = CkptHead(K_CKPT, "t", "", f"c{i}", f"c{i - 1}" if i else None, b"ts 2026-11-30" * 9,
...                  b"{source: loop}", {"messages": i}, {"messages": [2 * i, 0]})
...     frames[i] = encode_record(heads.pack(h))
...     heads.written(i)
>>> [len(read_head(frames[i])) for i in range(3)]        # a keyframe, then deltas
[9, 6, 6]
>>> heads.load(frames.__getitem__, 2).versions
{'messages': 2}
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Sequence

import msgpack
import zstandard

from ..errors import CorruptionError, NotFoundError
from ..payload import decode_head, zstd_compressor
from .records import K_CKPT, K_COPY_CKPT, CkptDeltaHead, CkptHead, read_head

__all__ = ["CkptHeads", "KEYFRAME_EVERY"]

KEYFRAME_EVERY = 64     # deltas per keyframe: the dictionary stays close to what it compresses
MIN_HEAD = 96           # smaller heads never become keyframes (a zstd frame costs ~15 B)
MAX_KEYFRAME = 64 << 10  # larger heads are stored whole and never become keyframes
MAX_LANES = 128         # lanes whose keyframe (and ~40 KB compressor) the writer keeps
MAX_BASES = 32          # decompressors the reader keeps, by base LSN (a history walk's bases)
MAX_BACKOFF = 6         # after k misses in a row, the next 2**k - 1 puts do not try
POOR = 0.4              # a delta over this share of its full head retires its keyframe
KEEP = 0.75             # a delta is written only if z is at most this share of what it holds

_RAW = zstandard.DICT_TYPE_RAWCONTENT


_unpackb = functools.partial(msgpack.unpackb, raw=False, strict_map_key=False, use_list=True)


class _Keyframe:
    """The writer's keyframe of one lane: its LSN, head bytes and (lazily) a compressor."""

    __slots__ = ("lsn", "hb", "comp", "count", "misses", "skip", "rekeyed", "retire")

    def __init__(self, lsn: int, hb: bytes, misses: int, skip: int, rekeyed: bool) -> None:
        self.lsn, self.hb, self.comp = lsn, hb, None
        self.count = 0          # deltas written against it
        self.misses = misses    # delta attempts in a row that did not save a quarter
        self.skip = skip        # puts left before the next attempt (backoff after a miss)
        self.rekeyed = rekeyed  # it replaced a keyframe retired for compressing poorly
        self.retire = False     # retired for that: the next put is the next keyframe

    def compress(self, tail: bytes) -> bytes:
        """``tail`` as a zstd frame against the keyframe's head (a raw-content dictionary,
        no dictionary id, checksummed: FORMAT.md 5); the compressor is made once."""
        comp = self.comp
        if comp is None:
            comp = self.comp = zstd_compressor(3, self.hb, checksum=True)
        return comp(tail)


class CkptHeads:
    """One store's checkpoint heads: the writer's keyframes and the reader's bases.

    Writer (under the store's lock): ``pack(head)`` returns the bytes to store for a
    checkpoint head (a delta when the lane has a keyframe and it pays); once the frame
    is appended at ``lsn``, ``written(lsn)`` records it (a full head becomes the lane's
    keyframe). A frame that failed to append is never ``written``. ``forget()`` drops
    every keyframe and cached base: a compaction moves them, a repair may reuse LSNs.

    Reader: ``load(read, lsn)`` / ``full(read, h, lsn)`` give the full head of a
    checkpoint frame, checking a delta's base. ``read`` is a backend's ``read(lsn)``.
    """

    def __init__(self) -> None:
        self._kf: dict[tuple[str, str], _Keyframe] = {}
        self._pending: tuple | None = None    # what the last pack() wrote, for written()
        self._bases: dict[int, tuple[str, str, Any]] = {}
        self._lock = threading.Lock()     # zstd (de)compressors are not thread-safe
        self._packb = msgpack.Packer(use_bin_type=True).pack    # under self._lock

    # -- writer ------------------------------------------------------------------------------

    def pack(self, head: Sequence) -> bytes:
        """The bytes to store for checkpoint head ``head`` (a :class:`CkptHead`, or the list
        of a longer one). Raises what msgpack raises for a field it cannot encode."""
        self._pending = None
        key = (head[1], head[2])
        kf = self._kf.get(key)
        misses = skip = 0
        with self._lock:
            packb = self._packb
            if kf is not None and kf.count < KEYFRAME_EVERY:
                if kf.skip:
                    misses, skip = kf.misses, kf.skip - 1
                else:
                    tail = packb(head[4:])     # a tuple or list: a msgpack array
                    z = kf.compress(tail)
                    if len(z) <= KEEP * len(tail):       # it saves at least a quarter
                        out = packb((head[0], head[1], head[2], head[3], kf.lsn, z))
                        # over POOR of the full head: a keyframe unlike the heads that
                        # follow it (LangGraph's input checkpoint starts every thread)
                        poor = len(out) > POOR * (len(tail) + len(out) - len(z))
                        self._pending = (key, None, poor, 0)
                        return out
                    misses = min(kf.misses + 1, MAX_BACKOFF)
                    skip = (1 << misses) - 1
            hb = packb(head)
        self._pending = (key, hb, misses, skip)
        return hb

    def written(self, lsn: int) -> None:
        """The head the last ``pack`` returned is in frame ``lsn``."""
        got, self._pending = self._pending, None
        if got is None:
            return
        key, hb, misses, skip = got     # for a delta (hb None): key, None, poor, 0
        kfs = self._kf
        kf = kfs.get(key)
        if hb is None:                  # a delta against the lane's keyframe
            if kf is not None:
                kf.count += 1
                kf.misses = 0
                if misses and not kf.rekeyed:     # poor: retire it, once in a row
                    kf.count = KEYFRAME_EVERY
                    kf.retire = True
            return
        if not MIN_HEAD <= len(hb) <= MAX_KEYFRAME:
            return                      # stored whole, never a keyframe
        kfs.pop(key, None)
        if len(kfs) >= MAX_LANES:
            del kfs[next(iter(kfs))]    # the lane whose keyframe is the oldest
        kfs[key] = _Keyframe(lsn, hb, misses, skip, kf is not None and kf.retire)

    def forget(self) -> None:
        """Drop every keyframe and cached base: their frames are about to move (a
        compaction), or the log was repaired under a reader and an LSN may now hold
        another frame (FORMAT.md 2a)."""
        with self._lock:
            self._kf.clear()
            self._pending = None
            self._bases.clear()

    # -- reader ------------------------------------------------------------------------------

    def load(self, read: Callable[[int], bytes], lsn: int, payload: bytes | None = None
             ) -> CkptHead:
        """The full head of the checkpoint frame at ``lsn`` (its ``payload`` if at hand)."""
        if payload is None:
            payload = read(lsn)
        h = read_head(payload, lsn)
        if h[0] != K_CKPT and h[0] != K_COPY_CKPT:
            raise _bad(lsn, f"frame {lsn} is a record of kind {h[0]!r}, not a checkpoint")
        return CkptHead.of(self.full(read, h, lsn), lsn)

    def full(self, read: Callable[[int], bytes], h: list, lsn: int) -> list:
        """The full head list of checkpoint head ``h`` (frame ``lsn``): ``h`` itself, or
        the head a delta stands for, its base checked (FORMAT.md section 5)."""
        if len(h) < 5 or type(h[4]) is not int:
            return h
        # tuple-unpacked, not a typed view: history resolves one per checkpoint
        kind, thread, ns, cid, base, z = h if len(h) == 6 else CkptDeltaHead.of(h, lsn)
        if type(z) is not bytes or not 0 <= base < lsn:
            raise _bad(lsn, f"delta checkpoint head of frame {lsn} names base {base!r}, "
                            "not an earlier frame")
        with self._lock:
            got = self._bases.get(base)
            if got is None:
                got = self._base(read, base, lsn)
            if got[0] != thread or got[1] != ns:
                raise _bad(lsn, f"delta checkpoint head of frame {lsn} (thread {thread!r}, "
                                f"ns {ns!r}) names base frame {base}, a checkpoint of thread "
                                f"{got[0]!r}, ns {got[1]!r}")
            try:
                # the content size is in the frame (the writer's), the checksum checked
                tail = _unpackb(got[2].decompress(z))
            except Exception as e:
                raise _bad(lsn, f"delta checkpoint head of frame {lsn} does not decode "
                                f"against base frame {base}: {e}") from None
        if type(tail) is not list:
            raise _bad(lsn, f"delta checkpoint head of frame {lsn} decodes to "
                            f"{type(tail).__name__}, not a list")
        return [kind, thread, ns, cid, *tail]

    def _base(self, read: Callable[[int], bytes], base: int, lsn: int) -> tuple:
        """(thread, ns, decompressor) of keyframe ``base``, checked and cached."""
        try:
            p = read(base)
        except NotFoundError as e:
            # as for the checkpoint's own frame: a reader whose view predates a compaction
            # (refresh() or reopen), never another frame read in its place
            raise NotFoundError(f"{e}: the keyframe of the delta checkpoint head of frame "
                                f"{lsn}", lsn=lsn, base=base) from None
        bh = read_head(p, base)
        if (bh[0] not in (K_CKPT, K_COPY_CKPT) or len(bh) < 9 or type(bh[4]) is int
                or type(bh[1]) is not str or type(bh[2]) is not str):
            raise _bad(lsn, f"delta checkpoint head of frame {lsn} names base frame {base}, "
                            "which is not a full checkpoint head")
        dct = zstandard.ZstdCompressionDict(bytes(decode_head(p, base)), dict_type=_RAW)
        got = (bh[1], bh[2], zstandard.ZstdDecompressor(dict_data=dct))
        bases = self._bases
        if len(bases) >= MAX_BASES:
            del bases[next(iter(bases))]
        bases[base] = got
        return got


def _bad(lsn: int, msg: str) -> CorruptionError:
    return CorruptionError(f"{msg}; run `durkv verify --deep` on the store", kind="bad_record",
                           lsn=lsn)
