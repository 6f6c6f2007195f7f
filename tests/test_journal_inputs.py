"""A step's inputs recorded once per item, the rest by reference (issue 20, FORMAT.md 5a ``ir``).

An agent passes its growing message list to its model step every turn: the journal must
grow by the new messages (record sizes that do not grow with the history), rebuild every
record's inputs exactly (``Run.journal``, ``durkv show``), keep the fingerprint of the
whole value (old journals replay), and detect a changed input as before. Real stores,
real serdes (durkv's and LangGraph's), a real SIGKILL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import msgpack
import pytest
from click.testing import CliRunner

import durkv
from durkv.cli.main import cli
from durkv.runtime.inputs import SMALL_INPUTS
from durkv.runtime.values import Values
from durkv.runtime.view import UnreadableInputs

FIXTURES = Path(__file__).parent / "fixtures"
TEXT = "observe the result, plan the next call, keep the goal in view. " * 3


def _msg(i: int, role: str) -> dict:
    return {"role": role, "i": i, "text": f"{role} {i}: {TEXT}"}


def _reply(history: list, temperature: float = 0.0) -> dict:
    return _msg(len(history), "ai")


def _agent(run, turns: int, calls: list | None = None) -> list:
    """A model step on the whole history, then a tool message appended, ``turns`` times."""
    history = [_msg(0, "user")]
    for i in range(turns):
        ai = run.step("model", lambda h, **kw: (calls.append(len(h)) if calls is not None
                                                else None) or _reply(h, **kw),
                      history, temperature=0.5)
        history = history + [ai, _msg(i, "tool")]
    return history


def _steps(store, run_id: str) -> list[dict]:
    return [r for r in store.journal(run_id) if r["e"] == 2]


def _old_fingerprint(store, history: list) -> str:
    """The fingerprint as the runtime computed it before items: the canonical encoding of
    the whole value ``[args, kwargs]``, walked in one piece."""
    return f"{Values(store.serde).canonical([[history], {'temperature': 0.5}]):016x}"


# ---- a growing list: linear bytes, exact inputs, the same fingerprint --------------------


def test_a_growing_history_costs_its_new_items_and_reads_back_whole(url):
    with durkv.open(url) as s:
        with s.run("r") as run:
            _agent(run, 40)
        sizes = [len(msgpack.packb(r, use_bin_type=True)) for r in _steps(s, "r")]
        # the history grows by ~300 bytes a turn; a record whole would grow with it
        assert max(sizes[5:]) - min(sizes[5:]) < 64, sizes
        assert sizes[-1] < 2 * len(msgpack.packb([_msg(0, "ai"), _msg(0, "tool")])) + 300
        assert all("ir" in r for r in _steps(s, "r")[5:])
        entries = run.journal()
        history = [_msg(0, "user")]
        for i, e in enumerate(entries):
            assert e.inputs == [[history], {"temperature": 0.5}], i
            assert e.inputs_fingerprint == _old_fingerprint(s, history)
            history = history + [_reply(history), _msg(i, "tool")]


def test_the_items_a_record_shares_are_found_by_content_not_identity(url):
    """The base is what the previous record holds: an item changed in the middle is new
    bytes from there on (the next records refer to the changed record)."""
    with durkv.open(url) as s:
        h = [_msg(i, "user") for i in range(12)]
        with s.run("r") as run:
            run.step("model", _reply, h)
            h2 = [*h[:5], _msg(99, "edited"), *h[6:], _msg(12, "user")]
            run.step("model", _reply, h2)
            run.step("model", _reply, h2 + [_msg(13, "user")])
        ir1, ir2 = (r["ir"] for r in _steps(s, "r")[1:])
        assert ir1[1] == ["0", 0, 5] and len(ir1[2]) == 9       # 5 shared, 8 items + kwargs
        assert ir2[1] == ["1", 0, 13] and len(ir2[2]) == 2
        assert [e.inputs for e in run.journal()] == [[[h], {}], [[h2], {}],
                                                     [[h2 + [_msg(13, "user")]], {}]]


def test_a_replay_detects_an_item_changed_in_the_middle(url):
    with durkv.open(url) as s:
        with s.run("r") as run:
            history = _agent(run, 6)
        with s.run("r") as run:      # the same code: every step replays
            assert _agent(run, 6, calls := []) == history and calls == []
        with pytest.raises(durkv.IdempotencyConflictError):
            with s.run("r") as run:
                h = [_msg(0, "user")]
                for i in range(6):
                    if i == 4:
                        h[1] = {**h[1], "text": "rewritten"}       # not an append
                    ai = run.step("model", _reply, h, temperature=0.5)
                    h = h + [ai, _msg(i, "tool")]


def test_durkv_show_prints_the_inputs_rebuilt(tmp_path):
    path = str(tmp_path / "s.durkv")
    with durkv.open(path) as s:
        with s.run("r") as run:
            history = _agent(run, 8)
    r = CliRunner().invoke(cli, ["show", "--json", path, "r"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["journal"][-1]["inputs"] == [[history[:-2]], {"temperature": 0.5}]


def test_small_inputs_are_written_whole_as_before(url):
    """Below SMALL_INPUTS (default serde) a record keeps ``in``: the bytes older versions
    write and read (tests/test_runtime_records.py pins them frame for frame)."""
    with durkv.open(url) as s:
        with s.run("r") as run:
            for i in range(3):
                run.step("plan", str.upper, "hi" * i)
        assert all("in" in r and "ir" not in r for r in _steps(s, "r"))
        assert len(msgpack.packb([["hi" * 2], {}])) < SMALL_INPUTS


def test_secret_and_too_large_inputs_keep_no_items_and_break_the_chain(url):
    big = "x" * (70 << 10)
    with durkv.open(url) as s:
        h = [_msg(i, "user") for i in range(8)]
        calls = [h, h + [big], h + [big, "more"], h + [_msg(8, "user")],
                 h + [_msg(8, "user"), _msg(9, "user")], h + [_msg(8, "user")] * 3]
        with s.run("r") as run:
            for i, c in enumerate(calls):
                run.step("model", _reply, c, secret=i == 4)
        recs = _steps(s, "r")
        kept = [("in" if "in" in r else "") + ("ir" if "ir" in r else "") for r in recs]
        # new bytes over 64 KiB: nothing kept, and nothing to refer to after it; a secret
        # record keeps nothing either
        assert kept == ["in", "", "", "in", "", "in"]
        assert [e.inputs for e in run.journal()] == [
            [[c], {}] if k else None for c, k in zip(calls, kept)]


def test_inputs_by_reference_survive_compaction_and_a_copy(url):
    with durkv.open(url) as s:
        with s.run("r") as run:
            history = _agent(run, 12)
        want = [e.inputs for e in run.journal()]
        assert want[-1] == [[history[:-2]], {"temperature": 0.5}]
        s.compact()
        s.copy_thread("r", "r2")
        for rid in ("r", "r2"):
            assert [e.inputs for e in durkv.runtime.view.describe(s, rid)] == want
            with s.run(rid) as run:
                assert _agent(run, 12, calls := []) == history and calls == []


def test_threads_calling_one_step_name_refer_only_to_records_already_written(url):
    """Steps with key= from several threads share the writer's memory: a record refers
    only to a record appended before it, so every input rebuilds (whichever thread's
    record it shares items with)."""
    import threading

    common = [_msg(i, "system") for i in range(6)]
    passed: dict[str, list] = {}
    with durkv.open(url) as s:
        with s.run("r") as run:
            def worker(w):
                h = list(common)
                for i in range(25):
                    key = f"w{w}-{i}"
                    passed[key] = [[list(h)], {}]
                    h.append(run.step("model", _reply, h, key=key))
            threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        got = {e.step_id: e.inputs for e in run.journal()}
        assert got == passed
        assert sum("ir" in r for r in _steps(s, "r")) > 50


@pytest.mark.parametrize("serde", ["default", "langgraph"])
def test_a_resumed_run_refers_to_the_history_recorded_before(tmp_path, serde):
    """A new execution (a new process, a restarted agent) replays the recorded turns and
    its first new record refers to the last one recorded before, not to nothing: a long
    conversation resumed is not journaled whole (nor, over 64 KiB, by fingerprint only)."""
    kw = {}
    if serde == "langgraph":
        pytest.importorskip("langgraph")
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

        from durkv.langgraph_serde import LangGraphSerde
        kw["serde"] = LangGraphSerde(JsonPlusSerializer())
    with durkv.open(str(tmp_path / "s.durkv"), **kw) as s:
        with s.run("r") as run:
            _agent(run, 10)
        with s.run("r") as run:
            history = _agent(run, 14, calls := [])
        assert calls == [21, 23, 25, 27]           # four new turns after ten replayed
        recs = _steps(s, "r")
        assert recs[10]["ir"][1] == ["9", 0, 19]    # the new tool message, then new items
        assert [e.inputs for e in run.journal()][-1] == [[history[:-2]], {"temperature": 0.5}]


# ---- LangGraph's serde: messages, results referred to by content --------------------------


def test_langgraph_messages_by_reference_and_the_same_fingerprint(tmp_path):
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from durkv.langgraph_serde import LangGraphSerde

    def model(msgs):
        return AIMessage(content=f"turn {len(msgs)}: {TEXT}", id=f"ai-{len(msgs)}",
                         tool_calls=[{"name": "t", "args": {"q": len(msgs)}, "id": f"c{len(msgs)}"}])

    def turns(run, n):
        msgs = [HumanMessage(content="find it", id="h0")]
        for i in range(n):
            ai = run.step("model", model, msgs)
            msgs = msgs + [ai, ToolMessage(content=f"result {i}: {TEXT}", tool_call_id=f"c{i}",
                                           id=f"t{i}")]
        return msgs

    with durkv.open(str(tmp_path / "s.durkv"), serde=LangGraphSerde(JsonPlusSerializer())) as s:
        with s.run("r") as run:
            msgs = turns(run, 20)
        recs = _steps(s, "r")
        # after the first turn: the previous record's items, the previous result (the AI
        # message, by reference to that step's `r`: [g], the base's step), and the new
        # tool message and kwargs
        for i, r in enumerate(recs[1:], 1):
            shape, base, new = r["ir"]
            assert base == [str(i - 1), 0, 2 * i - 1] and new[0] == [0], i
            assert [type(x) for x in new[1:]] == [bytes, bytes]
        v = Values(s.serde)
        for i, e in enumerate(run.journal()):
            assert e.inputs == [[msgs[:2 * i + 1]], {}]
            assert e.inputs_fingerprint == f"{v.canonical([[msgs[:2 * i + 1]], {}]):016x}"
        with s.run("r") as run:
            assert turns(run, 20) == msgs       # replays: no conflict, same results


def test_langgraph_messages_changed_in_place_are_new_inputs_and_fingerprint_whole(tmp_path):
    """The canonical encodings of the items a record shares with its base are taken from
    the base (their bytes were compared): a message mutated in place in the history --
    the same object passed again -- is new bytes, a new fingerprint, a conflict on replay;
    and every fingerprint is the whole value's, computed in one piece."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from durkv.langgraph_serde import LangGraphSerde

    def model(msgs):
        return AIMessage(content=f"turn {len(msgs)}", id=f"ai-{len(msgs)}")

    def turns(run, n, edit=None):
        msgs = [HumanMessage(content=f"q{i}: {TEXT}", id=f"h{i}") for i in range(3)]
        for i in range(n):
            if i == edit:
                msgs[1].content = "rewritten in place"        # the same object
            if i == edit + 1 if edit is not None else False:
                msgs[2].additional_kwargs["k"] = (1, 2)       # a tuple: the serializer's path
            msgs.append(run.step("model", model, msgs))       # the same list, grown
        return msgs

    with durkv.open(str(tmp_path / "s.durkv"), serde=LangGraphSerde(JsonPlusSerializer())) as s:
        with s.run("r") as run:
            msgs = turns(run, 8, edit=4)
        v = Values(s.serde)
        entries = list(run.journal())
        for e in entries:
            assert e.inputs_fingerprint == f"{v.canonical(e.inputs):016x}"
        fps = [e.inputs_fingerprint for e in entries]
        assert len(set(fps)) == 8
        # the record after the edit shares only the item before it
        assert _steps(s, "r")[4]["ir"][1] == ["3", 0, 1]
        assert entries[4].inputs[0][0][1].content == "rewritten in place"
        assert msgs[1].content == "rewritten in place"
        with pytest.raises(durkv.IdempotencyConflictError):
            with s.run("r") as run:
                turns(run, 8, edit=5)        # the edit one turn later: turn 4 differs


