"""The operator's durkv as a hostile operator uses it (the eighteenth session's review):
--dry-run with --ack, Ctrl-C during a repair, compact's open of a torn tail, a dead
driver not yet reaped, ids with newlines, a non-JSON --result. Each test held a defect."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import logtools as lt
import pytest
from click.testing import CliRunner

import durkv
from durkv import log as seglog
from durkv.cli import cli
from durkv.store import drivers


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _store(path, n=5, thread="t"):
    with durkv.open(str(path)) as s:
        for i in range(n):
            s.put(thread, "", f"{i:06d}", checkpoint={}, metadata={"i": i},
                  values={"v": i}, versions={"v": i + 1})
    return path


def _tear_tail(d) -> None:
    act = lt.segments(d)[-1]
    lt.truncate(act.path, act.frames[-1].end - 4)


def test_recover_dry_run_with_ack_is_refused_and_records_nothing(tmp_path):
    """--dry-run was ignored: the acknowledgement, durable and final, was recorded."""
    d = _store(tmp_path / "s.durkv")
    before = seglog.verify(str(d)).next_lsn
    for extra in ("--dry-run", "--skip-corrupt"):
        r = run("recover", extra, d, "--ack", "r1")
        assert r.exit_code == 2 and "run it on its own" in r.output
    assert seglog.verify(str(d)).next_lsn == before


def test_recover_by_or_note_without_ack_is_refused_not_dropped(tmp_path):
    """`recover PATH --by ann` ran a repair and dropped --by without a word."""
    d = _store(tmp_path / "s.durkv")
    _tear_tail(d)
    for extra in (["--by", "ann"], ["--note", "why"]):
        r = run("recover", d, *extra)
        assert r.exit_code == 2 and "go with --ack" in r.output
    assert not seglog.verify(str(d)).ok             # nothing was repaired


def test_a_progress_callback_that_raises_stops_verify_and_is_not_swallowed(tmp_path, capfd):
    """cffi printed 'Exception ignored from cffi callback' with a traceback and went on."""
    d = _store(tmp_path / "s.durkv", 50)

    def stop(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        seglog.verify(str(d), progress=stop)
    assert "Exception ignored" not in capfd.readouterr().err


def test_ctrl_c_during_a_repair_lets_it_finish_says_so_and_exits_130(tmp_path, monkeypatch):
    """A repair cannot stop midway (its cut, then its record): Ctrl-C is noted, the
    repair and its report finish, then exit 130 with one line, never a traceback."""
    d = _store(tmp_path / "s.durkv", 20)
    _tear_tail(d)
    recover = seglog.recover

    def interrupted(*a, **kw):
        os.kill(os.getpid(), signal.SIGINT)     # the operator's Ctrl-C, mid-repair
        time.sleep(0.05)
        return recover(*a, **kw)

    monkeypatch.setattr(seglog, "recover", interrupted)
    r = CliRunner().invoke(cli, ["recover", str(d)])
    assert r.exit_code == 130, r.output
    assert "removed:" in r.stdout and "ran to its end" in r.output
    assert "Traceback" not in r.output
    monkeypatch.undo()
    assert seglog.verify(str(d)).ok and lt.quarantine_files(d)


def test_compact_says_when_its_open_moved_a_torn_tail(tmp_path):
    d = _store(tmp_path / "s.durkv")
    _tear_tail(d)
    r = run("compact", d)
    assert r.exit_code == 0
    assert "moved a torn tail" in r.stdout and str(d / "quarantine") in r.stdout
    r = run("compact", "--json", _store(tmp_path / "t.durkv"))
    assert json.loads(r.stdout)["quarantined"] == []


def test_a_dead_driver_not_yet_reaped_is_no_driver(tmp_path):
    """os.kill(pid, 0) succeeds for a zombie: `durkv runs` named a dead process."""
    store_dir = str(tmp_path)
    code = ("import sys, time\n"
            "from durkv.store import drivers\n"
            "c = drivers.claim(sys.argv[1], 'run', 'r')\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code, store_dir], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        assert drivers.driver_pid(store_dir, "run", "r") == child.pid
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while drivers.driver_pid(store_dir, "run", "r") is not None:
            assert time.monotonic() < deadline, "a zombie is still named as the driver"
            time.sleep(0.01)
        with open(f"/proc/{child.pid}/stat") as f:  # not reaped yet: a zombie
            assert f.read().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        child.kill()
        child.wait()


def test_ids_with_newlines_cannot_forge_rows(tmp_path):
    d = tmp_path / "s.durkv"
    _store(d, 1, thread="ok\nFAKE  -  9999")
    r = run("ls", d)
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and "ok\\nFAKE" in lines[1]


def test_resolve_refuses_a_result_that_is_not_json(tmp_path):
    d = _store(tmp_path / "s.durkv")
    r = run("resolve", d, "r", "0", "--done", "--result", "NaN")
    assert r.exit_code != 0 and "NaN is not JSON" in r.output


def test_runs_does_not_call_a_finished_langgraph_thread_stopped_mid_run(tmp_path):
    """A LangGraph thread's journal never records that its graph ended: `durkv runs` said
    of every such thread that it stopped mid-run. A store.run killed mid-run still is."""
    pytest.importorskip("langgraph")
    import operator
    from typing import Annotated

    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    from durkv.langgraph import DurkvSaver
    from durkv.langgraph import step as lg_step

    State = TypedDict("State", {"log": Annotated[list, operator.add]})
    g = StateGraph(State)
    g.add_node("act", lambda s: {"log": [lg_step("plan", lambda: "p")]})
    g.add_edge(START, "act")
    g.add_edge("act", END)
    d = tmp_path / "s.durkv"
    with DurkvSaver.open(str(d)) as saver:
        g.compile(checkpointer=saver).invoke({"log": []}, {"configurable": {"thread_id": "t"}})
    code = ("import os, signal, sys, durkv\n"
            "s = durkv.open(sys.argv[1])\n"
            "run = s.run('job').__enter__()\n"
            "run.step('a', lambda: 1)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    subprocess.run([sys.executable, "-c", code, str(d)], timeout=60)
    rows = {r["run_id"]: r for r in json.loads(run("runs", "--json", d).stdout)["runs"]}
    assert rows["t"]["langgraph"] is True and rows["job"]["langgraph"] is False
    text = run("runs", d).stdout
    assert "a LangGraph thread, finished or stopped mid-run" in text
    assert "it stopped mid-run; run it again to resume" in text     # the killed store.run
