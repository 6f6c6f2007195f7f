"""``durkv compact`` and ``durkv stats``: a store's upkeep.

The work is the store's (``Store.compact``, ``Store.stats``: :mod:`durkv.store.stats`);
this module opens the store, draws the progress bars and prints.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from .. import open as open_store
from ..errors import ConfigError, StoreLockedError
from . import output
from .output import JSON_KEY, human_bytes
from .stores import log_dir, quarantined

# the record kinds of `stats`, in the order printed, with their names for humans
KIND_NAMES = {
    "checkpoint_heads": "checkpoint heads",
    "channel_full": "channel values FULL",
    "channel_delta": "channel values DELTA/SNAP",
    "pending_writes": "pending writes",
    "journal": "run journal",
    "other_records": "other records",
    "framing": "frame and segment headers",
}
FRAME_NAMES = {"checkpoints": "checkpoint", "pending_writes": "pending-write",
               "journal": "journal", "other_records": "other"}


def _store_url(store: str) -> str:
    """A local store's directory, checked (a missing one is not created), or an s3:// URL."""
    return store if store.startswith("s3://") else log_dir(Path(store))


def _share(n: int, total: int) -> str:
    return f"{100 * n / total:.0f}%" if total else "-"


@click.command()
@click.argument("store", metavar="STORE")
@output.json_option
@output.quiet_option
@click.pass_context
def compact(ctx: click.Context, store: str, as_json: bool, quiet: bool) -> None:
    """Rewrite a store with only its live data; deleted data leaves the disk.

    Copies every live checkpoint (with its pending writes) and every run journal
    record to the end of the log, durably, then unlinks the old segment files: the
    data of deleted threads and runs, pruned checkpoints and superseded records is
    gone from STORE afterwards (PATH/quarantine/ is left as it is). Its open, as
    any writer's, first moves a torn tail -- the bytes of a write that never
    finished, never acknowledged -- to PATH/quarantine/, and says so. Every other
    thread reads exactly as before. A crash
    at any point loses nothing: the old records stay authoritative until the
    copies are complete and durable (docs/GUARANTEES.md, "Compaction").

    It needs the store to itself: while another process has it open to write
    (a running agent), it refuses and changes nothing. Readers may stay.

    Exit status: 0 compacted, 1 the store is in use, missing or unreadable,
    3 the store is damaged (run durkv verify).

    \b
    Example:
        durkv compact ./agent.durkv
        durkv compact --json ./agent.durkv | jq '.bytes_on_disk_after'
    """
    ctx.meta[JSON_KEY] = as_json
    if store.startswith("s3://"):
        raise ConfigError("durkv compact works on a local store; a live s3:// store is "
                          "compacted by its one writer: store.compact() in the agent's process")
    where = _store_url(store)
    show = not (quiet or as_json)
    t0 = time.monotonic()
    kept_before = quarantined(where)
    with open_store(where) as s:
        moved = {p: n for p, n in quarantined(where).items() if kept_before.get(p) != n}
        before = output.with_progress("reading", show, lambda bar: s.stats(
            bar, whole_values=False))
        try:
            res = output.with_progress("compacting", show, lambda bar: s.compact(bar))
        except StoreLockedError:
            s.close(snapshot=False)     # refused: nothing of this handle's is appended
            refusal = StoreLockedError(f"another process has {where} open for writing and "
                                       "compact needs the store to itself; nothing was changed",
                                       path=where)
            ctx.exit(output.report_error(ctx, refusal, hint=(
                f"Try: stop the agent using it (readers may stay), then durkv compact {where}")))
        after = output.with_progress("checking", show, lambda bar: s.stats(
            bar, whole_values=False))
    report = _compact_report(where, before, after, res, time.monotonic() - t0)
    report["quarantined"] = [{"file": p, "bytes": n} for p, n in moved.items()]
    if as_json:
        output.emit_json(report)
    elif not quiet:
        _echo_compact(report)


def _compact_report(where: str, before: Any, after: Any, res: dict, seconds: float) -> dict:
    dropped = {k: n - after.frames_by_kind.get(k, 0)
               for k, n in before.frames_by_kind.items()}
    return {
        "path": where, "seconds": round(seconds, 3),
        "bytes_on_disk_before": before.bytes_on_disk, "bytes_on_disk_after": after.bytes_on_disk,
        "segments_before": before.segments, "segments_after": after.segments,
        "frames_before": before.frames, "frames_after": after.frames,
        "dropped_records": {k: n for k, n in dropped.items() if n > 0},
        "kept": {"threads": after.threads, "checkpoints": res["checkpoints_kept"],
                 "pending_writes": after.pending_writes, "runs": after.runs,
                 "journal_records": res["journal_records_kept"]},
    }


