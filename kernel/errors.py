"""The one error hierarchy of durkv.

Every error a user can meet is a ``DurkvError`` with a stable ``code`` and a
message that says what happened and what to do. Data errors carry where
(segment, offset, run, step). Errors that are also bad arguments subclass the
matching builtin too, so ``except ValueError`` keeps working.
"""

from __future__ import annotations

from typing import Any


class DurkvError(Exception):
    """Base of every durkv error."""

    code = "durkv_error"

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, **self.context}


class CorruptionError(DurkvError):
    """Stored bytes fail a check. Carries segment, offset and kind."""

    code = "corruption"

    def __init__(self, message: str, *, segment: str = "", offset: int = -1,
                 kind: str = "", **context: Any) -> None:
        super().__init__(message, segment=segment, offset=offset, kind=kind, **context)
        self.segment = segment
        self.offset = offset
        self.kind = kind


class StoreLockedError(DurkvError):
    """Another process holds the store's writer lock."""

    code = "store_locked"


class FencedError(DurkvError):
    """This writer lost ownership of the store (a newer writer fenced it off)."""

    code = "fenced"


class LogFailedError(DurkvError):
    """A write or fsync failed; the handle refuses all further work.

    The data acknowledged before the failure is safe; reopen the store to
    recover from what is on disk (fsync is never retried: see GUARANTEES.md).
    """

    code = "log_failed"


class StoreClosedError(DurkvError):
    """A call on a store (or log) handle after its ``close()``: an operational error, as
    a lost connection is, not a bad argument. Open the store again."""

    code = "store_closed"


class ReadOnlyError(DurkvError):
    """A write was attempted through a read-only handle."""

    code = "read_only"


class IdempotencyConflictError(DurkvError):
    """The same idempotency key was used with a different input."""

    code = "idempotency_conflict"


class NonDeterminismError(DurkvError):
    """A replayed node asked for a different step than its journal holds."""

    code = "non_determinism"


class InDoubtError(DurkvError):
    """An at-most-once tool was interrupted between its intent and its receipt: nobody
    knows whether it happened. An operator records what did with ``Store.resolve``."""

    code = "in_doubt"

    def __init__(self, message: str, *, run_id: str | None = None,
                 step_id: str | None = None, key: str | None = None, **context: Any) -> None:
        super().__init__(message, run_id=run_id, step_id=step_id, key=key, **context)
        self.run_id = run_id        # like Interrupted: where, and the key to check with
        self.step_id = step_id
        self.key = key


class VersionDriftError(DurkvError):
    """A recorded prompt/tool version differs from the running one (``on_drift="fail"``)."""

    code = "version_drift"


class ApprovalMismatchError(DurkvError):
    """An approval was decided for another (action, payload) than the code now asks about."""

    code = "approval_mismatch"


class DecisionConflictError(DurkvError):
    """A decision (``decide``) or a resolution (``resolve``) contradicts the one already
    recorded for that step: the first one recorded is final. Operational, not usage: two
    operators answered at once, and the other one's answer is the run's."""

    code = "decision_conflict"


class RunConflictError(DurkvError):
    """A run id was opened with another input than the run was created with, or two runs
    would share one journal (copy_thread into a thread that has one)."""

    code = "run_conflict"


class RunBusyError(DurkvError):
    """The run is already being driven by another ``store.run`` in this process."""

    code = "run_busy"


class StepFailedError(DurkvError):
    """A recorded step failure whose exception type cannot be rebuilt on replay."""

    code = "step_failed"


class Interrupted(BaseException):
    """A run paused for an approval (not an error: a ``BaseException``, so that a bare
    ``except Exception`` in user code cannot swallow the pause). ``with store.run()``
    ends quietly on it and reports the run as waiting."""

    def __init__(self, run_id: str, step_id: str, action: str, payload: Any = None) -> None:
        super().__init__(f"run {run_id!r} waits for approval of {action!r} at step {step_id}; "
                         f"decide with store.decide({run_id!r}, {step_id!r}, approved=...)")
        self.run_id = run_id
        self.step_id = step_id
        self.action = action
        self.payload = payload


class ConfigError(DurkvError, ValueError):
    """Bad configuration or arguments (missing thread_id, unknown URL scheme...)."""

    code = "config"


class NotFoundError(DurkvError, KeyError):
    """The thing asked for is not in the store (no such LSN, thread, checkpoint)."""

    code = "not_found"

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class SerializationError(DurkvError, TypeError):
    """A value cannot be serialized by the store's serde."""

    code = "serialization"


class GraphError(ConfigError):
    """A ``durkv.Graph`` that cannot run as built, or a node/router that broke its contract
    (an unknown node, key or route, a value its reducer refuses, a runaway loop). The
    message names the node, key or router; nothing of the failing superstep is committed."""

    code = "graph"


class FrameTooLargeError(ConfigError):
    """A commit is larger than the log accepts."""

    code = "frame_too_large"


class BackendError(DurkvError):
    """The storage backend failed (I/O error, S3 error)."""

    code = "backend"


class StaleReaderError(DurkvError):
    """A read-only handle's log was repaired (``durkv recover``) since it was opened.

    LSNs it had indexed may now hold other frames: it refuses to extend its view.
    Open the log again (a read-only store's ``refresh()`` does so by itself).
    """

    code = "stale_reader"


class ArchiveConflictError(BackendError):
    """An archive already holds different content at a key durkv would write (another
    store's archive, or a fork of this one). The existing object is left untouched."""

    code = "archive_conflict"


class AccessDeniedError(BackendError):
    """The object store refused the credentials (HTTP 403)."""

    code = "access_denied"


class NoSuchBucketError(BackendError):
    """The bucket named in an ``s3://`` URL does not exist."""

    code = "no_such_bucket"


__all__ = [
    "DurkvError", "CorruptionError", "StoreLockedError", "FencedError", "LogFailedError",
    "ReadOnlyError", "IdempotencyConflictError", "NonDeterminismError", "ConfigError",
    "NotFoundError", "SerializationError", "FrameTooLargeError", "BackendError",
    "StaleReaderError",
    "ArchiveConflictError", "AccessDeniedError", "NoSuchBucketError",
    "InDoubtError", "VersionDriftError", "ApprovalMismatchError", "RunConflictError",
    "RunBusyError", "StepFailedError", "Interrupted", "DecisionConflictError",
]
