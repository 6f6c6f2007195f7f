"""kill -9 of writers at random instants while other writers of the same store keep
committing (issue 17; docs/FORMAT.md section 12, GUARANTEES section 18).

Two survivors commit for the whole test; victims (forked by the fork server, so each
costs milliseconds) join them and are killed 0-40 ms after they opened the store --
inside a write section, inside write(2), inside an fsync, during a segment roll. Then:
every commit acknowledged by anyone is in the store, once, in order (at most one more,
whose acknowledgement the kill cut off); the survivors never died and no commit of
theirs waited longer than the lock timeout; `verify --deep` is clean after the next
open. >= 50 kills (bounded to ~60 s); DURKV_SLOW_TESTS=1: 1,000.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chaos.harness import ForkServer

import durkv
from durkv.log import verify

CHILD = Path(__file__).with_name("multiwriter_child.py")
SLOW = os.environ.get("DURKV_SLOW_TESTS") == "1"
# the slow run's kill budget is an hour: the default 300 s timeout would cut it short
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(4200 if SLOW else 300)]
LOCK_TIMEOUT = 10.0     # the default lock_timeout_ms, in seconds


def _check_run(s, name: str, acked: list[int]) -> None:
    assert acked == list(range(len(acked))), (name, acked[:5])
    got = [r["i"] for r in s.journal(name)]
    cks = [int(c.checkpoint_id) for c in s.history(name)][::-1]
    present = sorted(got + cks)
    assert present == list(range(len(present))), f"{name}: a commit twice or a hole"
    assert got == [i for i in present if i % 3 != 2]
    assert len(acked) <= len(present) <= len(acked) + 1, (name, len(acked), len(present))


def test_kill_writers_while_others_commit(tmp_path):
    path = str(tmp_path / "s.durkv")
    durkv.open(path).close()
    kills = 1000 if SLOW else 50
    budget = 3600 if SLOW else 60
    rnd = random.Random(int(os.environ.get("DURKV_SEED", "17")))
    survivors = []
    for k in range(2):
        acks = str(tmp_path / f"survivor{k}.acks")
        p = subprocess.Popen([sys.executable, str(CHILD), path, f"s{k}", acks],
                             stderr=subprocess.PIPE)
        survivors.append((p, f"s{k}", acks))
    acked: dict[str, list[int]] = {}
    done = 0
    try:
        with ForkServer("multiwriter_child") as fs:
            t_end = time.monotonic() + budget
            while done < kills and (done < 10 or time.monotonic() < t_end):
                name = f"v{done}"
                lines = fs.run_child([path, name], str(tmp_path / "victim.err"),
                                     kill_after=rnd.uniform(0, 0.04), end="NEVER")
                acked[name] = [int(ln.split()[2]) for ln in lines if ln.startswith("A ")]
                done += 1
                for p, sname, _a in survivors:
                    assert p.poll() is None, f"survivor {sname} died:\n{p.stderr.read()!r}"
    finally:
        for p, _n, _a in survivors:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
    assert done >= 50
    assert sum(len(v) for v in acked.values()) > 0, "no victim ever committed"
    for p, sname, acks in survivors:
        assert p.returncode == -signal.SIGKILL, p.stderr.read()
        whole = [ln for ln in Path(acks).read_text().split("\n")[:-1]]
        acked[sname] = [int(ln.split()[0]) for ln in whole]
        worst = max(float(ln.split()[1]) for ln in whole)
        assert worst < LOCK_TIMEOUT, f"survivor {sname} waited {worst:.2f}s for one commit"
        assert len(whole) > 10, f"survivor {sname} barely committed"
    with durkv.open(path) as s:         # a writer: repairs the last writer's torn tail
        for name, got in acked.items():
            _check_run(s, name, got)
    report = verify(path, deep=True)
    assert report.ok, report.damage
    print(f"kills {done}, victims' acks {sum(len(acked[f'v{i}']) for i in range(done))}, "
          f"survivors' {[len(acked[n]) for _p, n, _a in survivors]}, segments "
          f"{len(report.segments)}, quarantined {len(os.listdir(Path(path, 'quarantine'))) if os.path.isdir(Path(path, 'quarantine')) else 0}")
