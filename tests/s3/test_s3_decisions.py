"""Decisions on a live s3:// store from a process that is not its writer (FORMAT.md 13,
GUARANTEES.md 19): a create-only decision object, the writer's intake and its ack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import durkv
from durkv.backends.s3.decisions import (
    DECISIONS, DecisionBox, DecisionPendingError, ack_error,
)
from durkv.runtime import remote
from durkv.runtime.journal import E_DECISION, E_RESOLVE, fold

from .storetools import keys

ROOT = str(Path(__file__).resolve().parents[2])

_WRITER = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    sys.path.insert(0, {root!r})
    import durkv
    from durkv.backends.s3 import decisions
    from durkv.runtime import remote

    url, run_ids, out, point = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]

    if point == "before-journal":       # killed as it starts taking an object in
        def take_in(store, doc):
            os.kill(os.getpid(), signal.SIGKILL)
        remote.take_in = take_in
    elif point == "after-journal":      # killed with the record durable, before the ack
        def write_ack(self, doc, fields, writer_epoch=0):
            os.kill(os.getpid(), signal.SIGKILL)
        decisions.DecisionBox.write_ack = write_ack

    @durkv.tool
    def send(to, ok, *, idempotency_key):
        with open(out, "a") as f:
            f.write(json.dumps([idempotency_key, to, ok]) + "\\n")
        return ok

    store = durkv.open(url)
    print("open", flush=True)
    todo = list(run_ids)
    while todo:
        for rid in list(todo):
            with store.run(rid, input={{"rid": rid}}) as run:
                d = run.approve("send", {{"to": rid}})
                run.tool(send, rid, d.approved)
            if run.status == "waiting":
                continue
            print(f"done {{rid}} {{d.approved}}", flush=True)
            todo.remove(rid)
        time.sleep(0.02)
    store.close()
    print("closed", flush=True)
""")


def _writer(url: str, run_ids: list[str], out: Path, point: str = "none") -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER.format(root=ROOT), url, ",".join(run_ids), str(out),
         point], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ.copy())
    line = proc.stdout.readline().strip()
    assert line == "open", proc.stderr.read()[-3000:] if not line else line
    return proc


def _wait_waiting(reader, run_ids: list[str], timeout: float = 30) -> None:
    """Until every run is waiting for its approval (its APPROVAL record is in S3)."""
    deadline = time.monotonic() + timeout
    while True:
        reader.refresh()
        st = {r.run_id: r.status for r in reader.runs()}
        if all(st.get(rid) == "waiting" for rid in run_ids):
            return
        assert time.monotonic() < deadline, st
        time.sleep(0.05)


def _decisions(store, run_id: str) -> list[dict]:
    if store.read_only:
        store.refresh()
    return [r for r in store.journal(run_id) if r.get("e") in (E_DECISION, E_RESOLVE)]


