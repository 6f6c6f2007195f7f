"""``durkv archive``: copy a store's sealed segments to S3, create-only (FORMAT.md 10).

Idempotent and resumable: every object is written with ``If-None-Match: *``; a key
that already holds the same segment counts as written, a key that holds anything
else is :class:`~durkv.errors.ArchiveConflictError` and stays as it is. A run cut
short between the segment PUTs and the manifest PUT is completed by the next run.

>>> # archive_dir("./agent.durkv", S3Location.parse("s3://bucket/agents/a1"))
"""

from __future__ import annotations

import functools
import os
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import zstandard

from durkv import log as seglog
from durkv.errors import ArchiveConflictError, BackendError, ConfigError, CorruptionError

from .client import (
    KeyExistsError, NoSuchKeyError, S3Location, crc32c_b64, in_order, translate,
)
from .manifest import MANIFESTS, Manifest, SegmentEntry, manifest_key, manifest_no_of, segment_key
from .segfile import HEADER_LEN, SegmentHeader, read_header, read_trailer

__all__ = ["archive_dir", "latest_manifest", "current_manifest", "ArchiveResult", "ENCODINGS"]

ENCODINGS = ("identity", "zstd")
_MANIFEST_RETRIES = 8


@dataclass
class ArchiveResult:
    """What one archive call did."""

    url: str
    manifest_no: int | None         # the current manifest after the call (None: none yet)
    manifest_written: bool
    uploaded: list[int] = field(default_factory=list)     # segment numbers PUT now
    already: list[int] = field(default_factory=list)      # found in the archive (412, same)
    listed: int = 0                                        # segments the manifest lists
    bytes_uploaded: int = 0
    puts: int = 0
    next_lsn: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def latest_manifest(loc: S3Location, *, page_size: int = 1000) -> Manifest | None:
    """The highest-numbered manifest under the prefix (one paged LIST + one GET)."""
    best = None
    for key in loc.list_keys(MANIFESTS, page_size=page_size):
        n = manifest_no_of(key)
        if n is not None and (best is None or n > best):
            best = n
    return None if best is None else read_manifest(loc, best)


# The newest manifest this process read or wrote, per archive: a later archive call checks
# it is still there with one HEAD instead of a LIST and a GET. If another archiver wrote a
# newer one meanwhile, the create-only PUT of the next number gets 412 and the archive
# re-reads (LIST) and rebases, so a stale entry costs a retry, never a wrong manifest.
_KNOWN: dict[tuple[str, str], Manifest] = {}
_KNOWN_LOCK = threading.Lock()


def _known_key(loc: S3Location) -> tuple[str, str]:
    return loc.url, str(getattr(loc.s3().meta, "endpoint_url", ""))


def _remember(loc: S3Location, m: Manifest) -> None:
    with _KNOWN_LOCK:
        _KNOWN[_known_key(loc)] = m


def current_manifest(loc: S3Location, *, page_size: int = 1000) -> Manifest | None:
    """The archive's newest manifest: the one this process last saw if it still exists
    (one HEAD), else found by listing (:func:`latest_manifest`)."""
    with _KNOWN_LOCK:
        known = _KNOWN.get(_known_key(loc))
    if known is not None:
        key = loc.key(manifest_key(known.manifest_no))
        try:
            with translate(loc, "head " + key):
                loc.s3().head_object(Bucket=loc.bucket, Key=key)
            return known
        except NoSuchKeyError:
            pass
    m = latest_manifest(loc, page_size=page_size)
    if m is not None:
        _remember(loc, m)
    return m


def read_manifest(loc: S3Location, n: int) -> Manifest:
    key = loc.key(manifest_key(n))
    with translate(loc, "get " + key):
        body = loc.s3().get_object(Bucket=loc.bucket, Key=key)["Body"].read()
    return Manifest.from_json(body, key)


