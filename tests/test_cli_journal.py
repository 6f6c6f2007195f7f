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
    assert any(ln.split()[:5] == ["0", "step", "plan", "p=p7", "done"] for ln in lines)
    assert any(ln.split()[:5] == ["1", "tool", "send", "t=2", "done"] for ln in lines)
    assert any(ln.split()[:5] == ["2", "approval", "publish", "-", "pending"] for ln in lines)


def test_the_journal_table_stays_aligned_with_langgraph_step_ids(tmp_path):
    """A step id of a call inside a LangGraph node is `<task uuid>:<n>` (38+ characters):
    the STEP column widens to it, so every column starts under its header."""
    path = str(tmp_path / "s.durkv")
    sid = "0a46480b-33fa-f0f3-b8f3-a45efaa708b5:12"
    with durkv.open(path) as s:
        with s.run("r") as run:
            run.step("model", lambda: 1, key=sid)
            run.step("plan", lambda: 2)
    r = CliRunner().invoke(cli, ["journal", path, "r"])
    assert r.exit_code == 0, r.output
    head, long, short = r.output.splitlines()[1:4]
    assert long.startswith(f"  {sid} ") and short.startswith("  0 ")
    for row in (long, short):
        assert row.index(" step ") + 1 == head.index("KIND")
        assert row.index(" done ") + 1 == head.index("STATE")


def test_show_json_and_checkpoint_with_journal(tmp_path):
    path = _store(tmp_path)
    r = CliRunner().invoke(cli, ["show", "--json", path, "ticket-42"])
    doc = json.loads(r.output)
    assert doc["run"]["status"] == "waiting"
    assert [e["planned_action"] for e in doc["journal"]] == ["plan", "send", "publish"]
    assert doc["journal"][1]["idempotency_key"] == "ticket-42:1"
    assert doc["checkpoint"] is None                 # ticket-42 has no checkpoint
    r = CliRunner().invoke(cli, ["show", path, "both"])
    assert r.exit_code == 0 and "checkpoint_id:" in r.output and "run both: finished" in r.output
    # --json of a run with a journal and a checkpoint: both, in one document
    r = CliRunner().invoke(cli, ["show", "--json", path, "both"])
    doc = json.loads(r.output)
    assert doc["run"]["status"] == "finished" and doc["journal"]
    with durkv.open(path) as s:
        newest = s.get("both")
    assert doc["checkpoint"]["checkpoint_id"] == newest.checkpoint_id
    assert doc["checkpoint"]["thread_id"] == "both"
    r = CliRunner().invoke(cli, ["show", path, "nobody"])
    assert r.exit_code == 1 and "no thread 'nobody'" in r.output


# ---- durkv verify / recover on a store with journals ---------------------------------------

CALLS = []


@durkv.tool(name="notify")
def notify(who, *, idempotency_key):
    CALLS.append(idempotency_key)
    return f"told {who}"


def _agent(path, who=("a", "b")):
    with durkv.open(path, index_every=0) as s, s.run("r", input=1) as run:
        return [run.tool(notify, w) for w in who]


def test_verify_and_recover_cover_journal_records(tmp_path):
    import logtools as lt

    path = str(tmp_path / "s.durkv")
    _agent(path)
    before = lt.segments(path)[-1]
    _agent(path, ("a", "b", "c"))          # replays a and b, calls c
    seg = lt.segments(path)[-1]
    new = [f for f in seg.frames if f.offset >= before.frames[-1].end]
    assert len(new) == 4                   # status running, intent c, receipt c, status
    r = CliRunner().invoke(cli, ["verify", "--deep", path])
    assert r.exit_code == 0, r.output

    # a crash while the receipt was being written: a torn tail in the journal
    lt.truncate(seg.path, new[2].offset + 5)
    r = CliRunner().invoke(cli, ["verify", path])
    assert r.exit_code == 3 and "durkv recover" in r.output
    r = CliRunner().invoke(cli, ["recover", path])
    assert r.exit_code == 0 and "torn_tail" in r.output, r.output
    assert CliRunner().invoke(cli, ["verify", "--deep", path]).exit_code == 0
    del CALLS[:]
    assert _agent(path, ("a", "b", "c")) == ["told a", "told b", "told c"]
    assert CALLS == ["r:2"]                # the intent survived: called again, same key
    with durkv.open(path) as s:
        assert [e.retry_count for e in s.run("r").journal()] == [0, 0, 1]

    # a flipped byte inside a journal record is corruption (exit 3), and names the fix
    lt.flip_byte(seg.path, new[1].offset + lt.FRAME_HDR + 3)
    r = CliRunner().invoke(cli, ["verify", path])
    assert r.exit_code == 3 and "recover --skip-corrupt" in r.output
