"""A commit's short log calls and its compresses keep the GIL (csrc/heldcall.c,
csrc/zstdheld.c; issue 20).

Holding the GIL is safe only where the call never waits for a thread that may need it.
These tests hold the try calls to that: they refuse (``DKV_WOULD_WAIT``, nothing done)
where the blocking call would wait for another thread's section, another handle's or
process's WLOCK, or an fdatasync, and SegmentLog then makes the blocking call, which
lets the other thread finish. A deadlock would hang the process, so those cases run in a
child under a timeout. The witness that the commit path holds the GIL counts the calls
that release it (cffi's log calls, zstandard's compresses) during commits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import zstandard

import durkv
import durkv.log as L
import durkv.payload as P
from durkv import _heldcall, _zstdheld
from durkv.log import SegmentLog, verify

WOULD_WAIT = L.lib.DKV_WOULD_WAIT
EXIT, ASYNC, SYNC = (L.DURABILITY_CODES[d] for d in ("exit", "async", "sync"))


def _run_child(code: str, *args: str, timeout: float = 60) -> str:
    """Run ``code`` in a child; a hang (a deadlock under the GIL) fails the test."""
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child hung (a GIL-held call waited?): {e.stderr!r}")
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


# ---- the try calls: what they refuse -------------------------------------------------------


def test_begin_try_enters_under_the_lease_and_nests(tmp_path):
    with SegmentLog.open(str(tmp_path / "log"), durability="async") as log:
        log.write_begin()            # the blocking call took WLOCK...
        log.write_end()              # ...and kept it as this process's lease
        assert _heldcall.begin(log._addr) == 0
        assert _heldcall.begin(log._addr) == 0          # nested
        assert _heldcall.append(log._addr, L.FRAME_DATA, b"a", EXIT) == 0
        assert _heldcall.end(log._addr) == 0
        assert _heldcall.end_async(log._addr) == 0      # the outermost end: written
        assert log.read(0) == b"a"


def test_begin_try_refuses_another_threads_section(tmp_path):
    with SegmentLog.open(str(tmp_path / "log"), durability="async") as log:
        log.append(b"x")
        entered, release = threading.Event(), threading.Event()

        def holder():
            log.write_begin()
            entered.set()
            release.wait()
            log.append(b"holder", durability="exit")
            log.write_end()

        t = threading.Thread(target=holder)
        t.start()
        entered.wait()
        assert _heldcall.begin(log._addr) == WOULD_WAIT       # nothing held, no wait
        assert _heldcall.append(log._addr, L.FRAME_DATA, b"no", EXIT) == WOULD_WAIT
        release.set()
        t.join()
        assert [p for _, p in log.scan()] == [b"x", b"holder"]


def test_append_try_refuses_sync_and_appends_outside_a_section(tmp_path):
    with SegmentLog.open(str(tmp_path / "log"), durability="sync") as log:
        log.append(b"x")
        # outside a section: the implicit section may wait for another thread's
        assert _heldcall.append(log._addr, L.FRAME_DATA, b"no", EXIT) == WOULD_WAIT
        log.write_begin()
        assert _heldcall.append(log._addr, L.FRAME_DATA, b"no", SYNC) == WOULD_WAIT
        assert _heldcall.append(log._addr, L.FRAME_DATA, b"no", -1) == WOULD_WAIT  # log's: sync
        assert _heldcall.append(log._addr, L.FRAME_DATA, b"y", ASYNC) == 1
        log.write_end()
        assert log.append(b"z") == 2         # sync: through cffi, fdatasync'd
        assert [p for _, p in log.scan()] == [b"x", b"y", b"z"]


def test_try_calls_refuse_to_move_64_kib_with_the_gil_held(tmp_path):
    big = b"b" * (64 << 10)
    with SegmentLog.open(str(tmp_path / "log"), durability="async") as log:
        log.append(b"x")
        log.write_begin()
        assert _heldcall.append(log._addr, L.FRAME_DATA, big, EXIT) == WOULD_WAIT
        assert log.append(big, durability="exit") == 1        # through cffi
        for i in range(2, 5):     # small frames, but 64 KiB already waits to be written
            assert _heldcall.append(log._addr, L.FRAME_DATA, b"s", EXIT) == WOULD_WAIT
            assert log.append(b"s", durability="exit") == i
        assert _heldcall.end_async(log._addr) == WOULD_WAIT   # the section is still held
        assert _heldcall.begin(log._addr) == 0                # (nested: it is this thread's)
        assert _heldcall.end(log._addr) == WOULD_WAIT
        log.write_end()                                       # the nested one, blocking
        assert log.write_end_async() is True                  # the outermost: written
        assert log.read(1) == big and log.read(4) == b"s"


def test_try_calls_refuse_a_frame_that_rolls_the_segment(tmp_path):
    """A roll fdatasyncs the old segment twice and makes the next one (a header sync, a
    rename, a directory fsync): the blocking call's, never done with the GIL held."""
    with SegmentLog.open(str(tmp_path / "log"), durability="async", segment_bytes=8192) as log:
        log.write_begin()
        i = 0
        while True:
            segs, lsn = len(log.segments()), log.next_lsn
            r = _heldcall.append(log._addr, L.FRAME_DATA, b"f" * 1000, EXIT)
            if r == WOULD_WAIT:
                break
            assert r == lsn
            i += 1
        assert i > 0 and (len(log.segments()), log.next_lsn) == (segs, lsn)  # nothing done
        syncs = L.fdatasync_count()
        assert log.append(b"f" * 1000, durability="exit") == lsn       # cffi rolls
        assert len(log.segments()) == segs + 1 and L.fdatasync_count() > syncs
        log.write_end()
    with SegmentLog.open(str(tmp_path / "one"), durability="async", segment_bytes=8192) as log:
        log.write_begin()
        log.write_end()               # this process's lease: append_one's try may enter
        while (r := _heldcall.append_one(log._addr, L.FRAME_DATA, b"f" * 1000, ASYNC,
                                         log.next_lsn)) != WOULD_WAIT:
            assert r >= 0
        assert log.next_lsn == lsn    # the same frames as above fit one segment
        assert log.append_one(b"f" * 1000, lsn) == lsn
        assert len(log.segments()) == 2
    assert verify(str(tmp_path / "log"), deep=True).ok
    assert verify(str(tmp_path / "one"), deep=True).ok


