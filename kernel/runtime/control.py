"""The operator's verbs over runs: list them, decide approvals, resolve in-doubt steps.

They only append journal records (durably) and read journals: a run that is
not open anywhere picks the decision up when it is executed again, and a run
another process drives sees it at its next read of the journal.

A decision's check and its append are one step (``Store.append_journal_if``): the
journal is read, checked and appended to inside the store's write section, after
catching up with every other process's frames, so of two contradictory answers --
threads, handles or processes -- exactly one is recorded and the other is refused.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..errors import ConfigError, FrameTooLargeError, RunBusyError, SerializationError
from . import remote
from .journal import E_DECISION, RunInfo, RunState, fold, fold_lazy
from .records import DecisionRecord, ResolveRecord
from .remote import check_answer
from .repair import mark_damaged
from .run import Decision

__all__ = ["runs", "run_info", "overview", "decide", "resolve"]


def runs(store: Any) -> list[RunInfo]:
    """Every run with a journal and its status: ``running``, ``waiting`` (for approval,
    ``step`` says which), ``sleeping`` (``until``), ``in_doubt`` (``step``), ``finished``,
    ``failed`` (``message``)."""
    return [_info(_state(store, rid)) for rid in store.journal_runs()]


def run_info(store: Any, run_id: str) -> RunInfo | None:
    """One run as :func:`runs` lists it (its journal alone is read); None: no journal."""
    return _info(_state(store, run_id)) if store.journal_length(run_id) else None


def _state(store: Any, run_id: str) -> RunState:
    """``run_id``'s journal folded lazily -- its plain STEP records counted and dated but
    not decoded, as a re-execution opens it (GUARANTEES 16.11: the answers are the eager
    fold's) -- or eagerly when its heads do not read that way (the eager read names what
    is wrong with them). A listing of long runs then costs a scan, not a decode of every
    record."""
    try:
        return fold_lazy(run_id, store.journal_heads(run_id))
    except ValueError:
        return fold(run_id, store.journal(run_id))


def _info(st: RunState) -> RunInfo:
    step = st.status_step
    if st.status == "waiting" and step is not None:
        # the status names the first approval of a superstep (durkv.Graph's parallel
        # nodes each ask): once it is decided, the run still waits for the next one
        e = st.latest(step)
        if e is not None and e.decision is not None:
            pending = _undecided(st)
            step = pending[0]["step"] if pending else step
    return RunInfo(st.run_id, st.status or "running", st.until, step,
                   st.calls, st.message, st.created, st.updated)


def overview(store: Any, status: str | None = None) -> list[dict]:
    """Every run (of ``status``, if given) as ``durkv runs`` reports it: the fields of
    :class:`RunInfo` (a damaged run marked, as ``store.runs()`` does), ``action`` -- the
    name of the approval or tool call at ``step`` that a waiting or in-doubt run stands
    on --, ``decided`` -- the answer recorded there since (``approved``, ``rejected``,
    ``done``, ``not done``; the run acts on it when it next runs), else None --,
    ``pending`` -- every approval a waiting run still waits for (``[{"step",
    "action"}]``; ``step`` is the first of them once the status's own is decided) --, ``in_doubt`` --
    the tool calls a run that is not running left with an intent and no receipt or
    answer beside the one its status names (a run that caught ``InDoubtError`` and went
    on: ``[{"step", "action"}]``; each waits for ``durkv resolve``) -- and ``bytes``, what its journal frames take in the log, and ``driver``, the pid of the
    process driving it now (a ``store.run``/``durkv.Graph`` run, or a LangGraph thread),
    else None: a ``running`` run without a driver stopped mid-run and resumes when it is
    run again -- unless ``langgraph`` (set for such a run only: the journal of a LangGraph
    thread, which never records that its graph ended: it may have finished)."""
    states = [_state(store, rid) for rid in store.journal_runs()]
    out = []
    for st, info in zip(states, mark_damaged(store, [_info(st) for st in states])):
        if status is not None and info.status != status:
            continue
        pending = _undecided(st) if info.status == "waiting" else []
        doubt = [] if info.status == "running" else _left_in_doubt(st, info.step)
        e = st.latest(info.step) if info.step is not None else None
        d = None if e is None else (e.decision or e.resolved)
        driver = _driver(store, info)
        out.append(dict(dataclasses.asdict(info), action=None if e is None else e.name,
                        decided=None if d is None else _answer_words(d), pending=pending,
                        in_doubt=doubt,
                        bytes=store.journal_bytes(info.run_id), driver=driver,
                        langgraph=(info.status == "running" and driver is None
                                   and _langgraph_thread(store, info.run_id))))
    return out


def _undecided(st: Any) -> list[dict]:
    """The approvals of a waiting run no decision has answered yet, in journal order:
    ``[{"step", "action"}]`` (a run waits on all of them at once when parallel nodes
    asked in one superstep)."""
    out = []
    for sid, gens in st.entries.items():
        e = gens[-1]
        if e.kind == "approval" and e.decision is None:
            out.append({"step": sid, "action": e.name})
    return out


def _left_in_doubt(st: Any, own: str | None) -> list[dict]:
    """The tool calls, other than step ``own``, whose newest attempt has an intent and
    neither a receipt nor an operator's answer, in journal order: ``[{"step",
    "action"}]``. In a run that is not running they stay so until ``durkv resolve``."""
    return [{"step": sid, "action": e.name} for sid, gens in st.entries.items()
            for e in gens[-1:]
            if e.kind == "tool" and not e.done and e.resolved is None and sid != own]


def _langgraph_thread(store: Any, run_id: str) -> bool:
    """Whether run ``run_id`` is the journal of a LangGraph thread: the thread of the same
    id holds checkpoints, and they are not a durkv.Graph run's (whose record names its
    graph)."""
    head = next(iter(store.history(run_id, "", limit=1, values=False)), None)
    return head is not None and not (isinstance(head.checkpoint, dict)
                                     and "graph" in head.checkpoint)


def _driver(store: Any, info: RunInfo) -> int | None:
    if info.status in ("finished", "failed"):
        return None
    return store.driver_pid("run", info.run_id) or store.driver_pid("thread", info.run_id)


def _not_in_flight(store: Any, st: RunState, step_id: str) -> None:
    """Refuse to resolve a call a live driver may be making right now: an intent without
    a receipt is in doubt only once an execution found it so (its status names the step)
    or no process drives the run. "Not done" would have the next execution call an
    at-most-once tool again while this one may still be calling it."""
    if st.status == "in_doubt" and st.status_step == step_id:
        return
    for kind in ("run", "thread"):
        pid = store.claim_held(kind, st.run_id)
        if pid is not None:
            raise RunBusyError(
                f"run {st.run_id!r} step {step_id}: the run is being driven now (pid "
                f"{pid or '?'}) and this call is in flight, not in doubt; resolve it once "
                "the run has stopped (`durkv runs STORE` shows its driver) or the run "
                "reports it in doubt", run_id=st.run_id, holder_pid=pid)


def _answer_words(rec: dict) -> str:
    if rec.get("e") == E_DECISION:
        return "approved" if rec.get("ok") else "rejected"
    return "done" if rec.get("done") else "not done"


def _check_ids(run_id: Any, step_id: Any) -> None:
    """A run id and a step id are text (a step id as the journal shows it: ``"1"``, not 1:
    an int found nothing and said so, though the approval was there)."""
    for name, v in (("run_id", run_id), ("step_id", step_id)):
        if type(v) is not str:
            raise ConfigError(f"{name} must be a str, got {type(v).__name__} {v!r:.40}; "
                              f"as `durkv journal` shows it, e.g. {str(v)!r:.40}")


def decide(store: Any, run_id: str, step_id: str, approved: bool, *, by: Any = None,
           note: Any = None) -> Decision:
    """Record the decision on the approval pending at ``step_id`` (fdatasync'd before it
    returns, under every policy). A decision is final: deciding again the same way
    returns the recorded decision; the other way raises
    :class:`durkv.DecisionConflictError` -- also when two callers race, in one process or
    in several: the check and the append are one step, and exactly one wins.

    Raises:
        NotFoundError: no such run, or no approval at ``step_id``.
        DecisionConflictError: already decided the other way.
    """
    _check_ids(run_id, step_id)
    if type(approved) is not bool:
        raise ConfigError(f"approved must be True or False, got {approved!r}")
    if remote.on_s3(store):     # one writer: through a decision object (FORMAT.md 13)
        return remote.decide(store, run_id, step_id, approved, by=by, note=note)
    held: dict = {}

    def record(records: list[dict]) -> dict | None:
        st = fold(run_id, records)
        held["rec"] = check_answer(st, run_id, step_id, "approval", {"ok": approved})
        if held["rec"] is not None:
            return None         # the same decision again: the recorded one
        e = st.latest(step_id)
        held["rec"] = DecisionRecord(time.time(), step_id, e.gen, e.fp, approved, by,
                                     note).pack()
        return held["rec"]

    try:
        store.append_journal_if(run_id, record)
    except SerializationError as exc:
        raise ConfigError(f"by= and note= must be plain data (str, numbers): {exc}") from exc
    d = held["rec"]
    return Decision(step_id, bool(d.get("ok")), d.get("by"), d.get("note"), d.get("t"))


def resolve(store: Any, run_id: str, step_id: str, *, done: bool, result: Any = None,
            by: Any = None, note: Any = None) -> None:
    """Record what really happened to an in-doubt tool call (intent, no receipt):
    ``done=True`` with the call's ``result`` (replayed as its receipt), or ``done=False``
    (the next execution calls it once more, with the same key; if that call is
    interrupted too, it is in doubt again). Durable before it returns, as :func:`decide`.

    The answer about one attempt is final: the same answer again is a no-op, another
    one raises :class:`durkv.DecisionConflictError` (racing callers: exactly one wins)."""
    if type(done) is not bool:
        raise ConfigError(f"done must be True or False, got {done!r}")
    _check_ids(run_id, step_id)
    if remote.on_s3(store):     # one writer: through a decision object (FORMAT.md 13)
        return remote.resolve(store, run_id, step_id, done=done, result=result, by=by,
                              note=note)
    t = time.time()
    r = remote.resolved_result(store, run_id, step_id, result) if done else None
    answer = {"done": done, "r": r}

    def record(records: list[dict]) -> dict | None:
        st = fold(run_id, records)
        if check_answer(st, run_id, step_id, "resolve", answer) is not None:
            return None         # the same answer about this attempt: a no-op
        _not_in_flight(store, st, step_id)
        return ResolveRecord(t, step_id, done, by, note, r, st.latest(step_id).gen).pack()

    try:
        store.append_journal_if(run_id, record)
    except FrameTooLargeError as exc:
        raise FrameTooLargeError(
            f"run {run_id!r} step {step_id}: the result given to resolve is too large "
            f"to journal ({exc}); store the payload elsewhere and resolve with a "
            "reference to it (e.g. its URL or id): the run replays what resolve "
            "records", run_id=run_id, step_id=step_id) from exc
