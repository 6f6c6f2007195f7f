"""A replay gives back what was recorded (issue 15 items 3, 8 and 9).

- A recorded value replays as an equal value of the same type, or is refused when it
  is recorded (before the step counts as done), naming its type and path.
- Fingerprints are canonical: set order (the hash seed), dict order and keyword order
  never make a false conflict; values of other types never match.
- A recorded failure replays as its own exception class.

Crash and hash-seed claims run in real subprocesses (each script is written next to
its store).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import datetime as dt
import enum
import json
import operator
import os
import signal
import subprocess
import sys
import textwrap
import threading
import zoneinfo
from typing import Annotated, NamedTuple

import pytest
from samevalue import same
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from typing_extensions import TypedDict

import durkv
from durkv.errors import (
    ApprovalMismatchError, IdempotencyConflictError, RunConflictError, SerializationError,
)
from durkv.runtime.journal import E_RUN, E_STEP

NY = zoneinfo.ZoneInfo("America/New_York")


class Mode(enum.Enum):
    EMAIL = "email"
    PAGE = "page"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Span(NamedTuple):
    start: int
    end: int


class Bag(dict):
    pass


VALUES = [
    Mode.PAGE, Level.HIGH, Span(1, 2), collections.Counter("aab"),
    collections.defaultdict(list, {"k": [1]}), collections.OrderedDict(b=1, a=2),
    bytearray(b"ab"), dt.datetime(2026, 3, 7, 12, tzinfo=NY),
    {"nested": [Mode.EMAIL, (Level.LOW, Span(3, 4))], "when": dt.datetime(2026, 1, 1, tzinfo=NY)},
]


def _env(*paths):
    # the caller's PYTHONPATH too, when it has one (a source tree on it); CI has none
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, paths), *inherited])}


# ---- item 3: a replayed value is the recorded value -------------------------------------

@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_step_tool_and_approval_values_replay_as_the_same_type(tmp_path, value):
    path = str(tmp_path / "s.durkv")
    calls = []

    @durkv.tool(name="fetch")
    def fetch(*, idempotency_key):
        calls.append("tool")
        return value

    def model():
        calls.append("step")
        return value

    got = []
    for _ in range(2):          # the second execution (a reopened store) replays
        with durkv.open(path) as s, s.run("r") as run:
            got.append((run.step("m", model), run.tool(fetch)))
            if len(got) == 1:
                with pytest.raises(durkv.Interrupted):
                    run.approve("send", value)
            else:
                assert run.journal()[2].inputs is not None
                same(value, run.journal()[2].inputs)
    assert calls == ["step", "tool"]
    for first, replayed in zip(got[0], got[1]):
        same(first, replayed)


# The case: a step picks a channel, the run branches on it, the process dies
# after the step; the resumed run must take the branch the first execution took.
AGENT = textwrap.dedent('''
    import enum, os, signal, sys
    import durkv

    class Channel(enum.Enum):
        EMAIL = "email"
        PAGE = "page"

    @durkv.tool(name="notify")
    def notify(how, *, idempotency_key):
        with open(sys.argv[2], "a") as f:
            f.write(how + "\\n")
        return how

    with durkv.open(sys.argv[1]) as s, s.run("incident") as run:
        channel = run.step("triage", lambda: Channel.PAGE)
        if os.environ.get("DIE_AFTER_STEP"):
            os.kill(os.getpid(), signal.SIGKILL)
        if channel is Channel.PAGE:
            run.tool(notify, "page")
        else:
            run.tool(notify, "email")
''')


def test_a_resumed_run_after_a_kill_takes_the_branch_the_first_execution_took(tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    store, effects = str(tmp_path / "s.durkv"), str(tmp_path / "effects")
    first = subprocess.run([sys.executable, str(script), store, effects],
                           env={**_env(), "DIE_AFTER_STEP": "1"})
    assert first.returncode == -signal.SIGKILL
    subprocess.run([sys.executable, str(script), store, effects], env=_env(), check=True)
    assert open(effects).read().split() == ["page"]


def test_an_unfaithful_step_result_is_refused_before_it_counts_as_done(url):
    calls = []

    def model():
        calls.append(1)
        return {"ok": [1, Bag(a=1)]}

    with durkv.open(url) as s:
        for _ in range(2):
            with pytest.raises(SerializationError) as ei, s.run("r") as run:
                run.step("m", model)
            msg = str(ei.value)
            assert "Bag" in msg and "['ok'][1]" in msg and "will run again" in msg
        assert calls == [1, 1]                     # nothing was recorded: it ran again
        assert not [r for r in s.journal("r") if r["e"] == E_STEP]


def test_an_unfaithful_tool_result_says_the_call_happened_and_what_to_do(url):
    @durkv.tool(name="create")
    def create(*, idempotency_key):
        return [Bag(id=7)]

    with durkv.open(url) as s:
        with pytest.raises(SerializationError) as ei, s.run("r") as run:
            run.tool(create)
    msg = str(ei.value)
    assert "Bag" in msg and "[0]" in msg and "the call happened" in msg
    assert "same key (r:0)" in msg


class LgState(TypedDict):
    log: Annotated[list, operator.add]


def _lg_graph(saver, node):
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(LgState)
    g.add_node("act", node)
    g.add_edge(START, "act")
    g.add_edge("act", END)
    return g.compile(checkpointer=saver)


LG_KEPT = [Mode.PAGE, Level.HIGH, Span(1, 2), bytearray(b"ab"), {"s": {1, 2}}, frozenset({"a"})]
LG_REFUSED = [((1, 2), "tuple", "list"), (collections.Counter("aab"), "Counter", "dict"),
              (collections.OrderedDict(b=1), "OrderedDict", "dict"),
              (dt.datetime(2026, 3, 7, 12, tzinfo=NY), "datetime", "zone")]


@pytest.mark.parametrize("value", LG_KEPT + [v for v, _, _ in LG_REFUSED],
                         ids=lambda v: type(v).__name__)
def test_langgraph_step_results_replay_as_the_same_type_or_are_refused(tmp_path, value):
    """Through DurkvSaver the journal uses LangGraph's JsonPlusSerializer: what it keeps
    (Enum, namedtuple, bytearray, sets) replays as itself; what it changes (a tuple
    becomes a list, a Counter a dict, a zoned datetime a fixed offset) is refused when
    the step records it, naming the type."""
    pytest.importorskip("langgraph")
    from durkv.langgraph import DurkvSaver
    from durkv.langgraph import step as lg_step

    calls, seen = [], []
    crash = {"armed": True}

    def node(state):
        v = lg_step("pick", lambda: calls.append(1) or value)
        seen.append(v)
        if crash["armed"]:
            crash["armed"] = False
            raise RuntimeError("crash")
        return {"log": ["done"]}

    path = str(tmp_path / "lg.durkv")
    cfg = {"configurable": {"thread_id": "t"}}
    refused = next(((k, how) for v, k, how in LG_REFUSED if v is value), None)
    with DurkvSaver.open(path) as saver:
        if refused is not None:
            with pytest.raises(SerializationError) as ei:
                _lg_graph(saver, node).invoke({"log": []}, cfg)
            assert refused[0] in str(ei.value) and refused[1] in str(ei.value)
            return
        with pytest.raises(RuntimeError):
            _lg_graph(saver, node).invoke({"log": []}, cfg)
    with DurkvSaver.open(path) as saver:      # the node runs again: the step replays
        _lg_graph(saver, node).invoke(None, cfg)
    assert len(calls) == 1 and len(seen) == 2
    same(seen[0], seen[1])
    same(value, seen[1])


# ---- item 8: fingerprints are canonical --------------------------------------------------

SEEDED = textwrap.dedent('''
    import sys
    import durkv

    tags = {f"tag-{i}" for i in range(40)}
    calls = []
    with durkv.open(sys.argv[1]) as s:
        with s.run("r", input={"tags": tags, "n": 1}) as run:
            out = run.step("classify", lambda t, **kw: calls.append(1) or sorted(t)[:2],
                           tags, opts={"b": frozenset(tags), "a": 1})
            d = run.approve("publish", {"labels": tags})
            print("order", ",".join(list(tags)[:5]))
            print("calls", len(calls), "approved", d.approved)
''')


def test_a_set_fingerprints_the_same_under_every_hash_seed(tmp_path):
    """A run whose input, step input and approval payload hold sets of strings is created
    under one PYTHONHASHSEED, decided, and resumed under two others: no false conflict,
    the step is not called again, the decision is found."""
    script = tmp_path / "seeded.py"
    script.write_text(SEEDED)
    store = str(tmp_path / "s.durkv")

    def execute(seed):
        return subprocess.run([sys.executable, str(script), store], capture_output=True,
                              text=True, env={**_env(), "PYTHONHASHSEED": str(seed)})

    first = execute(1)
    assert first.returncode == 0, first.stderr     # paused at the approval (Interrupted)
    with durkv.open(store) as s:
        s.decide("r", "1", True)
    orders = set()
    for seed in (2, 3):
        out = execute(seed)
        assert out.returncode == 0, out.stderr
        lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
        assert lines["calls"] == "0 approved True"
        orders.add(lines["order"])
    assert len(orders) == 2          # the seeds really iterate the set in other orders


def test_dict_order_and_keyword_order_do_not_conflict(url):
    calls = []

    def f(*a, **kw):
        calls.append(1)
        return "ok"

    with durkv.open(url) as s:
        with s.run("r", input={"a": 1, "b": {"x": 1, "y": 2}}) as run:
            run.step("s", f, {"q": 1, "ctx": [1, {"m": 2, "k": 3}]}, model="m", temp=0)
            with pytest.raises(durkv.Interrupted):
                run.approve("go", {"to": "x", "cc": collections.Counter(a=1, b=2)})
        s.decide("r", "1", True)
        with s.run("r", input={"b": {"y": 2, "x": 1}, "a": 1}) as run:
            run.step("s", f, {"ctx": [1, {"k": 3, "m": 2}], "q": 1}, temp=0, model="m")
            assert run.approve("go", {"cc": collections.Counter(b=2, a=1), "to": "x"}).approved
    assert calls == [1]


@pytest.mark.parametrize("first, second", [
    (1, 1.0), (1, True), (1, "1"), (0, False), ([1], (1,)), ({1}, frozenset({1})),
    ({"a": 1}, collections.OrderedDict(a=1)), (Mode.PAGE, "page"), (Level.HIGH, 2),
    (collections.OrderedDict(a=1, b=2), collections.OrderedDict(b=2, a=1)),
    ({"k": 1, 2: "v"}, {"k": 1, "2": "v"}), (b"ab", bytearray(b"ab")),
])
def test_values_of_another_type_never_share_a_fingerprint(url, first, second):
    with durkv.open(url) as s:
        with s.run("r") as run:
            run.step("s", lambda v: "ok", first)
        with pytest.raises(IdempotencyConflictError), s.run("r") as run:
            run.step("s", lambda v: "ok", second)
        with pytest.raises(RunConflictError):
            with s.run("i", input=first):
                pass
            with s.run("i", input=second):
                pass
        with s.run("a") as run:          # pauses: the with ends quietly, waiting
            run.approve("go", first)
        assert run.status == "waiting"
        s.decide("a", "0", True)
        with pytest.raises(ApprovalMismatchError), s.run("a") as run:
            run.approve("go", second)


def test_a_run_recorded_with_the_old_fingerprints_still_resumes(url):
    """Records written before fingerprints were canonical hashed the serde bytes as
    given (a two-key dict in its insertion order): such a run still replays."""
    with durkv.open(url) as s:
        inp = {"b": 1, "a": 2}
        step_in = s.serde.dumps([[{"q": 1, "ctx": 2}], {"model": "m", "temp": 0}])
        old = xxhash.xxh3_64_intdigest
        s.append_journal("r", {"e": E_RUN, "t": 1.0, "fp": old(s.serde.dumps(inp)),
                               "in": s.serde.dumps(inp)})
        s.append_journal("r", {"e": E_STEP, "t": 1.0, "s": "0", "k": "step", "n": "plan",
                               "fp": old(step_in), "in": step_in, "r": s.serde.dumps("P")})
        with s.run("r", input={"b": 1, "a": 2}) as run:
            assert run.step("plan", lambda *a, **k: 1 / 0, {"q": 1, "ctx": 2},
                            model="m", temp=0) == "P"


def test_fingerprint_stays_cheap_for_plain_inputs():
    """The hot path (no set, no two-key dict) fingerprints the bytes it stores: no second
    encoding (the benchmark in bench/test_bench_journal.py measures the rest)."""
    from durkv.runtime.values import Values
    from durkv.serde import default_serde

    v = Values(default_serde)
    b, fp = v.encode([[7, "prompt"], {"k": 1}])
    assert fp == xxhash.xxh3_64_intdigest(b)
    assert v.encode([[{"b": 1, "a": 2}], {}])[1] == v.encode([[{"a": 2, "b": 1}], {}])[1]


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**63, max_value=2**64 - 1)
    | st.floats() | st.text() | st.binary(),
    lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=30)

any_value = st.recursive(
    json_like | st.integers() | st.sampled_from([Mode.PAGE, Level.LOW]) | st.binary().map(bytearray)
    | st.datetimes(timezones=st.just(NY)),
    lambda c: st.lists(c) | st.tuples(c, c) | st.builds(Span, c, c)
    | st.dictionaries(st.text() | st.integers() | st.tuples(st.text()), c)
    | st.frozensets(st.text() | st.integers()) | st.sets(st.text() | st.integers())
    | st.dictionaries(st.text(), c).map(collections.OrderedDict)
    | st.dictionaries(st.text(), st.integers()).map(collections.Counter)
    | st.dictionaries(st.text(), c).map(lambda d: collections.defaultdict(list, d)),
    max_leaves=25)


def _reordered(v):
    """The same value built in another order: dict entries and set items reversed."""
    t = type(v)
    if t in (dict, collections.Counter, collections.defaultdict):
        out = t() if t is not collections.defaultdict else t(v.default_factory)
        for k in reversed(list(v)):
            dict.__setitem__(out, _reordered(k), _reordered(v[k]))
        return out
    if t is collections.OrderedDict:
        return t((_reordered(k), _reordered(x)) for k, x in v.items())
    if t in (set, frozenset):
        return t(reversed([_reordered(x) for x in v]))
    if t is list:
        return [_reordered(x) for x in v]
    if t is tuple or t is Span:
        items = [_reordered(x) for x in v]
        return tuple(items) if t is tuple else Span(*items)
    return v


@settings(max_examples=300, deadline=None)
@given(json_like)
def test_the_c_sort_and_the_python_walk_fingerprint_alike(value):
    """JSON-like data is sorted by ormsgpack in C when it is installed; every other value
    by the walk: both must give the bytes the walk gives."""
    from durkv.runtime.values import Values
    from durkv.serde import default_serde

    v = Values(default_serde)
    assert v.encode(value)[1] == v.canonical(value) == v.encode(_reordered(value))[1]


@settings(max_examples=300, deadline=None)
@given(any_value)
def test_a_value_built_in_another_order_fingerprints_the_same(value):
    from durkv.runtime.values import Values
    from durkv.serde import default_serde

    v = Values(default_serde)
    assert v.encode(value)[1] == v.encode(_reordered(value))[1] == v.canonical(value)


def test_fingerprints_are_canonical_under_the_langgraph_serde():
    """Through DurkvSaver the store serde is LangGraph's: containers are still sorted by
    durkv, and what only LangGraph encodes (a message) is fingerprinted by its bytes."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from durkv.langgraph_serde import LangGraphSerde
    from durkv.runtime.values import Values

    v = Values(LangGraphSerde(JsonPlusSerializer()))
    msgs = [AIMessage(content="hi", id="m1")]
    one = v.encode([[{"tags": {"s", "t", "u"}, "msgs": msgs}], {"k": 1, "j": 2}])[1]
    two = v.encode([[{"msgs": msgs, "tags": {"u", "t", "s"}}], {"j": 2, "k": 1}])[1]
    other = v.encode([[{"msgs": [AIMessage(content="ho", id="m1")], "tags": {"s", "t", "u"}}],
                      {"k": 1, "j": 2}])[1]
    assert one == two != other


