"""What a cut removed: the runs and threads whose records can still be read from its bytes.

``recover --skip-corrupt`` copies every byte it cuts to ``quarantine/`` and leaves a note
(:mod:`durkv.repairnotes`, docs/FORMAT.md section 6a). This module reads those copies
back as frames -- a frame counts only if its CRC-32C verifies with its segment's seed
(FORMAT.md section 3), so garbage never names a run -- and lists the run ids and thread
ids in the store records it finds. The damaged frame itself never verifies: what it held
is unknown, and :mod:`durkv.runtime.repair` applies the conservative rule for that.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field

from ..errors import CorruptionError
from ..log import crc32c
from .records import (
    K_CKPT, K_COPY_CKPT, K_COPY_JOURNAL, K_COPY_THREAD, K_COPY_WRITES, K_DEL_JOURNAL,
    K_DEL_THREAD, K_JOURNAL, K_REMOVE, K_REPAIR, K_WRITES, read_head,
)

__all__ = ["CutContents", "read_cut", "local_path"]

_SEG_HDR = 64
_FRAME = struct.Struct("<IIQBBHI")   # crc len lsn type flags reserved sync_gap (FORMAT.md 3)
_COMMIT = 2
_MAX_LEN = (1 << 30) - 1
# quarantine/<segment>.<offset>.torn[.N] (FORMAT.md section 1)
_QNAME = re.compile(r"^([0-9a-f]{16}\.seg)\.(\d+)\.torn(?:\.\d+)?$")
_RUN_KINDS = (K_JOURNAL, K_COPY_JOURNAL)
_THREAD_KINDS = (K_CKPT, K_COPY_CKPT, K_WRITES, K_COPY_WRITES, K_DEL_THREAD)


@dataclass
class CutContents:
    """Ids read from a cut's bytes. ``unread``: LSNs between the cut's first lost LSN and
    the last frame read that no verifying frame holds (-1: no frame could be read)."""

    runs: set[str] = field(default_factory=set)
    threads: set[str] = field(default_factory=set)
    frames: int = 0
    unread: int = -1


def local_path(backend: object) -> str | None:
    """The store directory of a local backend (repairs exist only there), else None."""
    path = getattr(backend, "path", None)
    return path if isinstance(path, str) and os.path.isdir(path) else None


def _seed(header: bytes) -> int | None:
    """The frame-checksum seed of a segment (crc32c of uuid || segment_no), from its
    64-byte header; None when the header does not verify."""
    if len(header) < _SEG_HDR or header[:8] != b"DKVSEG\x00\x01":
        return None
    if crc32c(header[:60]) != struct.unpack_from("<I", header, 60)[0]:
        return None
    return crc32c(header[16:40])


def _header_of(path: str, seg: str, off: int, data: bytes) -> bytes:
    """A quarantined whole file starts with its header; a cut tail's header is the one
    of the segment file it was cut from (still in place, or quarantined whole later)."""
    if off == 0:
        return data[:_SEG_HDR]
    try:
        with open(os.path.join(path, seg), "rb") as f:
            return f.read(_SEG_HDR)
    except OSError:
        return b""


def _frames(data: bytes, start: int, seed: int):
    """(lsn, type, payload) of every frame of ``data`` from ``start`` that verifies;
    past bytes that do not, resync one byte at a time (FORMAT.md section 9)."""
    pos, end = start, len(data)
    while pos + _FRAME.size <= end:
        crc, ln, lsn, typ, flags, res, _gap = _FRAME.unpack_from(data, pos)
        stop = pos + _FRAME.size + ln
        if (typ in (1, 2) and res == 0 and flags <= 1 and ln <= _MAX_LEN and stop <= end
                and crc32c(data[pos + 4:stop], seed) == crc):
            yield lsn, typ, data[pos + _FRAME.size:stop]
            pos = stop
        else:
            pos += 1


def _ids(out: CutContents, payload: bytes, lsn: int) -> None:
    try:
        h = read_head(payload, lsn)
    except CorruptionError:
        return          # a frame of the log that is not a store record: nothing to name
    kind = h[0]
    args = h[1:]
    if kind in _RUN_KINDS and args and type(args[0]) is str:
        out.runs.add(args[0])
    elif kind in (K_REPAIR, K_DEL_JOURNAL, K_COPY_JOURNAL) and args and type(args[0]) is list:
        out.runs.update(r for r in args[0] if type(r) is str)     # a lost delete too
    elif kind in _THREAD_KINDS and args and type(args[0]) is str:
        out.threads.add(args[0])
    elif kind == K_COPY_THREAD:
        out.threads.update(t for t in args[:2] if type(t) is str)
    elif kind == K_REMOVE and args and type(args[0]) is list:
        out.threads.update(d[0] for d in args[0]
                           if type(d) is list and d and type(d[0]) is str)


def read_cut(path: str, files: list[str], lost_first_lsn: int) -> CutContents:
    """The ids in the quarantined files ``files`` (names in ``path/quarantine/``) of a cut
    whose first lost LSN is ``lost_first_lsn``."""
    out = CutContents()
    lsns: set[int] = set()
    for name in files:
        m = _QNAME.match(name)
        if m is None:
            continue
        try:
            with open(os.path.join(path, "quarantine", name), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue        # moved away by hand: its frames count as unread
        off = int(m.group(2))
        seed = _seed(_header_of(path, m.group(1), off, data))
        if seed is None:
            continue        # its frames cannot be told from garbage: all unread
        for lsn, typ, payload in _frames(data, _SEG_HDR if off == 0 else 0, seed):
            if lsn < lost_first_lsn:
                continue    # an older use of these bytes: not this cut's
            lsns.add(lsn)
            if typ == _COMMIT:
                _ids(out, payload, lsn)
    out.frames = len(lsns)
    if lsns:
        out.unread = max(lsns) + 1 - lost_first_lsn - len(lsns)
    return out
