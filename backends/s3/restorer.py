"""``durkv restore``: rebuild a store directory from an archive (FORMAT.md section 10).

All or nothing: the segments are downloaded into a new temporary directory beside
the target, every byte is checked (object size and CRC-32C, the decoded segment's
size and CRC-32C, its header against the manifest, then the C ``verify`` of the
whole directory), and only then is the directory renamed to the target. Any failure
names the object key and removes the temporary directory.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Callable

import zstandard

from durkv import log as seglog
from durkv.errors import ConfigError, CorruptionError, NotFoundError
from durkv.fsync import fsync_dir, fsync_file

from .archiver import read_manifest
from .client import NoSuchKeyError, S3Location, in_order, translate
from .manifest import MANIFESTS, Manifest, SegmentEntry, manifest_no_of
from .segfile import cut_after, read_header

__all__ = ["restore_dir", "RestorePlan", "plan_restore"]


@dataclass
class RestorePlan:
    """Which manifest, which segments, and where the last one is cut."""

    url: str
    manifest_no: int
    log_uuid: str
    segments: list[SegmentEntry]
    cut_after_lsn: int | None           # None: the last segment is restored whole (sealed)
    next_lsn: int                       # LSN the restored store's next commit gets
    bytes: int = 0
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "manifest_no": self.manifest_no, "log_uuid": self.log_uuid,
                "segments": [e.segment_no for e in self.segments],
                "files": [e.file for e in self.segments],
                "cut_after_lsn": self.cut_after_lsn, "next_lsn": self.next_lsn,
                "bytes": self.bytes}


def _manifest_numbers(loc: S3Location, page_size: int) -> list[int]:
    nums = [n for n in (manifest_no_of(k) for k in loc.list_keys(MANIFESTS, page_size=page_size))
            if n is not None]
    if not nums:
        raise NotFoundError(f"no durkv archive at {loc.url}: no manifest under "
                            f"{loc.key(MANIFESTS)}")
    return sorted(nums, reverse=True)


def plan_restore(loc: S3Location, *, to_lsn: int | None = None, to_time_ns: int | None = None,
                 page_size: int = 1000) -> RestorePlan:
    """Choose the manifest and segments for a restore (nothing is downloaded).

    ``to_lsn``: the newest manifest whose segments hold that LSN; the restore ends with
    it. ``to_time_ns``: the newest manifest with a segment sealed at or before that
    time; the restore ends with the last such segment.
    """
    if to_lsn is not None and to_time_ns is not None:
        raise ConfigError("give --to-lsn or --to-time, not both")
    if to_lsn is not None and to_lsn < 0:
        raise ConfigError(f"--to-lsn must be >= 0, got {to_lsn}")
    newest = None
    for n in _manifest_numbers(loc, page_size):
        m = read_manifest(loc, n)
        newest = newest or m
        segs, cut = m.segments, None
        if to_lsn is not None:
            if to_lsn >= m.next_lsn:
                if m is newest:
                    raise NotFoundError(f"{loc.url} ends at lsn {m.next_lsn - 1} (manifest "
                                        f"{m.manifest_no}); --to-lsn {to_lsn} is past it")
                continue
            segs = [e for e in segs if e.base_lsn <= to_lsn]
            cut = to_lsn if segs and segs[-1].last_lsn != to_lsn else None
        elif to_time_ns is not None:
            kept: list[SegmentEntry] = []
            for e in segs:
                if e.sealed_at_ns > to_time_ns:
                    break
                kept.append(e)
            segs = kept
        if not segs:
            continue
        # The last restored segment's header decides where the log starts (FORMAT.md 7):
        # the segments below it are dead, the ones from it on must all be there.
        need = segs[-1].start_lsn
        segs = [e for e in segs if e.last_lsn >= need]
        if segs and segs[0].base_lsn <= need and (to_lsn is None or to_lsn >= need):
            return _plan(loc, m, segs, cut)
    what = f"lsn {to_lsn}" if to_lsn is not None else "that time"
    raise NotFoundError(f"no manifest of {loc.url} covers {what}: it was compacted away or "
                        "archived later")


def _plan(loc: S3Location, m: Manifest, segs: list[SegmentEntry],
          cut: int | None) -> RestorePlan:
    next_lsn = cut + 1 if cut is not None else segs[-1].last_lsn + 1
    return RestorePlan(url=loc.url, manifest_no=m.manifest_no, log_uuid=m.log_uuid,
                       segments=list(segs), cut_after_lsn=cut, next_lsn=next_lsn,
                       bytes=sum(e.bytes for e in segs), files=[e.file for e in segs])


def _fetch(loc: S3Location, plan: RestorePlan, e: SegmentEntry) -> bytes:
    """One segment's bytes, every check passed; CorruptionError naming the key otherwise."""
    key = loc.key(e.key)

    def bad(kind: str, why: str) -> CorruptionError:
        return CorruptionError(f"archive object {key} (segment {e.segment_no} of manifest "
                               f"{plan.manifest_no}): {why}; nothing was restored",
                               segment=key, kind=kind, url=loc.url)

    try:
        with translate(loc, "get " + key):
            body = loc.s3().get_object(Bucket=loc.bucket, Key=key)["Body"].read()
    except NoSuchKeyError as exc:
        raise bad("missing_segment", "the object is missing") from exc
    if len(body) != e.object_bytes:
        kind = "truncated" if len(body) < e.object_bytes else "checksum_mismatch"
        raise bad(kind, f"{len(body)} bytes, the manifest says {e.object_bytes}")
    crc = seglog.crc32c(body)
    if crc != e.object_crc32c:
        raise bad("checksum_mismatch", f"crc32c {crc:08x}, the manifest says "
                                       f"{e.object_crc32c:08x}")
    if e.encoding == "zstd":
        try:
            body = zstandard.ZstdDecompressor().decompress(body, max_output_size=e.bytes)
        except zstandard.ZstdError as exc:
            raise bad("checksum_mismatch", f"zstd: {exc}") from exc
        crc = seglog.crc32c(body)
    elif e.encoding != "identity":
        raise bad("bad_manifest", f"unknown encoding {e.encoding!r}")
    if len(body) != e.bytes or crc != e.crc32c:
        raise bad("checksum_mismatch", "the decoded segment does not match the manifest's "
                                       "size and crc32c")
    h = read_header(body)
    if h is None or (h.log_uuid, h.segment_no, h.base_lsn) != (
            plan.log_uuid, e.segment_no, e.base_lsn):
        raise bad("foreign_segment", "its header is not segment "
                                     f"{e.segment_no} of log {plan.log_uuid}")
    return body