# ---- item 9: a recorded failure replays as its own class --------------------------------

class CodeError(Exception):
    """An exception whose __init__ takes other arguments than its args."""

    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")
        self.code = code


class Unencodable(ValueError):
    pass


def _json_fail():
    json.loads("{bad json")


def _code_fail():
    raise CodeError(404, "no such order")


def _unencodable_fail():
    raise Unencodable(threading.Lock(), "lock held")


FAILURES = [(_json_fail, json.JSONDecodeError, ValueError),
            (_code_fail, CodeError, CodeError),
            (_unencodable_fail, Unencodable, ValueError)]


@durkv.tool(name="failing")
def _failing(which, *, idempotency_key):
    FAILURES[which][0]()


def _call(run, verb, which):
    fn = FAILURES[which][0]
    if verb == "step":
        return run.step("s", fn)
    if verb == "tool":
        return run.tool(_failing, which)
    if verb == "astep":
        return asyncio.run(run.astep("s", fn))
    return asyncio.run(run.atool(_failing, which))


@pytest.mark.parametrize("verb", ["step", "tool", "astep", "atool"])
@pytest.mark.parametrize("which", range(len(FAILURES)), ids=["json", "init", "unencodable"])
def test_a_recorded_failure_replays_as_its_own_class(url, verb, which):
    """Each execution of the run catches the failure with the except clause that caught
    the first one; the run finishes, and a re-execution of the finished run does too."""
    _, cls, catch = FAILURES[which]
    caught = []
    with durkv.open(url) as s:
        for _ in range(3):
            with s.run("r") as run:
                try:
                    _call(run, verb, which)
                except catch as e:
                    caught.append(e)
            assert run.status == "finished"
    assert [type(e) for e in caught] == [cls] * 3
    assert len({str(e) for e in caught}) == 1
    if cls is json.JSONDecodeError:
        assert {(e.doc, e.pos, e.msg) for e in caught} == {("{bad json", 1, caught[0].msg)}
    if cls is CodeError:
        assert {e.code for e in caught} == {404} and str(caught[1]) == "404: no such order"


