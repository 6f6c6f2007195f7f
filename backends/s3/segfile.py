"""The few fields of a segment file an archive needs (FORMAT.md sections 2 and 4).

Read from the bytes of a whole segment: the header (log UUID, segment number,
base and start LSN) and, for a sealed segment, the trailer and its frame-offset
index, so that a point-in-time restore can cut a segment after a given frame.
The C log remains the judge of a segment's integrity (``durkv.log.verify``); these
checks only make sure the archive's bookkeeping names the right file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from durkv.log import crc32c

__all__ = ["SegmentHeader", "SegmentTrailer", "read_header", "read_trailer", "cut_after",
           "HEADER_LEN", "TRAILER_LEN"]

HEADER_LEN = 64
TRAILER_LEN = 48
_MAGIC = b"DKVSEG\x00\x01"
_KNOWN_FLAGS = 1        # STEP_IDS (FORMAT.md section 2): as the C log, refuse any other bit
_SEAL_MAGIC = b"DKVSEAL\x01"
_HEADER = struct.Struct("<8sHHI16sQQQII")
_TRAILER = struct.Struct("<8sQQQQII")


@dataclass(frozen=True)
class SegmentHeader:
    log_uuid: str       # 32 lowercase hex digits
    segment_no: int
    base_lsn: int
    start_lsn: int


@dataclass(frozen=True)
class SegmentTrailer:
    frame_count: int
    first_lsn: int
    last_lsn: int
    data_end: int


def read_header(data: bytes) -> SegmentHeader | None:
    """The header of a segment's bytes, or None if they do not start with a valid one."""
    if len(data) < HEADER_LEN:
        return None
    magic, version, hlen, flags, uuid, seg_no, base, start, _prev, hcrc = _HEADER.unpack_from(
        data, 0)
    if (magic != _MAGIC or version != 1 or hlen != HEADER_LEN or flags & ~_KNOWN_FLAGS
            or hcrc != crc32c(memoryview(data)[:60])):
        return None
    return SegmentHeader(uuid.hex(), seg_no, base, start)


def read_trailer(data: bytes) -> SegmentTrailer | None:
    """The seal trailer of a segment's bytes, or None if it has no valid one."""
    if len(data) < HEADER_LEN + TRAILER_LEN:
        return None
    magic, count, first, last, data_end, _digest, _tcrc = _TRAILER.unpack_from(
        data, len(data) - TRAILER_LEN)
    if magic != _SEAL_MAGIC or data_end + 8 * count + TRAILER_LEN != len(data):
        return None
    if count and last - first + 1 != count:
        return None
    return SegmentTrailer(count, first, last, data_end)


def cut_after(data: bytes, lsn: int) -> bytes:
    """A sealed segment's bytes cut right after frame ``lsn``: its header and frames up to
    ``lsn``, without the footer (an unsealed active segment, as a crash after frame
    ``lsn`` leaves it). ``lsn`` must be in the segment."""
    t = read_trailer(data)
    if t is None:
        raise ValueError("not a sealed segment")
    if not t.first_lsn <= lsn <= t.last_lsn:
        raise ValueError(f"lsn {lsn} is not in segment {t.first_lsn}..{t.last_lsn}")
    if lsn == t.last_lsn:
        return data[:t.data_end]
    (off,) = struct.unpack_from("<Q", data, t.data_end + 8 * (lsn + 1 - t.first_lsn))
    return data[:off]
