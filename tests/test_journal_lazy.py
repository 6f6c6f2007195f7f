"""The lazy fold (journal.fold_lazy, what a Run opens with) against the eager one.

A run's plain STEP records stay unfolded until their entry is asked for, and a replay
compares its call with the record itself (issue 20: a long journal opens at the cost of
reading it). These tests hold the two folds to the same answers: every entry of a
journal with every kind of record, folded lazily from each prefix with the rest applied
after, is the entry the eager fold builds; and a Run opened lazily replays, refuses and
warns exactly as before.
"""

from __future__ import annotations

import collections
import datetime
import enum
import functools
import logging
import math

import msgpack
import pytest

import durkv
from durkv.runtime.inputs import ByRef, Unreadable
from durkv.runtime.journal import MISS, CallState, RunState, apply, fold
from durkv.runtime.journal import fold_lazy as fold_heads
from durkv.runtime.records import RunRecord, StatusRecord, StepRecord, WarnRecord

def fold_lazy(run_id, records):
    """fold_lazy of the heads a store would read for ``records`` (K_JOURNAL frames)."""
    return fold_heads(run_id, msgpack.packb([[11, run_id, r] for r in records],
                                            use_bin_type=True))


class _Colour(enum.Enum):
    RED = 1


class _IntSub(int):
    pass


class _StrSub(str):
    pass


BIG = ["m" * 300] * 6       # a list input over inputs.SMALL_INPUTS: journaled by items (`ir`)


def model(x):
    return {"said": x, "n": [1, 2]}


def boom(x):
    raise ValueError(f"bad {x}")


@durkv.tool(name="send")
def send(x, *, idempotency_key):
    return [x, idempotency_key]


def _flaky():
    calls = []

    def f(x):
        calls.append(x)
        if len(calls) == 1:
            raise ConnectionError("once")
        return x
    return f


def _execute(run, drift="v1"):
    run.step("plan", model, "a", prompt_version=drift)
    try:
        run.step("fails", boom, 1)
    except ValueError:
        pass
    run.step("flaky", _flaky(), 2, retry=durkv.Retry(3, backoff=0.0))
    run.tool(send, "hi")
    run.now()
    run.random()
    run.step("keyed", model, "k", key="k1")
    history = list(BIG)
    for turn in range(3):
        history = history + [f"turn {turn}"]
        run.step("chat", model, history)
    run.approve("ship", {"to": "prod"})
    run.step("after", model, "z")


def _journal(tmp_path):
    """A run's records: two executions (an approval between them), a prompt drift that
    warns, a failure retried as a new generation, inputs by reference."""
    store = durkv.open(str(tmp_path / "s.durkv"))
    with store.run("r", input={"q": 1}) as run:
        _execute(run)
    assert run.status == "waiting"
    store.decide("r", run.interrupt.step_id, True, by="ann")
    with store.run("r", input={"q": 1}) as run:
        _execute(run, drift="v2")
    with store.run("r", input={"q": 1}) as run:
        run.step("plan", model, "a", prompt_version="v2")
        with pytest.raises(ValueError):
            run.step("fails", boom, 1, retry_failed=True)
    return store, store.journal("r")


def _same(a, b, path="entry"):
    if isinstance(a, CallState):
        assert type(b) is CallState, path
        for s in CallState.__slots__:
            _same(getattr(a, s), getattr(b, s), f"{path}.{s}")
    elif isinstance(a, ByRef):
        assert type(b) is ByRef, path
        for s in ("shape", "k", "new"):
            _same(getattr(a, s), getattr(b, s), f"{path}.{s}")
        _same(a.base, b.base, f"{path}.base")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b and type(a) is type(b), (path, a, b)


def _unfold_all(st: RunState) -> None:
    for sid in list(st.lazy):
        st.unfold(sid)


def _assert_states_equal(eager: RunState, lazy: RunState) -> None:
    for f in ("run_id", "fp", "input", "created", "status", "until", "status_step", "message",
              "updated", "task_ids"):
        assert getattr(eager, f) == getattr(lazy, f), f
    assert lazy.calls == len(eager.order)
    _unfold_all(lazy)
    assert sorted(eager.entries) == sorted(lazy.entries)
    for sid, gens in eager.entries.items():
        _same(gens, lazy.entries[sid], f"entries[{sid!r}]")
    assert sorted((e.step_id, e.gen) for e in eager.order) == sorted(
        (e.step_id, e.gen) for e in lazy.order)


def test_the_lazy_fold_of_every_prefix_then_the_rest_applied_is_the_eager_fold(tmp_path):
    store, recs = _journal(tmp_path)
    events = {r["e"] for r in recs}
    assert {1, 2, 3, 4, 5, 6, 8, 9, 10} <= events, events   # every event a Run writes
    assert any("ir" in r for r in recs) and any(r.get("g") for r in recs)
    eager = fold("r", recs)
    for k in range(len(recs) + 1):
        lazy = fold_lazy("r", recs[:k])
        for r in recs[k:]:
            apply(lazy, r)
        _assert_states_equal(eager, lazy)
    store.close()


def test_latest_and_find_fold_the_entry_they_are_asked_for(tmp_path):
    store, recs = _journal(tmp_path)
    eager, lazy = fold("r", recs), fold_lazy("r", recs)
    assert "4" in lazy.lazy and "4" not in lazy.entries and lazy.out_of_order
    _same(eager.latest("4"), lazy.latest("4"))
    assert "4" not in lazy.lazy and lazy.find("4", 0) is lazy.latest("4")
    assert "0" not in lazy.lazy         # its WARN record folded it
    _same(eager.find("k1", 0), lazy.find("k1", 0))
    assert "k1" not in lazy.lazy
    assert lazy.latest("nope") is None and lazy.find("nope", 0) is None
    assert not fold("r", recs).lazy and not fold("r", recs).out_of_order
    store.close()


