"""``durkv runs/journal/approve/reject`` on a live ``s3://`` store while its one writer
drives the run (the decision goes through a decision object, FORMAT.md 13)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from durkv.cli import cli

CHILD = str(Path(__file__).resolve().parents[1] / "decide_child.py")


def _runs(url: str) -> dict:
    r = CliRunner().invoke(cli, ["runs", "--json", url])
    assert r.exit_code == 0, r.output
    return {x["run_id"]: x for x in json.loads(r.stdout)["runs"]}


def test_approve_and_reject_on_s3_while_the_writer_drives_the_run(s3_env, bucket, tmp_path):
    url = f"s3://{bucket}/ops?decision_poll_ms=50"
    outbox = tmp_path / "outbox"
    agent = subprocess.Popen([sys.executable, CHILD, "agent", url, str(outbox), "a,b"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=os.environ.copy())
    try:
        assert {agent.stdout.readline().split()[1] for _ in range(2)} == {"a", "b"}
        deadline = time.monotonic() + 30
        while {r["status"] for r in _runs(url).values()} != {"waiting"}:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        j = CliRunner().invoke(cli, ["journal", "--json", url, "a"])
        assert json.loads(j.stdout)["journal"][0]["approval_status"] == "pending"
        ok = CliRunner().invoke(cli, ["approve", "--json", url, "a", "0", "--by", "alice"])
        assert ok.exit_code == 0, ok.output
        assert json.loads(ok.stdout)["approved"] is True
        no = CliRunner().invoke(cli, ["reject", url, "b", "0"])
        assert no.exit_code == 0 and "rejected" in no.stdout, no.output
        clash = CliRunner().invoke(cli, ["reject", url, "a", "0"])
        assert clash.exit_code == 1 and "already approved by 'alice'" in clash.stderr
        out, err = agent.communicate(timeout=60)
        assert agent.returncode == 0, err[-3000:]
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert {ln.split()[1]: ln.split()[2] for ln in out.splitlines() if ln.startswith("done")
            } == {"a": "True", "b": "False"}
    assert sorted(json.loads(x)[2] for x in outbox.read_text().splitlines()) == [False, True]
