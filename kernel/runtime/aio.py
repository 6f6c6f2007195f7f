"""The awaitable forms of a run's verbs: ``astep``, ``atool``, ``aapprove``, ``asleep``,
``acompensate``.

Each claims its step id when called (not when awaited), so calls issued together
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
from functools import partial
from itertools import count
from typing import Any, Callable

from .plan import ONCE, Plan, err_type, plain_version
from .tools import Retry, tool_spec

__all__ = ["OWED", "AsyncVerbs", "SCOPED_ID", "scoped_id", "is_async"]

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
        ctx.run(_scope.set, parent.child())
        kw["context"] = ctx
    st = _loops.get(loop)
    prev = st[0] if st is not None else None
    return prev(loop, coro, **kw) if prev is not None else asyncio.Task(coro, loop=loop, **kw)


def is_async(fn: Any) -> bool:
    spec = tool_spec(fn)
    return spec.is_async if spec is not None else inspect.iscoroutinefunction(fn)


class AsyncVerbs:
    """Mixed into :class:`durkv.runtime.Run` (uses its planning and recording methods)."""

    _scope_token: Any = None

    def _deferred(self, fn: Callable, *args: Any) -> tuple[list, Any, BaseException | None]:
        """Call ``fn`` on the loop, its records only queued: (owed LSNs, result, error)."""
        owed: list = []
        token = OWED.set(owed)
        try:
            return owed, fn(*args), None
        except BaseException as e:      # re-raised by _settled once the records are durable
            return owed, None, e
        finally:
            OWED.reset(token)

    async def _settled(self, done: tuple[list, Any, BaseException | None]) -> Any:
        """Wait in a worker thread for the fsyncs ``done``'s records owe; then its outcome."""
        owed, result, exc = done
        if owed:
            await asyncio.to_thread(self.store.wait_journal, max(owed))
        if exc is not None:
            raise exc
        return result

    async def _off_loop(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` with every fdatasync it owes waited for off the event loop."""
        return await self._settled(self._deferred(fn, *args))

    def _scope_tasks(self) -> None:
        """Make this (the run's own) task the root of the run's task tree (``__aenter__``):
        durkv's task factory, chained to the loop's, gives the tasks it creates a path."""
        loop = asyncio.get_running_loop()
        st = _loops.get(loop)
        if st is None:      # else ours is installed (or chained by a factory set since)
            st = _loops[loop] = [loop.get_task_factory(), 0]
            loop.set_task_factory(_task_factory)
        st[1] += 1
        self._scope_token = _scope.set(TaskScope(self, ""))
        self._plain = False

    def _unscope_tasks(self) -> None:
        token, self._scope_token = self._scope_token, None
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

    def astep(self, name: str, fn: Callable, *args: Any, prompt_version: Any = None,
              retry: Retry | None = None, key: str | None = None, secret: bool = False,
              retry_failed: bool = False, **kwargs: Any):
        """Awaitable :meth:`step`; ``fn`` may be a coroutine function."""
        sid = self._sid(key)
        prompt_version = plain_version(prompt_version)      # checked before the call
        inputs, fp = self._inputs("step", name, args, kwargs, secret)
        p = self._plan_step(sid, "step", name, fp, inputs, prompt_version, retry_failed)
        return self._astep(p, fn, args, kwargs, retry)

    async def _astep(self, p: Plan, fn: Callable, args: tuple, kwargs: dict,
                     retry: Retry | None) -> Any:
        if p.replay:
            return self._outcome(p.entry)
        r = retry or ONCE
        tries = list(p.tries)
        for i in count(len(tries)):      # the budget goes on across executions
            try:
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                break
            except Exception as exc:
                tries.append([err_type(exc), str(exc)])
                if not r.retries(exc, i):
                    await self._off_loop(partial(self._record_step, p, exc=exc, tries=tries))
                    raise
                await self._off_loop(self._try, p, tries)
                await _asleep(r.sleep, r.delay(i))
        await self._off_loop(partial(self._record_step, p, result, tries=tries))
        return result

    def atool(self, fn: Callable, *args: Any, retry: Retry | None = None,
              key: str | None = None, secret: bool = False, retry_failed: bool = False,
              **kwargs: Any):
        """Awaitable :meth:`tool`; ``fn`` may be a coroutine function. The intent and
        receipt fsyncs run in a worker thread (concurrent calls share them)."""
        spec = self._spec(fn, kwargs)
        p = self._plan_tool(self._sid(key), spec, args, kwargs, secret,
                            retry_failed=retry_failed)
        return self._atool(p, fn, args, kwargs, retry)

    async def _atool(self, p: Plan, fn: Callable, args: tuple, kwargs: dict,
                     retry: Retry | None) -> Any:
        if p.replay:
            return self._done(p, self._outcome(p.entry))
        r = retry or ONCE
        tries = list(p.tries)
        for i in count(len(tries)):      # the budget goes on across executions
            await self._off_loop(self._intent, p)
            try:
                result = fn(*args, idempotency_key=p.key, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                break
            except Exception as exc:
                tries.append([err_type(exc), str(exc)])
                if not r.retries(exc, i):
                    await self._off_loop(self._receipt, p, None, exc, tries)
                    raise
                await self._off_loop(self._try, p, tries)
                await _asleep(r.sleep, r.delay(i))
                p.rc += 1
        await self._off_loop(self._receipt, p, result, None, tries)
        return self._done(p, result)

    def aapprove(self, action: str, payload: Any = None, *, key: str | None = None):
        """Awaitable :meth:`approve`."""
        sid = self._sid(key)

        async def go() -> Any:      # a durkv.runtime.Decision
            return await self._off_loop(self._approve_at, sid, action, payload)
        return go()

    async def acompensate(self) -> list:
        """Awaitable :meth:`compensate`: sync and async undos, newest first, each awaited."""
        return [await self._atool(p, undo, (result,), {}, None)
                for p, undo, result in self._undos()]

    def asleep(self, seconds: float, *, key: str | None = None):
        """Awaitable :meth:`sleep`."""
        done = self._deferred(self._plan_sleep, seconds, key)   # the id is claimed now
        if done[2] is not None and not done[0]:
            raise done[2]       # bad input: raised when called, as before

        async def go() -> None:
            left, slept = await self._settled(done)
            if slept:
                await _asleep(self._sleep, left)
                await self._off_loop(self._status, "running")
        return go()


async def _asleep(sleep: Callable[[float], Any], seconds: float) -> None:
    if sleep is time.sleep:
        await asyncio.sleep(seconds)
    else:
        r = sleep(seconds)      # an injected (fake) sleep
        if inspect.isawaitable(r):
            await r