def _model_calls():
    calls = []

    def m(x):
        calls.append(x)
        return {"said": x, "n": [1, 2]}
    return m, calls


def _record(tmp_path, n=50):
    store = durkv.open(str(tmp_path / "s.durkv"))
    m, _ = _model_calls()
    with store.run("r") as run:
        for i in range(n):
            run.step("model", m, i, prompt_version="p1")
        with pytest.raises(ValueError):
            run.step("fails", boom, 7)
    store.close()
    return str(tmp_path / "s.durkv")


def test_a_lazily_opened_run_replays_fresh_equal_values_without_calling(tmp_path):
    path = _record(tmp_path)
    m, calls = _model_calls()
    with durkv.open(path) as store, store.run("r") as run:
        # nothing folded at open but the failure (a record with `err` is never left lazy)
        assert len(run._st.lazy) == 50 and list(run._st.entries) == ["50"]
        first = run.step("model", m, 0, prompt_version="p1")
        assert first == {"said": 0, "n": [1, 2]}
        first["n"].append("mutated by the caller")
        for i in range(1, 50):
            assert run.step("model", m, i, prompt_version="p1") == {"said": i, "n": [1, 2]}
        with pytest.raises(ValueError, match="bad 7"):     # the recorded failure's class
            run.step("fails", boom, 7)
        assert len(run._st.lazy) == 50      # a replay as asked folds nothing
    assert calls == []
    with durkv.open(path) as store, store.run("r") as run:     # a fresh object each time
        assert run.step("model", m, 0, prompt_version="p1") == {"said": 0, "n": [1, 2]}
        assert store.runs()[0].status == "running"
    with durkv.open(path) as store:
        entries = store.run("r").journal()
        assert [e.step_id for e in entries][:3] == ["0", "1", "2"]
        assert entries[0].result_receipt == {"said": 0, "n": [1, 2]}


def test_the_same_key_twice_replays_a_fresh_object_each_time(tmp_path):
    store = durkv.open(str(tmp_path / "s.durkv"))
    m, calls = _model_calls()
    with store.run("r") as run:
        run.step("model", m, 1, key="once")
    store.close()
    with durkv.open(str(tmp_path / "s.durkv")) as store, store.run("r") as run:
        a = run.step("model", m, 1, key="once")
        a["said"] = "changed"
        assert run.step("model", m, 1, key="once") == {"said": 1, "n": [1, 2]}
    assert calls == [1]


def test_conflicts_at_an_unfolded_record_are_detected_as_before(tmp_path):
    path = _record(tmp_path)
    m, calls = _model_calls()
    with durkv.open(path) as store:
        with pytest.raises(durkv.IdempotencyConflictError), store.run("r") as run:
            run.step("model", m, 0, prompt_version="p1")
            run.step("model", m, 999, prompt_version="p1")
        with pytest.raises(durkv.NonDeterminismError), store.run("r") as run:
            run.step("other", m, 0, prompt_version="p1")
        with pytest.raises(durkv.VersionDriftError), store.run("r", on_drift="fail") as run:
            run.step("model", m, 0, prompt_version="p2")
    assert calls == []


def test_a_prompt_drift_at_an_unfolded_record_warns_once_and_replays(tmp_path, caplog):
    path = _record(tmp_path, n=3)
    m, calls = _model_calls()
    for _ in range(2):
        with durkv.open(path) as store, store.run("r") as run:
            with caplog.at_level(logging.WARNING, logger="durkv"):
                assert run.step("model", m, 0, prompt_version="p2") == {"said": 0,
                                                                        "n": [1, 2]}
    with durkv.open(path) as store:
        warns = [r for r in store.journal("r") if r["e"] == 9]
        assert len(warns) == 1 and store.run("r").journal()[0].warnings
    assert calls == []


def test_a_new_step_after_a_lazy_replay_is_recorded_and_folded(tmp_path):
    path = _record(tmp_path, n=5)
    m, calls = _model_calls()
    with durkv.open(path) as store, store.run("r") as run:
        for i in range(5):
            run.step("model", m, i, prompt_version="p1")
        with pytest.raises(ValueError):
            run.step("fails", boom, 7)
        assert run.step("model", m, "new") == {"said": "new", "n": [1, 2]}
    assert calls == ["new"]
    with durkv.open(path) as store:
        recs = store.journal("r")
        eager, lazy = fold("r", recs), fold_lazy("r", recs)
        _assert_states_equal(eager, lazy)


def test_a_later_record_of_an_unfolded_step_folds_it_first():
    # two outcomes of one generation (not written by a Run, but a fold must not reorder
    # them): the second holds, lazily as eagerly, and one WARN lands on the entry
    recs = [RunRecord(1.0).pack(),
            StepRecord(2.0, "x", "step", "m", 5, result=b"\x01").pack(),
            StepRecord(3.0, "x", "step", "m", 5, result=b"\x02").pack(),
            WarnRecord(4.0, "x", 0, "drift").pack(),
            StepRecord(5.0, "y", "step", "m", 6, result=b"\x03").pack()]
    eager = fold("r", recs)
    assert eager.latest("x").result == b"\x02"
    for k in range(len(recs) + 1):
        lazy = fold_lazy("r", recs[:k])
        for r in recs[k:]:
            apply(lazy, r)
        _assert_states_equal(eager, lazy)


