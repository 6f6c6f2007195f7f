"""The operator's commands: ``durkv runs``, ``journal``, ``approve``, ``reject``, ``resolve``.

They work while another process drives the run. A local store is opened for writing
beside the agent (several writers, docs/FORMAT.md 12) for the time of one decision; the
decision's check and append are one step in the store's write section, so the agent's
next read of its journal sees it and a contradictory answer is refused
(docs/GUARANTEES.md 19a). An ``s3://`` store is opened read-only, and a decision goes
through a decision object that its writer journals (FORMAT.md 13).
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import click

from .. import open as open_store
from ..errors import ConfigError, NotFoundError
from ..runtime.control import overview
from ..runtime.journal import STATUSES
from . import output
from .browse import open_reader, serde_option
from .journal_view import journal_doc, print_entry, print_journal
from .output import JSON_KEY
from .stores import log_dir

STORE = click.argument("store", metavar="STORE")
RUN = click.argument("run_id", metavar="RUN")
STEP = click.argument("step_id", metavar="STEP")
BY = click.option("--by", default=None, metavar="NAME", help="Who decides (recorded).")
NOTE = click.option("--note", default=None, metavar="TEXT", help="Why (recorded).")


def _on_s3(store: str) -> bool:
    return store.startswith("s3://")


@contextmanager
def _reading(store: str, serde: str = "auto") -> Iterator[Any]:
    """The store to read: a local one read-only with the serde that decodes it; an
    ``s3://`` one as a reader (the writer keeps running)."""
    if _on_s3(store):
        with open_store(store, read_only=True) as s:
            yield s
        return
    with open_reader(Path(store), serde) as s:
        yield s


@contextmanager
def _deciding(store: str) -> Iterator[Any]:
    """The store to decide on: a local one opened to write beside its other writers
    (no index snapshot at close: a decision adds one frame, nothing else); an ``s3://``
    one read-only (its one writer journals the decision object)."""
    if _on_s3(store):
        with open_store(store, read_only=True) as s:
            yield s
        return
    with open_store(log_dir(Path(store)), index_every=0) as s:
        yield s


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="seconds")


def _where(r: dict) -> str:
    """What a run stands on, in words: the approval it waits for, the call in doubt,
    the wake-up time, the failure; and the calls it left in doubt."""
    doubt = r.get("in_doubt") or ()
    left = "; ".join(f"tool {d['action']!r} at step {d['step']}" for d in doubt)
    left = f"left in doubt (durkv resolve): {left}" if left else ""
    return "; ".join(w for w in (_stands_on(r), left) if w)


def _stands_on(r: dict) -> str:
    st, step, action = r["status"], r["step"], r["action"]
    decided = f": {r['decided']}, acted on when the run next runs" if r["decided"] else ""
    if st == "waiting":
        more = len(r.get("pending") or ()) - (0 if r["decided"] else 1)
        also = f" (and {more} more undecided)" if more > 0 else ""
        return f"approval of {action!r} at step {step}{decided}{also}"
    if st == "in_doubt":
        return f"tool {action!r} at step {step}{decided}"
    if st == "sleeping":
        return f"until {_when(r['until'])}"
    if st in ("failed", "damaged"):
        return r["message"] or ""
    if st == "running" and r["driver"] is None:
        if r.get("langgraph"):      # its journal never says that the graph ended
            return ("no driver: a LangGraph thread, finished or stopped mid-run; if its "
                    "graph had not ended, invoke it again to resume")
        return "no driver: it stopped mid-run; run it again to resume"
    return ""


@click.command("runs")
@STORE
@click.option("--status", type=click.Choice((*STATUSES, "damaged")), default=None,
              help="Only the runs in this state.")
