"""``durkv demo``: its printed figures checked against the evidence, read independently.

The demo runs as a real subprocess (its agents are its children, SIGKILLed for real);
the test then opens the store, folds the run journal and reads the outbox, the mail
service's request log and the model's bill itself, and compares.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import durkv
import logtools as lt
import pytest
from click.testing import CliRunner
from durkv.cli import cli
from durkv.cli.demo_agent import MailService
from durkv.runtime.view import describe

DEMO = [sys.executable, "-m", "durkv.cli", "demo"]


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False)

    return invoke


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_demo_figures_match_the_outbox_and_the_store(tmp_path):
    d = tmp_path / "demo"
    p = subprocess.run([*DEMO, str(d), "--steps", "40", "--crashes", "2", "--seed", "3",
                        "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    f = json.loads(p.stdout)          # stdout is one JSON document, nothing else
    assert f["ok"] is True and f["problems"] == [] and f["run_id"] == "support-1"

    with durkv.open(str(d / "agent.durkv"), read_only=True) as store:
        head = store.get("support-1")
        journal = describe(store, "support-1")
    assert head.metadata["step"] == f["steps"] == 40
    assert head.metadata["status"] == f["status"] == "finished"

    # crashes: each was a new agent process; the approver was yet another one
    assert f["crashes"] == len(f["kills"]) == 2
    assert len(set(f["agent_pids"])) == len(f["agent_pids"]) == 3
    [approval] = [e for e in journal if e.kind == "approval"]
    [approved] = f["approved"]
    assert approval.approval_status == "approved" and approved["step_id"] == approval.step_id
    assert approved["approver_pid"] not in f["agent_pids"]
    assert approved["agent_pid"] in f["agent_pids"]

    # tool calls vs effects: one email per receipt, keyed as durkv keyed the call
    outbox = _jsonl(d / "outbox.jsonl")
    keys = Counter(r["key"] for r in outbox)
    receipts = {e.idempotency_key for e in journal if e.kind == "tool" and e.state == "done"}
    s = f["send_email"]
    assert s["effects"] == len(outbox) == 10 and s["receipts"] == len(receipts) == 10
    assert s["duplicates"] == 0 == sum(n - 1 for n in keys.values())
    assert set(keys) == receipts and s["receipts_match_effects"] is True
    assert s["requests"] == len(_jsonl(d / "mail-requests.jsonl"))
    assert s["retried_with_same_key"] == sum(e.retry_count for e in journal if e.kind == "tool")

    # model calls: the bill against the journal's model steps
    bill = [line.split()[:3] for line in (d / "model-calls.log").read_text().splitlines()]
    model = [e for e in journal if e.planned_action == "model"]
    recorded = {(str(e.inputs[0][0]["id"]), e.inputs[0][1]) for e in model}
    assert f["model"]["calls_paid"] == len(bill) and f["model"]["model_steps"] == len(model)
    assert {(t, ph) for _, t, ph in bill} == recorded
    assert f["model"]["repaid"] == len(bill) - len({tuple(b) for b in bill})

    on_disk = sum(os.path.getsize(os.path.join(top, n))
                  for top, _, names in os.walk(d / "agent.durkv") for n in names)
    assert f["bytes_on_disk"] == on_disk > lt.total_bytes(d / "agent.durkv") > 0
    assert f["verify"]["ok"] is True
    assert f["steps_per_s"] > 0 and f"durkv journal {d / 'agent.durkv'} support-1" in f["next"]


def test_demo_in_a_temp_dir_tells_the_story(run, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = run("demo", "--steps", "8", "--crashes", "1", "--seed", "5")
    assert result.exit_code == 0, result.output
    [made] = tmp_path.glob("durkv-demo-*/agent.durkv")
    out = result.stdout
    for told in ("killed agent (pid", "resumed in pid", "a process of its own, while the agent", "duplicates: 0",
                 "crashes survived", "verify:       ok", f"durkv runs {made}"):
        assert told in out, out
    assert run("verify", made).exit_code == 0


def test_demo_again_in_its_directory_counts_only_its_own_run(run, tmp_path):
    d = tmp_path / "demo"
    first = run("demo", d, "--steps", "4", "--crashes", "0", "--json")
    second = run("demo", d, "--steps", "8", "--crashes", "0", "--json")
    assert first.exit_code == 0 and second.exit_code == 0, second.output
    f1, f2 = json.loads(first.stdout), json.loads(second.stdout)
    assert (f1["run_id"], f2["run_id"]) == ("support-1", "support-2")
    assert f2["send_email"]["effects"] == 2 and len(_jsonl(d / "outbox.jsonl")) == 3
    assert f2["model"]["calls_paid"] == 4 and f2["steps"] == 8


@pytest.mark.parametrize("args, says", [
    (["--steps", "0"], "--steps 0"),
    (["--steps", "10", "--crashes", "9"], "--crashes 9"),
    (["--crashes", "-1"], "--crashes -1"),
])
def test_demo_bad_options_are_one_line_exit_2(run, tmp_path, args, says):
    result = run("demo", tmp_path / "new", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {says}") and result.stderr.count("\n") == 1
    assert result.stdout == "" and not (tmp_path / "new").exists()


def test_demo_refuses_a_directory_that_is_not_its_own(run, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = run("demo", tmp_path)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_demo_refuses_a_store_as_its_directory(run, tmp_path):
    store = tmp_path / "agent.durkv"
    lt.make_log(store, 2)
    before = lt.total_bytes(store)
    result = run("demo", store)
    assert result.exit_code == 2 and "is a durkv store itself" in result.stderr
    assert lt.total_bytes(store) == before


def test_the_mail_service_sends_once_per_key(tmp_path):
    mail = MailService(tmp_path)
    a = mail.send("r:1", "a@b", "s", "body")
    again = MailService(tmp_path).send("r:1", "a@b", "s", "body")   # a new process, a retry
    assert again == a and len(_jsonl(tmp_path / "outbox.jsonl")) == 1
    assert len(_jsonl(tmp_path / "mail-requests.jsonl")) == 2


KILLED_AFTER_EFFECT = """
import os, signal, sys
from durkv.cli import demo_agent
send = demo_agent.MailService.send
def send_then_die(self, key, *args):
    out = send(self, key, *args)
    if key.endswith(":3:act:0:0"):      # the first email is out; its receipt is not
        os.kill(os.getpid(), signal.SIGKILL)
    return out
