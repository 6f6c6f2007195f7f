"""run.step's C entry appends a new step's record itself (csrc/journalscan.c,
fast_append) only where Store.append_journal's one-call path would, and otherwise leaves
it to the Python methods having appended nothing: another process's frames, an index
snapshot due, a `sync` store, a closed or forked handle, a store whose append_journal is
wrapped. (That both paths write the same bytes: tests/test_runtime_stepentry.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import durkv
import pytest
from durkv.backends.local import LocalBackend
from durkv.runtime.view import describe


def model(i):
    return {"answer": i}


@pytest.fixture
def backend_calls(monkeypatch):
    calls = []
    for name in ("write_begin", "append_one", "append"):
        real = getattr(LocalBackend, name)
        monkeypatch.setattr(LocalBackend, name, lambda self, *a, _n=name, _r=real, **k:
                            calls.append(_n) or _r(self, *a, **k))
    return calls


def _steps(path, run_id, first, n, **kw):
    with durkv.open(path, **kw) as store, store.run(run_id) as run:
        return [run.step("model", model, i) for i in range(first, first + n)]


def test_async_and_exit_take_it_sync_and_memory_do_not(tmp_path, backend_calls):
    for policy, taken in (("async", True), ("exit", True), ("sync", False)):
        path = str(tmp_path / policy)
        with durkv.open(path, durability=policy) as store, store.run("r") as run:
            run.step("model", model, 0)            # the first record may catch the index up
            backend_calls.clear()
            before = store._b.next_lsn
            assert run.step("model", model, 1) == {"answer": 1}
            assert store._b.next_lsn == before + 1
            assert (backend_calls == []) is taken, (policy, backend_calls)
        with durkv.open(path) as store:
            assert [e.result_receipt for e in describe(store, "r")][:2] == [{"answer": 0},
                                                                     {"answer": 1}]
    with durkv.open("memory://", durability="async") as store:
        assert store._fast_journal is None
        with store.run("r") as run:
            assert run.step("model", model, 2) == {"answer": 2}


CHILD = """
import sys, durkv
with durkv.open(sys.argv[1], durability="async") as store, store.run("other") as run:
    run.step("model", lambda i: {"child": i}, 7)
"""


def test_another_process_appended_the_step_goes_after_its_frames(tmp_path, backend_calls):
    path = str(tmp_path / "s.durkv")
    with durkv.open(path, durability="async") as store, store.run("r") as run:
        run.step("model", model, 0)
        run.step("model", model, 1)
        subprocess.run([sys.executable, "-c", CHILD, path], check=True)
        backend_calls.clear()
        # the entry's append finds the log moved (DKV_MOVED: nothing appended); the
        # Python path catches up with the child's frames, then appends
        assert run.step("model", model, 2) == {"answer": 2}
        assert "write_begin" in backend_calls, backend_calls
        backend_calls.clear()
        assert run.step("model", model, 3) == {"answer": 3}
        assert backend_calls == []          # caught up: the entry appends again
        assert [e.result_receipt for e in describe(store, "other")][0] == {"child": 7}
    with durkv.open(path) as store:
        assert [e.result_receipt for e in describe(store, "r")][:4] == [
            {"answer": i} for i in range(4)]
        assert store.verify(deep=True).ok


def test_index_snapshots_fall_due_between_fast_appends(tmp_path):
    path = str(tmp_path / "s.durkv")
    assert _steps(path, "r", 0, 40, durability="async", index_every=7) == [
        {"answer": i} for i in range(40)]
    with durkv.open(path, index_every=7) as store:
        assert [e.result_receipt for e in describe(store, "r")][:40] == [
            {"answer": i} for i in range(40)]
        assert store.verify(deep=True).ok


def test_a_closed_store_or_a_forked_child_refuses(tmp_path):
    path = str(tmp_path / "s.durkv")
    store = durkv.open(path, durability="async")
    run = store.run("r").__enter__()
    run.step("model", model, 0)
    pid = os.fork()
    if pid == 0:        # the child: the parent's handle refuses, nothing is appended
        try:
            run.step("model", model, 1)
            os._exit(1)
        except durkv.DurkvError as e:
            os._exit(0 if "fork" in str(e) else 2)
        except BaseException:
            os._exit(3)
    assert os.waitpid(pid, 0)[1] == 0
    before = store._b.next_lsn
    store.close()
    with pytest.raises(durkv.DurkvError, match="closed"):
        run.step("model", model, 1)
    with durkv.open(path) as again:
        assert again._b.next_lsn >= before
        assert [e.result_receipt for e in describe(again, "r")][:1] == [{"answer": 0}]
        assert len([e for e in describe(again, "r") if e.kind == "step"]) == 1


def test_two_handles_alternating_each_find_the_log_moved(tmp_path):
    """Two stores open on one log in one process, their runs' steps alternating: every
    append of one moves the log under the other, whose entry then appends nothing and
    leaves the record to the Python path (DKV_MOVED). Every step is in the log once, in
    order, and the LSNs are dense."""
    path = str(tmp_path / "s.durkv")
    a = durkv.open(path, durability="async")
    b = durkv.open(path, durability="async")
    try:
        with a.run("ra") as ra, b.run("rb") as rb:
            for i in range(60):
                assert ra.step("model", model, i) == {"answer": i}
                assert rb.step("model", model, 1000 + i) == {"answer": 1000 + i}
    finally:
        a.close()
        b.close()
    with durkv.open(path) as store:
        for run_id, first in (("ra", 0), ("rb", 1000)):
            steps = [e for e in describe(store, run_id) if e.kind == "step"]
            assert [e.result_receipt for e in steps] == [{"answer": first + i}
                                                        for i in range(60)]
        assert store.verify(deep=True).ok


WORKER = """
import sys, threading, durkv
path, name = sys.argv[1], sys.argv[2]
store = durkv.open(path, durability="async")
def work(t):
    with store.run(f"{name}-{t}") as run:
        for i in range(300):
            assert run.step("model", lambda i: {"w": name, "t": t, "i": i}, i)["i"] == i