def _write(path: str, data: bytes, mtime_ns: int | None) -> None:
    """Write a new file (its fsync runs in the background: :func:`restore_dir`)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def restore_target(dest: str | os.PathLike) -> tuple[str, str]:
    """``dest`` as an absolute path that is new (or an empty directory), and a new
    temporary directory beside it to build the restore in and rename into place, so that
    a failed restore never leaves a partial ``dest``."""
    dest = os.path.abspath(os.fspath(dest))
    if os.path.lexists(dest) and not (os.path.isdir(dest) and not os.listdir(dest)):
        raise ConfigError(f"{dest} exists and is not an empty directory; restore into a new "
                          "directory (nothing was changed)")
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    return dest, tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.restore-", dir=parent)


def move_into_place(tmp: str, dest: str) -> None:
    """Rename the finished restore over ``dest`` and make the rename durable."""
    os.rename(tmp, dest)
    fsync_dir(os.path.dirname(dest))


def restore_dir(loc: S3Location, dest: str | os.PathLike, plan: RestorePlan,
                progress: Callable[[int, int], None] | None = None) -> seglog.Report:
    """Restore ``plan`` into the new directory ``dest``; returns the verify report."""
    dest, tmp = restore_target(dest)
    try:
        # Downloads run ahead (in_order) while this thread writes each file and hands its
        # fsync to two background threads, so the disk flushes while the network works.
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="durkv-fsync") as syncs, \
                closing(in_order(functools.partial(_fetch, loc, plan), plan.segments)) as got:
            synced = []
            for i, (e, data) in enumerate(zip(plan.segments, got)):
                last = i == len(plan.segments) - 1
                if last and plan.cut_after_lsn is not None:
                    data, mtime = cut_after(data, plan.cut_after_lsn), None
                else:
                    mtime = e.sealed_at_ns
                path = os.path.join(tmp, e.file)
                _write(path, data, mtime)
                synced.append(syncs.submit(fsync_file, path))
                if progress:
                    progress(i + 1, len(plan.segments))
            for f in synced:
                f.result()      # every file is durable before the rename makes it the store
        fsync_dir(tmp)
        report = seglog.verify(tmp, deep=False)
        if not report.ok or report.next_lsn != plan.next_lsn:
            d = report.damage[0] if report.damage else None
            seg = next((e for e in plan.segments if d and e.file == d.segment), None)
            where = loc.key(seg.key) if seg else loc.url
            why = (f"{d.kind} at offset {d.offset} ({d.detail})" if d else
                   f"it ends at lsn {report.next_lsn - 1}, the manifest at {plan.next_lsn - 1}")
            raise CorruptionError(f"archive object {where}: the restored log does not verify: "
                                  f"{why}; nothing was restored", segment=where,
                                  kind=d.kind if d else "truncated", url=loc.url)
        move_into_place(tmp, dest)
        return report
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