# ---- durkv._journalscan against msgpack's own decode ------------------------------------

def _plain(r):
    """Whether fold_lazy may leave ``r`` unfolded (the rule of csrc/journalscan.c)."""
    if type(r) is not dict or any(type(k) is not str for k in r) or r.get("e") != 2:
        return False
    if "ir" in r or r.get("err") is not None or type(r.get("s")) is not str:
        return False
    ok = {"k": (str,), "n": (str,), "pv": (str, type(None)), "fp": (int, type(None)),
          "r": (bytes, type(None)), "in": (bytes, type(None)), "t": (int, float, type(None))}
    return all(type(r[k]) in types for k, types in ok.items() if k in r) and (
        type(r.get("e")) is int and type(r.get("e")) is not bool)


HOSTILE = [
    {"e": 2, "s": "a"},                                         # every default
    {"e": 2, "s": "b", "fp": None, "k": "now", "n": "now", "pv": None, "r": None, "t": None},
    {"e": 2, "s": "c", "fp": -5, "t": 3},                       # negative fixint, int t
    {"e": 2, "s": "d", "fp": -200, "t": 1.5, "pv": "v" * 40},    # int16, str8
    {"e": 2, "s": "e", "fp": -70000, "n": "x" * 300},            # int32, str16
    {"e": 2, "s": "f", "fp": -(2 ** 40), "r": b"\x01" * 70000},  # int64, bin32
    {"e": 2, "s": "g", "fp": 2 ** 64 - 1, "r": b"\x02" * 300},   # uint64, bin16
    {"e": 2, "s": "h", "fp": 200, "err": None, "extra": {"x": [1, {"y": 2}]}},
    {"e": 2, "s": "i", "pv": ["a", 1]},                          # a list version: folded
    {"e": 2, "s": "j", "err": ["ValueError", "bad", None]},      # a failure: folded
    {"e": 2, "s": "k", "ir": None},                              # inputs by reference
    {"e": 2, "s": 7},                                            # a non-str step id
    {"e": 2, "s": "l", "k": None},
    {"e": 2, "s": "m", 3: "int key"},
    {"e": 3, "s": "n"},
    {"e": 2.0, "s": "o"},
    {"e": True, "s": "p"},
    {"e": 2, "s": "q", "fp": 1.5},
    {"e": 2, "s": "r", "r": "text"},
    {"e": 2, "s": "in", "in": b"\x92\x90\x80", "r": b"\xc0"},
    {"e": 2, "s": "in2", "in": "text"},
    {"e": 2, "s": "s", "t": "noon"},
    {"s": "t"},
    ["not", "a", "map"],
    None,
    {("e" * i): i for i in range(1, 20)} | {"e": 2, "s": "map16"},   # a map16 record
    {"e": 2, "s": "ünï", "n": "名前", "k": "step"},
]


def test_the_index_reads_every_plain_record_as_its_decode_and_keeps_the_rest_as_they_are():
    from durkv._journalscan import index
    heads = [[11, "r", r] for r in HOSTILE] + [[20, ["r", "q"], HOSTILE[0], "later field"]]
    buf = msgpack.packb(heads, use_bin_type=True)
    lazy, rest, where, last = index(buf)
    records = [h[2] for h in heads]
    seen, want_lazy, want_rest, want_where = set(), [], [], []
    for i, r in enumerate(records):
        sid = r.get("s") if type(r) is dict else None
        if _plain(r) and sid not in seen:       # the first record of its step id
            want_lazy.append((i, sid))
            x = lazy.get(sid)
            fields = (sid, r.get("fp", 0), r.get("k", "step"), r.get("n", ""), r.get("pv"),
                      r.get("in"), r.get("r"), r.get("t"))
            assert x[:8] == fields and [type(v) for v in x[:8]] == [type(v) for v in fields]
            assert msgpack.unpackb(x[8], strict_map_key=False) == r and len(x) == 9
            assert sid in lazy
        else:
            want_rest.append(r)
            want_where.append(i)
        if type(sid) is str:
            seen.add(sid)
    assert list(lazy) == [sid for _, sid in want_lazy] and len(lazy) == len(want_lazy)
    assert msgpack.unpackb(bytes(rest), strict_map_key=False) == want_rest
    assert where == want_where and where[-1] == len(records) - 1   # "a" again: not lazy
    assert last == (want_lazy[-1][0], records[want_lazy[-1][0]].get("t"))
    assert "m" not in lazy and 7 not in lazy and lazy.get("nope", 5) == 5
    lazy.limit = 0
    assert not lazy and len(lazy) == 0 and list(lazy) == []
    lazy.limit = 4                      # the records before position 4 only
    assert list(lazy) == ["a", "b", "c", "d"] and len(lazy) == 4 and "e" not in lazy and lazy
    assert lazy.get("e") is None and lazy.pop("e", None) is None
    lazy.limit = len(records)
    assert lazy.pop("e")[0] == "e" and "e" not in lazy and len(lazy) == len(want_lazy) - 1
    with pytest.raises(KeyError):
        lazy.pop("e")
    for sid in list(lazy):
        lazy.pop(sid)
    assert not lazy and len(lazy) == 0
    empty, rest, where, last = index(b"\x90")
    assert (len(empty), rest, where, last) == (0, bytearray(b"\xdd\0\0\0\0"), [], None)


