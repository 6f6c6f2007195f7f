"""A repair that cuts journal records names the runs it touched and holds their tools
(issue 15 item 7; docs/GUARANTEES.md 16a, FORMAT.md 6a).

Real stores on the local C log: runs with tool receipts near the end, one byte flipped in
a frame mid-log (``logtools``), ``recover --skip-corrupt``, then the runs executed again.
Before the fix the at-most-once tool whose receipt was cut was simply called again.
"""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
from typing import Annotated

import logtools as lt
import pytest
from click.testing import CliRunner
from typing_extensions import TypedDict

import durkv
import durkv.log
from durkv.cli.main import cli
from durkv.store.records import K_COPY_JOURNAL, K_REPAIR, read_head
from storeinternals import backend_of, index_of

CALLS: list[tuple[str, str]] = []


class State(TypedDict):     # the LangGraph test's state
    log: Annotated[list, operator.add]


@durkv.tool(at_most_once=True)
def pay(amount, *, idempotency_key):
    CALLS.append(("pay", idempotency_key))
    return {"paid": amount}


@durkv.tool
def notify(to, *, idempotency_key):
    CALLS.append(("notify", idempotency_key))
    return f"sent to {to}"


def agent(run) -> tuple:
    plan = run.step("plan", lambda: "p")          # step 0
    return plan, run.tool(pay, 10), run.tool(notify, "ops")   # steps 1 and 2


def _build(d) -> int:
    """early (finished before the damage), victim (its pay INTENT is the damaged frame),
    late (all of it after the damage), thread t (a checkpoint after it). Returns the LSN
    of the damaged frame."""
    with durkv.open(str(d), segment_bytes=4096) as s:
        with s.run("early") as r:
            agent(r)
        with s.run("victim") as r:
            agent(r)
        with s.run("late") as r:
            agent(r)
        s.put("t", "", "0001", checkpoint={}, metadata={}, values={"n": 1}, versions={"n": 1})
        intent = index_of(s).ix.journals["victim"][2]     # RUN, STEP plan, INTENT pay
    CALLS.clear()
    seg, frame = lt.frame_at(d, intent)
    lt.flip_byte(seg.path, frame.offset + lt.FRAME_HDR + 3)
    return intent


@pytest.fixture(autouse=True)
def _no_calls_yet():
    CALLS.clear()


@pytest.fixture
def repaired(tmp_path):
    d = tmp_path / "s.durkv"
    lost = _build(d)
    rep = durkv.log.recover(str(d), skip_corrupt=True)
    assert rep.next_lsn == lost and rep.repair
    return d, rep.repair


def test_cut_receipts_are_in_doubt_not_called_again(repaired):
    d, rid = repaired
    with durkv.open(str(d)) as s:
        st = {i.run_id: i.status for i in s.runs()}
        assert st == {"early": "finished", "victim": "damaged", "late": "damaged"}
        for run_id in ("victim", "late"):
            for i in range(2):       # held however often it is executed
                with pytest.raises(durkv.InDoubtError,
                                   match=rf"store.resolve\('{run_id}', '1'") as ei:
                    with s.run(run_id) as r:
                        agent(r)
                assert (ei.value.context["step_id"], ei.value.context["key"]) == \
                    ("1", f"{run_id}:1")
                if i == 0:      # the first names the repair (then: an in-doubt intent)
                    assert rid in str(ei.value) and "acknowledge_repair" in str(ei.value)
        assert CALLS == []          # neither pay nor notify ran again
        with s.run("early") as r:   # untouched: replays, calls nothing
            assert agent(r) == ("p", {"paid": 10}, "sent to ops")
        with s.run("fresh") as r:   # a new run after the repair works as ever
            agent(r)
        assert CALLS == [("pay", "fresh:1"), ("notify", "fresh:2")]
        assert {i.run_id: i.status for i in s.runs()}["fresh"] == "finished"


