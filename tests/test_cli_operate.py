"""The operator's commands (cli/operate.py) through click's CliRunner: ``durkv runs``,
``journal``, ``approve``, ``reject``, ``resolve`` -- their text, their ``--json``
(parsed: stdout holds one document and nothing else), and every refusal's one error
line and exit code (0 ok, 1 operational, 2 usage)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import durkv
from durkv.cli import cli


@durkv.tool(version="2")
def send(to, *, idempotency_key):
    return {"sent": to}


_IN_DOUBT = r"""
import os, signal, sys
import durkv
@durkv.tool(at_most_once=True, name="charge")
def charge(amount, *, idempotency_key):
    os.kill(os.getpid(), signal.SIGKILL)
with durkv.open(sys.argv[1]) as s:
    with s.run("pay") as run:
        run.step("quote", lambda: 5)
        run.tool(charge, 5)
"""


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A store with a run of each state: waiting (approval at step 2), finished,
    failed, sleeping, in doubt (a real SIGKILL inside an at-most-once tool)."""
    path = str(tmp_path_factory.mktemp("ops") / "s.durkv")
    with durkv.open(path) as s:
        with s.run("wait", input={"n": 1}) as run:
            run.step("plan", lambda: "the plan", prompt_version="v1")
            run.tool(send, "a@b")
            run.approve("refund", {"amount": 5})
        with s.run("fine") as run:
            run.step("x", lambda: 1)
        with pytest.raises(ValueError):
            with s.run("bad") as run:
                run.step("boom", lambda: (_ for _ in ()).throw(ValueError("no luck")))
        run = s.run("nap")      # a scheduler's durable sleep: mark, close unrecorded
        run.open()
        run.mark("sleeping", "0", until=time.time() + 3600)
        run.close(record=False)
    p = subprocess.run([sys.executable, "-c", _IN_DOUBT, path], capture_output=True)
    assert p.returncode == -signal.SIGKILL, p.stderr

    @durkv.tool(at_most_once=True, name="charge")
    def charge(amount, *, idempotency_key):
        raise AssertionError("in doubt: not called")

    with durkv.open(path) as s:     # the resumed run finds the call in doubt
        with pytest.raises(durkv.InDoubtError):
            with s.run("pay") as run:
                run.step("quote", lambda: 5)
                run.tool(charge, 5)
    return path


@pytest.fixture
def store(template, tmp_path):
    """A fresh copy of the template store for each test (decisions change it)."""
    dst = tmp_path / "s.durkv"
    dst.mkdir()
    for name in os.listdir(template):
        src = os.path.join(template, name)
        if os.path.isfile(src):
            with open(src, "rb") as f, open(dst / name, "wb") as g:
                g.write(f.read())
    return str(dst)


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def _json(r) -> dict:
    return json.loads(r.stdout)     # exactly one JSON document on stdout, nothing else


def _refused(r, code: int, text: str) -> None:
    assert r.exit_code == code, (r.exit_code, r.output)
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and text in err[0], err
    assert "Traceback" not in r.output


# ---- durkv runs ----------------------------------------------------------------------------

def test_runs_lists_every_run_with_its_state(store):
    r = invoke("runs", store)
    assert r.exit_code == 0, r.output
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:]}
    assert set(lines) == {"wait", "fine", "bad", "nap", "pay"}
    assert "approval of 'refund' at step 2" in lines["wait"]
    assert "tool 'charge' at step 1" in lines["pay"] and "in_doubt" in lines["pay"]
    assert "ValueError: no luck" in lines["bad"]
    assert " until 20" in lines["nap"]


def test_runs_json_and_status_filter(store):
    doc = _json(invoke("runs", "--json", store))
    by = {r["run_id"]: r for r in doc["runs"]}
    assert {k: v["status"] for k, v in by.items()} == {
        "wait": "waiting", "fine": "finished", "bad": "failed", "nap": "sleeping",
        "pay": "in_doubt"}
    w = by["wait"]
    assert (w["step"], w["action"], w["steps"], w["decided"]) == ("2", "refund", 3, None)
    assert by["pay"]["in_doubt"] == []      # its one call in doubt is its status's step
    assert all(r["bytes"] > 24 * 2 for r in doc["runs"])     # at least two frames each
    assert by["nap"]["until"] > by["nap"]["updated"] + 3000
    only = _json(invoke("runs", "--json", "--status", "waiting", store))["runs"]
    assert [r["run_id"] for r in only] == ["wait"]
    assert "no runs with status running" in invoke("runs", "--status", "running", store).stdout


