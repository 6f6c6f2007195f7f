"""``durkv restore``: rebuild a store directory from an archive (FORMAT.md section 10).

All or nothing: the segments are downloaded into a new staging directory (beside a
new target; inside an existing empty one, which keeps its inode, mode and owner:
:class:`RestoreTarget`), every byte is checked (object size and CRC-32C, the decoded
segment's size and CRC-32C, its header against the manifest, then the C ``verify`` of
the whole directory), and only then is it put in place. Any failure names the object
key and removes the staging directory.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import zstandard

from durkv import log as seglog
from durkv.errors import ConfigError, CorruptionError, NotFoundError
from durkv.fsync import fsync_dir, fsync_file

from .archiver import read_manifest
from .client import NoSuchKeyError, S3Location, in_order, translate
from .manifest import MANIFESTS, Manifest, SegmentEntry, manifest_no_of
from .segfile import cut_after, read_header

__all__ = ["restore_dir", "RestorePlan", "plan_restore", "RestoreTarget", "restore_target"]


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


# The staging directory of a restore into an existing empty DEST, inside DEST: while it is
# there, DEST holds a restore that has not finished (a crash or kill cut it short).
STAGING = ".durkv-restore-"


@dataclass
class RestoreTarget:
    """Where a restore is built (``tmp``) and how it becomes ``dest``, all or nothing.

    A new ``dest``: ``tmp`` is a directory beside it, renamed to ``dest`` at the end (one
    atomic rename). An existing empty ``dest`` keeps its inode, mode and owner (a shell's
    cwd, a mount point, a directory an administrator made for another user): ``tmp`` is
    inside it, and at the end its files are renamed into ``dest``, the oldest segment last,
    after a directory fsync. Every state a crash can leave is then detectable: the staging
    directory (``STAGING``) is still there, and until the oldest segment lands the log's
    first segment is missing, so an open refuses it (GUARANTEES.md 5: ``missing_segment``)
    instead of reading a shorter log; once it lands, every other file is durable in
    ``dest`` already. (A temporary directory beside ``dest`` would fail where ``dest`` is
    a mount point or its parent is not writable; inside ``dest`` every rename stays on one
    file system.) New files and directories get the modes ``durkv.open`` gives (0755 and
    0644 less the umask), not ``mkdtemp``'s 0700.
    """

    dest: str
    tmp: str
    in_place: bool
    made: list[str] = field(default_factory=list)   # parents this restore created

    def finish(self) -> None:
        """Put the finished, verified restore in place and make that durable."""
        if self.in_place:
            with _sigint_held():
                _move_files_in(self.tmp, self.dest)
        else:
            os.rename(self.tmp, self.dest)
            fsync_dir(os.path.dirname(self.dest))

    def discard(self) -> None:
        """Undo a restore that failed: no staging directory, no ``dest`` (or ``dest`` as
        empty as it was), no parent directory this restore made."""
        shutil.rmtree(self.tmp, ignore_errors=True)
        _rmdirs(self.made)


def restore_target(dest: str | os.PathLike) -> RestoreTarget:
    """``dest`` (absolute), new or an existing empty directory, and its staging directory;
    ConfigError (nothing changed) if ``dest`` exists and is not an empty directory."""
    dest = os.path.abspath(os.fspath(dest))
    if os.path.lexists(dest):
        if not os.path.isdir(dest) or os.listdir(dest):
            raise ConfigError(_not_empty(dest))
        return RestoreTarget(dest, tempfile.mkdtemp(prefix=STAGING, dir=dest), in_place=True)
    made: list[str] = []
    try:
        _makedirs(os.path.dirname(dest), made)
        return RestoreTarget(dest, _mkdir_beside(dest), in_place=False, made=made)
    except BaseException:
        _rmdirs(made)
        raise


def _not_empty(dest: str) -> str:
    # a staging directory with files in it: killed before its last rename into dest (an
    # empty one: killed between that rename and its rmdir; dest holds the whole store)
    left = [n for n in sorted(os.listdir(dest)) if n.startswith(STAGING)
            and os.path.isdir(os.path.join(dest, n)) and os.listdir(os.path.join(dest, n))
            ] if os.path.isdir(dest) else []
    if left:
        return (f"{dest} holds a restore that was cut short (its staging directory "
                f"{os.path.join(dest, left[0])} is still there; {dest} does not hold a whole "
                f"store): empty {dest} and run restore again (nothing was changed)")
    return (f"{dest} exists and is not an empty directory; restore into a new or empty "
            "directory (nothing was changed)")


def _makedirs(path: str, made: list[str]) -> None:
    """``os.makedirs(path)``, appending each directory it creates to ``made`` (outermost
    first), so that a failed restore removes exactly those."""
    missing = []
    while not os.path.isdir(path) and path != os.path.dirname(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            continue            # made meanwhile by someone else: theirs, not to remove
        made.append(d)


def _rmdirs(made: list[str]) -> None:
    for d in reversed(made):
        with contextlib.suppress(OSError):
            os.rmdir(d)


def _mkdir_beside(dest: str) -> str:
    """A new directory next to ``dest``, mode 0755 less the umask (as the C log's mkdir of
    a new store: mkdtemp's 0700 would become the restored store's mode)."""
    parent, base = os.path.split(dest)
    for _ in range(100):
        tmp = os.path.join(parent, f".{base}.restore-{secrets.token_hex(4)}")
        try:
            os.mkdir(tmp, 0o755)
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot make a staging directory beside {dest}")


def _move_files_in(tmp: str, dest: str) -> None:
    """Rename every file of ``tmp`` into ``dest``, the oldest segment last (see
    :class:`RestoreTarget`); on an error, those already moved go back to ``tmp``."""
    names = sorted(os.listdir(tmp))
    first = [n for n in names if n.endswith(".seg")][:1]    # hex names: sorted = numbered
    moved: list[str] = []
    try:
        for group in ([n for n in names if n not in first], first):
            for n in group:
                os.rename(os.path.join(tmp, n), os.path.join(dest, n))
                moved.append(n)
            fsync_dir(dest)     # all the others are durable in dest before the oldest is
        os.rmdir(tmp)
        fsync_dir(dest)
    except BaseException:
        for n in reversed(moved):
            with contextlib.suppress(OSError):
                os.rename(os.path.join(dest, n), os.path.join(tmp, n))
        raise


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """A Ctrl-C during the block is delivered after it: the renames into an existing
    ``dest`` take milliseconds and must not stop halfway (the restore then is whole, and
    the interrupt still stops the caller). Only the main thread gets KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if got and callable(old):
        old(signal.SIGINT, None)


def restore_dir(loc: S3Location, dest: str | os.PathLike, plan: RestorePlan,
                progress: Callable[[int, int], None] | None = None) -> seglog.Report:
    """Restore ``plan`` into the new directory ``dest``; returns the verify report."""
    target = restore_target(dest)
    tmp = target.tmp
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
        target.finish()
        return report
    except BaseException:
        target.discard()
        raise
