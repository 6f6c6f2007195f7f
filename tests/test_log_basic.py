"""The segment log through durkv.log: append/read/scan/reopen, policies, segments,
readers, the lock, the COMMIT codec and channel reads."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time

import pytest
from durkv.errors import (
    ConfigError, CorruptionError, LogFailedError, NotFoundError,
    ReadOnlyError, StoreClosedError, StoreLockedError,
)
from durkv.log import FRAME_COMMIT, FRAME_DATA, SegmentLog, fault_inject, recover, verify
from durkv.payload import (
    DELTA, F_REFS, F_VALUE, FULL, SNAP, CommitEntry, decode_commit, encode_commit, pack_ref,
    resolve_channel,
)

POLICIES = ["sync", "async", "exit"]


def _payload(i: int, size: int = 50) -> bytes:
    return (f"p{i:06d}-".encode() * (size // 8 + 1))[:size]


@pytest.mark.parametrize("policy", POLICIES)
def test_append_read_scan_reopen(log_dir, policy):
    with SegmentLog.open(log_dir, durability=policy) as log:
        assert (log.next_lsn, log.start_lsn) == (0, 0)
        lsns = [log.append(_payload(i)) for i in range(20)]
        assert lsns == list(range(20))
        assert log.append_many([b"a", b"", b"c"]) == [20, 21, 22]
        assert log.read(5) == _payload(5)
        assert log.read(21) == b""
        assert log.read_frame(22) == (FRAME_DATA, b"c")
        assert [lsn for lsn, _ in log.scan(18)] == [18, 19, 20, 21, 22]
        log.append(b"commit", frame_type=FRAME_COMMIT)
        assert list(log.scan_frames(23)) == [(23, FRAME_COMMIT, b"commit")]
    with SegmentLog.open(log_dir, durability=policy) as log:
        assert log.next_lsn == 24
        assert log.durable_lsn == 24
        assert log.read(19) == _payload(19)
        assert log.append(b"more") == 24
    assert verify(log_dir).ok


def test_durability_watermarks(log_dir):
    with SegmentLog.open(log_dir, durability="exit") as log:
        log.append(b"x")
        assert log.durable_lsn == 0
        assert log.read(0) == b"x"            # readable from the buffer
        log.flush()
        assert log.durable_lsn == 1
        log.append(b"y", durability="sync")    # per-call policy
        assert log.durable_lsn == 2
    with SegmentLog.open(log_dir, durability="async", flush_interval_ms=5) as log:
        lsn = log.append(b"z")
        deadline = time.monotonic() + 2
        while log.durable_lsn <= lsn and time.monotonic() < deadline:
            time.sleep(0.002)
        assert log.durable_lsn == lsn + 1, "the flusher did not sync within its interval"
        lsn = log.append(b"w")
        log.wait_durable(lsn)
        assert log.durable_lsn > lsn
        with pytest.raises(NotFoundError):
            log.wait_durable(lsn + 10)


def test_exit_policy_flushes_at_interpreter_exit(log_dir):
    code = (
        "import sys; from durkv.log import SegmentLog\n"
        f"log = SegmentLog.open({str(log_dir)!r}, durability='exit')\n"
        "for i in range(100): log.append(b'e%d' % i)\n"
        "sys.exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with SegmentLog.open(log_dir, read_only=True) as log:
        assert log.next_lsn == 100
        assert log.read(99) == b"e99"


def test_roll_across_segments(log_dir):
    with SegmentLog.open(log_dir, segment_bytes=1024) as log:
        for i in range(100):
            log.append(_payload(i, 100))
        big = log.append(b"B" * 5000)           # larger than segment_bytes: its own segment
        log.append(b"after")
        segs = log.segments()
        assert len(segs) > 10
        assert all(s.sealed for s in segs[:-1]) and not segs[-1].sealed
        assert segs[0].base_lsn == 0 and segs[0].name == "0000000000000000.seg"
        assert [s.segment_no for s in segs] == list(range(len(segs)))
        assert sum(s.frames for s in segs) == 102
        assert log.read(big) == b"B" * 5000
    with SegmentLog.open(log_dir, segment_bytes=1024) as log:
        assert [p for _, p in log.scan()][:100] == [_payload(i, 100) for i in range(100)]
        assert log.read(101) == b"after"
    rep = verify(log_dir)
    assert rep.ok and rep.frames_ok == 102 and rep.next_lsn == 102


def test_seal_and_prefix_removal(log_dir):
    with SegmentLog.open(log_dir) as log:
        for i in range(10):
            log.append(_payload(i))
        log.seal()
        log.seal()                              # an empty active segment is not sealed
        for i in range(10, 20):
            log.append(_payload(i))
        log.seal(new_start_lsn=10)
        assert log.start_lsn == 10
        assert [s.base_lsn for s in log.segments()] == [10, 20]
        with pytest.raises(NotFoundError):
            log.read(3)
        assert log.read(10) == _payload(10)
    assert sorted(p for p in os.listdir(log_dir) if p.endswith(".seg")) == [
        "000000000000000a.seg", "0000000000000014.seg"]
    with SegmentLog.open(log_dir) as log:
        assert (log.start_lsn, log.next_lsn) == (10, 20)
        assert [lsn for lsn, _ in log.scan()] == list(range(10, 20))
    assert verify(log_dir).ok


def test_reader_alongside_writer(log_dir):
    with SegmentLog.open(log_dir, segment_bytes=2048) as w:
        w.append(b"first")
        with SegmentLog.open(log_dir, read_only=True) as r:
            assert r.read_only and r.next_lsn == 1
            with pytest.raises(ReadOnlyError):
                r.append(b"no")
            for i in range(60):
                w.append(_payload(i, 100))
            assert r.next_lsn == 1              # a consistent snapshot until refresh
            r.refresh()
            assert r.next_lsn == 61
            assert r.read(60) == _payload(59, 100)
            assert r.read(0) == b"first"


def test_second_writer_attaches_and_recover_is_locked_out(log_dir):
    # several writers (FORMAT.md 12): a second handle writes too; recover needs them gone
    with SegmentLog.open(log_dir) as a, SegmentLog.open(log_dir) as b:
        assert a.append(b"a0") == 0
        assert b.append(b"b1") == 1            # b caught up with a's frame first
        assert a.append(b"a2") == 2
        assert b.next_lsn == 2                  # what b knows, until it catches up
        b.refresh()
        assert [b.read(i) for i in range(3)] == [b"a0", b"b1", b"a2"]
        with pytest.raises(StoreLockedError):
            recover(log_dir)
    recover(log_dir)                            # released at close


def test_errors(log_dir, tmp_path):
    with pytest.raises(NotFoundError):
        SegmentLog.open(tmp_path / "nothing", read_only=True)
    with pytest.raises(ConfigError):
        SegmentLog.open(log_dir, durability="sometimes")
    with pytest.raises(ConfigError):
        SegmentLog.open(log_dir, recovery="hope")
    log = SegmentLog.open(log_dir)
    with pytest.raises(NotFoundError):
        log.read(0)
    assert log.append(memoryview(b"xy")[1:]) == 0      # any buffer
    assert log.read(0) == b"y"
    with pytest.raises(ConfigError):
        log.append(b"x", frame_type=7)
    log.close()
    assert log.closed
    log.close()
    with pytest.raises(StoreClosedError):
        log.append(b"x")
    with pytest.raises(StoreClosedError):      # read in place while open: never after close
        log.next_lsn


def test_concurrent_appenders_group_commit(log_dir):
    n_threads, per = 8, 50
    out: list[list[int]] = [[] for _ in range(n_threads)]
    with SegmentLog.open(log_dir, segment_bytes=8192) as log:
        def work(t):
            for i in range(per):
                out[t].append(log.append(b"t%d-%d" % (t, i)))
        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        allr = sorted(x for o in out for x in o)
        assert allr == list(range(n_threads * per))
        assert log.durable_lsn == log.next_lsn
        for t in range(n_threads):
            assert [log.read(lsn) for lsn in out[t]] == [b"t%d-%d" % (t, i) for i in range(per)]
    assert verify(log_dir).ok


def test_failed_fsync_fails_the_handle(log_dir, no_faults):
    log = SegmentLog.open(log_dir)
    log.append(b"safe")
    fault_inject("fdatasync", 1, errno.EIO)
    with pytest.raises(LogFailedError, match="fdatasync"):
        log.append(b"lost")
    with pytest.raises(LogFailedError):
        log.append(b"after")            # sticky: never retried
    with pytest.raises(LogFailedError):
        log.read(0)
    with pytest.raises(LogFailedError, match="1 frame written to .* not made durable"):
        log.close()                     # a later call too: it does not pretend it flushed
    log.close()                         # closed: a second close is a no-op
    with SegmentLog.open(log_dir) as log:
        assert log.read(0) == b"safe"


def test_torn_tail_is_quarantined_on_writer_open(log_dir):
    with SegmentLog.open(log_dir) as log:
        for i in range(5):
            log.append(_payload(i))
    seg = log_dir / "0000000000000000.seg"
    size = seg.stat().st_size
    with open(seg, "r+b") as f:
        f.truncate(size - 7)
    with SegmentLog.open(log_dir, read_only=True) as r:   # readers never repair
        assert r.next_lsn == 4
    assert seg.stat().st_size == size - 7
    with SegmentLog.open(log_dir) as log:
        assert log.next_lsn == 4
        dmg = log.recovery_damage
        assert dmg.kind == "torn_tail" and dmg.segment == seg.name
        assert log.append(b"new") == 4
    q = os.listdir(log_dir / "quarantine")
    assert len(q) == 1 and q[0].startswith(seg.name) and q[0].endswith(".torn")
    assert verify(log_dir).ok


# ---- COMMIT payloads and channel reads ---------------------------------------------------


def test_commit_round_trip():
    entries = [
        CommitEntry(FULL, [b"a", b"", b"ccc"]),
        CommitEntry(DELTA, [b"d"], flags=1, depth=3, prev_lsn=7, prev_idx=2),
        CommitEntry(SNAP, [pack_ref(1, 0), pack_ref(2, 1)]),
        CommitEntry(FULL, [b"value"], flags=F_VALUE),
    ]
    payload = encode_commit(b"head-bytes", entries)
    head, got = decode_commit(payload)
    assert head == b"head-bytes" and got == entries
    assert decode_commit(encode_commit(b"", [])) == (b"", [])
    with pytest.raises(CorruptionError):
        decode_commit(payload[:-1])


def _channel_log(log):
    """Frames exercising FULL, DELTA chains, SNAP (incl. a SNAP over a SNAP) and
    same-frame references. Returns {(lsn, idx): expected items}."""
    expect = {}
    payloads = {}

    def commit(entries):
        p = encode_commit(b"h", entries)
        lsn = log.append(p, frame_type=FRAME_COMMIT)
        payloads[lsn] = p
        return lsn

    base = commit([CommitEntry(FULL, [b"i0", b"i1"]), CommitEntry(FULL, [b"v"], flags=F_VALUE)])
    expect[(base, 0)] = [b"i0", b"i1"]
    expect[(base, 1)] = [b"v"]
    chain, prev, items, deltas = [], (base, 0), [b"i0", b"i1"], []
    for k in range(5):
        lsn = commit([CommitEntry(DELTA, [b"d%d" % k], depth=k + 1, prev_lsn=prev[0],
                            prev_idx=prev[1])])
        items = items + [b"d%d" % k]
        prev = (lsn, 0)
        deltas.append(prev)
        expect[prev] = items
        chain.append(prev)
    # A DELTA and a SNAP in one frame: the SNAP's refs are the base and the 6 deltas.
    refs = [pack_ref(*r) for r in [(base, 0)] + deltas]
    lsn = log.next_lsn
    refs.append(pack_ref(lsn, 0))
    commit([CommitEntry(DELTA, [b"d5"], depth=6, prev_lsn=prev[0], prev_idx=prev[1]),
            CommitEntry(SNAP, refs)])
    items = items + [b"d5"]
    expect[(lsn, 0)] = items
    expect[(lsn, 1)] = items
    snap = (lsn, 1)
    # Two deltas on the SNAP, then a SNAP over that SNAP.
    d1 = commit([CommitEntry(DELTA, [b"e0", b"e1"], depth=1, prev_lsn=snap[0], prev_idx=snap[1])])
    d2 = commit([CommitEntry(DELTA, [b"e2"], depth=2, prev_lsn=d1, prev_idx=0)])
    items = items + [b"e0", b"e1", b"e2"]
    expect[(d1, 0)] = items[:-1]
    expect[(d2, 0)] = items
    s2 = commit([CommitEntry(SNAP, [pack_ref(*snap), pack_ref(d1, 0), pack_ref(d2, 0)])])
    expect[(s2, 0)] = items
    d3 = commit([CommitEntry(DELTA, [b"f"], depth=1, prev_lsn=s2, prev_idx=0)])
    items = items + [b"f"]
    expect[(d3, 0)] = items
    # FORMAT.md section 5: a REFS DELTA appends the items of the FULL entries it names (a
    # pending write's), then a plain DELTA on it in the same frame, then a SNAP over both
    w = commit([CommitEntry(FULL, [b"w0"]), CommitEntry(FULL, [b"w1", b"w2"], flags=0)])
    expect[(w, 0)], expect[(w, 1)] = [b"w0"], [b"w1", b"w2"]
    r = log.next_lsn
    commit([CommitEntry(DELTA, [pack_ref(w, 1), pack_ref(w, 0)], flags=F_REFS, depth=2,
                  prev_lsn=d3, prev_idx=0),
            CommitEntry(DELTA, [b"g"], depth=3, prev_lsn=r, prev_idx=0)])
    expect[(r, 0)] = items + [b"w1", b"w2", b"w0"]
    expect[(r, 1)] = items + [b"w1", b"w2", b"w0", b"g"]
    s3 = commit([CommitEntry(SNAP, [pack_ref(s2, 0), pack_ref(d3, 0), pack_ref(r, 0),
                              pack_ref(r, 1)])])
    expect[(s3, 0)] = expect[(r, 1)]
    return expect, payloads


@pytest.mark.parametrize("segment_bytes", [64 << 20, 300])
def test_read_channel_matches_resolve_channel(log_dir, segment_bytes):
    with SegmentLog.open(log_dir, segment_bytes=segment_bytes) as log:
        expect, payloads = _channel_log(log)
        for (lsn, idx), items in expect.items():
            got, flags = log.read_channel(lsn, idx)
            assert got == items, (lsn, idx)
            assert resolve_channel(payloads.__getitem__, lsn, idx) == (got, flags)
        assert log.read_channel(0, 1) == ([b"v"], F_VALUE)
        with pytest.raises(NotFoundError):
            log.read_channel(0, 5)
    assert verify(log_dir, deep=True).ok


def test_deep_verify_finds_broken_references(log_dir):
    with SegmentLog.open(log_dir) as log:
        log.append(encode_commit(b"", [CommitEntry(FULL, [b"a"])]), frame_type=FRAME_COMMIT)
        log.append(encode_commit(b"", [CommitEntry(DELTA, [b"b"], prev_lsn=0, prev_idx=3)]),
                   frame_type=FRAME_COMMIT)
        log.append(encode_commit(b"", [CommitEntry(SNAP, [pack_ref(1, 0)])]),
                   frame_type=FRAME_COMMIT)
        with pytest.raises(CorruptionError):
            log.read_channel(1, 0)
    assert verify(log_dir).ok
    rep = verify(log_dir, deep=True)
    assert not rep.ok
    assert [(d.kind, d.lost_first_lsn) for d in rep.damage] == [
        ("broken_chain", 1), ("broken_chain", 2)]


@pytest.mark.parametrize("target", ["delta", "value", "forward", "missing"])
def test_refs_delta_must_name_an_earlier_full_list_entry(log_dir, target):
    """A REFS DELTA (FORMAT.md section 5) naming anything but an earlier FULL list entry
    is damage: read_channel (C and Python) refuses it and verify --deep reports it."""
    payloads = {}
    with SegmentLog.open(log_dir) as log:
        def commit(entries):
            p = encode_commit(b"h", entries)
            lsn = log.append(p, frame_type=FRAME_COMMIT)
            payloads[lsn] = p
            return lsn

        commit([CommitEntry(FULL, [b"a"]), CommitEntry(FULL, [b"v"], flags=F_VALUE),
                CommitEntry(DELTA, [b"d"], depth=1, prev_lsn=0, prev_idx=0)])
        ref = {"delta": (0, 2), "value": (0, 1), "forward": (2, 0), "missing": (0, 7)}[target]
        bad = commit([CommitEntry(DELTA, [pack_ref(*ref)], flags=F_REFS, depth=1, prev_lsn=0,
                            prev_idx=0)])
        commit([CommitEntry(FULL, [b"later"])])
        with pytest.raises(CorruptionError):
            log.read_channel(bad, 0)
        with pytest.raises(CorruptionError):
            resolve_channel(payloads.__getitem__, bad, 0)
    rep = verify(log_dir, deep=True)
    assert [(d.kind, d.lost_first_lsn) for d in rep.damage] == [("broken_chain", 1)]


@pytest.mark.parametrize("policy", POLICIES)
def test_reads_race_appends_and_rolls(log_dir, policy):
    """Readers on the writer's handle see every appended frame, whether it is still in
    the pending buffer, in a leader's write, or already rolled into a sealed segment."""
    import random

    stop = threading.Event()
    errors: list[BaseException] = []
    with SegmentLog.open(log_dir, durability=policy, segment_bytes=4096) as log:
        def writer(t):
            try:
                for i in range(300):
                    log.append(b"%d:%d:" % (t, i) + b"x" * (i % 50))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def reader():
            rng = random.Random(7)
            try:
                while not stop.is_set():
                    n = log.next_lsn
                    if n:
                        p = log.read(rng.randrange(n))
                        t, i, rest = p.split(b":", 2)
                        assert rest == b"x" * (int(i) % 50)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        readers = [threading.Thread(target=reader) for _ in range(2)]
        writers = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
        for th in readers + writers:
            th.start()
        for th in writers:
            th.join()
        stop.set()
        for th in readers:
            th.join()
        assert not errors, errors[:3]
        assert log.next_lsn == 1200
    assert verify(log_dir).ok


