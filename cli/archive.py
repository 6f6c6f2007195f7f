"""``durkv archive`` and ``durkv restore``: a store's sealed segments to and from S3.

The work is :mod:`durkv.backends.s3`; this module parses options and prints.
Credentials come from boto3's standard chain and are never printed (nor is any
request); the endpoint and region from ``--endpoint-url``/``--region`` or the
usual ``AWS_ENDPOINT_URL``/``AWS_REGION`` variables.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError, CorruptionError
from . import output
from .output import JSON_KEY


def _s3() -> Any:
    """``durkv.backends.s3``, loaded by the commands that use it (like ``log_module`` in
    main.py: ``durkv --help`` works without the compiled log)."""
    try:
        from ..backends import s3
    except ImportError as exc:
        raise ConfigError(f"archive and restore cannot load ({exc}); "
                          "pip install -e '.[s3]'") from exc
    return s3


def endpoint_options(f):
    f = click.option("--region", default=None, metavar="REGION",
                     help="S3 region (default: AWS_REGION / AWS_DEFAULT_REGION / config).")(f)
    f = click.option("--endpoint-url", default=None, metavar="URL",
                     help="S3-compatible endpoint (default: AWS_ENDPOINT_URL[_S3] or AWS).")(f)
    return f


@click.command()
@click.argument("store", type=click.Path(path_type=str))
@click.argument("url")
@click.option("--seal", is_flag=True,
              help="Seal the active segment first, so that every commit so far is archived "
                   "(takes the writer lock for a moment).")
@click.option("--compress", is_flag=True,
              help="Store segment objects zstd-compressed (recorded in each object).")
@endpoint_options
@output.json_option
@output.quiet_option
@click.pass_context
def archive(ctx: click.Context, store: str, url: str, seal: bool, compress: bool,
            endpoint_url: str | None, region: str | None, as_json: bool, quiet: bool) -> None:
    """Copy a store's sealed segments to S3 (create-only, idempotent).

    Uploads the sealed segments of STORE that the archive at URL
    (s3://BUCKET/PREFIX) does not hold yet, then a new numbered manifest. Every
    object is created once and never overwritten: running it again adds nothing,
    a run cut short is completed by the next, and different content already at
    a key (another store, a fork) is refused with the original left as it is.
    Without --seal the active segment (the newest commits) stays local. STORE may
    be a live s3://BUCKET/PREFIX store: every commit so far is archived.

    Exit status: 0 archived (or nothing to do), 1 S3 error or conflict,
    2 usage, 3 the local store is damaged.

    \b
    Example:
        durkv archive --seal ./agent.durkv s3://my-bucket/agents/a1
        AWS_ENDPOINT_URL=http://127.0.0.1:9000 durkv archive ./agent.durkv s3://b/p
    """
    ctx.meta[JSON_KEY] = as_json
    s3 = _s3()
    res = output.with_progress("archiving", not (quiet or as_json), lambda bar: s3.archive(
        store, url, seal=seal, encoding="zstd" if compress else "identity",
        endpoint_url=endpoint_url, region=region, progress=bar))
    if as_json:
        output.emit_json(res.to_dict())
        return
    if quiet:
        return
    if res.manifest_no is None:
        click.echo(f"nothing to archive: {store} has no sealed segment (use --seal)")
        return
    done = (f"uploaded {len(res.uploaded)} segment(s), {output.human_bytes(res.bytes_uploaded)}"
            if res.uploaded else "no new segment")
    if res.already:
        done += f"; {len(res.already)} already there"
    state = (f"wrote manifest {res.manifest_no}" if res.manifest_written
             else f"manifest {res.manifest_no} is current")
    click.echo(f"{res.url}: {done}; {state} ({res.listed} segments, up to lsn "
               f"{res.next_lsn - 1})")


RESTORE_DAMAGE_HINT = ("Try: restore an earlier point, before the damaged object (durkv "
                       "restore --dry-run --to-lsn N URL DEST lists the segments it takes), "
                       "or archive the source store again to a new prefix")


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="seconds")


@click.command()
@click.argument("url")
@click.argument("dest", type=click.Path(path_type=Path))
@click.option("--to-lsn", type=click.IntRange(min=0), default=None, metavar="N",
              help="Restore the log up to and including LSN N (cut inside a segment).")
@click.option("--to-time", default=None, metavar="T",
              help="Restore the segments sealed at or before T (ISO 8601, e.g. "
                   "2026-11-30T18:00:00Z, or seconds since the epoch).")
@click.option("--dry-run", is_flag=True, help="Print the plan; download and change nothing.")
@endpoint_options
@output.json_option
@output.quiet_option
@click.pass_context
def restore(ctx: click.Context, url: str, dest: Path, to_lsn: int | None, to_time: str | None,
            dry_run: bool, endpoint_url: str | None, region: str | None, as_json: bool,
            quiet: bool) -> None:
    """Rebuild a store in a new or empty directory from an S3 archive, all or nothing.

    Downloads the segments the archive's newest manifest lists (or, with
    --to-lsn/--to-time, the manifest and segments for that point) into a
    temporary directory (next to a new DEST; inside an existing empty DEST,
    which keeps its owner and mode), checks every object's size and CRC-32C,
    each segment's header and the whole log's checksums and chain, and only then
    puts it in place as DEST. On any failure the object key is named and DEST is
    not created (or left empty). The restored store opens for writing and
    continues the LSNs.

    Exit status: 0 restored, 1 S3 error or nothing to restore, 2 usage
    (DEST exists and is not empty), 3 a damaged, missing or truncated object.

    \b
    Example:
        durkv restore s3://my-bucket/agents/a1 ./agent.durkv
        durkv restore --to-lsn 1200 --dry-run s3://my-bucket/agents/a1 ./old.durkv
    """
    ctx.meta[JSON_KEY] = as_json
    s3 = _s3()
    try:
        plan, report = output.with_progress("restoring", not (quiet or as_json or dry_run), lambda bar: s3.restore(
            url, dest, to_lsn=to_lsn, to_time=to_time, dry_run=dry_run, endpoint_url=endpoint_url,
            region=region, progress=bar))
    except CorruptionError as exc:
        if ctx.find_root().params.get("debug"):
            raise
        # the default hint (verify/recover a local PATH) does not apply: the damage is in S3
        ctx.exit(output.report_error(ctx, exc, hint=RESTORE_DAMAGE_HINT))
    if as_json:
        output.emit_json({**plan.to_dict(), "dest": str(dest), "dry_run": dry_run,
                          "verify": None if report is None else report.to_dict()})
        return
    if quiet:
        return
    cut = (f", cut after lsn {plan.cut_after_lsn}" if plan.cut_after_lsn is not None else "")
    if plan.segments:
        last = plan.segments[-1]
        what = (f"manifest {plan.manifest_no}: {len(plan.segments)} segment(s) "
                f"{plan.segments[0].segment_no}..{last.segment_no}, "
                f"{output.human_bytes(plan.bytes)}{cut}; the store resumes at lsn "
                f"{plan.next_lsn} (last segment sealed {_when(last.sealed_at_ns)})")
    else:       # a live s3:// store: its frames, not archived segments
        what = (f"live store: {plan.next_lsn} frame(s), {output.human_bytes(plan.bytes)}{cut}; "
                f"the store resumes at lsn {plan.next_lsn}")
    if dry_run:
        click.echo(f"dry run: would restore {plan.url} {what} into {dest}")
    else:
        click.echo(f"restored {plan.url} {what} into {dest}; verify: ok")
