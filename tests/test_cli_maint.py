"""``durkv compact`` and ``durkv stats`` (issue 19, "Maintenance"), and the progress bars of
the long commands (issue 19, "Conventions").

Real stores, real processes: a second process holds a store open to write with the real
flock, the bars are looked for on a real pseudo-terminal in front of the real ``durkv``
script, and `durkv compact` is SIGKILLed at random moments.
"""

from __future__ import annotations

import json
import os
import pty
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import durkv
import pytest
from click.testing import CliRunner
from durkv.cli import cli
from durkv.serde import default_serde

SLOW = os.environ.get("DURKV_SLOW_TESTS") == "1"
MARKER = "ZEBRA-7f3c-deleted-thread-marker"
_SCRIPT = Path(sys.executable).with_name("durkv")
DURKV = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "durkv.cli"]


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def item(t: str, i: int) -> str:
    return f"{t} says {i}: " + "x" * (40 + i % 50)


def fill(path: Path, threads: int = 4, steps: int = 40, *, marker_thread: str | None = None,
         segment_bytes: int | None = 16384) -> None:
    """``threads`` threads of ``steps`` checkpoints each (a growing message list, a
    counter, one pending write each) and a run journal; values are never compressed so
    that their bytes can be looked for in the files."""
    with durkv.open(str(path), compress_min_bytes=1 << 20, segment_bytes=segment_bytes,
                    snapshot_every=8) as s:
        for k in range(threads):
            t = f"t{k}"
            msgs: list[str] = []
            parent = None
            for i in range(steps):
                msgs = msgs + [item(t, i) + (MARKER if t == marker_thread else "")]
                cid = f"{i:06d}"
                s.put(t, "", cid, checkpoint={"i": i}, metadata={"step": i, "run_id": f"r{k}"},
                      values={"msgs": msgs, "n": i}, versions={"msgs": i, "n": i},
                      parent_id=parent)
                s.put_writes(t, "", cid, "task", [(0, "out", f"{t}-{i}")])
                parent = cid
            s.append_journal(f"r{k}", {"e": 1, "t": 0.0, "note": t}, durable=True)


def snapshot(path: Path, skip: str | None = None) -> dict:
    """Everything the store reads back: every checkpoint of every thread (values, metadata,
    record, writes) and every run's journal."""
    with durkv.open(str(path), read_only=True) as s:
        out = {}
        for t in s.threads():
            if t == skip:
                continue
            for c in s.history(t):
                full = s.get(t, "", c.checkpoint_id)
                out[(t, c.checkpoint_id)] = (full.values, full.metadata, full.checkpoint,
                                             full.parent_id,
                                             [(w.task_id, w.idx, w.channel, w.value)
                                              for w in full.writes])
        for r in s.journal_runs():
            out[("journal", r)] = s.journal(r)
        return out


def files_holding(path: Path, needle: bytes, *, skip_quarantine: bool) -> list[str]:
    hits = []
    for p in sorted(path.rglob("*")):
        if not p.is_file() or (skip_quarantine and "quarantine" in p.parts):
            continue
        if needle in p.read_bytes():
            hits.append(str(p.relative_to(path)))
    return hits


# ---- compact ---------------------------------------------------------------------------------


def test_compact_removes_a_deleted_threads_bytes_and_keeps_every_other_thread(tmp_path):
    d = tmp_path / "agent.durkv"
    fill(d, marker_thread="t1")
    with durkv.open(str(d)) as s:
        s.delete_thread("t1")
    expect = snapshot(d)
    assert ("t1", "000000") not in expect and ("t0", "000039") in expect
    # the test can fail: the marker is on disk before, in plain bytes
    assert files_holding(d, MARKER.encode(), skip_quarantine=False)

    result = run("compact", d)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"compacted {d} in ")
    assert "dropped: 40 checkpoint record(s), 40 pending-write record(s)" in result.stdout
    assert "kept: 3 thread(s), 120 checkpoint(s), 120 pending-write record(s)" in result.stdout

    # GUARANTEES "Compaction": the deleted thread's bytes are in no file of the store (quarantine is
    # not touched by compact, and this store has none)
    assert not (d / "quarantine").exists()
    assert files_holding(d, MARKER.encode(), skip_quarantine=False) == []
    assert snapshot(d) == expect
    assert run("verify", "--deep", d).exit_code == 0


