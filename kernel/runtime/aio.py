"""How a run's awaitable verbs (``astep``, ``atool``, ``aapprove``, ``asleep``,
``acompensate``, in :mod:`durkv.runtime.run`) wait: off the event loop, and per task.

Each verb claims its step id when called (not when awaited), so calls issued together
(``asyncio.gather``) get ids in the order they were issued. Tools' intent and
receipt fsyncs run in a worker thread (concurrent calls share them: group commit), as
does every other fdatasync an async verb waits for (``durability="sync"``): its records
are queued on the loop (log order as called) and the wait runs in a worker thread.

Step ids per asyncio task: inside ``async with store.arun(...)`` every task created
(directly or not) by the run's own task gets a *path*, its parent's path and its index
among the tasks its parent created (``"2"``, ``"2.0"``), assigned at creation by a task
factory; a call without ``key=`` in such a task gets the id ``"<path>/<n>"`` (its n-th
call). Creation order within one task is that task's own code, so the ids do not depend
on the order in which awaits complete: ``asyncio.gather`` of per-item pipelines replays.
Calls in the run's own task keep the ids ``"0"``, ``"1"``...; runs created before
(no ``tid`` in their RUN record) keep one counter for every task.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import re
import time
import weakref
from itertools import count
from typing import Any, Callable

from .plan import CALL, IN_CALL, SLEEP, outcome

__all__ = ["OWED", "SCOPED_ID", "scoped_id", "deferred", "raise_now", "settled", "off_loop", "adrive",
           "asleep_with", "scope_tasks", "unscope_tasks"]

SCOPED_ID = re.compile(r"[0-9]+(\.[0-9]+)*/[0-9]+")    # the ids of calls in tasks

# the task scope of the running asyncio task (None: not inside a run's task tree)
_scope: contextvars.ContextVar["TaskScope | None"] = contextvars.ContextVar(
    "durkv_task_scope", default=None)
# the LSNs an async verb's records owe an fdatasync (None: a sync verb waits itself)
OWED: contextvars.ContextVar["list[int] | None"] = contextvars.ContextVar(
    "durkv_owed_fsyncs", default=None)
# per event loop: [the task factory durkv's replaced, how many runs use durkv's]
_loops: "weakref.WeakKeyDictionary[Any, list]" = weakref.WeakKeyDictionary()


class TaskScope:
    """Where an asyncio task stands in a run's task tree, and its counters."""

    __slots__ = ("run", "path", "steps", "children")

    def __init__(self, run: Any, path: str) -> None:
        self.run, self.path = run, path
        self.steps = count()
        self.children = count()

    def child(self) -> "TaskScope":
        i = next(self.children)
        return TaskScope(self.run, f"{self.path}.{i}" if self.path else str(i))


def scoped_id(run: Any) -> str | None:
    """The next automatic step id of the running task in ``run`` (None: the run's own
    task, or a thread or task outside the run's tree: the run's one counter)."""
    sc = _scope.get()
    if sc is None or sc.run is not run or not sc.path:
        return None
    return f"{sc.path}/{next(sc.steps)}"


def _task_factory(loop: Any, coro: Any, **kw: Any) -> Any:
    parent = _scope.get()      # the creating task's scope (the factory runs in its context)
    if parent is not None and kw.get("context") is None:
        ctx = contextvars.copy_context()
        # a task a durable call's function starts (its own gather, a wait_for) takes no
        # place in the tree: a replay does not run that function, and the tasks gathered
        # after the call must get the paths they got live. It needs none: a durable call
        # of the run made from it is refused (plan.not_nested)
        ctx.run(_scope.set, None if _inside_call_of(parent.run) else parent.child())
        kw["context"] = ctx
    st = _loops.get(loop)
    prev = st[0] if st is not None else None
    return prev(loop, coro, **kw) if prev is not None else asyncio.Task(coro, loop=loop, **kw)


def _inside_call_of(run: Any) -> bool:
    """Whether this context runs inside the function of one of ``run``'s durable calls."""
    cell = IN_CALL.get()
    while cell is not None:
        if cell[0] is run:
            return True
        cell = cell[1]
    return False