def test_heads_the_index_cannot_read_raise_value_error():
    from durkv._journalscan import index
    good = msgpack.packb([[11, "r", {"e": 2, "s": "a", "r": b"x" * 50}]], use_bin_type=True)
    for bad in (b"", b"\x80", b"\x91\x92\x0b\xa1r", b"\x91\xc1", good[:-3], good + b"\x00",
                msgpack.packb([[11, "r"]]), msgpack.packb([5]), b"\xdd\xff\xff\xff\xff"):
        with pytest.raises(ValueError):
            index(bad)
    bad_utf8 = good.replace(b"\xa1a", b"\xa1\xff")     # the step id's bytes: not UTF-8
    lazy, rest, where, last = index(bad_utf8)
    assert len(lazy) == 0 and where == [0] and last is None    # left to the decode


def test_a_journal_the_scan_refuses_is_folded_the_eager_way(tmp_path, monkeypatch):
    path = _record(tmp_path, n=3)
    import durkv.runtime.journal as journal

    def refuse(heads):
        raise ValueError("not readable")
    monkeypatch.setattr(journal, "index", refuse)
    m, calls = _model_calls()
    with durkv.open(path) as store, store.run("r") as run:
        assert not run._st.lazy and len(run._st.entries) == 4
        assert run.step("model", m, 0, prompt_version="p1") == {"said": 0, "n": [1, 2]}
    assert calls == []


def test_inputs_equal_by_bytes_or_by_fingerprint_replay_and_unencodable_ones_are_refused(tmp_path):
    store = durkv.open(str(tmp_path / "s.durkv"))
    m, calls = _model_calls()
    with store.run("r") as run:
        run.step("model", m, {"a": 1, "b": 2})
        run.step("model", m, {"a": 1})
        run.step("model", m, [1, 2], secret=True)
    store.close()
    with durkv.open(str(tmp_path / "s.durkv")) as store:
        with store.run("r") as run:
            assert run.step("model", m, {"b": 2, "a": 1})["said"] == {"a": 1, "b": 2}  # fp
            assert run.step("model", m, {"a": 1})["said"] == {"a": 1}                  # bytes
            assert run.step("model", m, [1, 2], secret=True)["said"] == [1, 2]    # no `in`
        with pytest.raises(durkv.SerializationError), store.run("r") as run:
            run.step("model", m, object())
        with pytest.raises(durkv.IdempotencyConflictError), store.run("r") as run:
            run.step("model", m, {"a": 1, "b": 3})
        with pytest.raises(durkv.IdempotencyConflictError), store.run("r") as run:
            run.step("model", m, {"a": 1, "b": 2})
            run.step("model", m, {"a": 1.0})        # equal in Python, another value here
    assert calls == [{"a": 1, "b": 2}, {"a": 1}, [1, 2]]


# ---- Index.replay: a replayed step in one C call, against the serde ---------------------

NATIVE = [None, True, False, 0, 1, -1, 31, 32, 127, 128, 255, 256, 65535, 65536, 2**32 - 1,
          2**32, 2**63 - 1, 2**63, 2**64 - 1, -32, -33, -128, -129, -32768, -32769, -2**31,
          -2**31 - 1, -2**63, 0.0, -0.0, 1.5, float("inf"), float("nan"), "", "a" * 31,
          "a" * 32, "a" * 255, "a" * 256, "a" * 65535, "a" * 65536, "ünï", "名前 🙂", b"",
          b"x" * 255, b"x" * 256, b"x" * 65536, [], [1] * 15, [1] * 16, [None] * 65536, {},
          {str(i): i for i in range(15)}, {str(i): i for i in range(16)},
          {1: "int key", None: 2, b"b": 3, 1.5: 4, False: 5, -7: [{}]},
          {"a": [{"b": [None, True, 2.5, b"\xc4"]}], "c": {"d": "e" * 40}},
          "a" * 9 + "é", "é" + "a" * 20, "a" * 15 + "\x7f", {"ключ": 1, "k": {"ключ": "é" * 9}}]
OTHER = [2**64, -2**63 - 1, (1, 2), [1, (2,)], {3}, frozenset([4]), bytearray(b"ab"),
         datetime.datetime(2026, 12, 3, 18, 0, tzinfo=datetime.timezone.utc),
         collections.OrderedDict(a=1), {"k": {"x"}}, _Colour.RED,
         functools.reduce(lambda a, _: [a], range(70), 1)]     # deeper than replay() packs


def _index_of(records):
    from durkv._journalscan import index
    return index(msgpack.packb([[11, "r", r] for r in records], use_bin_type=True))[0]


def _step(sid, args, kwargs, result, name="m", pv=None, serde=durkv.serde.default_serde):
    r = {"e": 2, "t": 1.0, "s": sid, "k": "step", "n": name, "fp": 1,
         "in": serde.dumps([list(args), kwargs]), "r": serde.dumps(result)}
    return r | ({} if pv is None else {"pv": pv})


def _same_value(a, b):
    if isinstance(a, float) and math.isnan(a):
        assert type(b) is float and math.isnan(b)
    else:
        _same(a, b, "value")


