"""A live run's entries are the ones its journal folds to (issue 20, the new-step hot path).

A new step's record is folded from the fields the run packed, not from the map read back
(``journal.apply_step``), and a call without ``retry`` runs in a straight line rather than
through the ``attempts`` generator (``Run._once``). Neither may diverge from what a re-open
reads: the entries a live run holds after every kind of call are compared, field by
field, with the entries a fresh process folds from the store; and the straight line must
write, byte for byte, the journal the generator writes.
"""

from __future__ import annotations

import asyncio
import pickle
import subprocess
import sys
from itertools import count

import pytest
from storeinternals import run_state_of

import durkv
from durkv.runtime.inputs import ByRef, Unreadable
from durkv.runtime.journal import CallState

MODEL_OUT = {"text": "x" * 300, "tokens": 57}


def model(prompt, *history, **kw):
    return MODEL_OUT


@durkv.tool(name="effect")
def effect(i, *, idempotency_key):
    return {"done": i, "key": idempotency_key}


@durkv.tool(name="wire", at_most_once=True)
def wire(amount, *, idempotency_key):
    return amount


class Flaky:
    """Raises on its first ``fails`` calls, then returns ``ok``."""

    def __init__(self, fails: int, ok: object = "ok") -> None:
        self.left, self.ok = fails, ok

    def __call__(self, *a, **kw):
        if self.left:
            self.left -= 1
            raise ValueError(f"flaky ({self.left} left)")
        return self.ok


def _scenario(run, retry=None, chance=True):
    """Every kind of call a run records; ``retry`` is what the calls that take one get;
    ``chance``: random and uuid too (they record what they drew)."""
    out = [run.step("plan", model, "hi", retry=retry)]
    history = []
    for i in range(6):          # a growing message list: later records refer (`ir`)
        history.append({"role": "user", "content": f"message {i} " + "y" * 400})
        reply = run.step("model", model, history, turn=i, retry=retry,
                         prompt_version={"v": [1, i % 2]})
        history.append(reply)   # the step's own result, an item of its next inputs
    out.append(run.step("secret", model, "pw", secret=True, retry=retry))
    out.append(run.step("keyed", model, "k", key="by-key", retry=retry))
    with pytest.raises(ValueError):
        run.step("fails", Flaky(5), retry=retry)
    out.append(run.step("flaky", Flaky(1), retry=durkv.Retry(3, backoff=0)))
    out.append(run.tool(effect, 1, retry=retry))
    out.append(run.tool(wire, 10, retry=retry))
    out.append(run.now())
    if chance:
        out += [run.random(), str(run.uuid())]
    run.sleep(0)
    return out


def _norm(v):
    """A folded value as plain data (a ByRef by what it holds, not its identity)."""
    if isinstance(v, ByRef):
        return ("ByRef", _norm(v.shape), v.k, _norm(v.new), _norm(v.base))
    if isinstance(v, Unreadable):
        return ("Unreadable", str(v))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [_norm(x) for x in v])
    if isinstance(v, dict):
        return ("dict", sorted((k, _norm(x)) for k, x in v.items()))
    return v


def _entries(st) -> list:
    assert all(type(e) is CallState for e in st.order)
    order = [[(slot, _norm(getattr(e, slot))) for slot in CallState.__slots__]
             for e in st.order]
    gens = sorted((sid, [e.gen for e in es]) for sid, es in st.entries.items())
    head = [st.fp, st.input, st.created, st.status, st.until, st.status_step, st.message,
            st.updated, st.task_ids]
    return [head, gens, order]


_FOLD_IN_A_FRESH_PROCESS = """
import pickle, sys
import durkv
from durkv.runtime.journal import fold
with durkv.open(sys.argv[1], read_only=True) as s:
    st = fold(sys.argv[2], s.journal(sys.argv[2]))
sys.stdout.buffer.write(pickle.dumps(st))
"""


@pytest.mark.parametrize("durability", ["async", "sync"])
def test_a_live_runs_entries_are_what_a_fresh_process_folds(tmp_path, durability):
    path = str(tmp_path / "s.durkv")
    ticks = count(1)
    with durkv.open(path, durability=durability) as store:
        with store.run("r", input={"q": 1}, clock=lambda: 1000.0 + next(ticks) / 8) as run:
            _scenario(run)
            _same_as_folded(run, path)      # the last record a step's (not the run's end)
        _same_as_folded(run, path)


def _same_as_folded(run, path: str) -> None:
    live = _entries(run_state_of(run))
    p = subprocess.run([sys.executable, "-c", _FOLD_IN_A_FRESH_PROCESS, path, "r"],
                       capture_output=True, check=True)
    folded = _entries(pickle.loads(p.stdout))
    assert live[0] == folded[0]
    assert live[1] == folded[1]
    assert len(live[2]) == len(folded[2]) > 15
    for a, b in zip(live[2], folded[2]):
        assert a == b, dict(a)["step_id"]


def _journal_bytes(path: str, retry) -> list:
    ticks = count(1)
    with durkv.open(path, durability="async") as store:
        with store.run("r", clock=lambda: 2000.0 + next(ticks) / 4) as run:
            _scenario(run, retry, chance=False)
        return store.journal("r")


def test_a_call_without_retry_writes_the_journal_the_attempts_generator_writes(tmp_path):
    # retry=Retry(1) is one attempt driven by Run.attempts; retry=None the straight line
    straight = _journal_bytes(str(tmp_path / "a"), None)
    generator = _journal_bytes(str(tmp_path / "b"), durkv.Retry(1))
    assert len(straight) >= 20
    assert straight == generator


def test_new_steps_and_keyed_tools_under_async_journal_in_one_backend_call_each(tmp_path,
                                                                                monkeypatch):
    """The live hot path end to end (issue 20): under ``async`` on a local store, each
    record of a keyed tool (intent and receipt) and an ``astep`` is appended by one
    ``append_one`` call -- no write section of its own (write_begin), no waits -- and a
    new step's record by run.step's C entry itself, with no backend call at all."""
    from durkv.backends.local import LocalBackend

    calls = []
    for name in ("write_begin", "append_one", "wait_durable", "wait_written"):
        real = getattr(LocalBackend, name)
        monkeypatch.setattr(LocalBackend, name, lambda self, *a, _n=name, _r=real, **k:
                            calls.append(_n) or _r(self, *a, **k))
    with durkv.open(str(tmp_path / "s.durkv"), durability="async") as store:
        with store.run("r") as run:
            run.step("warm", model, 0)      # the first record may catch the index up
            calls.clear()
            before = store._b.next_lsn
            assert run.step("plan", model, 1) == MODEL_OUT
            assert calls == [] and store._b.next_lsn == before + 1, calls
            assert run.tool(effect, 2) == {"done": 2, "key": "r:2"}
            assert calls == ["append_one"] * 2, calls

        async def steps():
            async with store.arun("a") as arun:
                await arun.astep("warm", model, 0)
                calls.clear()
                await arun.astep("plan", model, 1)
                await arun.atool(effect, 2)
                assert calls == ["append_one"] * 3, calls
        asyncio.run(steps())
        # STEP, INTENT, RECEIPT, STATUS (finished: the run's end, in a section)
        assert [r["e"] for r in store.journal("r")][-4:] == [2, 3, 4, 8]