Deferred = tuple  # (owed LSNs, result, error) of a call whose records are only queued


def deferred(fn: Callable, *args: Any) -> Deferred:
    """Call ``fn`` on the loop, its records only queued: (owed LSNs, result, error). The
    verbs plan this way when called, so that a step id is claimed in the order of issue."""
    owed: list = []
    token = OWED.set(owed)
    try:
        return owed, fn(*args), None
    except BaseException as e:      # re-raised by settled() once the records are durable
        return owed, None, e
    finally:
        OWED.reset(token)


def raise_now(done: Deferred) -> Deferred:
    """``done`` itself, or its error raised at once when it owes nothing (bad input is
    refused when the verb is called, not when it is awaited)."""
    if done[2] is not None and not done[0]:
        raise done[2]
    return done


async def settled(store: Any, done: Deferred) -> Any:
    """Wait in a worker thread for the fsyncs ``done``'s records owe; then its outcome."""
    owed, result, exc = done
    if owed:
        await asyncio.to_thread(store.wait_journal, max(owed))
    if exc is not None:
        raise exc
    return result


async def off_loop(store: Any, fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` with every fdatasync it owes waited for off the event loop."""
    return await settled(store, deferred(fn, *args))


async def adrive(run: Any, attempts: Any, fn: Callable, args: tuple, kwargs: dict) -> Any:
    """Drive a call's attempts (``Run.attempts``) from a coroutine: ``fn`` may return an
    awaitable; each record's fsync is waited for in a worker thread, each sleep on the
    loop. :func:`durkv.runtime.plan.drive` is the sync form."""
    sent: Any = None
    while True:
        try:
            effect = attempts.send(sent)
        except StopIteration as stop:
            return outcome(stop.value)
        sent = None
        if effect is CALL:     # plan.call_in, awaiting what fn returns
            cell = [run, IN_CALL.get()]
            token = IN_CALL.set(cell)
            try:
                r = fn(*args, **kwargs)
                sent = True, (await r if inspect.isawaitable(r) else r)
            except Exception as e:
                sent = False, e
            finally:
                IN_CALL.reset(token)
            if len(cell) > 2:
                raise cell[2]
        elif effect[0] is SLEEP:
            await asleep_with(effect[1], *effect[2])
        else:
            done = deferred(effect[1], *effect[2])
            try:
                await settled(run.store, done)
            except asyncio.CancelledError as e:
                if done[2] is None:
                    # the record is made and the task was cancelled while its fsync was
                    # waited for: the attempts may have to record what that means (an
                    # intent whose call never began); they raise it again
                    attempts.throw(e)
                raise


def scope_tasks(run: Any) -> Any:
    """Make the running task the root of ``run``'s task tree (its ``__aenter__``): durkv's
    task factory, chained to the loop's, gives the tasks it creates a path. Returns the
    token for :func:`unscope_tasks`."""
    loop = asyncio.get_running_loop()
    st = _loops.get(loop)
    if st is None:      # else ours is installed (or chained by a factory set since)
        st = _loops[loop] = [loop.get_task_factory(), 0]
        loop.set_task_factory(_task_factory)
    st[1] += 1
    return _scope.set(TaskScope(run, ""))


def unscope_tasks(token: Any) -> None:
    if token is None:
        return
    try:
        _scope.reset(token)
    except ValueError:          # exited in another context than entered
        _scope.set(None)
    loop = asyncio.get_running_loop()
    st = _loops.get(loop)
    if st is not None:
        st[1] -= 1
        if st[1] <= 0 and loop.get_task_factory() is _task_factory:
            loop.set_task_factory(st[0])      # the loop's own factory again
            del _loops[loop]


async def asleep_with(sleep: Callable[[float], Any], seconds: float) -> None:
    """Sleep ``seconds`` on the loop (``time.sleep``), or with an injected (fake) sleep."""
    if sleep is time.sleep:
        await asyncio.sleep(seconds)
    else:
        r = sleep(seconds)
        if inspect.isawaitable(r):
            await r
