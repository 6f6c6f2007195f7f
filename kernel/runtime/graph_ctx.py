"""A node's ``ctx``: the run journal scoped to one task of one superstep.

Every durable call of a task gets the step id ``f"{superstep}:{node}:{index}:{n}"``
(``n`` counts the task's calls from 0), or ``f"...:{index}:{key}"`` for an explicit
``key=``: the same ids on every re-execution of the task, whatever the durability
mode, whichever worker thread runs it, and whatever the other tasks of the superstep
do. The awaitable verbs claim their id when called, not when awaited, so calls
issued together (``asyncio.gather(ctx.astep(...), ctx.astep(...))``) are numbered in
the order they were issued; sub-coroutines of one node that call ``ctx`` after their
own awaits interleave by timing, so they must name their calls with ``key=``.
"""

from __future__ import annotations

import threading
import time
from itertools import count
from typing import Any, Callable

from ..errors import ConfigError
from .tools import tool, tool_spec

__all__ = ["NodeContext", "SleepPause"]


class SleepPause(BaseException):
    """Raised by a node's durable ``ctx.sleep`` that is not due (the wake time is already
    journaled): the scheduler pauses the run as ``sleeping`` instead of blocking a worker.
    A ``BaseException``, like :class:`durkv.Interrupted`: ``except Exception`` in a node
    cannot swallow the pause."""

    def __init__(self, seconds_left: float) -> None:
        super().__init__(f"durable sleep: {seconds_left:.3f} s left")
        self.left = seconds_left
        # the wake time the journal holds, read now: the superstep pauses once its
        # siblings are done, and ``now + left`` then would push it back by their run time
        # (raised as the run computes ``left``: later only by its status record's write,
        # or an async sleep's fsync wait; never earlier)
        self.until = time.time() + seconds_left


_BINDING = threading.Lock()     # a task's first keyless call binds it to its thread


