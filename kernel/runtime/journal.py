"""What a run's journal records mean: events, and their fold into entries and a status.

The store keeps a run's journal as opaque records in log order
(``Store.append_journal`` / ``Store.journal``); docs/FORMAT.md section 5a lists the
events and their fields. This module turns that list into one :class:`CallState` per
durable call (per step id and generation) and the run's status. It is pure: no
store access, no clock.

:func:`fold` builds every entry from the decoded records. :func:`fold_lazy` (what a
:class:`durkv.Run` opens with) reads the records' undecoded heads (``Store.journal_heads``)
with ``durkv._journalscan.index`` (csrc/journalscan.c): a plain STEP record -- the first
record of its step id, without ``ir`` -- stays in the heads, indexed by step id in
:attr:`RunState.lazy` (its fields as a :data:`Lazy` tuple when asked), and is decoded and
folded into its entry only when the entry is first asked for (``latest``, ``find``, or
another record of that step id). A replay compares its call with the record and decodes
the recorded result in one C call (``Index.replay`` from ``Run.step``; ``Run._plan_step``
for the other verbs): a long journal opens at the cost of reading it.

A live run holds its own new plain steps the same way (:func:`record_step`): the record's
payload, as the log was given it, joins the index (``Index.add``) instead of a
:class:`CallState` being built -- folded only when asked for, like one read at the open.
"""

from __future__ import annotations

import gc
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from .._journalscan import MISS, Index, StepEntry, bind_append, index  # noqa: F401 - StepEntry for run.py (this module wraps _journalscan)
from ..log import APPEND_ONE_ADDRESS
from ..store.stepids import unpackb
from .inputs import by_ref
from .records import (E_APPROVAL, E_DECISION, E_INTENT, E_RECEIPT, E_RESOLVE, E_RUN, E_STATUS,
                      E_STEP, E_TRY, E_WARN, ApprovalRecord, DecisionRecord, IntentRecord,
                      ReceiptRecord, ResolveRecord, RunRecord, StatusRecord, StepRecord,
                      TryRecord, WarnRecord, default_key)

# run.step's entry appends a new step's record through the log's own call, on a local
# store (csrc/journalscan.c, fast_append)
bind_append(APPEND_ONE_ADDRESS)

__all__ = ["E_RUN", "E_STEP", "E_INTENT", "E_RECEIPT", "E_APPROVAL", "E_DECISION",
           "E_RESOLVE", "E_STATUS", "E_WARN", "E_TRY", "CallState", "RunState", "RunInfo", "fold", "apply",
           "apply_step", "JournalEntry", "STATUSES", "bulk_load", "fold_lazy",
           "replays_as_asked", "Lazy", "MISS", "record_step"]

STATUSES = ("running", "waiting", "sleeping", "in_doubt", "finished", "failed")


class CallState:
    """The folded state of one durable call (one step id, one generation).

    Slotted: a replayed run folds one CallState per call (100,000 for a long run), and
    slots make each a third of the cost of a dict-backed instance to build.
    """

    __slots__ = ("step_id", "gen", "kind", "name", "fp", "inputs", "prompt_version",
                 "tool_version", "key", "retry_count", "at_most_once", "comp_of", "result",
                 "err", "done", "tries", "decision", "resolved", "started", "ended",
                 "warnings", "in_flight")

    def __init__(self, step_id: str, gen: int, kind: str, name: str, fp: int) -> None:
        self.step_id = step_id
        self.gen = gen
        self.kind = kind        # step | tool | approval | now | random | uuid | sleep
        self.name = name
        self.fp = fp
        self.inputs: Any = None     # `in` bytes, or an `ir` linked (inputs.ByRef), or None
        self.prompt_version: Any = None
        self.tool_version: Any = None
        self.key: str | None = None
        self.retry_count = 0
        self.at_most_once = False
        self.comp_of: str | None = None
        self.result: bytes | None = None     # serde bytes of the result, once done
        self.err: list | None = None         # [type, message, args_b] of a final failure
        self.done = False                    # a result or a final error is recorded
        self.tries: tuple | list = ()
        self.decision: dict | None = None    # approvals: the DECISION record
        self.resolved: dict | None = None    # in-doubt tools: the operator's RESOLVE record
        self.started: float | None = None
        self.ended: float | None = None
        self.warnings: tuple = ()
        self.in_flight = False               # tools: the latest intent has no outcome yet


