"""The call protocol of a run's durable calls, shared by its sync and async verbs:
plan (:class:`Plan`: replay a recorded entry, or call and record), attempts, record.

``Run.attempts`` is the one place a :class:`~durkv.Retry` drives attempts: a generator
that yields what each step of the protocol needs -- :data:`CALL` (make an attempt; the
driver sends back its outcome ``(ok, value or exception)``), ``(RECORD, fn, args)``
(journal a record; the driver waits for its fsync), ``(SLEEP, sleep, (seconds,))`` (back
off) -- and returns the call's outcome ``(ok, value or exception)``. :func:`drive` runs
it in the calling thread (``run.step``, ``run.tool``); :func:`durkv.runtime.aio.adrive`
from a coroutine, every durable wait off the event loop (``run.astep``, ``run.atool``),
as DBOS composes its immediate and pending outcomes."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Callable, Generator, NamedTuple

from ..errors import ConfigError
from .journal import CallState
from .tools import Retry, ToolSpec

__all__ = ["Plan", "Recorded", "err_type", "ONCE", "plain_version", "CALL", "RECORD", "SLEEP",
           "drive", "outcome", "IN_CALL", "call_in", "not_nested"]

ONCE = Retry(1)      # no retry: one attempt
CALL = "call"        # the effects an attempt generator yields (see the module docstring)
RECORD = "record"
SLEEP = "sleep"


# the durable call whose function runs in this context (a thread, an asyncio task and the
# tasks it starts), as ``[run, the call it runs inside (its list) or None]``, a refusal
# appended once a call of the same run was refused inside it (not_nested). A list: the C
# StepEntry makes one per new step (~30 ns)
IN_CALL: ContextVar[list | None] = ContextVar("durkv_in_call", default=None)


def not_nested(run: Any, kind: str, name: str) -> None:
    """Refuse a durable call of ``run`` made inside the function of another of its calls.

    A replay returns the outer call's recorded result without calling its function, so a
    call made inside it would never be asked for again: every later step id would shift
    and the run could not be resumed. The outer call then records nothing (see
    :func:`call_in`) and raises this refusal."""
    inside: list[list] = []     # the calls from the innermost out to one of ``run``
    cell = IN_CALL.get()
    while cell is not None:
        inside.append(cell)
        if cell[0] is run:
            break
        cell = cell[1]
    else:
        return
    refusal = ConfigError(
        f"run {run.run_id!r}: {kind} {name!r} was called inside the function of another "
        "durable call of the same run; a replay returns that call's recorded result "
        "without running its function, so this call would vanish. Make it a plain call, "
        "or make both calls one after the other at the run's level", run_id=run.run_id)
    for c in inside:            # each of them records nothing (another run's call between
        c.append(refusal)       # them too: its function raised for this misuse)
    raise refusal


def call_in(run: Any, fn: Callable, args: tuple, kwargs: dict) -> tuple[bool, Any]:
    """``fn(*args, **kwargs)`` as a durable call of ``run``: its outcome ``(ok, value or
    exception)``; a durable call of ``run`` refused inside it (:func:`not_nested`) is
    raised instead, whatever ``fn`` did with it, and nothing of this call is recorded."""
    cell = [run, IN_CALL.get()]
    token = IN_CALL.set(cell)
    try:
        done = True, fn(*args, **kwargs)
    except Exception as e:
        done = False, e
    finally:
        IN_CALL.reset(token)
    if len(cell) > 2:
        raise cell[2]
    return done


def outcome(done: tuple[bool, Any]) -> Any:
    """The value of an outcome ``(ok, value or exception)``, or its exception raised."""
    if done[0]:
        return done[1]
    raise done[1]


def drive(run: Any, attempts: Generator, fn: Callable, args: tuple, kwargs: dict) -> Any:
    """Drive a call's attempts in this thread: ``fn(*args, **kwargs)`` each attempt,
    records and sleeps done here (each record waits as the store's policy says)."""
    sent: Any = None
    try:
        while True:
            effect = attempts.send(sent)
            if effect is CALL:
                sent = call_in(run, fn, args, kwargs)
            else:
                sent = effect[1](*effect[2])
    except StopIteration as stop:
        ok, value = stop.value
    if ok:
        return value
    raise value


class Recorded(NamedTuple):
    """A recorded result replayed from a STEP record left unfolded (journal.fold_lazy):
    the fields of an entry a replay reads (``Run._outcome``), without folding one."""

    step_id: str
    name: str
    result: bytes | None
    err: None = None


class Plan:
    """What one durable call will do: replay a recorded entry, or call and record."""

    __slots__ = ("sid", "gen", "kind", "name", "fp", "inputs", "version", "entry", "replay",
                 "rc", "key", "t0", "comp_of", "spec", "tries", "refs", "encoded", "synced",
                 "issued")

    def __init__(self, sid: str, kind: str, name: str, fp: int, inputs: Any,
                 version: Any) -> None:
        self.sid, self.kind, self.name, self.fp = sid, kind, name, fp
        self.inputs, self.version = inputs, version
        self.gen = 0
        self.entry: CallState | Recorded | None = None
        self.replay = False
        self.rc = 0
        self.key: str | None = None
        self.t0 = 0.0
        self.comp_of: str | None = None
        self.spec: ToolSpec | None = None
        self.tries: tuple | list = ()    # failed attempts already journaled (the budget used)
        self.refs: list | None = None    # `ir`: the inputs by reference (runtime/inputs.py)
        self.encoded: Any = None         # its inputs as encoded (inputs.Encoded), to refer to
        self.synced = False     # a tool synced as under `sync` whatever the policy (16.9)
        self.issued = 0         # a tool's place among its execution's calls, in issue order

    @classmethod
    def replay_of(cls, e: CallState | Recorded) -> "Plan":
        """The plan of a call recorded as it is asked for now: return (raise) the recorded
        outcome. Built without ``__init__``: the hot path of a re-execution."""
        p = cls.__new__(cls)
        p.entry, p.replay, p.spec, p.sid = e, True, None, e.step_id
        return p


def err_type(exc: BaseException) -> str:
    t = type(exc)
    return f"{t.__module__}.{t.__qualname__}"


def plain_version(v: Any) -> Any:
    """A ``prompt_version`` as the journal records and replays it (a tuple is a list), so
    that a replay compares like with like; anything else is refused before the call."""
    if v is None or isinstance(v, (str, int, float)):
        return v
    if isinstance(v, (list, tuple)):
        return [plain_version(x) for x in v]
    if isinstance(v, dict) and all(type(k) is str for k in v):
        return {k: plain_version(x) for k, x in v.items()}
    raise ConfigError(f"prompt_version must be plain data (str, numbers, lists or str-keyed "
                      f"dicts of them), got {type(v).__name__} {v!r}; pass e.g. str(...) of it")
