"""A store over a damaged or repaired log (issue 7, items 2, 5, 15): salvage reads what
still verifies, ``recover --skip-corrupt`` leaves an openable store, and a reader open
across a repair never returns another checkpoint's frame as the one it asked for.

Real stores on the local C log, damaged as files (``logtools``).
"""

from __future__ import annotations

import logtools as lt
import pytest
from durkv.errors import CorruptionError, NotFoundError
from durkv.log import recover, verify

import durkv
from storeinternals import backend_of

N = 40


def _msgs(i: int) -> list[str]:
    return [f"m{k}-" + "x" * 20 for k in range(i + 1)]


def _cid(i: int) -> str:
    return f"{i:04d}"


@pytest.fixture
def store_dir(tmp_path):
    """N checkpoints of thread t, each appending one message (delta chains), in several
    small segments."""
    d = tmp_path / "agent.durkv"
    with durkv.open(str(d), segment_bytes=2048, snapshot_every=4) as s:
        for i in range(N):
            s.put("t", "", _cid(i), checkpoint={"i": i}, metadata={"i": i},
                  values={"msgs": _msgs(i), "n": i}, versions={"msgs": i + 1, "n": i + 1})
    assert len(lt.segment_files(d)) >= 4
    return d


def _lsn_range(d, seg_index: int) -> range:
    seg = lt.segments(d)[seg_index]
    return range(seg.header.base_lsn, seg.header.base_lsn + len(seg.frames))


def test_salvage_history_goes_past_a_missing_middle_segment(store_dir):
    """The hole is reported, and history yields every checkpoint that still reads -- the
    older ones whose chains end before the hole -- instead of stopping at the first whose
    delta chain crosses it."""
    d = store_dir
    lost = _lsn_range(d, 2)
    lt.segment_files(d)[2].unlink()
    with durkv.open(str(d), recovery="salvage") as s:
        dmg = backend_of(s)._log.recovery_damage
        assert dmg is not None and dmg.kind == "missing_segment"
        assert (dmg.lost_first_lsn, dmg.lost_last_lsn) == (lost[0], lost[-1])
        got = {cp.checkpoint_id: cp.values for cp in s.history("t")}
        # every checkpoint before the hole reads back exactly (one frame per put: LSN = i)
        for i in range(lost[0]):
            assert got.get(_cid(i)) == {"msgs": _msgs(i), "n": i}, i
        assert all(v == {"msgs": _msgs(int(c)), "n": int(c)} for c, v in got.items())
    with pytest.raises(CorruptionError):
        durkv.open(str(d))                       # the default mode still refuses the hole


def test_store_with_missing_first_segment_salvage_then_recover(store_dir):
    d = store_dir
    first = _lsn_range(d, 0)
    lt.segment_files(d)[0].unlink()
    with pytest.raises(CorruptionError):
        durkv.open(str(d))
    with durkv.open(str(d), recovery="salvage") as s:
        dmg = backend_of(s)._log.recovery_damage
        assert (dmg.kind, dmg.lost_first_lsn, dmg.lost_last_lsn) == \
            ("missing_segment", 0, first[-1])
        ids = [cp.checkpoint_id for cp in s.history("t", values=False)]
        assert ids and all(int(c) > first[-1] for c in ids)
    rep = recover(str(d), skip_corrupt=True)
    assert [(x.kind, x.lost_first_lsn, x.lost_last_lsn) for x in rep.damage] == \
        [("missing_segment", 0, first[-1])]
    assert verify(str(d)).ok
    with durkv.open(str(d)) as s:       # an openable store again, and a writer
        s.put("t", "", "9999", checkpoint={}, metadata={}, values={"n": -1}, versions={"n": 99})
        assert s.get("t").values["n"] == -1
    with durkv.open(str(d), read_only=True) as s:
        assert s.get("t").checkpoint_id == "9999"


def test_reader_across_recover_and_reused_lsns(store_dir):
    """A reader open while `recover --skip-corrupt` cuts the log and a writer then appends
    another thread's checkpoints at the cut LSNs: after refresh() it maps the log again and
    answers from what is on disk now -- never another thread's checkpoint as one of its own."""
    d = store_dir
    reader = durkv.open(str(d), read_only=True)
    assert reader.get("t", "", _cid(15)).values["n"] == 15
    seg, frame = lt.frame_at(d, 10)
    lt.flip_byte(seg.path, frame.offset + lt.FRAME_HDR + 3)
    recover(str(d), skip_corrupt=True)
    with durkv.open(str(d)) as w:
        for i in range(N):
            w.put("other", "", f"x{i:02d}", checkpoint={}, metadata={}, values={"n": 1000 + i},
                  versions={"n": i + 1})
    # before refresh: the old view never passes a reused frame off as checkpoint 0015
    try:
        cp = reader.get("t", "", _cid(15))
    except (CorruptionError, NotFoundError):
        cp = None
    assert cp is None or (cp.checkpoint_id == _cid(15) and cp.values["n"] == 15)
    reader.refresh()
    assert reader.get("t", "", _cid(15)) is None         # cut by the repair
    assert reader.get("t", "", _cid(9)).values == {"msgs": _msgs(9), "n": 9}
    assert reader.get("other").values == {"n": 1000 + N - 1}
    assert [cp.checkpoint_id for cp in reader.history("t", values=False)] == \
        [_cid(i) for i in reversed(range(10))]
    reader.close()


def test_store_with_deleted_newest_segments_refuses_instead_of_going_back(store_dir):
    """Deleting the newest segments must not reopen the store at an older state as if
    nothing happened (item 6): the default open refuses, naming the loss; salvage shows
    what remains; recover --skip-corrupt accepts the loss explicitly."""
    d = store_dir
    files = lt.segment_files(d)
    end = lt.segments(d)[-2].header.base_lsn
    for p in files[-2:]:
        p.unlink()
    with pytest.raises(CorruptionError) as ei:
        durkv.open(str(d))
    assert ei.value.kind == "missing_segment" and ei.value.context["lost_first_lsn"] == end
    with pytest.raises(CorruptionError):
        durkv.open(str(d), read_only=True)
    with durkv.open(str(d), recovery="salvage") as s:
        newest = s.get("t").checkpoint_id
    assert int(newest) < N - 1
    recover(str(d), skip_corrupt=True)
    with durkv.open(str(d)) as s:
        assert s.get("t").checkpoint_id == newest


def test_opening_a_plain_file_as_a_store_says_so(tmp_path):
    f = tmp_path / "agent.durkv"
    f.write_text("x")
    with pytest.raises(durkv.ConfigError, match="is a file, not a store directory"):
        durkv.open(str(f))


def test_a_checkpoint_sharing_a_damaged_write_names_the_lost_frame(tmp_path):
    """A checkpoint whose REFS delta refers to a pending-write frame that a salvage read
    skipped as damaged is a CorruptionError naming that write frame (not only the
    checkpoint's own), never a shorter list."""
    p = tmp_path / "s"
    s = durkv.open(p, durability="sync")
    s.put("t", "", "1", checkpoint={}, metadata={}, values={"m": ["hello"]}, versions={"m": 1})
    msg = "MSG-XYZ-" * 5
    s.put_writes("t", "", "1", "agent", [(0, "m", [msg])])
    s.put("t", "", "2", checkpoint={}, metadata={}, values={"m": ["hello", msg]},
          versions={"m": 2}, parent_id="1")
    s.close()
    # the only frame holding the message's bytes: the write's (the checkpoint refers to it)
    [(seg, f)] = [(g, f) for g in lt.segments(p) for f in g.frames if msg.encode() in f.payload]
    wlsn = f.lsn
    lt.flip_byte(seg.path, f.offset + lt.FRAME_HDR + f.payload.find(msg.encode()) + 2)
    with durkv.open(p, recovery="salvage") as r:
        with pytest.raises(CorruptionError, match=rf"names no entry \(lsn {wlsn} entry 0\)"):
            r.get("t", "", "2")


def test_salvage_channel_entries_go_past_a_missing_middle_segment(tmp_path):
    """channel_entries in salvage mode lists every checkpoint that still reads, as history
    does, instead of stopping at the hole: one whose frame is lost is skipped, and so is
    the one after it (its parent is lost: its whole value would be reported, and that
    chain crosses the hole); every other one reports its append."""
    d = tmp_path / "agent.durkv"
    with durkv.open(str(d), segment_bytes=2048, snapshot_every=4) as s:
        for i in range(N):
            s.put("t", "", _cid(i), checkpoint={"i": i}, metadata={"i": i},
                  values={"msgs": _msgs(i)}, versions={"msgs": i + 1},
                  parent_id=_cid(i - 1) if i else None)
    lost = _lsn_range(d, 2)
    lt.segment_files(d)[2].unlink()
    with durkv.open(str(d), recovery="salvage") as s:
        got = {e.checkpoint_id: (e.kind, e.value) for e in s.channel_entries("t", "", "msgs")}
        for i in range(N):      # one frame per put: LSN = i
            if i in lost or i - 1 in lost:
                assert _cid(i) not in got, i
            elif i == 0:
                assert got[_cid(i)] == ("full", _msgs(0))
            else:
                assert got[_cid(i)] == ("append", _msgs(i)[-1:]), i
        assert len(got) == N - len(lost) - 1
