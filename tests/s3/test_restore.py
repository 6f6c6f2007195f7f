"""durkv restore against a real HTTP S3: all or nothing, every byte checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

import durkv
from durkv.backends import s3 as ds3
from durkv.cli.main import cli
from durkv.errors import ConfigError, CorruptionError, NotFoundError
from durkv.log import verify

from .storetools import make_store, put, sealed_files, segment_files


@pytest.fixture
def archived(tmp_path, s3, bucket):
    """A store of 40 commits in many sealed segments, archived to s3://bucket/p."""
    path = make_store(tmp_path / "a.durkv", 40)
    url = f"s3://{bucket}/p"
    ds3.archive(path, url)
    manifest = json.loads(s3.get_object(Bucket=bucket, Key="p/manifests/"
                                        "00000000000000000000.json")["Body"].read())
    return path, url, manifest


def test_restore_in_a_new_process_then_the_store_resumes(tmp_path, archived):
    path, url, manifest = archived
    dest = tmp_path / "restored.durkv"
    child = textwrap.dedent(f"""
        import json, durkv
        from durkv.backends import s3 as ds3
        plan, report = ds3.restore({url!r}, {str(dest)!r})
        with durkv.open({str(dest)!r}) as store:
            before = store.get("t")
            store.put("t", "", "999999", checkpoint={{}}, metadata={{}}, values={{"n": -1}},
                      versions={{"n": 999}}, parent_id=before.checkpoint_id)
            segs = [(s.segment_no, s.base_lsn) for s in store._b._log.segments()]
        print(json.dumps({{"ok": report.ok, "last": before.checkpoint_id,
                          "n": before.values["n"], "segs": segs}}))
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         env=os.environ.copy(), timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["ok"] and got["last"] == "000039" and got["n"] == 39
    last = manifest["segments"][-1]
    # the next writer starts the next segment at the next LSN (nothing renumbered)
    assert got["segs"][-1] == [last["segment_no"] + 1, 40]
    assert verify(str(dest)).ok
    with durkv.open(str(dest), read_only=True) as store:
        assert store.get("t").values == {"n": -1}
        assert [c.checkpoint_id for c in store.history("t")][:2] == ["999999", "000039"]
    assert set(sealed_files(path)) < set(segment_files(dest))
    for name, data in sealed_files(path).items():
        assert (dest / name).read_bytes() == data


def test_restore_to_an_lsn_cuts_inside_a_segment(tmp_path, archived):
    path, url, manifest = archived
    seg = [e for e in manifest["segments"] if e["frames"] > 1][1]
    n = seg["base_lsn"]                  # the first frame of a multi-frame segment
    dest = tmp_path / "pit.durkv"
    plan, report = ds3.restore(url, dest, to_lsn=n)
    assert plan.cut_after_lsn == n and report.ok and report.next_lsn == n + 1
    with durkv.open(str(dest), index_every=0) as store:
        assert store.get("t").checkpoint_id == f"{n:06d}"
        put(store, 1000)
    assert verify(str(dest)).next_lsn == n + 2


def test_restore_to_a_time_keeps_the_segments_sealed_by_then(tmp_path, s3, bucket):
    path = make_store(tmp_path / "a.durkv", 10)
    url = f"s3://{bucket}/p"
    ds3.archive(path, url)
    time.sleep(0.05)
    then = time.time()
    time.sleep(0.05)
    with durkv.open(path, segment_bytes=2048, index_every=0) as store:
        for i in range(10, 20):
            put(store, i)
        store.archive(url, seal=True)
    plan, report = ds3.restore(url, tmp_path / "t.durkv", to_time=then)
    assert plan.manifest_no == 1 and report.next_lsn == 10
    with pytest.raises(NotFoundError, match="covers that time"):
        ds3.restore(url, tmp_path / "old.durkv", to_time="1970-01-02T00:00:00Z")
    assert not (tmp_path / "old.durkv").exists()


def _no_leftovers(parent, dest):
    assert not dest.exists()
    assert not [p for p in os.listdir(parent) if ".restore-" in p]


@pytest.mark.parametrize("damage", ["bit_flip", "missing", "truncated"])
def test_a_damaged_object_is_named_and_nothing_is_restored(tmp_path, s3, bucket, archived,
                                                           damage):
    _, url, manifest = archived
    middle = manifest["segments"][len(manifest["segments"]) // 2]
    key = "p/" + middle["key"]
    data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    if damage == "missing":
        s3.delete_object(Bucket=bucket, Key=key)
    elif damage == "truncated":
        s3.put_object(Bucket=bucket, Key=key, Body=data[:-1])
    else:
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x10
        s3.put_object(Bucket=bucket, Key=key, Body=bytes(flipped))
    dest = tmp_path / "r.durkv"
    with pytest.raises(CorruptionError) as err:
        ds3.restore(url, dest)
    kind = {"bit_flip": "checksum_mismatch", "missing": "missing_segment",
            "truncated": "truncated"}[damage]
    assert err.value.segment == key and err.value.kind == kind and key in str(err.value)
    _no_leftovers(tmp_path, dest)


def test_a_lying_manifest_is_caught_by_the_log_verify(tmp_path, s3, bucket, archived):
    """Even when an object and the manifest agree with each other (both rewritten), the
    restored log's own checks (segment digest, chain) refuse it."""
    _, url, manifest = archived
    from durkv.log import crc32c

    seg = manifest["segments"][3]
    key = "p/" + seg["key"]
    data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[200] ^= 0x01
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    seg["crc32c"] = seg["object_crc32c"] = crc32c(bytes(data))
    manifest["manifest_no"], manifest["prev_manifest_no"] = 1, 0
    s3.put_object(Bucket=bucket, Key="p/manifests/00000000000000000001.json",
                  Body=json.dumps(manifest).encode())
    dest = tmp_path / "r.durkv"
    with pytest.raises(CorruptionError) as err:
        ds3.restore(url, dest)
    assert err.value.segment == key and "does not verify" in str(err.value)
    _no_leftovers(tmp_path, dest)


def test_restore_refuses_an_existing_directory_and_dry_run_writes_nothing(tmp_path, archived):
    _, url, _ = archived
    dest = tmp_path / "busy"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not an empty directory"):
        ds3.restore(url, dest)
    assert os.listdir(dest) == ["keep.txt"]
    plan, report = ds3.restore(url, tmp_path / "plan.durkv", dry_run=True)
    assert report is None and plan.next_lsn == 40 and not (tmp_path / "plan.durkv").exists()
    with pytest.raises(NotFoundError, match="past it"):
        ds3.restore(url, tmp_path / "x.durkv", to_lsn=40)
    with pytest.raises(NotFoundError, match="no durkv archive"):
        ds3.restore(url + "-none", tmp_path / "y.durkv")


def test_a_compacted_store_archives_and_restores(tmp_path, s3, bucket):
    path = make_store(tmp_path / "a.durkv", 30)
    url = f"s3://{bucket}/p"
    ds3.archive(path, url)
    with durkv.open(path, segment_bytes=2048, index_every=0) as store:
        store.prune(["t"], keep_last=1)
        store.compact()
        put(store, 30)
        store.archive(url, seal=True)
        want = [c.checkpoint_id for c in store.history("t")]
    plan, report = ds3.restore(url, tmp_path / "r.durkv")
    assert report.ok
    with durkv.open(str(tmp_path / "r.durkv")) as store:
        assert [c.checkpoint_id for c in store.history("t")] == want


def test_a_langgraph_run_resumes_on_a_restored_store_in_a_new_process(tmp_path, s3, bucket):
    """Run a graph to a crash on this 'machine', archive, restore elsewhere (a new
    process and directory), resume there: the final state is the uninterrupted run's."""
    pytest.importorskip("langgraph")
    from durkv.langgraph import DurkvSaver

    from .lg_graph import Crash, build

    n, config = 30, {"configurable": {"thread_id": "run-1"}, "recursion_limit": 100}
    want = build(n).invoke({"step": 0, "log": []}, config)
    path = str(tmp_path / "here.durkv")
    with DurkvSaver.open(path, durability="sync") as saver:
        with pytest.raises(Crash):
            build(n, fail_at=17, checkpointer=saver).invoke({"step": 0, "log": []}, config)
    url = f"s3://{bucket}/lg"
    ds3.archive(path, url, seal=True)
    dest = tmp_path / "there.durkv"
    child = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.dirname(__file__)))!r})
        from durkv.backends import s3 as ds3
        from durkv.langgraph import DurkvSaver
        from tests.s3.lg_graph import build
        ds3.restore({url!r}, {str(dest)!r})
        config = {config!r}
        with DurkvSaver.open({str(dest)!r}, durability="sync") as saver:
            graph = build({n}, checkpointer=saver)
            resumed_from = graph.get_state(config).values["step"]
            final = graph.invoke(None, config)
        print(json.dumps({{"from": resumed_from, "final": final}}))
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         env=os.environ.copy(), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout)
    assert got["from"] == 17 and got["final"] == want