def _finish(proc: subprocess.Popen, timeout: float = 60) -> list[str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out.split("\n")


def test_decide_from_another_process_while_the_writer_drives_the_run(s3_env, bucket,
                                                                     tmp_path):
    url = f"s3://{bucket}/one?decision_poll_ms=50"
    outbox = tmp_path / "outbox"
    proc = _writer(url, ["r1", "r2"], outbox)
    try:
        with durkv.open(url, read_only=True) as reader:
            _wait_waiting(reader, ["r1", "r2"])
            d = reader.decide("r1", "0", True, by="alice", note="looks right")
            assert (d.step_id, d.approved, d.by, d.note) == ("0", True, "alice", "looks right")
            # durable and final when decide returns: the DECISION is in the log now
            (rec,) = _decisions(reader, "r1")
            assert rec["ok"] is True and rec["by"] == "alice" and rec["dq"]
            r = reader.decide("r2", "0", False, by="bob")
            assert r.approved is False
            # the same answer again returns the recorded decision, the other one is refused
            assert reader.decide("r1", "0", True, by="carol").by == "alice"
            with pytest.raises(durkv.DecisionConflictError, match="already approved by 'alice'"):
                reader.decide("r1", "0", False, by="carol")
        lines = _finish(proc)
    finally:
        proc.kill()
    assert "done r1 True" in lines and "done r2 False" in lines
    effects = sorted(json.loads(x) for x in outbox.read_text().splitlines())
    assert effects == [["r1:1", "r1", True], ["r2:1", "r2", False]]
    with durkv.open(url, read_only=True) as reader:
        assert [len(_decisions(reader, r)) for r in ("r1", "r2")] == [1, 1]


def test_racing_deciders_exactly_one_wins_and_the_run_acts_on_it(s3_env, bucket, tmp_path):
    url = f"s3://{bucket}/race?decision_poll_ms=50"
    run_ids = [f"r{i}" for i in range(6)]
    outbox = tmp_path / "outbox"
    proc = _writer(url, run_ids, outbox)
    told: dict[str, list] = {rid: [] for rid in run_ids}
    barrier = threading.Barrier(2)

    def decider(answer: bool) -> None:
        with durkv.open(url, read_only=True) as mine:     # a handle of its own
            for rid in run_ids:
                barrier.wait(timeout=60)
                try:
                    d = mine.decide(rid, "0", answer, by=f"op-{answer}")
                    told[rid].append(("ok", answer, d.approved))
                except durkv.DecisionConflictError:
                    told[rid].append(("conflict", answer, None))

    try:
        with durkv.open(url, read_only=True) as reader:
            _wait_waiting(reader, run_ids)
        threads = [threading.Thread(target=decider, args=(a,)) for a in (True, False)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        lines = _finish(proc)
    finally:
        proc.kill()
    effects = {k.split(":")[0]: ok for k, _, ok in map(json.loads, outbox.read_text().splitlines())}
    with durkv.open(url, read_only=True) as reader:
        for rid in run_ids:
            won = [a for kind, a, _ in told[rid] if kind == "ok"]
            assert len(won) == 1 and len(told[rid]) == 2, told[rid]    # exactly one winner
            assert f"done {rid} {won[0]}" in lines          # the run acted on the winner's
            assert effects[rid] is won[0]
            (rec,) = _decisions(reader, rid)                # recorded once
            assert rec["ok"] is won[0] and rec["by"] == f"op-{won[0]}"


@pytest.mark.parametrize("point", ["before-journal", "after-journal"])
def test_writer_killed_during_the_exchange_a_takeover_honours_the_decision(
        s3_env, bucket, tmp_path, point):
    url = f"s3://{bucket}/kill?decision_poll_ms=50"
    outbox = tmp_path / "outbox"
    proc = _writer(url, ["r1"], outbox, point)
    result: dict = {}
    try:
        with durkv.open(url, read_only=True) as reader:
            _wait_waiting(reader, ["r1"])

        def decider() -> None:
            with durkv.open(url + "&decision_wait_ms=60000", read_only=True) as mine:
                try:
                    result["d"] = mine.decide("r1", "0", True, by="alice")
                except Exception as exc:     # the test asserts on it below
                    result["exc"] = exc

        t = threading.Thread(target=decider)
        t.start()
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-3000:]
    finally:
        proc.kill()
    time.sleep(0.3)
    assert not result, result       # no ack came from the dead writer
    with durkv.open(url, read_only=True) as reader:
        journaled = _decisions(reader, "r1")
    assert len(journaled) == (1 if point == "after-journal" else 0)
    # no background poll: the heir takes the pending object in at open, before any run
    with durkv.open(url.replace("=50", "=0"), takeover=True) as heir:
        assert len(_decisions(heir, "r1")) == 1
        t.join(timeout=30)
        assert "exc" not in result, result
        assert result["d"].approved is True and result["d"].by == "alice"
        with heir.run("r1", input={"rid": "r1"}) as run:
            assert run.approve("send", {"to": "r1"}).approved is True
        (rec,) = _decisions(heir, "r1")             # once, whatever the kill point
        assert rec["by"] == "alice" and rec["ok"] is True
    # the dead writer acted on it only if it was journaled: then the way it was decided
    acted = outbox.read_text().splitlines() if outbox.exists() else []
    assert acted == [] if point == "before-journal" else acted in ([], ['["r1:1", "r1", true]'])


def test_wrong_step_fingerprint_and_request_are_refused(s3_env, s3, bucket):
    url = f"s3://{bucket}/refuse?decision_poll_ms=50"
    with durkv.open(url) as writer, durkv.open(url, read_only=True) as reader:
        with writer.run("r", input=1) as run:
            run.approve("pay", {"eur": 10})
        reader.refresh()
        with pytest.raises(durkv.NotFoundError, match="has nothing at step '7'"):
            reader.decide("r", "7", True)
        with pytest.raises(durkv.NotFoundError, match="not a tool"):
            reader.resolve("r", "0", done=False)
        with pytest.raises(durkv.NotFoundError, match="no run 'no-such-run' in this store"):
            reader.decide("no-such-run", "0", True)
        fp = fold("r", reader.journal("r")).latest("0").fp
        with pytest.raises(durkv.ApprovalMismatchError, match="fingerprint"):
            remote.decide(reader, "r", "0", True, fingerprint=fp ^ 1)
        with pytest.raises(durkv.ConfigError, match="plain data"):
            reader.decide("r", "0", True, by={"name": "x"})
        assert not [k for k in keys(s3, bucket) if "/decisions/" in k]    # nothing PUT

        # an object for a request that is not the pending one (a stale or foreign
        # decider): the writer refuses it in its ack, and records nothing
        box = DecisionBox(url)
        st = fold("r", reader.journal("r"))
        request = remote.request_of(st, "approval", "0")
        for bad, error in ((request[:7] + [fp ^ 1], durkv.ApprovalMismatchError),
                           (request[:2] + [123.0] + request[3:], durkv.NotFoundError)):
            doc = box.make(bad, {"ok": True}, by="mallory", note=None, t=time.time())
            held = box.submit(doc)
            ack = box.wait(doc, held, 20_000)
            assert ack is not None and ack["ok"] is False
            assert isinstance(ack_error(ack), error), ack
        assert _decisions(writer, "r") == []
        # the pending request itself is still open for the real decision
        assert reader.decide("r", "0", True, by="alice").approved is True
        with pytest.raises(durkv.DecisionConflictError):
            writer.decide("r", "0", False)       # the writer's own decide: the same rule


def test_the_writers_own_decision_goes_through_the_object(s3_env, s3, bucket):
    url = f"s3://{bucket}/own?decision_poll_ms=0"
    with durkv.open(url) as writer, durkv.open(url, read_only=True) as reader:
        with writer.run("r", input=1) as run:
            run.approve("pay", {"eur": 10})
        assert writer.decide("r", "0", False, by="ops").approved is False
        objs = [k for k in keys(s3, bucket) if "/decisions/" in k]
        assert len(objs) == 2 and sum(k.endswith(".ack.json") for k in objs) == 1
        reader.refresh()
        with pytest.raises(durkv.DecisionConflictError, match="already rejected by 'ops'"):
            reader.decide("r", "0", True)
        with writer.run("r", input=1) as run:
            assert run.approve("pay", {"eur": 10}).approved is False


def test_an_in_doubt_call_is_resolved_from_another_process(s3_env, bucket):
    url = f"s3://{bucket}/doubt?decision_poll_ms=50"
    calls = []

    @durkv.tool(at_most_once=True)
    def charge(eur, *, idempotency_key):
        calls.append(idempotency_key)
        if len(calls) == 1:
            raise SystemExit("killed between the call and its receipt")
        return {"charged": eur}

    with durkv.open(url) as writer, durkv.open(url, read_only=True) as reader:
        with pytest.raises(SystemExit):
            with writer.run("p", input=1) as run:
                run.tool(charge, 5)
        with pytest.raises(durkv.InDoubtError):
            with writer.run("p", input=1) as run:
                run.tool(charge, 5)
        reader.refresh()
        reader.resolve("p", "0", done=True, result={"charged": 5, "id": "ch_1"}, by="ops")
        with pytest.raises(durkv.DecisionConflictError, match="already resolved as done"):
            reader.resolve("p", "0", done=False)
        reader.resolve("p", "0", done=True, result={"charged": 5, "id": "ch_1"})   # a no-op
        with writer.run("p", input=1) as run:
            assert run.tool(charge, 5) == {"charged": 5, "id": "ch_1"}
        assert calls == ["p:0"] and len(_decisions(writer, "p")) == 1


def test_with_no_writer_the_decision_stands_until_one_opens(s3_env, s3, bucket):
    url = f"s3://{bucket}/closed?decision_poll_ms=0"
    with durkv.open(url) as writer:
        with writer.run("r", input=1) as run:
            run.approve("pay", {"eur": 10})
    with durkv.open(url, read_only=True) as reader:
        t0 = time.monotonic()
        with pytest.raises(DecisionPendingError, match="no writer has taken it"):
            reader.decide("r", "0", True, by="alice")
        assert time.monotonic() - t0 < 5        # no writer: it does not wait it out
        with pytest.raises(durkv.DecisionConflictError):    # the object holds the request
            reader.decide("r", "0", False, by="bob")
        with durkv.open(url) as writer:         # its open takes the object in
            assert [r["by"] for r in _decisions(writer, "r")] == ["alice"]
        assert reader.decide("r", "0", True).by == "alice"
    assert any(k.startswith("closed/" + DECISIONS) for k in keys(s3, bucket))


def test_answered_pairs_are_cleaned_up_and_the_journal_then_decides(s3_env, s3, bucket,
                                                                    monkeypatch):
    from durkv.backends.s3 import decisions

    monkeypatch.setattr(decisions, "GRACE_S", -1)      # every ack counts as old
    url = f"s3://{bucket}/gc?decision_poll_ms=50"
    with durkv.open(url) as writer, durkv.open(url, read_only=True) as reader:
        with writer.run("r", input=1) as run:
            run.approve("pay", {"eur": 10})
        reader.refresh()
        request = remote.request_of(fold("r", reader.journal("r")), "approval", "0")

        def cleaned_up() -> None:
            deadline = time.monotonic() + 20
            while [k for k in keys(s3, bucket) if "/decisions/" in k]:
                assert time.monotonic() < deadline
                time.sleep(0.05)

        assert reader.decide("r", "0", True, by="alice").approved
        cleaned_up()
        # the key is free again: a new object for the same request is answered from the
        # journal (its first DECISION holds), and nothing more is recorded
        box = DecisionBox(url)
        for answer, ok in ((False, False), (True, True)):
            doc = box.make(request, {"ok": answer}, by="bob", note=None, t=time.time())
            assert box.submit(doc) is doc       # it won the free key
            ack = box.wait(doc, doc, 20_000)
            assert ack is not None and ack["ok"] is ok, ack
            if ok:
                assert ack["rec"]["by"] == "alice" and ack["lsn"] is None
            else:
                assert isinstance(ack_error(ack), durkv.DecisionConflictError)
            cleaned_up()
        with pytest.raises(durkv.DecisionConflictError):
            reader.decide("r", "0", False)
        assert [r["by"] for r in _decisions(writer, "r")] == ["alice"]


def test_arun_lists_nothing_from_the_event_loop(s3_env, bucket, monkeypatch):
    import asyncio

    from durkv.backends.s3.decisions import Intake

    url = f"s3://{bucket}/aio?decision_poll_ms=0"
    passes = []
    real = Intake.run_pass
    monkeypatch.setattr(Intake, "run_pass",
                        lambda self, run_id=None: passes.append(run_id) or real(self, run_id))
    with durkv.open(url) as writer:
        assert passes == [None]     # the pass at open
        with writer.run("r", input=1):
            pass
        assert passes == [None, "r"]

        async def main():
            async with writer.arun("r", input=1):
                pass

        asyncio.run(main())
        assert passes == [None, "r"]    # no request on the loop