def test_try_calls_refuse_while_another_thread_does_disk_work_under_the_mutex(tmp_path):
    """A seal holds the handle's mutex through its fdatasyncs (here each held up 300 ms):
    a try call gives up on the mutex after a short spin instead of keeping the GIL through
    that wait, and the blocking call then waits for the seal, GIL released."""
    with SegmentLog.open(str(tmp_path / "log"), durability="async") as log:
        log.append(b"x")
        log.write_begin()
        log.write_end()
        L.fault_inject("fdatasync", 1, pause_ms=300)
        sealer = threading.Thread(target=log.seal)
        try:
            sealer.start()
            t0 = time.monotonic()
            while (r := _heldcall.begin(log._addr)) == 0:   # until the seal holds mu
                assert _heldcall.end(log._addr) == 0
                assert time.monotonic() - t0 < 0.25, "the seal never held the mutex"
            assert r == WOULD_WAIT
            assert time.monotonic() - t0 < 0.25    # refused without waiting the 300 ms
            assert _heldcall.append_one(log._addr, L.FRAME_DATA, b"y", ASYNC, 1) == WOULD_WAIT
            assert log.append_one(b"y", 1) == 1     # cffi: waits for the seal, then appends
        finally:
            sealer.join()
            L.fault_inject(None)
        assert [p for _, p in log.scan()] == [b"x", b"y"]
    assert verify(str(tmp_path / "log"), deep=True).ok


def test_a_section_end_refuses_to_wait_for_another_leaders_write(tmp_path):
    """Under `exit`, 4 MiB buffered in a section is written by the flusher in the
    background (a spill; here its write held up 400 ms). A held end meanwhile would wait
    for that write with the GIL held: it refuses, and the blocking end waits instead."""
    with SegmentLog.open(str(tmp_path / "log"), durability="exit") as log:
        log.write_begin()
        log.write_end()
        log.write_begin()
        L.fault_inject("write", 1, pause_ms=400)
        try:
            for _ in range(4):      # 1 MiB frames (through cffi): past 4 MiB, a spill
                log.append(b"s" * (1 << 20))     # (then nothing is pending: only the
                                                 # flusher's write could make end wait)
            until = time.monotonic() + 0.3
            while time.monotonic() < until:
                t0 = time.monotonic()
                assert _heldcall.end(log._addr) == WOULD_WAIT
                assert time.monotonic() - t0 < 0.15
        finally:
            L.fault_inject(None)
        log.write_end()
        assert [len(p) for _, p in log.scan()] == [1 << 20] * 4
    assert verify(str(tmp_path / "log"), deep=True).ok


