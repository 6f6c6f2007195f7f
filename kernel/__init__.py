"""durkv: a durable-execution storage kernel for long-running AI agents.

>>> import durkv
>>> with durkv.open("memory://") as store:
...     store.put("t1", "", "0001", checkpoint={}, metadata={}, values={"n": 1}, versions={"n": 1})
...     store.get("t1").values
{'n': 1}
"""

from __future__ import annotations

from typing import Any

from .errors import (
    AccessDeniedError, ApprovalMismatchError, ArchiveConflictError, BackendError, ConfigError,
    CorruptionError, DecisionConflictError, DurkvError, FencedError, FrameTooLargeError,
    GraphError, IdempotencyConflictError, InDoubtError, Interrupted, LogFailedError,
    NonDeterminismError, NoSuchBucketError,
    NotFoundError, ReadOnlyError, RunBusyError, RunConflictError, SerializationError,
    StaleReaderError, StepFailedError, StoreClosedError, StoreLockedError, VersionDriftError,
)
from .runtime.graph import END, START, Append, Graph, Last, Send
from .runtime import Decision, JournalEntry, Retry, Run, RunInfo, RuntimeStore, tool

__version__ = "0.1.0"     # the package's one version: pyproject.toml reads it from here


def open(url: str, **options: Any) -> RuntimeStore:  # noqa: A001 - the public verb
    """Open a store by URL: a path or ``file://`` (local C log), ``memory://``, or
    ``s3://bucket/prefix`` (a live store on S3; needs ``durkv[s3]``).

    The store has the runtime's verbs (``run``, ``decide``, ``resolve``, ``runs``:
    :class:`durkv.runtime.RuntimeStore`). See :meth:`durkv.store.Store.open` for the
    options.
    """
    unknown = sorted(set(options) - _OPEN_OPTIONS)
    if unknown:
        import difflib

        hints = [m for u in unknown for m in difflib.get_close_matches(u, _OPEN_OPTIONS, 1)]
        raise ConfigError(f"durkv.open has no option {', '.join(map(repr, unknown))}"
                          + (f"; did you mean {', '.join(map(repr, hints))}?" if hints else ".")
                          + f" Options: {', '.join(sorted(_OPEN_OPTIONS))}")
    if type(options.get("read_only", False)) is not bool:
        raise ConfigError(f"read_only must be True or False, got {options['read_only']!r}")
    return RuntimeStore.open(url, **options)


def _open_options() -> frozenset[str]:
    import inspect

    from .store import Store     # RuntimeStore.open passes its options to Store.open

    return frozenset(p for p in inspect.signature(Store.open).parameters
                     if p not in ("cls", "url"))


_OPEN_OPTIONS = _open_options()


__all__ = [
    "open", "__version__", "DurkvError", "CorruptionError", "StoreLockedError", "FencedError",
    "LogFailedError", "ReadOnlyError", "IdempotencyConflictError", "NonDeterminismError",
    "ConfigError", "NotFoundError", "SerializationError", "FrameTooLargeError", "BackendError",
    "InDoubtError", "VersionDriftError", "ApprovalMismatchError", "RunConflictError",
    "RunBusyError", "StepFailedError", "StoreClosedError", "Interrupted", "StaleReaderError",
    "ArchiveConflictError", "AccessDeniedError", "NoSuchBucketError", "tool", "Retry", "Run", "Decision",
    "JournalEntry", "RunInfo", "DecisionConflictError", "GraphError", "Graph", "Append", "Last",
    "Send", "START", "END",
]
