"""The ``durkv`` command line: a thin click layer over the library.

Commands do their work through ``durkv.log`` / ``durkv.open`` and leave exit
codes, error lines and JSON to :mod:`durkv.cli.output`. A new command is a
function here (or in its own module, registered with ``cli.add_command``) whose
docstring has a one-line summary and an ``Example:`` block; tests/test_cli.py
fails for a command without them. What several command modules share lives in
:mod:`durkv.cli.stores`, ``output`` and ``strict_json``: command modules never
import this one (tests/test_layers.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from .. import __version__, repairnotes
from .. import open as open_store
from ..errors import CorruptionError, DurkvError
from . import output, reports
from .archive import archive, restore
from .bench import bench
from .browse import history, ls
from .demo import demo
from .journal_view import show   # browse.show plus the run journal
from .maint import compact, stats
from .operate import approve, journal, reject, resolve, runs
from .output import EXIT_CORRUPT, EXIT_OK, JSON_KEY
from .stores import log_dir, log_module, quarantined

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class DurkvGroup(click.Group):
    """A click group that turns every durkv error into one line and its exit code."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # a usage error is found before the command runs: remember --json for it
        ctx.meta[JSON_KEY] = "--json" in args
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            if ctx.meta.get(JSON_KEY):      # --json: stdout holds JSON even then
                output.emit_json({"error": "usage", "message": exc.format_message(),
                                  "exit_code": output.EXIT_USAGE})
            raise                           # click prints the usage and exits 2
        except KeyboardInterrupt:
            # Ctrl-C: click's "Aborted!" and exit 1 read as an operational error. Every
            # command leaves the store as a crash at that point would (archive resumes,
            # restore leaves nothing, compact keeps the old records): say so, exit 130
            click.echo("interrupted: what was done is as a crash at this point leaves it; "
                       "run the command again", err=True)
            ctx.exit(130)
        except BrokenPipeError:
            # stdout was closed early (`durkv history ... | head`): stop quietly, and keep
            # Python's exit-time flush of stdout from failing again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(output.EXIT_ERROR)
        except (DurkvError, OSError) as exc:
            if ctx.params.get("debug"):
                raise
            ctx.exit(output.report_error(ctx, exc))


