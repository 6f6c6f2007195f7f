"""``durkv show STORE RUN``: a run's journal (and, without a journal, a checkpoint).

It prints a thread's checkpoint (:func:`durkv.cli.browse.print_checkpoint`) and,
when RUN has a run journal (and no CHECKPOINT_ID is given), the journal after the
checkpoint: one line per durable call with its state, retries and result. ``--json``
then prints the run (status and entries) and its newest checkpoint as one document.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from ..runtime.control import run_info
from ..runtime.view import describe
from . import output, strict_json
from .browse import (brief, checkpoint_data, echo_checkpoint, ns_option, open_reader,
                     print_checkpoint, serde_option)
from .output import JSON_KEY


def journal_doc(store: Any, run_id: str, step: str | None = None) -> dict[str, Any] | None:
    """The run's status and journal entries (only those of step id ``step``, if given)
    as plain data; None: the run has no journal."""
    info = run_info(store, run_id)
    if info is None:
        return None
    entries = [dict(dataclasses.asdict(e), warnings=list(e.warnings))   # a list in JSON
               for e in describe(store, run_id) if step is None or e.step_id == step]
    return {"run": dataclasses.asdict(info), "journal": entries}


def _versions(e: dict[str, Any]) -> str:
    """``p=<prompt version>`` / ``t=<tool version>``, or ``-``."""
    parts = [f"{k}={v}" for k, v in (("p", e["prompt_version"]), ("t", e["tool_version"]))
             if v is not None]
    return ",".join(parts) or "-"


def print_journal(doc: dict[str, Any]) -> None:
    """One line per durable call: step, kind, planned action, versions, state, retries,
    and the approval, the error or the receipt."""
    run = doc["run"]
    where = f" (step {run['step']})" if run["step"] else ""
    until = f" until {run['until']:.3f}" if run["until"] else ""
    click.echo(f"run {run['run_id']}: {run['status']}{where}{until}, "
               f"{len(doc['journal'])} journal entries")
    if run["message"]:
        click.echo(f"  {run['message']}")
    steps = [e["step_id"] + (f"#{e['generation']}" if e["generation"] else "")
             for e in doc["journal"]]
    # as wide as the longest step id: a LangGraph node's are `<task uuid>:<n>`, 38+ wide
    w = max([10, *map(len, steps)])
    click.echo(f"  {'STEP':<{w}} {'KIND':<8} {'ACTION':<22} {'VERSIONS':<12} {'STATE':<9} "
               f"{'TRIES':>5}  RESULT")
    for step, e in zip(steps, doc["journal"]):
        what = e["error_state"] or (e["approval_status"] if e["kind"] == "approval"
                                    else brief(e["result_receipt"], 60))
        # a name is text; a journal an older durkv wrote may hold another value
        action = e["planned_action"]
        action = action if isinstance(action, str) else brief(action, 22)
        click.echo(f"  {step:<{w}} {e['kind']:<8} {action[:22]:<22} "
                   f"{_versions(e)[:12]:<12} {e['state']:<9} {e['retry_count']:>5}  {what}")
        for warning in e["warnings"]:
            click.echo(f"  {'':<{w}} warning: {warning}")


def print_entry(e: dict[str, Any]) -> None:
    """One journal entry whole: every field on its own line, values as strict JSON."""
    width = max(len(k) for k in e)
    for k, v in e.items():
        click.echo(f"{k + ':':<{width + 1}} {strict_json.dumps(v, separators=(', ', ': '))}")


@click.command("show")
@click.argument("path", type=output.STORE_PATH)
@click.argument("thread")
@click.argument("checkpoint_id", required=False)
@ns_option
@serde_option
@output.json_option
@click.pass_context
def show(ctx: click.Context, path: Path, thread: str, checkpoint_id: str | None, ns: str,
         serde: str, as_json: bool) -> None:
    """Print a checkpoint of THREAD, and the journal of the run THREAD (durable steps,
    tools, approvals: their state, retries and results).

    Without CHECKPOINT_ID, the newest checkpoint (if the thread has any) and the
    run's journal (if it has one). With --json and a journal: the run, its entries
    and its newest checkpoint (``checkpoint``, null if none) as one document.

    \b
    Example:
        durkv show ./agent.durkv ticket-42
        durkv show --json ./agent.durkv ticket-42
        durkv show ./agent.durkv t1 1ef4f797-8335-6428-8001-8a1503f9b875
    """
    ctx.meta[JSON_KEY] = as_json
    doc = checkpoint = None
    if checkpoint_id is None:
        with open_reader(path, serde) as store:      # one snapshot for both
            doc = journal_doc(store, thread)
            if doc is not None and store.get(thread, ns) is not None:
                checkpoint = checkpoint_data(store, path, thread, None, ns)
    if doc is None:
        print_checkpoint(path, thread, checkpoint_id, ns, serde, as_json)
        return
    if as_json:
        output.emit_json(dict(doc, checkpoint=checkpoint))
        return
    if checkpoint is not None:
        echo_checkpoint(checkpoint)
        click.echo("")
    print_journal(doc)