def test_begin_try_refuses_when_another_handle_holds_wlock(tmp_path):
    path = str(tmp_path / "log")
    with SegmentLog.open(path, durability="async") as a, SegmentLog.open(path) as b:
        a.append(b"a0")
        b.write_begin()               # b takes WLOCK: a's lease is gone
        b.append(b"b1", durability="exit")
        assert _heldcall.begin(a._addr) == WOULD_WAIT
        b.write_end()
        a.write_begin()               # the blocking call: takes WLOCK, catches up with b1
        assert a.append(b"a2", durability="exit") == 2
        a.write_end()
    assert verify(path, deep=True).ok


def test_append_one_try_keeps_append_ones_answers_and_refuses_the_waits(tmp_path):
    path = str(tmp_path / "log")
    with SegmentLog.open(path, durability="async") as a, SegmentLog.open(path) as b:
        assert a.append_one(b"a0", 0) == 0           # blocking: WLOCK, then the lease
        assert _heldcall.append_one(a._addr, L.FRAME_DATA, b"a1", ASYNC, 1) == 1
        assert _heldcall.append_one(a._addr, L.FRAME_DATA, b"no", SYNC, 2) == WOULD_WAIT
        assert _heldcall.append_one(a._addr, L.FRAME_DATA, b"n" * (64 << 10), ASYNC,
                                    2) == WOULD_WAIT
        assert b.append(b"b2") == 2                 # b takes WLOCK: a's lease is gone
        assert _heldcall.append_one(a._addr, L.FRAME_DATA, b"no", ASYNC, 2) == WOULD_WAIT
        assert a.append_one(b"a?", 2) == -1          # moved: b's frame is news to a's view
        assert a.append_one(b"a3", 3) == 3
        assert _heldcall.append_one(a._addr, L.FRAME_DATA, b"a?", ASYNC, 9) == L.lib.DKV_MOVED
        entered, release = threading.Event(), threading.Event()

        def holder():
            a.write_begin()
            entered.set()
            release.wait()
            a.write_end()

        t = threading.Thread(target=holder)
        t.start()
        entered.wait()
        assert _heldcall.append_one(a._addr, L.FRAME_DATA, b"no", ASYNC, 4) == WOULD_WAIT
        release.set()
        t.join()
    with SegmentLog.open(path, read_only=True) as r:
        assert [p for _, p in r.scan()] == [b"a0", b"a1", b"b2", b"a3"]
    assert verify(path, deep=True).ok


@pytest.mark.parametrize("held", [True, False])
def test_an_end_without_a_begin_is_a_typed_error_either_way(tmp_path, monkeypatch, held):
    monkeypatch.setattr(L, "HELD_CALLS", held)
    with SegmentLog.open(str(tmp_path / "log"), durability="async") as log:
        for end in (log.write_end, log.write_end_async):
            with pytest.raises(durkv.ConfigError, match="without dkv_write_begin"):
                end()
        assert log.append(b"fine") == 0


def test_held_calls_refuse_bad_arguments(tmp_path):
    with SegmentLog.open(str(tmp_path / "log"), durability="async") as log:
        with pytest.raises(TypeError):
            _heldcall.append(log._addr, L.FRAME_DATA, bytearray(b"x"), EXIT)
        with pytest.raises(ValueError):
            _heldcall.append(log._addr, L.FRAME_DATA, b"x", 9)
        with pytest.raises(TypeError):
            _heldcall.begin(str(log._addr))
        with pytest.raises(ValueError):
            _heldcall.begin(0)
        assert log.append(b"still fine") == 0


# ---- no deadlock: the refused calls fall back to the blocking, GIL-releasing one -----------


