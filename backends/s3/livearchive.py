"""``Store.archive`` / ``durkv archive`` of a live ``s3://`` store (FORMAT.md section 10
archives, from the log of section 11).

An archive holds local segment files byte for byte, and a live store has none: the
live store's frames are appended, at the same LSNs, to a local *mirror* log kept in the
store's cache directory, its active segment is sealed, and the mirror is archived like
any local store. The mirror keeps its log UUID from call to call, so later archives
add only the new segments; on a machine without a mirror it is first restored from the
archive itself (so the archive stays one log), or started empty when there is none.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from typing import Any, Callable

from durkv import log as seglog
from durkv.errors import ArchiveConflictError, ConfigError, NotFoundError

from .archiver import ArchiveResult, archive_dir
from .client import S3Location
from .live import S3Backend
from .restorer import plan_restore, restore_dir

__all__ = ["archive_live"]


def _mirror_dir(src: S3Backend, loc: S3Location) -> str:
    digest = hashlib.sha256(loc.url.encode()).hexdigest()[:16]
    return os.path.join(src.cache.root, f"archive-mirror-{digest}")


def _has_segments(path: str) -> bool:
    return os.path.isdir(path) and any(n.endswith(".seg") for n in os.listdir(path))


def archive_live(src: S3Backend, loc: S3Location, *, encoding: str = "identity",
                 page_size: int = 1000, progress: Callable[[int, int], None] | None = None,
                 **_ignored: Any) -> ArchiveResult:
    """Archive every frame of the live store ``src`` so far to ``loc``. Archives of one
    store to one target from this machine take turns (they share the mirror)."""
    mirror = _mirror_dir(src, loc)
    os.makedirs(os.path.dirname(mirror), exist_ok=True)
    fd = os.open(f"{mirror}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        # the mirror is one log from call to call: two archivers appending to it at once
        # (each from its own next_lsn) made frames repeat at later LSNs, uploaded as the
        # archive -- a restore then read other values at those LSNs
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _archive_locked(src, loc, mirror, encoding, page_size, progress)
    finally:
        os.close(fd)        # releases the lock


def _archive_locked(src: S3Backend, loc: S3Location, mirror: str, encoding: str,
                    page_size: int, progress: Callable[[int, int], None] | None
                    ) -> ArchiveResult:
    if not _has_segments(mirror):
        shutil.rmtree(mirror, ignore_errors=True)
        try:
            plan = plan_restore(loc, to_lsn=None, to_time_ns=None, page_size=page_size)
        except NotFoundError:
            plan = None                 # no archive there yet: a new log
        if plan is not None:
            restore_dir(loc, mirror, plan)
    if src.read_only:
        src.refresh()
    else:
        src.flush()
    end = src.next_lsn
    with seglog.SegmentLog.open(mirror, durability="exit") as log:
        have = log.next_lsn
        if have > end or (have > 0 and have - 1 >= src.start_lsn
                          and log.read(have - 1) != src.read(have - 1)):
            raise ArchiveConflictError(
                f"the archive at {loc.url} holds another log than the live store {src.url} "
                f"(it ends at lsn {have - 1}, which the live store does not have); archive to "
                "another prefix (nothing was uploaded)", url=loc.url)
        if have < src.start_lsn:
            raise ConfigError(f"the live store {src.url} was compacted to lsn {src.start_lsn} "
                              f"and the archive at {loc.url} ends at lsn {have - 1}: the frames "
                              "between are gone; archive to a new prefix after a restore "
                              "(nothing was uploaded)")
        for lsn in range(have, end):
            if log.append(src.read(lsn), frame_type=seglog.FRAME_COMMIT) != lsn:
                raise ArchiveConflictError(    # not reached under the lock: said, not hidden
                    f"the archive mirror {mirror} was written by another process meanwhile; "
                    "run the archive again (nothing was uploaded)", url=loc.url)
        if end > have:
            log.flush()
            log.seal()
    return archive_dir(mirror, loc, encoding=encoding, page_size=page_size, progress=progress)
