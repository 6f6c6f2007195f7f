"""``async`` commits are fdatasync'd by the flusher within ``flush_interval`` (issue 15, item 1).

A kill -9 cannot tell an ``async`` commit that reached the OS from one that reached the
disk: both survive it. A power loss can. The witnesses here are the log's durable
position (frames below ``durable_lsn`` were fdatasync'd) and counted fdatasyncs
(``SegmentLog.flusher_syncs``, ``durkv.log.fdatasync_count()``), read while the
process runs -- at the log, the store and through a LangGraph graph. On 70cd864 the
store's queue/settle path (an ``exit`` append, then ``wait_written``) never woke the
flusher: the durable position stayed where open left it until close.
"""

from __future__ import annotations

import operator
import threading
import time
from typing import Annotated, TypedDict

import pytest

import durkv
from durkv import log as dlog
from storeinternals import backend_of

N = 100
CATCH_UP_S = 1.0     # flush_interval is 10 ms: a second is two orders of magnitude of slack


def _catch_up(log, target: int) -> float | None:
    """Seconds until ``log.durable_lsn`` reaches ``target`` (None: not within CATCH_UP_S)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < CATCH_UP_S:
        if log.durable_lsn >= target:
            return time.monotonic() - t0
        time.sleep(0.002)
    return None


def _assert_durable_soon(log, what: str) -> None:
    target = log.next_lsn
    waited = _catch_up(log, target)
    assert waited is not None, (
        f"{what}: durable position {log.durable_lsn} of {target} after {CATCH_UP_S}s "
        f"(flusher fdatasyncs: {log.flusher_syncs}); async commits are not being synced")


# ---- the C log -----------------------------------------------------------------------------


def test_log_async_appends_are_synced_by_the_flusher(tmp_path):
    with dlog.SegmentLog.open(tmp_path / "l", durability="async") as log:
        start, syncs, procs = log.durable_lsn, log.flusher_syncs, dlog.fdatasync_count()
        for i in range(N):
            log.append(b"x%d" % i)
        assert log.next_lsn == start + N
        _assert_durable_soon(log, "async appends")
        assert log.flusher_syncs > syncs and dlog.fdatasync_count() > procs


def test_log_queued_frames_given_the_async_promise_are_synced(tmp_path):
    """The store's path: a frame queued under ``exit`` (under the store lock), then
    ``wait_written`` outside it. That wait is the whole async promise: written now,
    fdatasync'd by the flusher within flush_interval -- not only at close."""
    with dlog.SegmentLog.open(tmp_path / "l", durability="async") as log:
        start, syncs = log.durable_lsn, log.flusher_syncs
        for i in range(N):
            lsn = log.append(b"x%d" % i, durability="exit")
            log.wait_written(lsn)
        assert log.commit_syncs == 0, "wait_written itself must not fdatasync (group commit)"
        _assert_durable_soon(log, "queued + wait_written")
        assert log.durable_lsn == start + N and log.flusher_syncs > syncs


def test_log_section_ended_async_writes_and_hands_its_frames_to_the_flusher(tmp_path):
    """The store's async commit in one call: frames queued under ``exit`` in a write
    section; ``write_end_async`` ends it, and they are in the file at once and fdatasync'd
    by the flusher soon after -- what ``wait_written`` of the last one would add. A nested
    section's end writes nothing (False): its frames wait for the outermost end."""
    path = tmp_path / "l"
    with dlog.SegmentLog.open(path, durability="async") as log:
        start, syncs = log.durable_lsn, log.flusher_syncs
        log.write_begin()
        log.write_begin()
        log.append(b"inner", durability="exit")
        assert log.write_end_async() is False       # nested: nothing written yet
        for i in range(N):
            log.append(b"x%d" % i, durability="exit")
        assert log.write_end_async() is True
        assert log.commit_syncs == 0, "it must not fdatasync itself (group commit)"
        with dlog.SegmentLog.open(path, read_only=True) as reader:   # in the file now
            assert [p for _, p in reader.scan()][-1] == b"x%d" % (N - 1)
        _assert_durable_soon(log, "write_end_async")
        assert log.durable_lsn == start + N + 1 and log.flusher_syncs > syncs


def test_log_exit_appends_stay_unsynced_until_flush(tmp_path):
    """``exit`` is unchanged: nothing is written or synced until flush/close."""
    with dlog.SegmentLog.open(tmp_path / "l", durability="exit") as log:
        start = log.durable_lsn
        procs = dlog.fdatasync_count()
        for i in range(N):
            log.append(b"x%d" % i)
        time.sleep(0.1)         # ten flush intervals
        assert log.durable_lsn == start and log.flusher_syncs == 0
        assert dlog.fdatasync_count() == procs
        log.flush()
        assert log.durable_lsn == start + N