def test_a_commit_waits_for_another_threads_python_section_without_a_deadlock(tmp_path):
    """Thread A holds the store's section and runs Python (it needs the GIL) until thread B
    -- which is trying to commit on another handle of the same log -- is seen waiting. B's
    try call must refuse and its blocking call release the GIL, or both hang."""
    out = _run_child("""
        import sys, threading, time
        import durkv
        path = sys.argv[1]
        a, b = durkv.open(path, durability="async"), durkv.open(path, durability="async")
        for s in (a, b):      # each handle has held a lease once
            s.put("t", "", "0000", checkpoint={}, metadata={}, values={"n": 0},
                  versions={"n": 1})
        started = threading.Event()
        done = []
        def committer():
            started.set()
            b.put("u", "", "0001", checkpoint={}, metadata={}, values={"n": 1},
                  versions={"n": 2})
            done.append(1)
        with a._writing():            # a's section: WLOCK held, Python running
            t = threading.Thread(target=committer)
            t.start()
            started.wait()
            spins = 0
            t0 = time.monotonic()
            while time.monotonic() - t0 < 0.3:    # Python work while b waits
                spins += 1
            assert not done, "b committed inside a's section"
        t.join(10)
        assert done and not t.is_alive()
        assert b.get("u").values == {"n": 1} and a.get("u").values == {"n": 1}
        a.close(); b.close()
        print("ok", spins)
        """, str(tmp_path / "s.durkv"))
    assert out.startswith("ok")


def test_threads_and_processes_commit_through_the_held_path(tmp_path):
    """Four threads in each of two processes put and put_writes to one store with async
    commits: every one is there once, the log verifies, and nothing hangs."""
    code = """
        import sys, threading
        import durkv
        path, k = sys.argv[1], sys.argv[2]
        s = durkv.open(path, durability="async", segment_bytes=32768)
        def work(j):
            for i in range(150):
                run = f"p{k}t{j}"
                s.put(run, "", f"{i:06d}", checkpoint={"i": i}, metadata={},
                      values={"v": "x" * (i % 7 * 400)}, versions={"v": i + 1})
                s.put_writes(run, "", f"{i:06d}", "task", [(0, "ch", "y" * 1500)])
        ts = [threading.Thread(target=work, args=(j,)) for j in range(4)]
        for t in ts: t.start()
        for t in ts: t.join()
        s.close()
        print("done")
        """
    path = str(tmp_path / "s.durkv")
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), path, str(k)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "done", err[-3000:]
    with durkv.open(path, read_only=True) as s:
        for k in range(2):
            for j in range(4):
                st = s.get(f"p{k}t{j}")
                assert st.checkpoint == {"i": 149}
                assert st.values == {"v": "x" * (149 % 7 * 400)}
                assert [w.value for w in st.writes] == ["y" * 1500]
                assert len(list(s.history(f"p{k}t{j}"))) == 150
    assert verify(path, deep=True).ok


# ---- the witness: an async commit makes no call that releases the GIL ----------------------


class _CountingLib:
    """durkv.log's cffi library, counting the calls made through it."""

    def __init__(self, lib):
        self._lib, self.calls = lib, []

    def __getattr__(self, name):
        f = getattr(self._lib, name)
        if not callable(f):
            return f

        def counted(*a):
            self.calls.append(name)
            return f(*a)
        return counted


@pytest.mark.parametrize("held", [True, False])
def test_an_async_commit_releases_the_gil_nowhere(tmp_path, monkeypatch, held):
    """A lone process's async put and put_writes: with the held calls no cffi log call and
    no zstandard compress runs (each would hand the GIL over); without them (the check
    can fail) both do."""
    if held and not _zstdheld.available:
        pytest.skip("no libzstd.so.1 on this machine: compresses go through zstandard")
    monkeypatch.setattr(L, "HELD_CALLS", held)
    monkeypatch.setattr(P, "HELD_ZSTD", held)
    compresses = []
    real = zstandard.ZstdCompressor

    class Counting:       # a wrapper: zstandard's C type is not made to be subclassed
        def __init__(self, *a, **kw):
            self._c = real(*a, **kw)

        def compress(self, data):
            compresses.append(len(data))
            return self._c.compress(data)
    monkeypatch.setattr(zstandard, "ZstdCompressor", Counting)
    counting = _CountingLib(L.lib)
    with durkv.open(str(tmp_path / "s.durkv"), durability="async") as s:
        big = "m" * 3000              # an item over compress_min_bytes
        for i in range(3):            # warm: the lease, a keyframe to delta against
            s.put("t", "", f"{i:04d}", checkpoint={"i": i, "pad": "p" * 300}, metadata={},
                  values={"msgs": [big] * (i + 1)}, versions={"msgs": i + 1})
        monkeypatch.setattr(L, "lib", counting)
        monkeypatch.setattr(L, "_append_lsn", counting.dkv_append_lsn)
        del compresses[:]
        for i in range(3, 23):
            s.put("t", "", f"{i:04d}", checkpoint={"i": i, "pad": "p" * 300}, metadata={},
                  values={"msgs": [big] * (i + 1)}, versions={"msgs": i + 1})
            s.put_writes("t", "", f"{i:04d}", "task", [(0, "msgs", big + str(i))])
        monkeypatch.setattr(L, "lib", counting._lib)
        assert s.get("t").values == {"msgs": [big] * 23}
    if held:
        assert counting.calls == [] and compresses == []
    else:
        assert "dkv_write_begin" in counting.calls and "dkv_write_end_async" in counting.calls
        assert len(compresses) >= 20