@dataclass
class RunState:
    """A run's journal, folded: its input fingerprint, entries and status."""

    run_id: str
    fp: int | None = None
    input: bytes | None = None
    created: float | None = None
    entries: dict[str, list[CallState]] = field(default_factory=dict)   # step id -> generations
    order: list[CallState] = field(default_factory=list)
    status: str | None = None
    until: float | None = None
    status_step: str | None = None
    message: str | None = None
    updated: float | None = None
    task_ids: bool = False      # step ids of asyncio tasks are scoped by task (RUN "tid")
    # fold_lazy: step id -> its one STEP record, not folded yet (no entry in `entries` or
    # `order`): a durkv._journalscan.Index (a dict's get/pop/in/len, and Index.replay);
    # `order` is in log order only for a state with none (fold)
    lazy: Any = field(default_factory=dict)
    heads: Any = None       # fold_lazy: the heads read, which hold the lazy records' bytes
    out_of_order: bool = False  # fold_lazy left records unfolded: `order` is not in log order

    @property
    def calls(self) -> int:
        """How many durable calls the journal records (folded or not)."""
        return len(self.order) + len(self.lazy)

    def latest(self, step_id: str) -> CallState | None:
        if step_id in self.lazy:
            self.unfold(step_id)
        gens = self.entries.get(step_id)
        return gens[-1] if gens else None

    def find(self, step_id: str, gen: int) -> CallState | None:
        """The entry of step ``step_id`` generation ``gen``, if folded."""
        if step_id in self.lazy:
            self.unfold(step_id)
        for e in self.entries.get(step_id, ()):
            if e.gen == gen:
                return e
        return None

    def unfold(self, step_id: str) -> None:
        """Fold the record ``lazy`` holds for ``step_id`` into its entry (it is the step
        id's only record so far: the entry is the one :func:`fold` builds)."""
        x = self.lazy.pop(step_id, None)
        if x is not None:
            _fold_step(self, self.record(x))

    def record(self, x: "Lazy") -> dict:
        """The record a :data:`Lazy` tuple was read from, decoded."""
        return _unpackb(x[LAZY_RECORD])


def _entry(st: RunState, sid: str, gen: int, kind: str, name: str | None, fp: int | None,
           started: float | None) -> CallState:
    """The entry of step ``sid`` generation ``gen``: found, or made (``name``, ``fp`` and
    ``started`` are the new entry's: a record that does not carry them gives None)."""
    if st.lazy and sid in st.lazy:      # its first record, not folded yet: folded first
        st.unfold(sid)
    gens = st.entries.get(sid)
    if gens is None:        # the common case: a step id seen for the first time
        e = CallState(sid, gen, kind, name or "", fp or 0)
        st.entries[sid] = [e]
    else:
        for e in gens:
            if e.gen == gen:
                return e
        e = CallState(sid, gen, kind, name or "", fp or 0)
        gens.append(e)
        if gens[-2].gen > gen:
            gens.sort(key=lambda x: x.gen)
    e.started = started
    st.order.append(e)
    return e


@contextmanager
def bulk_load() -> Iterator[None]:
    """Pause the cyclic garbage collector while a journal is read and folded: the
    records and entries are acyclic, and with the collector on, its passes over
    the growing heap cost more than the fold itself (a 100,000-record journal
    folds ~2x faster)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def fold(run_id: str, records: list[dict]) -> RunState:
    """Fold a run's records (in log order) into its :class:`RunState`."""
    st = RunState(run_id)
    for r in records:
        apply(st, r)
    return st


# A plain STEP record as the index reads it: (sid, fp, kind, name, prompt_version, inputs,
# result, t, record) -- each field as the record's decode gives it, a missing key as
# _fold_step defaults it; `record` the record map's bytes
Lazy = tuple
LAZY_INPUTS, LAZY_RESULT, LAZY_T, LAZY_RECORD = 5, 6, 7, 8


# as the store decodes record heads (durkv.store.records): str as str, lists, a compact
# step id (FORMAT.md 5a) as its str
_unpackb = unpackb