def _echo_compact(r: dict) -> None:
    for q in r["quarantined"]:
        click.echo(f"the open moved a torn tail (a write that never finished) to "
                   f"{q['file']} ({human_bytes(q['bytes'])})")
    b0, b1 = r["bytes_on_disk_before"], r["bytes_on_disk_after"]
    freed = b0 - b1
    click.echo(f"compacted {r['path']} in {r['seconds']:.2f} s: {human_bytes(b0)} -> "
               f"{human_bytes(b1)} on disk ({'freed ' + human_bytes(freed) if freed >= 0 else 'grew ' + human_bytes(-freed)}, "
               f"{r['segments_before']} -> {r['segments_after']} segment files)")
    dropped = r["dropped_records"]
    click.echo("dropped: " + (", ".join(f"{n} {FRAME_NAMES.get(k, k)} record(s)"
                                        for k, n in dropped.items()) or "nothing"))
    k = r["kept"]
    click.echo(f"kept: {k['threads']} thread(s), {k['checkpoints']} checkpoint(s), "
               f"{k['pending_writes']} pending-write record(s), {k['runs']} run(s) with "
               f"{k['journal_records']} journal record(s)")


@click.command()
@click.argument("store", metavar="STORE")
@output.json_option
@click.pass_context
def stats(ctx: click.Context, store: str, as_json: bool) -> None:
    """Count what a store holds and where its bytes go, without the lock.

    Threads, runs, checkpoints, pending writes and journal records (live), segment
    files and bytes on disk; the log's bytes by record kind (live and dead: a
    compaction drops the dead); and what the delta encoding saves: the bytes the
    live checkpoints' channel values take, against each value stored whole.
    Reads the log once, read-only: safe while an agent writes (the figures are
    those of the moment it starts). STORE may be an s3:// store: every frame is
    read (through the local cache).

    Exit status: 0 ok, 1 no store at STORE or it cannot be read, 3 damaged.

    \b
    Example:
        durkv stats ./agent.durkv
        durkv stats --json ./agent.durkv | jq '.bytes_by_kind'
    """
    ctx.meta[JSON_KEY] = as_json
    where = _store_url(store)
    with open_store(where, read_only=True) as s:
        st = output.with_progress("reading", not as_json, s.stats)
    if as_json:
        output.emit_json(st.to_dict())
        return
    _echo_stats(st)


def _echo_stats(st: Any) -> None:
    click.echo(f"{st.url}: {st.threads} thread(s), {st.runs} run(s), {st.checkpoints} "
               f"checkpoint(s), {st.pending_writes} pending-write record(s), "
               f"{st.journal_records} journal record(s)")
    segs = "" if st.segments is None else f"{st.segments} segment file(s), "
    click.echo(f"log: {segs}{st.frames} frame(s), {human_bytes(st.segment_bytes)}; "
               f"on disk {human_bytes(st.bytes_on_disk)}")
    frames = {"checkpoint_heads": st.frames_by_kind.get("checkpoints", 0),
              "pending_writes": st.frames_by_kind.get("pending_writes", 0),
              "journal": st.frames_by_kind.get("journal", 0),
              "other_records": st.frames_by_kind.get("other_records", 0)}
    rows = [(name, human_bytes(st.bytes_by_kind[k]), _share(st.bytes_by_kind[k], st.segment_bytes),
             str(frames[k]) if k in frames else "")
            for k, name in KIND_NAMES.items()]
    click.echo(output.table(rows, ("record kind", "bytes", "share", "frames"),
                            right=frozenset({1, 2, 3})))
    stored, whole = st.channel_bytes, st.whole_values_bytes
    if not whole:
        click.echo("delta encoding: no channel values yet")
        return
    # "1.9x as much" reads right both ways; "0.5x more" (dead entries outweighing the
    # live values) did not
    ratio = f", {whole / stored:.1f}x as much" if stored else ""
    click.echo(f"delta encoding: channel entries take {human_bytes(stored)} in the log (dead "
               f"ones too, until a compaction); the live values stored whole would take "
               f"{human_bytes(whole)}{ratio}; every checkpoint's every value whole: "
               f"{human_bytes(st.whole_states_bytes)}")
