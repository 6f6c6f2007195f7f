"""Decisions on a live ``s3://`` store, from any machine (docs/FORMAT.md section 13).

The store has one writer, and only it appends. ``store.decide`` / ``store.resolve``
on an ``s3://`` store therefore pass through a create-only *decision object* keyed by
the exact request answered (run, step, attempt, fingerprint): of two contradictory
answers exactly one wins at S3. A handle that is not the writer (``durkv.open(url,
read_only=True)`` on another machine) PUTs the object and waits for the writer's ack;
the writer takes objects into the journal at open, on a poll, and when a run is
opened, and its own ``decide`` goes through the same object. The object mechanics are
:mod:`durkv.backends.s3.decisions`; this module is what a decision means.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from typing import Any

from ..errors import (
    ApprovalMismatchError, BackendError, ConfigError, DecisionConflictError, DurkvError,
    NotFoundError, SerializationError, StoreClosedError,
)
from .journal import E_DECISION, E_RESOLVE, RunState, fold
from .records import DecisionRecord, ResolveRecord
from .run import Decision
from .values import Values

__all__ = ["on_s3", "decide", "resolve", "start", "stop", "take", "check_answer", "same_answer"]

log = logging.getLogger("durkv")

_boxes: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_intakes: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_locks: "weakref.WeakKeyDictionary[Any, threading.RLock]" = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def _locks_after_fork() -> None:
    # a forked child has only the forking thread: a lock another thread held at the fork
    # would never be released
    global _guard, _locks
    _guard = threading.Lock()
    _locks = weakref.WeakKeyDictionary()


os.register_at_fork(after_in_child=_locks_after_fork)


def on_s3(store: Any) -> bool:
    """Whether ``store`` is a live ``s3://`` store (its decisions take this path)."""
    return str(store.url).startswith("s3://")


def _box(store: Any) -> Any:
    from ..backends.s3.decisions import DecisionBox      # needs boto3: loaded on use

    with _guard:
        box = _boxes.get(store)
        if box is None:
            box = _boxes[store] = DecisionBox(store.url)
        return box


def _lock(store: Any) -> threading.RLock:
    with _guard:
        lk = _locks.get(store)
        if lk is None:
            lk = _locks[store] = threading.RLock()
        return lk


# -- the writer's intake --------------------------------------------------------------------

def start(store: Any) -> None:
    """A writer on an ``s3://`` store: take every pending decision object in now (before
    any run reads its journal: a writer that took the store over honours what was
    decided while none ran), then on a poll in the background."""
    if not on_s3(store) or store.read_only:
        return
    from ..backends.s3.decisions import Intake

    epoch = int(store.verify().details.get("writer_epoch") or 0)    # no I/O when not deep
    ref = weakref.ref(store)    # the intake's thread must not keep a dropped store alive

    def take_one(doc: dict) -> dict:
        alive = ref()
        if alive is None:
            raise StoreClosedError(f"{doc.get('run')!r}: the store was dropped")
        return take_in(alive, doc)

    intake = Intake(_box(store), take_one, store, lambda: epoch)
    with _guard:
        _intakes[store] = intake
    try:
        intake.run_pass()
    except DurkvError as exc:   # a run opened now finds no decision and pauses: safe
        log.warning("durkv: %s: the pending decisions could not be taken in at open (%s); "
                    "the intake tries again on its next pass", store.url, exc)
    intake.start()


def stop(store: Any) -> None:
    with _guard:
        intake = _intakes.pop(store, None)
    if intake is not None:
        intake.stop()


def take(store: Any, run_id: str) -> None:
    """Before a run is opened on the writer: take that run's pending decisions in (not
    from a running event loop, ``store.arun``: no request blocks the loop; the intake's
    poll takes them in)."""
    intake = _intakes.get(store) if on_s3(store) else None
    if intake is None:
        return
    try:
        asyncio.get_running_loop()
        return
    except RuntimeError:
        pass
    intake.run_pass(run_id)