def test_compact_removes_a_deleted_runs_checkpoints_and_journal(tmp_path):
    """delete_runs drops a run's checkpoints and its journal from the index; compact then
    drops their bytes, the journal record's included."""
    d = tmp_path / "agent.durkv"
    fill(d, threads=3, steps=10)
    with durkv.open(str(d), compress_min_bytes=1 << 20) as s:
        s.append_journal("r1", {"e": 1, "t": 0.0, "note": MARKER}, durable=True)
        s.put("t1", "", "000100", checkpoint={}, metadata={"run_id": "r1"},
              values={"secret": MARKER}, versions={"secret": 1})
    assert files_holding(d, MARKER.encode(), skip_quarantine=False)
    with durkv.open(str(d)) as s:
        s.delete_runs(["r1"])
    expect = snapshot(d)
    assert ("journal", "r1") not in expect and ("journal", "r0") in expect
    result = run("compact", "--json", d)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["kept"]["runs"] == 2
    assert files_holding(d, MARKER.encode(), skip_quarantine=False) == []
    assert snapshot(d) == expect


def test_compact_json_and_quiet(tmp_path):
    d = tmp_path / "agent.durkv"
    fill(d, threads=3, steps=20)
    with durkv.open(str(d)) as s:
        s.delete_thread("t2")
        s.prune(["t0"], keep_last=2)
    expect = snapshot(d)
    before = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    result = run("compact", "--json", d)
    assert result.exit_code == 0, result.output
    rep = json.loads(result.stdout)          # exactly one JSON document
    assert rep["path"] == str(d)
    assert rep["bytes_on_disk_before"] == before
    assert rep["bytes_on_disk_after"] == sum(p.stat().st_size for p in d.rglob("*")
                                             if p.is_file())
    assert rep["bytes_on_disk_after"] < rep["bytes_on_disk_before"]
    # t2 (20 checkpoints) and 18 of t0's went, with their pending writes
    assert rep["dropped_records"]["checkpoints"] == 38
    assert rep["dropped_records"]["pending_writes"] == 38
    assert rep["kept"] == {"threads": 2, "checkpoints": 22, "pending_writes": 22, "runs": 3,
                           "journal_records": 3}
    assert snapshot(d) == expect

    quiet = run("compact", "-q", d)
    assert quiet.exit_code == 0 and quiet.output == ""
    assert snapshot(d) == expect


_HOLDER = """
import sys, time, durkv
s = durkv.open(sys.argv[1])
# an agent's commit since the store's last index snapshot: a refused compact's close
# appended a snapshot of the whole index for it, per try
s.put("agent", "", "c1", checkpoint={}, metadata={}, values={"i": 1}, versions={"i": 1})
print("OPEN", flush=True)
sys.stdin.readline()
s.close()
"""


def test_compact_refuses_while_another_process_writes(tmp_path):
    d = tmp_path / "agent.durkv"
    fill(d, threads=2, steps=10)
    with durkv.open(str(d)) as s:
        s.delete_thread("t1")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(d)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "OPEN"
        files = {p: p.read_bytes() for p in d.glob("*.seg")}
        for args in (["compact", d], ["compact", "--json", d]):
            result = run(*args)
            assert result.exit_code == 1, result.output
            lines = result.stderr.splitlines()
            assert lines[0] == (f"error: another process has {d} open for writing and compact "
                                "needs the store to itself; nothing was changed")
            assert lines[1].startswith("Try: stop the agent")
            assert len(lines) == 2 and "Traceback" not in result.output
        assert json.loads(result.stdout)["error"] == "store_locked"
        assert {p: p.read_bytes() for p in d.glob("*.seg")} == files   # nothing changed
    finally:
        holder.communicate("\n", timeout=30)
    assert run("compact", "-q", d).exit_code == 0      # alone now


def test_a_reader_follows_the_store_across_two_compactions(tmp_path):
    """A read-only handle open across two `durkv compact` runs sees the compacted store
    (the deleted thread gone, the others the same) at its next read, not its old view:
    the segments it knew were all unlinked, so its log is mapped again."""
    d = tmp_path / "agent.durkv"
    fill(d, threads=3, steps=10)
    expect = snapshot(d, skip="t1")
    with durkv.open(str(d), read_only=True) as reader:
        assert reader.threads() == ["t0", "t1", "t2"]
        assert run("compact", "-q", d).exit_code == 0
        with durkv.open(str(d)) as s:
            s.delete_thread("t1")
        assert run("compact", "-q", d).exit_code == 0
        assert reader.threads() == ["t0", "t2"]
        for (t, cid), (values, *_rest) in expect.items():
            if t != "journal":
                assert reader.get(t, "", cid).values == values


def test_compact_and_stats_refuse_a_missing_store_without_creating_it(tmp_path):
    for cmd in ("compact", "stats"):
        result = run(cmd, tmp_path / "nope")
        assert result.exit_code == 1
        assert result.stderr.startswith(f"error: no durkv log at {tmp_path / 'nope'}")
        assert not (tmp_path / "nope").exists()
    assert run("compact", "s3://bucket/prefix").exit_code == 2


# ---- stats -----------------------------------------------------------------------------------