# ---- journals written before items, a lost base, a kill ----------------------------------


def test_a_journal_written_before_items_replays_without_conflict(tmp_path):
    d = tmp_path / "old"
    shutil.copytree(FIXTURES / "journal-2ea939e", d)
    sys.path.insert(0, str(FIXTURES))
    try:
        import make_journal_store as old
    finally:
        sys.path.remove(str(FIXTURES))
    with durkv.open(str(d)) as s:
        before = len(s.journal("agent"))
        with s.run("agent", input={"user": "ann"}) as run:
            decision = old.agent(run)       # every call replays; the approval is decided
        assert decision.approved
        news = s.journal("agent")[before:]
        assert {r["e"] for r in news} == {8}, news     # only STATUS records: nothing called


def test_a_record_whose_base_is_not_in_the_journal_reads_as_unreadable(url):
    """A record that refers to a step the journal does not hold (its records cut by a
    repair) rebuilds no inputs -- never a partial value -- and its fingerprint still
    decides a replay."""
    with durkv.open(url) as s:
        h = [_msg(i, "user") for i in range(10)]
        with s.run("src") as run:
            run.step("model", _reply, h)
            run.step("model", _reply, h + [_msg(10, "user")])
        rec = _steps(s, "src")[1]
        rec["ir"][1][0] = "7"           # the base: a step id this run never recorded
        rec["s"] = "0"
        s.append_journal("cut", {"e": 1, "t": 1.0, "fp": None, "tid": 1})
        s.append_journal("cut", rec)
        (e,) = durkv.runtime.view.describe(s, "cut")
        assert isinstance(e.inputs, UnreadableInputs) and "step 7" in repr(e.inputs)
        with s.run("cut") as run:       # the same input: replays by fingerprint
            assert run.step("model", lambda _: 1 / 0, h + [_msg(10, "user")]) == _reply(
                h + [_msg(10, "user")])
        with pytest.raises(durkv.IdempotencyConflictError), s.run("cut") as run:
            run.step("model", _reply, h)
    if not url.startswith("memory"):
        r = CliRunner().invoke(cli, ["show", "--json", url, "cut"])
        assert r.exit_code == 0 and "step 7" in json.dumps(json.loads(r.output)["journal"][0]
                                                          ["inputs"]), r.output