ERR_MODULE = "class Boom(ValueError):\n    pass\n"
ERR_AGENT = textwrap.dedent('''
    import sys
    import durkv

    def fail():
        import durkv_test_err_mod
        raise durkv_test_err_mod.Boom("boom", 3)

    with durkv.open(sys.argv[1]) as s, s.run("r") as run:
        before = "durkv_test_err_mod" in sys.modules
        try:
            run.step("s", fail)
        except ValueError as e:
            print(before, type(e).__module__, type(e).__name__, e.args)
        except durkv.StepFailedError as e:
            print(before, "StepFailedError", e)
''')


def test_a_failure_of_a_class_not_imported_yet_is_rebuilt_and_a_gone_one_is_named(tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "durkv_test_err_mod.py").write_text(ERR_MODULE)
    script = tmp_path / "agent.py"
    script.write_text(ERR_AGENT)
    store = str(tmp_path / "s.durkv")

    def execute():
        return subprocess.run([sys.executable, str(script), store], env=_env(mods),
                              capture_output=True, text=True, check=True).stdout.strip()

    assert execute() == "False durkv_test_err_mod Boom ('boom', 3)"      # the call
    assert execute() == "False durkv_test_err_mod Boom ('boom', 3)"      # the replay imports it
    (mods / "durkv_test_err_mod.py").unlink()
    out = execute()
    assert out.startswith("False StepFailedError") and "durkv_test_err_mod.Boom" in out
    assert "cannot be found here" in out


