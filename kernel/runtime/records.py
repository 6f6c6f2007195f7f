"""Journal records: one immutable type per event of docs/FORMAT.md section 5a.

A run's journal is a list of msgpack maps with short keys (``"e"`` the event, ``"t"`` the
time, then the event's fields). Each event has one type here, a NamedTuple (frozen, and
slotted as a tuple is), as :mod:`durkv.store.records` has for frame heads:

- ``X(...).pack()`` is the map the log stores: ``e``, ``t``, then the fields in the order
  the writers have always written them (the bytes on disk do not change with the code
  that builds them), an optional field left out when it has no value;
- ``X.of(rec)`` reads a stored map back into the type (a field the map lacks gets its
  default: older writers left some out).

Field names say what a field is; ``KEYS`` gives each one's key on disk and ``KEEP`` when
``pack`` writes it: :data:`ALWAYS`, :data:`SET` (unless None) or :data:`TRUE` (unless
false: 0, False, empty). So a misspelt field is an error where it is written, not a
``None`` where it is read.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

__all__ = ["E_RUN", "E_STEP", "E_INTENT", "E_RECEIPT", "E_APPROVAL", "E_DECISION",
           "E_RESOLVE", "E_STATUS", "E_WARN", "E_TRY", "E_REPAIR", "E_REPAIR_ACK", "RunRecord", "StepRecord",
           "IntentRecord", "ReceiptRecord", "ApprovalRecord", "DecisionRecord",
           "ResolveRecord", "StatusRecord", "WarnRecord", "TryRecord", "RepairRecord",
           "RepairAckRecord", "RECORD_TYPES", "default_key",
           "ALWAYS", "SET", "TRUE"]

# journal events: the "e" field of a record (part of the format: never renumber)
E_RUN = 1
E_STEP = 2
E_INTENT = 3
E_RECEIPT = 4
E_APPROVAL = 5
E_DECISION = 6
E_RESOLVE = 7
E_STATUS = 8
E_WARN = 9
E_TRY = 10      # a failed attempt that will be retried (its error; before the next attempt)
E_REPAIR = 20   # a repair cut records (only in K_REPAIR frames, FORMAT.md 6a)
E_REPAIR_ACK = 21

# when pack() writes a field
ALWAYS = 0      # always, None included
SET = 1         # unless it is None
TRUE = 2        # unless it is false (a generation 0, at_most_once False, no tries)


def _pack(cls: Any) -> Any:
    """``cls.pack``: a function written for ``cls`` from its ``KEYS`` and ``KEEP``, as
    :func:`collections.namedtuple` writes its methods (one dict literal and one test per
    optional field: ~2.5x faster than a loop over the fields, and every step writes one)."""
    names = [f"f{i}" for i in range(len(cls.KEYS))]
    lines = ["def pack(self):", f"    {', '.join(names)}, = self"]
    always = 0      # the fields up to the first optional one go in the literal
    while always < len(cls.KEEP) and cls.KEEP[always] == ALWAYS:
        always += 1
    items = ", ".join(f"{k!r}: {n}" for k, n in zip(cls.KEYS[:always], names))
    lines.append(f"    out = {{'e': {cls.E!r}, {items}}}")
    for key, keep, name in zip(cls.KEYS[always:], cls.KEEP[always:], names[always:]):
        test = {ALWAYS: "", SET: f"if {name} is not None: ", TRUE: f"if {name}: "}[keep]
        lines.append(f"    {test}out[{key!r}] = {name}")
    lines.append("    return out")
    scope: dict = {}
    exec("\n".join(lines), {}, scope)       # code made of KEYS and field positions only
    scope["pack"].__doc__ = "The map the log stores for this record (docs/FORMAT.md 5a)."
    return scope["pack"]


def _values(cls: Any) -> Any:
    """``cls.values(rec)``: a stored map's fields in the type's order (defaults for the keys
    it lacks), for a hot path to unpack into names without building the record."""
    fields = inspect.signature(cls).parameters.values()
    defaults = [None if f.default is f.empty else f.default for f in fields]
    assert len(cls.KEYS) == len(cls.KEEP) == len(defaults), cls
    keys = cls.KEYS

    def values(rec: dict) -> Any:
        return map(rec.get, keys, defaults)

    return staticmethod(values)


def _of(cls: Any) -> Any:
    """``cls.of(rec)``: the typed record of a stored map (no classmethod binding)."""
    values, new = cls.values, tuple.__new__

    def of(rec: dict) -> Any:
        return new(cls, values(rec))

    return staticmethod(of)


class RunRecord(NamedTuple):
    """RUN: a run created; ``fp`` of its input (None: created without one), ``inputs`` kept
    unless secret or large, ``task_ids`` 1: asyncio tasks get task-scoped step ids."""

    t: float
    fp: int | None = None
    task_ids: int = 0
    inputs: bytes | None = None
    E = E_RUN
    KEYS = ("t", "fp", "tid", "in")
    KEEP = (ALWAYS, ALWAYS, TRUE, SET)


class StepRecord(NamedTuple):
    """STEP: a step's (or now/random/uuid/sleep's) outcome: ``result`` or ``err``."""

    t: float
    step: str
    kind: str = "step"
    name: str = ""
    fp: int = 0
    t0: float | None = None
    gen: int = 0
    inputs: bytes | None = None
    prompt_version: Any = None
    tries: list | None = None
    err: list | None = None
    result: bytes | None = None
    inputs_by_ref: list | None = None   # `ir`: the inputs' new items, the rest by reference
    E = E_STEP
    KEYS = ("t", "s", "k", "n", "fp", "t0", "g", "in", "pv", "tries", "err", "r", "ir")
    KEEP = (ALWAYS, ALWAYS, ALWAYS, ALWAYS, ALWAYS, ALWAYS, TRUE, SET, SET, TRUE, SET, SET, SET)
    RESULT = KEYS.index("r")    # the store's writer finds `r` here (FORMAT.md 5, `jref`)


def default_key(run_id: str, step_id: str) -> str:
    """The idempotency key of a step's tool call unless the journal says another: an
    INTENT leaves its ``key`` out when it is this one (FORMAT.md 5a)."""
    return f"{run_id}:{step_id}"


class IntentRecord(NamedTuple):
    """INTENT: a tool is about to be called (one per attempt); journaled before the call."""

    t: float
    step: str
    name: str = ""
    fp: int = 0
    key: str | None = None
    retry_count: int = 0
    gen: int = 0
    inputs: bytes | None = None
    tool_version: Any = None
    at_most_once: bool = False
    compensates: str | None = None
    cut: str | None = None      # the repair guard's intent: no call followed it (FORMAT 6a)
    inputs_by_ref: list | None = None   # `ir`, as a STEP's
    E = E_INTENT
    KEYS = ("t", "s", "n", "fp", "key", "rc", "g", "in", "tv", "amo", "comp", "cut", "ir")
    # key: None for the run's default key of the step (FORMAT.md 5a), which every reader
    # derives; rc: 0 is the default of every reader
    KEEP = (ALWAYS, ALWAYS, ALWAYS, ALWAYS, SET, TRUE, TRUE, SET, SET, TRUE, SET, SET, SET)


class ReceiptRecord(NamedTuple):
    """RECEIPT: a tool call's outcome: ``result`` or ``err``."""

    t: float
    step: str
    gen: int = 0
    tries: list | None = None
    err: list | None = None
    result: bytes | None = None
    E = E_RECEIPT
    KEYS = ("t", "s", "g", "tries", "err", "r")
    KEEP = (ALWAYS, ALWAYS, TRUE, TRUE, SET, SET)
    RESULT = KEYS.index("r")