def test_the_repair_record_names_runs_and_threads(repaired):
    d, rid = repaired
    note = json.loads((d / "repairs" / f"{rid}.json").read_text())
    assert note["state"] == "cut"
    with durkv.open(str(d)) as s:
        note = json.loads((d / "repairs" / f"{rid}.json").read_text())
        assert note["state"] == "recorded"
        assert (note["runs"], note["threads"]) == (["late", "victim"], ["t"])
        recs = [r for r in s.journal("victim") if r.get("e") == 20]
        assert len(recs) == 1 and recs[0]["rep"] == rid and recs[0]["named"] == ["late",
                                                                                  "victim"]
        assert not [r for r in s.journal("early") if r.get("e") == 20]
        lsn = note["repair_lsn"]
    with durkv.open(str(d)) as s:        # recorded once: a reopen appends no other
        assert [n for n, p in backend_of(s).scan(0) if read_head(p, n)[0] == K_REPAIR] == [lsn]
        assert [r["rep"] for r in s.journal("victim") if r.get("e") == 20] == [rid]


def test_resolve_then_acknowledge_lets_the_run_go_on(repaired):
    d, rid = repaired
    with durkv.open(str(d)) as s:
        with pytest.raises(durkv.InDoubtError):
            with s.run("victim") as r:
                agent(r)
        s.resolve("victim", "1", done=True, result={"paid": 10}, by="ops")   # it happened
        with pytest.raises(durkv.InDoubtError, match="notify") as ei:
            with s.run("victim") as r:
                agent(r)
        assert ei.value.context["key"] == "victim:2"     # idempotent: held too
        assert CALLS == []
        assert s.acknowledge_repair("victim", by="ops", note="checked") == [rid]
        assert s.acknowledge_repair("victim", by="ops") == []          # a no-op now
        with s.run("victim") as r:
            assert agent(r) == ("p", {"paid": 10}, "sent to ops")
        assert CALLS == [("notify", "victim:2")]         # once more, with its key
        assert {i.run_id: i.status for i in s.runs()}["victim"] == "finished"

        # late: acknowledged after its pay was held -> that at-most-once call stays in
        # doubt (its guard INTENT) until resolved; resolved not done, it is called
        with pytest.raises(durkv.InDoubtError):
            with s.run("late") as r:
                agent(r)
        s.acknowledge_repair("late", by="ops")
        with pytest.raises(durkv.InDoubtError, match=r"store.resolve\('late', '1'"):
            with s.run("late") as r:
                agent(r)
        s.resolve("late", "1", done=False, by="ops")
        with s.run("late") as r:
            agent(r)
        assert CALLS[1:] == [("pay", "late:1"), ("notify", "late:2")]
        with pytest.raises(durkv.NotFoundError, match="not touched"):
            s.acknowledge_repair("early")