# exception groups are Python 3.11's: the tests run where they exist
ExceptionGroup = getattr(builtins, "ExceptionGroup", None)
needs_groups = pytest.mark.skipif(ExceptionGroup is None, reason="Python 3.11+")


def _group_fail():
    raise ExceptionGroup("fetch", [ConnectionError("host 0 down"), CodeError(404, "gone"),
                                   ExceptionGroup("inner", [ValueError("v")])])


async def _task_group_fail():
    async def one(i):
        raise ConnectionError(f"host {i} down")

    async with asyncio.TaskGroup() as tg:
        for i in range(2):
            tg.create_task(one(i))


@needs_groups
@pytest.mark.parametrize("verb", ["step", "astep"])
def test_an_exception_group_replays_as_a_group_of_its_own_classes(url, verb):
    """A TaskGroup's failure (an ExceptionGroup: its args hold exceptions) once replayed
    as a TypeError from BaseException.__new__: an ``except*`` took another branch. (The
    test splits the group as ``except* ConnectionError`` would.)"""
    caught = []
    with durkv.open(url) as s:
        for _ in range(3):
            with s.run("r") as run:
                try:
                    if verb == "step":
                        run.step("s", _group_fail)
                    else:
                        asyncio.run(run.astep("s", _task_group_fail))
                except ExceptionGroup as eg:
                    caught.append(eg)
            assert run.status == "finished"
    assert len(caught) == 3
    for eg in caught:
        assert type(eg) is ExceptionGroup
        matched, rest = eg.split(ConnectionError)
        assert [type(x) for x in matched.exceptions] == [ConnectionError] * (
            1 if verb == "step" else 2)
        assert (rest is None) == (verb == "astep")
    if verb == "step":
        g = caught[-1]
        assert g.message == "fetch" and str(g) == "fetch (3 sub-exceptions)"
        assert [type(x) for x in g.exceptions] == [ConnectionError, CodeError, ExceptionGroup]
        assert g.exceptions[1].code == 404 and str(g.exceptions[1]) == "404: gone"
        assert [type(x) for x in g.exceptions[2].exceptions] == [ValueError]