demo_agent.MailService.send = send_then_die
demo_agent.agent_main()
"""


def test_an_agent_killed_between_the_email_and_its_receipt_sends_it_once(tmp_path):
    """The windows the random kills rarely hit, hit on purpose: the resumed agent calls
    send_email again with the same key, and the mail service does not send twice; a
    frame torn by the kill is cut when the new process opens the store, and said."""
    argv = [str(tmp_path), "support-1", "8", "sync"]
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_EFFECT, *argv],
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL
    with durkv.open(str(tmp_path / "agent.durkv"), read_only=True) as store:
        [e] = [e for e in describe(store, "support-1") if e.kind == "tool"]
    assert e.state == "in_doubt" and e.idempotency_key == "support-1:3:act:0:0"
    # and as if the kill had also torn a frame it was writing: the next open cuts it
    lt.append_garbage(lt.segment_files(tmp_path / "agent.durkv")[-1], 100)

    resumed = subprocess.Popen([sys.executable, "-c", "from durkv.cli.demo_agent import "
                                "agent_main; agent_main()", *argv],
                               stdout=subprocess.PIPE, text=True)
    events = []
    for line in resumed.stdout:
        events.append(json.loads(line))
        if events[-1]["ev"] == "waiting":       # the refund ticket: approve, go on
            subprocess.run([sys.executable, "-c", "from durkv.cli.demo_agent import "
                            "approver_main; approver_main()", str(tmp_path), "support-1",
                            events[-1]["step_id"]], check=True, timeout=60)
    assert resumed.wait(timeout=60) == 0
    assert events[0]["ev"] == "start" and events[0]["torn_bytes"] == 100
    assert sum(p.stat().st_size for p in lt.quarantine_files(tmp_path / "agent.durkv")) == 100
    assert {"ev": "repeat", "pid": resumed.pid, "key": e.idempotency_key} in events
    outbox = [r["key"] for r in _jsonl(tmp_path / "outbox.jsonl")]
    assert outbox == ["support-1:3:act:0:0", "support-1:7:act:0:1"]   # 7:act:0:0: the approval
    requests = [r["key"] for r in _jsonl(tmp_path / "mail-requests.jsonl")]
    assert requests.count("support-1:3:act:0:0") == 2
    with durkv.open(str(tmp_path / "agent.durkv"), read_only=True) as store:
        tools = [e for e in describe(store, "support-1") if e.kind == "tool"]
    assert [(t.state, t.retry_count) for t in tools] == [("done", 1), ("done", 0)]
