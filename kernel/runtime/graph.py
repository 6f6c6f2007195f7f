"""``durkv.Graph``: durkv's superstep scheduler -- durable graphs over the run journal.

>>> import durkv
>>> g = durkv.Graph({"messages": durkv.Append(), "count": durkv.Last(0)})
>>> @g.node
... def agent(state, ctx):
...     reply = ctx.step("model", str.upper, state["messages"][-1])
...     return {"messages": [reply], "count": state["count"] + 1}
>>> g.add_edge(durkv.START, "agent")
>>> g.add_conditional_edges("agent", lambda s: "agent" if s["count"] < 3 else durkv.END)
>>> with durkv.open("memory://") as store:
...     res = g.compile(store).run({"messages": ["hi"]}, run_id="t-1")
>>> res.status, res.state["messages"], res.step
('finished', ['hi', 'HI', 'HI', 'HI'], 3)

Pregel supersteps: the active tasks run (concurrently when several: a thread pool for
plain nodes, the event loop for ``async def`` ones), their updates are folded at the
barrier by the channels' reducers in task order (node name, then Send index), routers
see the state after the barrier, and the superstep is ONE commit (``store.put``) under
the chosen durability. A node's ``ctx`` is the run journal scoped to its task
(:mod:`durkv.runtime.graph_ctx`); the layout of a run in the store is in
:mod:`durkv.runtime.graph_exec`.

State given to a node is the run's own: return changes, never mutate it in place (an
in-place edit is not an update: a resumed run would not see it). Returning a state value
in an update (``{"snap": state["messages"]}``, nested or not) is safe: a list the state
would grow in place, or a function channel's value its reducer may edit, is copied first
when anything else holds it, so the snapshot stays what the node saw.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable, Iterator

from ..durability import DURABILITIES, SYNC
from ..errors import ConfigError, GraphError, NotFoundError, RunBusyError, RunConflictError
from ..store import Store
from .graph_exec import (
    Execution, GraphResult, Outcome, Pending, Snapshot, Superstep, in_thread, snapshot_of,
)
from .graph_spec import END, START, Append, Last, Send, Spec, reducer_of

__all__ = ["Graph", "App", "Append", "Last", "Send", "START", "END", "GraphResult",
           "Pending", "Snapshot", "Superstep"]

DEFAULT_MAX_SUPERSTEPS = 10_000


def _check_name(what: str, name: Any) -> None:
    if type(name) is not str or not name or name.startswith("__") or ":" in name:
        raise GraphError(f"{what} name {name!r}: use a non-empty string without ':' (it is part "
                         "of step ids) that does not start with '__' (reserved)")


def _check_end(name: Any) -> None:
    """An edge's end is a node name (or START/END): anything else would first surface
    as a TypeError deep in compile (a list is not hashable)."""
    if type(name) is not str:
        raise GraphError(f"an edge joins node names (or durkv.START, durkv.END), got "
                         f"{type(name).__name__} {name!r:.80}; for fan-out, return a list "
                         "of names or durkv.Send from a router")


def _check_run_id(what: str, run_id: Any) -> None:
    if type(run_id) is not str or not run_id:
        raise ConfigError(f"{what} must be a non-empty string, got {run_id!r}")


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Graph:
    """A graph of nodes over channels. ``channels`` maps each channel name to its reducer:
    ``durkv.Append()``, ``durkv.Last(default)`` or ``fn(old, new) -> value``."""

    def __init__(self, channels: dict[str, Any]) -> None:
        if not isinstance(channels, dict):
            raise GraphError(f"durkv.Graph takes a dict of channel name -> reducer, got "
                             f"{type(channels).__name__}")
        self.channels: dict[str, tuple[int, Any]] = {}
        for ch, r in channels.items():
            _check_name("channel", ch)
            self.channels[ch] = reducer_of(ch, r)
        self.nodes: dict[str, Callable] = {}
        self.edges: dict[str, list[str]] = {}
        self.routers: dict[str, list[tuple[Callable, Any]]] = {}

    def add_node(self, name: str | Callable, fn: Callable | None = None) -> Callable:
        """Add node ``name`` running ``fn(state, ctx)`` (``fn(arg, ctx)`` as a Send target;
        ``fn(state)`` also works). ``add_node(fn)`` names it ``fn.__name__``."""
        if fn is None and callable(name):
            name, fn = name.__name__, name
        _check_name("node", name)
        if name in self.nodes:
            raise GraphError(f"node {name!r} is already in the graph")
        if not callable(fn):
            raise GraphError(f"node {name!r}: {fn!r} is not callable")
        self.nodes[name] = fn
        return fn

    def node(self, fn: Callable | None = None, *, name: str | None = None) -> Callable:
        """Decorator form of :meth:`add_node`: ``@g.node`` or ``@g.node(name="x")``."""
        def deco(f: Callable) -> Callable:
            return self.add_node(name or f.__name__, f)
        return deco if fn is None else deco(fn)

    def add_edge(self, src: str, dst: str) -> None:
        """After ``src`` runs (``durkv.START``: at the start), ``dst`` runs (``durkv.END``:
        nothing)."""
        for end in (src, dst):
            _check_end(end)
        if src == END or dst == START:
            raise GraphError(f"edge {src!r} -> {dst!r}: START has no way in, END no way out")
        self.edges.setdefault(src, []).append(dst)

    def add_conditional_edges(self, src: str, router: Callable, path_map: Any = None) -> None:
        """After ``src`` runs, ``router(state)`` (the state after the superstep) names what
        runs next: a node name, ``durkv.END``, a ``durkv.Send(node, arg)``, or a list of
        them. ``path_map`` (a list of the names it may return, or a dict mapping its return
        values to names) lets ``compile`` check them."""
        if not callable(router):
            raise GraphError(f"the router of {src!r} is not callable: {router!r}")
        _check_end(src)
        if src == END:
            raise GraphError("END has no way out")
        names = (path_map.values() if isinstance(path_map, dict)
                 else path_map if isinstance(path_map, (list, tuple)) else None)
        if path_map is not None and (names is None or any(type(n) is not str for n in names)):
            raise GraphError(f"path_map of the router of {src!r} is a list of node names or a "
                             f"dict of router values -> node names, got {path_map!r}")
        self.routers.setdefault(src, []).append((router, path_map))

    def compile(self, store: Any, *, name: str | None = None,
                max_supersteps: int = DEFAULT_MAX_SUPERSTEPS, on_drift: str = "warn",
                max_workers: int | None = None) -> "App":
        """Check the graph and bind it to ``store`` (``durkv.open(...)``).

        ``name`` identifies the graph's runs in the store (default: ``"graph:"``, its
        sorted node names, ``"|"`` and its sorted channel names -- adding a node or a
        channel changes it, so give runs that must outlive a deploy a name of your own);
        a run of another name is a RunConflictError;
        ``max_supersteps`` is the default of :meth:`App.run`; ``on_drift`` the journal's
        version-drift policy; ``max_workers`` the thread pool's size for parallel tasks.

        Raises:
            GraphError: an edge to or from an unknown node, no edge from START, a node
                that cannot be reached, a router's path_map naming an unknown node, a
                loop of plain edges (no router can leave it), a node that cannot be
                called ``fn(state, ctx)``.
        """
        self._check()
        _check_binding(store, max_supersteps, max_workers)
        spec = Spec(dict(self.channels), dict(self.nodes),
                    {k: list(v) for k, v in self.edges.items()},
                    {k: list(v) for k, v in self.routers.items()})
        default = f"graph:{','.join(sorted(self.nodes))}|{','.join(sorted(self.channels))}"
        return App(spec, store, name or default,
                   max_supersteps, on_drift, max_workers)

    def _targets(self, src: str) -> tuple[set[str], bool]:
        """Where ``src`` leads: the named targets, and whether a router without a path_map
        may lead anywhere."""
        out = set(self.edges.get(src, ()))
        wild = False
        for _router, pm in self.routers.get(src, ()):
            if pm is None:
                wild = True
            else:
                out.update(pm.values() if isinstance(pm, dict) else pm)
        return out, wild

    def _check(self) -> None:
        if not self.nodes:
            raise GraphError("the graph has no nodes; add one with g.add_node(name, fn)")
        known = set(self.nodes)
        for src in [*self.edges, *self.routers]:
            if src != START and src not in known:
                raise GraphError(f"an edge leaves {src!r}, which is not a node (nodes: "
                                 f"{', '.join(sorted(known))})", node=src)
            targets, _ = self._targets(src)
            for dst in targets:
                if dst != END and dst not in known:
                    raise GraphError(f"an edge from {src!r} leads to {dst!r}, which is not a "
                                     f"node (nodes: {', '.join(sorted(known))})", node=dst)
        if START not in self.edges and START not in self.routers:
            raise GraphError("the graph has no entry: add g.add_edge(durkv.START, <node>)")
        seen, todo, wild = {START}, [START], False
        while todo:
            targets, w = self._targets(todo.pop())
            wild = wild or w
            for dst in targets - seen:
                seen.add(dst)
                todo.append(dst)
        lost = sorted(known - seen)
        if lost and not wild:
            raise GraphError(f"node(s) {', '.join(lost)} cannot be reached from START: add an "
                             "edge to them (or remove them)", nodes=lost)
        cycle = self._plain_cycle()
        if cycle:
            raise GraphError(
                f"the edges {' -> '.join(cycle)} form a loop no router can leave: a plain "
                "edge always runs its target, so a run would go round until max_supersteps. "
                "Make one of them a conditional edge (g.add_conditional_edges) that can "
                "lead to durkv.END", nodes=cycle)

    def _plain_cycle(self) -> list[str]:
        """A loop of plain edges (``a -> b -> a``), as the path round it; [] if none."""
        state: dict[str, int] = {}      # 1: on the current path, 2: done
        path: list[str] = []

        def visit(n: str) -> list[str]:
            state[n] = 1
            path.append(n)
            for dst in self.edges.get(n, ()):
                if state.get(dst) == 1:
                    return path[path.index(dst):] + [dst]
                if dst != END and dst not in state:
                    found = visit(dst)
                    if found:
                        return found
            path.pop()
            state[n] = 2
            return []

        for n in self.nodes:
            if n not in state:
                found = visit(n)
                if found:
                    return found
        return []


def _check_binding(store: Any, max_supersteps: Any, max_workers: Any) -> None:
    """What ``compile`` binds to: a store and limits that ``app.run`` can use (else the
    error would surface at the first run, far from the compile that caused it)."""
    if not isinstance(store, Store):
        raise ConfigError(f"g.compile takes a store opened with durkv.open(...), got "
                          f"{type(store).__name__} {store!r:.80}")
    if type(max_supersteps) is not int or max_supersteps < 1:
        raise ConfigError(f"max_supersteps must be an int >= 1, got {max_supersteps!r}")
    if max_workers is not None and (type(max_workers) is not int or max_workers < 1):
        raise ConfigError(f"max_workers must be an int >= 1 (or None: the default), got "
                          f"{max_workers!r}")


class App:
    """A compiled graph bound to a store: run, resume, stream, inspect and fork its runs.

    Each run is the store thread ``run_id`` (namespace "") and the run journal of the
    same id: ``durkv ls/history/show/verify``, ``store.runs()``, compaction and archive
    see them as any other."""

    def __init__(self, spec: Spec, store: Any, name: str, max_supersteps: int,
                 on_drift: str, max_workers: int | None) -> None:
        self.spec = spec
        self.store = store
        self.name = name
        self.max_supersteps = max_supersteps
        self.on_drift = on_drift
        self._max_workers = max_workers or min(32, (os.cpu_count() or 1) + 4)
        self._pool: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"<durkv.Graph app {self.name!r} on {self.store!r}>"

    def _execution(self, run_id: str, durability: str | None, max_supersteps: int | None,
                   wait: bool) -> Execution:
        _check_run_id("run_id", run_id)
        if durability is not None and durability not in DURABILITIES:
            raise ConfigError(f"unknown durability {durability!r}; use one of "
                              + ", ".join(DURABILITIES))
        limit = self.max_supersteps if max_supersteps is None else max_supersteps
        if type(limit) is not int or limit < 1:
            raise ConfigError(f"max_supersteps must be an int >= 1, got {limit!r}")
        return Execution(self, run_id, durability, limit, bool(wait))

    # -- running --------------------------------------------------------------------------

    def run(self, input: dict | None = None, *, run_id: str,  # noqa: A002
            durability: str | None = None, max_supersteps: int | None = None,
            wait: bool = False) -> GraphResult:
        """Run (or resume) run ``run_id`` until it finishes or pauses.

        ``input`` starts a new run; on an existing run it must equal the run's input (or
        be None): it resumes the run from its newest checkpoint, re-running only the
        tasks of the unfinished superstep that have no update. A finished run returns its
        recorded result without running anything; a run waiting for an undecided
        approval, in doubt before an operator's resolve, or sleeping before its wake time,
        returns as it is (``wait=True``: a durable sleep blocks in-process until its wake
        time instead).

        A node's exception ends the run ``failed`` (``result.error``); a node that asks
        for an approval pauses it ``waiting``; an at-most-once tool interrupted between
        intent and receipt pauses it ``in_doubt`` (``result.in_doubt``: resolve each with
        ``store.resolve``); a durable ``ctx.sleep`` pauses it ``sleeping``. In all four
        the other tasks' updates are kept.

        Raises:
            RunConflictError: another input for an existing run, or a thread that is not
                a run of this graph. RunBusyError: the run is driven elsewhere in this
                process. GraphError: a node's update or a router broke the graph's
                contract, or ``max_supersteps`` was reached (nothing of that superstep is
                committed). NotFoundError: ``input=None`` for a run that does not exist.
        """
        ex = self._execution(run_id, durability, max_supersteps, wait)
        for _ in self._drive(ex, input):
            pass
        return ex.result

    def stream(self, input: dict | None = None, *, run_id: str,  # noqa: A002
               durability: str | None = None, max_supersteps: int | None = None,
               wait: bool = False) -> Iterator[Superstep]:
        """:meth:`run`, yielding each committed superstep (its tasks' updates); the final
        status is then ``app.state(run_id)``."""
        ex = self._execution(run_id, durability, max_supersteps, wait)
        for _ in self._drive(ex, input):
            yield ex.superstep()

    def _drive(self, ex: Execution, input: Any,  # noqa: A002
               resume_failed: bool = True) -> Iterator[None]:
        """Run ``ex`` to its end, yielding after each commit."""
        if any(self.spec.is_async.values()) and _loop_running():
            # checked before anything is written: run_until_complete would fail mid-run
            raise ConfigError(f"run {ex.run_id!r}: this graph has async nodes and an event "
                              "loop is running in this thread; use `await app.arun(...)`",
                              run_id=ex.run_id)
        try:
            ex.start(input, resume_failed)
            while ex.result is None:
                if ex.barrier(self._run_tasks(ex, ex.todo())):
                    yield None
        except BaseException as e:
            ex.close(e)
            raise
        ex.close(None)

    def _run_tasks(self, ex: Execution, todo: list) -> list[Outcome]:
        if len(todo) == 1 and not self.spec.is_async[todo[0].node]:
            return [ex.call(todo[0])]       # the common case: no pool, no loop
        if any(self.spec.is_async[t.node] for t in todo):
            return ex.event_loop().run_until_complete(ex.acall_all(todo, False))
        if not todo:
            return []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._max_workers, thread_name_prefix="durkv-graph")
        futures = [self._pool.submit(ex.call, t) for t in todo]
        try:
            # a task no worker has started yet runs in this thread, which would only wait:
            # it may itself be a worker of this pool (a node running a sub-run of this
            # app), and with every worker waiting for queued tasks, none would ever run
            return [ex.call(t) if f.cancel() else f.result() for f, t in zip(futures, todo)]
        except BaseException:   # e.g. a KeyboardInterrupt: the run is released only once
            wait(futures)       # no worker still runs a task of it
            raise

    async def arun(self, input: dict | None = None, *, run_id: str,  # noqa: A002
                   durability: str | None = None, max_supersteps: int | None = None,
                   wait: bool = False) -> GraphResult:
        """Awaitable :meth:`run`: async nodes run on the caller's loop, plain nodes in
        worker threads (a blocking node never stalls the loop), and ``sync`` commits
        wait for their fsync in a worker thread."""
        ex = self._execution(run_id, durability, max_supersteps, wait)
        # a sync commit waits for its fdatasync in a worker thread, not on the loop
        blocking = (durability or self.store.durability) == SYNC
        try:
            await in_thread(ex.start, input)
            while ex.result is None:
                outs = await ex.acall_all(ex.todo(), True)
                if blocking:
                    await in_thread(ex.barrier, outs)
                else:
                    ex.barrier(outs)
        except BaseException as e:
            ex.close(e)
            raise
        ex.close(None)
        return ex.result

    def recover(self, *, durability: str | None = None,
                max_supersteps: int | None = None) -> list[GraphResult]:
        """Resume every unfinished run of this graph in the store -- crashed mid-superstep,
        waiting with a decision now recorded, in doubt with a resolve now recorded,
        sleeping past its wake time -- and return their results (runs still waiting, in
        doubt or sleeping are returned as they are, failed ones are not re-run: resume
        those with ``app.run(None, run_id=...)``; a run whose graph breaks its contract
        -- a GraphError, e.g. a stored value that no longer fits its channel's reducer
        -- is returned ``failed`` and the others go on). A run driven elsewhere in this
        process is skipped, and so are runs of other graph names."""
        out = []
        for tid in self.store.threads():
            head = next(iter(self.store.history(tid, "", limit=1, values=False)), None)
            if (head is None or not isinstance(head.checkpoint, dict)
                    or head.checkpoint.get("graph") != self.name
                    or head.metadata.get("status") == "finished"):
                continue
            ex = self._execution(tid, durability, max_supersteps, False)
            try:
                for _ in self._drive(ex, None, resume_failed=False):
                    pass
            except RunBusyError:
                continue
            except GraphError as e:     # this run's graph broke its contract: the others go on
                out.append(ex.result or ex.fail(e))
                continue
            out.append(ex.result)
        return out

    # -- reading --------------------------------------------------------------------------

    def state(self, run_id: str) -> GraphResult:
        """The run's newest state and status (``running`` = unfinished), read only.

        Raises:
            NotFoundError: no such run.
        """
        _check_run_id("run_id", run_id)
        ck = self.store.get(run_id)
        if ck is None:
            raise NotFoundError(f"run {run_id!r} does not exist", run_id=run_id)
        return self._execution(run_id, None, None, False).inspect(ck)

    def history(self, run_id: str) -> Iterator[Snapshot]:
        """The run's checkpoints, newest first.

        Raises (when iterated, like :meth:`state`):
            NotFoundError: no such run. RunConflictError: the thread is not a run of this
                graph.
        """
        _check_run_id("run_id", run_id)
        found = False
        for ck in self.store.history(run_id, ""):
            if not found:
                self._execution(run_id, None, None, False).check(ck, None)
                found = True
            yield snapshot_of(self.spec, ck)
        if not found:
            raise NotFoundError(f"run {run_id!r} does not exist", run_id=run_id)

    def fork(self, run_id: str, checkpoint_id: str, new_run_id: str) -> Snapshot:
        """Start run ``new_run_id`` from checkpoint ``checkpoint_id`` of ``run_id``: its
        state and next tasks, a journal of its own (its tasks run again, under its own
        idempotency keys). ``app.run(None, run_id=new_run_id)`` runs it.

        Raises:
            NotFoundError: no such checkpoint. RunConflictError: ``new_run_id`` exists.
        """
        _check_run_id("run_id", run_id)
        _check_run_id("new_run_id", new_run_id)
        ck = self.store.get(run_id, "", checkpoint_id)
        if ck is None:
            raise NotFoundError(f"run {run_id!r} has no checkpoint {checkpoint_id!r}; see "
                                "app.history(run_id)", run_id=run_id)
        self._execution(run_id, None, None, False).check(ck, None)
        if self.store.get(new_run_id) is not None or self.store.journal_length(new_run_id):
            raise RunConflictError(f"run {new_run_id!r} already exists; fork into a new run id",
                                   run_id=new_run_id)
        meta = {**ck.metadata, "run_id": new_run_id, "j": 0,
                "forked_from": [run_id, checkpoint_id]}
        self.store.put(new_run_id, "", checkpoint_id, checkpoint=ck.checkpoint, metadata=meta,
                       values=ck.values, versions=ck.versions)
        return snapshot_of(self.spec, self.store.get(new_run_id))

    def close(self) -> None:
        """Stop the worker threads (the app can still run afterwards: they restart)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()