@needs_groups
def test_a_group_recorded_without_its_sub_exceptions_replays_as_step_failed(url, monkeypatch):
    """Records written before groups were kept (no ``g``): a StepFailedError naming the
    group, never another class."""
    from durkv.runtime.values import Values
    error = Values.error

    def old_error(self, exc):
        err = error(self, exc)
        more = self.loads(err[3])
        more.pop("g", None), more.pop("gm", None)
        return err[:3] + [self.dumps(more)]

    with durkv.open(url) as s:
        monkeypatch.setattr(Values, "error", old_error)
        with pytest.raises(ExceptionGroup), s.run("r") as run:
            run.step("s", _group_fail)
        monkeypatch.undo()
        with pytest.raises(durkv.StepFailedError, match="ExceptionGroup: fetch"), \
                s.run("r") as run:
            run.step("s", _group_fail)


def test_a_resolved_result_is_refused_when_it_would_replay_as_another_type(tmp_path):
    """store.resolve(done=True, result=...) is checked as a receipt is: under LangGraph's
    serde a tuple would come back a list."""
    from durkv.langgraph import DurkvSaver
    calls = []

    @durkv.tool(at_most_once=True, name="pay")
    def pay(amount, *, idempotency_key):
        calls.append(idempotency_key)
        raise KeyboardInterrupt     # the process stops inside the call: no receipt

    with DurkvSaver.open(str(tmp_path / "lg.durkv")) as saver:
        store = saver.store
        with pytest.raises(KeyboardInterrupt), store.run("r") as run:
            run.tool(pay, 10)
        with pytest.raises(durkv.InDoubtError), store.run("r") as run:
            run.tool(pay, 10)
        with pytest.raises(SerializationError, match="tuple .*reads back as a list"):
            store.resolve("r", "0", done=True, result=("paid", 10))
        store.resolve("r", "0", done=True, result=["paid", 10])
        with store.run("r") as run:
            got = run.tool(pay, 10)
        assert got == ["paid", 10] and type(got) is list and len(calls) == 1


