"""Several processes, one local store (issue 17; docs/FORMAT.md section 12).

The model check: N processes x M threads commit journal records and checkpoints to one
store at once. Each commit is acknowledged (a line on the child's stdout) only after it
returned. Afterwards every acknowledged commit is in the store exactly once, in its
thread's order, the log's LSNs are dense (0 .. next_lsn-1, no frame twice), `verify` is
clean, and what each process read while the others wrote never went backwards.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

import pytest

import durkv
from durkv.errors import LogFailedError, StoreLockedError
from durkv.log import SegmentLog, fdatasync_count, verify

_CHILD = r"""
import json, sys, threading
import durkv
path, k, m, n, seg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
s = durkv.open(path, segment_bytes=seg, durability=sys.argv[6])
out = sys.stdout
lock = threading.Lock()
seen = {"len": -1, "lsn": -1}
def say(**kw):
    with lock:
        out.write(json.dumps(kw) + "\n")
        out.flush()
def work(j):
    run = f"p{k}t{j}"
    for i in range(n):
        if i % 3 == 2:
            s.put(run, "", f"{i:06d}", checkpoint={"i": i}, metadata={}, values={"v": [k, j, i]},
                  versions={"v": i + 1})
            say(ck=run, i=i)
        else:
            s.append_journal(run, {"i": i}, durable=(i % 2 == 0))
            say(j=run, i=i)
        # monotonic reads: another process's run never shrinks, our next LSN never falls
        other = f"p{(k + 1) % 4}t0"
        with lock:
            ln = s.journal_length(other)
            lsn = s._b.next_lsn
            if ln < seen["len"] or lsn < seen["lsn"]:
                say(bad=[ln, seen["len"], lsn, seen["lsn"]])
            seen["len"], seen["lsn"] = ln, lsn
ts = [threading.Thread(target=work, args=(j,)) for j in range(m)]
for t in ts: t.start()
for t in ts: t.join()
s.close()
say(done=k)
"""


def _spawn(path, k, m, n, seg, durability):
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(k), str(m), str(n),
                             str(seg), durability], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# one segment; many rolls; async: a record not waited for is appended in a section of its
# own by one backend call, which appends nothing when another process moved the log
@pytest.mark.parametrize("seg,durability", [(64 << 20, "sync"), (16384, "sync"),
                                            (16384, "async")])
def test_processes_and_threads_commit_to_one_store(tmp_path, seg, durability):
    path = tmp_path / "s.durkv"
    nproc, m, n = 4, 3, 60
    procs = [_spawn(path, k, m, n, seg, durability) for k in range(nproc)]
    acked: dict[str, list[int]] = {}
    cks: dict[str, list[int]] = {}
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        for line in out.splitlines():
            rec = json.loads(line)
            assert "bad" not in rec, f"a read went backwards: {rec}"
            if "j" in rec:
                acked.setdefault(rec["j"], []).append(rec["i"])
            elif "ck" in rec:
                cks.setdefault(rec["ck"], []).append(rec["i"])
    assert len(acked) == nproc * m
    with durkv.open(str(path), read_only=True) as s:
        for run, got in acked.items():
            assert [r["i"] for r in s.journal(run)] == got, run     # once each, in order
            assert got == [i for i in range(n) if i % 3 != 2]
        for run, ids in cks.items():
            k, j = int(run[1]), int(run[3])
            assert [c.checkpoint_id for c in s.history(run)] == [f"{i:06d}" for i in
                                                                reversed(ids)]
            assert s.get(run).values == {"v": [k, j, ids[-1]]}
    with SegmentLog.open(str(path), read_only=True) as log:
        lsns = [lsn for lsn, _t, _p in log.scan_frames(0)]
        assert lsns == list(range(log.next_lsn)), "LSNs are dense, each once"
    report = verify(str(path), deep=True)
    assert report.ok, report.damage
    if seg < 1 << 20:
        assert len(report.segments) > 4          # the rolls of several writers chained


def test_a_second_handle_in_one_process_sees_and_extends_the_first(tmp_path):
    path = str(tmp_path / "s.durkv")
    with durkv.open(path) as a, durkv.open(path) as b:
        for i in range(20):
            w, r = (a, b) if i % 2 == 0 else (b, a)
            w.put("t", "", f"{i:04d}", checkpoint={}, metadata={}, values={"n": i},
                  versions={"n": i + 1})
            assert r.get("t").values == {"n": i}          # current without a refresh
        # idempotent pending writes hold across handles: the second is a retry, ignored
        a.put_writes("t", "", "0019", "task", [(0, "ch", "first")])
        b.put_writes("t", "", "0019", "task", [(0, "ch", "second")])
        assert [w.value for w in a.get("t").writes] == ["first"]
        assert [w.value for w in b.get("t").writes] == ["first"]
    assert verify(path).ok


def test_append_one_appends_nothing_when_another_writer_moved_the_log(tmp_path):
    """``append_one``: begin + append + end in one call, only where the caller's view of
    the log (``expect``) is the log, caught up with the other writers' frames."""
    path = str(tmp_path / "log")
    with SegmentLog.open(path, durability="async") as a, SegmentLog.open(path) as b:
        assert a.append_one(b"a0", 0) == 0
        assert b.append(b"b1") == 1
        assert a.append_one(b"a?", 1) == -1      # b's frame is news to a's view: nothing
        assert a.append_one(b"a2", 2) == 2       # after taking it in
        assert a.append_one(b"a?", 7) == -1      # a view ahead of the log: nothing either
        assert b.append(b"b3") == 3              # the section a's calls took is released
    with SegmentLog.open(path, read_only=True) as r:
        assert [p for _, p in r.scan()] == [b"a0", b"b1", b"a2", b"b3"]
        with pytest.raises(durkv.ReadOnlyError):
            r.append_one(b"x", 4)
    assert verify(path, deep=True).ok