def take_in(store: Any, doc: dict) -> dict:
    """The writer takes one decision object into the run's journal (FORMAT.md 13, steps
    1-3); the ack's fields. Refusals are acks; a write error propagates (no ack)."""
    from ..backends.s3.decisions import decode_result, refusal

    kind, run_id, step_id, q = doc["kind"], doc["run"], doc["step"], doc["q"]
    answer = dict(doc["answer"])
    try:
        if kind == "resolve" and answer.get("done"):
            answer["r"] = decode_result(answer.get("r"))
        _plain(doc.get("by"), doc.get("note"))
    except (ValueError, ConfigError) as exc:
        return refusal(ConfigError(f"decision object {q}: {exc}"))
    with _lock(store):
        records = store.journal(run_id)
        for r in records:       # 1. taken in before (the writer died before its ack)
            if r.get("dq") == q and r.get("e") in (E_DECISION, E_RESOLVE):
                try:
                    same_answer(kind, run_id, step_id, r, answer)
                except DecisionConflictError as exc:
                    return refusal(exc)
                return {"ok": True, "lsn": None, "rec": _public(kind, r)}
        st = fold(run_id, records)
        try:            # 2. the request must be the one pending
            recorded = check_answer(st, run_id, step_id, kind, answer, request=doc["request"])
        except DurkvError as exc:
            return refusal(exc)
        if recorded is not None:
            return {"ok": True, "lsn": None, "rec": _public(kind, recorded)}
        e = st.latest(step_id)
        by, note = doc.get("by"), doc.get("note")
        if kind == "approval":
            rec = DecisionRecord(doc["t"], step_id, e.gen, e.fp, bool(answer.get("ok")), by,
                                 note, q).pack()
        else:
            done = bool(answer.get("done"))
            rec = ResolveRecord(doc["t"], step_id, done, by, note,
                                answer.get("r") if done else None, e.gen, q).pack()
        try:            # 3. durable before the ack
            lsn = store.append_journal(run_id, rec, durable=True)
        except (SerializationError, ConfigError) as exc:
            return refusal(ConfigError(str(exc)) if not isinstance(exc, ConfigError) else exc)
        return {"ok": True, "lsn": lsn, "rec": _public(kind, rec)}


# -- the checks, shared by deciders and the writer -------------------------------------------

def _plain(*values: Any) -> None:
    for v in values:
        if v is not None and type(v) not in (str, int, float, bool):
            raise ConfigError(f"by= and note= must be plain data (str, numbers) on an s3:// "
                              f"store, got {type(v).__name__}")


def request_of(st: RunState, kind: str, step_id: str) -> list:
    """The request an answer at ``step_id`` answers (FORMAT.md 13): what names it."""
    e = st.latest(step_id)
    attempt = e.retry_count if kind == "resolve" else 0
    return [kind, st.run_id, st.created, step_id, e.gen, e.started, attempt, e.fp]