def _whole_bytes(values: dict) -> int:
    """The bytes of the FULL entries holding ``values`` whole (docs/FORMAT.md 5), computed
    here from the serde, independently of the store's code."""
    dumps = default_serde.dumps
    n = 0
    for v in values.values():
        items = [dumps(x) for x in v] if isinstance(v, list) else [dumps(v)]
        n += 24 + sum(4 + len(i) for i in items)
    return n


def test_stats_counts_and_bytes(tmp_path):
    d = tmp_path / "agent.durkv"
    fill(d, threads=3, steps=30, segment_bytes=8192)
    result = run("stats", "--json", d)
    assert result.exit_code == 0, result.output
    st = json.loads(result.stdout)
    assert (st["threads"], st["runs"], st["checkpoints"], st["pending_writes"],
            st["journal_records"]) == (3, 3, 90, 90, 3)
    segs = sorted(d.glob("*.seg"))
    assert st["segments"] == len(segs) > 1
    assert st["segment_bytes"] == sum(p.stat().st_size for p in segs)
    assert st["bytes_on_disk"] == sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    assert sum(st["bytes_by_kind"].values()) == st["segment_bytes"]
    assert st["frames_by_kind"]["checkpoints"] == 90
    assert st["frames_by_kind"]["pending_writes"] == 90
    assert st["frames_by_kind"]["journal"] == 3
    assert st["channel_bytes"] == (st["bytes_by_kind"]["channel_full"]
                                   + st["bytes_by_kind"]["channel_delta"])

    # every state whole, computed from what the store reads back
    whole = 0
    with durkv.open(str(d), read_only=True) as s:
        for t in s.threads():
            for c in s.history(t):
                whole += _whole_bytes(s.get(t, "", c.checkpoint_id).values)
    assert st["whole_states_bytes"] == whole
    # both channels change at every step here: each value is distinct
    assert st["whole_values_bytes"] == whole
    assert st["channel_bytes"] * 5 < whole       # the delta encoding's saving is real

    text = run("stats", d)
    assert text.exit_code == 0
    assert text.stdout.startswith(f"{d}: 3 thread(s), 3 run(s), 90 checkpoint(s)")
    assert "channel values DELTA/SNAP" in text.stdout and "delta encoding:" in text.stdout


def test_stats_counts_an_unchanged_channel_once_in_whole_values(tmp_path):
    d = tmp_path / "agent.durkv"
    with durkv.open(str(d), compress_min_bytes=1 << 20) as s:
        for i in range(10):     # "big" is written once, then kept by reference
            s.put("t", "", f"{i:02d}", checkpoint={}, metadata={},
                  values={"big": ["same" * 50] * 5, "n": i} if i == 0 else {"n": i},
                  versions={"big": 1, "n": i}, parent_id=f"{i - 1:02d}" if i else None)
        vals = s.get("t").values
    st = json.loads(run("stats", "--json", d).stdout)
    big = _whole_bytes({"big": vals["big"]})
    n_each = _whole_bytes({"n": 0})         # small ints: one msgpack byte each
    assert st["whole_states_bytes"] == 10 * big + 10 * n_each
    assert st["whole_values_bytes"] == big + 10 * n_each


_WRITER = """
import sys, durkv
s = durkv.open(sys.argv[1], compress_min_bytes=1 << 20)
msgs = []
print("GO", flush=True)
i = 0
while True:
    msgs = msgs + ["m%d" % i + "y" * 80]
    s.put("w", "", "%08d" % i, checkpoint={}, metadata={}, values={"msgs": msgs},
          versions={"msgs": i}, parent_id=("%08d" % (i - 1)) if i else None)
    i += 1
"""


def test_stats_reads_alongside_a_running_writer(tmp_path):
    d = tmp_path / "agent.durkv"
    fill(d, threads=1, steps=5)
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(d)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert writer.stdout.readline().strip() == "GO"
        seen = []
        deadline = time.monotonic() + 60
        while len(seen) < 4 and time.monotonic() < deadline:
            result = run("stats", "--json", d)
            assert result.exit_code == 0, result.output
            st = json.loads(result.stdout)
            assert st["whole_states_bytes"] > 0 and st["frames"] >= st["checkpoints"]
            seen.append(st["checkpoints"])
            time.sleep(0.05)
        assert writer.poll() is None, "the writer stopped"
        assert seen == sorted(seen) and seen[-1] > seen[0] >= 5, seen
    finally:
        writer.kill()
        writer.wait()


# ---- progress bars: a terminal shows one, a pipe or -q none ----------------------------------