def test_a_sync_commit_is_durable_when_another_writer_wrote_after_it(tmp_path):
    # the power-loss witness: A's sync commit returns after an fdatasync that ran after its
    # frame was written; B's later frame (exit: written, not synced) does not change that
    path = str(tmp_path / "s.durkv")
    with durkv.open(path, durability="sync") as a, durkv.open(path, durability="exit") as b:
        la = a._b._log
        before = fdatasync_count()
        a.append_journal("ra", {"n": 1}, durable=True)
        lsn_a = la.next_lsn - 1
        assert la.durable_lsn > lsn_a
        assert fdatasync_count() > before
        b.append_journal("rb", {"n": 2})
        lb = b._b._log
        assert lb.next_lsn == lsn_a + 2 and lb.durable_lsn <= lsn_a + 1   # B's is not synced
        a.append_journal("ra", {"n": 3}, durable=True)       # A catches up past B's frame
        assert la.next_lsn == lsn_a + 3 and la.durable_lsn == lsn_a + 3  # and its fsync covers it
        assert [r["n"] for r in b.journal("ra")] == [1, 3]


def test_a_dead_writers_torn_tail_is_quarantined_by_the_next_writer(tmp_path):
    path = str(tmp_path / "log")
    with SegmentLog.open(path) as a:
        for i in range(5):
            a.append(b"frame %d" % i)
        seg = os.path.join(path, "0000000000000000.seg")
        size = os.path.getsize(seg)
        with open(seg, "ab") as f:           # what a writer killed inside write(2) leaves
            f.write(b"\x17" * 30)
        assert a.append(b"after") == 5       # the section cut the tail, then appended
        assert os.path.getsize(seg) > size + 24
        q = os.listdir(os.path.join(path, "quarantine"))
        assert q and q[0].startswith("0000000000000000.seg.")
        with open(os.path.join(path, "quarantine", q[0]), "rb") as f:
            assert f.read() == b"\x17" * 30      # copied before the cut
        assert a.read(5) == b"after"
    assert verify(path).ok