class Stop(BaseException):
    """Ends a call without a receipt (as a kill would), in this process."""


def test_a_tool_called_again_refers_to_its_own_earlier_intent(url):
    """An intent without a receipt, called again by the same Run (LangGraph's cached Run
    does this): the new INTENT of the same step and generation refers to the one before
    it, which the reader resolves as the journal stood at the new record."""
    calls = []

    @durkv.tool(name="send")
    def send(batch, *, idempotency_key):
        calls.append(len(batch))
        if len(calls) == 2:
            raise Stop
        return len(batch)

    batch = [_msg(i, "mail") for i in range(10)]
    with durkv.open(url) as s:
        run = s.run("r").attach()
        run.tool(send, batch[:9], key="a")
        with pytest.raises(Stop):
            run.tool(send, batch, key="b")
        assert run.tool(send, batch, key="b") == 10
        intents = [r for r in s.journal("r") if r["e"] == 3]
        assert [r["s"] for r in intents] == ["a", "b", "b"]
        assert intents[1]["ir"][1] == ["a", 0, 9]
        assert intents[2]["ir"][1] == ["b", 0, 11] and intents[2]["ir"][2] == []
        assert [e.inputs for e in run.journal()] == [[[batch[:9]], {}], [[batch], {}]]


_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import durkv, test_journal_inputs as t
    with durkv.open({path!r}, durability="sync") as s:
        with s.run("r") as run:
            h = [t._msg(0, "user")]
            for i in range(10_000):
                ai = run.step("model", t._reply, h, temperature=0.5)
                h = h + [ai, t._msg(i, "tool")]
                if i == 5:
                    print("ready", flush=True)