@pytest.mark.parametrize("verb", ["step", "tool", "astep", "atool"])
def test_a_retry_that_is_not_a_retry_is_refused_before_anything_is_journaled(url, verb):
    calls = []

    @durkv.tool(name="charge")
    def charge(*, idempotency_key):
        calls.append(idempotency_key)
        raise RuntimeError("declined")

    def fails():
        calls.append("step")
        raise RuntimeError("down")

    with durkv.open(url) as s:
        with s.run("r") as run:
            with pytest.raises(durkv.ConfigError, match="retry= must be a durkv.Retry"):
                if verb == "step":
                    run.step("s", fails, retry=3)
                elif verb == "tool":
                    run.tool(charge, retry=3)
                elif verb == "astep":
                    asyncio.run(run.astep("s", fails, retry=3))
                else:
                    asyncio.run(run.atool(charge, retry=3))
            assert calls == []
            assert run.step("after", lambda: "ok") == "ok"
        assert [r["e"] for r in s.journal("r")].count(E_STEP) == 1
        with s.run("r") as run:      # the refused call took no step id: this replays
            assert run.step("after", lambda: "again") == "ok"


@pytest.mark.parametrize("call", [
    "step-none", "step-tuple", "step-int", "step-not-callable", "astep-none", "approve-int",
    "aapprove-none", "step-surrogate", "approve-surrogate"])