def test_a_catch_up_reads_past_a_window_that_ends_in_a_frames_zero_first_byte(tmp_path):
    """A catch-up reads another writer's frames in windows from 4 KiB. A window that ends
    one byte into a frame whose crc begins with a zero byte ends in a single zero byte:
    that is not the zero slack (a frame header's type byte, 16 bytes in, is never 0), and
    taking it for the end of data made the writer append over the other's frames (a
    kill -9 test's store, CI, 2026-12-06). Writer `w` lays frames so that each round's
    first window ends one byte into a probe frame; rounds go on until that byte is 0
    (1 in 256) a few times; the writer `h` and a reader must each see every frame."""
    path = str(tmp_path / "log")
    frame_hdr, window = 24, 4096
    with SegmentLog.open(path, durability="async") as w, SegmentLog.open(path) as h, \
            SegmentLog.open(path, read_only=True) as r:
        seg = os.path.join(path, "0000000000000000.seg")
        end, hits = 64, 0                       # the segment header's end: data starts there
        for i in range(20000):
            w.append(bytes(window - 1 - frame_hdr))              # ends 1 byte before the window's
            w.append(struct.pack("<Q", i))                       # the probe frame
            with open(seg, "rb") as f:
                probe_first = os.pread(f.fileno(), 1, end + window - 1)[0]
            h.refresh()                         # an empty write section: its catch-up
            r.refresh()
            assert h.next_lsn == r.next_lsn == w.next_lsn, (i, probe_first)
            end += window - 1 + frame_hdr + 8
            hits += probe_first == 0
            if hits == 3:
                break
        assert hits == 3
        lsn = w.next_lsn
        assert h.append(b"h") == lsn            # after w's frames, not over them
        assert w.read(h.next_lsn - 2) == struct.pack("<Q", i)   # the last probe, whole
    assert verify(path, deep=True).ok


@pytest.mark.parametrize("seed", [1, 2])
def test_catch_ups_at_random_points_see_exactly_the_other_writers_frames(tmp_path, seed):
    """Frames of random sizes (zero-filled, random, or one byte) from 0 to 3 windows long,
    into small segments (rolls) and the zero slack; another writer and a reader catch up
    after a random number of them, and append in turn: both always see every frame, at its
    LSN, byte for byte."""
    import random
    rnd = random.Random(seed)
    path = str(tmp_path / "log")
    want: list[bytes] = []
    with SegmentLog.open(path, durability="async", segment_bytes=256 << 10) as w, \
            SegmentLog.open(path, durability="async", segment_bytes=256 << 10) as h, \
            SegmentLog.open(path, read_only=True) as r:
        for _ in range(300):
            for _ in range(rnd.randint(1, 12)):
                n = rnd.choice([0, 1, rnd.randint(2, 100), rnd.randint(100, 12288)])
                p = bytes(n) if rnd.random() < 0.3 else rnd.randbytes(n)
                assert w.append(p) == len(want)
                want.append(p)
            h.refresh()
            r.refresh()
            assert h.next_lsn == r.next_lsn == len(want)
            for lsn in (len(want) - 1, rnd.randrange(len(want))):
                assert h.read(lsn) == r.read(lsn) == want[lsn]
            if rnd.random() < 0.3:              # the other writer appends in turn
                p = rnd.randbytes(rnd.randint(0, 5000))
                assert h.append(p) == len(want)
                want.append(p)
                w.refresh()
                assert w.next_lsn == len(want)
    assert verify(path, deep=True).ok
    with SegmentLog.open(path, read_only=True) as r:
        assert [p for _, p in r.scan()] == want


def test_a_writer_that_adopts_a_roll_cuts_the_dead_rollers_torn_frames_first(tmp_path):
    """The roller sealed a segment, created the next and died inside the write(2) of its
    first frames there: another writer's catch-up adopts the new segment and quarantines
    those torn bytes before it appends, as for an active segment it already had."""
    path = str(tmp_path / "log")
    with SegmentLog.open(path, segment_bytes=4096) as a, \
            SegmentLog.open(path, segment_bytes=4096) as b:
        assert b.append(b"b0") == 0                     # b's active segment is the first
        for i in range(4):                              # a's fourth frame rolls
            a.append(bytes([i + 1]) * 1000)
        segs = sorted(f for f in os.listdir(path) if f.endswith(".seg"))
        assert len(segs) == 2
        torn = b"\x17" * 300                            # a dead roller's partial frame
        with open(os.path.join(path, segs[1]), "ab") as f:
            f.write(torn)
        assert b.append(b"b5") == 5                     # after a's frames, past the seal
        q = os.listdir(os.path.join(path, "quarantine"))
        assert len(q) == 1 and q[0].startswith(segs[1] + ".")
        with open(os.path.join(path, "quarantine", q[0]), "rb") as f:
            assert f.read() == torn
        a.refresh()                                     # a's catch-up finds no damage
        assert a.read(5) == b"b5" and b.read(4) == bytes([4]) * 1000
    assert verify(path, deep=True).ok