def test_kill_after_the_cut_before_the_record_still_marks_the_runs(tmp_path):
    """A real SIGKILL right after recover returned: no store open recorded the cut; the
    note (written before the cut) makes the next open record it."""
    d = tmp_path / "s.durkv"
    _build(d)
    code = ("import os, signal, sys, durkv.log; "
            "durkv.log.recover(sys.argv[1], skip_corrupt=True); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    p = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, timeout=60)
    assert p.returncode == -9, p.stderr.decode()
    assert durkv.log.verify(str(d)).ok
    [note] = [json.loads(f.read_text()) for f in (d / "repairs").glob("*.json")]
    assert note["state"] == "cut" and note["files"]
    with durkv.open(str(d)) as s:
        assert {i.run_id: i.status for i in s.runs()} == \
            {"early": "finished", "victim": "damaged", "late": "damaged"}
        with pytest.raises(durkv.InDoubtError):
            with s.run("victim") as r:
                agent(r)
    assert CALLS == []


def test_a_planned_note_is_recorded_as_a_cut(tmp_path):
    """Killed after the note but before recover rewrote it (during the cut): the note is
    still `planned`; the next open counts whatever quarantine/ gained since as the cut."""
    d = tmp_path / "s.durkv"
    _build(d)
    plan = durkv.log.recover(str(d), skip_corrupt=True, dry_run=True)
    from durkv import repairnotes
    note = repairnotes.begin(str(d), plan)
    durkv.log._recover(str(d), True, False)     # the cut alone, as if killed after it
    assert repairnotes.read(str(d), note["id"])["state"] == "planned"
    with durkv.open(str(d)) as s:
        assert {i.run_id: i.status for i in s.runs()}["victim"] == "damaged"
    done = repairnotes.read(str(d), note["id"])
    assert (done["state"], done["runs"], done["threads"]) == \
        ("recorded", ["late", "victim"], ["t"])


def test_repair_record_survives_compaction_and_index_snapshots(repaired):
    d, rid = repaired
    with durkv.open(str(d)) as s:
        # a record of one touched run after the repair's: the copies keep every run's order
        s.append_journal("late", {"e": 8, "st": "running", "t": 0.0})
        before = {r: s.journal(r) for r in s.journal_runs()}
        s.compact()
        assert {r: s.journal(r) for r in before} == before
        b = backend_of(s)
        copies = [h[1] for h in (read_head(p, lsn) for lsn, p in b.scan(b.start_lsn))
                  if h[0] == K_COPY_JOURNAL and type(h[1]) is list]
        assert copies == [["late", "victim"]]       # the repair's record, copied once
    with durkv.open(str(d)) as s:
        assert {i.run_id: i.status for i in s.runs()}["victim"] == "damaged"
        with pytest.raises(durkv.InDoubtError, match=rid):
            with s.run("victim") as r:
                agent(r)
    assert CALLS == []


def test_cli_recover_names_the_touched_runs_and_acks(tmp_path):
    d = tmp_path / "s.durkv"
    _build(d)
    res = CliRunner().invoke(cli, ["recover", "--skip-corrupt", "--json", str(d)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["repair"]["runs"] == ["late", "victim"] and doc["repair"]["threads"] == ["t"]
    assert doc["repair"]["state"] == "recorded"
    res = CliRunner().invoke(cli, ["recover", "--skip-corrupt", str(d)])
    assert res.exit_code == 0 and "marked damaged" not in res.output    # twice: a no-op
    res = CliRunner().invoke(cli, ["recover", str(d), "--ack", "victim", "--by", "ops"])
    assert res.exit_code == 0 and f"repair {doc['repair']['id']} acknowledged" in res.output
    res = CliRunner().invoke(cli, ["recover", str(d), "--ack", "early"])
    assert res.exit_code == 1 and "not touched" in res.output
    with durkv.open(str(d)) as s:
        assert {i.run_id: i.status for i in s.runs()}["victim"] != "damaged"


def test_a_store_never_repaired_reads_no_journal_for_it(tmp_path):
    """The hot path: without a repair note a run's open reads nothing more and its tool
    calls test one attribute."""
    d = tmp_path / "s.durkv"
    with durkv.open(str(d)) as s:
        assert not s.repaired and not os.path.exists(d / "repairs")
        with s.run("r") as r:
            agent(r)
            assert r._repair is None


def test_a_langgraph_thread_touched_by_a_repair_holds_its_tools(tmp_path):
    """durkv.langgraph.tool in a thread whose receipt was cut: the node runs again from
    the surviving checkpoint, and the tool is held in doubt instead of charging twice."""
    pytest.importorskip("langgraph")
    from langgraph.graph import END, START, StateGraph

    from durkv.langgraph import DurkvSaver
    from durkv.langgraph import tool as lg_tool

    def node(state):
        return {"log": [lg_tool(pay, 10)["paid"]]}

    g = StateGraph(State)
    g.add_node("act", node)
    g.add_edge(START, "act")
    g.add_edge("act", END)
    path, cfg = tmp_path / "lg.durkv", {"configurable": {"thread_id": "th-1"}}
    with DurkvSaver.open(str(path)) as saver:
        assert g.compile(checkpointer=saver).invoke({"log": []}, cfg)["log"] == [10]
        s = saver.store
        lsns = index_of(s).ix.journals["th-1"]
        intent = next(n for n, r in zip(lsns, s.journal("th-1")) if r.get("e") == 3)
    assert [c[0] for c in CALLS] == ["pay"]
    CALLS.clear()
    seg, frame = lt.frame_at(path, intent)
    lt.flip_byte(seg.path, frame.offset + lt.FRAME_HDR + 3)
    rep = durkv.log.recover(str(path), skip_corrupt=True)
    with DurkvSaver.open(str(path)) as saver:
        note = json.loads((path / "repairs" / f"{rep.repair}.json").read_text())
        assert "th-1" in note["runs"] and "th-1" in note["threads"]
        with pytest.raises(durkv.InDoubtError, match=rep.repair):
            g.compile(checkpointer=saver).invoke(None, cfg)
    assert CALLS == []


def test_killed_between_the_record_and_the_note_records_it_again_as_one_repair(repaired):
    """The REPAIR record is durable before the note says `recorded`; a kill between the
    two makes the next open append it again: the same id, one repair to the runtime."""
    d, rid = repaired
    from durkv import repairnotes
    with durkv.open(str(d)):
        pass
    note = repairnotes.read(str(d), rid)
    repairnotes.write(str(d), dict(note, state="cut"))    # the note as the kill left it
    with durkv.open(str(d)) as s:
        assert len([n for n, p in backend_of(s).scan(0) if read_head(p, n)[0] == K_REPAIR]) == 2
        assert s.acknowledge_repair("victim", by="ops") == [rid]
        with pytest.raises(durkv.InDoubtError, match=r"store.resolve\('late', '1'"):
            with s.run("late") as r:
                agent(r)
        with s.run("victim") as r:       # one acknowledgement covers both records
            agent(r)
    assert CALLS == [("pay", "victim:1"), ("notify", "victim:2")]


def test_async_tools_of_a_damaged_run_are_held_too(repaired):
    import asyncio
    d, rid = repaired

    async def main(s):
        async with s.arun("victim") as r:
            await r.astep("plan", lambda: "p")
            await r.atool(pay, 10)

    with durkv.open(str(d)) as s:
        with pytest.raises(durkv.InDoubtError, match=rid):
            asyncio.run(main(s))
    assert CALLS == []


def test_a_cut_inside_the_copies_of_the_compaction_the_log_begins_with(tmp_path):
    # damage inside a compaction's copies, the log starting with that compaction: the cut
    # quarantined the newest segment, whose header alone held the raised start_lsn, so
    # recover left a store that did not open (missing_segment); a second recover opened
    # it empty -- every run and thread the compaction had copied was gone, unnamed, and
    # an at-most-once tool of an intact run paid again
    import glob

    d = str(tmp_path / "s.durkv")
    paid = []

    @durkv.tool(name="pay_once", at_most_once=True)
    def pay_once(amount, *, idempotency_key):
        paid.append(idempotency_key)
        return "ok"

    def job(store, rid):
        with store.run(rid) as run:
            run.step("plan", lambda: f"plan for {rid} " + "z" * 200)
            run.tool(pay_once, 100)

    with durkv.open(d) as s:
        for i in range(30):
            s.put("dead", "", f"{i:06d}", checkpoint={}, metadata={}, values={"v": "x" * 300},
                  versions={"v": i})
        s.delete_thread("dead")
        for rid in ("r1", "r2", "r3"):
            job(s, rid)
        s.compact()
        for i in range(40):
            s.put("later", "", f"{i:06d}", checkpoint={}, metadata={}, values={"i": i},
                  versions={"i": i})
    victim = sorted(glob.glob(d + "/*.seg"))[-2]     # the copies
    raw = bytearray(open(victim, "rb").read())
    raw[raw.rfind(b"plan for r3")] ^= 0xFF
    open(victim, "wb").write(raw)
    r = CliRunner().invoke(cli, ["recover", "--skip-corrupt", d])
    assert r.exit_code == 0, r.output                  # the first recover leaves it whole
    assert durkv.log.verify(d).ok
    with durkv.open(d) as s:
        runs = {x.run_id: x.status for x in s.runs()}
        assert runs == {"r1": "finished", "r2": "finished", "r3": "damaged"}
        job(s, "r1")                                    # replayed: not paid again
    assert paid == ["r1:1", "r2:1", "r3:1"]