def test_wait_written_writes_a_queued_frame_and_refuses_an_unappended_lsn(log_dir):
    # an `exit` append is only queued in memory; wait_written gives it the `async` promise
    # (in the file, so a reader -- or a process killed now -- sees it), without an fsync.
    # Queued means inside a write section (FORMAT.md 12): outside one, the section the
    # append takes for itself writes the frame when it ends.
    with SegmentLog.open(log_dir, durability="sync") as log:
        syncs = log.commit_syncs
        log.write_begin()
        lsn = log.append(b"queued", durability="exit")
        with SegmentLog.open(log_dir, read_only=True) as reader:
            with pytest.raises(NotFoundError):
                reader.read(lsn)
        log.wait_written(lsn)
        with SegmentLog.open(log_dir, read_only=True) as reader:
            assert reader.read(lsn) == b"queued"
        log.write_end()
        assert log.append(b"alone", durability="exit") == lsn + 1
        with SegmentLog.open(log_dir, read_only=True) as reader:
            assert reader.read(lsn + 1) == b"alone"   # written by its own section's end
        assert log.commit_syncs == syncs, "wait_written must not fdatasync"
        log.wait_written(lsn)                 # already written: returns at once
        with pytest.raises(NotFoundError):
            log.wait_written(lsn + 2)