@output.json_option
@click.pass_context
def runs(ctx: click.Context, store: str, status: str | None, as_json: bool) -> None:
    """List every run of a store: its state, steps, last activity and size.

    A state is running, waiting (for approval: of what, at which step), sleeping
    (until when), in_doubt (a tool call with an intent and no receipt: which),
    finished, failed (why) or damaged (a repair cut its records); WHERE also names the
    tool calls a run that caught InDoubtError left in doubt. STEPS counts its
    durable calls; SIZE is what its journal records take in the log; DRIVER is the
    pid of the process driving it now (a running run without one stopped mid-run:
    run it again to resume it; a LangGraph thread's journal never records that its
    graph ended, so such a thread may also have finished). Opens the store read-only:
    safe while agents run.

    \b
    Example:
        durkv runs ./agent.durkv
        durkv runs --status waiting ./agent.durkv
        durkv runs --json ./agent.durkv | jq '.runs[].run_id'
    """
    ctx.meta[JSON_KEY] = as_json
    with _reading(store) as s:
        rows = overview(s, status)
    if as_json:
        output.emit_json({"store": store, "runs": rows})
        return
    if not rows:
        click.echo(f"no runs{f' with status {status}' if status else ''} in {store}")
        return
    click.echo(output.table(
        [(r["run_id"], r["status"], str(r["steps"]), _when(r["updated"]),
          output.human_bytes(r["bytes"]), "-" if r["driver"] is None else str(r["driver"]),
          _where(r)) for r in rows],
        ("RUN", "STATUS", "STEPS", "LAST ACTIVITY", "SIZE", "DRIVER", "WHERE"),
        right=frozenset({2, 4, 5})))


@click.command("journal")
@STORE
@RUN
@click.option("--step", "step", default=None, metavar="ID",
              help="Print the entry of this step id whole (every field).")
@serde_option
@output.json_option
@click.pass_context
def journal(ctx: click.Context, store: str, run_id: str, step: str | None, serde: str,
            as_json: bool) -> None:
    """Print a run's journal: one line per durable call.

    Each line: the step id, its kind (step, tool, approval, now, sleep, ...), the
    planned action, the prompt (p=) and tool (t=) versions, its state, retries,
    and the approval, the error or the receipt. --step prints one entry whole.
    Opens the store read-only: safe while the run is driven.

    \b
    Example:
        durkv journal ./agent.durkv ticket-42
        durkv journal ./agent.durkv ticket-42 --step 3
        durkv journal --json ./agent.durkv ticket-42 | jq '.journal[].state'
    """
    ctx.meta[JSON_KEY] = as_json
    with _reading(store, serde) as s:
        doc = journal_doc(s, run_id, step)
    if doc is None:
        raise NotFoundError(f"no run {run_id!r} in {store}; `durkv runs {store}` lists its "
                            "runs", run_id=run_id)
    if step is not None and not doc["journal"]:
        raise NotFoundError(f"run {run_id!r} has no step {step!r}; `durkv journal {store} "
                            f"{run_id}` lists its steps", run_id=run_id, step_id=step)
    if as_json:
        output.emit_json(doc)
    elif step is None:
        print_journal(doc)
    else:
        for i, e in enumerate(doc["journal"]):
            if i:
                click.echo("")
            print_entry(e)


def _decide(ctx: click.Context, store: str, run_id: str, step_id: str, approved: bool,
            by: str | None, note: str | None, as_json: bool) -> None:
    ctx.meta[JSON_KEY] = as_json
    started = time.time()
    with _deciding(store) as s:
        d = s.decide(run_id, step_id, approved, by=by, note=note)
    # the same decision given before: decide returns the recorded one, with its time
    earlier = d.decided_at is not None and d.decided_at < started
    doc = {"run_id": run_id, "step_id": step_id, "approved": d.approved, "by": d.by,
           "note": d.note, "decided_at": d.decided_at, "recorded_before": earlier}
    if as_json:
        output.emit_json(doc)
        return
    who = f" by {d.by}" if d.by is not None else ""
    what = "approved" if d.approved else "rejected"
    if earlier:
        click.echo(f"run {run_id} step {step_id}: already {what}{who} at "
                   f"{_when(d.decided_at)}; that decision holds")
    else:
        click.echo(f"run {run_id} step {step_id}: {what}{who} at {_when(d.decided_at)}; "
                   "the run acts on it at its next step")


_DECIDE_HELP = """

    A decision is durable (fdatasync'd) when the command returns, and final: the
    same decision again prints the one recorded; the other one is refused (exit
    1, DecisionConflictError), also when two operators race. Works while another
    process drives the run: it sees the decision at its next read of the journal.
    Refused in one line: no such run (exit 1), no approval at STEP (exit 1).
    STORE is a store directory, or an s3://BUCKET/PREFIX store (its writer
    journals the decision; exit 1 if none does within the wait).
"""