def test_runs_shows_a_decision_not_acted_on_yet(store):
    assert invoke("approve", store, "wait", "2").exit_code == 0
    w = next(r for r in _json(invoke("runs", "--json", store))["runs"] if r["run_id"] == "wait")
    assert (w["status"], w["decided"]) == ("waiting", "approved")
    assert "approved, acted on when the run next runs" in invoke("runs", store).stdout


# ---- durkv journal -------------------------------------------------------------------------

def test_runs_names_the_calls_a_run_that_went_on_left_in_doubt(store):
    # the run catches InDoubtError and finishes: its status says finished, and the call
    # stays in doubt -- unpaid or paid twice -- until an operator resolves it
    @durkv.tool(at_most_once=True, name="charge")
    def charge(amount, *, idempotency_key):
        raise AssertionError("in doubt: not called")

    with durkv.open(store) as s, s.run("pay") as run:
        run.step("quote", lambda: 5)
        with pytest.raises(durkv.InDoubtError):
            run.tool(charge, 5)
        run.step("apologize", lambda: "sorry")
    pay = next(r for r in _json(invoke("runs", "--json", store))["runs"]
               if r["run_id"] == "pay")
    assert (pay["status"], pay["in_doubt"]) == ("finished",
                                                [{"step": "1", "action": "charge"}])
    line = next(ln for ln in invoke("runs", store).stdout.splitlines() if ln.startswith("pay"))
    assert "left in doubt (durkv resolve): tool 'charge' at step 1" in line
    assert invoke("resolve", store, "pay", "1", "--not-done").exit_code == 0
    pay = next(r for r in _json(invoke("runs", "--json", store))["runs"]
               if r["run_id"] == "pay")
    assert pay["in_doubt"] == [] and "left in doubt" not in invoke("runs", store).stdout


def test_journal_one_line_per_call(store):
    r = invoke("journal", store, "wait")
    assert r.exit_code == 0, r.output
    rows = [ln.split() for ln in r.stdout.splitlines()[3:]]
    assert rows[0][:5] == ["0", "step", "plan", "p=v1", "done"]
    assert rows[1][:5] == ["1", "tool", "send", "t=2", "done"] and '"a@b"}' in rows[1][-1]
    assert rows[2][:5] == ["2", "approval", "refund", "-", "pending"]


def test_journal_json_and_one_step_whole(store):
    doc = _json(invoke("journal", "--json", store, "pay"))
    assert doc["run"]["status"] == "in_doubt"
    assert [e["state"] for e in doc["journal"]] == ["done", "in_doubt"]
    assert doc["journal"][1]["idempotency_key"] == "pay:1"
    one = _json(invoke("journal", "--json", store, "wait", "--step", "2"))
    assert [e["inputs"] for e in one["journal"]] == [{"amount": 5}]
    text = invoke("journal", store, "wait", "--step", "2").stdout
    assert 'planned_action:     "refund"' in text and 'inputs:             {"amount": 5}' in text


def test_journal_refusals(store, tmp_path):
    _refused(invoke("journal", store, "nope"), 1, "no run 'nope'")
    _refused(invoke("journal", store, "wait", "--step", "9"), 1, "has no step '9'")
    _refused(invoke("journal", str(tmp_path / "none"), "wait"), 1, "no durkv log")
    r = invoke("journal", "--json", store, "nope")
    assert r.exit_code == 1 and _json(r)["error"] == "not_found"


# ---- durkv approve / reject ----------------------------------------------------------------

def test_approve_then_the_same_again_then_the_other_way(store):
    r = invoke("approve", "--json", store, "wait", "2", "--by", "alice", "--note", "ok")
    assert r.exit_code == 0, r.output
    d = _json(r)
    assert (d["approved"], d["by"], d["note"]) == (True, "alice", "ok")
    assert d["recorded_before"] is False
    again = _json(invoke("approve", "--json", store, "wait", "2", "--by", "bob"))
    assert (again["by"], again["decided_at"]) == ("alice", d["decided_at"])    # the recorded one
    assert again["recorded_before"] is True
    text = invoke("approve", store, "wait", "2").stdout
    assert text.startswith("run wait step 2: already approved by alice at ")
    _refused(invoke("reject", store, "wait", "2"), 1, "already approved by 'alice'")
    r = invoke("reject", "--json", store, "wait", "2")
    assert r.exit_code == 1 and _json(r)["error"] == "decision_conflict"
    with durkv.open(store) as s:         # the run acts on the recorded decision
        with s.run("wait", input={"n": 1}) as run:
            run.step("plan", lambda: "the plan", prompt_version="v1")
            run.tool(send, "a@b")
            assert run.approve("refund", {"amount": 5}).approved is True