""")


def test_a_kill_between_records_leaves_every_recorded_input_readable(tmp_path):
    path = str(tmp_path / "s.durkv")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(tests=str(Path(__file__).parent), path=path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    with durkv.open(path) as s:
        entries = durkv.runtime.view.describe(s, "r")
        assert len(entries) > 5
        h = [_msg(0, "user")]
        for i, e in enumerate(entries):
            assert e.inputs == [[h], {"temperature": 0.5}], i
            h = h + [_reply(h), _msg(i, "tool")]
        with s.run("r") as run:         # a re-execution replays them all, then goes on
            _agent(run, len(entries) + 2, calls := [])
        assert len(calls) == 2


def test_a_result_of_the_base_step_is_named_by_its_generation_alone():
    """``[g]`` names a result of the base's own step (FORMAT.md 5a): rebuilt from that
    step's record like ``[s, g]``; without a base, or a generation the journal lacks, the
    inputs are unreadable (never partial)."""
    from durkv.runtime.inputs import ByRef, Unreadable, by_ref

    class Entry:
        def __init__(self, inputs, result):
            self.inputs, self.result = inputs, result

    entries = {("a", 0): Entry(b"in-a", b"res-a0"), ("b", 1): Entry(None, b"res-b1")}

    def find(s, g):
        return entries.get((s, g))

    x = by_ref([[2], ["a", 0, 1], [[0], ["b", 1]]], find)     # 2 list items + kwargs
    assert x.base == b"in-a" and x.k == 1 and x.new == [b"res-a0", b"res-b1"]
    gone = by_ref([[2], ["a", 0, 1], [[5], b"z"]], find)      # a generation not recorded
    assert isinstance(gone.new[0], Unreadable) and "step a generation 5" in str(gone.new[0])
    baseless = by_ref([[1], None, [[0]]], find)                # [g] needs a base
    assert type(baseless) is ByRef and isinstance(baseless.base, Unreadable)
    assert "malformed" in str(baseless.base)
