"""``durkv ls/history/show`` on a store written with LangGraph's ``EncryptedSerializer``
(issue 15, item 20).

The command has no key. It used to end in a 45-line traceback (``NotImplementedError:
Unknown serialization type: msgpack+aes``), with ``--json`` too. Now it lists what is
readable -- thread and checkpoint ids, parents, versions, times (from the checkpoint ids,
LangGraph's time-based UUIDs), channel names and the size of every encrypted value --
and says once, in one line on stderr, that the values need the key. ``--json`` stays one
strict JSON document on stdout; an encrypted value is a ``$encrypted`` marker.
"""

from __future__ import annotations

import datetime as dt
import json
import operator
import subprocess
import sys
from pathlib import Path
from typing import Annotated, TypedDict

import pytest
from click.testing import CliRunner

from durkv.cli import cli

pytest.importorskip("Crypto")   # pycryptodome: EncryptedSerializer.from_pycryptodome_aes

KEY = b"0123456789abcdef"
SECRET = "hunter2-top-secret"


def _refuse(token: str):
    raise ValueError(f"not strict JSON: {token}")


def strict_loads(text: str):
    return json.loads(text, parse_constant=_refuse)


class _State(TypedDict):
    msgs: Annotated[list, operator.add]


def _encrypted():
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    return EncryptedSerializer.from_pycryptodome_aes(key=KEY)


@pytest.fixture(scope="module")
def enc_store(tmp_path_factory):
    """Two threads run by a real graph through DurkvSaver with an encrypting serde, and
    what the saver (which has the key) lists: {thread: [(id, parent, ts), newest first]}."""
    from langgraph.graph import END, START, StateGraph

    from durkv.langgraph import DurkvSaver

    g = StateGraph(_State)
    g.add_node("think", lambda s: {"msgs": [f"{SECRET} thought {len(s['msgs'])}"]})
    g.add_edge(START, "think")
    g.add_edge("think", END)
    path = tmp_path_factory.mktemp("enc") / "enc.durkv"
    truth = {}
    with DurkvSaver.open(str(path)) as saver:
        saver.serde = _encrypted()
        app = g.compile(checkpointer=saver)
        for t in ("t1", "t2"):
            cfg = {"configurable": {"thread_id": t}}
            app.invoke({"msgs": [SECRET]}, cfg)
            app.invoke({"msgs": [SECRET + " again"]}, cfg)
            truth[t] = [(c.config["configurable"]["checkpoint_id"],
                         (c.parent_config or {}).get("configurable", {}).get("checkpoint_id"),
                         c.checkpoint["ts"]) for c in saver.list(cfg)]
        saver.put_writes(saver.get_tuple({"configurable": {"thread_id": "t1"}}).config,
                         [("msgs", [SECRET + " pending"])], "task-x")
    assert SECRET.encode() not in b"".join(p.read_bytes() for p in path.rglob("*.seg"))
    return path, truth


def _run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and SECRET not in result.output
    note = result.stderr.splitlines()
    assert len(note) == 1 and "values are encrypted (aes)" in note[0] and \
        "needs the key" in note[0], result.stderr
    return result


def _marker(x) -> dict:
    assert set(x) == {"$encrypted"}, x
    m = x["$encrypted"]
    assert m["type"] == "msgpack+aes" and m["bytes"] > 16, m
    return m


def _close_in_time(shown: str, ts: str) -> bool:
    """The id's time and LangGraph's ``ts`` are taken microseconds apart."""
    a, b = dt.datetime.fromisoformat(shown), dt.datetime.fromisoformat(ts)
    return abs((a - b).total_seconds()) < 1


def test_ls_lists_ids_times_and_channels(enc_store):
    path, truth = enc_store
    doc = strict_loads(_run("ls", "--json", path).stdout)
    rows = {r["thread_id"]: r for r in doc["threads"]}
    assert sorted(rows) == ["t1", "t2"]
    for t, row in rows.items():
        cid, parent, ts = truth[t][0]
        assert (row["checkpoint_id"], row["parent_id"]) == (cid, parent)
        assert _close_in_time(row["time"], ts)
        assert row["channels"] == ["msgs"] and row["versions"]
        _marker(row["metadata"])
    text = _run("ls", path).stdout
    assert truth["t1"][0][0] in text and truth["t2"][0][0] in text and "msgs" in text


