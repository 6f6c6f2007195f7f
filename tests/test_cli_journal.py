"""``durkv show STORE RUN`` prints a run's journal (text and --json)."""

from __future__ import annotations

import json

from click.testing import CliRunner

import durkv
from durkv.cli.main import cli


@durkv.tool(version="2")
def send(to, *, idempotency_key):
    return {"ok": to}


def _store(tmp_path):
    path = str(tmp_path / "s.durkv")
    with durkv.open(path) as s:
        with s.run("ticket-42", input={"t": 42}) as run:
            run.step("plan", lambda: "a plan", prompt_version="p7")
            run.tool(send, "a@b")
            run.approve("publish", {"x": 1})
        s.put("both", "", "1", checkpoint={}, metadata={}, values={"n": 1}, versions={"n": 1})
        with s.run("both") as run:
            run.step("x", lambda: 7)
    return path


def test_show_prints_the_journal(tmp_path):
    path = _store(tmp_path)
    r = CliRunner().invoke(cli, ["show", path, "ticket-42"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "run ticket-42: waiting (step 2), 3 journal entries"
    assert any(ln.split()[:4] == ["1", "tool", "send", "done"] for ln in lines)
    assert any(ln.split()[:4] == ["2", "approval", "publish", "pending"] for ln in lines)


def test_show_json_and_checkpoint_with_journal(tmp_path):
    path = _store(tmp_path)
    r = CliRunner().invoke(cli, ["show", "--json", path, "ticket-42"])
    doc = json.loads(r.output)
    assert doc["run"]["status"] == "waiting"
    assert [e["planned_action"] for e in doc["journal"]] == ["plan", "send", "publish"]
    assert doc["journal"][1]["idempotency_key"] == "ticket-42:1"
    r = CliRunner().invoke(cli, ["show", path, "both"])
    assert r.exit_code == 0 and "checkpoint_id:" in r.output and "run both: finished" in r.output
    r = CliRunner().invoke(cli, ["show", path, "nobody"])
    assert r.exit_code == 1 and "no thread 'nobody'" in r.output