def check_answer(st: RunState, run_id: str, step_id: str, kind: str, answer: dict, *,
                 request: list | None = None, fingerprint: int | None = None) -> dict | None:
    """Refuse an answer that does not fit the journal (typed errors; the one check of
    every decide/resolve, here and in control.py); the recorded answer when the same one
    is already there, else None (to record)."""
    want = "approval" if kind == "approval" else "tool"
    if st.created is None and not st.entries:
        raise NotFoundError(f"no run {run_id!r} in this store; `durkv runs STORE` lists its "
                            "runs", run_id=run_id, step_id=step_id)
    e = st.latest(step_id)
    if e is None or e.kind != want:
        have = "nothing" if e is None else f"a {e.kind} ({e.name!r})"
        raise NotFoundError(f"run {run_id!r} has {have} at step {step_id!r}, not "
                            f"{'an' if want == 'approval' else 'a'} {want}; "
                            f"see `durkv journal STORE {run_id}` for its steps",
                            run_id=run_id, step_id=step_id)
    if fingerprint is not None and fingerprint != e.fp:
        raise ApprovalMismatchError(
            f"run {run_id!r} step {step_id}: the request pending there has fingerprint "
            f"{e.fp:016x}, the decision is for {fingerprint:016x}; look at the request "
            f"again (`durkv journal STORE {run_id} --step {step_id}`) and decide on it",
            run_id=run_id, step_id=step_id)
    if request is not None:
        now = request_of(st, kind, step_id)
        if now != request:
            if now[:7] == request[:7]:
                raise ApprovalMismatchError(
                    f"run {run_id!r} step {step_id}: the decision is for fingerprint "
                    f"{request[7]:016x}, the request pending there has {e.fp:016x}; decide "
                    "on the request as it is", run_id=run_id, step_id=step_id)
            raise NotFoundError(
                f"run {run_id!r} step {step_id}: the request this decision answers is not "
                "the one the journal holds now (the run was created again, or the call "
                "made another attempt); decide on the current one",
                run_id=run_id, step_id=step_id)
    if kind == "approval":
        if e.decision is not None:
            same_answer(kind, run_id, step_id, e.decision, answer, e.name)
            return e.decision
        return None
    if e.resolved is not None:
        same_answer(kind, run_id, step_id, e.resolved, answer, e.name)
        return e.resolved
    if e.done:
        raise ConfigError(f"run {run_id!r} step {step_id}: tool {e.name!r} has a receipt; "
                          "only an in-doubt call (intent without receipt) can be resolved")
    return None


def same_answer(kind: str, run_id: str, step_id: str, rec: dict, answer: dict,
          name: str = "") -> None:
    """DecisionConflictError unless the recorded ``rec`` gives ``answer``."""
    if kind == "approval":
        if bool(rec.get("ok")) == bool(answer.get("ok")):
            return
        raise DecisionConflictError(
            f"run {run_id!r} step {step_id}: approval {name!r} was already "
            f"{'approved' if rec.get('ok') else 'rejected'}{_by(rec)}; a decision "
            "is final and the run acts on that one", run_id=run_id, step_id=step_id,
            recorded=bool(rec.get("ok")))
    if rec.get("done") == answer.get("done") and rec.get("r") == answer.get("r"):
        return
    was = "done, with another result" if rec.get("done") and answer.get("done") else (
        "done" if rec.get("done") else "not done")
    raise DecisionConflictError(
        f"run {run_id!r} step {step_id}: tool {name!r} was already resolved as {was}"
        f"{_by(rec)}; a resolution is final and the run acts on that one",
        run_id=run_id, step_id=step_id)


def _by(rec: dict) -> str:
    """' by NAME' of a recorded answer, or nothing when it was given without by=."""
    return "" if rec.get("by") is None else f" by {rec['by']!r}"


def _public(kind: str, rec: dict) -> dict:
    """What an ack says was recorded (JSON: a resolution's result stays in the journal)."""
    out = {"by": rec.get("by"), "note": rec.get("note"), "t": rec.get("t")}
    if kind == "approval":
        out["ok"] = bool(rec.get("ok"))
    else:
        out["done"] = bool(rec.get("done"))
    return out


# -- deciding: decide / resolve on an s3:// store --------------------------------------------

def decide(store: Any, run_id: str, step_id: str, approved: bool, *, by: Any = None,
           note: Any = None, fingerprint: int | None = None,
           wait_ms: int | None = None) -> Decision:
    """``store.decide`` on an ``s3://`` store (writer or not): the decision once the
    writer has journaled it durably.

    Args:
        fingerprint: the request's ``fp`` as the decider saw it (e.g. shown by ``durkv
            journal``): refused with ApprovalMismatchError if the pending request has
            another.
        wait_ms: how long to wait for the writer's ack (default: ``decision_wait_ms`` of
            the URL, else 60 s).

    Raises:
        NotFoundError, DecisionConflictError, ApprovalMismatchError: refused.
        DecisionPendingError: the object is in S3 but no writer took it in within the
            wait; it stands, and a writer takes it in at its next pass.
    """
    rec = _answer(store, "approval", run_id, step_id, {"ok": approved}, by, note,
                  fingerprint, wait_ms)
    return Decision(step_id, bool(rec.get("ok")), rec.get("by"), rec.get("note"), rec.get("t"))


