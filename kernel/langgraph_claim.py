"""One driver per LangGraph thread (issue 17): the claim of one invocation.

LangGraph gives a checkpointer no call that opens or closes an invocation, so durkv
takes the bracket from the pregel loop itself. The loop of a root graph reads its
thread's newest checkpoint first thing in its ``__enter__``/``__aenter__``; that read
(``DurkvSaver.get_tuple``) claims the thread with :func:`claim_for_loop` -- a
:mod:`durkv.store.drivers` claim: RunBusyError naming the holder's pid if another
invocation, in this process or another, drives the thread. Three things release the
claim, whichever comes first (releasing twice is a no-op):

1. **The loop's exit stack.** The claim is the first thing on it, so it is the last
   thing undone: after the ``durability="exit"`` save and the background executor's
   drain. This is how every invocation whose ``__enter__`` returned ends: a result, an
   exception in a node, an interrupt, the ``GeneratorExit`` of an abandoned
   ``graph.stream``, the ``CancelledError`` of a cancelled ``ainvoke`` task.
2. **The root run's end callback.** ``Pregel.stream``/``astream`` run the loop, its
   ``__enter__`` included, inside a ``try`` whose every exit reports the run's
   ``on_chain_end`` or ``on_chain_error`` (``astream`` shields it from cancellation).
   A loop that fails inside ``__enter__`` never unwinds its stack; this callback
   releases its claim before the exception reaches the caller, so the next invocation
   in the same process is never refused by a dead one.
3. **The loop's collection** (``weakref.finalize``): a net under both, for a path of a
   future LangGraph that neither sees.

A process that dies holds nothing: the kernel drops its flock.

Subgraphs (a loop with a checkpoint namespace, or nested in a task) claim nothing: they
run under their root's claim. Calls from outside a loop (``get_state``,
``update_state``, the saver's own methods) claim nothing either.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler

try:  # the pregel loop whose __enter__ reads the thread (langgraph >= 0.3)
    from langgraph.pregel._loop import PregelLoop
except ImportError:  # pragma: no cover - another layout: no claims (GUARANTEES 18)
    PregelLoop = None

__all__ = ["claim_for_loop"]

# get_tuple <- (aget_tuple, a subclass's override, checkpoint_superseded) <- __enter__
_MAX_DEPTH = 4
_ENTERS = frozenset(("__enter__", "__aenter__"))

# the loops holding a claim: a second read by the same loop's __enter__ claims nothing
_claimed: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


class _ReleaseAtRunEnd(BaseCallbackHandler):
    """Releases a claim when the root run it was taken for ends, however it ends."""

    run_inline = True       # before (a)stream re-raises, not later in an executor

    def __init__(self, claim: Any, run_id: Any) -> None:
        self.claim = claim
        self.run_id = run_id

    def on_chain_end(self, outputs: Any, *, run_id: Any, **kwargs: Any) -> None:
        if run_id == self.run_id:
            self.claim.release()

    def on_chain_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
        if run_id == self.run_id:
            self.claim.release()


def _entering_root_loop(saver: Any) -> Any:
    """The root pregel loop of ``saver`` whose ``__enter__`` is calling us, or None."""
    f = inspect.currentframe()
    for _ in range(_MAX_DEPTH + 2):     # this function, claim_for_loop, then the callers
        if f is None:
            return None
        if f.f_code.co_name in _ENTERS:
            loop = f.f_locals.get("self")
            if isinstance(loop, PregelLoop) and loop.checkpointer is saver:
                return None if loop.is_nested else loop
        f = f.f_back
    return None


def claim_for_loop(saver: Any, thread_id: str, checkpoint_ns: str) -> None:
    """If a root graph's pregel loop is entering on ``thread_id``, claim the thread for
    that invocation (RunBusyError naming the holder otherwise) and arrange its release."""
    if checkpoint_ns or PregelLoop is None or saver.store.read_only:
        return
    loop = _entering_root_loop(saver)
    if loop is None or loop in _claimed:
        return
    claim = saver.store.claim_driver("thread", thread_id)
    if claim is None:                   # not a local store: one process (memory), or s3
        return
    _claimed[loop] = claim
    try:
        loop.stack.callback(claim.release)
        manager = loop.manager
        if manager is not None:         # first: a user's raising handler cannot skip it
            manager.handlers.insert(0, _ReleaseAtRunEnd(claim, manager.run_id))
        weakref.finalize(loop, claim.release)
    except BaseException:
        claim.release()
        raise