class NodeContext:
    """``ctx`` of a node: every verb of a :class:`durkv.Run`, with step ids derived from
    (superstep, node, task index, call index). See the module docstring."""

    __slots__ = ("run", "superstep", "node", "index", "_prefix", "_n", "_undo", "_thread")

    def __init__(self, run: Any, superstep: int, node: str, index: int) -> None:
        self.run = run
        self.superstep = superstep
        self.node = node
        self.index = index
        self._prefix: str | None = None     # built at the first durable call
        self._n = count()
        self._undo: list = []
        self._thread: int | None = None     # the thread of the task's keyless calls

    def __repr__(self) -> str:
        return f"<durkv node ctx {self.task_id!r} of run {self.run.run_id!r}>"

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def task_id(self) -> str:
        p = self._prefix
        if p is None:
            p = self._prefix = f"{self.superstep}:{self.node}:{self.index}"
        return p

    def _key(self, key: str | None) -> str:
        if key is None:
            me = threading.get_ident()
            if self._thread != me:
                with _BINDING:      # two threads' first calls at once: one binds
                    if self._thread is None:
                        self._thread = me
                if self._thread != me:
                    raise ConfigError(
                        f"{self!r}: a durable call without key= from a second thread of "
                        "the task: the automatic ids follow the order of the calls, which "
                        "threads do not keep, so a resume could give one call another's "
                        "id. Pass key= (a name unique in the node, e.g. the item the "
                        "thread works on); nothing was called")
            return f"{self.task_id}:{next(self._n)}"     # count() is atomic under the GIL
        if type(key) is not str or not key or key.isdigit():
            raise ConfigError(f"key= must be a non-empty string that is not a number (numbers "
                              f"are the automatic step ids), got {key!r}")
        return f"{self.task_id}:{key}"

    # -- the verbs: each is the run's, under the task's step id ----------------------------

    def step(self, name: str, fn: Callable, *args: Any, key: str | None = None,
             **kwargs: Any) -> Any:
        """:meth:`durkv.Run.step` under this task's step ids."""
        return self.run.step(name, fn, *args, key=self._key(key), **kwargs)

    def astep(self, name: str, fn: Callable, *args: Any, key: str | None = None,
              **kwargs: Any):
        """:meth:`durkv.Run.astep` under this task's step ids."""
        return self.run.astep(name, fn, *args, key=self._key(key), **kwargs)

    def tool(self, fn: Callable, *args: Any, key: str | None = None, **kwargs: Any) -> Any:
        """:meth:`durkv.Run.tool` under this task's step ids (its idempotency key is
        ``f"{run_id}:{step_id}"``)."""
        sid = self._key(key)
        result = self.run.tool(fn, *args, key=sid, **kwargs)
        self._compensable(sid, fn, result)
        return result

    async def _atool(self, sid: str, fn: Callable, call: Any) -> Any:
        result = await call
        self._compensable(sid, fn, result)
        return result

    def atool(self, fn: Callable, *args: Any, key: str | None = None, **kwargs: Any):
        """:meth:`durkv.Run.atool` under this task's step ids."""
        sid = self._key(key)
        return self._atool(sid, fn, self.run.atool(fn, *args, key=sid, **kwargs))

    def approve(self, action: str, payload: Any = None, *, key: str | None = None) -> Any:
        """:meth:`durkv.Run.approve`: the first time, the run pauses (``waiting``) until
        ``store.decide``; then the :class:`durkv.Decision`."""
        return self.run.approve(action, payload, key=self._key(key))

    def aapprove(self, action: str, payload: Any = None, *, key: str | None = None):
        """Awaitable :meth:`approve`."""
        return self.run.aapprove(action, payload, key=self._key(key))

    def sleep(self, seconds: float, *, key: str | None = None) -> None:
        """A durable sleep: the wake time is journaled; if it is not due, the run pauses
        as ``sleeping`` (no worker blocks) and resumes at ``app.run``/``app.recover``
        after it (``app.run(..., wait=True)`` sleeps in-process instead)."""
        self.run.sleep(seconds, key=self._key(key))

    def asleep(self, seconds: float, *, key: str | None = None):
        """Awaitable :meth:`sleep`."""
        return self.run.asleep(seconds, key=self._key(key))

    def now(self, *, key: str | None = None) -> float:
        """The wall clock, recorded."""
        return self.run.now(key=self._key(key))

    def random(self, *, key: str | None = None) -> float:
        """``random.random()``, recorded."""
        return self.run.random(key=self._key(key))

    def uuid(self, *, key: str | None = None) -> Any:
        """A ``uuid4``, recorded."""
        return self.run.uuid(key=self._key(key))

    # -- compensation: the undos of this task's tools --------------------------------------

    def _compensable(self, sid: str, fn: Callable, result: Any) -> None:
        spec = tool_spec(fn)
        if spec is not None and spec.compensate is not None:
            # the result as a replay returns it, never the caller's (mutable) object
            serde = self.run.store.serde
            self._undo.append((sid, spec.compensate, serde.dumps(result)))

    def compensate(self) -> list:
        """Call the undos (``compensate=`` of ``@durkv.tool``) of the tools this task
        called, newest first, each a durable tool call with the step id
        ``f"{step_id}.undo"``. Returns their results."""
        loads = self.run.store.serde.loads
        out = []
        todo, self._undo = self._undo, []
        for sid, undo, recorded in reversed(todo):
            out.append(self.run.tool(_as_tool(undo), loads(recorded), key=f"{sid}.undo"))
        return out


def _as_tool(undo: Callable) -> Callable:
    """An undo as ``run.tool`` takes it: a ``@durkv.tool`` as is, a plain
    ``undo(result, *, idempotency_key)`` behind a tool of its name (never modified)."""
    if tool_spec(undo) is not None:
        return undo

    def call(result: Any, *, idempotency_key: str) -> Any:
        return undo(result, idempotency_key=idempotency_key)
    return tool(call, name=getattr(undo, "__qualname__", repr(undo)))
