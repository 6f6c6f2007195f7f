"""A handle opened before ``os.fork()`` does nothing in the child (issue 15, item 6).

Opened before a fork (gunicorn ``--preload``, multiprocessing's fork start method), a
store handle, its log and its writer lock were shared by the parent and every child:
all of them appended frames at the same file offsets, and ``verify`` then exited 3.
Now a handle refuses every call in a process other than the one that opened it, with a
``ConfigError`` that says to open the store again after the fork; the child's exit or
garbage collection never writes, fsyncs or truncates the parent's files; the parent goes
on as if nothing happened (docs/GUARANTEES.md section 8).

The scenarios run in fresh interpreters (``sys.executable``) that fork for real and
exit normally, so that ``atexit`` handlers and the garbage collector of the child run
as they do in production; LangGraph and multiprocessing run in this process.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import operator
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated, TypedDict

import pytest

import durkv
from durkv import log as dlog
from durkv.errors import ConfigError

FORK_WORDS = ("is a fork of it", "open the store again")


def _run(script: str, *args: str, timeout: int = 60) -> list[dict]:
    """Run ``script`` in a fresh interpreter; it prints one JSON object per line."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _digest(path: Path) -> str:
    """The bytes of every segment file of a log (what a child must never change)."""
    h = hashlib.sha256()
    for p in sorted(path.glob("*.seg")):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def _verify_clean(path: Path) -> None:
    report = dlog.verify(path, deep=True)
    assert report.ok, report.damage
    cli = subprocess.run([sys.executable, "-m", "durkv.cli", "verify", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stdout + cli.stderr


# ---- the C log: the check below Python -----------------------------------------------------


def test_c_handle_refuses_every_call_in_a_forked_child(tmp_path):
    """A handle opened through the C API alone (no Python hook knows it): in the child
    every call returns DKV_EFORKED without taking its mutex, and close only closes the
    child's descriptors (no write, no fsync of the parent's pending frames)."""
    from durkv._seglog import ffi, lib

    path = tmp_path / "raw"
    opt = ffi.new("dkv_options *")
    opt.durability = lib.DKV_EXIT
    out = ffi.new("dkv_log **")
    assert lib.dkv_open(str(path).encode(), opt, out) == 0
    h = out[0]
    first = ffi.new("uint64_t *")
    assert lib.dkv_append(h, lib.DKV_FRAME_DATA, b"before", 6, -1, first) == 0
    before = _digest(path)      # "before" is queued in C, not yet written (exit policy)
    pid = os.fork()
    if pid == 0:    # the child: report through the exit code only
        code = 13       # anything raised
        try:
            lsn = lib.dkv_append_lsn(h, lib.DKV_FRAME_DATA, b"child", 5, -1)
            buf, ln, ty = ffi.new("uint8_t **"), ffi.new("uint32_t *"), ffi.new("uint8_t *")
            calls = [lsn, lib.dkv_append_one(h, lib.DKV_FRAME_DATA, b"child", 5, -1, 1),
                     lib.dkv_read_alloc(h, 0, buf, ln, ty), lib.dkv_flush(h),
                     lib.dkv_wait_durable(h, 0), lib.dkv_wait_written(h, 0)]
            if any(rc != lib.DKV_EFORKED for rc in calls):
                code = 10
            elif b"is a fork of it" not in ffi.string(lib.dkv_last_error(h)):
                code = 11
            elif lib.dkv_close(h) != 0:
                code = 12
            else:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _digest(path) == before, "the child wrote to the parent's log"
    assert lib.dkv_append(h, lib.DKV_FRAME_DATA, b"after", 5, -1, first) == 0
    assert lib.dkv_close(h) == 0
    lib.dkv_destroy(h)
    with dlog.SegmentLog.open(path, read_only=True) as log:
        assert [p for _, p in log.scan()] == [b"before", b"after"]
    _verify_clean(path)


# ---- SegmentLog: buffered `exit` frames are the parent's alone -----------------------------

LOG_SCRIPT = """
import json, os, sys
from durkv import log as dlog
path = sys.argv[1]
log = dlog.SegmentLog.open(path, durability="exit")
for i in range(10):
    log.append(b"parent-%d" % i)          # buffered: written at the parent's flush/close
sys.stdout.flush()
pid = os.fork()
if pid == 0:
    out = {"who": "child"}
    for name, call in (("append", lambda: log.append(b"child")), ("read", lambda: log.read(0)),
                       ("flush", log.flush), ("next_lsn", lambda: log.next_lsn)):
        try:
            call()
            out[name] = "allowed"
        except dlog.ConfigError as e:
            out[name] = str(e)
    log.close()     # and then a normal exit: atexit and the collector run
    print(json.dumps(out)); sys.stdout.flush()
    sys.exit(0)
os.waitpid(pid, 0)
print(json.dumps({"who": "parent-after-child", "next_lsn": log.next_lsn}))
for i in range(10, 20):
    log.append(b"parent-%d" % i)
log.close()
"""


def test_log_child_refuses_and_never_writes_the_parents_buffered_frames(tmp_path):
    path = tmp_path / "l"
    with dlog.SegmentLog.open(path):
        pass                    # a log with only its segment header
    before = _digest(path)
    script = LOG_SCRIPT.replace("log.close()     # and", "assert True     # and")
    # first: the child exits WITHOUT closing (the atexit flush of a live handle)
    child, parent = _run(script, str(path))
    assert _digest(path) != before     # the parent wrote at its close, after the child
    assert parent["next_lsn"] == 10
    for name in ("append", "read", "flush", "next_lsn"):
        assert all(w in child[name] for w in FORK_WORDS), (name, child[name])
    with dlog.SegmentLog.open(path, read_only=True) as log:
        assert [p for _, p in log.scan()] == [b"parent-%d" % i for i in range(20)]
    _verify_clean(path)


def test_log_child_exit_leaves_the_parents_files_untouched(tmp_path):
    """Witness: the segment bytes right after the child exited (close, atexit, gc) are
    the bytes before the fork; the parent's 10 buffered frames were written once, by it."""
    path = tmp_path / "l"
    script = LOG_SCRIPT.replace(
        'os.waitpid(pid, 0)\n',
        'os.waitpid(pid, 0)\nimport hashlib, glob\n'
        'print(json.dumps({"who": "digest", "d": [open(p, "rb").read().hex() '
        'for p in sorted(glob.glob(path + "/*.seg"))]}))\n')
    script = script.replace('sys.stdout.flush()\npid = os.fork()',
                            'print(json.dumps({"who": "digest", "d": [open(p, "rb").read().hex()'
                            ' for p in sorted(__import__("glob").glob(path + "/*.seg"))]}))\n'
                            'sys.stdout.flush()\npid = os.fork()')
    before_fork, child, after_child, parent = _run(script, str(path))
    assert child["who"] == "child" and after_child["who"] == "digest"
    assert after_child["d"] == before_fork["d"], "the child's exit wrote to the parent's log"
    with dlog.SegmentLog.open(path, read_only=True) as log:
        assert [p for _, p in log.scan()] == [b"parent-%d" % i for i in range(20)]
    _verify_clean(path)


# ---- the store -----------------------------------------------------------------------------

STORE_SCRIPT = """
import json, os, sys, threading
import durkv
path, durability = sys.argv[1], sys.argv[2]
store = durkv.open(path, durability=durability)
def put(i, thread="t"):
    store.put(thread, "", "%06d" % i, checkpoint={}, metadata={"step": i}, values={"n": i},
              versions={"n": i})
for i in range(50):
    put(i)
store.append_journal("run", {"i": 0})
# another thread holds the store lock at the moment of the fork (a commit in flight)
held, release = threading.Event(), threading.Event()
def hold():
    with store._lock:
        held.set(); release.wait()
t = threading.Thread(target=hold); t.start(); held.wait()
sys.stdout.flush()
pid = os.fork()
if pid == 0:
    import signal
    signal.alarm(20)        # a call that hangs on the parent's lock fails the test
    out = {"who": "child"}
    calls = {"put": lambda: put(999, "child"),
             "append_journal": lambda: store.append_journal("run", {"i": "child"}),
             "get": lambda: store.get("t"), "history": lambda: list(store.history("t")),
             "journal": lambda: store.journal("run"), "flush": store.flush,
             "size_bytes": store.size_bytes, "pending_repairs": store.pending_repairs,
             "refresh_if_moved": store.refresh_if_moved}
    for name, call in calls.items():
        try:
            call()
            out[name] = "allowed"
        except durkv.DurkvError as e:
            out[name] = type(e).__name__ + ": " + str(e)
    # the fix the message gives: open the store in the child (a reader here: the parent
    # is still the writer)
    with durkv.open(path, read_only=True) as mine:
        out["reopened_reads"] = len(list(mine.history("t")))
    store.close()
    print(json.dumps(out)); sys.stdout.flush()
    sys.exit(0)
release.set(); t.join()
os.waitpid(pid, 0)
for i in range(50, 100):
    put(i)
store.close()
with durkv.open(path, read_only=True) as s:
    print(json.dumps({"who": "parent", "ids": [c.checkpoint_id for c in s.history()],
                      "journal": s.journal("run")}))
"""


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_store_child_refuses_and_the_parent_loses_nothing(tmp_path, durability):
    path = tmp_path / "s"
    child, parent = _run(STORE_SCRIPT, str(path), durability)
    # size_bytes, pending_repairs and refresh_if_moved answered from the frozen copy
    for name in ("put", "append_journal", "get", "history", "journal", "flush", "size_bytes",
                 "pending_repairs", "refresh_if_moved"):
        assert child[name].startswith("ConfigError: "), (name, child[name])
        assert all(w in child[name] for w in FORK_WORDS), child[name]
    # what the parent had made visible at the fork: every commit (`exit` too: a store's
    # frames are written when their write section ends, FORMAT.md 12; only the fsync
    # waits for close)
    assert child["reopened_reads"] == 50
    assert parent["ids"] == ["%06d" % i for i in reversed(range(100))]
    assert parent["journal"] == [{"i": 0}]
    _verify_clean(path)


def test_parent_can_close_and_reopen_while_a_forked_child_lives(tmp_path):
    """The child lets go of its copies of the log's descriptors at the fork (in its
    after-fork hook, before any of its own code runs): the writer lock, a flock on the
    parent's LOCK file description, is the parent's alone again."""
    path = str(tmp_path / "s")
    store = durkv.open(path)
    store.put("t", "", "1", checkpoint={}, metadata={}, values={"n": 1}, versions={"n": 1})
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.write(ready_w, b"r")     # its code runs: the after-fork hooks have run
        os.read(r, 1)               # live until the parent says so
        os._exit(0)
    os.close(r)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"r"
        store.close()
        with durkv.open(path) as again:     # on 70cd864: StoreLockedError (pid = our own)
            again.put("t", "", "2", checkpoint={}, metadata={}, values={"n": 2},
                      versions={"n": 2})
    finally:
        os.write(w, b"x")
        os.close(w)
        os.close(ready_r)
        os.waitpid(pid, 0)
    _verify_clean(Path(path))


def test_memory_store_refuses_in_a_forked_child():
    store = durkv.open("memory://")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            store.put("t", "", "1", checkpoint={}, metadata={}, values={}, versions={})
        except ConfigError as e:
            code = 0 if "is a fork of it" in str(e) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.put("t", "", "1", checkpoint={}, metadata={}, values={"n": 1}, versions={"n": 1})
    assert store.get("t").values == {"n": 1}


# ---- multiprocessing (fork start method) ---------------------------------------------------

_INHERITED = {}


def _child_put(i: int, q) -> None:
    store = _INHERITED["store"]
    try:
        store.put(f"worker{i}", "", "1", checkpoint={}, metadata={}, values={"n": i},
                  versions={"n": 1})
        q.put(("wrote", i))
    except ConfigError as e:
        q.put(("ConfigError", str(e)))


def test_multiprocessing_fork_workers_refuse_and_the_parent_continues(tmp_path):
    path = tmp_path / "s"
    ctx = multiprocessing.get_context("fork")
    with durkv.open(str(path), durability="async") as store:
        _INHERITED["store"] = store
        store.put("parent", "", "1", checkpoint={}, metadata={}, values={"n": 0},
                  versions={"n": 1})
        q = ctx.Queue()
        procs = [ctx.Process(target=_child_put, args=(i, q)) for i in range(4)]
        for p in procs:
            p.start()
        for i in range(2, 40):          # the parent commits while its children try
            store.put("parent", "", str(i), checkpoint={}, metadata={}, values={"n": i},
                      versions={"n": i})
        got = [q.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        _INHERITED.clear()
        assert all(kind == "ConfigError" and "is a fork of it" in msg for kind, msg in got), got
        assert store.threads() == ["parent"]
    with durkv.open(str(path), read_only=True) as s:
        assert len(list(s.history("parent"))) == 39 and s.threads() == ["parent"]
    _verify_clean(path)


# ---- DurkvSaver ----------------------------------------------------------------------------


class _State(TypedDict):
    msgs: Annotated[list, operator.add]


def _app(saver):
    lg = pytest.importorskip("langgraph.graph")
    g = lg.StateGraph(_State)
    g.add_node("step", lambda s: {"msgs": [f"m{len(s['msgs'])}"]})
    g.add_edge(lg.START, "step")
    g.add_edge("step", lg.END)
    return g.compile(checkpointer=saver)


def _child_invoke(q) -> None:
    app = _INHERITED["app"]
    try:
        app.invoke({"msgs": ["child"]}, {"configurable": {"thread_id": "child"}})
        q.put(("invoked", ""))
    except ConfigError as e:
        q.put(("ConfigError", str(e)))


def test_durkv_saver_refuses_in_a_forked_worker(tmp_path):
    from durkv.langgraph import DurkvSaver

    path = tmp_path / "lg.durkv"
    ctx = multiprocessing.get_context("fork")
    with DurkvSaver.open(str(path)) as saver:
        app = _app(saver)
        app.invoke({"msgs": ["a"]}, {"configurable": {"thread_id": "parent"}})
        _INHERITED["app"] = app
        q = ctx.Queue()
        p = ctx.Process(target=_child_invoke, args=(q,))
        p.start()
        kind, msg = q.get(timeout=60)
        p.join(60)
        _INHERITED.clear()
        assert p.exitcode == 0
        assert kind == "ConfigError" and all(w in msg for w in FORK_WORDS), (kind, msg)
        out = app.invoke({"msgs": ["b"]}, {"configurable": {"thread_id": "parent"}})
        assert out["msgs"] == ["a", "m1", "b", "m3"]
        assert saver.store.threads() == ["parent"]
    _verify_clean(path)


@pytest.mark.parametrize("module, name", [
    ("durkv.runtime.langgraph_steps", "_lock"), ("durkv.runtime.run", "_open_lock"),
    ("durkv.runtime.remote", "_guard"), ("durkv.store.drivers", "_releasing")])
def test_a_module_lock_another_thread_held_at_the_fork_is_free_in_the_child(module, name):
    # a server forking while a thread folded a Run under langgraph_steps' lock: the child
    # (which opens the store itself) hung for ever in its first durable step
    import importlib
    import threading

    mod = importlib.import_module(module)
    held, done = threading.Event(), threading.Event()

    def hold():
        with getattr(mod, name):
            held.set()
            done.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:        # the child: only this thread; the holder does not exist here
            os._exit(0 if getattr(mod, name).acquire(timeout=5) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        done.set()
        t.join()
