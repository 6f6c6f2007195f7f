"""``@durkv.tool`` (a mutating tool: it gets an idempotency key) and ``durkv.Retry``.

>>> import durkv
>>> @durkv.tool(version="3")
... def send_email(to, body, *, idempotency_key):
...     return "sent " + idempotency_key
>>> send_email.__durkv_tool__.version
'3'
"""

from __future__ import annotations

import inspect
import random as _random
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError

__all__ = ["tool", "ToolSpec", "Retry", "tool_spec"]


@dataclass(frozen=True)
class ToolSpec:
    """What ``@durkv.tool`` records about a function."""

    name: str
    version: str | None
    at_most_once: bool
    compensate: Callable | None


def _takes_key(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get("idempotency_key")
    if p is not None and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
        return True
    return any(q.kind is q.VAR_KEYWORD for q in params.values())


def tool(fn: Callable | None = None, *, version: Any = None, at_most_once: bool = False,
         compensate: Callable | None = None, name: str | None = None):
    """Mark ``fn`` as a mutating tool for ``run.tool``: it is called with
    ``idempotency_key=f"{run_id}:{step_id}"`` (the same on every retry and
    re-execution), behind an intent journaled before the call and a receipt journaled
    before ``run.tool`` returns (which of them get an fdatasync of their own:
    docs/GUARANTEES.md 16.9).

    Args:
        version: the tool's version; a recorded call of another version follows the
            run's ``on_drift`` policy.
        at_most_once: the tool cannot deduplicate by key: a call interrupted between
            intent and receipt is reported in doubt (``InDoubtError``) instead of retried.
        compensate: an undo, called by ``run.compensate()`` as ``undo(result, *,
            idempotency_key)`` for each completed call, newest first.
        name: the name journaled (default: the function's ``__qualname__``; not its module,
            which differs between ``python script.py`` and an import).

    Raises:
        ConfigError: at decoration, when ``fn`` takes no ``idempotency_key`` parameter.
    """
    def wrap(f: Callable) -> Callable:
        if not callable(f):
            raise ConfigError(f"@durkv.tool decorates a function, got {f!r}")
        if not _takes_key(f):
            raise ConfigError(
                f"@durkv.tool {getattr(f, '__qualname__', f)!r} takes no idempotency_key "
                "parameter; add one (def f(..., *, idempotency_key): ...) and pass it to the "
                "service so that a retried call is deduplicated")
        if compensate is not None and not callable(compensate):
            raise ConfigError(f"compensate= must be a callable, got {compensate!r}")
        if compensate is not None and tool_spec(compensate) is None and not _takes_key(compensate):
            raise ConfigError(f"the compensation {compensate!r} takes no idempotency_key "
                              "parameter; define it as undo(result, *, idempotency_key)")
        f.__durkv_tool__ = ToolSpec(
            name or getattr(f, "__qualname__", repr(f)), None if version is None else str(version),
            bool(at_most_once), compensate)
        return f

    return wrap if fn is None else wrap(fn)


def tool_spec(fn: Any) -> ToolSpec | None:
    return getattr(fn, "__durkv_tool__", None)


def _exception_types(on: Any) -> type | tuple:
    """``on=`` as isinstance takes it, checked now: a bad one would otherwise surface as a
    TypeError at the first failure, in place of that failure."""
    types = tuple(on) if isinstance(on, (tuple, list)) else (on,)
    if not types or not all(isinstance(t, type) and issubclass(t, BaseException)
                            for t in types):
        raise ConfigError(f"Retry on= takes an exception class or a tuple of them (on="
                          f"(ConnectionError, TimeoutError)), got {on!r}")
    return on if isinstance(on, type) else types


class Retry:
    """Retry policy of a step or tool: up to ``attempts`` calls, exponential backoff
    with jitter between them, only for exceptions in ``on``.

    The delay before attempt ``i + 1`` (``i`` from 0) is ``min(max_delay, backoff *
    2**i)`` scaled by a random factor in ``[1 - jitter, 1]``. ``sleep``/``random`` are
    injectable (tests use a fake clock).

    >>> r = Retry(4, backoff=1.0, max_delay=3.0, jitter=0.0)
    >>> [r.delay(i) for i in range(3)]
    [1.0, 2.0, 3.0]
    """

    def __init__(self, attempts: int = 3, backoff: float = 0.5, max_delay: float = 30.0,
                 on: type | tuple = Exception, *, jitter: float = 0.5,
                 sleep: Callable[[float], Any] | None = None,
                 random: Callable[[], float] | None = None) -> None:
        if type(attempts) is not int or attempts < 1:
            raise ConfigError(f"Retry attempts must be an int >= 1, got {attempts!r}")
        if backoff < 0 or max_delay < 0 or not 0 <= jitter <= 1:
            raise ConfigError("Retry needs backoff >= 0, max_delay >= 0 and 0 <= jitter <= 1")
        self.attempts = attempts
        self.on = _exception_types(on)
        self.backoff = float(backoff)
        self.max_delay = float(max_delay)
        self.jitter = float(jitter)
        self.sleep = sleep if sleep is not None else time.sleep
        self.random = random if random is not None else _random.random

    def delay(self, i: int) -> float:
        d = min(self.max_delay, self.backoff * (2 ** i))
        return d * (1.0 - self.jitter * self.random()) if self.jitter else d

    def retries(self, exc: BaseException, attempt: int) -> bool:
        """Whether attempt number ``attempt`` (0-based) that raised ``exc`` is retried."""
        return attempt + 1 < self.attempts and isinstance(exc, self.on)

    def __repr__(self) -> str:
        return (f"Retry({self.attempts}, backoff={self.backoff}, max_delay={self.max_delay}, "
                f"jitter={self.jitter})")
