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

Approvals stay LangGraph's ``interrupt()``; the tool after it is what must happen
once.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable

from langgraph.config import get_config

from ..errors import ConfigError
from .run import Run
from .tools import Retry

__all__ = ["step", "tool", "astep", "atool"]

_CHECKPOINTER = "__pregel_checkpointer"     # LangGraph's CONFIG_KEY_* (stable since 0.2)
_TASK_ID = "__pregel_task_id"
_RUNTIME = "__pregel_runtime"
_SCRATCHPAD = "__pregel_scratchpad"

_lock = threading.Lock()
_runs: "weakref.WeakKeyDictionary[Any, dict[str, Run]]" = weakref.WeakKeyDictionary()
# task id -> (the attempt's marker object, calls so far); a retry of the node by
# LangGraph is a new attempt (a new Runtime object) and counts from 0 again
_calls: "OrderedDict[str, tuple[Any, int]]" = OrderedDict()
_MAX_TASKS = 4096


def _where(config: dict | None, key: str | None) -> tuple[Run, str]:
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
    return run, sid


def step(name: str, fn: Callable, *args: Any, config: dict | None = None,
         prompt_version: Any = None, retry: Retry | None = None, key: str | None = None,
         secret: bool = False, **kwargs: Any) -> Any:
    """:meth:`durkv.Run.step` inside a LangGraph node (see the module docstring)."""
    run, sid = _where(config, key)
    return run.step(name, fn, *args, prompt_version=prompt_version, retry=retry, key=sid,
                    secret=secret, **kwargs)


def tool(fn: Callable, *args: Any, config: dict | None = None, retry: Retry | None = None,
         key: str | None = None, secret: bool = False, **kwargs: Any) -> Any:
    """:meth:`durkv.Run.tool` inside a LangGraph node: the ``@durkv.tool`` gets
    ``idempotency_key = f"{thread_id}:{task_id}:{index}"``."""
    run, sid = _where(config, key)
    return run.tool(fn, *args, retry=retry, key=sid, secret=secret, **kwargs)


def astep(name: str, fn: Callable, *args: Any, config: dict | None = None,
          prompt_version: Any = None, retry: Retry | None = None, key: str | None = None,
          secret: bool = False, **kwargs: Any):
    """Awaitable :func:`step` for async nodes (ids claimed in the order of the calls)."""
    run, sid = _where(config, key)
    return run.astep(name, fn, *args, prompt_version=prompt_version, retry=retry, key=sid,
                     secret=secret, **kwargs)


def atool(fn: Callable, *args: Any, config: dict | None = None, retry: Retry | None = None,
          key: str | None = None, secret: bool = False, **kwargs: Any):
    """Awaitable :func:`tool` for async nodes (ids claimed in the order of the calls)."""
    run, sid = _where(config, key)
    return run.atool(fn, *args, retry=retry, key=sid, secret=secret, **kwargs)