def fold_lazy(run_id: str, heads: Any) -> RunState:
    """:func:`fold` of the records in ``heads`` (``Store.journal_heads``), leaving each
    plain STEP record (the first of its step id, no ``ir``, which links to other entries
    as they stand at it) in ``lazy`` unfolded: the state answers ``latest``/``find`` and
    every later :func:`apply` exactly as ``fold``'s. Heads that do not read as such raise
    ValueError (the eager read, ``Store.journal``, names what is wrong)."""
    lazy, rest, where, last = index(heads)
    st = RunState(run_id)
    st.heads, st.lazy = heads, lazy
    others = _unpackb(rest)
    # the others in log order, each seeing only the lazy records before it (an `ir` links
    # to entries as they stand at its record); `updated` is the t of the last record
    # that sets it, which is the last lazy record's if nothing after it does
    at = -1 if last is None else last[0]
    for pos, r in zip(where, others):
        if 0 <= at < pos:
            st.updated, at = last[1], -1
        lazy.limit = pos
        apply(st, r)
    lazy.limit = _ALL
    if at >= 0:
        st.updated = last[1]
    st.out_of_order = last is not None
    return st


_ALL = sys.maxsize      # an Index's limit when every record is read: all of them count


def replays_as_asked(x: Lazy, kind: str, name: str, fp: int | None, version: Any) -> bool:
    """Whether the unfolded STEP record ``x`` replays a call of ``kind`` ``name`` with
    fingerprint ``fp`` and ``version``: ``Run._plan_step``'s test of a folded entry (done,
    no error -- a plain record has none --, the same fingerprint, kind, name and
    version), on the fields :func:`_fold_step` would set."""
    return x[1] == fp and x[2] == kind and x[3] == name and x[4] == version


def apply(st: RunState, r: dict) -> None:
    """Fold one more record into ``st`` (records in log order)."""
    fold_event = _FOLDS.get(r.get("e"))
    if fold_event is not None and fold_event(st, r) is not _FINAL:
        st.updated = r.get("t")       # an event this reader does not know changes nothing


_FINAL = object()   # a fold that changed nothing: an answer after the first, which holds


# The folds of STEP, INTENT and RECEIPT (a replay reads one per call) unpack the record's
# fields into names, in its type's order, rather than build the typed record.

def _fold_step(st: RunState, r: Any) -> None:
    """Fold one STEP record: ``r`` is the map the log stores, or its fields in
    :class:`StepRecord`'s order (:func:`apply_step`)."""
    if type(r) is dict:
        r = step_values(r)
    t, sid, kind, name, fp, t0, gen, inputs, pv, tries, err, result, ir = r
    e = _entry(st, sid, gen, kind, name, fp, t0 or t)
    e.fp = fp
    e.inputs = inputs if ir is None else by_ref(ir, st.find)
    e.prompt_version = pv
    e.result, e.err, e.done = result, err, True
    if tries or e.tries:        # a new entry already has no tries
        e.tries = tries or []
        e.retry_count = len(e.tries)
    e.ended = t


def apply_step(st: RunState, fields: tuple) -> None:
    """:func:`apply` of a STEP record given as its fields in :class:`StepRecord`'s order:
    a live run's own record, folded from the values it packed rather than from the map
    read back -- by the one fold a re-open uses, so the live entries are the folded ones."""
    _fold_step(st, fields)
    st.updated = fields[0]


def record_step(st: RunState, fields: tuple, payload: bytes) -> None:
    """:func:`apply_step` of a live run's own new STEP record, also given as the COMMIT
    payload the log got: a plain record (csrc/journalscan.c's rule) of a step id with no
    entry is held in the run's index as the open holds one it read -- its bytes, no
    :class:`CallState` --, and folded when first asked for, by the fold a re-open uses
    (GUARANTEES 16.11). Any other record is folded now. ``order`` then misses the held
    records: ``out_of_order``, as after a lazy open."""
    lazy = st.lazy
    if type(lazy) is Index and fields[1] not in st.entries and lazy.add(payload):
        st.updated = fields[0]
        st.out_of_order = True
    else:
        apply_step(st, fields)


def _fold_intent(st: RunState, r: dict) -> None:
    t, sid, name, fp, key, rc, gen, inputs, tv, amo, comp, _cut, ir = intent_values(r)
    e = _entry(st, sid, gen, "tool", name, fp, t)
    e.inputs = inputs if ir is None else by_ref(ir, st.find)   # refers to e's inputs before
    e.tool_version = tv
    e.key = default_key(st.run_id, sid) if key is None else key    # left out: the default
    e.retry_count = rc
    e.at_most_once = bool(amo)
    e.comp_of = comp
    e.resolved = None      # a new attempt: an earlier "not done" authorized it, and only it
    e.in_flight = True