def test_reject_text(store):
    r = invoke("reject", store, "wait", "2", "--by", "bob")
    assert r.exit_code == 0 and r.stdout.startswith("run wait step 2: rejected by bob at ")


def test_approve_refusals(store, tmp_path):
    _refused(invoke("approve", store, "nope", "2"), 1, "no run 'nope'")
    _refused(invoke("approve", store, "wait", "7"), 1, "has nothing at step '7'")
    _refused(invoke("approve", store, "wait", "1"), 1, "a tool ('send') at step '1', not an approval")
    _refused(invoke("reject", store, "pay", "1"), 1, "not an approval")
    _refused(invoke("approve", str(tmp_path / "none"), "wait", "2"), 1, "no durkv log")
    r = invoke("approve", "--json", store, "wait", "7")
    assert r.exit_code == 1 and _json(r)["error"] == "not_found"


# ---- durkv resolve -------------------------------------------------------------------------

def test_resolve_done_with_a_result_is_replayed(store):
    r = invoke("resolve", "--json", store, "pay", "1", "--done", "--result", '{"id": "ch_1"}')
    assert r.exit_code == 0, r.output
    assert _json(r) == {"run_id": "pay", "step_id": "1", "done": True,
                        "result": {"id": "ch_1"}, "by": None, "note": None}
    assert invoke("resolve", store, "pay", "1", "--done", "--result", '{"id": "ch_1"}'
                  ).exit_code == 0      # the same answer: a no-op
    _refused(invoke("resolve", store, "pay", "1", "--not-done"), 1, "already resolved as done")

    @durkv.tool(at_most_once=True, name="charge")
    def charge(amount, *, idempotency_key):
        raise AssertionError("resolved as done: never called again")

    with durkv.open(store) as s, s.run("pay") as run:
        assert run.step("quote", lambda: 5) == 5
        assert run.tool(charge, 5) == {"id": "ch_1"}
    assert "state" in invoke("journal", store, "pay", "--step", "1").stdout


def test_resolve_not_done_text(store):
    r = invoke("resolve", store, "pay", "1", "--not-done", "--by", "ops")
    assert r.exit_code == 0 and "resolved as not done" in r.stdout
    doc = _json(invoke("runs", "--json", store))
    assert next(x for x in doc["runs"] if x["run_id"] == "pay")["decided"] == "not done"


def test_resolve_refusals(store):
    _refused(invoke("resolve", store, "pay", "1"), 2, "--done (with --result JSON) or --not-done")
    _refused(invoke("resolve", store, "pay", "1", "--not-done", "--result", "1"), 2,
             "--result goes with --done")
    _refused(invoke("resolve", store, "pay", "1", "--done", "--result", "{x"), 2,
             "--result is not JSON")
    _refused(invoke("resolve", store, "nope", "1", "--done"), 1, "no run 'nope'")
    _refused(invoke("resolve", store, "wait", "2", "--done"), 1, "not a tool")
    _refused(invoke("resolve", store, "wait", "1", "--done"), 2, "has a receipt")
    r = invoke("resolve", "--json", store, "wait", "1", "--done")
    assert r.exit_code == 2 and _json(r)["error"] == "config"


def test_resolve_refuses_a_result_too_deep_or_infinite_in_one_line(store):
    # 3000 levels were a RecursionError traceback; 1e400 was stored as Infinity
    for deep in ("[" * 3000 + "]" * 3000, "[" * 201 + "]" * 201):
        _refused(invoke("resolve", store, "pay", "1", "--done", "--result", deep), 2,
                 "--result is nested more than 200 levels deep")
    for inf in ('{"n": 1e400}', "[-1e400]"):
        _refused(invoke("resolve", store, "pay", "1", "--done", "--result", inf), 2,
                 "beyond a float's range (it would be Infinity")
    _refused(invoke("resolve", store, "pay", "1", "--done", "--result", '{"n": NaN}'), 2,
             "NaN is not JSON")
    flat_enough = "[" * 200 + "1e300" + "]" * 200
    r = invoke("resolve", "--json", store, "pay", "1", "--done", "--result", flat_enough)
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("name", ["runs", "journal", "approve", "reject", "resolve"])
def test_help_has_an_example(name):
    r = invoke(name, "--help")
    assert r.exit_code == 0 and f"durkv {name} " in r.stdout.split("Example:", 1)[1]