def _decision_command(name: str, approved: bool, summary: str, examples: str) -> Any:
    """``durkv approve`` / ``durkv reject``: one command each, the same arguments."""

    @click.command(name, help=f"{summary}{_DECIDE_HELP}\n    \b\n    Example:\n{examples}")
    @STORE
    @RUN
    @STEP
    @BY
    @NOTE
    @output.json_option
    @click.pass_context
    def command(ctx: click.Context, store: str, run_id: str, step_id: str, by: str | None,
                note: str | None, as_json: bool) -> None:
        _decide(ctx, store, run_id, step_id, approved, by, note, as_json)

    return command


approve = _decision_command("approve", True, "Approve the approval a run waits for at STEP.", """\
        durkv approve ./agent.durkv ticket-42 3 --by alice
        durkv approve ./agent.durkv ticket-42 3 --by alice --note "refund ok"
        durkv approve --json s3://bucket/agents ticket-42 3
""")
reject = _decision_command("reject", False, "Reject the approval a run waits for at STEP.", """\
        durkv reject ./agent.durkv ticket-42 3 --by bob --note "amount too high"
        durkv reject --json ./agent.durkv ticket-42 3
""")


@click.command("resolve")
@STORE
@RUN
@STEP
@click.option("--done/--not-done", "done", default=None,
              help="The call did happen (--done: its --result is replayed as its receipt) "
                   "or did not (--not-done: the run calls it once more, same key).")
@click.option("--result", "result", default=None, metavar="JSON",
              help="With --done: what the call returned, as JSON (default null).")
@BY
@NOTE
@output.json_option
@click.pass_context
def resolve(ctx: click.Context, store: str, run_id: str, step_id: str, done: bool | None,
            result: str | None, by: str | None, note: str | None, as_json: bool) -> None:
    """Say what happened to a tool call in doubt (an intent without a receipt).

    The answer is durable when the command returns, and final for that attempt:
    the same answer again is a no-op; another is refused (exit 1,
    DecisionConflictError). Refused in one line: no such run or no tool call at
    STEP (exit 1), a call a live driver is making, not in doubt (exit 1,
    RunBusyError), a call that has a receipt (exit 2).

    \b
    Example:
        durkv resolve ./agent.durkv ticket-42 5 --done --result '{"id": "ch_1"}'
        durkv resolve ./agent.durkv ticket-42 5 --not-done --by alice
        durkv resolve --json ./agent.durkv ticket-42 5 --done
    """
    ctx.meta[JSON_KEY] = as_json
    if done is None:
        raise ConfigError("say what happened: --done (with --result JSON) or --not-done")
    value = None
    if result is not None:
        if not done:
            raise ConfigError("--result goes with --done: a call that did not happen "
                              "returned nothing")
        value = _result_json(result)
    with _deciding(store) as s:
        s.resolve(run_id, step_id, done=done, result=value, by=by, note=note)
    if as_json:
        output.emit_json({"run_id": run_id, "step_id": step_id, "done": done,
                          "result": value, "by": by, "note": note})
        return
    what = "done: the run replays the result as its receipt" if done else (
        "not done: the run calls it once more, with the same key")
    click.echo(f"run {run_id} step {step_id}: resolved as {what}")


# The deepest --result taken: far past any tool's answer, and well inside what the store's
# msgpack (512 levels) and Python's json (the recursion limit) handle; 3000 levels were a
# RecursionError traceback.
MAX_RESULT_DEPTH = 200


def _result_json(text: str) -> Any:
    """``--result``: strict JSON (no NaN, no Infinity, not even by overflow: 1e400),
    nested at most MAX_RESULT_DEPTH levels; ConfigError naming the fix otherwise."""
    try:
        value = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except RecursionError:
        value = None
        deep = True
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"--result is not JSON ({exc}); quote it for the shell, e.g. "
                          "--result '{\"id\": 1}'") from None
    else:
        deep = _depth(value) > MAX_RESULT_DEPTH
    if deep:
        raise ConfigError(f"--result is nested more than {MAX_RESULT_DEPTH} levels deep; "
                          "give the call's result as it was, flatter")
    return value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    f = float(text)
    if f in (float("inf"), float("-inf")):
        raise ConfigError(f"--result holds the number {text:.40}, beyond a float's range "
                          "(it would be Infinity, which JSON has not); give it as a string")
    return f


def _depth(value: Any) -> int:
    """How deep lists and objects nest in ``value`` (a loop: no recursion to run out of)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest
