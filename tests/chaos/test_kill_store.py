"""kill -9 the store's writer at random moments, also during compact(): nothing
acknowledged is lost and every checkpoint present reads back intact.

The child (``store_child.py``) puts checkpoints under ``sync`` and prints each
acknowledged checkpoint id; values are a deterministic function of the id, so
the parent knows what every checkpoint must hold. ~20 kills by default,
``DURKV_SLOW_TESTS=1`` runs ten times more.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chaos.harness import kill_and_collect, read_until

import durkv
import durkv.log

CHILD = Path(__file__).with_name("store_child.py")
SLOW = os.environ.get("DURKV_SLOW_TESTS") == "1"
# as the other kill harnesses: slow mode's 120 kills read back histories of ~14,000
# checkpoints (a list of up to 14,000 items each), more than 300 s of checks
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(3600 if SLOW else 300)]

sys.path.insert(0, str(CHILD.parent))
from store_child import item  # noqa: E402


def _run_and_kill(path, mode, rnd) -> tuple[set[str], set[str], int, bool]:
    """Spawn the child, SIGKILL it at a random moment; return (acked, write-acked,
    compactions, killed inside compact())."""
    proc = subprocess.Popen([sys.executable, str(CHILD), str(path), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    buf = bytearray()
    try:
        if not read_until(proc.stdout.fileno(), buf, b"READY", time.monotonic() + 30):
            proc.kill()
            proc.wait()
            pytest.fail(f"child never became ready: {proc.stderr.read().decode()[-3000:]}")
        time.sleep(rnd.uniform(0.005, 0.15))
    finally:
        lines, _err = kill_and_collect(proc, buf)
    acked = {ln.split()[1] for ln in lines if ln.startswith("ACK ")}
    wacked = {ln.split()[1] for ln in lines if ln.startswith("WACK ")}
    in_compact = bool(lines) and lines[-1] == "COMPACTING"
    return acked, wacked, sum(ln == "COMPACTED" for ln in lines), in_compact


def _check(path, acked: set[str], wacked: set[str], checked: set[str], rnd) -> int:
    """Every acknowledged checkpoint is present; the new ones (and a sample of the
    older ones, and the latest) read back exactly."""
    with durkv.open(str(path)) as store:
        ids = [e.checkpoint_id for e in store.channel_entries("t", "", "n")]
        assert ids == [f"{i:08d}" for i in range(len(ids) - 1, -1, -1)], "a gap in the history"
        missing = acked - set(ids)
        assert not missing, f"acknowledged checkpoints lost: {sorted(missing)[:5]}"
        old = sorted(set(ids) & checked)
        todo = [c for c in ids if c not in checked] + rnd.sample(old, min(20, len(old)))
        # every checkpoint's list is a prefix of the newest one's: made once, not per
        # checkpoint (DURKV_SLOW_TESTS reaches ~10,000 items, and the check was quadratic)
        items = [item(j) for j in range(int(ids[0]) + 1)] if ids else []
        for cid in todo:
            c = store.get("t", "", cid)
            i = int(cid)
            assert c.values == {"msgs": items[:i + 1], "n": i}
            assert c.metadata == {"step": i} and c.checkpoint == {"i": i}
            if cid in wacked:
                assert [(w.idx, w.channel, w.value) for w in c.writes] == [(0, "w", i)]
            checked.add(cid)
        if ids:
            latest = store.get("t")
            assert latest.checkpoint_id == ids[0]
            assert latest.values["msgs"] == items
        return len(ids)


@pytest.mark.parametrize("mode,kills", [("put", 12), ("compact", 8)])
def test_kill_during_commits(tmp_path, mode, kills):
    rnd = random.Random(f"{mode}-{os.getpid()}")
    path = tmp_path / "store.durkv"
    all_acked: set[str] = set()
    all_wacked: set[str] = set()
    compactions = killed_in_compact = 0
    checked: set[str] = set()
    for _ in range(kills * (10 if SLOW else 1)):
        acked, wacked, nc, inside = _run_and_kill(path, mode, rnd)
        killed_in_compact += inside
        all_acked |= acked
        all_wacked |= wacked
        compactions += nc
        n = _check(path, all_acked, all_wacked, checked, rnd)
        assert n >= len(all_acked)
    assert all_acked, "the child never acknowledged a checkpoint"
    report = durkv.log.verify(str(path), deep=True)
    assert report.ok, report
    if mode == "compact":
        assert compactions > 0
        print(f"{compactions} compactions, {killed_in_compact} kills inside compact()")
