"""Durable steps and tools inside LangGraph nodes: ``durkv.langgraph.step`` / ``tool``.

In a node of a graph compiled with :class:`durkv.langgraph.DurkvSaver`, the
store is found through the node's config (its checkpointer), the run id is the
thread id, and the step id is LangGraph's task id plus the call's index within
this execution of the task. LangGraph derives task ids deterministically from
the checkpoint, node and path, so a node that LangGraph re-runs after a crash
(or after an ``interrupt()``) meets the same step ids and gets the recorded
results back: a tool whose receipt was written before the crash is not called
again.

>>> from durkv.langgraph import tool            # doctest: +SKIP
>>> def node(state):                             # doctest: +SKIP
...     receipt = tool(send_email, to=state["to"], body=state["draft"])
...     return {"sent": receipt}

A task id names the checkpoint the task runs on, and under ``durability="async"``
LangGraph saves that checkpoint in the background while the task already runs. Were
the process killed before the save, the re-run would start from an older checkpoint
under new task ids, and meet none of the recorded steps: a tool would run again. So
each call in a node of the root graph first waits for the task's checkpoint to be
committed (at once under ``sync``). Under ``exit`` checkpoints are saved only when the
graph stops, and inside subgraphs nothing is waited for: see GUARANTEES.md.

Approvals stay LangGraph's ``interrupt()``; the tool after it is what must happen
once.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable

from langgraph.config import get_config

from ..errors import BackendError, ConfigError
from .run import Run
from .tools import Retry

__all__ = ["step", "tool", "astep", "atool"]

_CHECKPOINTER = "__pregel_checkpointer"     # LangGraph's CONFIG_KEY_* (stable since 0.2)
_TASK_ID = "__pregel_task_id"
_RUNTIME = "__pregel_runtime"
_SCRATCHPAD = "__pregel_scratchpad"
_CHECKPOINT_MAP = "checkpoint_map"          # {parent ns: the checkpoint its tasks run on}
_DURABILITY = "__pregel_durability"
_WAIT_S = 60.0

_lock = threading.Lock()
_runs: "weakref.WeakKeyDictionary[Any, dict[str, Run]]" = weakref.WeakKeyDictionary()
# task id -> (the attempt's marker object, calls so far); a retry of the node by
# LangGraph is a new attempt (a new Runtime object) and counts from 0 again
_calls: "OrderedDict[str, tuple[Any, int]]" = OrderedDict()
_MAX_TASKS = 4096


def _task_checkpoint(conf: dict) -> tuple[Any, str, str, str] | None:
    """(saver, thread, ns, checkpoint id) of the checkpoint a task of the root graph runs
    on, which the journal waits for (None: nothing to wait for). A subgraph's tasks do not
    wait: whether and under which namespace a subgraph saves its checkpoints depends on
    how it was compiled (``checkpointer=False`` saves none), so one may never appear."""
    saver = conf.get(_CHECKPOINTER)
    cmap = conf.get(_CHECKPOINT_MAP)
    if (not cmap or len(cmap) != 1 or conf.get(_DURABILITY) == "exit"
            or not hasattr(saver, "wait_for_checkpoint")):
        return None
    cid = cmap.get("")
    return None if cid is None else (saver, conf["thread_id"], "", cid)


def _not_saved(thread_id: str, ns: str, cid: str) -> BackendError:
    return BackendError(
        f"the checkpoint {cid!r} (thread {thread_id!r}, ns {ns!r}) that this task runs on "
        f"was not committed within {_WAIT_S:.0f} s; durkv journals no step before it (after "
        "a crash the task would re-run under another id and miss its records): check why "
        "the checkpointer's put does not finish", thread_id=thread_id, checkpoint_id=cid)


def _wait_checkpoint(pending: tuple | None) -> None:
    if pending is not None and not pending[0].wait_for_checkpoint(*pending[1:], _WAIT_S):
        raise _not_saved(*pending[1:])


async def _after_checkpoint(pending: tuple | None, awaitable: Any) -> Any:
    if pending is not None and not await pending[0].await_checkpoint(*pending[1:], _WAIT_S):
        awaitable.close()
        raise _not_saved(*pending[1:])
    return await awaitable


def _where(config: dict | None, key: str | None) -> tuple[Run, str, tuple | None]:
    if config is None:
        try:
            config = get_config()
        except RuntimeError as e:
            raise ConfigError("durkv.langgraph.step/tool must run inside a LangGraph node "
                              "(or get the node's config as config=)") from e
    conf = config.get("configurable") or {}
    store = getattr(conf.get(_CHECKPOINTER), "store", None)
    if store is None or not hasattr(store, "append_journal"):
        raise ConfigError("durkv.langgraph.step/tool need a graph compiled with a DurkvSaver "
                          "(graph.compile(checkpointer=DurkvSaver.open(url)))")
    thread_id, task_id = conf.get("thread_id"), conf.get(_TASK_ID)
    if not thread_id or not task_id:
        raise ConfigError("durkv.langgraph.step/tool need a thread_id in the config "
                          "(config={'configurable': {'thread_id': ...}}) and a LangGraph task")
    marker = conf.get(_RUNTIME) or conf.get(_SCRATCHPAD)
    with _lock:
        runs = _runs.setdefault(store, {})
        run = runs.get(thread_id)
        if run is None:
            run = runs[thread_id] = Run(store, str(thread_id)).attach()
        if key is None:
            seen = _calls.get(task_id)
            n = seen[1] if seen is not None and seen[0] is marker else 0
            _calls[task_id] = (marker, n + 1)
            _calls.move_to_end(task_id)
            if len(_calls) > _MAX_TASKS:
                _calls.popitem(last=False)
            sid = f"{task_id}:{n}"
        else:
            sid = f"{task_id}:{key}"
    run.refresh()
    return run, sid, _task_checkpoint(conf)


def step(name: str, fn: Callable, *args: Any, config: dict | None = None,
         prompt_version: Any = None, retry: Retry | None = None, key: str | None = None,
         secret: bool = False, **kwargs: Any) -> Any:
    """:meth:`durkv.Run.step` inside a LangGraph node (see the module docstring)."""
    run, sid, pending = _where(config, key)
    _wait_checkpoint(pending)
    return run.step(name, fn, *args, prompt_version=prompt_version, retry=retry, key=sid,
                    secret=secret, **kwargs)


def tool(fn: Callable, *args: Any, config: dict | None = None, retry: Retry | None = None,
         key: str | None = None, secret: bool = False, **kwargs: Any) -> Any:
    """:meth:`durkv.Run.tool` inside a LangGraph node: the ``@durkv.tool`` gets
    ``idempotency_key = f"{thread_id}:{task_id}:{index}"``."""
    run, sid, pending = _where(config, key)
    _wait_checkpoint(pending)
    return run.tool(fn, *args, retry=retry, key=sid, secret=secret, **kwargs)


def astep(name: str, fn: Callable, *args: Any, config: dict | None = None,
          prompt_version: Any = None, retry: Retry | None = None, key: str | None = None,
          secret: bool = False, **kwargs: Any):
    """Awaitable :func:`step` for async nodes (ids claimed in the order of the calls)."""
    run, sid, pending = _where(config, key)
    return _after_checkpoint(pending, run.astep(
        name, fn, *args, prompt_version=prompt_version, retry=retry, key=sid, secret=secret,
        **kwargs))


def atool(fn: Callable, *args: Any, config: dict | None = None, retry: Retry | None = None,
          key: str | None = None, secret: bool = False, **kwargs: Any):
    """Awaitable :func:`tool` for async nodes (ids claimed in the order of the calls)."""
    run, sid, pending = _where(config, key)
    return _after_checkpoint(pending, run.atool(fn, *args, retry=retry, key=sid, secret=secret,
                                                **kwargs))