def test_log_async_frames_written_behind_a_cross_process_fsync_wait_are_synced(tmp_path):
    """Handles A, B and C on one log stand for three processes. B's fdatasync is slow
    (800 ms) and holds the store's fsync turn. A's thread waits in that turn for B's
    fsync to cover A's earlier frame. Meanwhile A's section appends an ``async`` frame;
    the waiter's leadership makes the section write it at once. C waits for the write
    lock, so the section keeps no lease (the lease would wake A's flusher).

    B's cover was taken before that write, so only A's flusher can sync the frame. On
    bbc3549 nothing woke the parked flusher: the frame stayed unsynced until the next
    commit or close (2 s and more in the reproducer)."""
    path = tmp_path / "l"
    with dlog.SegmentLog.open(path, durability="async") as a, \
            dlog.SegmentLog.open(path, durability="sync") as b, dlog.SegmentLog.open(path) as c:
        a.append(b"a0", durability="sync")
        a1 = a.append(b"a1", durability="exit")     # written, not synced
        time.sleep(0.05)            # A's lease lapses: its flusher parks until work comes
        threads = []
        try:
            dlog.fault_inject("fdatasync", 1, pause_ms=800)
            threads.append(threading.Thread(target=b.append, args=(b"b",)))
            threads[-1].start()                     # B's sync commit: its fsync covers a1
            time.sleep(0.1)
            threads.append(threading.Thread(target=a.wait_durable, args=(a1,)))
            threads[-1].start()                     # A waits in B's fsync turn
            time.sleep(0.05)
            a.write_begin()

            def c_section():
                c.write_begin()
                c.write_end()
            threads.append(threading.Thread(target=c_section))
            threads[-1].start()                     # C wants the write lock
            time.sleep(0.05)
            a2 = a.append(b"a2", durability="async")
            a.write_end()
            assert a.durable_lsn <= a1, "the scenario needs B's fsync still running here"
        finally:
            for t in threads:
                t.join()
            dlog.fault_inject(None)
        assert _catch_up(a, a2 + 1) is not None, (
            f"the async frame {a2} was not synced within {CATCH_UP_S}s (durable position "
            f"{a.durable_lsn}; A's flusher fdatasyncs: {a.flusher_syncs})")


# ---- the store -----------------------------------------------------------------------------


def _put(store, i: int, thread: str = "t") -> None:
    store.put(thread, "", f"{i:06d}", checkpoint={}, metadata={"step": i},
              values={"n": i}, versions={"n": i})


def test_store_async_puts_are_fdatasynced_while_the_process_runs(tmp_path):
    with durkv.open(str(tmp_path / "s"), durability="async") as store:
        log = backend_of(store)._log
        syncs, procs = log.flusher_syncs, dlog.fdatasync_count()
        for i in range(N):
            _put(store, i)
        _assert_durable_soon(log, "store.put under async")
        assert log.flusher_syncs > syncs and dlog.fdatasync_count() > procs


def test_store_async_put_writes_and_journal_are_fdatasynced(tmp_path):
    with durkv.open(str(tmp_path / "s"), durability="async") as store:
        log = backend_of(store)._log
        _put(store, 0)
        for i in range(N):
            store.put_writes("t", "", "000000", f"task{i}", [(0, "n", i)])
        _assert_durable_soon(log, "store.put_writes under async")
        for i in range(N):
            store.append_journal("run", {"i": i})
        _assert_durable_soon(log, "store.append_journal under async")


def test_store_exit_policy_unchanged(tmp_path):
    with durkv.open(str(tmp_path / "s"), durability="exit") as store:
        log = backend_of(store)._log
        start, procs = log.durable_lsn, dlog.fdatasync_count()
        for i in range(N):
            _put(store, i)
        time.sleep(0.1)
        assert log.durable_lsn == start and dlog.fdatasync_count() == procs
        store.flush()
        assert log.durable_lsn == log.next_lsn


def test_store_sync_puts_are_durable_on_return(tmp_path):
    with durkv.open(str(tmp_path / "s"), durability="sync") as store:
        log = backend_of(store)._log
        for i in range(10):
            _put(store, i)
            assert log.durable_lsn == log.next_lsn


# ---- through LangGraph ---------------------------------------------------------------------


class _State(TypedDict):
    msgs: Annotated[list, operator.add]


def _graph():
    lg = pytest.importorskip("langgraph.graph")
    g = lg.StateGraph(_State)
    g.add_node("think", lambda s: {"msgs": [f"thought {len(s['msgs'])}"]})
    g.add_node("act", lambda s: {"msgs": [f"acted {len(s['msgs'])}"]})
    g.add_edge(lg.START, "think")
    g.add_edge("think", "act")
    g.add_edge("act", lg.END)
    return g


def test_langgraph_default_durability_is_fdatasynced(tmp_path):
    """``DurkvSaver`` follows LangGraph's ``durability=``, whose default is ``async``."""
    from durkv.langgraph import DurkvSaver

    with DurkvSaver.open(str(tmp_path / "lg.durkv")) as saver:
        app = _graph().compile(checkpointer=saver)
        log = backend_of(saver.store)._log
        syncs, procs = log.flusher_syncs, dlog.fdatasync_count()
        for t in range(20):
            out = app.invoke({"msgs": ["hi"]}, {"configurable": {"thread_id": f"t{t}"}})
            assert out["msgs"][-1] == "acted 2"
        assert log.next_lsn >= 20 * 4
        _assert_durable_soon(log, "LangGraph invoke, durability async")
        assert log.flusher_syncs > syncs and dlog.fdatasync_count() > procs