def test_history_lists_every_checkpoint(enc_store):
    path, truth = enc_store
    for t in ("t1", "t2"):
        doc = strict_loads(_run("history", "-n", "0", "--json", path, t).stdout)
        got = [(c["checkpoint_id"], c["parent_id"]) for c in doc["checkpoints"]]
        assert got == [(cid, parent) for cid, parent, _ in truth[t]]
        for c, (_, _, ts) in zip(doc["checkpoints"], truth[t]):
            assert _close_in_time(c["time"], ts)
            _marker(c["metadata"])
        text = _run("history", "-n", "0", path, t).stdout.splitlines()
        assert text[0].split()[:2] == ["checkpoint", "time"]
        assert [line.split()[0] for line in text[1:]] == [cid for cid, _, _ in truth[t]]


def test_show_prints_sizes_of_values_and_writes(enc_store):
    path, truth = enc_store
    doc = strict_loads(_run("show", "--json", path, "t1").stdout)
    assert doc["checkpoint_id"] == truth["t1"][0][0]
    _marker(doc["checkpoint"])
    _marker(doc["metadata"])
    items = doc["values"]["msgs"]
    assert len(items) == 4 and all(_marker(i) for i in items)
    (w,) = doc["pending_writes"]
    assert w["task_id"] == "task-x" and w["channel"] == "msgs"
    (item,) = w["value"]        # a list write is stored item by item, each encrypted
    _marker(item)
    older = truth["t2"][-1][0]
    assert strict_loads(_run("show", "--json", path, "t2", older).stdout)["checkpoint_id"] \
        == older
    text = _run("show", path, "t1").stdout
    assert "msgs: [4 items, last: {\"$encrypted\"" in text and "pending writes: 1" in text


def test_the_console_script_lists_an_encrypted_store(enc_store):
    """The installed ``durkv`` script in its own process: JSON on stdout that parses, one
    line on stderr, exit 0."""
    path, truth = enc_store
    script = Path(sys.executable).with_name("durkv")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "durkv.cli"]
    for args in (["ls", "--json", str(path)], ["history", "--json", str(path), "t1"],
                 ["show", "--json", str(path), "t1"], ["ls", str(path)],
                 ["history", str(path), "t2"], ["show", str(path), "t2"]):
        out = subprocess.run(cmd + args, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert len(out.stderr.splitlines()) == 1 and "needs the key" in out.stderr, out.stderr
        assert SECRET not in out.stdout
        if "--json" in args:
            strict_loads(out.stdout)
        else:
            assert truth["t1" if "t1" in args or args[0] == "ls" else "t2"][0][0] in out.stdout


def test_a_plain_store_gets_no_note(tmp_path):
    """The note is about encrypted values only: a LangGraph store without encryption
    prints its values and nothing on stderr."""
    from durkv.langgraph import DurkvSaver

    path = tmp_path / "plain.durkv"
    with DurkvSaver.open(str(path)) as saver:
        cfg = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        checkpoint = {"v": 4, "id": "1ef0000000000001", "ts": "2026-01-01T00:00:00+00:00",
                      "channel_values": {"msgs": ["hi"]}, "channel_versions": {"msgs": 1},
                      "versions_seen": {}, "updated_channels": ["msgs"]}
        saver.put(cfg, checkpoint, {"source": "input", "step": -1}, {"msgs": 1})
    result = CliRunner().invoke(cli, ["show", "--json", str(path), "t1"],
                                catch_exceptions=False)
    assert result.exit_code == 0 and result.stderr == ""
    doc = strict_loads(result.stdout)
    assert doc["values"]["msgs"] == ["hi"] and doc["time"] == "2026-01-01T00:00:00+00:00"