def _mode(path) -> int:
    return os.stat(path).st_mode & 0o7777


def test_restore_into_an_existing_empty_directory_keeps_its_inode_mode_and_owner(
        tmp_path, archived, monkeypatch):
    path, url, _ = archived
    dest = tmp_path / "made-by-admin"
    dest.mkdir()
    os.chmod(dest, 0o2751)
    if os.geteuid() == 0:
        os.chown(dest, 65534, 65534)    # another user's directory, as root restores into
    before = os.stat(dest)
    plan, report = ds3.restore(url, dest)
    after = os.stat(dest)
    assert (after.st_ino, after.st_mode, after.st_uid, after.st_gid) == (
        before.st_ino, before.st_mode, before.st_uid, before.st_gid)
    assert report.ok and segment_files(dest) == sealed_files(path)
    assert os.listdir(tmp_path) == ["a.durkv", "made-by-admin"]     # nothing staged beside
    # `durkv restore URL .`: the shell's cwd is the restored store, not a deleted directory
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    r = CliRunner().invoke(cli, ["restore", "-q", url, "."])
    assert r.exit_code == 0, r.output
    assert os.stat(".").st_ino == os.stat(here).st_ino
    assert CliRunner().invoke(cli, ["verify", "."]).exit_code == 0


def test_a_restored_store_gets_the_modes_durkv_open_gives(tmp_path, archived):
    _, url, _ = archived
    old = os.umask(0o027)
    try:
        with durkv.open(str(tmp_path / "opened")) as s:
            put(s, 0)
        ds3.restore(url, tmp_path / "restored")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "restored") == _mode(tmp_path / "opened") == 0o750
    for name in os.listdir(tmp_path / "restored"):
        assert _mode(tmp_path / "restored" / name) == _mode(
            tmp_path / "opened" / "0000000000000000.seg") == 0o640, name