def test_replay_packs_a_call_as_the_default_serde_does_and_decodes_as_it_does():
    serde = durkv.serde.default_serde
    values = NATIVE + OTHER
    lazy = _index_of([_step(str(i), (v, i), {"k": v}, v) for i, v in enumerate(values)])
    for i, v in enumerate(values):
        got = lazy.replay(str(i), "m", (v, i), {"k": v}, None, serde.loads)
        if i >= len(NATIVE):        # not packed here: the Python path decides
            assert got is MISS, v
            continue
        _same_value(serde.loads(serde.dumps(v)), got)
        again = lazy.replay(str(i), "m", (v, i), {"k": v}, None, serde.loads)
        if type(v) in (list, dict):
            assert again is not got        # a fresh object every time
    for i, v in enumerate(NATIVE):     # a call whose bytes differ: never replayed here
        for w in (NATIVE[(i + 1) % len(NATIVE)], [v], {"v": v}):
            assert lazy.replay(str(i), "m", (w, i), {"k": v}, None, serde.loads) is MISS
        assert lazy.replay(str(i), "m", (v, i), {"k": v, "x": 1}, None, serde.loads) is MISS
        assert lazy.replay(str(i), "m", (v,), {"k": v}, None, serde.loads) is MISS
    at = NATIVE.index(128)          # subclasses the serde refuses are not their base here
    assert lazy.replay(str(at), "m", (_IntSub(128), at), {"k": 128}, None, serde.loads) is MISS
    at = NATIVE.index("")
    assert lazy.replay(str(at), "m", ("", at), {_StrSub("k"): ""}, None, serde.loads) is MISS


def test_replay_answers_miss_for_anything_but_the_record_as_asked():
    loads = durkv.serde.default_serde.loads
    lazy = _index_of([_step("0", (1,), {}, {"a": 1}, pv="v1"),
                      {"e": 2, "s": "1", "n": "m", "in": b"\x92\x91\x01\x80"},   # no result
                      {"e": 2, "s": "2", "n": "m", "r": b"\x01"},                # no inputs
                      {"e": 2, "s": "3", "k": "tool", "n": "m", "in": b"\x92\x91\x01\x80",
                       "r": b"\x01"}])
    assert lazy.replay("0", "m", (1,), {}, "v1", loads) == {"a": 1}
    for sid, name, args, kwargs, version in [("0", "m", (1,), {}, None), ("0", "m", (1,), {}, "v2"),
                                             ("0", "n", (1,), {}, "v1"), ("9", "m", (1,), {}, "v1"),
                                             (0.0, "m", (1,), {}, "v1"), ("1", "m", (1,), {}, None),
                                             ("2", "m", (1,), {}, None), ("3", "m", (1,), {}, None),
                                             ("0", "m", [1], {}, "v1"), ("0", _StrSub("m"), (1,),
                                                                         {}, "v1")]:
        assert lazy.replay(sid, name, args, kwargs, version, loads) is MISS
    # an automatic step id may come as its number (Run.step makes no str for it); the
    # mapping side takes step ids only, as a dict of them would
    assert lazy.replay(0, "m", (1,), {}, "v1", loads) == {"a": 1}
    assert lazy.replay(2**70, "m", (1,), {}, "v1", loads) is MISS
    assert 0 not in lazy and lazy.get(0) is None and lazy.pop(0, None) is None
    lazy.limit = 0          # a record at or after the limit is not there
    assert lazy.replay("0", "m", (1,), {}, "v1", loads) is MISS


def test_replay_decodes_what_only_the_serde_reads_with_the_serde():
    serde = durkv.serde.default_serde
    results = [(1, [2, {3}]), {"when": datetime.date(2026, 1, 2), "ids": frozenset([1])},
               collections.OrderedDict(b=1, a=2), [1, (2, 3)], 2**70, _Colour.RED]
    lazy = _index_of([_step(str(i), (), {}, v) for i, v in enumerate(results)])
    for i, v in enumerate(results):
        _same(serde.loads(serde.dumps(v)), lazy.replay(str(i), "m", (), {}, None, serde.loads))
    # bytes the serde refuses are refused as the serde refuses them
    for i, bad in enumerate([b"\x01\x02", b"\xa1\xff", b"\x81\x91\x01\x02", b"\x92\x01",
                             b"\xc1", b"\xd6\xff\x00\x00\x00\x01"]):
        rec = _step("b", (), {}, None) | {"r": bad}
        lazy = _index_of([rec])
        try:
            want = serde.loads(bad)
        except Exception as e:
            with pytest.raises(type(e)):
                lazy.replay("b", "m", (), {}, None, serde.loads)
        else:
            assert lazy.replay("b", "m", (), {}, None, serde.loads) == want


def test_an_ir_before_a_lazy_record_links_to_the_journal_as_it_stood_at_it():
    # hostile order (a Run never writes it): "a" refers to "b", whose record comes later;
    # the eager fold finds nothing there, and so must the lazy one
    recs = [RunRecord(1.0).pack(),
            {"e": 2, "t": 2.0, "s": "a", "k": "step", "n": "m", "fp": 1,
             "ir": [[1], ["b", 0, 1], []], "r": b"\x01"},
            StepRecord(3.0, "b", "step", "m", 2, inputs=b"\x92\x91\x01\x80",
                       result=b"\x02").pack(),
            WarnRecord(4.0, "zz", 0, "nothing there").pack()]
    eager, lazy = fold("r", recs), fold_lazy("r", recs)
    assert "b" in lazy.lazy and eager.updated == lazy.updated == 4.0
    base_e, base_l = eager.latest("a").inputs.base, lazy.latest("a").inputs.base
    assert type(base_e) is type(base_l) is Unreadable and str(base_e) == str(base_l)
    for last_t, order in ((5.0, [0, 2, 1]), (2.0, [0, 1, 2])):
        recs2 = [recs[0], StatusRecord(last_t, "running").pack(),
                 StepRecord(2.0, "x", "step", "m", 2, result=b"\x03").pack()]
        recs2 = [recs2[i] for i in order]
        assert fold("r", recs2).updated == fold_lazy("r", recs2).updated