def resolved_result(store: Any, run_id: str, step_id: str, result: Any) -> bytes:
    """The serialized ``result`` a ``resolve(done=True)`` records (on any store): checked
    as a tool's receipt is, so that the replay returns an equal value of its type."""
    try:
        return Values(store.serde).record(result)
    except Exception as exc:
        raise SerializationError(f"the result given to resolve cannot be recorded: "
                                 f"{exc}", run_id=run_id, step_id=step_id) from exc


def resolve(store: Any, run_id: str, step_id: str, *, done: bool, result: Any = None,
            by: Any = None, note: Any = None, wait_ms: int | None = None) -> None:
    """``store.resolve`` on an ``s3://`` store, as :func:`decide`."""
    answer: dict = {"done": done}
    if done:
        answer["r"] = resolved_result(store, run_id, step_id, result)
    _answer(store, "resolve", run_id, step_id, answer, by, note, None, wait_ms)


def _answer(store: Any, kind: str, run_id: str, step_id: str, answer: dict, by: Any,
            note: Any, fingerprint: int | None, wait_ms: int | None) -> dict:
    from ..backends.s3.decisions import DecisionPendingError, encode_result

    _plain(by, note)
    box = _box(store)
    wire = dict(answer)
    if "r" in wire:
        wire["r"] = encode_result(wire["r"])
    for _ in range(4):
        if store.read_only:
            store.refresh()         # the writer's newest batches
        with _lock(store):
            st = fold(run_id, store.journal(run_id))
            recorded = check_answer(st, run_id, step_id, kind, answer, fingerprint=fingerprint)
            if recorded is not None:
                return _public(kind, recorded)
            doc = box.make(request_of(st, kind, step_id), wire, by=by, note=note, t=time.time())
            held = box.submit(doc)
            if held is not doc and held.get("answer") != wire:
                same_answer(kind, run_id, step_id, _decoded(held), answer,
                            st.latest(step_id).name)
                # the same answer in other words (a result that encodes differently)
            if not store.read_only:     # the writer: take it in now
                intake = _intakes.get(store)
                fields = take_in(store, held)
                epoch = intake.epoch() if intake is not None else 0
                return _outcome(box.write_ack(held, fields, epoch))
        ack = box.wait(doc, held, wait_ms)
        if ack is None:
            raise DecisionPendingError(
                f"run {run_id!r} step {step_id}: the {'decision' if kind == 'approval' else 'resolution'} "
                f"is in S3 ({box.loc.key(box.object_rel(run_id, held['q']))}) but no writer "
                "has taken it into the journal yet (none has the store open, or it did not "
                "poll in time); it stands: the writer takes it in at its next pass, or the "
                "next writer when it opens. Run the same command again to see the answer",
                run_id=run_id, step_id=step_id)
        if not ack.get("gone"):
            return _outcome(ack)
        # cleaned up meanwhile: the journal has the answer (or the key is free again)
    raise BackendError(f"run {run_id!r} step {step_id}: the decision objects of this request "
                       "keep vanishing while read; try again")


def _decoded(doc: dict) -> dict:
    from ..backends.s3.decisions import decode_result

    a = dict(doc.get("answer") or {})
    if a.get("done"):
        try:
            a["r"] = decode_result(a.get("r"))
        except ValueError:
            a["r"] = None
    a["by"] = doc.get("by")
    return a


def _outcome(ack: dict) -> dict:
    """The recorded answer of an ``ok`` ack; a refusal raises its error."""
    from ..backends.s3.decisions import ack_error

    if ack.get("ok"):
        return dict(ack.get("rec") or {})
    raise ack_error(ack)
