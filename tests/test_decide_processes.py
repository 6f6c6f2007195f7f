"""Decisions on a local store from other processes while an agent drives the run
(issue 19; docs/GUARANTEES.md 19a).

Real processes throughout: the agent (tests/decide_child.py) holds the store and waits
on its approvals; deciders are `durkv approve/reject/resolve` commands or long-lived
decider processes; kills are SIGKILL. What is checked: the agent sees each decision and
acts on it, racing contradictory deciders have exactly one winner (the loser gets
DecisionConflictError) and the run acts on the winner's answer, and a kill at any
moment of the exchange leaves each decision recorded once and acted on once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import durkv
from durkv.runtime.journal import E_DECISION, E_RESOLVE

SLOW = os.environ.get("DURKV_SLOW_TESTS") == "1"
CHILD = str(Path(__file__).with_name("decide_child.py"))


def _agent(path: str, outbox: Path, run_ids: list[str],
           env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, CHILD, "agent", path, str(outbox),
                             ",".join(run_ids)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def _expect(proc: subprocess.Popen, word: str) -> list[str]:
    """The agent's next line, which must start with ``word``."""
    line = proc.stdout.readline().split()
    if not line or line[0] != word:
        proc.kill()
        raise AssertionError(f"expected {word!r}, got {line!r}: {proc.stderr.read()[-3000:]}")
    return line


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "durkv.cli", *args], capture_output=True,
                          text=True, timeout=60)


def _outbox(outbox: Path) -> dict[str, bool]:
    """key -> the decision the effect was made with; each key at most once."""
    lines = [json.loads(ln) for ln in outbox.read_text().splitlines()] if outbox.exists() else []
    keys = [k for k, _, _ in lines]
    assert len(keys) == len(set(keys)), f"an effect made twice: {lines}"
    return {k: ok for k, _, ok in lines}


def _decisions(path: str, run_id: str) -> list[dict]:
    with durkv.open(path, read_only=True) as s:
        return [r for r in s.journal(run_id) if r.get("e") == E_DECISION]


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        for f in (p.stdout, p.stderr, p.stdin):
            if f is not None:
                f.close()


def test_approve_and_reject_from_another_process_while_the_agent_waits(tmp_path):
    path, outbox = str(tmp_path / "s.durkv"), tmp_path / "outbox"
    agent = _agent(path, outbox, ["a", "b"])
    try:
        waiting = {_expect(agent, "waiting")[1] for _ in range(2)}
        assert waiting == {"a", "b"}
        rows = json.loads(_cli("runs", "--json", path).stdout)["runs"]
        assert {(r["run_id"], r["status"], r["action"]) for r in rows} == {
            ("a", "waiting", "send"), ("b", "waiting", "send")}
        ok = _cli("approve", path, "a", "0", "--by", "alice")
        assert ok.returncode == 0 and "approved by alice" in ok.stdout, ok.stderr
        no = _cli("reject", "--json", path, "b", "0", "--note", "not this one")
        assert no.returncode == 0, no.stderr
        assert json.loads(no.stdout)["approved"] is False
        done = {}
        for _ in range(2):
            _, rid, approved, _t = _expect(agent, "done")
            done[rid] = approved == "True"
        assert agent.wait(30) == 0, agent.stderr.read()
    finally:
        _stop(agent)
    assert done == {"a": True, "b": False}
    assert _outbox(outbox) == {"a:1": True, "b:1": False}    # the tool is step 1
    again = _cli("reject", path, "a", "0")      # final: the other way is refused
    assert again.returncode == 1 and "already approved" in again.stderr
    assert [d["ok"] for d in _decisions(path, "a")] == [True]


def _decider(path: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, CHILD, "decider", path], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready", p.stderr.read()
    return p


def _wait_all(agent: subprocess.Popen, n: int) -> None:
    for _ in range(n):
        _expect(agent, "waiting")


@pytest.mark.parametrize("durability", ["sync", "exit"])
def test_racing_deciders_in_two_processes_exactly_one_wins_and_the_run_acts_on_it(
        tmp_path, durability):
    rounds = 200 if SLOW else 15
    path, outbox = str(tmp_path / "s.durkv"), tmp_path / "outbox"
    durkv.open(path, durability=durability).close()
    runs = [f"r{i}" for i in range(rounds)]
    agent = _agent(path, outbox, runs)
    deciders = [_decider(path) for _ in range(2)]
    winners = {}
    try:
        _wait_all(agent, rounds)
        for i, rid in enumerate(runs):
            # decider 0 approves, 1 rejects; who is told first alternates
            order = (0, 1) if i % 2 else (1, 0)
            for k in order:
                deciders[k].stdin.write(f"{rid} 0 {'yes' if k == 0 else 'no'}\n")
                deciders[k].stdin.flush()
            got = [json.loads(d.stdout.readline()) for d in deciders]
            oks = [g for g in got if g["ok"]]
            assert len(oks) == 1, got
            assert [g["error"] for g in got if not g["ok"]] == ["decision_conflict"], got
            winners[rid] = oks[0]["approved"]
        done = {}
        for _ in runs:
            _, rid, approved, _t = _expect(agent, "done")
            done[rid] = approved == "True"
        assert agent.wait(60) == 0, agent.stderr.read()
    finally:
        _stop(agent, *deciders)
    assert done == winners          # each run acted on the answer its decider was told
    assert _outbox(outbox) == {f"{rid}:1": ok for rid, ok in winners.items()}
    for rid, ok in winners.items():
        assert [d["ok"] for d in _decisions(path, rid)] == [ok]