def test_a_run_replays_calls_and_results_only_the_serde_packs_fresh_and_as_recorded(tmp_path):
    store = durkv.open(str(tmp_path / "s.durkv"))
    calls = []

    def m(*args, **kwargs):
        calls.append(args)
        return {"args": args, "kw": kwargs, "set": {1, 2}}

    with store.run("r") as run:
        first = run.step("m", m, (1, 2), {3}, when=datetime.date(2026, 1, 2))
        run.step("m", m, 2**70, x=[(1,)])
    store.close()
    with durkv.open(str(tmp_path / "s.durkv")) as store, store.run("r") as run:
        again = run.step("m", m, (1, 2), {3}, when=datetime.date(2026, 1, 2))
        _same(first, again)
        assert run.step("m", m, 2**70, x=[(1,)])["kw"] == {"x": [(1,)]}
    assert len(calls) == 2


def test_step_ids_that_look_like_numbers_are_each_their_own():
    # an automatic step id is found by its number, any other by hash: "007" is not "7"
    loads = durkv.serde.default_serde.loads
    sids = ["7", "007", "00", "0", "-1", str(10**17), str(10**19), "1e3", "٣", "12/3", ""]
    recs = [_step(sid, (), {}, i) for i, sid in enumerate(sids)]
    recs += [_step("7", (), {}, "again"), _step(str(10**19), (), {}, "again")]
    lazy = _index_of(recs)
    assert list(lazy) == sids and len(lazy) == len(sids)
    for i, sid in enumerate(sids):
        assert lazy.get(sid)[0] == sid and lazy.replay(sid, "m", (), {}, None, loads) == i
    for number in (7, 0, -1, 10**17):
        assert lazy.replay(number, "m", (), {}, None, loads) == sids.index(str(number))
    assert lazy.replay(8, "m", (), {}, None, loads) is MISS and "8" not in lazy
    assert lazy.replay(10**19, "m", (), {}, None, loads) is MISS     # past 64 bits: by str


def test_the_heads_of_a_run_across_segments_and_between_another_runs_read_whole(tmp_path):
    # dkv_read_heads sizes its buffer from the segment index: spans across segments,
    # records of another run between, records still pending -- every head, in order
    store = durkv.open(str(tmp_path / "s.durkv"), segment_bytes=1 << 16, durability="async")
    m, _ = _model_calls()
    with store.run("a") as a, store.run("b") as b:
        for i in range(300):
            a.step("model", m, "x" * (i % 7) * 40)
            if i % 3 == 0:
                b.step("model", m, i)
        heads = msgpack.unpackb(bytes(store.journal_heads("a")), strict_map_key=False)
        assert [h[2] for h in heads] == store.journal("a")
    store.close()
    with durkv.open(str(tmp_path / "s.durkv")) as store:
        heads = msgpack.unpackb(bytes(store.journal_heads("a")), strict_map_key=False)
        assert [h[2] for h in heads] == store.journal("a") and len(heads) >= 302
        assert len(store.journal_heads("b", start=50)) > 5


def test_garbled_heads_are_refused_or_read_as_their_decode():
    # bytes changed, cut or inserted anywhere: the index raises ValueError, or each record
    # it keeps is what msgpack decodes at its place, and a replay decodes as the serde does
    import random

    from durkv._journalscan import index
    serde = durkv.serde.default_serde
    recs = [_step(str(i), (i,), {}, {"a": [i, "x" * i]}, pv=None if i % 2 else "v")
            for i in range(8)] + [StatusRecord(2.0, "running", "3").pack()]
    buf = msgpack.packb([[11, "r", r] for r in recs], use_bin_type=True)
    rnd = random.Random(20)
    for _ in range(1500):
        b = bytearray(buf)
        p = rnd.randrange(len(b))
        b[p:p + rnd.randint(0, 3)] = bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 3)))
        try:
            lazy, _rest, _where, _last = index(bytes(b))
        except ValueError:
            continue
        for sid in list(lazy):
            x = lazy.get(sid)
            r = msgpack.unpackb(x[8], strict_map_key=False)
            assert x[8] in b
            assert r["s"] == sid and r.get("r") == x[6] and r.get("in") == x[5]
            args = (int(sid),) if sid.isascii() and sid.isdigit() else (0,)
            if x[6] is None:        # no result: not replayed here
                assert lazy.replay(sid, "m", args, {}, r.get("pv"), serde.loads) is MISS
                continue
            try:
                want = serde.loads(x[6])
            except Exception as e:
                with pytest.raises(type(e)):
                    lazy.replay(sid, "m", args, {}, r.get("pv"), serde.loads)
                continue
            got = lazy.replay(sid, "m", args, {}, r.get("pv"), serde.loads)
            assert got is MISS or got == want


def test_a_record_whose_decode_could_fail_is_never_left_lazy():
    # an unfold decodes the record: whatever msgpack could refuse in it (a str that is not
    # UTF-8, an extension type such as a bad timestamp, a list as a map key) is folded at
    # open instead, where the eager path refuses it as it always did
    from durkv._journalscan import index
    good = {"e": 2, "s": "u", "x": "Z", "r": b"\x01"}
    for rec in (msgpack.packb(good).replace(b"\xa1Z", b"\xa1\xff"),
                msgpack.packb(good | {"x": msgpack.ExtType(5, b"q")}),
                msgpack.packb(good).replace(b"\xa1Z", b"\xd7\xff" + b"\xff" * 8),  # a timestamp
                msgpack.packb(good | {"x": {(1,): 2}}),
                msgpack.packb(good).replace(b"\xa1x", b"\xa1\xfe")):
        lazy, _rest, where, last = index(b"\x91\x93\x0b\xa1r" + rec)
        assert len(lazy) == 0 and where == [0] and last is None
    lazy, _rest, where, _last = index(b"\x91\x93\x0b\xa1r" + msgpack.packb(good))
    assert list(lazy) == ["u"] and where == []