class ApprovalRecord(NamedTuple):
    """APPROVAL: a request for a human decision on ``action`` with a payload."""

    t: float
    step: str
    name: str = ""
    fp: int = 0
    inputs: bytes | None = None
    gen: int = 0
    E = E_APPROVAL
    KEYS = ("t", "s", "n", "fp", "in", "g")
    KEEP = (ALWAYS, ALWAYS, ALWAYS, ALWAYS, ALWAYS, TRUE)


class DecisionRecord(NamedTuple):
    """DECISION: the answer to an approval (the first one in the log holds); ``dq`` the
    S3 decision object it came from (FORMAT.md 13)."""

    t: float
    step: str
    gen: int = 0
    fp: int = 0
    ok: bool = False
    by: Any = None
    note: Any = None
    dq: str | None = None
    E = E_DECISION
    KEYS = ("t", "s", "g", "fp", "ok", "by", "note", "dq")
    KEEP = (ALWAYS, ALWAYS, ALWAYS, ALWAYS, ALWAYS, ALWAYS, ALWAYS, SET)


class ResolveRecord(NamedTuple):
    """RESOLVE: what happened to an in-doubt tool call (``done``, its ``result``)."""

    t: float
    step: str
    done: bool = False
    by: Any = None
    note: Any = None
    result: bytes | None = None
    gen: int = 0
    dq: str | None = None
    E = E_RESOLVE
    KEYS = ("t", "s", "done", "by", "note", "r", "g", "dq")
    KEEP = (ALWAYS, ALWAYS, ALWAYS, ALWAYS, ALWAYS, SET, ALWAYS, SET)


