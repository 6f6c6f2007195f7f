"""A run: durable steps, mutating tools, approvals, sleeps -- each a replay boundary.

``with store.run(run_id, input=...) as run:`` opens (or resumes) the run's
journal. The n-th durable call of an execution gets step id ``str(n)`` (or the
caller's ``key=``); a re-execution of the same code meets the same ids and gets
the recorded results back without calling anything:

>>> import durkv
>>> calls = []
>>> def model(prompt):
...     calls.append(prompt)
...     return prompt.upper()
>>> with durkv.open("memory://") as store:
...     for _ in range(2):
...         with store.run("r1", input={"q": 1}) as run:
...             out = run.step("plan", model, "hi")
...     (out, calls)
('HI', ['hi'])

Protocol of ``run.tool`` (docs/FORMAT.md 5a): an INTENT record; the call with
``idempotency_key``; a RECEIPT record before ``tool`` returns. An at-most-once tool's are
fdatasync'd whatever the store's policy; a keyed tool's follow the policy where a
returned commit survives a process kill (docs/GUARANTEES.md 16.9). Operator signals go
to the ``durkv`` logger.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import logging
import os
import random as _random
import struct
import threading
import time
import uuid as _uuid
import weakref
from contextvars import ContextVar
from dataclasses import dataclass, replace
from itertools import count
from typing import Any, Callable, Generator, Iterator

from ..errors import (
    ApprovalMismatchError, ConfigError, DurkvError, FrameTooLargeError, IdempotencyConflictError,
    InDoubtError, Interrupted, NonDeterminismError, RunBusyError, RunConflictError,
    SerializationError, VersionDriftError,
)
from ..store.records import check_id
from .aio import (
    OWED, SCOPED_ID, adrive, asleep_with, deferred, off_loop, raise_now, scope_tasks, scoped_id,
    settled, unscope_tasks,
)
from .inputs import SMALL_INPUTS, Encoded, InputRefs
from .journal import (LAZY_INPUTS, LAZY_RESULT, MISS, STATUSES, CallState, JournalEntry,
                      StepEntry, apply, apply_step, bulk_load, fold, fold_lazy, record_step, replays_as_asked)
from .records import (
    ApprovalRecord, DecisionRecord, IntentRecord, ReceiptRecord, ResolveRecord, RunRecord, StatusRecord, StepRecord, TryRecord,
    WarnRecord, default_key,
)
from .plan import (
    CALL, IN_CALL, ONCE, RECORD, SLEEP, Plan, Recorded, call_in, drive, err_type, not_nested,
    plain_version,
)
from .repair import damage_of
from .tools import Retry, ToolSpec, tool_spec
from .values import Values, err_message, fingerprint
from .view import describe

__all__ = ["Run", "Decision", "DRIFT_POLICIES", "NO_INPUT", "SAME_KEY", "SYNCED_TOOLS",
           "fingerprint", "check_not_driven"]

log = logging.getLogger("durkv")
# a STEP record from its fields in StepRecord's order, without NamedTuple's Python __new__
_new_record = tuple.__new__

DRIFT_POLICIES = ("warn", "fail", "rerun")
MAX_INLINE_INPUTS = 64 << 10     # inputs larger than this are journaled by fingerprint only
MAX_SLEEP = 1e9      # seconds (~31 years): time.sleep's own limit is ~9.2e9 on 64-bit
NO_INPUT: Any = object()     # store.run() without input=: no input fingerprint check
# run.tool(..., retry_failed=SAME_KEY): call a recorded failure again as the same logical
# call, under its recorded idempotency key (retry_failed=True makes it a new call: key#gen)
SAME_KEY = "same key"

# True around a tool call whose caller's commits are fdatasync'd whatever the store's
# policy (durkv.langgraph in an invocation whose checkpoints are: durability="sync"): the
# tool's records are synced as under `sync` (docs/GUARANTEES.md 16.9)
SYNCED_TOOLS: ContextVar[bool] = ContextVar("durkv_synced_tools", default=False)

# runs open in this process, per store (a second driver gets RunBusyError)
_open_runs: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
_open_lock = threading.Lock()


def _locks_after_fork() -> None:
    # a forked child has only the forking thread: a lock another thread held at the fork
    # would never be released (the child opens the store itself: GUARANTEES 8)
    global _open_lock
    _open_lock = threading.Lock()


os.register_at_fork(after_in_child=_locks_after_fork)


def check_not_driven(store: Any, run_ids: Any) -> None:
    """Refuse to delete runs that a ``with store.run(...)`` of this process is driving: its
    next record would start a journal with no RUN record, which another input replays."""
    with _open_lock:
        busy = sorted(set(run_ids) & _open_runs.get(store, set()))
    if busy:
        raise RunBusyError(f"run {busy[0]!r} is being driven by a `with store.run(...)` in "
                           "this process; delete it after that block ends", run_id=busy[0])


@dataclass(frozen=True)
class Decision:
    """An approval's decision, as ``run.approve`` returns it."""

    step_id: str
    approved: bool
    by: Any = None
    note: Any = None
    decided_at: float | None = None