_HOLDER = r"""
import sys, time
from durkv.log import SegmentLog
log = SegmentLog.open(sys.argv[1])
log.write_begin()
print("held", flush=True)
time.sleep(30)
"""


def test_a_stuck_holder_times_out_others_naming_its_pid_and_a_kill_frees_them(tmp_path):
    path = str(tmp_path / "log")
    log = SegmentLog.open(path, lock_timeout_ms=300)
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, path], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with pytest.raises(StoreLockedError, match=f"held by pid {p.pid}"):
            log.append(b"x")
        assert 0.25 < time.monotonic() - t0 < 5
        with pytest.raises(StoreLockedError, match=f"held by pid {p.pid}"):
            SegmentLog.open(path, lock_timeout_ms=300)   # opening is a section too
        p.kill()
        p.wait()
        t0 = time.monotonic()
        assert log.append(b"x") == 0          # the kernel dropped the dead holder's lock
        assert time.monotonic() - t0 < 1
    finally:
        log.close()
        if p.poll() is None:
            p.kill()
            p.wait()


_DRIVER = r"""
import sys, time
import durkv
s = durkv.open(sys.argv[1])
with s.run("r1") as run:
    run.step("greet", lambda: "hi")
    print("driving", flush=True)
    time.sleep(30)
"""


