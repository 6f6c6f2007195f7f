"""s3:// as a hostile operator uses it (the eighteenth session's review): two archivers of
one live store, a manifest that names a path, a fenced writer's own reads, a clean exit
without close(), --to-lsn past the end, a damaged epoch object. Each test held a defect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import durkv
from durkv.backends import s3 as ds3
from durkv.errors import CorruptionError, FencedError, NotFoundError

from .storetools import make_store, put

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _frames(url_or_path):
    with durkv.open(url_or_path, read_only=True) as s:
        b = s._b
        return [b.read(lsn) for lsn in range(b.start_lsn, b.next_lsn)]


def test_two_archives_of_a_live_store_take_turns_and_the_archive_stays_one_log(
        tmp_path, s3_env, bucket):
    """Both archivers appended the live frames to the shared local mirror, each from the
    length it had read: frames repeated at later LSNs and a restore read other values."""
    from durkv import log as seglog
    live, arch = f"s3://{bucket}/live", f"s3://{bucket}/arch"
    with durkv.open(live) as store:
        for i in range(30):
            put(store, i)
    ds3.archive(live, arch)
    with durkv.open(live) as store:
        for i in range(30, 60):
            put(store, i)
    original = seglog.SegmentLog.__dict__["open"]
    opened = seglog.SegmentLog.open

    def slow_open(*a, **kw):    # what a scheduling delay after the mirror's open does
        log = opened(*a, **kw)
        time.sleep(0.3)
        return log

    seglog.SegmentLog.open = staticmethod(slow_open)
    errors: list = []

    def one():
        try:
            ds3.archive(live, arch)
        except Exception as e:      # noqa: BLE001 - reported below
            errors.append(e)

    both = [threading.Thread(target=one) for _ in range(2)]
    for t in both:
        t.start()
    try:
        for t in both:
            t.join(60)
    finally:
        seglog.SegmentLog.open = original
    assert errors == []
    ds3.restore(arch, tmp_path / "r.durkv")
    assert _frames(str(tmp_path / "r.durkv")) == _frames(live)
    ds3.archive(live, arch)         # and the archive goes on


@pytest.fixture
def archived(tmp_path, s3, bucket):
    path = make_store(tmp_path / "a.durkv", 20)
    url = f"s3://{bucket}/p"
    ds3.archive(path, url)
    key = "p/manifests/00000000000000000000.json"
    return url, json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def _new_manifest(s3, bucket, manifest):
    manifest["manifest_no"], manifest["prev_manifest_no"] = 1, 0
    s3.put_object(Bucket=bucket, Key="p/manifests/00000000000000000001.json",
                  Body=json.dumps(manifest).encode())


@pytest.mark.parametrize("field, value, why", [
    ("file", "../../ESCAPED.seg", "not a segment's name"),
    ("file", "/tmp/x.seg", "not a segment's name"),
    ("base_lsn", "0", "is str '0', not int"),
    ("key", 7, "is int 7, not str"),
])
def test_a_manifest_segment_field_of_the_wrong_form_is_corruption_and_writes_nothing(
        tmp_path, s3, bucket, archived, field, value, why):
    """A manifest's ``file`` was joined to the restore's temporary directory as it was:
    ``../../ESCAPED.seg`` created a file outside it, left behind by the failed restore; a
    string LSN escaped as a TypeError traceback."""
    url, manifest = archived
    manifest["segments"][0][field] = value
    _new_manifest(s3, bucket, manifest)
    dest = tmp_path / "deep" / "sub" / "r.durkv"
    dest.parent.mkdir(parents=True)
    with pytest.raises(CorruptionError, match=why):
        ds3.restore(url, dest)
    assert not dest.exists() and os.listdir(dest.parent) == []
    assert not (tmp_path / "ESCAPED.seg").exists()
    assert not (tmp_path / "deep" / "ESCAPED.seg").exists()
    out = subprocess.run([sys.executable, "-m", "durkv.cli", "restore", url,
                          str(tmp_path / "r2")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3 and "Traceback" not in out.stderr and why in out.stderr


def test_a_fenced_writer_serves_nothing_after_the_fence(s3_env, bucket):
    """Its refused commit stayed in its own index: get() returned a checkpoint no other
    handle would ever see."""
    url = f"s3://{bucket}/fence"
    zombie = durkv.open(url, durability="sync")
    put(zombie, 1)
    with durkv.open(url, takeover=True) as heir:
        with pytest.raises(FencedError):
            put(zombie, 2)
        for call in (lambda: zombie.get("t"), lambda: list(zombie.history("t")),
                     lambda: put(zombie, 3)):
            with pytest.raises(FencedError):
                call()
        assert heir.get("t").checkpoint_id == "000001"
    zombie.close()


@pytest.mark.parametrize("policy", ["exit", "async"])
def test_a_clean_exit_without_close_puts_every_commit_and_closes_the_writer(
        s3_env, bucket, policy):
    url = f"s3://{bucket}/noclose-{policy}"
    child = textwrap.dedent(f"""
        import sys, durkv
        sys.path.insert(0, {ROOT!r})
        from tests.s3.storetools import put
        store = durkv.open({url!r}, durability={policy!r})
        for i in range(5):
            put(store, i)
    """)                                # no close(): the interpreter exits
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=120, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-2000:]
    with durkv.open(url) as store:      # closed at exit: no takeover needed
        assert [c.checkpoint_id for c in store.history("t")] == [
            f"{i:06d}" for i in range(4, -1, -1)]


def test_a_live_restore_to_an_lsn_past_the_end_is_refused(tmp_path, s3_env, bucket):
    url = f"s3://{bucket}/live"
    with durkv.open(url) as store:
        for i in range(5):
            put(store, i)
    with durkv.open(url, read_only=True) as reader:
        end = reader._b.next_lsn
    with pytest.raises(NotFoundError, match=f"ends at lsn {end - 1}; --to-lsn {end} is past"):
        ds3.restore(url, tmp_path / "r.durkv", to_lsn=end)
    assert not (tmp_path / "r.durkv").exists()
    ds3.restore(url, tmp_path / "r.durkv", to_lsn=end - 1)     # the last frame: fine


@pytest.mark.parametrize("body", [b"[]", b'{"state": "open"}', b'{"epoch_no": "1"}'])
def test_a_damaged_epoch_object_is_refused_and_changes_nothing(s3, s3_env, bucket, body):
    """[] was taken for "no writer ever": the open fenced at a lower epoch and every
    reader of the store failed from then on; a record without its keys was a KeyError."""
    url = f"s3://{bucket}/ep"
    for start in (0, 10):
        with durkv.open(url) as store:
            for i in range(start, start + 3):
                put(store, i)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(
        Bucket=bucket, Prefix="ep/live/epochs/")["Contents"])
    s3.put_object(Bucket=bucket, Key=keys[-1], Body=body)
    before = _frames(url)
    with pytest.raises(CorruptionError, match="not a writer epoch record"):
        durkv.open(url, takeover=True)
    assert _frames(url) == before