def test_a_failed_restore_into_an_empty_directory_leaves_it_empty(tmp_path, s3, bucket,
                                                                  archived):
    _, url, manifest = archived
    key = "p/" + manifest["segments"][-1]["key"]
    s3.put_object(Bucket=bucket, Key=key, Body=b"DKVSEG")
    dest = tmp_path / "empty"
    dest.mkdir()
    ino = os.stat(dest).st_ino
    with pytest.raises(CorruptionError, match=key):
        ds3.restore(url, dest)
    assert os.listdir(dest) == [] and os.stat(dest).st_ino == ino
    # parents the restore made for a new DEST go too
    with pytest.raises(CorruptionError, match=key):
        ds3.restore(url, tmp_path / "new" / "sub" / "dest")
    assert not (tmp_path / "new").exists()


def test_a_restore_into_an_empty_directory_killed_mid_move_is_detected(tmp_path, archived):
    """A child restores into an existing empty DEST and SIGKILLs itself after its first
    rename into DEST (the newest segments go first, the oldest last): the half-moved DEST
    does not open as a shorter log, and a new restore names the leftover."""
    _, url, _ = archived
    dest = tmp_path / "dest"
    dest.mkdir()
    child = textwrap.dedent(f"""
        import os, signal
        from durkv.backends import s3 as ds3
        from durkv.backends.s3 import restorer
        real = os.rename
        def rename(src, dst):
            real(src, dst)
            if os.path.dirname(dst) == {str(dest)!r}:
                os.kill(os.getpid(), signal.SIGKILL)
        restorer.os.rename = rename
        ds3.restore({url!r}, {str(dest)!r})
        print("restore finished without being killed")
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=60)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    with pytest.raises(CorruptionError, match="missing_segment"):
        durkv.open(str(dest))
    r = CliRunner().invoke(cli, ["restore", url, str(dest)])
    assert r.exit_code == 2 and "holds a restore that was cut short" in r.stderr, r.output