def test_long_strings_are_checked_as_utf8_at_every_byte():
    # the check reads 8 bytes at a time, then the rest one by one: a byte that is not
    # ASCII anywhere in a 1..24-byte value or key is judged by Python's decoder
    from durkv._journalscan import index
    for n in range(1, 25):
        for at in range(n):
            for text, bad in ((b"a" * at + b"\xff" + b"b" * (n - at - 1), True),
                              (b"a" * at + "é".encode() + b"b" * (n - at - 1), False)):
                rec = msgpack.packb({"e": 2, "s": "u", "x": "Z", "r": b"\x01"})
                for key_or_value in (b"\xa1x", b"\xa1Z"):       # x: a key, Z: a value
                    raw = bytes([0xa0 + len(text)]) + text
                    heads = b"\x91\x93\x0b\xa1r" + rec.replace(key_or_value, raw)
                    lazy, _rest, where, _last = index(heads)
                    assert (list(lazy), where) == (([], [0]) if bad else (["u"], [])), \
                        (n, at, text, key_or_value)


# ---- LIVE: a run's own new plain steps held in the index (journal.record_step) ----------

def _clock():
    t = iter(range(10 ** 6))
    return lambda: 1000.0 + next(t)


def _eager_record_step(monkeypatch):
    """The fold every record took before live steps were held: the eager path."""
    import durkv.runtime.journal as journal
    import durkv.runtime.run as run_mod
    monkeypatch.setattr(run_mod, "record_step",
                        lambda st, fields, payload: journal.apply_step(st, fields))


def _live_agent(run):
    """Every way a live run meets its own held steps: replays of them in the same Run,
    conflicts at them, records that unfold them, inputs that refer to them."""
    m, calls = _model_calls()
    out = [run.step("model", m, i) for i in range(300)]             # automatic ids
    out += [run.step("model", m, [i, "x"], key=f"k{i}") for i in range(40)]   # hashed ids
    a = run.step("model", m, [1, "x"], key="k1")    # replayed in the Run that recorded it
    a["said"] = "changed by the caller"
    out.append(run.step("model", m, [1, "x"], key="k1"))    # a fresh decode, not `a`
    with pytest.raises(durkv.IdempotencyConflictError):
        run.step("model", m, 2, key="k2")
    with pytest.raises(durkv.NonDeterminismError):
        run.step("other", m, [3, "x"], key="k3")
    out.append(run.step("model", m, "v", key="pv", prompt_version="p1"))
    out.append(run.step("model", m, "v", key="pv", prompt_version="p2"))   # WARN: unfolds
    with pytest.raises(ValueError):
        run.step("fails", boom, 9)              # a failure: folded, never held
    out.append(run.step("flaky", _flaky(), 4, retry=durkv.Retry(2, backoff=0.0)))  # TRY first
    out.append(run.tool(send, "hi"))
    out.append(run.now())
    out.append(run.step("chat", m, ["small"]))
    held = len(run._st.lazy)
    # inputs that may refer to the journal's entries look for the latest of their name in
    # log order: the Run reads its journal again, eagerly (once), and holds no more steps
    out.append(run.step("chat", m, BIG))
    assert len(run._st.lazy) == 0 and not run._st.out_of_order
    out.append(run.step("chat", m, BIG + ["more"]))
    out += [run.step("model", m, i) for i in range(1000, 1100)]
    return out, calls, held


def test_a_live_runs_held_steps_answer_as_the_eager_fold_and_write_the_same_bytes(
        tmp_path, monkeypatch):
    results = {}
    for how in ("live", "eager"):
        with monkeypatch.context() as mp:
            if how == "eager":
                _eager_record_step(mp)
            store = durkv.open(str(tmp_path / how))
            with store.run("r", clock=_clock()) as run:
                out, calls, held = _live_agent(run)
                st = run._st
                recs = store.journal("r")
                assert (held > 300) is (how == "live")     # held, not folded
                _assert_states_equal(fold("r", recs), st)   # every entry, every field
            results[how] = (out, calls, store.journal("r"), store.run("r").journal(),
                            store.runs())
            store.close()
    live, eager = results["live"], results["eager"]
    assert live[0] == eager[0] and live[1] == eager[1]      # values returned, calls made
    assert live[2] == eager[2]          # the records, field by field (same clock)
    assert live[3] == eager[3]          # Run.journal(): durkv show's entries
    assert [(r.run_id, r.steps, r.status) for r in live[4]] == [
        (r.run_id, r.steps, r.status) for r in eager[4]]
    assert any("ir" in r for r in live[2])      # a reference to a held step's inputs


def test_held_steps_are_held_and_every_query_folds_as_the_eager_fold(tmp_path):
    store = durkv.open(str(tmp_path / "s"))
    m, calls = _model_calls()
    with store.run("r") as run:
        for i in range(3000):           # past the index's first tables: they grow
            run.step("model", m, i)
        for i in range(500):
            run.step("model", m, i, key=f"key-{i}")
        st = run._st
        assert len(st.lazy) == 3500 and not st.entries     # no CallState built
        assert list(st.lazy) == [str(i) for i in range(3000)] + [f"key-{i}" for i in range(500)]
        eager = fold("r", store.journal("r"))
        assert st.calls == len(eager.order) and st.updated == eager.updated
        for sid in ("0", "1234", "2999", "key-0", "key-499"):
            _same(eager.latest(sid), st.latest(sid))        # folded when asked for
            assert sid not in st.lazy
        assert st.latest("3000") is None and st.find("key-500", 0) is None
        # a replay of a held step in the Run that recorded it: a fresh decode each time
        a = run.step("model", m, 7, key="key-7")
        assert a == {"said": 7, "n": [1, 2]} and a is not run.step("model", m, 7, key="key-7")
        _assert_states_equal(fold("r", store.journal("r")), st)
    assert len(calls) == 3500
    with store.run("r") as run:         # re-opened: the same records, read from the log
        for i in range(3000):
            run.step("model", m, i)
    assert len(calls) == 3500
    store.close()


