"""run.step's C entry (csrc/journalscan.c StepEntry) against the general Python path.

``Run.step`` takes a replayed step and the common new step in C and hands every other
call to ``Run._step`` (the definition). Here the same hostile agent runs once through
the entry and once with ``Run.step`` replaced by ``Run._step``: the journal's bytes must
be the same, the results the same values of the same types, and a re-execution (through
either path, in a fresh store) must replay what was recorded, raise what was recorded,
and call nothing.
"""

from __future__ import annotations

import math

import pytest

import durkv
from durkv.runtime.run import Run

BIG = ["m" * 300] * 6       # over inputs.SMALL_INPUTS: the entry hands it to the Python path


class Unpackable:
    pass


def _clock():
    t = iter(range(10 ** 6))
    return lambda: 1000.0 + next(t)


@durkv.tool(name="send")
def send(x, *, idempotency_key):
    return [x, idempotency_key]


def _nested(depth):
    v: list = []
    for _ in range(depth):
        v = [v]
    return v


def _agent(run, calls):
    """Every kind of call the entry meets; returns what each call gave (or raised)."""
    def echo(*a, **kw):
        calls.append((a, kw))
        return {"a": list(a), "kw": kw, "n": len(calls)}

    def same(x):
        calls.append(x)
        return x

    def boom(x):
        calls.append(("boom", x))
        raise ValueError(f"bad {x!r}")

    flaky_calls = []

    def flaky(x):
        flaky_calls.append(x)
        calls.append(("flaky", x))
        if len(flaky_calls) == 1:
            raise ConnectionError("once")
        return x

    out = []

    def do(*a, **kw):
        try:
            out.append(("ok", run.step(*a, **kw)))
        except Exception as e:      # noqa: BLE001 - the class and message are compared
            out.append(("err", type(e).__name__, str(e)))

    hostile = [
        0, 1, -1, 127, 128, 386, 0x82, 0x8F, -126, 0xDE, 0xDF, 0xC7, 0xD4, 2 ** 31, 2 ** 63 - 1,
        -(2 ** 63), 2 ** 64 - 1, 2 ** 70, 1.5, -0.0, math.inf, float("nan"), None, True, False,
        "", "x", "\x82\x83", "naïve ✓ 模型", "a" * 40, b"", b"\x82\xde\xdf", bytearray(b"\x8f"),
        [], [1, [2, [3, {"k": None}]]], {"only": 1}, {"b": 1, "a": 2}, {"z": {"y": 1, "x": 2}},
        (1, 2), {1, 2, 3}, frozenset({"a"}), {"\x82": b"\x83"}, [386] * 3, {"k": [0xDE, "\xdf"]},
        # the C packer's edges (csrc/journalscan.c pack_native): headers at their limits,
        # int and bool keys, nesting past its depth, text the UTF-8 codec refuses
        "s" * 31, "s" * 32, "s" * 255, "s" * 256, "é" * 16, b"b" * 255, b"b" * 256,
        [0] * 15, [0] * 16, {str(i): i for i in range(16)}, {1: "a"}, {True: None},
        -32, -33, -128, -129, 255, 256, 65535, 65536, 2 ** 32 - 1, 2 ** 32, -(2 ** 31) - 1,
        _nested(70), "\ud800", [1.0, 1], [True, 1],
    ]
    for v in hostile:
        do("same", same, v)
        do("echo", echo, v, v)
    do("模型 ✓", same, "ünïcode")                          # a unicode step name
    do("echo", echo, 1, x=2, y=[3])                         # keyword arguments to fn
    do("echo", echo, key="k-é")                             # an explicit step id
    do("echo", echo, 5, prompt_version="p1")
    do("echo", echo, 5, prompt_version=("p", 2))
    do("echo", echo, 6, secret=True)
    do("boom", boom, 7)                                     # a failure, recorded
    do("boom", boom, {"b": 1, "a": 2})
    do("bad result", same, Unpackable())                    # refused inputs
    do("bad result", lambda: Unpackable())                  # a result the serde refuses
    do("flaky", flaky, 8, retry=durkv.Retry(2, backoff=0.0))
    do("big", same, BIG)                                    # inputs by reference
    do("big", same, BIG + ["more"])
    out.append(("tool", run.tool(send, "hi")))
    out.append(("now", run.now()))
    do("same", same, "after the tool")
    do("no args", lambda: 42)
    return out