def test_one_driver_per_run_across_processes_and_a_killed_one_releases_at_once(tmp_path):
    path = str(tmp_path / "s.durkv")
    durkv.open(path).close()
    p = subprocess.Popen([sys.executable, "-c", _DRIVER, path], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "driving", p.stderr.read()
        with durkv.open(path) as s:
            with pytest.raises(durkv.RunBusyError, match=f"pid {p.pid}") as ei:
                with s.run("r1"):
                    pass
            assert ei.value.context["holder_pid"] == str(p.pid)
            with s.run("r2") as run:            # another run: no wait
                assert run.step("x", lambda: 1) == 1
            p.kill()
            p.wait()
            with s.run("r1") as run:            # the dead driver released at once
                assert run.step("greet", lambda: "again") == "hi"    # its result, journaled
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert os.listdir(os.path.join(path, "drivers")) == []     # released claims leave no file


def test_one_driver_per_run_across_handles_of_one_process(tmp_path):
    path = str(tmp_path / "s.durkv")
    with durkv.open(path) as a, durkv.open(path) as b:
        with a.run("r") as run:
            run.step("t", lambda: 1)
            with pytest.raises(durkv.RunBusyError, match=f"pid {os.getpid()}"):
                with b.run("r"):
                    pass
        with b.run("r") as run:
            assert run.step("t", lambda: 2) == 1


def _graph(saver):
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class S(TypedDict):
        n: int

    g = StateGraph(S)
    g.add_node("inc", lambda st: {"n": st["n"] + 1})
    g.add_edge(START, "inc")
    g.add_edge("inc", END)
    return g.compile(checkpointer=saver)


def test_two_savers_on_one_path_in_one_process_see_each_others_commits(tmp_path):
    pytest.importorskip("langgraph")
    from durkv.langgraph import DurkvSaver

    path = str(tmp_path / "s.durkv")
    with DurkvSaver.open(path) as saver, DurkvSaver.open(path) as again:
        assert _graph(saver).invoke({"n": 10}, {"configurable": {"thread_id": "t"}})["n"] == 11
        assert _graph(again).get_state({"configurable": {"thread_id": "t"}}).values == {"n": 11}
        assert _graph(again).invoke({"n": 5}, {"configurable": {"thread_id": "u"}})["n"] == 6
        assert _graph(saver).get_state({"configurable": {"thread_id": "u"}}).values == {"n": 6}


def test_langgraph_reader_follows_a_writer_without_refresh(tmp_path):
    pytest.importorskip("langgraph")
    from durkv.langgraph import DurkvSaver

    path = str(tmp_path / "s.durkv")
    with DurkvSaver.open(path) as w:
        graph = _graph(w)
        graph.invoke({"n": 0}, {"configurable": {"thread_id": "t"}})
        with DurkvSaver.open(path, read_only=True) as r:
            view = _graph(r)
            for i in range(3):
                cfg = {"configurable": {"thread_id": "t"}}
                assert view.get_state(cfg).values == {"n": 1 + 2 * i}
                graph.invoke({"n": 1 + 2 * i + 1}, cfg)


_FORKER = r"""
import os, sys, time
import durkv
s = durkv.open(sys.argv[1])
run = s.run("r")
run.open()
if os.fork() == 0:      # a child that outlives its parent, with copies of its fds
    time.sleep(30)
    os._exit(0)
print("forked", flush=True)
time.sleep(30)
"""


def test_a_fork_does_not_keep_a_dead_parents_driver_claim(tmp_path):
    path = str(tmp_path / "s.durkv")
    durkv.open(path).close()
    p = subprocess.Popen([sys.executable, "-c", _FORKER, path], stdout=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "forked"
        p.kill()                            # the driver dies; its forked child lives on
        p.wait()
        with durkv.open(path) as s, s.run("r") as run:
            assert run.step("s", lambda: 1) == 1
    finally:
        os.killpg(p.pid, 9)                 # the orphaned child, by its process group


# -- the lease and the shared watermark (FORMAT.md section 12, WSHM) ------------------------

def _wlock_free(path: str) -> bool:
    """Whether WLOCK is free now: a separate open file description tries it (no wait)."""
    import fcntl

    fd = os.open(os.path.join(path, "WLOCK"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)      # closing drops a lock it took
    return True


def test_a_lone_writer_keeps_wlock_between_commits_and_lets_it_go_when_idle(tmp_path):
    path = str(tmp_path / "log")
    with SegmentLog.open(path, durability="exit") as log:
        held = 0
        for i in range(50):
            log.append(b"frame %d" % i)
            held += not _wlock_free(path)       # right after the commit: the lease holds it
        # without a lease it is 0; a loaded machine can pause this thread for over the
        # 1 ms idle time between a commit and the look, so not every look sees it held
        assert held >= 10, held
        deadline = time.monotonic() + 2
        while not _wlock_free(path):           # no commit for 1 ms: the flusher lets it go
            assert time.monotonic() < deadline, "the lease was never released"
            time.sleep(0.005)
        # the frames were written at each commit (exit: write(2), no fsync), lease or not
        assert os.path.getsize(os.path.join(path, "0000000000000000.seg")) > 50 * 24


_LEASER = r"""
import sys, time
from durkv.log import SegmentLog
log = SegmentLog.open(sys.argv[1], durability="exit")
n, t0 = 0, time.monotonic()
log.append(b"first")
print("go", flush=True)
while time.monotonic() - t0 < float(sys.argv[2]):
    log.append(b"leaser %d" % n)
    n += 1
log.close()
print(n, flush=True)
"""


def test_a_busy_lease_holder_lets_a_waiting_process_commit_well_within_the_timeout(tmp_path):
    path = str(tmp_path / "log")
    SegmentLog.open(path).close()
    p = subprocess.Popen([sys.executable, "-c", _LEASER, path, "3"], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "go"
        t0 = time.monotonic()       # opening waits for WLOCK too (its load runs under it)
        with SegmentLog.open(path, durability="exit", lock_timeout_ms=5000) as log:
            waits = [time.monotonic() - t0]
            for i in range(30):
                t0 = time.monotonic()
                log.append(b"waiter %d" % i)
                waits.append(time.monotonic() - t0)
                time.sleep(0.01)
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        assert int(out.split()[-1]) > 100       # the holder kept committing meanwhile
        assert max(waits) < 1.0, waits          # a fifth of the timeout, at worst
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    rep = verify(path)
    assert rep.ok and rep.next_lsn > 130


def test_a_killed_lease_holder_frees_the_others_at_once(tmp_path):
    path = str(tmp_path / "log")
    SegmentLog.open(path).close()
    p = subprocess.Popen([sys.executable, "-c", _LEASER, path, "30"], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "go"
        time.sleep(0.2)
        p.kill()                                # SIGKILL, wherever it was: lease or section
        p.wait()
        with SegmentLog.open(path, lock_timeout_ms=5000) as log:
            t0 = time.monotonic()
            lsn = log.append(b"after the kill", durability="sync")
            assert time.monotonic() - t0 < 1.0
            assert log.read(lsn) == b"after the kill"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert verify(path).ok


_SYNCER = r"""
import json, sys
from durkv.log import SegmentLog, fdatasync_count
log = SegmentLog.open(sys.argv[1], durability="sync")
print("ready", flush=True)
sys.stdin.readline()
rows = []
for i in range(int(sys.argv[2])):
    f0, (_, p0) = fdatasync_count(), log.shared_durable
    lsn = log.append(b"p%s %d" % (sys.argv[3].encode(), i))
    d, p1 = log.shared_durable
    rows.append([lsn, fdatasync_count() - f0, p0, p1, d, log.durable_lsn])
log.close()
print(json.dumps(rows), flush=True)
"""


def test_a_commit_acked_through_another_processes_fsync_was_covered_by_it(tmp_path):
    # the power-loss witness of cross-process group commit: a sync commit that returned
    # without an fdatasync of its own did so because the store's shared watermark (raised
    # only after an fdatasync that began after the frame was written) covered it
    path = str(tmp_path / "log")
    SegmentLog.open(path).close()
    n = 150
    ps = [subprocess.Popen([sys.executable, "-c", _SYNCER, path, str(n), str(k)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
          for k in range(4)]
    for p in ps:
        assert p.stdout.readline().strip() == "ready"
    for p in ps:
        p.stdin.write("go\n")
        p.stdin.flush()
    rows = []
    for p in ps:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        rows += json.loads(out)
    lsns = sorted(r[0] for r in rows)
    assert lsns == list(range(4 * n))
    borrowed = [r for r in rows if r[1] == 0]
    for lsn, _, p0, p1, shared, own in borrowed:
        assert shared > lsn and own > lsn        # durable, by the shared watermark
        assert p1 > p0                           # published after this frame's write began
    own_syncs = sum(r[1] for r in rows)
    assert borrowed and own_syncs < len(rows)    # they shared fsyncs across processes
    assert verify(path).ok


_FAILER = r"""
import sys
from durkv.errors import DurkvError
from durkv.log import SegmentLog, fault_inject
log = SegmentLog.open(sys.argv[1], durability="sync")
fault_inject("fdatasync", 1)
try:
    if sys.argv[2] == "seal":       # a roll's fdatasync of the segment the others wrote
        log.seal()
    else:
        log.append(b"failer")
    print("acked", flush=True)
except DurkvError as e:
    print("failed", type(e).__name__, flush=True)
"""


@pytest.mark.parametrize("op", ["append", "seal"])
def test_a_failed_fsync_in_one_process_lets_no_process_ack(tmp_path, op):
    # seal: through 161e998 a failed fdatasync while rolling the segment failed only its
    # own handle; the others went on acknowledging through later fdatasyncs of a file
    # whose dirty pages the failed one may have dropped
    path = str(tmp_path / "log")
    log = SegmentLog.open(path, durability="sync")
    try:
        before = fdatasync_count()
        lsn = log.append(b"mine", durability="exit")     # written (section end), not synced
        assert fdatasync_count() == before and log.durable_lsn <= lsn
        # another process runs the fdatasync that would have covered it -- and it fails
        out = subprocess.run([sys.executable, "-c", _FAILER, path, op], capture_output=True,
                             text=True, timeout=60).stdout
        assert out.startswith("failed LogFailedError"), out
        with pytest.raises(LogFailedError, match="another process"):
            log.wait_durable(lsn)                # never acked through the failed fsync
        assert log.durable_lsn <= lsn
        with pytest.raises(LogFailedError):
            log.append(b"later", durability="sync")
        with pytest.raises(LogFailedError, match="not made durable before close"):
            log.close()
    finally:
        log.close()
    # all closed: the next writer opens alone, rebuilds WSHM and the store works again
    with SegmentLog.open(path, durability="sync") as log:
        log.append(b"again")
        assert log.shared_durable[0] == log.next_lsn
    assert verify(path).ok


def test_a_stale_or_torn_wshm_is_rebuilt_at_open_and_never_trusted(tmp_path):
    path = str(tmp_path / "log")
    shm = os.path.join(path, "WSHM")
    with SegmentLog.open(path, durability="sync") as log:
        log.append(b"a")
    # a stale file: this log's magic, uuid and epoch, a watermark far past the log (what
    # a power loss could leave if a file outlived its writers)
    with open(shm, "r+b") as f:
        f.seek(56)
        f.write(struct.pack("=Q", 1 << 60))
    with SegmentLog.open(path, durability="sync") as log:     # alone: rebuilt
        assert log.shared_durable[0] == log.next_lsn == 1
        before = fdatasync_count()
        log.append(b"b")
        assert fdatasync_count() > before       # its own fsync, not the stale watermark
    # a torn (short) file, then garbage while another writer is attached: rebuilt too
    with open(shm, "r+b") as f:
        f.truncate(20)
    with SegmentLog.open(path, durability="sync") as a:
        assert a.shared_durable[0] == 2
        with open(shm, "r+b") as f:
            f.write(b"\xff" * 128)
        with SegmentLog.open(path, durability="sync") as b:   # not alone, not this log's
            assert b.shared_durable[0] == b.next_lsn == 2
            b.append(b"c")
            a.append(b"d")
            assert a.shared_durable[0] == 4
    with SegmentLog.open(path, read_only=True) as r:
        assert [p for _, p in r.scan()] == [b"a", b"b", b"c", b"d"]
    assert verify(path).ok


# The syncer turn (FORMAT.md section 12): sync_owner, the pid running the store's
# group-commit fdatasync, is WSHM's 4 bytes at offset 92.
_SYNC_OWNER = 92


def _sync_owner(path: str) -> int:
    with open(os.path.join(path, "WSHM"), "rb") as f:
        f.seek(_SYNC_OWNER)
        return struct.unpack("<I", f.read(4))[0]


_STUCK_SYNCER = r"""
import sys, threading, time
from durkv import log as dlog
log = dlog.SegmentLog.open(sys.argv[1], durability="sync")
log.append(b"warm")
dlog.fault_inject("fdatasync", 1, pause_ms=int(sys.argv[2]))
threading.Thread(target=log.append, args=(b"held",), daemon=True).start()
print("syncing", flush=True)
time.sleep(60)
"""

# a sync commit from a fresh process, which prints how long it took
_COMMIT = r"""
import sys, time
from durkv.log import SegmentLog
log = SegmentLog.open(sys.argv[1], durability="sync")
t0 = time.monotonic()
lsn = log.append(b"other")
print(f"{lsn} {time.monotonic() - t0:.3f}", flush=True)
log.close()
"""


def _commit_elsewhere(path: str) -> tuple[int, float]:
    out = subprocess.run([sys.executable, "-c", _COMMIT, path], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    return int(out[0]), float(out[1])


def test_a_holder_stuck_in_its_fdatasync_loses_the_turn_and_others_commit(tmp_path):
    """A process whose fdatasync hangs (a slow disk; SIGSTOP and Ctrl-Z look the same)
    while it holds the syncer turn: every other process's sync commit waited for it
    (4 of 5 reviewers' runs with a stopped writer hung past 40 s). Now another process
    takes the turn after 100 ms of no publish and runs its own fdatasync."""
    path = str(tmp_path / "log")
    p = subprocess.Popen([sys.executable, "-c", _STUCK_SYNCER, path, "20000"],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "syncing"
        deadline = time.monotonic() + 10
        while _sync_owner(path) != p.pid:           # its fdatasync holds the turn
            assert time.monotonic() < deadline, "the holder never took the turn"
            time.sleep(0.01)
        lsn, took = _commit_elsewhere(path)
        assert took < 5, f"a sync commit waited {took:.1f} s for a stuck holder's fdatasync"
        assert lsn == 2 and _sync_owner(path) != p.pid
    finally:
        p.kill()
        p.wait()
    with SegmentLog.open(path, read_only=True) as r:
        assert [x for _, x in r.scan()] == [b"warm", b"held", b"other"]


def test_a_turn_left_to_a_reused_pid_is_taken_back(tmp_path):
    """A holder killed with -9 mid-fdatasync leaves its pid in sync_owner; once another
    process has that pid (or the holder ran in another pid namespace), kill(pid, 0)
    finds it alive and every sync commit of the store waited for ever."""
    path = str(tmp_path / "log")
    with SegmentLog.open(path, durability="sync") as log:
        log.append(b"warm")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # a writer stays attached (a writer opening alone rebuilds WSHM); the dead
        # holder's pid, now another process's, is left in sync_owner
        with SegmentLog.open(path, durability="async") as keep:
            with open(os.path.join(path, "WSHM"), "r+b") as f:
                f.seek(_SYNC_OWNER)
                f.write(struct.pack("<I", other.pid))
            lsn, took = _commit_elsewhere(path)
            assert lsn == 1 and took < 5
            assert keep.next_lsn >= 1
    finally:
        other.kill()
        other.wait()