class StatusRecord(NamedTuple):
    """STATUS: the run's status (``until`` when sleeping, ``step`` and ``msg`` why)."""

    t: float
    status: str | None = None
    step: str | None = None
    msg: str | None = None
    until: float | None = None
    E = E_STATUS
    KEYS = ("t", "st", "s", "msg", "until")
    KEEP = (ALWAYS, ALWAYS, SET, SET, SET)


class WarnRecord(NamedTuple):
    """WARN: version drift under ``on_drift="warn"`` at a recorded entry."""

    t: float
    step: str
    gen: int = 0
    msg: str = ""
    E = E_WARN
    KEYS = ("t", "s", "g", "msg")
    KEEP = (ALWAYS, ALWAYS, ALWAYS, ALWAYS)


class TryRecord(NamedTuple):
    """TRY: a failed attempt that will be retried; a step's also names the step (its STEP
    comes at the end), a tool's has its INTENT."""

    t: float
    step: str
    err: list | None = None
    gen: int = 0
    kind: str | None = None
    name: str | None = None
    fp: int | None = None
    prompt_version: Any = None
    E = E_TRY
    KEYS = ("t", "s", "err", "g", "k", "n", "fp", "pv")
    KEEP = (ALWAYS, ALWAYS, ALWAYS, TRUE, SET, SET, SET, SET)


class RepairRecord(NamedTuple):
    """REPAIR: ``durkv recover --skip-corrupt`` cut the log from LSN ``lost_first``;
    ``read`` frames of the cut were read, ``unread`` LSNs not (-1: none could be),
    ``named`` the run ids and ``threads`` the thread ids read from its bytes."""

    t: float
    repair_id: str
    lost_first: int = 0
    read: int = 0
    unread: int = -1
    named: list | None = None
    threads: list | None = None
    msg: str = ""
    E = E_REPAIR
    KEYS = ("t", "rep", "lost_first", "read", "unread", "named", "threads", "msg")
    KEEP = (ALWAYS,) * 8


class RepairAckRecord(NamedTuple):
    """REPAIR_ACK: the operator's word for the repairs ``repair_ids`` of this run."""

    t: float
    repair_ids: list | None = None
    by: Any = None
    note: Any = None
    E = E_REPAIR_ACK
    KEYS = ("t", "rep", "by", "note")
    KEEP = (ALWAYS,) * 4


RECORD_TYPES = (RunRecord, StepRecord, IntentRecord, ReceiptRecord, ApprovalRecord,
                DecisionRecord, ResolveRecord, StatusRecord, WarnRecord, TryRecord,
                RepairRecord, RepairAckRecord)
for record_type in RECORD_TYPES:
    record_type.pack = _pack(record_type)
    record_type.values = _values(record_type)
    record_type.of = _of(record_type)
del record_type