# ---- the compressor: frames any zstd reader reads ------------------------------------------


@pytest.mark.skipif(not _zstdheld.available, reason="no libzstd.so.1 on this machine")
@pytest.mark.parametrize("size", [0, 1, 900, 5000, _zstdheld.RELEASE_OVER + 1])
def test_held_frames_decode_with_zstandard(size):
    data = (os.urandom(64) + b"a commit's message " * 300) * (size // 5000 + 1)
    data = data[:size]
    f = _zstdheld.Compressor(1).compress(data)
    assert zstandard.ZstdDecompressor().decompress(f) == data
    assert zstandard.get_frame_parameters(f).content_size == size
    # a delta against a raw-content dictionary, checksummed, naming no dictionary id
    hb = b"\x99" + b"a head's fields " * 30
    f = _zstdheld.Compressor(3, hb, True).compress(data)
    fp = zstandard.get_frame_parameters(f)
    assert (fp.dict_id, fp.has_checksum) == (0, True)
    dct = zstandard.ZstdCompressionDict(hb, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    assert zstandard.ZstdDecompressor(dict_data=dct).decompress(f) == data


@pytest.mark.skipif(not _zstdheld.available, reason="no libzstd.so.1 on this machine")
def test_held_compressor_refuses_bad_input():
    with pytest.raises(TypeError):
        _zstdheld.Compressor(1).compress("text")
    with pytest.raises(TypeError):
        _zstdheld.Compressor("one")
    with pytest.raises(RuntimeError):
        _zstdheld.Compressor(1).__init__(1)      # initialized once


@pytest.mark.parametrize("held", [True, False])
def test_a_dictionary_that_begins_with_zstds_magic_is_raw_content(monkeypatch, held):
    """libzstd's stable API would read such bytes as a formatted dictionary (it failed
    with a MemoryError); the held compressor refuses them and zstd_compressor takes them
    to zstandard, so the frame still decodes against the raw bytes."""
    if held and not _zstdheld.available:
        pytest.skip("no libzstd.so.1 on this machine")
    monkeypatch.setattr(P, "HELD_ZSTD", held)
    hb = b"\x37\xa4\x30\xec" + bytes(range(256)) * 4
    if held:
        with pytest.raises(ValueError, match="dictionary magic"):
            _zstdheld.Compressor(3, hb, True)
    data = b"a head's fields " * 40 + bytes(range(256))
    f = P.zstd_compressor(3, hb, checksum=True)(data)
    fp = zstandard.get_frame_parameters(f)
    assert (fp.dict_id, fp.has_checksum) == (0, True)
    dct = zstandard.ZstdCompressionDict(hb, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    assert zstandard.ZstdDecompressor(dict_data=dct).decompress(f) == data


@pytest.mark.parametrize("held", [True, False])
def test_stores_written_either_way_read_back_the_same(tmp_path, monkeypatch, held):
    """The compressor is the writer's choice alone: a store written with libzstd reads
    back exactly as one written with zstandard (checkpoint head deltas, big items)."""
    if held and not _zstdheld.available:
        pytest.skip("no libzstd.so.1 on this machine")
    monkeypatch.setattr(P, "HELD_ZSTD", held)
    path = str(tmp_path / "s.durkv")
    want = []
    with durkv.open(path, durability="exit") as s:
        for i in range(40):
            v = {"msgs": ["x" * 1200 + str(j) for j in range(i % 5)], "n": i}
            s.put("t", "", f"{i:04d}", checkpoint={"i": i, "pad": "q" * 200},
                  metadata={"step": i}, values=v, versions={"msgs": i + 1, "n": i + 1})
            want.append(v)
    with durkv.open(path, read_only=True) as s:
        got = [c.values for c in s.history("t")][::-1]
        assert got == want
        assert [c.checkpoint["i"] for c in s.history("t")][::-1] == list(range(40))
    assert verify(path, deep=True).ok