def test_agent_killed_right_after_it_read_the_decision_the_resumed_run_acts_once(tmp_path):
    path, outbox = str(tmp_path / "s.durkv"), tmp_path / "outbox"
    agent = _agent(path, outbox, ["k"], env={"DURKV_TEST_KILL_AFTER_SEEN": "1"})
    try:
        _expect(agent, "waiting")
        assert _cli("approve", path, "k", "0").returncode == 0
        assert agent.wait(30) == -signal.SIGKILL
    finally:
        _stop(agent)
    assert _outbox(outbox) == {}        # killed before acting
    again = _agent(path, outbox, ["k"])
    try:
        assert _expect(again, "done")[2] == "True"
        assert again.wait(30) == 0
    finally:
        _stop(again)
    assert _outbox(outbox) == {"k:1": True}
    assert len(_decisions(path, "k")) == 1


def test_kills_at_random_moments_of_the_exchange_lose_and_repeat_nothing(tmp_path):
    """Each round: the agent waits; a decider process (open, ready) is told to decide;
    within the next few ms -- while it decides, or the agent reads the decision and acts
    on it -- the agent or the decider is SIGKILLed. A decider told success has its
    decision in the journal; a killed one left one decision or none (then it is decided
    again); a new agent finishes the run on the one recorded decision, with one effect."""
    rnd = random.Random(19)
    rounds = 60 if SLOW else 5
    path, outbox = str(tmp_path / "s.durkv"), tmp_path / "outbox"
    for i in range(rounds):
        rid = f"k{i}"
        want = rnd.random() < 0.5
        agent = _agent(path, outbox, [rid])
        decider = None
        try:
            _expect(agent, "waiting")
            decider = _decider(path)
            victim = agent if i % 2 == 0 else decider
            decider.stdin.write(f"{rid} 0 {'yes' if want else 'no'}\n")
            decider.stdin.flush()
            time.sleep(rnd.uniform(0, 0.008 if victim is agent else 0.003))
            victim.send_signal(signal.SIGKILL)
            victim.wait(30)
            told = decider.stdout.readline()    # "" when the decider was killed first
        finally:
            _stop(agent, *(p for p in (decider,) if p is not None))
        recorded = _decisions(path, rid)
        assert len(recorded) <= 1
        if told:
            assert json.loads(told) == {"ok": True, "approved": want}
            assert [d["ok"] for d in recorded] == [want]
        if not recorded:
            assert _cli("approve" if want else "reject", path, rid, "0").returncode == 0
        resumed = _agent(path, outbox, [rid])
        try:
            acted = _expect(resumed, "done")[2] == "True"
            assert resumed.wait(30) == 0
        finally:
            _stop(resumed)
        assert acted == want
        assert [d["ok"] for d in _decisions(path, rid)] == [want]
    assert _outbox(outbox) == {f"k{i}:1": ok for i, ok in enumerate(
        d[0]["ok"] for d in (_decisions(path, f"k{i}") for i in range(rounds)))}


_IN_DOUBT = r"""
import os, signal, sys
import durkv
@durkv.tool(at_most_once=True)
def charge(amount, *, idempotency_key):
    os.kill(os.getpid(), signal.SIGKILL)     # the effect may have happened: no receipt
with durkv.open(sys.argv[1]) as s:
    with s.run("pay") as run:
        run.tool(charge, 5)
"""

_WRITER = r"""
import sys, time
import durkv
with durkv.open(sys.argv[1]) as s:
    print("open", flush=True)
    i = 0
    while True:
        s.append_journal("busy", {"i": i}, durable=True)
        i += 1
        time.sleep(0.002)
"""


@pytest.mark.parametrize("done", [True, False])
def test_resolve_from_another_process_while_another_writes(tmp_path, done):
    path = str(tmp_path / "s.durkv")
    p = subprocess.run([sys.executable, "-c", _IN_DOUBT, path], capture_output=True)
    assert p.returncode == -signal.SIGKILL
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, path], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "open", writer.stderr.read()
        args = ["--done", "--result", '{"id": "ch_1"}'] if done else ["--not-done"]
        r = _cli("resolve", "--json", path, "pay", "0", *args, "--by", "ops")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["done"] is done
        other = ["--not-done"] if done else ["--done"]
        clash = _cli("resolve", path, "pay", "0", *other)
        assert clash.returncode == 1 and "already resolved" in clash.stderr
    finally:
        _stop(writer)
    calls = []

    @durkv.tool(at_most_once=True, name="charge")
    def charge(amount, *, idempotency_key):
        calls.append(idempotency_key)
        return {"id": "ch_2"}

    with durkv.open(path) as s:
        assert len([r for r in s.journal("pay") if r.get("e") == E_RESOLVE]) == 1
        with s.run("pay") as run:
            got = run.tool(charge, 5)
    assert (got, calls) == (({"id": "ch_1"}, []) if done else ({"id": "ch_2"}, ["pay:0"]))


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_a_decision_is_fdatasynced_before_decide_returns_under_every_policy(tmp_path,
                                                                           durability):
    from durkv.log import fdatasync_count

    path = str(tmp_path / "s.durkv")
    with durkv.open(path) as s, s.run("d") as run:
        run.approve("send", 1)      # the run pauses: waiting
    with durkv.open(path, durability=durability, index_every=0) as s:
        log = s._b._log
        before = fdatasync_count()
        s.decide("d", "0", True)
        (rec,) = [r for r in s.journal("d") if r.get("e") == E_DECISION]
        assert fdatasync_count() > before
        assert log.durable_lsn == log.next_lsn      # every frame, the DECISION's too
        before = fdatasync_count()
        assert s.decide("d", "0", True).decided_at == rec["t"]     # recorded: no new frame
        assert fdatasync_count() == before
