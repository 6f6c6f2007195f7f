"""Which journal records get an fdatasync of their own (docs/GUARANTEES.md 16.9, issue 20).

A kill -9 cannot see a missing fdatasync: a frame written to the OS survives it. So the
witnesses here are the log's durable position (frames below ``durable_lsn`` were
fdatasync'd), read inside the tool and right after it, with the background flusher
slowed to 30 s so that nothing but a waited-for fdatasync can move it; the commit
fdatasyncs the log counts; and the store's waits for durability, spied on with the
thread that waits. Before issue 20 a keyed tool's intent and receipt each waited for an
fdatasync under every policy; an at-most-once tool's still do.
"""

from __future__ import annotations

import asyncio
import operator
import threading
from typing import Annotated

import pytest
from typing_extensions import TypedDict

import durkv
from storeinternals import backend_of, index_of

SLOW_FLUSHER_MS = 30_000      # no background fdatasync while a test runs


def _open(tmp_path, durability: str):
    return durkv.open(str(tmp_path / "s"), durability=durability,
                      flush_interval_ms=SLOW_FLUSHER_MS)


def _newest_lsn(store, run_id: str) -> int:
    """The LSN of the run's newest journal record (the intent, inside the tool)."""
    return index_of(store).ix.journals[run_id][-1]


def _spy_waits(store) -> list:
    """Record the thread of every wait for durability the store's backend is asked for."""
    b = backend_of(store)
    real, waits = b.wait_durable, []

    def spy(lsn):
        waits.append(threading.get_ident())
        return real(lsn)
    b.wait_durable = spy
    return waits


def _call(store, verb: str, at_most_once: bool, inside) -> tuple[int, int]:
    """One tool call of run "r" by ``run.tool`` or ``await run.atool``; ``inside()`` runs in
    the tool. Returns (the receipt's LSN, the durable position right after the call)."""
    log = backend_of(store)._log
    if verb == "tool":
        @durkv.tool(name="send", at_most_once=at_most_once)
        def send(n, *, idempotency_key):
            inside()
            return n
        with store.run("r") as run:
            assert run.tool(send, 7) == 7
            return _newest_lsn(store, "r"), log.durable_lsn

    @durkv.tool(name="send", at_most_once=at_most_once)
    async def asend(n, *, idempotency_key):
        inside()
        return n

    async def agent():
        async with store.arun("r") as run:
            assert await run.atool(asend, 7) == 7
            return _newest_lsn(store, "r"), log.durable_lsn
    return asyncio.run(agent())


@pytest.mark.parametrize("verb", ["tool", "atool"])
@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_an_at_most_once_tools_intent_and_receipt_are_fdatasynced_under_every_policy(
        tmp_path, durability, verb):
    with _open(tmp_path, durability) as s:
        log = backend_of(s)._log
        seen = []
        receipt, durable_after = _call(
            s, verb, True, lambda: seen.append((_newest_lsn(s, "r"), log.durable_lsn)))
        (intent, durable_inside), = seen
        assert durable_inside > intent, (
            f"{durability}: the at-most-once tool ran before an fdatasync covered its intent "
            f"(lsn {intent}, durable below {durable_inside})")
        assert durable_after > receipt, (
            f"{durability}: the at-most-once tool returned before an fdatasync covered its "
            f"receipt (lsn {receipt}, durable below {durable_after})")
        assert [e.kind for e in durkv.Run(s, "r").journal()] == ["tool"]


@pytest.mark.parametrize("verb", ["tool", "atool"])
@pytest.mark.parametrize("durability", ["async", "exit"])
def test_a_keyed_tool_waits_for_no_fdatasync_under_async_or_exit(tmp_path, durability, verb):
    """No commit fdatasync in the call path; yet the intent is written before the call (a
    second handle reads it: a kill keeps it) and the receipt before the return."""
    path = str(tmp_path / "s")
    with _open(tmp_path, durability) as s:
        log = backend_of(s)._log
        syncs, waits, seen = log.commit_syncs, _spy_waits(s), []

        def inside():
            intent = _newest_lsn(s, "r")
            with durkv.open(path, read_only=True) as r:      # what a kill would leave
                seen.append((intent, log.durable_lsn, [rec["e"] for rec in r.journal("r")]))
        receipt, durable_after = _call(s, verb, False, inside)
        (intent, durable_inside, written), = seen
        assert written[-1] == 3, "the intent was not written before the call"    # INTENT
        assert durable_inside <= intent and durable_after <= receipt, (
            "a keyed tool's intent or receipt was fdatasync'd under " + durability)
        assert log.commit_syncs == syncs and waits == []
        with durkv.open(path, read_only=True) as r:
            assert [rec["e"] for rec in r.journal("r")][-2:] == [4, 8]   # RECEIPT, STATUS
    with durkv.open(path) as s:                                  # and it replays
        assert durkv.Run(s, "r").journal()[0].result_receipt == 7


def test_many_keyed_tool_calls_under_async_take_no_commit_fdatasync(tmp_path):
    @durkv.tool
    def send(n, *, idempotency_key):
        return n

    with _open(tmp_path, "async") as s:
        log = backend_of(s)._log
        syncs = log.commit_syncs
        with s.run("r") as run:
            assert [run.tool(send, i) for i in range(200)] == list(range(200))
        assert log.commit_syncs == syncs
        s.flush()                                   # the policy's promise is still kept
        assert log.durable_lsn == log.next_lsn