def _fold_receipt(st: RunState, r: dict) -> None:
    t, sid, gen, tries, err, result = receipt_values(r)
    e = _entry(st, sid, gen, "tool", None, None, t)
    e.result, e.err, e.done = result, err, True
    e.tries = tries or []
    e.ended = t


def _fold_approval(st: RunState, r: dict) -> None:
    x = ApprovalRecord.of(r)
    _entry(st, x.step, x.gen, "approval", x.name, x.fp, x.t).inputs = x.inputs


def _fold_decision(st: RunState, r: dict) -> None:
    x = DecisionRecord.of(r)
    e = _entry(st, x.step, x.gen, "approval", None, x.fp, x.t)
    if e.decision is None:       # a decision is final: the first one in the log holds
        e.decision = r           # the stored map: answers are compared as stored
        e.ended = x.t


def _fold_resolve(st: RunState, r: dict) -> Any:
    x = ResolveRecord.of(r)
    e = _entry(st, x.step, x.gen, "tool", None, None, x.t)
    if e.resolved is not None or e.done:
        return _FINAL          # final: the first answer about this attempt holds
    e.resolved = r
    if x.done:
        e.result, e.err, e.done = x.result, None, True
        e.ended = x.t
    return None


def _fold_try(st: RunState, r: dict) -> None:
    x = TryRecord.of(r)
    e = _entry(st, x.step, x.gen, x.kind or "tool", x.name, x.fp, x.t)
    e.tries = (*e.tries, x.err)
    e.in_flight = False         # that attempt failed: the next one is not in doubt
    if e.kind != "tool":        # a tool's retry_count is its intents' (calls - 1)
        e.retry_count = len(e.tries)
        e.prompt_version = x.prompt_version


def _fold_warn(st: RunState, r: dict) -> None:
    x = WarnRecord.of(r)
    e = st.latest(x.step)
    if e is not None:
        e.warnings = (*e.warnings, x.msg)


def _fold_status(st: RunState, r: dict) -> None:
    x = StatusRecord.of(r)
    st.status, st.until, st.status_step, st.message = x.status, x.until, x.step, x.msg


def _fold_run(st: RunState, r: dict) -> None:
    x = RunRecord.of(r)
    st.fp, st.input, st.created = x.fp, x.inputs, x.t
    st.task_ids = bool(x.task_ids)
    st.status, st.until, st.status_step, st.message = "running", None, None, None


step_values, intent_values, receipt_values = (StepRecord.values, IntentRecord.values,
                                               ReceiptRecord.values)
_FOLDS = {E_STEP: _fold_step, E_INTENT: _fold_intent, E_RECEIPT: _fold_receipt,
          E_APPROVAL: _fold_approval, E_DECISION: _fold_decision, E_RESOLVE: _fold_resolve,
          E_TRY: _fold_try, E_WARN: _fold_warn, E_STATUS: _fold_status, E_RUN: _fold_run}


@dataclass(frozen=True)
class JournalEntry:
    """One durable call as :meth:`durkv.runtime.Run.journal` reports it (the seed's fields).

    ``inputs``/``result_receipt`` are decoded values (``inputs`` is None when the
    caller marked them secret or they were too large to keep); ``error_state`` is
    ``"Type: message"`` of a final failure; ``approval_status`` is ``pending``,
    ``approved`` or ``rejected`` for approvals; ``state`` is ``done``, ``failed``,
    ``in_doubt`` (intent without receipt) or ``pending``.
    """

    step_id: str
    generation: int
    kind: str
    planned_action: str
    inputs_fingerprint: str
    inputs: Any
    prompt_version: Any
    tool_version: Any
    idempotency_key: str | None
    approval_status: str | None
    result_receipt: Any
    retry_count: int
    error_state: str | None
    attempt_errors: list
    state: str
    started_at: float | None
    ended_at: float | None
    warnings: tuple = ()
    compensates: str | None = None


@dataclass(frozen=True)
class RunInfo:
    """A run as :meth:`Store.runs` lists it."""

    run_id: str
    status: str
    until: float | None
    step: str | None
    steps: int
    message: str | None
    created: float | None
    updated: float | None
