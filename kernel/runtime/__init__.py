"""durkv's runtime: durable steps, mutating tools, approvals and the run journal.

It uses only the store's public API (``append_journal``, ``journal``,
``journal_runs``, ``serde``), so every backend inherits it. The runtime's verbs --
``run``/``arun``, ``decide``, ``resolve``, ``runs`` -- are the methods of
:class:`RuntimeStore`, the :class:`durkv.store.Store` that :func:`durkv.open`
returns: the store never imports the runtime, so imports keep pointing down.

>>> import durkv
>>> @durkv.tool(version="1")
... def send(to, *, idempotency_key):
...     return idempotency_key
>>> with durkv.open("memory://") as store:
...     with store.run("t-1", input={"n": 1}) as run:
...         run.tool(send, "a@b")
't-1:0'
"""

from __future__ import annotations

from typing import Any

from ..store import Store, check_ids
from . import remote
from .control import decide, resolve, runs
from .journal import JournalEntry, RunInfo
from .run import NO_INPUT, Decision, Run, check_not_driven
from .repair import acknowledge, mark_damaged, record_pending
from .tools import Retry, tool

__all__ = ["Run", "Decision", "Retry", "tool", "JournalEntry", "RunInfo", "RuntimeStore"]


class RuntimeStore(Store):
    """A store with the runtime's verbs: what :func:`durkv.open` returns."""

    def run(self, run_id: str, *, input: Any = NO_INPUT,  # noqa: A002
            on_drift: str = "warn", secret_input: bool = False, clock: Any = None,
            sleep: Any = None) -> Run:
        """Open (or resume) run ``run_id``: ``with store.run(...) as run:`` (``async with
        store.arun(...)``).

        Args:
            input: the run's input; its fingerprint is recorded at creation, and opening
                the run again with another input raises :class:`durkv.RunConflictError`.
            on_drift: ``warn`` (default), ``fail`` or ``rerun``: what a recorded step of
                another prompt/tool version does (see :meth:`Run.step`).
            secret_input: journal only the input's fingerprint.
            clock, sleep: injectable ``time.time`` / ``time.sleep`` (tests).

        Raises:
            RunConflictError, RunBusyError (a second driver in this process).
        """
        remote.take(self, run_id)   # s3://: its pending decision objects first
        return Run(self, run_id, input, on_drift=on_drift, secret_input=secret_input,
                   clock=clock, sleep=sleep)

    def delete_runs(self, run_ids: Any) -> None:
        """:meth:`durkv.store.Store.delete_runs`, refused with :class:`durkv.RunBusyError`
        for a run that a ``with store.run(...)`` of this process is driving."""
        check_not_driven(self, check_ids("run_ids", run_ids))
        super().delete_runs(run_ids)

    arun = run      # the same object is also an async context manager
    decide = decide
    resolve = resolve

    @classmethod
    def open(cls, url: str, **options: Any) -> "RuntimeStore":
        """:meth:`durkv.store.Store.open`, then (a writer) the REPAIR record of every cut
        by ``recover --skip-corrupt`` not recorded yet (docs/FORMAT.md 6a)."""
        store = super().open(url, **options)
        try:
            record_pending(store)
            remote.start(store)     # s3:// writers: take decision objects in (FORMAT.md 13)
        except BaseException:
            store.close()
            raise
        return store

    def close(self, *, snapshot: bool = True) -> None:
        """:meth:`durkv.store.Store.close`, after stopping an ``s3://`` writer's intake of
        decision objects."""
        remote.stop(self)
        super().close(snapshot=snapshot)

    def runs(self) -> list[RunInfo]:
        """Every run with a journal and its status (see :func:`durkv.runtime.control.runs`);
        a run a repair touched and nobody acknowledged shows ``damaged``."""
        return mark_damaged(self, runs(self))

    def acknowledge_repair(self, run_id: str, *, by: Any = None, note: Any = None) -> list[str]:
        """The operator's word for every repair that touched ``run_id`` (docs/GUARANTEES.md
        16a): its tools follow the usual rules again. Returns the repair ids acknowledged."""
        return acknowledge(self, run_id, by=by, note=note)