def test_a_name_that_is_not_text_is_refused_before_anything_is_journaled(tmp_path, call):
    """A step's name or an approval's action is journaled as text: `run.step(None, f)`
    was recorded, and the same code's next execution met `step ''` and stopped with a
    NonDeterminismError (the run could never resume); a tuple name broke `durkv journal`.
    `run.step("s", 5)` failed with a raw TypeError. Each is now a ConfigError first."""
    from durkv.runtime.view import describe

    calls = []

    def f(*a):
        calls.append(a)
        return 1

    kind, _, arg = call.partition("-")
    bad = {"none": None, "tuple": ("plan", 1), "int": 123, "surrogate": "a\ud800"}.get(arg)
    path = str(tmp_path / "s")
    for _ in range(2):      # the refusal is the same, and the run goes on after it
        with durkv.open(path) as s, s.run("r") as run:
            with pytest.raises(durkv.ConfigError, match="must be|lone surrogate"):
                if call == "step-not-callable":
                    run.step("s", 5)
                elif kind == "step":
                    run.step(bad, f, 1)
                elif kind == "astep":
                    asyncio.run(run.astep(bad, f, 1))
                elif kind == "approve":
                    run.approve(bad, {"x": 1})
                else:
                    asyncio.run(run.aapprove(bad))
            assert run.step("after", f, 0) == 1        # replayed the second time
        with durkv.open(path) as s:
            assert [e.planned_action for e in describe(s, "r")] == ["after"]
    assert calls == [(0,)]


def test_a_run_recorded_before_fold_codes_replays_its_fold_1_inputs(tmp_path, monkeypatch):
    """A step input holding a fold=1 datetime was written as ext code 4 (fold dropped)
    before codes 18/19; with them its bytes changed and so did its fingerprint, so the
    run met an IdempotencyConflictError on upgrade. Fingerprints encode such values
    without their fold, as before (FORMAT.md 5a)."""
    import msgpack as _msgpack

    from durkv import serde as serde_mod

    at = dt.datetime(2026, 11, 1, 1, 30, fold=1)
    path = str(tmp_path / "s")
    calls = []

    def model(when):
        calls.append(when)
        return "answer"

    legacy = lambda self, obj: _msgpack.ExtType(4, obj.isoformat().encode())  # noqa: E731
    with monkeypatch.context() as m:                   # the durkv that recorded it
        m.setattr(serde_mod.MsgpackSerde, "_datetime", legacy)
        with durkv.open(path) as s, s.run("r") as run:
            run.step("plan", model, {"at": at})
            run.approve("send")
    with durkv.open(path) as s, s.run("r") as run:    # today's durkv replays it
        assert run.step("plan", model, {"at": at}) == "answer"
    assert len(calls) == 1


class _Response:                    # a client library's response object: no serde stores it
    def __init__(self, status):
        self.status = status


class _RateLimited(Exception):
    def __init__(self, response):
        super().__init__("rate limited")
        self.response = response
        self.status = response.status


def test_an_exception_attribute_that_does_not_serialize_is_absent_on_replay(url, caplog):
    # live, e.response is the client's object; on replay the class was re-called with its
    # args ("rate limited"), not its __init__'s, and e.response held the message string
    def call():
        raise _RateLimited(_Response(429))

    def agent(run):
        try:
            run.step("model", call)
        except _RateLimited as e:
            return e

    with durkv.open(url) as s:
        with caplog.at_level("WARNING", logger="durkv"), s.run("r") as run:
            live = agent(run)
        assert live.response.status == 429 and "without its attribute(s) response" in caplog.text
        with s.run("r") as run:
            replayed = agent(run)
        assert type(replayed) is _RateLimited and str(replayed) == "rate limited"
        assert replayed.status == 429                   # what serializes is kept
        assert not hasattr(replayed, "response")        # never the message string