class Run:
    """One run of an agent over a store's journal. Create with ``store.run(...)``."""

    def __init__(self, store: Any, run_id: str, input: Any = NO_INPUT, *,  # noqa: A002
                 on_drift: str = "warn", secret_input: bool = False,
                 clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], Any] | None = None, since: int = 0,
                 undos: bool = True) -> None:
        if type(run_id) is not str or not run_id:
            raise ConfigError(f"run_id must be a non-empty string, got {run_id!r}; "
                              "pass e.g. store.run('ticket-42')")
        if not run_id.isascii():
            check_id("run_id", run_id)      # a lone surrogate: refused here, named
        if on_drift not in DRIFT_POLICIES:
            raise ConfigError(f"on_drift must be one of {', '.join(DRIFT_POLICIES)}, "
                              f"got {on_drift!r}")
        self.store = store
        self.run_id = run_id
        self.on_drift = on_drift
        self._input = input
        self._secret_input = secret_input
        self._clock = clock or time.time
        self._sleep = sleep or time.sleep
        self._dumps = store.serde.dumps
        # a returned record survives a process kill: a keyed tool's need no fdatasync of
        # their own (docs/GUARANTEES.md 16.9)
        self._kill_safe = store.commits_survive_kill
        self._loads = store.serde.loads
        self._values = Values(store.serde)     # recorded values, fingerprints, exceptions
        # what this Run appended that later inputs may refer to (FORMAT.md 5a `ir`)
        self._refs = InputRefs(self._values, MAX_INLINE_INPUTS, self._latest_inputs,
                               getattr(store, "item_place", None),
                               getattr(store, "write_item", None))
        self._lock = threading.RLock()
        self._n = count()
        self._compensable: list[tuple] = []     # (issued, sid, spec, result): undoable
        self._issued = count()
        self._undo_left: list = []      # a compensate() under way: its undos not done yet
        self._st: Any = None
        self._seen = 0          # journal records folded into _st
        self._repair: Any = None    # a repair cut records of this run (runtime/repair.py)
        # a scheduler that knows the records before `since` belong to finished work (its
        # committed supersteps) folds only the rest: an O(1) resume (durkv.Graph)
        self._since = since
        # False: a scheduler whose tasks keep their own undo lists (durkv.Graph's
        # ctx.compensate); the run's own list would hold every compensable tool's result
        # for the whole execution, never drained
        self._keep_undos = undos
        self._opened = False
        self._driver: Any = None    # the cross-process claim while open (store/drivers.py)
        self._plain = False     # open, and every automatic step id comes from self._n
        self._task_ids = False  # asyncio tasks' step ids are scoped by task (see aio.py)
        self._scope_token: Any = None   # async with: this task roots the run's task tree
        # awaitable calls under way, and the event `async with`'s exit waits on for them
        self._calls_under_way = 0
        self._calls_done: asyncio.Event | None = None
        self.status: str | None = None
        self.interrupt: Interrupted | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"<durkv.Run {self.run_id!r} {self.status or 'new'}>"

    def __enter__(self) -> "Run":
        self.open()
        return self

    def __exit__(self, et: Any, exc: Any, tb: Any) -> bool:
        return self.close(exc)

    async def __aenter__(self) -> "Run":
        try:
            await off_loop(self.store, self.open)
        except BaseException:
            # cancelled while open's records waited for their fsync (a request whose
            # client went away): __aexit__ will not run, so let the claim go here -- else
            # the run stays busy in every process until this one exits
            self.close(record=False)
            raise
        if self._task_ids:
            self._scope_token = scope_tasks(self)
            self._plain = False
        return self

    async def __aexit__(self, et: Any, exc: Any, tb: Any) -> bool:
        token, self._scope_token = self._scope_token, None
        unscope_tasks(token)
        # `gather(run.atool(a), run.atool(b))` raises as soon as `a` fails while `b` still
        # runs: the run is released only once every call its tasks started has recorded
        # its outcome (else `b`'s receipt would land after the run's end, while another
        # driver may hold it)
        try:
            while self._calls_under_way:
                self._calls_done = asyncio.Event()
                await self._calls_done.wait()
        except BaseException:       # cancelled while waiting: the run is released anyway
            await off_loop(self.store, self.close, exc)
            raise
        finally:
            self._calls_done = None
        return await off_loop(self.store, self.close, exc)

    def open(self) -> None:
        """Claim the run in this process and read its journal (``with`` does this)."""
        key = self.store
        with _open_lock:
            busy = _open_runs.setdefault(key, set())
            if self.run_id in busy:
                raise RunBusyError(
                    f"run {self.run_id!r} is already being driven in this process; let the "
                    "other `with store.run(...)` finish first (one driver per run)",
                    run_id=self.run_id)
            busy.add(self.run_id)
        try:        # and across processes: RunBusyError naming the holder's pid
            self._driver = self.store.claim_driver("run", self.run_id)
        except BaseException:
            self._release()
            raise
        self._n = count()          # an execution numbers its calls from 0
        self._compensable = []
        self._issued = count()
        self.interrupt = None
        try:
            self._open_journal()
        except BaseException:
            self._release()
            raise
        self._opened = self._plain = True

    def attach(self) -> "Run":
        """Use the run's journal without claiming it: for code whose driver is someone
        else (LangGraph nodes, several of which may run at once on one thread id).
        Nothing is written at close; :meth:`refresh` rereads what others appended."""
        self._open_journal()
        self._opened = self._plain = True
        return self

    def refresh(self) -> None:
        """Reread the journal if records were appended by anyone else (``decide``,
        ``resolve``, a delete)."""
        if self.store.journal_length(self.run_id) != self._seen:
            self._reread(lazily=True)

    def _reread(self, lazily: bool) -> None:
        """Fold the run's journal again from the store (``lazily``: see :meth:`_fold`)."""
        with self._lock:
            self._st = self._fold(lazily)
            self._seen = self.store.journal_length(self.run_id)
            self._repair = damage_of(self.store, self.run_id)

    def _fold(self, lazily: bool) -> Any:
        """The run's journal from ``_since`` on, folded: ``lazily``, its plain STEP records
        left unfolded until asked for (journal.fold_lazy); heads it cannot read are read
        and folded the eager way, which raises what is wrong with them. Under another
        serde than the default (DurkvSaver's), every call's inputs look for a base among
        the entries in log order (runtime/inputs.py), which a lazy state folds again
        whole: such a run folds eagerly from the start."""
        with bulk_load():
            if lazily and self._values.default_serde:
                try:
                    return fold_lazy(self.run_id,
                                     self.store.journal_heads(self.run_id, start=self._since))
                except ValueError:
                    pass
            return fold(self.run_id, self.store.journal(self.run_id, start=self._since))

    def settle(self, since: int) -> None:
        """Forget the folded journal records before position ``since``: work the caller
        has committed for good (durkv.Graph: the supersteps before its newest checkpoint,
        whose step ids never recur). The run then holds what a resume from ``since``
        would fold -- not every recorded result of the whole execution."""
        with self._lock:
            self._since = since
            st = self._st
            if st is not None and st.calls:
                self._st = replace(st, entries={}, order=[], lazy={}, heads=None,
                                   out_of_order=False)
                self._seen = since      # records at/after since: refolded by refresh()

    def _open_journal(self) -> None:
        st = self._st = self._fold(lazily=True)
        self._seen = self.store.journal_length(self.run_id)
        self._task_ids = st.task_ids
        self._repair = damage_of(self.store, self.run_id)   # None unless ever repaired
        fp = in_b = None
        if self._input is not NO_INPUT:
            try:
                b, fp = self._values.encode(self._input)
            except Exception as e:
                raise SerializationError(f"the input of run {self.run_id!r} cannot be "
                                         f"serialized: {e}", run_id=self.run_id) from e
            in_b = None if self._secret_input or len(b) > MAX_INLINE_INPUTS else b
        if st.fp is None and not st.calls and not self._since:
            # tid: a run created now scopes its asyncio tasks' step ids (older runs keep one
            # counter, so that their journals replay)
            self._append(RunRecord(self._clock(), fp, 1, in_b).pack())
            self._task_ids = True
            self.status = "running"
            return
        if (fp is not None and st.fp is not None
                and not self._values.matches(st.fp, fp, st.input)):
            raise RunConflictError(
                f"run {self.run_id!r} exists with another input (fingerprint {st.fp:016x}, "
                f"now {fp:016x}); two jobs must not share a run id: use a new run id, or the "
                "original input", run_id=self.run_id, recorded=f"{st.fp:016x}",
                given=f"{fp:016x}")
        n = st.calls
        log.info("durkv: resuming run %r (status %s): %d recorded steps will replay",
                 self.run_id, st.status, n)
        self._append(StatusRecord(self._clock(), "running",
                                  msg=f"resumed; {n} recorded steps").pack())
        self.status = "running"

    def close(self, exc: BaseException | None = None, *, record: bool = True) -> bool:
        """Record how the execution ended; returns True when ``exc`` is the approval pause
        (``with`` then ends quietly and ``run.status == "waiting"``). ``record=False``
        records nothing: the caller recorded the status itself (:meth:`mark`)."""
        if not self._opened:
            return False
        self._opened = self._plain = False
        try:
            return self._record_end(exc) if record else False
        except DurkvError as e:
            if exc is None:
                raise
            # the block's own exception matters more than a status record that failed
            log.warning("durkv: run %r: could not record its end (%s)", self.run_id, e)
            return isinstance(exc, Interrupted)
        finally:
            self._release()

    def _record_end(self, exc: BaseException | None) -> bool:
        exc = _pause_in(exc)
        if isinstance(exc, Interrupted):
            self.interrupt = exc
            self._status("waiting", exc.step_id, f"waiting for approval of {exc.action!r}")
            return True
        if isinstance(exc, InDoubtError):
            return False     # the in-doubt status is already journaled
        if exc is None:
            self._status("finished")
        else:
            self._status("failed", None, f"{err_type(exc)}: {err_message(exc)}")
        return False

    def mark(self, status: str, step: str | None = None, msg: str | None = None,
             until: float | None = None) -> None:
        """Journal the run's status (a scheduler's own pause, e.g. durkv.Graph's durable
        sleep: ``mark("sleeping", step, until=wake)`` then ``close(record=False)``)."""
        if status not in STATUSES:
            raise ConfigError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        self._status(status, step, msg, until)

    def _release(self) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.release()
        with _open_lock:
            busy = _open_runs.get(self.store)
            if busy is not None:
                busy.discard(self.run_id)

    # -- journal plumbing --------------------------------------------------------------------

    def _check_open(self) -> None:
        if not self._opened:
            raise ConfigError(f"run {self.run_id!r} is not open; use `with store.run(...) "
                              "as run:`")

    def _append(self, rec: dict, durable: bool = False, prior: bool = False) -> None:
        self._write(rec, durable, prior)
        # no lock: concurrent callers (threads with key=, async tools) fold different
        # entries, and each step of apply() is atomic under the GIL
        apply(self._st, rec)
        self._seen += 1

    def _write(self, rec: Any, durable: bool = False, prior: bool = False) -> None:
        """Journal ``rec`` (a map, or a typed record: Store.append_journal); the caller folds
        it (:meth:`_append`, or the fields it packed).
        ``prior``: ``rec`` is only written, and every record before it is fdatasync'd before
        this returns (or owed, for an async verb) -- a keyed tool's intent under ``sync``.
        (run.step's C entry appends a new step's record as the ``owed is None`` branch does,
        and calls this method otherwise.)"""
        owed = OWED.get()
        if prior:
            lsn = self.store.append_journal(self.run_id, rec, written=True)
            if lsn > 0 and owed is None:
                self.store.wait_journal(lsn - 1)
            elif lsn > 0:
                owed.append(lsn - 1)
            return
        if owed is None:
            self.store.append_journal(self.run_id, rec, durable=durable)
        else:       # an async verb: its coroutine waits for the fsync in a worker thread
            lsn = self.store.append_journal(self.run_id, rec, durable=durable, defer=True)
            if durable or self.store.durability == "sync":
                owed.append(lsn)

    def _status(self, status: str, step: str | None = None, msg: str | None = None,
                until: float | None = None) -> None:
        self._append(StatusRecord(self._clock(), status, step, msg, until).pack())
        self.status = status

    def _sid(self, key: str | None) -> str:
        if key is None and self._plain:     # open, no task scopes: the run's one counter
            return str(next(self._n))       # count(): atomic (GIL)
        self._check_open()
        if key is None:
            sid = None if self._plain else scoped_id(self)
            return str(next(self._n)) if sid is None else sid   # count(): atomic (GIL)
        if type(key) is not str or not key or key.isdigit() or (
                "/" in key and SCOPED_ID.fullmatch(key)):
            raise ConfigError(f"key= must be a non-empty string that is not a number or "
                              f"'N/N' (those are the automatic step ids), got {key!r}")
        return key

    def _inputs(self, kind: str, name: str, args: tuple, kwargs: dict,
                 secret: bool) -> Encoded:
        """A call's inputs as its record keeps them: whole (``in``), or their new items
        and references to what earlier records hold (``ir``), or by fingerprint only."""
        try:
            return self._refs.encode(kind, name, args, kwargs, secret)
        except Exception as e:
            raise SerializationError(
                f"the inputs of {kind} {name!r} in run {self.run_id!r} cannot be serialized "
                f"({e}); "
                "pass plain data (a client object belongs in the function, not its "
                "arguments)", run_id=self.run_id) from e

    def _latest_inputs(self, kind: str, name: str) -> CallState | None:
        """The latest folded entry of ``kind`` ``name`` that keeps inputs (a base for the
        inputs of a call this Run has not recorded yet: runtime/inputs.py)."""
        if self._st.out_of_order:    # once per Run at most: the entries in log order
            self._reread(lazily=False)
        for e in reversed(self._st.order):
            if e.kind == kind and e.name == name and e.inputs is not None:
                return e
        return None

    def _check(self, sid: str, kind: str, name: str, fp: int | None) -> CallState | None:
        e = self._st.latest(sid)
        if e is None:
            return None
        if e.kind != kind or e.name != name:
            raise NonDeterminismError(
                f"run {self.run_id!r} step {sid}: the journal holds {e.kind} {e.name!r} at this "
                f"position, the code now asks for {kind} {name!r}; the code changed under a "
                "recorded run: run it with the code that started it, or use a new run id",
                run_id=self.run_id, step_id=sid, recorded=f"{e.kind} {e.name}",
                requested=f"{kind} {name}")
        # an `ir` record (written with canonical fingerprints) needs no second look
        recorded_in = e.inputs if type(e.inputs) is bytes else None
        if fp is not None and not self._values.matches(e.fp, fp, recorded_in):
            raise IdempotencyConflictError(
                f"run {self.run_id!r} step {sid} ({name!r}) was recorded with inputs "
                f"{e.fp:016x}, now called with {fp:016x}; the same step must get the same "
                "input (pass key= to name a different call)", run_id=self.run_id,
                step_id=sid, recorded=f"{e.fp:016x}", given=f"{fp:016x}")
        return e

    def _drift(self, e: CallState, what: str, recorded: Any, running: Any) -> bool:
        """Version drift at a recorded entry: True means call again (``rerun``)."""
        msg = (f"run {self.run_id!r} step {e.step_id} ({e.name!r}): recorded {what} version "
               f"{recorded!r}, running {running!r}")
        if self.on_drift == "fail":
            raise VersionDriftError(msg + "; on_drift='fail' (use 'warn' to replay the "
                                    "recorded result, 'rerun' to call again)",
                                    run_id=self.run_id, step_id=e.step_id)
        if self.on_drift == "rerun":
            log.warning("durkv: %s; re-running (on_drift='rerun')", msg)
            return True
        log.warning("durkv: %s; replaying the recorded result (on_drift='warn')", msg)
        note = f"version drift: {what} {recorded!r} -> {running!r}; recorded result used"
        if note not in e.warnings:
            self._append(WarnRecord(self._clock(), e.step_id, e.gen, note).pack())
        return False

    def _outcome(self, e: CallState) -> Any:
        if e.err is not None:
            raise self._values.rebuild(e.err, f"run {self.run_id!r} step {e.step_id} "
                                       f"({e.name!r})", run_id=self.run_id, step_id=e.step_id)
        return self._loads(e.result)

    def _err(self, exc: BaseException) -> list:
        return self._values.error(exc)

    # -- steps -------------------------------------------------------------------------------

    def _plan_step(self, sid: str, kind: str, name: str, fp: int | None, inputs: Any,
                   version: Any, retry_failed: bool = False) -> Plan:
        st = self._st
        gens = st.entries.get(sid)
        if gens is None and st.lazy:
            x = st.lazy.get(sid)
            if x is not None:
                if replays_as_asked(x, kind, name, fp, version):
                    # the hot path of a replay on a freshly opened run: nothing folded
                    return Plan.replay_of(Recorded(sid, name, x[LAZY_RESULT]))
                st.unfold(sid)      # and the eager path decides
                gens = st.entries.get(sid)
        e = gens[-1] if gens else None
        if e is not None and e.done and e.err is None and e.fp == fp and e.kind == kind and (
                e.name == name and e.prompt_version == version):
            return Plan.replay_of(e)    # the hot path of a replay: recorded as asked for now
        p = Plan(sid, kind, name, fp or 0, inputs, version)
        p.t0 = self._clock()
        if e is None:       # the hot path of a live run: a new step
            return p
        self._check(sid, kind, name, fp)
        p.gen = e.gen
        if not e.done:      # failed attempts journaled, then interrupted: go on with the budget
            p.tries = e.tries
            return p
        if e.err is not None and retry_failed:
            p.gen = e.gen + 1
            log.info("durkv: run %r step %s: retrying a recorded failure (retry_failed=True)",
                     self.run_id, sid)
            return p
        if e.err is None and version != e.prompt_version and self._drift(
                e, "prompt", e.prompt_version, version):
            p.gen = e.gen + 1
            return p
        p.entry, p.replay = e, True
        return p

    def _record_step(self, p: Plan, result: Any = None, exc: BaseException | None = None,
                     tries: list | None = None) -> None:
        t = self._clock()
        tries, err, r = self._outcome_fields(p, result, exc, tries, "nothing was recorded "
                                             "and the step will run again: return plain data")
        # the typed record, its frame packed from the fields (csrc/recpack.c); the run keeps
        # the bytes the log gets (a plain step is held as them, unfolded) or folds the
        # fields as they are (not read back from a map: one fold, journal.py)
        rec = _new_record(StepRecord, (t, p.sid, p.kind, p.name, p.fp, p.t0, p.gen, p.inputs,
                                       p.version, tries, err, r, p.refs))
        packed = self.store.pack_journal(self.run_id, rec)
        self._write(packed)
        record_step(self._st, rec, packed.payload)
        self._seen += 1
        self._refs.recorded(p.sid, p.gen, p.kind, p.name, p.encoded, r)

    def _try(self, p: Plan, tries: list) -> None:
        """Journal a failed attempt that will be retried, before the next attempt: a
        re-execution goes on with the budget left (a tool's is as durable as its next
        intent; a step's follows the store's policy like the step's own record)."""
        if p.spec is None:      # a step: no entry yet (its record comes at the end)
            rec = TryRecord(self._clock(), p.sid, tries[-1], p.gen, p.kind, p.name, p.fp,
                            p.version)
        else:
            rec = TryRecord(self._clock(), p.sid, tries[-1], p.gen)
        self._append(rec.pack())

    def _step(self, name: str, fn: Callable, *args: Any, prompt_version: Any = None,
              retry: Retry | None = None, key: str | None = None, secret: bool = False,
              retry_failed: bool = False, **kwargs: Any) -> Any:
        """Call ``fn(*args, **kwargs)`` once per run: a recorded result (or final error) is
        returned (raised) without calling ``fn``.

        Args:
            name: the planned action journaled (a replay asking for another name at this
                position is a NonDeterminismError).
            prompt_version: recorded; a different one on replay follows ``on_drift``.
            retry: a :class:`durkv.Retry`; every failed attempt is journaled.
            key: an explicit step id (threads: where the call order is not deterministic).
            secret: journal only the inputs' fingerprint, not the inputs.
            retry_failed: call again even if a final failure is recorded.
        """
        _check_name("step", name, fn, callable_fn=True)
        _check_retry(retry)
        # the automatic step id as its number (str() of it only when it is needed)
        n = next(self._n) if key is None and self._plain else self._sid(key)
        return self._step_at(n, name, fn, args, kwargs, prompt_version, retry, secret,
                             retry_failed)

    def _step_at(self, n: Any, name: str, fn: Callable, args: tuple, kwargs: dict,
                 prompt_version: Any = None, retry: Retry | None = None, secret: bool = False,
                 retry_failed: bool = False) -> Any:
        """:meth:`step` from its step id ``n`` on (an int: an automatic id's number)."""
        lazy = self._st.lazy
        if lazy:
            # the hot path of a re-execution: the step's one record, unfolded, compared
            # with the call by the default serde's bytes and its result decoded (a fresh
            # object each time), in one C call (a lazy state is the default serde's: _fold)
            r = lazy.replay(n, name, args, kwargs, prompt_version, self._loads)
            if r is not MISS:
                return r
        sid = n if type(n) is str else str(n)
        if lazy and (prompt_version is None or type(prompt_version) is str):
            x = lazy.get(sid)       # inputs not packed byte for byte as recorded, or
            if x is not None and self._replays(x, name, args, kwargs, secret, prompt_version):
                return self._loads(x[LAZY_RESULT])     # ... any other case: as before
        p = self._plan_call(sid, name, args, kwargs, prompt_version, secret, retry_failed)
        return self._drive(p, fn, args, kwargs, retry)

    def _new_step_end(self, sid: str, name: str, fp: int, inputs: bytes, t0: float,
                      value: Any, exc: BaseException | None) -> Any:
        """The end of a new step whose call failed (``exc``) or whose result the serde
        refused, for the C entry (csrc/journalscan.c StepEntry) that planned and called it:
        _once's record and raise, from the plan _plan_call would have made."""
        p = Plan(sid, "step", name, fp or 0, inputs, None)
        p.t0, p.refs, p.encoded = t0, None, (inputs, None, fp, None)
        if exc is None:
            self._record_step(p, value, None, [])
            return value
        tries = [[err_type(exc), err_message(exc)]]
        self._record_step(p, None, exc, tries)
        raise exc

    def _replays(self, x: Any, name: str, args: tuple, kwargs: dict, secret: bool,
                 version: Any) -> bool:
        """Whether the unfolded STEP record ``x`` replays ``step(name, *args, **kwargs)``:
        _plan_step's test. Under the default serde, inputs whose bytes are the recorded
        ``in`` need no fingerprint: the serde is faithful (the same bytes are the same
        value, so the same canonical fingerprint, GUARANTEES 16.8), and the eager path
        replays them too (``Values.matches`` of the recorded input). Any other call is
        fingerprinted as ``_plan_call`` does; a False goes on there."""
        if x[2] != "step" or x[3] != name or x[4] != version:
            return False
        recorded = x[LAZY_INPUTS]
        if recorded is not None and self._values.default_serde:
            try:
                if self._dumps([list(args), kwargs]) == recorded:
                    return True
            except Exception:
                return False        # _plan_call raises the SerializationError
        return replays_as_asked(x, "step", name,
                                self._inputs("step", name, args, kwargs, secret)[2], version)

    def _plan_call(self, sid: str, name: str, args: tuple, kwargs: dict, prompt_version: Any,
                   secret: bool, retry_failed: bool) -> Plan:
        """The plan of ``step``/``astep``: its inputs and version checked before any call."""
        not_nested(self, "step", name)
        if prompt_version is not None and type(prompt_version) is not str:
            prompt_version = plain_version(prompt_version)
        inputs, refs, fp, _items = enc = self._inputs("step", name, args, kwargs, secret)
        p = self._plan_step(sid, "step", name, fp, inputs, prompt_version, retry_failed)
        if not p.replay:
            p.refs, p.encoded = refs, enc
        return p

    def attempts(self, p: Plan, retry: Retry | None) -> Generator:
        """The attempts of a planned call and their records (docs/FORMAT.md 5a): the one
        place ``retry`` applies. A generator of effects (see :mod:`durkv.runtime.plan`),
        driven by ``plan.drive`` (sync verbs) or ``aio.adrive`` (async verbs)."""
        record = self._record_step if p.spec is None else self._receipt
        r = retry or ONCE
        tries = list(p.tries)
        for i in count(len(tries)):      # the budget goes on across executions
            if p.spec is not None:
                try:
                    yield RECORD, self._intent, (p,)
                except asyncio.CancelledError:      # thrown by aio.adrive: not yet called
                    self._not_called(p)
                    raise
            ok, value = yield CALL
            if ok:
                yield RECORD, record, (p, value, None, tries)
                return ok, (value if p.spec is None else self._done(p, value))
            tries.append([err_type(value), err_message(value)])
            if not r.retries(value, i):
                yield RECORD, record, (p, None, value, tries)
                return ok, value
            yield RECORD, self._try, (p, tries)
            log.info("durkv: run %r step %s attempt %d failed: %s", self.run_id, p.sid, i + 1,
                     value)
            yield SLEEP, r.sleep, (r.delay(i),)
            p.rc += 1
        raise AssertionError("unreachable: count() is endless")

    # -- tools -------------------------------------------------------------------------------

    def _spec(self, fn: Any, kwargs: dict) -> ToolSpec:
        spec = tool_spec(fn)
        if spec is None:
            raise ConfigError(f"run.tool({getattr(fn, '__qualname__', fn)!r}): not a "
                              "@durkv.tool; decorate it (it gets an idempotency_key), or use "
                              "run.step for calls without side effects")
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            # its body runs only when iterated: the intent would record a call that never
            # began, found in doubt (at most once) or called again for nothing
            raise ConfigError(f"run.tool({spec.name!r}): a generator function; its body "
                              "runs only when the result is iterated, after the receipt. "
                              "Return a list (or collect the items inside the tool)")
        if "idempotency_key" in kwargs:      # else: a TypeError journaled as the tool's failure
            raise ConfigError(f"run.tool({spec.name!r}, idempotency_key=...): durkv gives the "
                              "key (run id and step id); drop the argument, and pass key= to "
                              "name the step")
        return spec

    def _plan_tool(self, sid: str, spec: ToolSpec, args: tuple, kwargs: dict, secret: bool,
                   comp_of: str | None = None, retry_failed: bool = False) -> Plan:
        not_nested(self, "tool", spec.name)
        inputs, refs, fp, _items = enc = self._inputs("tool", spec.name, args, kwargs, secret)
        p = Plan(sid, "tool", spec.name, fp, inputs, spec.version)
        p.spec, p.comp_of, p.refs, p.encoded = spec, comp_of, refs, enc
        p.issued = next(self._issued)
        # an at-most-once tool's records get an fdatasync of their own under every policy
        p.synced = spec.at_most_once or SYNCED_TOOLS.get()
        base = default_key(self.run_id, sid)
        p.key = base
        e = self._check(sid, "tool", spec.name, fp)
        if e is None:
            return p
        p.gen = e.gen
        p.key = e.key or base
        if e.done:
            if (e.err is not None and retry_failed) or (
                    e.err is None and spec.version != e.tool_version
                    and self._drift(e, "tool", e.tool_version, spec.version)):
                p.gen = e.gen + 1
                if e.err is None or retry_failed != SAME_KEY:
                    p.key = f"{base}#{p.gen}"  # a new call: a new key; both stay journaled
                return p
            p.entry, p.replay = e, True
            return p
        # an intent without a receipt: the call may or may not have happened
        p.tries = e.tries
        if not e.in_flight:     # its last attempt failed (journaled): go on with the budget
            p.rc = e.retry_count + 1
            return p
        if e.resolved is not None and not e.resolved.get("done"):
            p.rc = e.retry_count + 1
            log.warning("durkv: run %r step %s (%r): resolved as not done; calling it (key %s)",
                        self.run_id, sid, spec.name, p.key)
            return p
        if e.at_most_once or spec.at_most_once:
            msg = (f"run {self.run_id!r} step {sid}: at-most-once tool {spec.name!r} "
                   f"(key {p.key}) was interrupted between intent and receipt; whether it "
                   "happened is unknown. Check the service, then record it with "
                   f"store.resolve({self.run_id!r}, {sid!r}, done=True, result=...) or "
                   "done=False (call it again)")
            log.error("durkv: in-doubt step: %s", msg)
            self._status("in_doubt", sid, msg)
            raise InDoubtError(msg, run_id=self.run_id, step_id=sid, key=p.key)
        p.rc = e.retry_count + 1
        log.warning("durkv: run %r step %s (%r): intent without receipt; calling again with "
                    "the same key %s (retry %d)", self.run_id, sid, spec.name, p.key, p.rc)
        return p

    def _intent(self, p: Plan) -> None:
        t = self._clock()
        # a repair may have cut this call's records: held until the operator's word
        held = self._repair is not None and self._repair.doubt(
            p.sid, p.gen, p.key, p.name, self._st.latest(p.sid))
        at_most_once = p.spec is not None and p.spec.at_most_once
        key = None if p.key == default_key(self.run_id, p.sid) else p.key   # derived
        rec = IntentRecord(t, p.sid, p.name, p.fp, key, p.rc, p.gen, p.inputs, p.version,
                           at_most_once, p.comp_of, self._repair.ids[0] if held else None,
                           p.refs).pack()       # cut: no call follows
        # docs/GUARANTEES.md 16.9: an at-most-once tool's intent gets its own fdatasync, and
        # a keyed tool's where the policy would not keep it through a process kill; under
        # `sync` a keyed tool's intent is only written, after every record before it is
        # durable (it mostly is: each waited) -- a lost intent is the same call again, with
        # the same key and the inputs those records replay
        own = bool(held) or at_most_once or not self._kill_safe
        self._append(rec, durable=own,
                     prior=not own and (p.synced or self.store.durability == "sync"))
        self._refs.recorded(p.sid, p.gen, "tool", p.name, p.encoded, None)
        if held:
            log.error("durkv: in-doubt step: %s", held)
            self._status("in_doubt", p.sid, held)
            raise InDoubtError(held, run_id=self.run_id, step_id=p.sid, key=p.key)

    def _not_called(self, p: Plan) -> None:
        """The intent is written and the call never began (a task cancelled while the
        intent's fsync was waited for): say so in the journal, as an operator's "not
        done" would, so that the next execution calls it (same key) instead of finding
        an at-most-once tool in doubt. Should this record be lost, the call is in doubt,
        as any intent without a receipt."""
        try:
            self._append(ResolveRecord(self._clock(), p.sid, False, "durkv",
                                       "cancelled before the call began", None,
                                       p.gen).pack())
        except DurkvError as e:
            log.warning("durkv: run %r step %s: could not record that %r was never called "
                        "(%s); it will be found in doubt", self.run_id, p.sid, p.name, e)

    def _receipt(self, p: Plan, result: Any = None, exc: BaseException | None = None,
                 tries: list | None = None) -> None:
        t = self._clock()
        tries, err, r = self._outcome_fields(p, result, exc, tries,
                                             f"the call happened but has no receipt: a "
                                             f"re-execution calls it again with the same key "
                                             f"({p.key}). Return plain data")
        try:
            # a keyed tool's lost receipt is the same call again with the same key and
            # the inputs its intent recorded: once by key (docs/GUARANTEES.md 16.9)
            self._append(ReceiptRecord(t, p.sid, p.gen, tries, err, r).pack(),
                         durable=p.synced)
        except FrameTooLargeError as e:
            raise FrameTooLargeError(
                f"tool {p.name!r} (step {p.sid} of run {self.run_id!r}, key {p.key}) was "
                f"called and returned, but its receipt is too large to journal ({e}); the "
                f"call happened and is unrecorded: {self._unrecorded(p)}. Return a smaller "
                "result (store the payload elsewhere and return a reference to it)",
                run_id=self.run_id, step_id=p.sid, key=p.key) from e

    def _unrecorded(self, p: Plan) -> str:
        if p.spec is not None and p.spec.at_most_once:
            return (f"the next execution reports it in doubt; resolve it with store.resolve("
                    f"{self.run_id!r}, {p.sid!r}, done=True, result=<a reference to the "
                    "payload>)")
        return f"the next execution calls it again with the same key ({p.key})"

    def _outcome_fields(self, p: Plan, result: Any, exc: BaseException | None,
                        tries: list | None, if_unencodable: str) -> tuple:
        """A step's or receipt's outcome fields ``(tries, err, result)``: the attempts'
        errors, then the final error or the serialized result (SerializationError, saying
        ``if_unencodable``)."""
        if exc is not None:
            return tries, self._err(exc), None
        try:
            return tries, None, self._values.record(result)
        except Exception as e:
            if inspect.isawaitable(result):      # fn is async: its body has not run
                getattr(result, "close", lambda: None)()
                raise ConfigError(
                    f"{p.kind} {p.name!r} (step {p.sid} of run {self.run_id!r}) returned an "
                    f"awaitable: the function is async and was not awaited, nothing was "
                    f"recorded; use `await run.a{p.kind}(...)` inside `async with "
                    "store.arun(...)`", run_id=self.run_id, step_id=p.sid) from e
            raise SerializationError(
                f"the result of {p.kind} {p.name!r} (step {p.sid} of run {self.run_id!r}) "
                f"cannot be serialized ({e}); {if_unencodable}", run_id=self.run_id,
                step_id=p.sid) from e

    def _done(self, p: Plan, result: Any) -> Any:
        if (p.spec is not None and p.spec.compensate is not None and p.comp_of is None
                and self._keep_undos):
            # the result as recorded, not the caller's object (which it may mutate): the undo
            # gets what a replay would pass, so a re-execution meets the same undo inputs
            self._compensable.append((p.issued, p.sid, p.spec, self._dumps(result)))
        return result

    def tool(self, fn: Callable, *args: Any, retry: Retry | None = None, key: str | None = None,
             secret: bool = False, retry_failed: bool = False, **kwargs: Any) -> Any:
        """Call a ``@durkv.tool`` at most once per step id (see the module docstring): a
        recorded receipt is returned without a call; an intent without a receipt is
        called again with the same key (``retry_count + 1``), or, for an at-most-once
        tool, raises :class:`durkv.InDoubtError`. A recorded failure is raised again,
        unless ``retry_failed``: ``True`` calls again under a new key (``key#gen``),
        :data:`SAME_KEY` under the recorded one (durkv.langgraph: a LangGraph retry)."""
        spec = self._spec(fn, kwargs)
        _check_retry(retry)
        if inspect.iscoroutinefunction(fn):    # refused before its intent: never awaited
            raise ConfigError(f"run.tool({spec.name!r}): an async tool; call it with `await "
                              "run.atool(...)` (inside `async with store.arun(...)`)")
        p = self._plan_tool(self._sid(key), spec, args, kwargs, secret,
                            retry_failed=retry_failed)
        return self._drive(p, fn, args, kwargs, retry)

    def _drive(self, p: Plan, fn: Callable, args: tuple, kwargs: dict,
               retry: Retry | None) -> Any:
        """A planned call, synchronously: its recorded outcome, or its attempts."""
        if p.replay:
            e = p.entry
            v = self._loads(e.result) if e.err is None else self._outcome(e)
            return v if p.spec is None else self._done(p, v)
        if retry is None:
            return self._once(p, fn, args, kwargs)
        return drive(self, self.attempts(p, retry), fn, args, _kwargs_of(p, kwargs))

    def _once(self, p: Plan, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """:meth:`attempts` of a call without ``retry`` (one attempt), in this thread, in a
        straight line rather than through its generator (the hot path of a live run): the
        same records -- a tool's intent, the call, the record of its outcome."""
        record = self._record_step if p.spec is None else self._receipt
        if p.spec is not None:
            self._intent(p)
        tries = list(p.tries)
        ok, value = call_in(self, fn, args, _kwargs_of(p, kwargs))
        if ok:
            record(p, value, None, tries)
            return value if p.spec is None else self._done(p, value)
        tries.append([err_type(value), err_message(value)])
        record(p, None, value, tries)
        raise value

    def compensate(self) -> list:
        """Run the undos of this run's completed tools that declared ``compensate=``,
        newest first; each is a durable tool call with its own key. Returns their results.
        An async undo is refused before any is called: use ``await run.acompensate()``."""
        self._check_open()
        for _n, _sid, spec, _r in self._compensable:
            if inspect.iscoroutinefunction(spec.compensate):
                raise ConfigError(f"run.compensate(): the undo {spec.compensate!r} is async; "
                                  "use `await run.acompensate()`")
        try:
            return [self._drive(self._plan_tool(*plan), undo, (result,), {}, None)
                    for plan, undo, result in self._undos()]
        finally:
            self._undo_end()

    def _undos(self) -> Iterator[tuple[tuple, Callable, Any]]:
        """The undos to call, newest first: each one's ``_plan_tool`` arguments (its step
        id claimed when reached), the undo, and the result it undoes. One is done when
        the caller asks for the next; the caller ends the iteration with :meth:`_undo_end`
        either way (not the generator's own cleanup: after a failure the exception's
        traceback keeps the generator alive past the caller's next ``compensate()``)."""
        self._check_open()
        todo, self._compensable = self._compensable, []
        # newest first by issue, not by completion: gathered calls complete in any order,
        # and a replay completes them in issue order -- a re-execution asks for the same
        # undos in the same order (else NonDeterminismError)
        self._undo_left = pending = sorted(todo, key=lambda c: c[0], reverse=True)
        while pending:
            _n, sid, spec, recorded = pending[0]
            result = self._loads(recorded)
            undo = spec.compensate
            uspec = tool_spec(undo) or ToolSpec(
                getattr(undo, "__qualname__", repr(undo)), None, False, None)
            yield (self._sid(None), uspec, (result,), {}, False, sid), undo, result
            pending.pop(0)

    def _undo_end(self) -> None:
        """After a failed undo: it and every older one stay for the next ``compensate()``
        -- a new durable call each, so a re-execution that makes the same calls replays
        the same way (before, they were dropped and the saga could never finish)."""
        left, self._undo_left = self._undo_left, []
        self._compensable = left[::-1] + self._compensable

    # -- awaitable verbs: planned when called (ids in order of issue); every fdatasync they
    # wait for is waited for in a worker thread (aio.py) --------------------------------------

    def astep(self, name: str, fn: Callable, *args: Any, prompt_version: Any = None,
              retry: Retry | None = None, key: str | None = None, secret: bool = False,
              retry_failed: bool = False, **kwargs: Any):
        """Awaitable :meth:`step`; ``fn`` may be a coroutine function."""
        _check_name("step", name, fn, callable_fn=True)
        _check_retry(retry)
        done = raise_now(deferred(self._plan_call, self._sid(key), name, args, kwargs,
                                  prompt_version, secret, retry_failed))
        return self._adrive(done, fn, args, kwargs, retry)

    def atool(self, fn: Callable, *args: Any, retry: Retry | None = None,
              key: str | None = None, secret: bool = False, retry_failed: bool = False,
              **kwargs: Any):
        """Awaitable :meth:`tool`; ``fn`` may be a coroutine function. The intent and
        receipt fsyncs run in a worker thread (concurrent calls share them)."""
        spec = self._spec(fn, kwargs)
        _check_retry(retry)
        done = raise_now(deferred(self._plan_tool, self._sid(key), spec, args, kwargs, secret,
                                  None, retry_failed))
        return self._adrive(done, fn, args, kwargs, retry)

    async def _adrive(self, done: tuple, fn: Callable, args: tuple, kwargs: dict,
                      retry: Retry | None) -> Any:
        """A call planned by ``deferred``, from a coroutine: :meth:`_drive`'s async form.
        Counted while under way: ``async with``'s exit waits for it (:meth:`__aexit__`)."""
        self._calls_under_way += 1
        try:
            p = await settled(self.store, done)
            if p.replay:
                return self._done(p, self._outcome(p.entry))
            return await adrive(self, self.attempts(p, retry), fn, args, _kwargs_of(p, kwargs))
        finally:
            self._calls_under_way -= 1
            if not self._calls_under_way and self._calls_done is not None:
                self._calls_done.set()

    def aapprove(self, action: str, payload: Any = None, *, key: str | None = None):
        """Awaitable :meth:`approve` (a :class:`Decision`)."""
        _check_name("approval", action)
        return off_loop(self.store, self._approve_at, self._sid(key), action, payload)

    async def acompensate(self) -> list:
        """Awaitable :meth:`compensate`: sync and async undos, newest first, each awaited."""
        try:
            return [await self._adrive(deferred(self._plan_tool, *plan), undo, (result,), {},
                                       None)
                    for plan, undo, result in self._undos()]
        finally:
            self._undo_end()

    def asleep(self, seconds: float, *, key: str | None = None):
        """Awaitable :meth:`sleep`."""
        return self._asleep(raise_now(deferred(self._plan_sleep, seconds, key)))

    async def _asleep(self, planned: tuple) -> None:
        execution = self._n         # this execution's call counter: new at every open
        left, slept = await settled(self.store, planned)
        if slept:
            await asleep_with(self._sleep, left)
            # a sleep gathered beside a call that failed outlives the run's `async with`
            # (which does not wait hours for it): the run has ended, recorded failed, and
            # a "running" now would contradict it -- or another execution's status
            if self._opened and self._n is execution:
                await off_loop(self.store, self._status, "running")

    # -- approvals ---------------------------------------------------------------------------

    def approve(self, action: str, payload: Any = None, *, key: str | None = None) -> Decision:
        """Ask for a human decision on ``(action, payload)``.

        The first time: a durable pending request, then :class:`durkv.Interrupted` (the
        run pauses; ``store.decide`` records the decision). On re-execution after the
        decision: the :class:`Decision` (a rejection is a result, not an error).

        Raises:
            ApprovalMismatchError: the decision (or request) was for another payload.
        """
        _check_name("approval", action)
        return self._approve_at(self._sid(key), action, payload)

    def _approve_at(self, sid: str, action: str, payload: Any) -> Decision:
        not_nested(self, "approval", action)
        try:
            pb = self._values.record(payload)
            fp = self._values.encode([action, payload])[1]
        except Exception as e:
            raise SerializationError(f"the payload of approval {action!r} cannot be serialized: "
                                     f"{e}", run_id=self.run_id) from e
        e = self._check(sid, "approval", action, None)
        if e is None:
            self._append(ApprovalRecord(self._clock(), sid, action, fp, pb).pack(), durable=True)
            log.info("durkv: run %r step %s waits for approval of %r", self.run_id, sid, action)
            raise Interrupted(self.run_id, sid, action, payload)
        d = None if e.decision is None else DecisionRecord.of(e.decision)
        if not self._values.matches(e.fp if d is None else d.fp, fp, e.inputs,
                                    lambda p: [action, p]):
            what = "decided" if d is not None else "requested"
            raise ApprovalMismatchError(
                f"run {self.run_id!r} step {sid}: approval of {action!r} was {what} for "
                f"payload {e.fp if d is None else d.fp:016x}, the code now asks about {fp:016x}: "
                "the payload changed after the request; start a new run id or restore the "
                "payload", run_id=self.run_id, step_id=sid)
        if d is None:
            raise Interrupted(self.run_id, sid, action, payload)
        return Decision(sid, bool(d.ok), d.by, d.note, d.t)

    # -- time and chance ---------------------------------------------------------------------

    def _recorded(self, kind: str, make: Callable[[], Any], key: str | None) -> Any:
        not_nested(self, kind, kind)
        p = self._plan_step(self._sid(key), kind, kind, None, None, None)
        if p.replay:
            return self._outcome(p.entry)
        v = make()
        self._record_step(p, v)
        return v

    def now(self, *, key: str | None = None) -> float:
        """The wall clock (unix seconds), recorded: a re-execution gets the same time.
        ``key=`` names the step (threads), as for :meth:`step`."""
        return self._recorded("now", self._clock, key)

    def random(self, *, key: str | None = None) -> float:
        """``random.random()``, recorded (``key=`` as for :meth:`now`)."""
        return self._recorded("random", _random.random, key)

    def uuid(self, *, key: str | None = None) -> _uuid.UUID:
        """A new ``uuid4``, recorded (``key=`` as for :meth:`now`)."""
        return self._recorded("uuid", _uuid.uuid4, key)

    def _plan_sleep(self, seconds: float, key: str | None) -> tuple[float, bool]:
        # NaN passes `seconds < 0` and slept not at all; inf recorded a wake time, then
        # time.sleep raised OverflowError; True is an int
        if (not isinstance(seconds, (int, float)) or isinstance(seconds, bool)
                or not 0 <= seconds <= MAX_SLEEP):
            raise ConfigError(f"sleep seconds must be a number from 0 to {MAX_SLEEP:.0e}, got "
                              f"{seconds!r}")
        not_nested(self, "sleep", f"{seconds} s")
        sid = self._sid(key)
        # the length asked for is the sleep's input: another one at a recorded sleep is an
        # IdempotencyConflictError (a sleep recorded before lengths were, fp 0, is not checked)
        fp = fingerprint(struct.pack("<d", seconds))
        e = self._st.latest(sid)
        p = self._plan_step(sid, "sleep", "sleep", None if e is not None and not e.fp else fp,
                            None, None)
        p.fp = fp
        if p.replay:
            wake = self._outcome(p.entry)
        else:
            wake = self._clock() + seconds
            self._record_step(p, wake)
        left = wake - self._clock()
        if left > 0:
            self._status("sleeping", p.sid, until=wake)
        return left, left > 0

    def sleep(self, seconds: float, *, key: str | None = None) -> None:
        """Sleep durably: the wake-up time is recorded, a re-execution sleeps what is left
        (asking for another length there is an IdempotencyConflictError; ``key=`` as for
        :meth:`step`)."""
        left, slept = self._plan_sleep(seconds, key)
        if slept:
            self._sleep(left)
            self._status("running")

    # -- reading -----------------------------------------------------------------------------

    def journal(self) -> list[JournalEntry]:
        """The run's journal entries in call order, read from the store."""
        return describe(self.store, self.run_id)


_GROUPS = getattr(builtins, "BaseExceptionGroup", ())     # Python 3.11+


def _pause_in(exc: BaseException | None) -> BaseException | None:
    """``exc``, or the pause an exception group from an ``asyncio.TaskGroup`` stands for:
    its first ``Interrupted`` when every exception in it is one (parallel approvals), an
    ``InDoubtError`` when each is one of those two (its status is journaled) -- not a
    failure of the run, as a group of them would otherwise be recorded."""
    if not isinstance(exc, _GROUPS):
        return exc
    leaves, todo = [], [exc]
    while todo:
        e = todo.pop()
        if isinstance(e, _GROUPS):
            todo.extend(reversed(e.exceptions))
        else:
            leaves.append(e)
    if all(isinstance(e, Interrupted) for e in leaves):
        return leaves[0]
    if all(isinstance(e, (Interrupted, InDoubtError)) for e in leaves):
        return next(e for e in leaves if isinstance(e, InDoubtError))
    return exc


def _kwargs_of(p: Plan, kwargs: dict) -> dict:
    """The keyword arguments of each attempt: a tool's get its idempotency key (the plan's)."""
    return kwargs if p.spec is None else {"idempotency_key": p.key, **kwargs}


def _check_name(kind: str, name: Any, fn: Any = None, *, callable_fn: bool = False) -> None:
    """Refuse a step's or approval's name that is not a str (and a step's ``fn`` that
    cannot be called) before a step id is claimed or anything is journaled: the journal
    records the name as text, so another type would never match its own replay and the
    run could not resume."""
    what = "an approval's action" if kind == "approval" else f"a {kind}'s name"
    if type(name) is not str:
        raise ConfigError(f"{what} must be a str, got {type(name).__name__} {name!r:.40}; "
                          "name the call with text, e.g. run.step(\"plan\", fn)")
    if not name.isascii():
        try:
            name.encode()
        except UnicodeEncodeError:
            raise ConfigError(f"{what} {name!r:.40} holds a lone surrogate, which the "
                              "journal cannot store as text: pass valid Unicode") from None
    if callable_fn and not callable(fn):
        raise ConfigError(f"{kind} {name!r}: fn must be callable, got {type(fn).__name__} "
                          f"{fn!r:.40}; pass the function and its arguments: "
                          f"run.step({name!r}, fn, *args)")


def _check_retry(retry: Any) -> None:
    """Refuse a ``retry=`` that is not a Retry before a step id is claimed or anything is
    journaled (else it would surface as an AttributeError once the call failed, after a
    tool's intent)."""
    if retry is not None and not isinstance(retry, Retry):
        raise ConfigError(f"retry= must be a durkv.Retry (e.g. durkv.Retry(attempts=3)), "
                          f"got {type(retry).__name__} {retry!r:.40}")


# run.step: a replayed step and the common new step in one C call, everything else by the
# Python methods above (Run._step is the definition; csrc/journalscan.c StepEntry)
# a caller's wrong arguments are reported by the definition: named as the caller wrote it
Run._step.__qualname__ = "Run.step"
Run.step = StepEntry(general=Run._step, at=Run._step_at, end=Run._new_step_end,
                     fingerprint=fingerprint, record_type=StepRecord,
                     apply_step=apply_step, record_step=record_step, globals=globals(),
                     owed=OWED, cls=Run, small=SMALL_INPUTS, in_call=IN_CALL)