@pytest.mark.parametrize("verb", ["tool", "atool"])
def test_a_keyed_tool_under_sync_calls_once_all_before_its_intent_is_durable(tmp_path, verb):
    """Under ``sync`` the records before a keyed tool's intent are fdatasync'd before the
    call (here they already were: each waited), the intent is only written (a second
    handle reads it: a kill keeps it), and the receipt is fdatasync'd before the return --
    one commit fdatasync a call, where the intent's own made two."""
    path = str(tmp_path / "s")
    with _open(tmp_path, "sync") as s:
        log = backend_of(s)._log
        seen = []

        def inside():
            intent = _newest_lsn(s, "r")
            with durkv.open(path, read_only=True) as r:      # what a kill would leave
                seen.append((intent, log.durable_lsn, log.commit_syncs,
                             [rec["e"] for rec in r.journal("r")]))
        syncs = log.commit_syncs
        receipt, durable_after = _call(s, verb, False, inside)
        (intent, durable_inside, syncs_inside, written), = seen
        assert written[-1] == 3, "the intent was not written before the call"    # INTENT
        assert durable_inside == intent, (
            f"inside the call: durable below {durable_inside}, intent at {intent} (the "
            "records before it must be durable, the intent need not)")
        assert durable_after > receipt
        assert syncs_inside - syncs == 1        # the RUN record's (sync), not the intent's
        assert log.commit_syncs - syncs_inside == 2   # the receipt's, the final STATUS's


@pytest.mark.parametrize("verb", ["tool", "atool"])
def test_a_keyed_tool_under_sync_waits_for_records_before_its_intent_not_yet_durable(
        tmp_path, verb):
    """A record appended without a wait (here one from another run, as an async store
    under a LangGraph `sync` invocation leaves its steps) is fdatasync'd before the call:
    the prefix the re-execution replays is durable before the tool runs."""
    with _open(tmp_path, "sync") as s:
        log = backend_of(s)._log
        with s.run("other") as run:
            run.step("model", lambda: 1)
        other = s.append_journal("other", {"e": 99, "t": 0.0}, written=True)
        assert log.durable_lsn <= other     # written, not fdatasync'd (the flusher sleeps)
        seen = []
        _call(s, verb, False, lambda: seen.append((_newest_lsn(s, "r"), log.durable_lsn)))
        (intent, durable_inside), = seen
        assert other < intent and durable_inside == intent


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_async_verbs_wait_for_no_fdatasync_on_the_loop(tmp_path, durability):
    """An at-most-once atool's owed fdatasyncs are waited for in a worker thread; a keyed
    atool under async owes none."""
    @durkv.tool(name="wire", at_most_once=True)
    async def wire(n, *, idempotency_key):
        return n

    @durkv.tool(name="send")
    async def send(n, *, idempotency_key):
        return n

    async def agent(store):
        async with store.arun("r") as run:
            await run.atool(wire, 1)
            n = len(waits)
            await run.atool(send, 2)
            keyed.append(len(waits) - n)
        return threading.get_ident()

    with _open(tmp_path, durability) as s:
        waits, keyed = _spy_waits(s), []
        loop_thread = asyncio.run(agent(s))
    assert len(waits) >= 2 and loop_thread not in waits     # wire's intent and receipt
    assert keyed == [0] if durability == "async" else keyed[0] >= 1


def test_the_store_says_whether_a_returned_commit_survives_a_kill(tmp_path):
    for durability in ("sync", "async", "exit"):
        with durkv.open(str(tmp_path / durability), durability=durability) as s:
            assert s.commits_survive_kill     # local: written when the section ends
        with durkv.open("memory://", durability=durability) as s:
            assert s.commits_survive_kill is (durability == "sync")


class _Log(TypedDict):
    log: Annotated[list, operator.add]


@pytest.mark.parametrize("verb", ["tool", "atool"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_langgraph_tool_follows_the_invocations_durability(tmp_path, mode, verb):
    """``DurkvSaver.open(url)`` opens its store ``async`` and fdatasyncs the checkpoints of
    a ``durability="sync"`` invocation: that invocation's keyed tools are fdatasync'd too
    (what precedes the intent before the call, the receipt before the return); an
    ``async`` one's are written."""
    pytest.importorskip("langgraph")
    from langgraph.graph import END, START, StateGraph

    from durkv.langgraph import DurkvSaver, atool, tool

    with DurkvSaver.open(str(tmp_path / "lg"), flush_interval_ms=SLOW_FLUSHER_MS) as saver:
        s, seen = saver.store, []
        log = backend_of(s)._log

        def inside():       # the thread's journal is run "t"'s
            seen.append((_newest_lsn(s, "t"), log.durable_lsn))

        @durkv.tool(name="send")
        def send(*, idempotency_key):
            inside()
            return "sent"

        @durkv.tool(name="asend")
        async def asend(*, idempotency_key):
            inside()
            return "sent"

        def node(state):
            out = tool(send)
            return {"log": [out, (_newest_lsn(s, "t"), log.durable_lsn)]}

        async def anode(state):
            out = await atool(asend)
            return {"log": [out, (_newest_lsn(s, "t"), log.durable_lsn)]}

        g = StateGraph(_Log)
        g.add_node("act", node if verb == "tool" else anode)
        g.add_edge(START, "act")
        g.add_edge("act", END)
        app = g.compile(checkpointer=saver)
        args = ({"log": []}, {"configurable": {"thread_id": "t"}})
        out = (app.invoke(*args, durability=mode) if verb == "tool"
               else asyncio.run(app.ainvoke(*args, durability=mode)))
        assert s.durability == "async" and out["log"][0] == "sent"
        (intent, durable_inside), = seen
        receipt, durable_after = out["log"][1]
        assert [r["e"] for r in s.journal("t")] == [1, 3, 4]      # RUN, INTENT, RECEIPT
        if mode == "sync":     # all before the intent durable before the call (16.9)
            assert durable_inside >= intent and durable_after > receipt
        else:
            assert durable_inside <= intent and durable_after <= receipt