@click.group(cls=DurkvGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", prog_name="durkv")
@click.option("--debug", is_flag=True, envvar="DURKV_DEBUG",
              help="Show the full traceback of an error (also: DURKV_DEBUG=1).")
def cli(debug: bool) -> None:
    """durkv: a durable-execution storage kernel for long-running AI agents.

    Exit codes: 0 ok, 1 operational error (lock held, fenced, I/O, no log at
    PATH), 2 usage error, 3 corruption found.

    \b
    Example:
        durkv demo
        durkv verify ./agent.durkv
        durkv recover --dry-run ./agent.durkv
    """


@cli.command()
@click.argument("path", type=output.STORE_PATH)
@click.option("--deep", is_flag=True,
              help="Also decode every COMMIT frame and resolve every channel reference "
                   "and every reference to a journal record.")
@output.json_option
@output.quiet_option
@click.pass_context
def verify(ctx: click.Context, path: Path, deep: bool, as_json: bool, quiet: bool) -> None:
    """Check a log's checksums and segment chain, without the lock.

    Reads every segment of the log at PATH: sealed segments through their seal
    footer and whole-segment digest, the active one frame by frame. Prints one
    line per segment file and a summary. Safe while a writer is running; it
    changes nothing.

    Exit status: 0 the log is clean, 3 damage found (a torn tail counts),
    1 there is no log at PATH or it cannot be read.

    \b
    Example:
        durkv verify ./agent.durkv
        durkv verify --deep --json ./agent.durkv | jq '.damage'
    """
    ctx.meta[JSON_KEY] = as_json
    where = log_dir(path)
    log = log_module()
    report = output.with_progress("verifying", not (quiet or as_json), lambda bar: log.verify(
        where, deep=deep, progress=bar))
    notes = repairnotes.problems(where)     # a damaged one stops every writer's open
    clean = reports.is_clean(report) and not any(n["blocks_writers"] for n in notes)
    if as_json:
        output.emit_json({**report.to_dict(), "ok": clean, "repair_notes": notes})
    elif not quiet:
        click.echo(reports.segment_table(report))
        for d in report.damage:
            click.echo(f"damage: {reports.damage_line(d)}")
        for n in notes:
            click.echo(f"{'damage' if n['blocks_writers'] else 'warning'}: {n['message']}")
        verdict = "ok" if clean else "DAMAGED"
        click.echo(f"{verdict}: {reports.summary(report)}")
    if not clean:
        if not quiet and not reports.is_clean(report):
            click.echo(reports.repair_hint(where, report), err=True)
        ctx.exit(EXIT_CORRUPT)


@cli.command()
@click.argument("path", type=output.STORE_PATH)
@click.option("--dry-run", is_flag=True, help="Say what would be cut and kept; change nothing.")
@click.option("--skip-corrupt", is_flag=True,
              help="Also cut mid-log corruption (the log is cut at the last good frame "
                   "before it; every removed byte is copied to PATH/quarantine/ first).")
@click.option("--ack", "ack", metavar="RUN", multiple=True,
              help="Acknowledge every repair that touched run RUN (repeatable): its tools "
                   "follow the usual rules again. Appends a durable acknowledgement "
                   "record; cuts nothing.")
@click.option("--by", default=None, help="Who acknowledges (recorded with --ack).")
@click.option("--note", default=None, help="Why (recorded with --ack).")
@output.json_option
@output.quiet_option
@click.pass_context
def recover(ctx: click.Context, path: Path, dry_run: bool, skip_corrupt: bool,
            ack: tuple[str, ...], by: str | None, note: str | None,
            as_json: bool, quiet: bool) -> None:
    """Repair a log: quarantine a torn tail; cut corruption on request.

    Without options, only a torn tail (bytes of an unfinished write at the end
    of the active segment) is removed. Mid-log corruption is refused unless
    --skip-corrupt is given: then the log is cut at the last good frame before
    the damage and the lost LSN range is reported. Every removed byte is first
    copied to PATH/quarantine/ and fsync'd; no frame is deleted (the *.tmp files
    a writer killed mid-roll left, a header or HEAD's next version, are removed,
    and counted in the output).
    Running it twice is a no-op. Takes the writer lock: stop the writer first.

    A cut of more than a torn tail also names the runs and threads whose records
    it may have removed (REPAIR record, docs/GUARANTEES.md 16a): those runs are
    `damaged`, and their tool calls without a surviving receipt are held in doubt
    until resolved, or until `--ack RUN` acknowledges the repair for the run.

    Exit status: 0 the log is clean now (or would be, with --dry-run),
    3 corruption remains, 1 the store is locked or cannot be read.

    \b
    Example:
        durkv recover --dry-run ./agent.durkv
        durkv recover ./agent.durkv
        durkv recover --skip-corrupt ./agent.durkv
        durkv recover ./agent.durkv --ack ticket-42 --by alice
    """
    ctx.meta[JSON_KEY] = as_json
    where = log_dir(path)
    if ack:
        if dry_run or skip_corrupt:     # an ack is recorded at once and is final: a dry
            raise click.UsageError(     # run must not make it, nor a cut ride along
                "--ack records an acknowledgement (durable, final); run it on its own, "
                "without --dry-run or --skip-corrupt")
        ctx.exit(_acknowledge(where, ack, by, note, as_json, quiet))
    if by is not None or note is not None:      # they would be dropped without a word
        raise click.UsageError("--by and --note go with --ack (who acknowledges a repair, "
                               "and why): durkv recover PATH --ack RUN --by NAME")
    log = log_module()
    skip_hint = reports.skip_corrupt_hint(where)
    before = quarantined(where)
    # a repair runs to its end (the C cut cannot stop midway, and its REPAIR record must
    # follow it): Ctrl-C is said after, with exit 130, never a traceback
    with output.sigint_deferred() as interrupted:
        try:
            try:
                report = output.with_progress(
                    "recovering", not (quiet or as_json), lambda bar: (
                        log.recover(where, skip_corrupt=skip_corrupt, dry_run=dry_run,
                                    progress=bar)))
            except CorruptionError as exc:
                ctx.exit(output.report_error(ctx, exc,
                                             hint=None if skip_corrupt else skip_hint))
            _recovered(ctx, where, report, before, dry_run, skip_corrupt, skip_hint, as_json,
                       quiet)
            code = EXIT_OK
        except click.exceptions.Exit as e:
            code = e.exit_code
    if interrupted[0]:
        click.echo("interrupted: the repair had started and ran to its end (it cannot stop "
                   "midway); what it did is above", err=True)
        ctx.exit(130)
    ctx.exit(code)


def _recovered(ctx: click.Context, where: str, report: Any, before: dict, dry_run: bool,
               skip_corrupt: bool, skip_hint: str, as_json: bool, quiet: bool) -> None:
    log = log_module()
    # The log refuses by raising (above); report.ok is False whenever it found damage, even
    # damage it removed. A plan is refused when the real run would be: only a torn tail
    # passes without --skip-corrupt.
    refused = dry_run and not skip_corrupt and not (
        reports.only_torn_tail(report) or not report.damage)
    kept = {p: n for p, n in quarantined(where).items() if before.get(p) != n}
    after = None if dry_run or refused else log.verify(where)
    clean = not refused and (after is None or reports.is_clean(after))
    repair = _record_repair(where, report.repair) if clean and report.repair else None
    # a damaged repair note stops every writer's open, and a cut cannot mend it: said,
    # exit 3 (its message says what the operator does)
    notes = [n for n in repairnotes.problems(where) if n["blocks_writers"]]

    if as_json:
        output.emit_json({
            "path": where, "dry_run": dry_run, "skip_corrupt": skip_corrupt,
            "ok": clean and not notes, "refused": refused, "report": report.to_dict(),
            "repair_notes": notes,
            "quarantined": [{"file": p, "bytes": n} for p, n in kept.items()],
            "after": None if after is None else after.to_dict(), "repair": repair,
        })
    if refused:
        first = next(d for d in report.damage if reports.kind_name(d.kind) != "torn_tail")
        click.echo(f"error: recover would refuse: the damage is not a torn tail: "
                   f"{reports.damage_line(first)}", err=True)
        if not quiet:
            click.echo(skip_hint, err=True)
        ctx.exit(EXIT_CORRUPT)
    if not as_json and not quiet:
        verb = "would remove" if dry_run else "removed"
        for d in report.damage:
            click.echo(f"{verb}: {reports.damage_line(d)}")
        if report.transients:
            click.echo(f"{verb}: {report.transients} file(s) a writer killed mid-roll left "
                       "(<segment>.tmp / HEAD.tmp; they hold no frame)")
        for p, n in kept.items():
            click.echo(f"kept: {p} ({output.human_bytes(n)})")
        if not report.damage and not report.transients:
            click.echo("nothing to recover: the log is clean")
        elif dry_run:
            click.echo("dry run: nothing changed" + (
                f"; removed bytes would be copied to {where}/quarantine/" if report.damage else ""))
        if after is not None:
            click.echo(f"{'ok' if clean else 'DAMAGED'}: {reports.summary(after)}")
        if repair is not None:
            _echo_repair(repair)
    if not clean:
        for d in after.damage:
            click.echo(f"error: still damaged after recover: {reports.damage_line(d)}", err=True)
        ctx.exit(EXIT_CORRUPT)
    if notes:
        for n in notes:
            click.echo(f"error: {n['message']}", err=True)
        ctx.exit(EXIT_CORRUPT)
    ctx.exit(EXIT_OK)


def _record_repair(where: str, note_id: str) -> dict:
    """Open the store once (a writer open records the cut's REPAIR record: FORMAT.md 6a)
    and return what the note says it touched."""
    open_store(where).close()
    n = repairnotes.read(where, note_id)
    return {"id": note_id, "state": n.get("state"), "lost_first_lsn": n.get("lost_first_lsn"),
            "repair_lsn": n.get("repair_lsn"), "runs": n.get("runs", []),
            "threads": n.get("threads", []), "quarantined": n.get("files", [])}


def _echo_repair(r: dict) -> None:
    runs, threads = r["runs"], r["threads"]
    click.echo(f"repair {r['id']}: records from LSN {r['lost_first_lsn']} were cut; "
               f"{len(runs)} run(s) marked damaged: {', '.join(runs) or 'none'}; "
               f"{len(threads)} thread(s) in the cut: {', '.join(threads) or 'none'}")
    if runs:
        click.echo("their tool calls without a surviving receipt are held in doubt: resolve "
                   "each, or acknowledge with: durkv recover PATH --ack RUN --by NAME")


def _acknowledge(where: str, runs: tuple[str, ...], by: str | None, note: str | None,
                 as_json: bool, quiet: bool) -> int:
    with open_store(where) as store:
        done = {r: store.acknowledge_repair(r, by=by, note=note) for r in runs}
    if as_json:
        output.emit_json({"path": where, "acknowledged": done})
    elif not quiet:
        for r, ids in done.items():
            click.echo(f"run {r}: repair {', '.join(ids)} acknowledged" if ids else
                       f"run {r}: every repair was already acknowledged")
    return EXIT_OK


for command in (ls, history, show, demo, archive, restore, runs, journal, approve, reject,
                resolve, compact, stats, bench):
    cli.add_command(command)


def main() -> None:
    """Console-script entry point: ``durkv = durkv.cli.main:main``."""
    cli(prog_name="durkv")


if __name__ == "__main__":  # pragma: no cover
    main()
