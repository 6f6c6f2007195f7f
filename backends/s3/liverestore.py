"""``durkv restore`` of a live ``s3://`` store: its log, frame for frame at the same LSNs,
into a new local store directory (all or nothing, like an archive's restore).

Every frame is read through the live store's checks (each object's crc, LSN and epoch
continuity), appended to a new local log in a temporary directory beside the target,
sealed, fsynced and verified by the C code, and only then put in place
(:class:`~durkv.backends.s3.restorer.RestoreTarget`).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from durkv import log as seglog
from durkv.errors import ConfigError, CorruptionError, NotFoundError

from .client import S3Location
from .live import S3Backend
from .livefmt import EPOCHS
from .restorer import RestorePlan, restore_target

__all__ = ["is_live_store", "plan_live_restore", "restore_live"]


def is_live_store(loc: S3Location) -> bool:
    return any(True for _ in loc.list_keys(EPOCHS, page_size=1))


def _reader(loc: S3Location) -> S3Backend:
    return S3Backend(loc.url, read_only=True, client=loc.client)


def plan_live_restore(loc: S3Location, to_lsn: int | None) -> tuple[RestorePlan, S3Backend]:
    src = _reader(loc)
    if src.start_lsn > 0:
        raise ConfigError(f"{loc.url} is a live store compacted to lsn {src.start_lsn}: a local "
                          "log cannot start there yet, so it cannot be restored into a "
                          "directory; open it as s3:// instead (nothing was changed)")
    if to_lsn is not None and to_lsn < 0:
        raise ConfigError(f"--to-lsn must be >= 0, got {to_lsn}")
    if to_lsn is not None and to_lsn >= src.next_lsn:
        # as an archive's restore: never silently short of what was asked (GUARANTEES 14)
        raise NotFoundError(f"{loc.url} ends at lsn {src.next_lsn - 1}; --to-lsn {to_lsn} "
                            "is past it (nothing was restored)")
    end = src.next_lsn if to_lsn is None else to_lsn + 1
    plan = RestorePlan(url=loc.url, manifest_no=src.manifest.manifest_no, log_uuid="live",
                       segments=[], cut_after_lsn=None if to_lsn is None else end - 1,
                       next_lsn=end, bytes=src.size_bytes())
    return plan, src


def restore_live(loc: S3Location, dest: str | os.PathLike, plan: RestorePlan, src: S3Backend,
                 progress: Callable[[int, int], None] | None = None) -> seglog.Report:
    target = restore_target(dest)
    tmp = target.tmp
    try:
        with seglog.SegmentLog.open(tmp, durability="exit") as log:
            for lsn, payload in src.scan(0):
                if lsn >= plan.next_lsn:
                    break
                got = log.append(payload, frame_type=seglog.FRAME_COMMIT)
                if got != lsn:
                    raise CorruptionError(f"live store {loc.url}: frame {lsn} became local "
                                          f"lsn {got}; nothing was restored", kind="lsn_gap")
                if progress and lsn % 1024 == 0:
                    progress(lsn + 1, plan.next_lsn)
            log.flush()
            log.seal()
        report = seglog.verify(tmp, deep=True)
        if not report.ok or report.next_lsn != plan.next_lsn:
            raise CorruptionError(f"live store {loc.url}: the restored log does not verify "
                                  f"(ends at lsn {report.next_lsn - 1}, expected "
                                  f"{plan.next_lsn - 1}); nothing was restored",
                                  kind="truncated", url=loc.url)
        target.finish()
        if progress:
            progress(plan.next_lsn, plan.next_lsn)
        return report
    except BaseException:
        target.discard()
        raise


def restore_from_live(loc: S3Location, dest: Any, *, to_lsn: int | None, dry_run: bool,
                      progress: Callable[[int, int], None] | None
                      ) -> tuple[RestorePlan, seglog.Report | None]:
    plan, src = plan_live_restore(loc, to_lsn)
    try:
        if dry_run:
            return plan, None
        return plan, restore_live(loc, dest, plan, src, progress)
    finally:
        src.close()
