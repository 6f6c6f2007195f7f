"""Store open time: from an index snapshot (K_INDEX) vs a full replay of the log.

| benchmark   | measures                                                  | target       |
|-------------|-----------------------------------------------------------|--------------|
| store-open  | open (read-only) of a 200,000-frame local store whose     | <= 0.1x      |
|             | newest frame is a K_INDEX, vs a full replay of the same   |              |
|             | log written with ``index_every=0`` (no snapshot; the      |              |
|             | replay alone, as open did before K_INDEX; the open with   |              |
|             | the backward probe that finds none is recorded too)       |              |

Workload: 100 threads x 1,000 checkpoints, each followed by one put_writes
(200,000 frames). Env: DURKV_BENCH_QUICK=1 (20,000 frames), DURKV_BENCH_DIR.
"""

from __future__ import annotations

import shutil

import pytest
from benchlib import QUICK, median_time, record

import durkv
from durkv.store import K_INDEX, Store, read_head


def cid(i: int) -> str:
    h = f"{i:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _open_time(path, rounds=3) -> float:
    def run():
        durkv.open(str(path), read_only=True).close()
    return median_time(run, rounds)


@pytest.mark.benchmark(group="store-open")
def test_open_with_snapshot_vs_full_replay(benchmark, bench_root, monkeypatch):
    n_threads, per = (10, 1000) if QUICK else (100, 1000)
    frames = 2 * n_threads * per
    full = bench_root / "open-full"
    with durkv.open(str(full), durability="exit", index_every=0) as s:
        for t in range(n_threads):
            for i in range(per):
                s.put(f"thread-{t}", "", cid(i), checkpoint={"v": 1}, metadata={"step": i},
                      values={"count": i}, versions={"count": i + 1},
                      parent_id=cid(i - 1) if i else None)
                s.put_writes(f"thread-{t}", "", cid(i), "task", [(0, "count", i)])
        assert s._b.next_lsn == frames
    snap = bench_root / "open-snap"
    shutil.copytree(full, snap)
    durkv.open(str(snap), durability="exit").close()   # a writer's close adds the K_INDEX
    with durkv.open(str(snap), read_only=True) as r:
        assert r._index.index_lsn == frames and read_head(r._b.read(frames))[0] == K_INDEX
        assert len(r._index.ix.threads) == n_threads

    t_full = _open_time(full)
    with monkeypatch.context() as m:           # the replay alone, without the probe
        m.setattr(Store, "_restore_index", lambda self: None)
        t_replay = _open_time(full)
    t_snap = benchmark.pedantic(lambda: _open_time(snap, rounds=5), rounds=1, iterations=1)
    ratio = t_snap / t_replay     # vs the replay an open did before snapshots existed
    print(f"\nopen: snapshot {t_snap * 1e3:.1f} ms, full replay {t_full * 1e3:.1f} ms "
          f"(replay alone {t_replay * 1e3:.1f} ms)")
    record(benchmark, f"store open from a snapshot / full replay ({frames} frames)",
           ratio=ratio, target="open with snapshot <= 0.1x full replay", ok=ratio <= 0.1,
           frames=frames, open_snapshot_s=round(t_snap, 4), full_replay_s=round(t_replay, 4),
           open_no_snapshot_with_probe_s=round(t_full, 4))
