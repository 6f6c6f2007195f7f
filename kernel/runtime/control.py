"""The operator's verbs over runs: list them, decide approvals, resolve in-doubt steps.

They only append journal records (durably) and read journals: a run that is
not open anywhere picks the decision up when it is executed again.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from ..errors import (
    ConfigError, DecisionConflictError, FrameTooLargeError, NotFoundError, SerializationError,
)
from . import remote
from .journal import E_DECISION, E_RESOLVE, RunInfo, fold
from .run import Decision

__all__ = ["runs", "decide", "resolve"]


def runs(store: Any) -> list[RunInfo]:
    """Every run with a journal and its status: ``running``, ``waiting`` (for approval,
    ``step`` says which), ``sleeping`` (``until``), ``in_doubt`` (``step``), ``finished``,
    ``failed`` (``message``)."""
    out = []
    for rid in store.journal_runs():
        st = fold(rid, store.journal(rid))
        out.append(RunInfo(rid, st.status or "running", st.until, st.status_step,
                           len(st.order), st.message, st.created, st.updated))
    return out


# decide/resolve of one store: re-reading the journal, checking and appending is one step
_locks: "weakref.WeakKeyDictionary[Any, threading.Lock]" = weakref.WeakKeyDictionary()
_locks_lock = threading.Lock()


def _store_lock(store: Any) -> threading.Lock:
    with _locks_lock:
        lk = _locks.get(store)
        if lk is None:
            lk = _locks[store] = threading.Lock()
        return lk


def _entry(store: Any, run_id: str, step_id: str, kind: str):
    """The step's entry as the log holds it now (read under the store's decision lock)."""
    st = fold(run_id, store.journal(run_id))
    e = st.latest(step_id)
    if e is None or e.kind != kind:
        have = "nothing" if e is None else f"a {e.kind} ({e.name!r})"
        raise NotFoundError(f"run {run_id!r} has {have} at step {step_id!r}, not a {kind}; "
                            f"see `durkv show STORE {run_id}` for its steps",
                            run_id=run_id, step_id=step_id)
    return e


def decide(store: Any, run_id: str, step_id: str, approved: bool, *, by: Any = None,
           note: Any = None) -> Decision:
    """Record the decision on the approval pending at ``step_id`` (durably, before it
    returns). A decision is final: deciding again the same way returns the recorded
    decision; the other way raises :class:`durkv.DecisionConflictError` (also when two
    callers race: the check and the append are one step, and exactly one wins)."""
    if type(approved) is not bool:
        raise ConfigError(f"approved must be True or False, got {approved!r}")
    if remote.on_s3(store):     # one writer: through a decision object (FORMAT.md 13)
        return remote.decide(store, run_id, step_id, approved, by=by, note=note)
    with _store_lock(store):
        e = _entry(store, run_id, step_id, "approval")
        d = e.decision
        if d is not None:
            if bool(d.get("ok")) != approved:
                raise DecisionConflictError(
                    f"run {run_id!r} step {step_id}: approval of {e.name!r} was already "
                    f"{'approved' if d.get('ok') else 'rejected'} by {d.get('by')!r}; a "
                    "decision is final and the run acts on that one",
                    run_id=run_id, step_id=step_id, recorded=bool(d.get("ok")))
            return Decision(step_id, approved, d.get("by"), d.get("note"), d.get("t"))
        t = time.time()
        rec = {"e": E_DECISION, "t": t, "s": step_id, "g": e.gen, "fp": e.fp, "ok": approved,
               "by": by, "note": note}
        try:
            store.append_journal(run_id, rec, durable=True)
        except SerializationError as exc:
            raise ConfigError(f"by= and note= must be plain data (str, numbers): {exc}") from exc
    return Decision(step_id, approved, by, note, t)


def resolve(store: Any, run_id: str, step_id: str, *, done: bool, result: Any = None,
            by: Any = None, note: Any = None) -> None:
    """Record what really happened to an in-doubt tool call (intent, no receipt):
    ``done=True`` with the call's ``result`` (replayed as its receipt), or ``done=False``
    (the next execution calls it once more, with the same key; if that call is
    interrupted too, it is in doubt again).

    The answer about one attempt is final: the same answer again is a no-op, another
    one raises :class:`durkv.DecisionConflictError`."""
    if type(done) is not bool:
        raise ConfigError(f"done must be True or False, got {done!r}")
    if remote.on_s3(store):     # one writer: through a decision object (FORMAT.md 13)
        return remote.resolve(store, run_id, step_id, done=done, result=result, by=by,
                              note=note)
    rec: dict = {"e": E_RESOLVE, "t": time.time(), "s": step_id, "done": done,
                 "by": by, "note": note}
    if done:
        try:
            rec["r"] = store.serde.dumps(result)
        except Exception as exc:
            raise SerializationError(f"the result given to resolve cannot be serialized: "
                                     f"{exc}", run_id=run_id, step_id=step_id) from exc
    with _store_lock(store):
        e = _entry(store, run_id, step_id, "tool")
        if e.resolved is not None:
            _same_resolution(run_id, e, rec)
            return
        if e.done:
            raise ConfigError(f"run {run_id!r} step {step_id}: tool {e.name!r} has a "
                              "receipt; only an in-doubt call (intent without receipt) can "
                              "be resolved")
        rec["g"] = e.gen
        try:
            store.append_journal(run_id, rec, durable=True)
        except FrameTooLargeError as exc:
            raise FrameTooLargeError(
                f"run {run_id!r} step {step_id}: the result given to resolve is too large "
                f"to journal ({exc}); store the payload elsewhere and resolve with a "
                "reference to it (e.g. its URL or id): the run replays what resolve "
                "records", run_id=run_id, step_id=step_id) from exc


def _same_resolution(run_id: str, e: Any, rec: dict) -> None:
    """A second answer about one attempt: the same one is a no-op, another is refused."""
    r = e.resolved
    if r.get("done") == rec["done"] and r.get("r") == rec.get("r"):
        return
    was = "done, with another result" if r.get("done") and rec["done"] else (
        "done" if r.get("done") else "not done")
    raise DecisionConflictError(
        f"run {run_id!r} step {e.step_id}: tool {e.name!r} (key {e.key}) was already "
        f"resolved as {was} by {r.get('by')!r}; a resolution is final and the run acts on "
        "that one", run_id=run_id, step_id=e.step_id, key=e.key)