def _same(a, b):
    """Equal, of the same type, recursively (NaN equals NaN)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b, (a, b)


def _execute(path, general, monkeypatch, planned=None):
    with monkeypatch.context() as mp:
        if general:
            mp.setattr(Run, "step", Run._step)
        if planned is not None:         # the steps the Python path planned
            plan = Run._plan_call
            mp.setattr(Run, "_plan_call", lambda self, *a: planned.append(a[1]) or plan(self, *a))
        calls: list = []
        with durkv.open(path, durability="async") as store:
            with store.run("r", clock=_clock()) as run:
                out = _agent(run, calls)
            return out, calls, bytes(store.journal_heads("r")), store.journal("r")


@pytest.mark.parametrize("replay_general", [False, True])
def test_the_entry_writes_the_general_paths_bytes_and_replays_the_same(
        tmp_path, monkeypatch, replay_general):
    assert type(Run.__dict__["step"]).__name__ == "StepEntry"
    planned: list = []
    fast = _execute(str(tmp_path / "fast"), False, monkeypatch, planned)
    slow = _execute(str(tmp_path / "slow"), True, monkeypatch)
    # the entry took most new steps itself (inputs with a map or a set: the canonical
    # fingerprint, in C too); the Python path planned the others (of "same": "\ud800" only,
    # which no serde packs)
    assert 0 < len(planned) < 20 and planned.count("same") == 1, planned
    assert fast[2] == slow[2]               # the journal, byte for byte
    _same(fast[0], slow[0])
    _same(fast[1], slow[1])
    assert any(o[0] == "err" and o[1] == "ValueError" for o in fast[0])
    assert any(o[0] == "err" and o[1] == "SerializationError" for o in fast[0])
    # a re-execution, through either path: what was recorded, nothing called
    again = []
    for path, first in ((tmp_path / "fast", fast), (tmp_path / "slow", slow)):
        out, calls, heads, _ = _execute(str(path), replay_general, monkeypatch)
        replayed = [o for o in out if o[:2] != ("err", "SerializationError")]
        recorded = [o for o in first[0] if o[:2] != ("err", "SerializationError")]
        _same(replayed, recorded)
        # only the refused result's step (unrecorded) runs again, and it appends nothing
        assert calls == []
        again.append(heads)
    assert again[0] == again[1]             # and the re-executions append the same records


def test_the_entry_binds_as_a_method_and_reads_as_the_general_one(tmp_path):
    assert Run.step.__doc__ == Run._step.__doc__
    with durkv.open(str(tmp_path / "s")) as store, store.run("r") as run:
        step = run.step                     # a bound method, as for a function
        assert step("m", lambda x: x + 1, 1) == 2
        assert run.step("m", lambda x: x + 1, 2) == 3
        assert [e.step_id for e in run.journal()] == ["0", "1"]


def test_a_fresh_decode_each_replay_and_a_new_call_after_the_recorded_ones(tmp_path):
    path = str(tmp_path / "s")
    calls = []

    def model(i):
        calls.append(i)
        return {"i": i, "l": [i]}
    with durkv.open(path) as store, store.run("r") as run:
        first = [run.step("model", model, i) for i in range(3)]
    with durkv.open(path) as store, store.run("r") as run:
        again = [run.step("model", model, i) for i in range(4)]
        assert again[0] is not first[0] and again[0] == first[0]
        again[1]["i"] = "mutated"
        assert run.step("model", model, 1, key="k") == {"i": 1, "l": [1]}
    with durkv.open(path) as store, store.run("r") as run:
        assert run.step("model", model, 0) == first[0]
        with pytest.raises(durkv.IdempotencyConflictError):
            run.step("model", model, 99)            # step 1 was recorded with 1
        with pytest.raises(durkv.NonDeterminismError):
            run.step("other", model, 2)             # step 2 was "model"
    assert calls == [0, 1, 2, 3, 1]


def test_a_subclass_of_run_takes_the_general_path_and_its_overrides_count(tmp_path):
    recorded = []

    class Audited(Run):
        def _record_step(self, p, *a, **kw):
            recorded.append(p.sid)
            return super()._record_step(p, *a, **kw)

    with durkv.open(str(tmp_path / "s")) as store:
        run = Audited(store, "r")
        with run:
            assert [run.step("m", lambda x: x * 2, i) for i in range(3)] == [0, 2, 4]
    assert recorded == ["0", "1", "2"]


def test_wrong_arguments_are_reported_as_run_step(tmp_path):
    """A caller's missing arguments name the method the caller called, not its Python
    definition behind the C entry."""
    store = durkv.open(str(tmp_path / "s.durkv"))
    try:
        with store.run("r") as run:
            with pytest.raises(TypeError, match=r"^Run\.step\(\) missing 2 required"):
                run.step()
            with pytest.raises(TypeError, match=r"^Run\.step\(\) missing 1 required"):
                run.step("name")
    finally:
        store.close()


def test_the_entrys_appends_are_indexed_as_a_reopen_indexes_them(tmp_path):
    """The entry appends a new step's record itself and notes its LSN in the run's list
    (a run's first by Index.add_journal, the others in C): runs stepped in turn hold
    the LSN lists a reopen rebuilds from the log."""
    path = str(tmp_path / "s")
    with durkv.open(path, durability="async") as store:
        assert store._fast_journal is not None      # the C append is what is tested
        runs = [store.run(f"r{i}") for i in range(3)]
        for run in runs:
            run.__enter__()
        for i in range(20):
            for run in runs:
                assert run.step("m", lambda x: [x], i) == [i]
        for run in runs:
            run.__exit__(None, None, None)
        live = {r: list(v) for r, v in store._index.ix.journals.items()}
    with durkv.open(path) as store:
        assert {r: list(v) for r, v in store._index.ix.journals.items()} == live
        assert [len(live[f"r{i}"]) for i in range(3)] == [22] * 3    # RUN, 20 steps, END
        for i in range(3):
            with store.run(f"r{i}") as run:
                assert [run.step("m", lambda x: 1 / 0, k) for k in range(20)] == [
                    [k] for k in range(20)]


def test_the_entry_refuses_a_record_type_that_is_not_a_tuple():
    from durkv.runtime import run as run_mod
    kw = dict(general=Run._step, at=Run._step_at, end=Run._new_step_end,
              fingerprint=run_mod.fingerprint, apply_step=run_mod.apply_step,
              record_step=run_mod.record_step, globals=vars(run_mod), owed=run_mod.OWED,
              cls=Run, small=run_mod.SMALL_INPUTS, in_call=run_mod.IN_CALL)
    entry = type(Run.__dict__["step"])
    assert entry(record_type=run_mod.StepRecord, **kw) is not None
    for bad in (dict, list):
        with pytest.raises(TypeError, match="record_type: a tuple subclass"):
            entry(record_type=bad, **kw)
