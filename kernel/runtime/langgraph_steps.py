"""Durable steps and tools inside LangGraph nodes: ``durkv.langgraph.step`` / ``tool``.

In a node of a graph compiled with :class:`durkv.langgraph.DurkvSaver`, the
store is found through the node's config (its checkpointer), the run id is the
thread id, and the step id is LangGraph's task id plus the call's index within
this attempt of the task. LangGraph derives task ids deterministically from
the checkpoint, node and path, so a node that LangGraph re-runs after a crash
(or after an ``interrupt()``) meets the same step ids and gets the recorded
results back: a tool whose receipt was written before the crash is not called
again.

Each attempt of a task -- a RetryPolicy retry, or a new execution (a re-invoke after a
failure, a resume after a crash or an interrupt) -- counts its calls from 0 again: a
recorded result is returned, a recorded *failure* is called again, with the same
idempotency key (it is the same logical call; LangGraph decides whether to retry).
Inside a tool run by the prebuilt ``ToolNode`` (which runs a message's tool calls in
threads), the index counts within the tool call, and the id names it:
``{task_id}:{tool_call_id}:{index}``. Anywhere else, calls without ``key=`` from two
threads of one task are refused before the second is made (ConfigError).

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
import os
import weakref
from collections import OrderedDict
from contextvars import ContextVar
from typing import Any, Callable

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers.context import register_configure_hook
from langgraph.config import get_config

from ..errors import BackendError, ConfigError
from ..store.records import check_id
from .run import SAME_KEY, SYNCED_TOOLS, Run
from .tools import Retry

__all__ = ["step", "tool", "astep", "atool", "thread_key", "forget_thread",
           "CONFIG_KEY_DURABILITY"]

_CHECKPOINTER = "__pregel_checkpointer"     # LangGraph's CONFIG_KEY_* (stable since 0.2)
_TASK_ID = "__pregel_task_id"
_RUNTIME = "__pregel_runtime"
_SEND = "__pregel_send"                     # the task's ``writes.extend``
_CHECKPOINT_MAP = "checkpoint_map"          # {parent ns: the checkpoint its tasks run on}
# the configurable key LangGraph's pregel loop carries its durability mode in (defined here
# once; durkv.langgraph imports it)
CONFIG_KEY_DURABILITY = "__pregel_durability"
_WAIT_S = 60.0
_KEEP_RUNS = 64          # idle threads whose Run stays cached (a Run is rebuilt from the store)

_lock = threading.Lock()


def _locks_after_fork() -> None:
    # a forked child has only the forking thread: a lock another thread held at the fork
    # would never be released, and its first step would hang for ever
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_locks_after_fork)


def thread_key(thread_id: Any) -> str:
    """A LangGraph thread id as durkv's thread and run id: a str as is, any other value
    (an int) as ``str()``, as DurkvSaver stores it; None, "" or text that is not valid
    Unicode (a lone surrogate) is a ConfigError."""
    if thread_id is None or thread_id == "":
        raise ConfigError("checkpointer needs configurable.thread_id; "
                          "pass config={'configurable': {'thread_id': ...}}")
    key = thread_id if type(thread_id) is str else str(thread_id)
    check_id("thread_id", key)      # before it names a claim file or a record
    return key


# ---- the Run of each thread -------------------------------------------------------------
#
# A Run holds a thread's folded journal. The tasks that use it hold it (their _Task, below);
# the cache holds it weakly, plus the last _KEEP_RUNS threads used, so that the next
# superstep does not fold the journal again; DurkvSaver.delete_thread drops it. Dropping a
# Run loses nothing: it is rebuilt from the store.

class _Runs:
    __slots__ = ("live", "recent")

    def __init__(self) -> None:
        self.live: "weakref.WeakValueDictionary[str, Run]" = weakref.WeakValueDictionary()
        self.recent: "OrderedDict[str, Run]" = OrderedDict()


# keyed by the saver (not the store, which every Run references: that would keep it alive)
_runs: "weakref.WeakKeyDictionary[Any, _Runs]" = weakref.WeakKeyDictionary()


def _run_of(saver: Any, thread_id: str) -> Run:
    runs = _runs.get(saver)
    if runs is None:
        runs = _runs[saver] = _Runs()
    run = runs.live.get(thread_id)
    if run is None:
        run = runs.live[thread_id] = Run(saver.store, thread_id).attach()
    runs.recent[thread_id] = run
    runs.recent.move_to_end(thread_id)
    if len(runs.recent) > _KEEP_RUNS:
        runs.recent.popitem(last=False)
    return run


def forget_thread(saver: Any, thread_id: Any) -> None:
    """Drop the cached Run of a thread (DurkvSaver.delete_thread calls this)."""
    with _lock:
        runs = _runs.get(saver)
        if runs is not None:
            runs.recent.pop(str(thread_id), None)
            runs.live.pop(str(thread_id), None)


# ---- the tool call a LangChain tool runs for ---------------------------------------------
#
# The prebuilt ToolNode runs the tool calls of one message in threads (or as gathered
# coroutines): the order in which their bodies reach durkv is not deterministic, their ids
# must come from the tool call. LangChain hands the call's id only to callbacks
# (on_tool_start(tool_call_id=...)); this handler, added to every callback manager through
# LangChain's configure hook, notes it under the tool run's id, which the tool body finds as
# the parent run of its config's callbacks.

class _ToolCalls(BaseCallbackHandler):
    run_inline = True      # called in the tool's own thread, before its body runs
    ignore_llm = ignore_chain = ignore_retriever = ignore_chat_model = True
    ignore_retry = ignore_custom_event = True     # (tool events come under ignore_agent)

    def __init__(self) -> None:
        self.ids: dict[Any, str] = {}

    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: Any,
                      **kwargs: Any) -> None:
        call_id = kwargs.get("tool_call_id")
        if call_id:
            self.ids[run_id] = str(call_id)

    def on_tool_end(self, output: Any, *, run_id: Any, **kwargs: Any) -> None:
        self.ids.pop(run_id, None)

    def on_tool_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
        self.ids.pop(run_id, None)


_tool_calls = _ToolCalls()
register_configure_hook(ContextVar("durkv_tool_calls", default=_tool_calls), inheritable=True)


def _tool_call_id(config: dict) -> str | None:
    return _tool_calls.ids.get(getattr(config.get("callbacks"), "parent_run_id", None))


# ---- the calls of one task attempt --------------------------------------------------------

class _Task:
    """The automatic call ids of one LangGraph task, kept as long as the task itself: per
    attempt (a RetryPolicy retry is attempt 2, 3, ...: ids count from 0 again), per scope
    (the node's body, or one tool call of a ToolNode): [next index, claiming thread]."""

    __slots__ = ("run", "attempt", "scopes", "ref")

    def __init__(self, run: Run) -> None:
        self.run = run
        self.attempt: Any = None
        self.scopes: dict[str | None, list] = {}
        self.ref: Any = None

    def claim(self, attempt: Any, scope: str | None) -> int:
        if attempt != self.attempt:
            self.attempt, self.scopes = attempt, {}
        me = threading.get_ident()
        slot = self.scopes.get(scope)
        if slot is None:
            self.scopes[scope] = [1, me]
            return 0
        if slot[1] != me:
            where = "" if scope is None else (
                f" (the scope is ToolNode tool call {scope!r}: if the model gave several "
                "tool calls that same id -- some providers repeat or leave out ids -- "
                "durkv cannot tell them apart; give each call a unique id, or pass key=)")
            raise ConfigError(
                "durkv.langgraph.step/tool without key= called from two threads of one "
                "LangGraph task: the automatic ids follow the order of the calls, which "
                "threads do not keep, so a re-run could give one call another's id. Pass "
                "key= (a name unique in the node, e.g. the item the thread works on)"
                f"{where}; nothing was called")
        slot[0] += 1
        return slot[0] - 1


# id(the task's writes buffer) -> its _Task. LangGraph gives each task one buffer (a deque,
# whose extend is the task's CONFIG_KEY_SEND) for its lifetime (a retry clears it); the
# entry goes when the buffer does (a weak reference's callback): no bound, no eviction.
_tasks: dict[int, _Task] = {}


def _task_of(buf: Any) -> _Task | None:
    t = _tasks.get(id(buf))
    return t if t is not None and t.ref() is buf else None


def _drop(key: int, ref: Any) -> None:
    t = _tasks.get(key)
    if t is not None and t.ref is ref:
        del _tasks[key]


def _attempt(conf: dict) -> Any:
    """LangGraph's attempt number of the task (1, then 2, 3, ... under a RetryPolicy)."""
    info = getattr(conf.get(_RUNTIME), "execution_info", None)
    return getattr(info, "node_attempt", 1)


# ---- where a call is journaled ------------------------------------------------------------

def _task_checkpoint(conf: dict, thread_id: str) -> tuple[Any, str, str, str] | None:
    """(saver, thread, ns, checkpoint id) of the checkpoint a task of the root graph runs
    on, which the journal waits for (None: nothing to wait for). A subgraph's tasks do not
    wait: whether and under which namespace a subgraph saves its checkpoints depends on
    how it was compiled (``checkpointer=False`` saves none), so one may never appear."""
    saver = conf.get(_CHECKPOINTER)
    cmap = conf.get(_CHECKPOINT_MAP)
    if (not cmap or len(cmap) != 1 or conf.get(CONFIG_KEY_DURABILITY) == "exit"
            or not hasattr(saver, "wait_for_checkpoint")):
        return None
    cid = cmap.get("")
    return None if cid is None else (saver, thread_id, "", cid)


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


def _node_config(config: dict | None) -> tuple[dict, dict, Any, str]:
    """(config, its configurable, the saver, the thread id) of the calling LangGraph task."""
    if config is None:
        try:
            config = get_config()
        except RuntimeError as e:
            raise ConfigError("durkv.langgraph.step/tool must run inside a LangGraph node "
                              "(or get the node's config as config=)") from e
    conf = config.get("configurable") or {}
    saver = conf.get(_CHECKPOINTER)
    store = getattr(saver, "store", None)
    if store is None or not hasattr(store, "append_journal"):
        raise ConfigError("durkv.langgraph.step/tool need a graph compiled with a DurkvSaver "
                          "(graph.compile(checkpointer=DurkvSaver.open(url)))")
    if not conf.get(_TASK_ID) or conf.get("thread_id") in (None, ""):
        raise ConfigError("durkv.langgraph.step/tool need a thread_id in the config "
                          "(config={'configurable': {'thread_id': ...}}) and a LangGraph task")
    return config, conf, saver, thread_key(conf["thread_id"])


def _task(conf: dict, saver: Any, thread_id: str, keyed: bool) -> _Task:
    buf = getattr(conf.get(_SEND), "__self__", None)     # the task's writes buffer
    t = _task_of(buf) if buf is not None else None
    if t is not None:
        return t
    t = _Task(_run_of(saver, thread_id))
    try:
        t.ref = weakref.ref(buf, lambda ref, key=id(buf): _drop(key, ref))
    except TypeError:            # no buffer (a config put together by hand): no count
        if not keyed:
            raise ConfigError("durkv.langgraph.step/tool found no LangGraph task to number "
                              "its calls in (a config without the task's writes); pass "
                              "key= (a name unique in the node); nothing was called") from None
        return t
    _tasks[id(buf)] = t
    return t


def _checkpoints_synced(saver: Any, conf: dict) -> bool:
    """Whether the saver fdatasyncs this invocation's checkpoints (its policy is ``sync``:
    pinned, or following LangGraph's ``durability="sync"``): then a tool's intent and
    receipt are fdatasync'd too, whatever the store's policy (docs/GUARANTEES.md 16.9)."""
    return (getattr(saver, "durability", None) or conf.get(CONFIG_KEY_DURABILITY)) == "sync"


def _check_key(key: Any, config: dict) -> None:
    """Refuse a ``key=`` that is (or may be) an automatic id of this task: ``N`` for the
    node's N-th keyless call, ``<tool call id>:N`` inside a ToolNode's tool. Such a key
    would name another call, whose recorded result it would then silently take."""
    if type(key) is not str or not key or key.isdigit():
        raise ConfigError(f"key= must be a non-empty string that is not a number (numbers "
                          f"are the automatic ids of a node's keyless calls), got {key!r}")
    call_id = _tool_call_id(config)
    if call_id is not None and key.startswith(f"{call_id}:") and key[len(call_id) + 1:].isdigit():
        raise ConfigError(f"key= {key!r} is the automatic id of a keyless call of tool call "
                          f"{call_id!r}; pass another key")


def _where(config: dict | None, key: str | None) -> tuple[Run, str, tuple | None, bool]:
    config, conf, saver, thread_id = _node_config(config)
    task_id = conf[_TASK_ID]
    with _lock:
        t = _task(conf, saver, thread_id, key is not None)
        if key is not None:
            _check_key(key, config)
            sid = f"{task_id}:{key}"
        else:
            call_id = _tool_call_id(config)
            n = t.claim(_attempt(conf), call_id)
            sid = f"{task_id}:{n}" if call_id is None else f"{task_id}:{call_id}:{n}"
    t.run.refresh()
    return t.run, sid, _task_checkpoint(conf, thread_id), _checkpoints_synced(saver, conf)


def _synced(synced: bool, verb: Callable, *args: Any, **kwargs: Any) -> Any:
    """``verb(...)`` (``run.tool``, or ``run.atool``, which plans when called) with its
    tool's records fdatasync'd if ``synced``."""
    token = SYNCED_TOOLS.set(synced)
    try:
        return verb(*args, **kwargs)
    finally:
        SYNCED_TOOLS.reset(token)


def step(name: str, fn: Callable, *args: Any, config: dict | None = None,
         prompt_version: Any = None, retry: Retry | None = None, key: str | None = None,
         secret: bool = False, **kwargs: Any) -> Any:
    """:meth:`durkv.Run.step` inside a LangGraph node (see the module docstring)."""
    run, sid, pending, _ = _where(config, key)
    _wait_checkpoint(pending)
    return run.step(name, fn, *args, prompt_version=prompt_version, retry=retry, key=sid,
                    secret=secret, retry_failed=True, **kwargs)


def tool(fn: Callable, *args: Any, config: dict | None = None, retry: Retry | None = None,
         key: str | None = None, secret: bool = False, **kwargs: Any) -> Any:
    """:meth:`durkv.Run.tool` inside a LangGraph node: the ``@durkv.tool`` gets
    ``idempotency_key = f"{thread_id}:{task_id}:{index}"`` (in a tool run by a ToolNode:
    ``f"{thread_id}:{task_id}:{tool_call_id}:{index}"``; with ``key=``:
    ``f"{thread_id}:{task_id}:{key}"``)."""
    run, sid, pending, synced = _where(config, key)
    _wait_checkpoint(pending)
    return _synced(synced, run.tool, fn, *args, retry=retry, key=sid, secret=secret,
                   retry_failed=SAME_KEY, **kwargs)


def astep(name: str, fn: Callable, *args: Any, config: dict | None = None,
          prompt_version: Any = None, retry: Retry | None = None, key: str | None = None,
          secret: bool = False, **kwargs: Any):
    """Awaitable :func:`step` for async nodes (ids claimed in the order of the calls)."""
    run, sid, pending, _ = _where(config, key)
    return _after_checkpoint(pending, run.astep(
        name, fn, *args, prompt_version=prompt_version, retry=retry, key=sid, secret=secret,
        retry_failed=True, **kwargs))


def atool(fn: Callable, *args: Any, config: dict | None = None, retry: Retry | None = None,
          key: str | None = None, secret: bool = False, **kwargs: Any):
    """Awaitable :func:`tool` for async nodes (ids claimed in the order of the calls)."""
    run, sid, pending, synced = _where(config, key)
    return _after_checkpoint(pending, _synced(synced, run.atool, fn, *args, retry=retry,
                                              key=sid, secret=secret, retry_failed=SAME_KEY,
                                              **kwargs))
