"""One execution of a graph run: its state in memory, the barrier, one commit per superstep.

A run is the store thread ``run_id`` (namespace "") plus the run journal of the same
id. Checkpoint ``f"{k:012d}"`` holds the state after k supersteps (0: the input) and,
in its metadata, ``step`` (k), ``next`` (the tasks of superstep k), ``run_id``, ``j``
(the journal's length at the commit: every record before it belongs to a committed
superstep, so a resume folds only the records after it) and ``status: "finished"``
once nothing is left to run. A superstep that cannot finish leaves, as pending writes
of checkpoint k: each completed task's update (task id ``f"{k}:{node}:{index}"``, a
``__task__`` marker then its channels) and one ``__pause__`` record saying why it
stopped (``waiting``, ``sleeping`` with its wake time, ``in_doubt`` with the in-doubt
tool calls' step ids, ``failed``). A resume runs only the tasks without an update.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from sys import getrefcount
from typing import Any

from ..durability import SYNC
from ..errors import (
    ConfigError, DurkvError, FrameTooLargeError, GraphError, InDoubtError, Interrupted,
    NotFoundError, RunConflictError, SerializationError,
)
from .graph_ctx import NodeContext, SleepPause
from .graph_spec import APPEND, FN, START, Spec, Task, decode_tasks
from .journal import E_DECISION, E_RESOLVE, E_RUN, E_STATUS
from .plan import err_type
from .run import NO_INPUT, Run, fingerprint
from .values import Values

__all__ = ["Execution", "GraphResult", "in_thread", "Pending", "Superstep", "Snapshot", "cid_of",
           "snapshot_of", "DONE_CH", "PAUSE_TASK", "PAUSE_CH"]

DONE_CH = "__task__"        # a completed task's marker write (its update may be empty)
PAUSE_TASK = "__pause__"    # the task id of the superstep's pause record
PAUSE_CH = "__interrupt__"  # a special channel: a later pause record overwrites the last
_MISSING = object()
# the pauses an answer in the journal ends: a decision (store.decide), a resolve
_ANSWERED_BY = {"waiting": E_DECISION, "in_doubt": E_RESOLVE}
_SCALARS = frozenset((str, int, float, bool, bytes, type(None)))    # immutable: no copy


def cid_of(step: int) -> str:
    """The checkpoint id of the state after ``step`` supersteps (sortable)."""
    return str(step).zfill(12)      # f"{step:012d}", in half the time (once a superstep)


@dataclass(frozen=True)
class Pending:
    """An approval a paused run waits for: decide it with ``store.decide(run_id,
    step_id, approved)``."""

    step_id: str
    action: str
    payload: Any = None


@dataclass
class GraphResult:
    """What ``app.run`` returns (and ``app.state`` reads): ``status`` is ``finished``,
    ``waiting`` (``waiting`` lists the approvals), ``sleeping`` (until ``until``),
    ``in_doubt`` (``in_doubt`` lists the step ids of at-most-once tool calls interrupted
    between intent and receipt: record what happened with ``store.resolve(run_id,
    step_id, done=...)``; ``message`` says how), ``failed`` (``error`` the exception when
    raised in this process, ``message`` its text) or, from ``app.state`` only,
    ``running`` (unfinished: resume with ``app.run(None, run_id=...)``)."""

    run_id: str
    status: str
    state: dict
    step: int
    checkpoint_id: str
    waiting: list = field(default_factory=list)
    until: float | None = None
    error: BaseException | None = None
    message: str | None = None
    in_doubt: list = field(default_factory=list)

    @property
    def interrupt(self) -> Pending | None:
        """The first pending approval (None unless ``waiting``)."""
        return self.waiting[0] if self.waiting else None


@dataclass(frozen=True)
class Superstep:
    """One committed superstep, as ``app.stream`` yields it: the tasks' updates in task
    order (node name, then Send index)."""

    step: int
    checkpoint_id: str
    updates: list


@dataclass(frozen=True)
class Snapshot:
    """A checkpoint of a run (``app.history``): the state after ``step`` supersteps and
    the tasks that were to run next (``[node]`` or ``[node, send_arg]``)."""

    checkpoint_id: str
    step: int
    state: dict
    next: list
    finished: bool
    metadata: dict


def snapshot_of(spec: Spec, ck: Any) -> Snapshot:
    meta = ck.metadata
    state = spec.defaults()
    state.update(ck.values)
    return Snapshot(ck.checkpoint_id, meta.get("step", 0), state, meta.get("next", []),
                    meta.get("status") == "finished", meta)


class Outcome:
    """What one task did: its update, or the exception that ended it."""

    __slots__ = ("task", "update", "exc", "restored")

    def __init__(self, task: Task, update: Any, exc: BaseException | None,
                 restored: bool = False) -> None:
        self.task, self.update, self.exc, self.restored = task, update, exc, restored


class Execution:
    """One ``app.run``/``app.arun`` of one run (see the module docstring)."""

    def __init__(self, app: Any, run_id: str, durability: str | None, max_supersteps: int,
                 wait: bool) -> None:
        self.spec: Spec = app.spec
        self.store = app.store
        self.name = app.name
        self.on_drift = app.on_drift
        self.run_id = run_id
        self.durability = durability
        self.max_supersteps = max_supersteps
        self.wait = wait
        self.run: Run | None = None
        self.record: dict = {}
        self.values: dict = {}
        self.versions: dict = {}
        self.step = -1
        self.cid: str | None = None
        self.since = 0
        self.tasks: list[Task] = []
        self.done: dict[str, dict] = {}        # task id -> its update (pending writes)
        self.pause: dict | None = None
        self.result: GraphResult | None = None
        self.last: list[Outcome] = []           # the outcomes of the last commit
        self.dirty = False      # a superstep folded into the state and not committed
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- start: load the run, or create it ------------------------------------------------

    def start(self, input: Any, resume_failed: bool = True) -> None:  # noqa: A002
        """Load the newest checkpoint (or commit the input as checkpoint 0). Sets
        ``result`` when there is nothing to run now (finished, waiting for a decision,
        sleeping, failed and not ``resume_failed``): then no journal record is written."""
        if input is not None and not isinstance(input, dict):
            raise ConfigError(f"the input of a graph run is a dict of channel values (or None "
                              f"to resume), got {type(input).__name__}")
        if input is not None and type(input) is not dict:
            input = dict(input)     # noqa: A001 - the channels count, not the mapping's class
        fp = None
        if input is not None:
            # the state starts from the input as stored, not from the caller's objects
            # (which the caller may edit while the run goes on, under arun)
            input, fp = self._fingerprint(input)   # noqa: A001
        ck = self.store.get(self.run_id)
        if ck is None:
            self._refuse_plain_journal()
            if input is None:
                raise NotFoundError(f"run {self.run_id!r} does not exist; start it with its "
                                    "input: app.run({...}, run_id=...)", run_id=self.run_id)
            staged: dict = {}
            self.reduce_into(staged, START, input)   # a bad input writes nothing at all
            self._open(input)
            ck = self.store.get(self.run_id)     # another driver may have created it
            if ck is None:
                return self._first(fp, staged)
        self.check(ck, fp)
        self._load(ck)
        if self.run is not None:
            self._ready(resume_failed)
            return None
        if not self._ready(resume_failed):
            return None         # nothing to run: no journal record written
        self._open(NO_INPUT)
        if self._newest() != ck.checkpoint_id:      # advanced before we claimed it
            self._load(self.store.get(self.run_id))
            self._ready(resume_failed)
        return None

    def _refuse_plain_journal(self) -> None:
        """A run id with a journal but no checkpoint: a graph run cut before its first
        commit (its journal has only its start record, maybe a status) resumes; a
        ``store.run`` journal -- steps, or finished -- is not adopted (its input may even
        be equal: the graph would take its status and journal as its own)."""
        if not self.store.journal_length(self.run_id):
            return
        if any(r.get("e") not in (E_RUN, E_STATUS) or r.get("st") == "finished"
               for r in self.store.journal(self.run_id)):
            raise RunConflictError(
                f"run id {self.run_id!r} holds a store.run journal, not a durkv.Graph run; "
                "use another run id", run_id=self.run_id)

    def _fingerprint(self, input: dict) -> tuple[dict, tuple[int, int]]:  # noqa: A002
        """A copy of the input decoded from its serde bytes, and its fingerprints: the
        canonical one (an equal dict in another order, a set in another process's hash
        order: the same) and that of its serde bytes (what runs started before the
        canonical one recorded, FORMAT.md 5c)."""
        try:
            b, fp = Values(self.store.serde).encode(input)
            return self.store.serde.loads(b), (fp, fingerprint(b))
        except Exception as e:
            raise ConfigError(f"the input of run {self.run_id!r} cannot be serialized: {e}",
                              run_id=self.run_id) from e

    def _open(self, input: Any) -> None:  # noqa: A002
        sleep = time.sleep if self.wait else _pause_sleep
        run = Run(self.store, self.run_id, input, on_drift=self.on_drift, sleep=sleep,
                  since=self.since, undos=False)     # each task's ctx keeps its undos
        run.open()          # RunBusyError: another driver in this process
        self.run = run

    def _newest(self) -> str | None:
        head = next(iter(self.store.history(self.run_id, "", limit=1, values=False)), None)
        return None if head is None else head.checkpoint_id

    def check(self, ck: Any, fp: tuple[int, int] | None) -> None:
        """Refuse a checkpoint that is not of a run of this graph, or another input."""
        rec = ck.checkpoint
        if not isinstance(rec, dict) or rec.get("graph") != self.name:
            other = rec.get("graph") if isinstance(rec, dict) else None
            raise RunConflictError(
                f"thread {self.run_id!r} holds " + (
                    f"a run of graph {other!r}, not {self.name!r}: to run it with this "
                    f"code, compile the graph under the run's name, g.compile(store, "
                    f"name={other!r}) (a default name changes with the nodes and "
                    "channels: name graphs whose runs outlive a deploy); for a new job, "
                    "use another run id" if other else
                    "checkpoints of no durkv.Graph; use another run id"),
                run_id=self.run_id, graph=other)
        if fp is not None and rec.get("in") not in fp:
            raise RunConflictError(
                f"run {self.run_id!r} exists with another input; two jobs must not share a run "
                "id: use a new run id, the original input, or None to resume",
                run_id=self.run_id)

    def _first(self, fp: tuple[int, int], staged: dict) -> None:
        """Commit checkpoint 0: the input (``staged`` by :meth:`reduce_into`)."""
        self.record = {"graph": self.name, "in": fp[0]}
        self.values = self.spec.defaults()
        changed = self.apply(staged)
        tasks = self._route([START])
        self.commit(changed, tasks)

    def _load(self, ck: Any) -> None:
        meta = ck.metadata
        self.record = ck.checkpoint
        self.step, self.cid, self.since = meta["step"], ck.checkpoint_id, meta.get("j", 0)
        self.values = self.spec.defaults()
        self.values.update(ck.values)
        self.versions = dict(ck.versions)
        self._check_kinds(ck)
        self.tasks = decode_tasks(meta.get("next", []))
        lost = sorted({t.node for t in self.tasks} - self.spec.nodes.keys())
        if lost:
            raise GraphError(f"run {self.run_id!r} is to run node(s) {', '.join(lost)} next, "
                             "which this graph does not have: run it with the graph's code "
                             "that made it", run_id=self.run_id, nodes=lost)
        self.done, self.pause = {}, None
        for w in ck.writes:
            if w.task_id == PAUSE_TASK:
                self.pause = w.value
            elif w.channel == DONE_CH:
                self.done.setdefault(w.task_id, {})
            else:
                self.done.setdefault(w.task_id, {})[w.channel] = w.value
        self.result = None
        if meta.get("status") == "finished":
            self.result = self._result("finished")

    def _check_kinds(self, ck: Any) -> None:
        """Refuse a run whose stored values or pending writes do not fit their channels'
        reducers: the graph changed under it (a deploy turned a ``Last`` channel into an
        ``Append``), and the first superstep would fail on them deep in a fold."""
        chans = self.spec.channels
        for ch, v in ck.values.items():
            if _misfit(chans.get(ch), v, list):
                raise self._changed(ch, f"holds {type(v).__name__} {v!r:.60}")
        for w in ck.writes:
            if _misfit(chans.get(w.channel), w.value, (list, tuple)):
                raise self._changed(w.channel, f"has a pending write of task {w.task_id} "
                                               f"that is {type(w.value).__name__} "
                                               f"{w.value!r:.60}")

    def _changed(self, ch: str, what: str) -> GraphError:
        return GraphError(
            f"run {self.run_id!r}: channel {ch!r} is a durkv.Append() in this graph, but "
            f"the run {what}, not a list: the channel's reducer changed since the run "
            f"started. Finish the run with the graph's code that started it, and compile "
            f"the changed graph under a new name (g.compile(store, name=...)) so that its "
            f"runs stay apart from {self.name!r}'s", run_id=self.run_id, channel=ch)

    def _ready(self, resume_failed: bool) -> bool:
        """Whether the loaded run has work to do now; else ``result`` says why not."""
        p = self.pause
        if self.result is not None or p is None:
            return self.result is None
        st = p.get("status")
        left = (p.get("until") or 0) - time.time()
        if st == "sleeping" and left > 0:
            if not self.wait:
                self.result = self._paused(p)
                return False
            time.sleep(left)
        elif st in _ANSWERED_BY and not self._answered(p):
            # waiting for a decision, or in doubt until an operator's resolve: run nothing
            self.result = self._paused(p)
            return False
        elif st == "failed" and not resume_failed:
            self.result = self._paused(p)
            return False
        return True

    def inspect(self, ck: Any) -> GraphResult:
        """The status of the run whose newest checkpoint is ``ck`` (nothing is run)."""
        self.check(ck, None)
        try:
            self._load(ck)
        except GraphError as e:     # this graph cannot run it (a deploy changed it)
            return self._result("failed", error=e, message=f"{err_type(e)}: {e}")
        if self.result is not None:
            return self.result
        p = self.pause
        if p is not None and p.get("status") == "waiting":
            # the approvals still to decide: a decided one is not pending any more, and
            # with none left the run is ready to resume
            done = self._answered(p)
            p = {**p, "waiting": [w for w in p.get("waiting", ()) if w[0] not in done]}
            if not p["waiting"]:
                p = None
        elif p is not None and p.get("status") == "in_doubt" and self._answered(p):
            p = None        # resolved: the next app.run/recover resumes it
        return self._result("running") if p is None else self._paused(p)

    def _answered(self, p: dict) -> set[str]:
        """The step ids of ``p``'s pause that are answered in the journal: the approvals
        of a ``waiting`` run with a decision, the tool calls of an ``in_doubt`` one with
        an operator's resolve (the records since the checkpoint: those of this
        superstep)."""
        st = p.get("status")
        want = ({w[0] for w in p.get("waiting", ())} if st == "waiting"
                else set(p.get("in_doubt", ())))
        kind = _ANSWERED_BY[st]
        return {r["s"] for r in self.store.journal(self.run_id, start=self.since)
                if r.get("e") == kind and r.get("s") in want}

    def _result(self, status: str, **kw: Any) -> GraphResult:
        if self.dirty:
            self._committed()
        return GraphResult(self.run_id, status, self.values, self.step, self.cid, **kw)

    def _paused(self, p: dict) -> GraphResult:
        return self._result(p["status"], waiting=[Pending(*w) for w in p.get("waiting", ())],
                            until=p.get("until"), message=p.get("message"),
                            in_doubt=list(p.get("in_doubt", ())))

    # -- a superstep: the tasks, the barrier, the commit -------------------------------------

    def todo(self) -> list[Task]:
        """The tasks of the current superstep that have no update yet."""
        if self.step >= self.max_supersteps:
            nodes = ", ".join(sorted({t.node for t in self.tasks}))
            e = GraphError(
                f"run {self.run_id!r} reached max_supersteps={self.max_supersteps} with nodes "
                f"{nodes} still active: a loop that never reaches durkv.END? If it is meant "
                "to go on, resume it with app.run(None, run_id=..., max_supersteps=<more>)",
                run_id=self.run_id, nodes=nodes)
            self.fail(e)
            raise e
        done = self.done
        if not done:
            return self.tasks
        return [t for t in self.tasks if self.task_id(t) not in done]

    def task_id(self, t: Task) -> str:
        return f"{self.step}:{t.node}:{t.index}"

    def _arg(self, t: Task) -> tuple[Any, NodeContext]:
        return (t.arg if t.send else dict(self.values)), NodeContext(self.run, self.step,
                                                                     t.node, t.index)

    def call(self, t: Task) -> Outcome:
        """Run one (plain) task; its exception, whatever it is, becomes its outcome."""
        arg, ctx = self._arg(t)
        try:
            fn = self.spec.nodes[t.node]
            upd = fn(arg, ctx) if self.spec.arity[t.node] == 2 else fn(arg)
        except BaseException as e:      # noqa: B036 - the barrier sorts them out
            return Outcome(t, None, e)
        return Outcome(t, upd, None)

    async def acall(self, t: Task, threads: bool) -> Outcome:
        if not self.spec.is_async[t.node]:
            return await in_thread(self.call, t) if threads else self.call(t)
        arg, ctx = self._arg(t)
        try:
            fn = self.spec.nodes[t.node]
            upd = await (fn(arg, ctx) if self.spec.arity[t.node] == 2 else fn(arg))
        except asyncio.CancelledError:
            raise
        except BaseException as e:      # noqa: B036
            return Outcome(t, None, e)
        return Outcome(t, upd, None)

    async def acall_all(self, todo: list[Task], offload: bool) -> list[Outcome]:
        """Run the tasks on the running loop: async nodes as coroutines, plain ones in
        worker threads when several run at once or ``offload`` (the loop is the
        caller's: a blocking node must not stall its other work)."""
        if len(todo) == 1:
            return [await self.acall(todo[0], offload)]
        return list(await asyncio.gather(*(self.acall(t, True) for t in todo)))

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop async nodes run on under the sync ``app.run`` (one per execution)."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        return self.loop

    def barrier(self, ran: list[Outcome]) -> bool:
        """Fold the superstep's updates (in task order) and commit it (True); or, when a
        task failed or paused, keep the completed tasks' updates as pending writes."""
        outs = self._in_order(ran)
        staged: dict = {}
        ok = True
        self.dirty = True       # a reducer may edit the state in place from here on
        for o in outs:
            if o.exc is None:
                try:
                    self.reduce_into(staged, o.task.node, o.update)
                except GraphError as e:
                    o.exc = e
            ok = ok and o.exc is None
        if not ok:
            self._stop(outs)
            return False
        changed = self.apply(staged)
        # the nodes that ran, each once, in task order (one task: the common loop)
        sources = ([outs[0].task.node] if len(outs) == 1
                   else list(dict.fromkeys(o.task.node for o in outs)))
        try:
            tasks = self._route(sources)
        except Exception as e:
            self._keep(outs)
            self.fail(e)
            raise
        self.commit(changed, tasks)
        self.dirty = False
        self.last = outs
        return True

    def _committed(self) -> None:
        """The state as the last checkpoint has it, read back from the store, after a
        superstep that was folded or applied and not committed: apply extends Append lists
        in place, and a reducer may edit its old value in place (``a.update(b)``)."""
        self.dirty = False
        if self.cid is None:
            return
        try:
            ck = self.store.get(self.run_id, "", self.cid)
        except DurkvError:
            return          # the store failed too: its error is the one the caller gets
        if ck is not None:
            self.values = self.spec.defaults()
            self.values.update(ck.values)

    def superstep(self) -> Superstep:
        """The superstep just committed, as ``app.stream`` yields it."""
        return Superstep(self.step, self.cid, [(o.task.node, o.update) for o in self.last])

    def _in_order(self, ran: list[Outcome]) -> list[Outcome]:
        if not self.done:
            return ran
        by_id = {self.task_id(o.task): o for o in ran}
        return [by_id.get(self.task_id(t)) or Outcome(t, self.done[self.task_id(t)], None, True)
                for t in self.tasks]

    def reduce_into(self, staged: dict, node: str, upd: Any) -> None:
        """Fold one task's update into ``staged`` (Append: the new items; other
        channels: the new value). Raises GraphError naming node and key; ``self.values``
        is not touched."""
        if upd is None:
            return
        if type(upd) is not dict and not isinstance(upd, dict):    # a subclass is a dict
            raise GraphError(f"{_who(node)} returned {type(upd).__name__} {upd!r:.80}; a node "
                             "returns a dict of channel updates (or None)", node=node)
        chans = self.spec.channels
        for ch, v in upd.items():
            r = chans.get(ch)
            if r is None:
                raise GraphError(f"{_who(node)} has key {ch!r}, which is not a channel of "
                                 f"the graph (channels: {', '.join(chans)})", node=node, key=ch)
            kind, fn = r
            if kind == APPEND:
                if type(v) is not list and type(v) is not tuple:
                    raise GraphError(f"{_who(node)}: channel {ch!r} is a durkv.Append(); its "
                                     f"update is a list of new items, got {type(v).__name__}",
                                     node=node, key=ch)
                got = staged.get(ch)
                if got is None:
                    staged[ch] = list(v)     # our own list: never the node's
                else:
                    got.extend(v)
            elif kind == FN:
                self._fold(staged, node, ch, fn, v)
            else:
                staged[ch] = v

    def _fold(self, staged: dict, node: str, ch: str, fn: Any, v: Any) -> None:
        if ch in staged:
            old = staged[ch]
        elif ch in self.versions:
            old = self.values[ch]
            if type(old) not in _SCALARS and getrefcount(old) > _STATE_ONLY:
                # the reducer may edit it in place (``a.extend(b)``), and something else
                # holds it (a node set another channel to it): that value must stay what
                # the node saw. It was stored: it encodes
                old = self.store.serde.loads(self.store.serde.dumps(old))
        else:
            staged[ch] = self._own(node, ch, v)
            return
        try:
            new = fn(old, v)
        except Exception as e:
            name = getattr(fn, "__qualname__", repr(fn))
            raise GraphError(f"{_who(node)}: the reducer {name!r} of channel {ch!r} refused "
                             f"the update {v!r:.80} ({err_type(e)}: {e})",
                             node=node, key=ch) from e
        staged[ch] = self._own(node, ch, v) if new is v else new

    def _own(self, node: str, ch: str, v: Any) -> Any:
        """The state's own copy of a node's value that a fold would otherwise take as is
        (a channel's first value, or a reducer returning its ``new``): a later fold --
        an in-place reducer, ``a.extend(b); return a`` -- edits the state's value, and
        the node's object is also its update, kept as a pending write when the superstep
        stops and yielded by ``app.stream``. Decoded from its serde bytes: the value a
        resumed run reads. Only then: a reducer's own result is not copied."""
        if type(v) in _SCALARS:
            return v
        serde = self.store.serde
        try:
            return serde.loads(serde.dumps(v))
        except Exception as e:      # a user serde may raise anything: name the node
            raise GraphError(f"{_who(node)}: the update of channel {ch!r} cannot be stored: "
                             f"{e}", node=node, key=ch) from e

    def apply(self, staged: dict) -> dict:
        """Apply folded updates to the state; returns the changed channels' values."""
        values, chans = self.values, self.spec.channels
        for ch, v in staged.items():
            if chans[ch][0] != APPEND:
                values[ch] = v
                continue
            cur = values[ch]
            if getrefcount(cur) > _STATE_ONLY:
                # a node kept the list (a Last/function channel set to it, ``{"snap":
                # state["msgs"]}``, maybe nested; a closure): it keeps what it saw, the
                # state goes on with a copy (once: nothing else holds the new list)
                cur = values[ch] = cur + v
            else:
                cur.extend(v)       # in place: the list is ours, the store copies what it keeps
            staged[ch] = cur
        return staged

    def _route(self, sources: list[str]) -> list[Task]:
        try:
            return self.spec.next_tasks(sources, dict(self.values))
        except GraphError:
            raise
        except Exception as e:
            raise GraphError(f"a router of node(s) {', '.join(sources)} raised {err_type(e)}: "
                             f"{e}", run_id=self.run_id) from e

    def commit(self, changed: dict, tasks: list[Task]) -> None:
        """The superstep's one commit: the changed channels, all versions, the next tasks."""
        step = self.step + 1
        cid = cid_of(step)
        versions = self.versions
        for ch in changed:
            versions[ch] = step
        meta = {"step": step, "next": [t.enc for t in tasks], "run_id": self.run_id,
                "j": self.store.journal_length(self.run_id)}
        if not tasks:
            meta["status"] = "finished"
        try:
            self.store.put(self.run_id, "", cid, checkpoint=self.record, metadata=meta,
                           values=changed, versions=versions, parent_id=self.cid,
                           durability=self.durability)
        except (SerializationError, FrameTooLargeError) as e:   # a node's value or a Send's
            raise self._unstorable(e, f"superstep {step} (its updates and next tasks)") from e
        self.step, self.cid, self.tasks = step, cid, tasks
        if self.run is not None:
            self.run.settle(meta["j"])      # the supersteps before this one: never again
        if self.done:
            self.done = {}
        if not tasks:
            self.result = self._result("finished")

    # -- a superstep that stops: pending writes and the pause record --------------------------

    def _keep(self, outs: list[Outcome]) -> None:
        """Each completed task's update as pending writes of the current checkpoint."""
        dur = self.durability if self.durability == SYNC else None
        for o in outs:
            if o.exc is not None or o.restored:
                continue
            upd = o.update or {}
            # stored as given (a tuple stays a tuple: the fold on resume sees what the
            # node returned, as it does on an uninterrupted run)
            writes = [(0, DONE_CH, None)] + [
                (i, ch, v) for i, (ch, v) in enumerate(upd.items(), 1)]
            try:
                self.store.put_writes(self.run_id, "", self.cid, self.task_id(o.task), writes,
                                      durability=dur)
            except (SerializationError, FrameTooLargeError) as e:
                raise self._unstorable(e, f"the update of node {o.task.node!r} (task "
                                          f"{self.task_id(o.task)})") from e

    def _stop(self, outs: list[Outcome]) -> None:
        """A superstep that cannot commit: keep what completed, record why it stopped."""
        self._keep(outs)
        excs = [o for o in outs if o.exc is not None]
        for o in excs:
            if not isinstance(o.exc, (Exception, Interrupted, SleepPause)):
                raise o.exc         # KeyboardInterrupt, SystemExit: after the siblings' writes
        # an at-most-once tool in doubt pauses the run until an operator resolves it
        doubts = [o.exc for o in excs if isinstance(o.exc, InDoubtError)]
        failed = [o for o in excs if isinstance(o.exc, Exception)
                  and not isinstance(o.exc, InDoubtError)]
        waits = [o.exc for o in excs if isinstance(o.exc, Interrupted)]
        if failed:
            o = failed[0]
            p = {"status": "failed", "message": f"node {o.task.node!r} (task "
                 f"{self.task_id(o.task)}) raised {err_type(o.exc)}: {o.exc}"}
        elif doubts:
            p = {"status": "in_doubt", "in_doubt": [e.step_id for e in doubts],
                 "message": str(doubts[0])}
        elif waits:
            p = {"status": "waiting", "waiting": [[w.step_id, w.action, w.payload]
                                                  for w in waits]}
        else:       # the earliest wake time a task asked for (its siblings' run time aside)
            p = {"status": "sleeping", "until": min(o.exc.until for o in excs)}
        self._pause(p)
        self.result = self._paused(p)
        if failed:
            self.result.error = failed[0].exc
            if isinstance(failed[0].exc, GraphError):
                raise failed[0].exc

    def _pause(self, p: dict) -> None:
        """Record why the current superstep stopped (a special channel: it overwrites)."""
        dur = self.durability if self.durability == SYNC else None
        self.store.put_writes(self.run_id, "", self.cid, PAUSE_TASK, [(0, PAUSE_CH, p)],
                              durability=dur)

    def _unstorable(self, e: DurkvError, what: str) -> GraphError:
        """A value the serde refuses, or a superstep larger than the store's
        ``max_commit_bytes``, breaks the graph's contract as a bad update does:
        the run is ``failed`` (so that ``recover`` goes on with the others), nothing of
        the superstep is committed."""
        err = GraphError(f"run {self.run_id!r}: {what} cannot be stored: {e}",
                         run_id=self.run_id)
        self.fail(err)
        return err

    def fail(self, e: Exception) -> GraphResult:
        """Record that the run stopped on ``e`` (a GraphError: its graph broke the
        contract), so that ``app.state`` says ``failed`` and ``recover`` passes it by."""
        msg = f"{err_type(e)}: {e}"
        if self.cid is not None:
            self._pause({"status": "failed", "message": msg})
        return self._result("failed", error=e, message=msg)

    # -- the end: the journal's status ----------------------------------------------------

    def close(self, exc: BaseException | None) -> None:
        """Journal how the execution ended and release the run."""
        run, self.run = self.run, None
        if self.loop is not None:
            self.loop.close()
            self.loop = None
        if run is None:
            return
        if exc is not None and not isinstance(exc, GeneratorExit):
            run.close(exc)
            return
        r = self.result
        if r is not None:
            step = (r.waiting[0].step_id if r.waiting
                    else r.in_doubt[0] if r.in_doubt else None)
            run.mark(r.status, step, r.message, r.until)
        run.close(record=False)     # a stream abandoned early: the run stays "running"


async def in_thread(fn: Any, *args: Any) -> Any:
    """``await asyncio.to_thread(fn, *args)``, except that a cancellation still waits for
    the thread to finish before it propagates: a thread cannot be stopped, and one still
    running a node, a start (it claims the run) or a barrier (it commits) after
    ``arun`` released the run would act for a run another driver may now hold."""
    fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        while not fut.done():
            try:
                await asyncio.wait((fut,))
            except asyncio.CancelledError:  # cancelled again: still wait for the thread
                continue
        if not fut.cancelled():
            fut.exception()     # retrieved: the cancellation is what the caller gets
        raise


def _state_only() -> int:
    """``getrefcount(value)`` of a value that only the state (a dict) holds, bound to a
    local as in ``apply`` and ``_fold``: measured by the same code, so that the
    interpreter's own references (the local, the argument) cancel out. A higher count
    there means something else holds the state's value -- an update, another channel's
    value at any depth, a node's closure -- and it must not be edited in place (CPython's
    reference count: exact, and a call per Append channel or function channel fold)."""
    values = {"ch": []}
    cur = values["ch"]
    return getrefcount(cur)


_STATE_ONLY = _state_only()


def _misfit(chan: tuple | None, v: Any, fits: type | tuple) -> bool:
    """Whether a stored value cannot be a value (or an update) of channel ``chan``: only an
    Append channel's has a type (a list; its updates: lists or tuples)."""
    return chan is not None and chan[0] == APPEND and not isinstance(v, fits)


def _who(node: str) -> str:
    """The writer of an update, as an error names it (built on the error path only)."""
    return "the input" if node == START else f"node {node!r}"


def _pause_sleep(seconds: float) -> None:
    """A node's durable sleep under the scheduler: the wake time is journaled; pause the
    run instead of blocking a worker."""
    raise SleepPause(seconds)