def _read_segment(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError as exc:
        raise BackendError(f"segment {path} was removed while it was archived (a compaction "
                           "ran meanwhile); run archive again", path=path) from exc


@dataclass
class _Local:
    path: str
    header: SegmentHeader
    entry: SegmentEntry


def _local_sealed(path: str) -> tuple[list[_Local], str]:
    """The store's sealed segments, checked by the C verify first (a damaged segment is
    never archived), and the store's log UUID."""
    report = seglog.verify(path)
    bad = [d for d in report.damage if d.kind != "torn_tail"]
    if bad:
        d = bad[0]
        raise CorruptionError(f"store {path} is damaged ({d.segment} offset {d.offset}: "
                              f"{d.kind}); nothing archived. Run durkv verify {path}",
                              segment=d.segment, offset=d.offset, kind=d.kind)
    out = []
    for s in report.segments:
        if not s.sealed:
            continue
        fpath = os.path.join(path, s.segment)
        data = _read_segment(fpath)
        h, t = read_header(data), read_trailer(data)
        if h is None or t is None or h.base_lsn != s.base_lsn or t.frame_count != s.frames_ok:
            raise CorruptionError(f"segment {fpath} changed while it was read; try again",
                                  segment=s.segment, kind="bad_seal")
        crc = seglog.crc32c(data)
        out.append(_Local(fpath, h, SegmentEntry(
            segment_no=h.segment_no, key=segment_key(h.segment_no), file=s.segment,
            base_lsn=h.base_lsn, last_lsn=t.last_lsn, start_lsn=h.start_lsn,
            frames=t.frame_count, bytes=len(data),
            crc32c=crc, encoding="identity", object_bytes=len(data), object_crc32c=crc,
            sealed_at_ns=os.stat(fpath).st_mtime_ns)))
    return out, out[-1].header.log_uuid if out else _active_log_uuid(path, report)


def _active_log_uuid(path: str, report: seglog.Report) -> str:
    """The log UUID in the header of the newest segment whose header reads (with nothing
    sealed yet, the active segment's): what decides whether an archive prefix holds this
    store's log."""
    for s in reversed(report.segments):
        with open(os.path.join(path, s.segment), "rb") as f:
            h = read_header(f.read(HEADER_LEN))
        if h is not None:
            return h.log_uuid
    raise CorruptionError(f"store {path}: no segment has a readable header; nothing "
                          f"archived. Run durkv verify {path}", kind="bad_header")


def archive_dir(path: str | os.PathLike, loc: S3Location, *, encoding: str = "identity",
                page_size: int = 1000,
                progress: Callable[[int, int], None] | None = None) -> ArchiveResult:
    """Archive the sealed segments of the store directory ``path`` to ``loc``.

    Takes no lock: sealed segments never change, so a writer may keep running (its
    active segment is not archived; seal it first to include it). Raises
    ArchiveConflictError if the archive holds another log or other bytes at one of
    this log's keys, CorruptionError if the local store is damaged.
    """
    path = os.fspath(path)
    if encoding not in ENCODINGS:
        raise ConfigError(f"encoding must be one of {', '.join(ENCODINGS)}; got {encoding!r}")
    local, log_uuid = _local_sealed(path)
    res = ArchiveResult(url=loc.url, manifest_no=None, manifest_written=False)
    prev = current_manifest(loc, page_size=page_size)
    # Checked before anything is reported, even with nothing sealed to upload: another
    # log's manifest must never be reported as this store's archive.
    _check_same_log(loc, prev, log_uuid)
    if prev is not None:
        res.manifest_no = prev.manifest_no
        res.listed = len(prev.segments)
        res.next_lsn = prev.next_lsn
    if not local:
        return res
    archived = {e.segment_no: e for e in (prev.segments if prev else ())}
    todo = []
    for seg in local:
        old = archived.get(seg.entry.segment_no)
        if old is None:
            todo.append(seg)
        elif not old.same_content(seg.entry):
            raise ArchiveConflictError(
                f"{loc.url}: segment {old.segment_no} ({old.key}) in manifest "
                f"{prev.manifest_no} holds {old.bytes} bytes crc32c {old.crc32c:08x}, but "
                f"{seg.path} has {seg.entry.bytes} bytes crc32c {seg.entry.crc32c:08x}: this "
                "store forked from the archived one; archive it to a new prefix",
                url=loc.url, key=loc.key(old.key))
    put = functools.partial(_put_segment, loc, encoding=encoding, log_uuid=log_uuid)
    for done, (entry, sent) in enumerate(in_order(put, todo), 1):
        archived[entry.segment_no] = entry
        res.puts += 1
        if sent is None:
            res.already.append(entry.segment_no)
        else:
            res.uploaded.append(entry.segment_no)
            res.bytes_uploaded += sent
        if progress:
            progress(done, len(todo))
    for _ in range(_MANIFEST_RETRIES):
        newest = max(archived.values(), key=lambda e: e.segment_no)
        start_lsn = newest.start_lsn    # the header of the newest segment rules (FORMAT.md 7)
        chain = _chain(loc, archived, start_lsn, newest)
        if prev is not None and prev.start_lsn == start_lsn and _same(prev.segments, chain):
            return res
        n = 0 if prev is None else prev.manifest_no + 1
        m = Manifest(manifest_no=n, prev_manifest_no=None if prev is None else prev.manifest_no,
                     log_uuid=log_uuid, start_lsn=start_lsn, next_lsn=chain[-1].last_lsn + 1,
                     created_at_ns=time.time_ns(), segments=chain,
                     writer_epoch=0 if prev is None else prev.writer_epoch)
        if _put_manifest(loc, m, res):
            _remember(loc, m)
            return res
        # Another archiver of this log took number n: rebase onto its manifest.
        prev = latest_manifest(loc, page_size=page_size)
        assert prev is not None
        _remember(loc, prev)
        _check_same_log(loc, prev, log_uuid)
        res.manifest_no, res.listed, res.next_lsn = (prev.manifest_no, len(prev.segments),
                                                     prev.next_lsn)
        for e in prev.segments:
            mine = archived.get(e.segment_no)
            if mine is not None and not mine.same_content(e):
                raise ArchiveConflictError(
                    f"{loc.url}: manifest {prev.manifest_no}, written meanwhile, lists other "
                    f"content for segment {e.segment_no}; archive this store to a new prefix",
                    url=loc.url)
            if mine is None:
                archived[e.segment_no] = e
    raise ArchiveConflictError(f"{loc.url}: the manifest number kept being taken by another "
                               f"archiver ({_MANIFEST_RETRIES} tries); run archive again",
                               url=loc.url)


def _same(a: list[SegmentEntry], b: list[SegmentEntry]) -> bool:
    return [(e.segment_no, e.crc32c) for e in a] == [(e.segment_no, e.crc32c) for e in b]


def _check_same_log(loc: S3Location, prev: Manifest | None, log_uuid: str) -> None:
    if prev is not None and prev.log_uuid != log_uuid:
        raise ArchiveConflictError(
            f"{loc.url} holds the archive of log {prev.log_uuid}, not of this store (log "
            f"{log_uuid}); archive it to another prefix", url=loc.url)


def _chain(loc: S3Location, archived: dict[int, SegmentEntry], start_lsn: int,
           newest: SegmentEntry) -> list[SegmentEntry]:
    """The segments from the one holding start_lsn to the newest, without a gap."""
    chain = [newest]
    while chain[0].base_lsn > start_lsn:
        below = archived.get(chain[0].segment_no - 1)
        if below is None:
            raise ConfigError(
                f"cannot archive to {loc.url}: the store starts at lsn {start_lsn} but segment "
                f"{chain[0].segment_no - 1} (below lsn {chain[0].base_lsn}) is neither local "
                "(a compaction removed it before it was archived) nor archived; commit once "
                "more and run durkv archive --seal, so that the segment the compaction "
                "started is sealed and archived", url=loc.url)
        chain.insert(0, below)
    return chain


def _put_segment(loc: S3Location, seg: _Local, *, encoding: str, log_uuid: str
                 ) -> tuple[SegmentEntry, int | None]:
    """PUT one segment create-only (runs in a worker thread). Returns its manifest entry
    and the bytes sent, or None if the archive already held it."""
    data = _read_segment(seg.path)
    e = seg.entry
    if len(data) != e.bytes or seglog.crc32c(data) != e.crc32c:
        raise CorruptionError(f"segment {seg.path} changed between verify and upload; a sealed "
                              "segment never changes: check the disk", segment=e.file,
                              kind="checksum_mismatch")
    body = data
    if encoding == "zstd":
        body = zstandard.ZstdCompressor(level=3).compress(data)
        e = replace(e, encoding="zstd", object_bytes=len(body),
                    object_crc32c=seglog.crc32c(body))
    key = loc.key(e.key)
    meta = {
        "durkv-format": "1", "durkv-log-uuid": log_uuid, "durkv-segment-no": str(e.segment_no),
        "durkv-base-lsn": str(e.base_lsn), "durkv-last-lsn": str(e.last_lsn),
        "durkv-bytes": str(e.bytes), "durkv-crc32c": str(e.crc32c),
        "durkv-encoding": e.encoding, "durkv-put-id": uuid.uuid4().hex,
    }
    try:
        with translate(loc, "put " + key):
            loc.s3().put_object(Bucket=loc.bucket, Key=key, Body=body, IfNoneMatch="*",
                                ChecksumAlgorithm="CRC32C",
                                ChecksumCRC32C=crc32c_b64(e.object_crc32c), Metadata=meta,
                                ContentType="application/octet-stream")
    except KeyExistsError:
        return _existing_segment(loc, key, e, log_uuid), None
    return e, len(body)


def _existing_segment(loc: S3Location, key: str, e: SegmentEntry, log_uuid: str
                      ) -> SegmentEntry:
    """The key was taken: the same segment (a re-run, a lost response) or a conflict."""
    with translate(loc, "head " + key):
        head = loc.s3().head_object(Bucket=loc.bucket, Key=key)
    meta = head.get("Metadata", {})
    theirs = (meta.get("durkv-log-uuid"), meta.get("durkv-bytes"), meta.get("durkv-crc32c"))
    if theirs != (log_uuid, str(e.bytes), str(e.crc32c)):
        raise ArchiveConflictError(
            f"{loc.url}: {key} already holds other content (log {theirs[0]}, {theirs[1]} "
            f"bytes, crc32c {theirs[2]}) than segment {e.segment_no} of this store (log "
            f"{log_uuid}, {e.bytes} bytes, crc32c {e.crc32c}); left untouched: archive to "
            "another prefix", url=loc.url, key=key)
    enc = meta.get("durkv-encoding", "identity")
    if enc == e.encoding:
        return e
    # An earlier run uploaded it with the other encoding: describe the object as it is.
    with translate(loc, "get " + key):
        body = loc.s3().get_object(Bucket=loc.bucket, Key=key)["Body"].read()
    return replace(e, encoding=enc, object_bytes=len(body), object_crc32c=seglog.crc32c(body))


def _put_manifest(loc: S3Location, m: Manifest, res: ArchiveResult) -> bool:
    """PUT manifest ``m`` create-only; False if its number is taken."""
    m.check(manifest_key(m.manifest_no))
    body = m.to_json()
    key = loc.key(manifest_key(m.manifest_no))
    res.puts += 1
    try:
        with translate(loc, "put " + key):
            loc.s3().put_object(Bucket=loc.bucket, Key=key, Body=body, IfNoneMatch="*",
                                ChecksumAlgorithm="CRC32C",
                                ChecksumCRC32C=crc32c_b64(seglog.crc32c(body)),
                                ContentType="application/json")
    except KeyExistsError:
        return False
    res.manifest_no = m.manifest_no
    res.manifest_written = True
    res.listed = len(m.segments)
    res.next_lsn = m.next_lsn
    return True