def _on_a_terminal(args: list[str], env: dict | None = None) -> tuple[int, str]:
    """Run the real durkv script with stdout and stderr on a pseudo-terminal; its exit
    code and everything it wrote there."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(DURKV + args, stdin=subprocess.DEVNULL, stdout=follower,
                                stderr=follower, env=dict(os.environ, COLUMNS="100",
                                                          TERM="xterm", **(env or {})))
        os.close(follower)
        follower = -1
        out = bytearray()
        while True:
            ready, _, _ = select.select([leader], [], [], 60)
            if not ready:
                proc.kill()
                pytest.fail(f"durkv {args} wrote nothing for 60 s")
            try:
                chunk = os.read(leader, 65536)
            except OSError:        # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            out += chunk
        return proc.wait(timeout=60), out.decode(errors="replace")
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)


BAR_CASES = [("verify", "verifying"), ("recover", "recovering"), ("compact", "compacting"),
             ("stats", "reading")]


@pytest.mark.parametrize("cmd,label", BAR_CASES)
def test_long_commands_draw_a_bar_on_a_terminal_only(tmp_path, cmd, label):
    d = tmp_path / "agent.durkv"
    fill(d, threads=2, steps=15, segment_bytes=4096)
    code, out = _on_a_terminal([cmd, str(d)])
    assert code == 0, out
    assert label in out and "100%" in out, out           # click's bar: label, bar, percent

    piped = subprocess.run(DURKV + [cmd, str(d)], capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0, piped.stderr
    assert label not in piped.stderr and "%" not in piped.stderr, piped.stderr

    if cmd != "stats":          # stats prints its figures; it has no -q
        code, out = _on_a_terminal([cmd, "-q", str(d)])
        assert code == 0 and out == "", out
    code, out = _on_a_terminal([cmd, "--json", str(d)])
    assert code == 0 and label not in out, out
    json.loads(out)             # nothing but the one document, even on a terminal


# ---- SIGKILL during `durkv compact` ----------------------------------------------------------


def _segments(d: Path) -> list[tuple[str, int]]:
    out = []
    for p in sorted(d.glob("*.seg")):
        try:
            out.append((p.name, p.stat().st_size))
        except FileNotFoundError:
            pass        # unlinked by the compaction meanwhile
    return out


def _kill_inside_compaction(d: Path, delay: float) -> bool:
    """Start `durkv compact`, wait until its compaction writes (the segment files change:
    the roll before BEGIN), then SIGKILL it ``delay`` s later. True if the kill landed
    while it ran."""
    before = _segments(d)
    proc = subprocess.Popen(DURKV + ["compact", "-q", str(d)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while _segments(d) == before and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.0005)
    time.sleep(delay)
    landed = proc.poll() is None
    if landed:
        proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGKILL), err
    return landed


def _verify_after_kill(d: Path) -> None:
    """verify is clean after a SIGKILL, but for the one frame the kill may have cut: Linux
    stops a write(2) of more than a page between pages when SIGKILL arrives, so a frame
    being written (the index snapshot `compact` writes as it closes: 13 KiB here) can be
    left torn at the end of the active segment, unacknowledged. verify reports that torn
    tail; the next writer's open moves it to quarantine/, and then verify is clean."""
    got = run("verify", "--json", d)
    if got.exit_code == 0:
        return
    report = json.loads(got.stdout)
    active = [x["segment"] for x in report["segments"] if not x["sealed"]]
    assert [(x["kind"], [x["segment"]]) for x in report["damage"]] == [("torn_tail", active)], \
        report
    with durkv.open(str(d)):
        pass
    assert run("verify", "-q", d).exit_code == 0


def test_sigkill_during_compact_loses_nothing(tmp_path):
    """`durkv compact` killed at random moments of its compaction (GUARANTEES "Compaction"): every
    thread reads as before, verify is clean (or, once the next writer's open has moved a
    frame the kill cut to quarantine/), and a last compaction still removes the deleted
    thread's bytes."""
    rnd = random.Random(19)
    d = tmp_path / "agent.durkv"
    fill(d, threads=8, steps=60, marker_thread="t3")
    with durkv.open(str(d)) as s:
        s.delete_thread("t3")
    expect = snapshot(d)
    # how long one compaction of this store takes here (a copy, timed in-process)
    probe = tmp_path / "probe.durkv"
    fill(probe, threads=8, steps=60)
    with durkv.open(str(probe)) as s:
        t0 = time.monotonic()
        s.compact()
        span = time.monotonic() - t0
    landed = 0
    for _ in range(40 if SLOW else 8):
        landed += _kill_inside_compaction(d, rnd.uniform(0.0, span))
        assert snapshot(d) == expect
        _verify_after_kill(d)
    assert landed >= 2, f"only {landed} kill(s) landed inside a compaction: nothing proved"
    assert run("compact", "-q", d).exit_code == 0
    assert snapshot(d) == expect
    assert files_holding(d, MARKER.encode(), skip_quarantine=False) == []
