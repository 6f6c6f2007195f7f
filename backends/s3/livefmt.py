"""The objects of a live ``s3://`` store (FORMAT.md section 11): batch and segment
encoding, keys, and live manifests.

>>> decode_batch(encode_batch(3, 10, [b"a", b"bc"]), "k")
(3, 10, [b'a', b'bc'])
>>> seg_key(0, 412)
'live/seg/00000000000000000000-00000000000000000412.seg'
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from durkv.errors import CorruptionError
from durkv.log import crc32c

__all__ = ["encode_batch", "decode_batch", "FENCE_BYTES", "EPOCHS", "WAL", "SEGS", "LEASES",
           "LIVE_MANIFESTS", "num_key", "num_of", "newest_numbered", "seg_key", "SegRef",
           "LiveManifest", "Piece"]

_MAGIC = b"DKVBAT\x00\x01"
_HEAD = struct.Struct("<8sQQI")
FENCE_BYTES = _HEAD.size + 4        # a batch with no frames: only a fence is this small
EPOCHS = "live/epochs/"
WAL = "live/wal/"
SEGS = "live/seg/"
LEASES = "live/lease/"
LIVE_MANIFESTS = "live/manifests/"
_DIGITS = 20


def encode_batch(epoch: int, first_lsn: int, frames: list[bytes]) -> bytes:
    parts = [_HEAD.pack(_MAGIC, epoch, first_lsn, len(frames))]
    for f in frames:
        parts.append(struct.pack("<I", len(f)))
        parts.append(f)
    body = b"".join(parts)
    return body + struct.pack("<I", crc32c(body))


def batch_crc(body: bytes) -> int:
    """The CRC-32C an encoded batch or segment ends with (of every byte before it)."""
    return struct.unpack_from("<I", body, len(body) - 4)[0]


def decode_batch(data: bytes, key: str) -> tuple[int, int, list[bytes]]:
    """(writer_epoch, first_lsn, frames); CorruptionError naming ``key`` if damaged."""
    def bad(why: str) -> CorruptionError:
        return CorruptionError(f"live object {key}: {why}", segment=key, kind="checksum_mismatch")

    if len(data) < FENCE_BYTES:
        raise bad(f"{len(data)} bytes is too short")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if crc != crc32c(memoryview(data)[:-4]):
        raise bad("crc32c mismatch")
    magic, epoch, first, count = _HEAD.unpack_from(data, 0)
    if magic != _MAGIC:
        raise bad("bad magic")
    frames, off, end = [], _HEAD.size, len(data) - 4
    for _ in range(count):
        if off + 4 > end:
            raise bad("frame past the end")
        (n,) = struct.unpack_from("<I", data, off)
        frames.append(data[off + 4:off + 4 + n])
        off += 4 + n
    if off != end:
        raise bad("bytes after the last frame")
    return epoch, first, frames


def num_key(prefix: str, n: int, ext: str) -> str:
    return f"{prefix}{n:0{_DIGITS}d}{ext}"


def num_of(prefix: str, rel: str, ext: str) -> int | None:
    """The number of ``prefix``NNN``ext``; None for any other key."""
    stem = rel[len(prefix):] if rel.startswith(prefix) else ""
    stem = stem[:-len(ext)] if stem.endswith(ext) else ""
    return int(stem) if len(stem) == _DIGITS and stem.isdigit() else None


def newest_numbered(loc: Any, prefix: str, ext: str) -> tuple[str, dict] | None:
    """The key (relative) and listing entry of the highest-numbered ``prefix``NNN``ext``
    object at ``loc`` (an :class:`~durkv.backends.s3.client.S3Location`: one paged
    LIST), or None when there is none."""
    best = None
    for rel, entry in loc.list_objects(prefix):
        n = num_of(prefix, rel, ext)
        if n is not None and (best is None or n > best[0]):
            best = (n, rel, entry)
    return None if best is None else (best[1], best[2])


def seg_key(first_lsn: int, end_lsn: int) -> str:
    return f"{SEGS}{first_lsn:0{_DIGITS}d}-{end_lsn:0{_DIGITS}d}.seg"


@dataclass(frozen=True)
class SegRef:
    """One merged segment object as a live manifest lists it."""

    key: str            # relative to the store's prefix
    first_lsn: int
    count: int
    bytes: int
    crc32c: int

    @property
    def end_lsn(self) -> int:
        return self.first_lsn + self.count


@dataclass(frozen=True)
class Piece:
    """An object holding frames [first_lsn, first_lsn + count): a batch or a segment."""

    first_lsn: int
    count: int
    rel: str
    tag: str            # the cache file's tag: ETag (batch) or CRC-32C hex (segment)
    batch_no: int = -1  # -1: a merged segment
    size: int = 0
    epoch: int = 0


@dataclass
class LiveManifest:
    manifest_no: int = -1               # -1: none written yet (a first-version store)
    writer_epoch: int = 0
    start_lsn: int = 0
    next_batch: int = 0
    next_lsn: int = 0
    segments: list[SegRef] = field(default_factory=list)

    def to_json(self) -> bytes:
        return json.dumps({
            "format": "durkv-live-manifest", "version": 1, "manifest_no": self.manifest_no,
            "writer_epoch": self.writer_epoch, "start_lsn": self.start_lsn,
            "next_batch": self.next_batch, "next_lsn": self.next_lsn,
            "segments": [s.__dict__ for s in self.segments],
            "created_at_ns": time.time_ns()}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, key: str) -> LiveManifest:
        try:
            doc: Any = json.loads(data)
            if doc.get("format") != "durkv-live-manifest" or doc.get("version") != 1:
                raise ValueError("not a durkv-live-manifest version 1")
            m = cls(int(doc["manifest_no"]), int(doc["writer_epoch"]), int(doc["start_lsn"]),
                    int(doc["next_batch"]), int(doc["next_lsn"]),
                    [SegRef(str(s["key"]), int(s["first_lsn"]), int(s["count"]),
                            int(s["bytes"]), int(s["crc32c"])) for s in doc["segments"]])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptionError(f"live manifest {key} cannot be read: {exc}", segment=key,
                                  kind="bad_manifest") from exc
        at = m.segments[0].first_lsn if m.segments else m.start_lsn
        for s in m.segments:
            if s.first_lsn != at or s.count <= 0:
                raise CorruptionError(f"live manifest {key}: segment {s.key} does not continue "
                                      f"at lsn {at}", segment=key, kind="bad_manifest")
            at = s.end_lsn
        if at != m.next_lsn or (m.segments and not
                                m.segments[0].first_lsn <= m.start_lsn < m.next_lsn):
            raise CorruptionError(f"live manifest {key}: segments end at {at}, next_lsn is "
                                  f"{m.next_lsn}, start_lsn {m.start_lsn}", segment=key,
                                  kind="bad_manifest")
        return m
