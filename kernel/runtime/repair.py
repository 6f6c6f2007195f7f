"""The runtime's side of a repair: which runs a cut touched, and what they may call after.

``recover --skip-corrupt`` may cut a run's INTENT or RECEIPT records; a re-execution
would then call an at-most-once tool again as if it never ran. docs/GUARANTEES.md 16a
is the rule; FORMAT.md 6a the records:

- :func:`record_pending` (at every ``durkv.open`` by a writer) turns each note of a cut
  not yet recorded into ONE durable REPAIR record naming the touched runs and threads.
- :func:`damage_of` (at a run's open, only in a store that was ever repaired) gives a
  :class:`RunRepair` for a run with a repair not acknowledged; ``Run`` asks its
  :meth:`RunRepair.doubt` before every tool call that is not a replay: the call is held
  (in doubt) until the operator resolves it or acknowledges the repair
  (:func:`acknowledge`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from ..errors import ConfigError, NotFoundError, SerializationError
from .journal import CallState, RunInfo, fold
from .records import E_REPAIR, E_REPAIR_ACK, RepairAckRecord, RepairRecord

__all__ = ["E_REPAIR", "E_REPAIR_ACK", "RunRepair", "record_pending", "damage_of",
           "acknowledge", "mark_damaged"]

log = logging.getLogger("durkv")


# -- recording a cut -------------------------------------------------------------------------

def _went_on(store: Any, run_id: str) -> bool:
    """The conservative half of the rule: a run not ``finished`` in what survived may
    have written records into the cut (the damaged frame can never be read)."""
    return fold(run_id, store.journal(run_id)).status != "finished"


def _record(store: Any, note: dict) -> dict:
    cut = store.cut_contents(note)
    runs = sorted(cut.runs | {r for r in store.journal_runs() if _went_on(store, r)})
    threads = sorted(cut.threads)
    rid = note["id"]
    rec = RepairRecord(time.time(), rid, note["lost_first_lsn"], cut.frames, cut.unread,
                       sorted(cut.runs), threads,
                       f"repair {rid}: `durkv recover --skip-corrupt` cut the log from LSN "
                       f"{note['lost_first_lsn']}; this run's records may have been cut").pack()
    lsn = store.record_repair(note, runs, rec)
    log.warning("durkv: repair %s recorded at LSN %d: %d run(s) marked damaged (%s), "
                "%d thread(s) named in the cut (%s)", rid, lsn, len(runs),
                ", ".join(runs[:10]) or "none", len(threads), ", ".join(threads[:10]) or "none")
    return {"id": rid, "lsn": lsn, "runs": runs, "threads": threads,
            "named_runs": rec["named"], "unread": cut.unread}


def record_pending(store: Any) -> list[dict]:
    """Record every cut whose note is not recorded yet (one REPAIR record each, durable
    before the note says so). Returns what was recorded: ``id``, ``lsn``, ``runs``,
    ``threads``. A store never repaired pays one directory listing (at open)."""
    out = []
    for note in store.pending_repairs():
        with store.repair_note(note["id"]) as now:
            if now.get("state") in ("planned", "cut"):   # else: another process did it
                out.append(_record(store, now))
    return out


# -- a run touched by a repair ---------------------------------------------------------------

class RunRepair:
    """The repairs of one run not acknowledged yet, and the tool calls this execution
    was allowed (by the operator's word) to make."""

    def __init__(self, run_id: str, repairs: list[dict]) -> None:
        self.run_id = run_id
        self.ids = [r["rep"] for r in repairs]
        self.cleared: set[tuple[str, int]] = set()

    def describe(self) -> str:
        return (f"damaged by repair {', '.join(self.ids)} (`durkv recover --skip-corrupt` "
                "cut records of this run): tool calls without a surviving receipt are held "
                "until `store.resolve(...)` of each, or `store.acknowledge_repair("
                f"{self.run_id!r}, by=...)` (`durkv recover PATH --ack {self.run_id}`)")

    def doubt(self, sid: str, gen: int, key: str, name: str, e: CallState | None) -> str | None:
        """None when the call ``sid`` (generation ``gen``) may go on: the operator
        resolved it (``e``: its journal entry). Else the in-doubt message: its records
        may be in the cut."""
        if (sid, gen) in self.cleared:
            return None
        if e is not None and e.gen == gen and e.resolved is not None:
            self.cleared.add((sid, gen))      # the operator's word: this call may go on
            return None
        return (f"run {self.run_id!r} step {sid}: tool {name!r} (key {key}) has no surviving "
                f"receipt and repair {', '.join(self.ids)} may have cut its records: whether "
                "it happened is unknown, so it is not called. Check the service, then "
                f"store.resolve({self.run_id!r}, {sid!r}, done=True, result=...) or "
                "done=False (call it), or acknowledge the whole repair for this run: "
                f"store.acknowledge_repair({self.run_id!r}, by=...) / "
                f"`durkv recover PATH --ack {self.run_id}`")


def _open_repairs(records: list[dict]) -> dict[str, dict]:
    open_: dict[str, dict] = {}
    for r in records:
        ev = r.get("e")
        if ev == E_REPAIR:
            open_.setdefault(r.get("rep"), r)
        elif ev == E_REPAIR_ACK:
            for rid in r.get("rep") or ():
                open_.pop(rid, None)
    return open_


def damage_of(store: Any, run_id: str) -> RunRepair | None:
    """The run's repairs not acknowledged (None: none, or a store never repaired --
    one attribute test, no read)."""
    if not getattr(store, "repaired", False):
        return None
    open_ = _open_repairs(store.journal(run_id))
    return RunRepair(run_id, list(open_.values())) if open_ else None


def acknowledge(store: Any, run_id: str, *, by: Any = None, note: Any = None) -> list[str]:
    """The operator's word for a whole repair of run ``run_id``: its tool calls follow the
    usual rules again (docs/GUARANTEES.md 16a). A durable REPAIR_ACK record; returns the
    repair ids it acknowledged ([] when all were already: a no-op)."""
    if type(run_id) is not str or not run_id:
        raise ConfigError(f"run_id must be a non-empty string, got {run_id!r}")
    records = store.journal(run_id) if getattr(store, "repaired", False) else []
    if not any(r.get("e") == E_REPAIR for r in records):
        raise NotFoundError(f"run {run_id!r} was not touched by any repair; "
                            "`durkv runs STORE` lists the damaged runs", run_id=run_id)
    ids = list(_open_repairs(records))
    if ids:
        try:
            store.append_journal(run_id, RepairAckRecord(time.time(), ids, by, note).pack(),
                                 durable=True)
        except SerializationError as exc:
            raise ConfigError(f"by= and note= must be plain data (str, numbers): {exc}") \
                from exc
        log.warning("durkv: run %r: repair %s acknowledged by %r", run_id, ", ".join(ids), by)
    return ids


def mark_damaged(store: Any, infos: list[RunInfo]) -> list[RunInfo]:
    """``store.runs()``: a run with a repair not acknowledged shows status ``damaged``."""
    if not getattr(store, "repaired", False):
        return infos
    out = []
    for info in infos:
        d = damage_of(store, info.run_id)
        out.append(info if d is None else
                   dataclasses.replace(info, status="damaged", message=d.describe()))
    return out
