"""Byte-surgery helpers for the segment-log tests (LevelDB ``log_test.cc`` style).

Everything here works on files as bytes and follows docs/FORMAT.md on its own
(a pure-Python CRC-32C and parsers for the segment header, frames and seal
footer), so a test can find "the length field of the frame at LSN 7" without
trusting the code under test to tell it where that is.

>>> crc32c(0, b"123456789") == 0xE3069283
True
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

SEG_MAGIC = b"DKVSEG\x00\x01"
SEAL_MAGIC = b"DKVSEAL\x01"
HEADER_LEN = 64
FRAME_HDR = 24          # crc len lsn type flags reserved sync_gap (FORMAT.md section 3)
FORMAT_VERSION = 1
SYNC_GAP_UNKNOWN = 0xFFFFFFFF
TRAILER_LEN = 48

# -- CRC-32C (Castagnoli), reflected 0x82F63B78, with pre/post inversion ----------

_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(seed: int, data: bytes) -> int:
    """CRC-32C continuing from ``seed`` (``crc32c(crc32c(0, a), b) == crc32c(0, a + b)``)."""
    crc = seed ^ 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# -- parsing (FORMAT.md sections 2-4) ----------------------------------------------


@dataclass
class SegHeader:
    version: int
    flags: int
    log_uuid: bytes
    segment_no: int
    base_lsn: int
    start_lsn: int
    prev_digest: int
    header_crc: int

    @property
    def seed(self) -> int:
        return crc32c(0, self.log_uuid + struct.pack("<Q", self.segment_no))


@dataclass
class Frame:
    offset: int          # file offset of the 24-byte header
    crc: int
    length: int
    lsn: int
    type: int
    flags: int
    payload: bytes
    sync_gap: int = 0

    @property
    def end(self) -> int:
        return self.offset + FRAME_HDR + self.length

    @property
    def durable(self) -> int:
        """The durable watermark D the writer recorded (0 when unknown, FORMAT.md section 3)."""
        if self.sync_gap == SYNC_GAP_UNKNOWN or self.sync_gap > self.lsn:
            return 0
        return self.lsn - self.sync_gap


@dataclass
class Trailer:
    offset: int          # file offset of the 48-byte trailer
    frame_count: int
    first_lsn: int
    last_lsn: int
    data_end: int
    segment_digest: int
    trailer_crc: int


def parse_header(data: bytes) -> SegHeader:
    assert data[:8] == SEG_MAGIC, data[:8]
    version, _hlen, flags = struct.unpack_from("<HHI", data, 8)
    uuid = data[16:32]
    segno, base, start = struct.unpack_from("<QQQ", data, 32)
    prev_digest, hcrc = struct.unpack_from("<II", data, 56)
    return SegHeader(version, flags, uuid, segno, base, start, prev_digest, hcrc)


def parse_trailer(data: bytes) -> Trailer | None:
    """The seal trailer, or None when the file does not end with a valid-looking one."""
    if len(data) < HEADER_LEN + TRAILER_LEN:
        return None
    off = len(data) - TRAILER_LEN
    if data[off:off + 8] != SEAL_MAGIC:
        return None
    count, first, last, data_end = struct.unpack_from("<QQQQ", data, off + 8)
    digest, tcrc = struct.unpack_from("<II", data, off + 40)
    return Trailer(off, count, first, last, data_end, digest, tcrc)


def parse_frames(data: bytes, hdr: SegHeader | None = None, end: int | None = None) -> list[Frame]:
    """Frames from offset 64 while they check out (seeded CRC, consecutive LSN).

    ``end`` bounds the scan (a sealed segment's ``data_end``); by default the
    trailer's data_end when the file is sealed, else the file size.
    """
    hdr = hdr or parse_header(data)
    if end is None:
        tr = parse_trailer(data)
        end = tr.data_end if tr else len(data)
    seed = hdr.seed
    frames: list[Frame] = []
    off, lsn = HEADER_LEN, hdr.base_lsn
    while off + FRAME_HDR <= end:
        crc, length, flsn, ftype, fflags, _res, gap = struct.unpack_from("<IIQBBHI", data, off)
        if off + FRAME_HDR + length > end or flsn != lsn:
            break
        body = data[off + 4:off + FRAME_HDR + length]
        if crc32c(seed, body) != crc:
            break
        frames.append(Frame(off, crc, length, flsn, ftype, fflags,
                            data[off + FRAME_HDR:off + FRAME_HDR + length], gap))
        off += FRAME_HDR + length
        lsn += 1
    return frames


@dataclass
class Segment:
    path: Path
    header: SegHeader
    frames: list[Frame]
    trailer: Trailer | None
    size: int

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def sealed(self) -> bool:
        return self.trailer is not None

    def structure_at(self, off: int) -> tuple[int, int]:
        """(start, end) of the on-disk structure holding byte ``off``: header, frame or footer."""
        if off < HEADER_LEN:
            return 0, HEADER_LEN
        for f in self.frames:
            if f.offset <= off < f.end:
                return f.offset, f.end
        if self.trailer and off >= self.trailer.data_end:
            return self.trailer.data_end, self.size
        last = self.frames[-1].end if self.frames else HEADER_LEN
        return last, self.size


def read_segment(path: str | os.PathLike) -> Segment:
    p = Path(path)
    data = p.read_bytes()
    hdr = parse_header(data)
    return Segment(p, hdr, parse_frames(data, hdr), parse_trailer(data), len(data))


HEAD_MAGIC = b"DKVHEAD\x01"
HEAD_LEN = 64


@dataclass
class Head:
    """The HEAD file (FORMAT.md section 2a): the newest segment and the repair epoch."""

    log_uuid: bytes
    segment_no: int
    base_lsn: int
    epoch: int


def read_head(d: str | os.PathLike) -> Head | None:
    p = Path(d) / "HEAD"
    if not p.exists():
        return None
    data = p.read_bytes()
    assert len(data) == HEAD_LEN and data[:8] == HEAD_MAGIC, data
    assert crc32c(0, data[:60]) == struct.unpack_from("<I", data, 60)[0]
    segno, base, epoch = struct.unpack_from("<QQQ", data, 24)
    return Head(data[8:24], segno, base, epoch)


def write_head(d: str | os.PathLike, head: Head) -> None:
    """Write HEAD as the writer would (FORMAT.md section 2a), for crash-state surgery."""
    body = HEAD_MAGIC + head.log_uuid + struct.pack("<QQQ", head.segment_no, head.base_lsn,
                                                    head.epoch) + b"\x00" * 12
    (Path(d) / "HEAD").write_bytes(body + struct.pack("<I", crc32c(0, body)))


def name_newest_in_head(d: str | os.PathLike, seg: Segment) -> None:
    """Point HEAD at ``seg`` (what HEAD holds before the writer created a later segment)."""
    h = read_head(d)
    assert h is not None
    write_head(d, Head(h.log_uuid, seg.header.segment_no, seg.header.base_lsn, h.epoch))


# -- files -------------------------------------------------------------------------


def segment_files(d: str | os.PathLike) -> list[Path]:
    """The segment files of a log directory, in name (= log) order."""
    return sorted(Path(d).glob("*.seg"))


def segments(d: str | os.PathLike) -> list[Segment]:
    return [read_segment(p) for p in segment_files(d)]


def frame_at(d: str | os.PathLike, lsn: int) -> tuple[Segment, Frame]:
    """The segment and frame that hold ``lsn``, found by parsing the files."""
    for seg in segments(d):
        for f in seg.frames:
            if f.lsn == lsn:
                return seg, f
    raise KeyError(lsn)


def flip_byte(path: str | os.PathLike, off: int, mask: int = 0x01) -> int:
    """XOR the byte at ``off`` with ``mask`` (one bit by default); returns the old byte."""
    with open(path, "r+b") as f:
        f.seek(off)
        old = f.read(1)[0]
        f.seek(off)
        f.write(bytes([old ^ mask]))
    return old


def set_bytes(path: str | os.PathLike, off: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)


def truncate(path: str | os.PathLike, size: int) -> None:
    os.truncate(path, size)


def zero_range(path: str | os.PathLike, off: int, n: int) -> None:
    set_bytes(path, off, b"\x00" * n)


def append_garbage(path: str | os.PathLike, n: int, *, seed: int = 1, zeros: bool = False) -> bytes:
    """Append ``n`` deterministic pseudo-random (or zero) bytes; returns them."""
    data = b"\x00" * n if zeros else pseudo_random(n, seed)
    with open(path, "ab") as f:
        f.write(data)
    return data


def fix_frame_crc(path: str | os.PathLike, frame_off: int) -> None:
    """Recompute a frame's seeded CRC after a field was changed (LevelDB ``FixChecksum``)."""
    data = Path(path).read_bytes()
    hdr = parse_header(data)
    length = struct.unpack_from("<I", data, frame_off + 4)[0]
    body = data[frame_off + 4:frame_off + FRAME_HDR + length]
    set_bytes(path, frame_off, struct.pack("<I", crc32c(hdr.seed, body)))


def pseudo_random(n: int, seed: int | str = 0) -> bytes:
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=64).digest()
        i += 1
    return bytes(out[:n])


def payload(i: int, size: int = 32, tag: str = "p") -> bytes:
    """Deterministic payload number ``i``: readable prefix, then pseudo-random filler."""
    head = f"{tag}{i:08d}:".encode()
    if size <= len(head):
        return head[:size]
    return head + pseudo_random(size - len(head), f"{tag}{i}")


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def snapshot(d: str | os.PathLike) -> dict[str, str]:
    """Relative path -> content hash of every file under ``d`` (LOCK excluded)."""
    root = Path(d)
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "LOCK":
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def total_bytes(d: str | os.PathLike) -> int:
    """Bytes in segments plus quarantine/: recovery may move bytes, never lose them."""
    root = Path(d)
    n = sum(p.stat().st_size for p in segment_files(root))
    q = root / "quarantine"
    if q.is_dir():
        n += sum(p.stat().st_size for p in q.rglob("*") if p.is_file())
    return n


def quarantine_files(d: str | os.PathLike) -> list[Path]:
    q = Path(d) / "quarantine"
    return sorted(p for p in q.rglob("*") if p.is_file()) if q.is_dir() else []


def copy_log(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("LOCK"))
    return Path(dst)


# -- building logs through the API ---------------------------------------------------


def make_log(d: str | os.PathLike, n: int, size: int = 32, segment_bytes: int | None = None,
             seal: bool = True, *, per_segment: int | None = None, tail: int = 0,
             tag: str = "p", synced: bool = True) -> list[bytes]:
    """Write a log of ``n`` frames of ``size`` bytes and close it; returns the payloads.

    ``per_segment``: call ``seal()`` after every that many frames (small sealed
    segments without depending on the roll threshold). ``seal``: seal the last
    segment of the ``n`` too. ``tail``: then append that many more frames to the
    new active segment (so the log ends with an unsealed segment holding frames).
    ``synced``: flush after every append, so each frame records (``sync_gap``) that
    every earlier frame was durable before it was written: damage to any frame but
    the last of the active segment is then corruption, not a torn tail (FORMAT.md
    section 6). ``synced=False`` leaves the frames of each segment one unsynced group.
    """
    from durkv.log import SegmentLog

    kw = {} if segment_bytes is None else {"segment_bytes": segment_bytes}
    payloads = [payload(i, size, tag) for i in range(n + tail)]
    with SegmentLog.open(str(d), durability="exit", **kw) as log:
        for i in range(n):
            assert log.append(payloads[i]) == i
            if synced:
                log.flush()
            if per_segment and (i + 1) % per_segment == 0 and i + 1 < n:
                log.seal()
        if seal and n:
            log.seal()
        for i in range(n, n + tail):
            assert log.append(payloads[i]) == i
            if synced:
                log.flush()
        log.flush()
    return payloads


def damages(x) -> list:
    """Normalise a Report / list / single Damage / None to a list of damage records."""
    if x is None:
        return []
    if hasattr(x, "damage"):
        return list(x.damage)
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]