@pytest.mark.parametrize("bad", [-1, "3", None, 2.0, True, 1 << 70])
def test_lsn_arguments_that_are_not_lsns_are_config_errors(log_dir, bad):
    from durkv.errors import ConfigError
    with SegmentLog.open(log_dir) as log:
        log.append(b"x")
        for call in (log.wait_durable, log.wait_written):
            with pytest.raises(ConfigError, match="an LSN is an int"):
                call(bad)
        if bad != -1:
            with pytest.raises(ConfigError, match="an LSN is an int"):
                log.read(bad)


def test_read_heads_over_many_megabytes_equals_the_heads_read_one_by_one(log_dir):
    # dkv_read_heads reads runs of neighbouring frames 1 MiB at a time: runs that span many
    # MB, broken by DATA frames and by LSNs left out, a head larger than a pread's MiB, and
    # frames still pending under `async` -- every head, in order, as read_frame gives it
    import random

    import msgpack
    from durkv.payload import decode_commit, encode_record

    rng = random.Random(7)
    wanted = []
    with SegmentLog.open(log_dir, durability="async") as log:
        for i in range(2500):
            if i % 97 == 5:
                log.append(b"data frame %d" % i)                 # not a COMMIT: not asked
                continue
            size = (3 << 19) if i == 1234 else rng.randrange(0, 4000)
            head = msgpack.packb([11, "r", {"i": i, "v": b"h" * size}])
            lsn = log.append(encode_record(head), frame_type=FRAME_COMMIT)
            if i % 41 != 3:                                       # some left out
                wanted.append(lsn)

        def one_by_one(lg):
            heads = [decode_commit(lg.read(lsn))[0] for lsn in wanted]
            return b"\xdd" + len(heads).to_bytes(4, "big") + b"".join(heads)

        expect = one_by_one(log)
        assert len(expect) > 5 << 20
        assert bytes(log.read_heads(wanted)) == expect            # some of it pending
    with SegmentLog.open(log_dir, read_only=True) as r:
        assert bytes(r.read_heads(wanted)) == expect
        assert bytes(r.read_heads(wanted[::-1])) == b"\xdd" + len(wanted).to_bytes(4, "big") \
            + b"".join(decode_commit(r.read(lsn))[0] for lsn in wanted[::-1])
