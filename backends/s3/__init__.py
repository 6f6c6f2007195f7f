"""durkv on S3: archive a store's sealed segments, restore a store from them.

The layout and its checks are FORMAT.md section 10; the promises are GUARANTEES.md
("Archives on S3"). Needs boto3 (``pip install 'durkv[s3]'``).

>>> # import durkv.backends.s3 as s3
>>> # s3.archive("./agent.durkv", "s3://bucket/agents/a1", seal=True)
>>> # s3.restore("s3://bucket/agents/a1", "./restored.durkv", to_lsn=1200)
"""

from __future__ import annotations

import contextlib
import os
from datetime import datetime, timezone
from typing import Any, Callable

from durkv import log as seglog
from durkv.errors import ConfigError, NotFoundError

from .archiver import ENCODINGS, ArchiveResult, archive_dir, latest_manifest
from .client import S3Location
from .live import S3Backend
from .livearchive import archive_live
from .liverestore import is_live_store, restore_from_live
from .restorer import RestorePlan, plan_restore, restore_dir

__all__ = ["archive", "archive_backend", "restore", "S3Location", "ArchiveResult",
           "RestorePlan", "ENCODINGS", "latest_manifest", "parse_time"]

Progress = Callable[[int, int], None]


def archive(store: str | os.PathLike, url: str, *, seal: bool = False,
            encoding: str = "identity", endpoint_url: str | None = None,
            region: str | None = None, client: Any = None, page_size: int = 1000,
            progress: Progress | None = None) -> ArchiveResult:
    """Archive the store directory ``store`` to ``url`` (``s3://bucket/prefix``); a live
    ``s3://`` store as ``store`` is archived whole (every frame so far, ``seal`` or not).

    ``seal``: first seal the active segment (takes the writer lock briefly:
    StoreLockedError while another process writes the store; use ``Store.archive``
    from inside that process), so that every commit so far is archived.
    """
    path = os.fspath(store)
    loc = S3Location.parse(url, endpoint_url=endpoint_url, region=region, client=client)
    if path.startswith("s3://"):     # a live store: every frame so far (seal or not)
        src = S3Backend(path, read_only=True, client=client)
        try:
            return archive_live(src, loc, encoding=encoding, page_size=page_size,
                                progress=progress)
        finally:
            src.close()
    if not os.path.isdir(path) or not any(n.endswith(".seg") for n in os.listdir(path)):
        raise NotFoundError(f"no durkv store at {path}: no directory with segment files")
    if seal:
        with seglog.SegmentLog.open(path) as log:
            log.seal()
    return archive_dir(path, loc, encoding=encoding, page_size=page_size, progress=progress)


def archive_backend(backend: Any, url: str, *, seal: bool = False,
                    lock: Any = contextlib.nullcontext(), **options: Any) -> ArchiveResult:
    """``Store.archive``: archive the store behind an open local backend; with ``seal``,
    flush and seal its active segment through the open handle first (under ``lock``, the
    store's; the upload runs without it: sealed segments never change)."""
    if isinstance(backend, S3Backend):
        loc = S3Location.parse(url, endpoint_url=options.get("endpoint_url"),
                               region=options.get("region"), client=options.get("client"))
        with lock:
            backend.flush()     # every commit returned so far goes into the archive
        return archive_live(backend, loc, **{k: v for k, v in options.items()
                                             if k in ("encoding", "page_size", "progress")})
    path = getattr(backend, "path", None)
    if path is None:
        raise ConfigError(f"only a local store can be archived; {backend.url} is not one")
    if seal:
        if backend.read_only:
            raise ConfigError(f"store {backend.url} is open read-only; seal=True needs the "
                              "writer")
        with lock:
            backend.flush()
            backend.roll()
    return archive(path, url, **options)


def restore(url: str, dest: str | os.PathLike, *, to_lsn: int | None = None,
            to_time: datetime | float | str | None = None, dry_run: bool = False,
            endpoint_url: str | None = None, region: str | None = None, client: Any = None,
            page_size: int = 1000, progress: Progress | None = None
            ) -> tuple[RestorePlan, seglog.Report | None]:
    """Restore the archive at ``url`` (or, when there is none, the live ``s3://`` store
    there) into the new directory ``dest``.

    Returns the plan and the restored log's verify report (None with ``dry_run``,
    which downloads and changes nothing).
    """
    loc = S3Location.parse(url, endpoint_url=endpoint_url, region=region, client=client)
    to_time_ns = None if to_time is None else parse_time(to_time)
    try:
        plan = plan_restore(loc, to_lsn=to_lsn, to_time_ns=to_time_ns, page_size=page_size)
    except NotFoundError:
        if not is_live_store(loc):
            raise
        # no archive here, but a live s3:// store: its log into a local directory
        if to_time_ns is not None:
            raise ConfigError(f"{url} is a live store: --to-time needs an archive "
                              "(durkv archive); use --to-lsn") from None
        return restore_from_live(loc, dest, to_lsn=to_lsn, dry_run=dry_run,
                                 progress=progress)
    if dry_run:
        return plan, None
    return plan, restore_dir(loc, dest, plan, progress=progress)


# The latest time a datetime holds (9999-12-31T23:59:59Z), in seconds since the epoch:
# past it (or inf, 1e400, nan) a time is not one a segment can be sealed at.
_MAX_SECONDS = 253402300799


def parse_time(value: datetime | float | int | str) -> int:
    """A point in time as ns since the epoch: a datetime (naive = UTC), seconds since the
    epoch, or an ISO 8601 string (``2026-11-30T18:00:00Z``; no zone = UTC).

    >>> parse_time("1970-01-01T00:00:01Z")
    1000000000
    """
    shown = value
    if isinstance(value, str):
        text = shown = value.strip()
        try:
            value = float(text)
        except ValueError:
            try:
                value = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
            except ValueError as exc:
                raise ConfigError(f"cannot read time {text!r}: use ISO 8601 "
                                  "(2026-11-30T18:00:00Z) or seconds since the epoch") from exc
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return int(value.timestamp()) * 10**9 + value.microsecond * 1000
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not -_MAX_SECONDS <= value <= _MAX_SECONDS:     # False for nan too
            raise ConfigError(f"time {shown!r:.40} is out of range: give seconds since the "
                              "epoch up to 253402300799 (year 9999), or ISO 8601 "
                              "(2026-11-30T18:00:00Z)")
        return value * 10**9 if isinstance(value, int) else int(value * 1e9)
    raise ConfigError(f"cannot read time {value!r}")