_OTHER_PROCESS = """
import sys, durkv
from durkv.runtime.records import StatusRecord
store = durkv.open(sys.argv[1])
store.append_journal("r", StatusRecord(5.0, "running", None, "from elsewhere").pack(),
                     durable=True)
store.close()
"""


def test_a_record_another_process_appends_between_held_steps(tmp_path):
    import subprocess
    import sys
    path = str(tmp_path / "s")
    store = durkv.open(path)
    m, _ = _model_calls()
    with store.run("r") as run:
        for i in range(20):
            run.step("model", m, i)
        subprocess.run([sys.executable, "-c", _OTHER_PROCESS, path], check=True)
        for i in range(20, 40):         # appended after catching up with the other's frame
            run.step("model", m, i)
        recs = store.journal("r")
        foreign = [i for i, r in enumerate(recs) if r.get("msg") == "from elsewhere"]
        assert len(foreign) == 1 and 0 < foreign[0] < len(recs) - 20
        own = [r for i, r in enumerate(recs) if i not in foreign]
        _assert_states_equal(fold("r", own), run._st)      # what this Run wrote, held
        run.refresh()                   # and the journal as it is, read again
        _assert_states_equal(fold("r", store.journal("r")), run._st)
        assert run.step("model", m, 5, key="x") == {"said": 5, "n": [1, 2]}
    store.close()


def test_index_add_holds_only_a_plain_first_record_of_its_step_id():
    from durkv._journalscan import index
    from durkv.payload import encode_record
    from durkv.store.records import K_JOURNAL

    def payload(rec):
        return encode_record(msgpack.packb([K_JOURNAL, "r", rec], use_bin_type=True))
    lazy = index(msgpack.packb([[K_JOURNAL, "r", HOSTILE[0]]], use_bin_type=True))[0]
    for r in HOSTILE:
        sid = r.get("s") if type(r) is dict else None
        want = _plain(r) and sid != "a"     # "a": the index holds a record of it already
        assert lazy.add(payload(r)) is want, r
        if want:
            x = lazy.get(sid)
            assert msgpack.unpackb(x[8], strict_map_key=False) == r
            assert x[:8] == (sid, r.get("fp", 0), r.get("k", "step"), r.get("n", ""),
                             r.get("pv"), r.get("in"), r.get("r"), r.get("t"))
    assert lazy.add(payload(HOSTILE[1])) is False       # held once: a second is folded
    for bad in (b"", b"\x05\0\0\0\x93\x0b\xa1r", payload(HOSTILE[0])[:-6] + b"\0\0\0\0"):
        with pytest.raises(ValueError):
            lazy.add(bad)
    with pytest.raises(TypeError):
        lazy.add(bytearray(payload(HOSTILE[0])))
    held = list(lazy)
    assert held == ["a"] + [r["s"] for r in HOSTILE[1:] if _plain(r)]


HOSTILE_VALUES = [(1, 2), [1, 2], 1, 1.0, True, 0.0, -0.0, float("nan"), "a", b"a",
                  bytearray(b"a"), {"b": 2, "a": 1}, 2 ** 63, 2 ** 64 - 1, 2 ** 64, -2 ** 63,
                  -2 ** 63 - 1, "\udc80x", {1: "a"}, None, [[[]]], "é", 1 << 40, _IntSub(3),
                  _StrSub("s"), _Colour.RED, datetime.date(2026, 12, 3), "x" * 300,
                  collections.OrderedDict(a=1), {"k": (1, [2, (3,)])}, math.inf, -1]


def _hostile_agent(run):
    out = []
    for i, v in enumerate(HOSTILE_VALUES):
        for args, result in (((v,), v), ((i,), [v, v]), ((v, i), {"r": v})):
            try:
                out.append(repr(run.step("h", lambda *a, _r=result: _r, *args)))
            except Exception as e:
                out.append(type(e).__name__)
    for i, v in enumerate(HOSTILE_VALUES):      # a replay of each in the same Run (key=)
        for _ in range(2):
            try:
                out.append(repr(run.step("h", lambda *a, _v=v: _v, v, key=f"h{i}")))
            except Exception as e:
                out.append(type(e).__name__)
    return out


def test_held_and_folded_steps_write_the_same_bytes_for_hostile_values(tmp_path, monkeypatch):
    got = {}
    for how in ("live", "eager"):
        with monkeypatch.context() as mp:
            if how == "eager":
                _eager_record_step(mp)
            with durkv.open(str(tmp_path / how)) as store:
                with store.run("r", clock=_clock()) as run:
                    out = _hostile_agent(run)
                    _assert_states_equal(fold("r", store.journal("r")), run._st)
                got[how] = out, bytes(store.journal_heads("r"))
                with store.run("r", clock=_clock()) as run:     # and replayed from the log
                    got[how] += (_hostile_agent(run),)
    assert got["live"][1] == got["eager"][1]        # the journal, byte for byte
    assert got["live"][0] == got["eager"][0] and got["live"][2] == got["eager"][2]
    assert "SerializationError" in got["live"][0]   # the lone surrogate, on both paths