_DRIVING = r"""
import sys, time
import durkv
with durkv.open(sys.argv[1]) as s:
    with s.run("busy") as run:
        run.step("first", lambda: 1)
        print("driving", flush=True)
        time.sleep(120)
"""


def test_runs_names_the_driving_process_and_says_when_a_running_run_has_none(tmp_path):
    """DRIVER: the pid of the process inside ``with store.run()`` (looked at without
    taking its lock: the driver is not disturbed); after a kill -9, a running run with
    no driver, which the text says stopped mid-run."""
    path = str(tmp_path / "s.durkv")
    child = subprocess.Popen([sys.executable, "-c", _DRIVING, path], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline() == "driving\n"
        for _ in range(3):      # looking never takes the claim from under the driver
            res = CliRunner().invoke(cli, ["runs", "--json", path])
            assert res.exit_code == 0, res.output
            (row,) = json.loads(res.stdout)["runs"]
            assert (row["run_id"], row["status"], row["driver"]) == ("busy", "running",
                                                                     child.pid)
        with durkv.open(path) as s, pytest.raises(durkv.RunBusyError, match=str(child.pid)):
            s.run("busy").__enter__()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    res = CliRunner().invoke(cli, ["runs", "--json", path])
    (row,) = json.loads(res.stdout)["runs"]
    assert (row["status"], row["driver"]) == ("running", None)
    text = CliRunner().invoke(cli, ["runs", path]).output
    assert "no driver: it stopped mid-run; run it again to resume" in text
    with durkv.open(path) as s:         # and it resumes: the recorded step replays
        with s.run("busy") as run:
            assert run.step("first", lambda: 2) == 1
    (row,) = json.loads(CliRunner().invoke(cli, ["runs", "--json", path]).stdout)["runs"]
    assert (row["status"], row["driver"]) == ("finished", None)


def test_runs_shows_every_approval_parallel_nodes_wait_for(tmp_path):
    """Two parallel durkv.Graph nodes each ask for an approval in one superstep. `durkv
    runs` named only the first; once it was decided, the run read "approved, acted on
    when the run next runs" while the other was still undecided (store.runs() too)."""
    path = str(tmp_path / "g.durkv")
    g = durkv.Graph({"log": durkv.Append()})

    def asker(name):
        def node(state, ctx):
            return {"log": [name + str(ctx.approve("go-" + name).approved)]}
        return node

    for name in ("a", "b"):
        g.add_node(name, asker(name))
        g.add_edge(durkv.START, name)
    with durkv.open(path) as store:
        r = g.compile(store).run({"log": []}, run_id="pc")
    steps = [p.step_id for p in r.waiting]
    assert len(steps) == 2

    def listed():
        out = CliRunner().invoke(cli, ["runs", path])
        doc = json.loads(CliRunner().invoke(cli, ["runs", "--json", path]).output)
        with durkv.open(path, read_only=True) as s:
            info = s.runs()[0]
        return out.output, doc["runs"][0], info

    text, doc, info = listed()
    assert "approval of 'go-a'" in text and "(and 1 more undecided)" in text
    assert [p["action"] for p in doc["pending"]] == ["go-a", "go-b"]
    assert CliRunner().invoke(cli, ["approve", path, "pc", steps[0]]).exit_code == 0
    text, doc, info = listed()
    assert "approval of 'go-b'" in text and "acted on" not in text
    assert doc["step"] == info.step == steps[1] and doc["decided"] is None
    assert [p["action"] for p in doc["pending"]] == ["go-b"]
    assert CliRunner().invoke(cli, ["reject", path, "pc", steps[1]]).exit_code == 0
    text, doc, _ = listed()
    assert doc["pending"] == [] and doc["decided"] is not None
    with durkv.open(path) as store:
        assert g.compile(store).run(None, run_id="pc").state == {"log": ["aTrue", "bFalse"]}