ts = [threading.Thread(target=work, args=(t,)) for t in range(2)]
for t in ts: t.start()
for t in ts: t.join()
store.close()
"""


def test_processes_and_threads_step_into_one_store(tmp_path):
    """Three processes of two threads each, run.step under `async` on one store at once:
    each record once, in its run's order, the log dense and verified."""
    path = str(tmp_path / "s.durkv")
    durkv.open(path, durability="async").close()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, path, f"p{k}"])
             for k in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    with durkv.open(path) as store:
        for k in range(3):
            for t in range(2):
                steps = [e for e in describe(store, f"p{k}-{t}") if e.kind == "step"]
                assert [e.result_receipt["i"] for e in steps] == list(range(300))
        assert store.verify(deep=True).ok


@pytest.mark.parametrize("where", ["class", "instance"])
def test_a_wrapped_append_journal_is_called_as_ever(tmp_path, monkeypatch, where):
    """A caller that wraps the store's append_journal (or pack_journal) -- to watch its
    records, say -- sees a new step's record: the entry appends itself only through
    Store's own methods."""
    from durkv.store import Store

    seen = []
    path = str(tmp_path / "s.durkv")
    with durkv.open(path, durability="async") as store, store.run("r") as run:
        run.step("model", model, 0)
        real = Store.append_journal
        if where == "class":
            monkeypatch.setattr(Store, "append_journal", lambda self, run_id, rec, **k:
                                seen.append(run_id) or real(self, run_id, rec, **k))
        else:
            monkeypatch.setattr(store, "append_journal", lambda run_id, rec, **k:
                                seen.append(run_id) or real(store, run_id, rec, **k))
        assert run.step("model", model, 1) == {"answer": 1}
        assert seen == ["r"]
        monkeypatch.undo()
        assert run.step("model", model, 2) == {"answer": 2}
        assert seen == ["r"]                # Store's own again: the entry appends itself


def test_an_async_step_record_is_fdatasynced_by_the_flusher(tmp_path, backend_calls):
    """The async promise for a record the entry appended itself (a power loss is not a
    kill: the witness is the log's durable position and the flusher's fdatasyncs): it is
    written before run.step returns and made durable within flush_interval_ms, with no
    flush asked for."""
    path = str(tmp_path / "s.durkv")
    with durkv.open(path, durability="async", flush_interval_ms=10) as store, \
            store.run("r") as run:
        run.step("model", model, 0)
        log = store._b._log
        store.flush()               # nothing owed: only this record can make the flusher sync
        time.sleep(0.05)
        backend_calls.clear()
        syncs = log.flusher_syncs
        run.step("model", model, 1)
        lsn = store._b.next_lsn - 1
        assert backend_calls == []                  # the entry appended it
        deadline = time.monotonic() + 5
        while log.durable_lsn <= lsn and time.monotonic() < deadline:
            time.sleep(0.002)
        assert log.durable_lsn > lsn
        assert log.flusher_syncs > syncs
