"""Concurrent committers share fsyncs: no store lock is held while a commit waits for
its write or its fdatasync (``Appender.queue`` / ``Appender.settle`` in durkv.store).

Had a commit waited under the lock -- as an ``async`` append did, behind a running
group-commit fdatasync -- the committers of other threads would queue on the lock one
fsync apart and never share one (docs/BENCHMARKS.md, "store, 8 threads").
"""

from __future__ import annotations

import threading

import durkv
from storeinternals import backend_of, lock_of


def _lock_is_free(store) -> bool:
    """Another thread can take the store lock now (as a concurrent committer would)."""
    got = []

    def take() -> None:
        ok = lock_of(store).acquire(timeout=5)
        got.append(ok)
        if ok:
            lock_of(store).release()
    t = threading.Thread(target=take)
    t.start()
    t.join()
    return got[0]


def test_put_and_put_writes_wait_outside_the_store_lock(tmp_path):
    with durkv.open(f"file://{tmp_path}/s", durability="sync") as store:
        backend = backend_of(store)
        waits = []
        for name in ("wait_durable", "wait_written"):
            real = getattr(backend, name)

            def wait(lsn, _real=real, _name=name):
                waits.append((_name, _lock_is_free(store)))
                return _real(lsn)
            setattr(backend, name, wait)
        store.put("t", "", "0001", checkpoint={}, metadata={}, values={"n": 1},
                  versions={"n": 1})
        store.put_writes("t", "", "0001", "task", [(0, "n", 2)])       # default: async
        store.put_writes("t", "", "0001", "task2", [(0, "n", 3)], durability="sync")
        # the async write waits for nothing: the end of its write section wrote it and
        # handed it to the flusher in the same call (test_async_durability)
        assert waits == [("wait_durable", True), ("wait_durable", True)]


def test_async_put_writes_are_in_the_file_when_put_writes_returns(tmp_path):
    url = f"file://{tmp_path}/s"
    with durkv.open(url, durability="sync") as store:
        store.put("t", "", "0001", checkpoint={}, metadata={}, values={"n": 1},
                  versions={"n": 1})
        store.put_writes("t", "", "0001", "task", [(0, "n", 2)], durability="async")
        with durkv.open(url, read_only=True) as reader:
            assert [(w.task_id, w.value) for w in reader.get("t").writes] == [("task", 2)]


def test_eight_threads_of_sync_commits_read_back_whole(tmp_path):
    url = f"file://{tmp_path}/s"
    n = 40

    def agent(i: int) -> None:
        parent = None
        for k in range(n):
            cid = f"{k:04d}"
            if parent:
                store.put_writes(f"t{i}", "", parent, "task", [(0, "m", [k])])
            store.put(f"t{i}", "", cid, checkpoint={"k": k}, metadata={}, values={"n": k},
                      versions={"n": k + 1}, parent_id=parent)
            parent = cid

    with durkv.open(url, durability="sync") as store:
        threads = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    with durkv.open(url, read_only=True) as store:
        for i in range(8):
            latest = store.get(f"t{i}")
            assert latest.checkpoint_id == f"{n - 1:04d}" and latest.values == {"n": n - 1}
            assert [w.value for w in store.get(f"t{i}", "", f"{n - 2:04d}").writes] == [[n - 1]]
