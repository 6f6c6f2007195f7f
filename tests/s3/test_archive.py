"""durkv archive against a real HTTP S3 (moto's server on 127.0.0.1)."""

from __future__ import annotations

import base64
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap

import pytest

import durkv
from durkv.backends import s3 as ds3
from durkv.errors import ArchiveConflictError, ConfigError, CorruptionError
from durkv.log import crc32c

from .storetools import keys, make_store, put, sealed_files, segment_files

HERE = os.path.dirname(os.path.abspath(__file__))


def test_segment_objects_are_the_sealed_files_byte_for_byte(tmp_path, s3, bucket):
    path = make_store(tmp_path / "a.durkv", 40)
    res = ds3.archive(path, f"s3://{bucket}/runs/a")
    local = sealed_files(path)
    assert res.manifest_written and res.manifest_no == 0
    assert len(res.uploaded) == len(local) > 5
    assert res.puts == len(local) + 1          # one PUT per segment plus the manifest
    manifest = json.loads(s3.get_object(Bucket=bucket, Key="runs/a/manifests/"
                                        "00000000000000000000.json")["Body"].read())
    assert [e["file"] for e in manifest["segments"]] == list(local)
    assert manifest["writer_epoch"] == 0 and manifest["next_lsn"] == 40
    for e in manifest["segments"]:
        obj = s3.get_object(Bucket=bucket, Key="runs/a/" + e["key"])
        data = local[e["file"]]
        assert obj["Body"].read() == data
        assert obj["Metadata"]["durkv-crc32c"] == str(crc32c(data))
        head = s3.head_object(Bucket=bucket, Key="runs/a/" + e["key"], ChecksumMode="ENABLED")
        assert head["ChecksumCRC32C"] == base64.b64encode(struct.pack(">I", crc32c(data))).decode()


def test_archive_twice_adds_no_object(tmp_path, s3, bucket):
    path = make_store(tmp_path / "a.durkv", 20)
    url = f"s3://{bucket}/p"
    ds3.archive(path, url)
    before = {k: s3.head_object(Bucket=bucket, Key=k)["ETag"] for k in keys(s3, bucket)}
    again = ds3.archive(path, url)
    assert again.puts == 0 and not again.manifest_written and again.manifest_no == 0
    assert {k: s3.head_object(Bucket=bucket, Key=k)["ETag"] for k in keys(s3, bucket)} == before


def test_new_commits_add_their_segments_and_one_manifest(tmp_path, s3, bucket):
    path = make_store(tmp_path / "a.durkv", 20)
    url = f"s3://{bucket}/p"
    first = ds3.archive(path, url)
    with durkv.open(path, segment_bytes=2048, index_every=0) as store:
        for i in range(20, 30):
            put(store, i)
        res = store.archive(url, seal=True)
    assert res.manifest_no == 1 and res.next_lsn == 30
    assert set(res.uploaded).isdisjoint(first.uploaded)
    assert res.puts == len(res.uploaded) + 1


def test_different_content_at_a_key_is_a_conflict_and_the_original_stays(tmp_path, s3, bucket):
    url = f"s3://{bucket}/p"
    ds3.archive(make_store(tmp_path / "a.durkv", 10), url)
    objs = {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys(s3, bucket)}
    other = make_store(tmp_path / "b.durkv", 10)       # another log (another uuid)
    with pytest.raises(ArchiveConflictError, match="archive of log"):
        ds3.archive(other, url)
    # No manifest to tell: the segment key itself is checked (create-only PUT -> 412 -> HEAD).
    s3.put_object(Bucket=bucket, Key="q/segments/00000000000000000000.seg", Body=b"junk")
    with pytest.raises(ArchiveConflictError, match="already holds other content"):
        ds3.archive(other, f"s3://{bucket}/q")
    assert s3.get_object(Bucket=bucket, Key="q/segments/00000000000000000000.seg")[
        "Body"].read() == b"junk"
    assert not [k for k in keys(s3, bucket) if k.startswith("q/manifests/")]
    assert {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read()
            for k in keys(s3, bucket) if k.startswith("p/")} == objs


def test_listing_pages_through_many_manifests(tmp_path, s3, bucket):
    """Each archive of a new seal writes one manifest; listing them is paged with a
    MaxKeys of 3, and the highest number is still found."""
    path = tmp_path / "a.durkv"
    url = f"s3://{bucket}/p"
    with durkv.open(str(path), segment_bytes=1 << 20, index_every=0) as store:
        for i in range(7):
            put(store, i)
            res = store.archive(url, seal=True, page_size=3)
            assert res.manifest_no == i and res.puts == 2
    assert ds3.latest_manifest(ds3.S3Location.parse(url), page_size=3).next_lsn == 7
    plan, report = ds3.restore(url, tmp_path / "r.durkv", page_size=2)
    assert plan.manifest_no == 6 and report.next_lsn == 7


def test_a_crash_between_segment_puts_and_the_manifest_is_repaired(tmp_path, s3_env, s3, bucket):
    """A child archives and is SIGKILLed by itself the moment it starts the manifest PUT;
    the segments are there, no manifest is; the next archive finishes the job."""
    path = make_store(tmp_path / "a.durkv", 30)
    url = f"s3://{bucket}/p"
    child = textwrap.dedent(f"""
        import os, signal, sys
        from durkv.backends import s3 as ds3
        loc = ds3.S3Location.parse({url!r})
        def die(request, **kw):
            if "/manifests/" in request.url:
                os.kill(os.getpid(), signal.SIGKILL)
        loc.s3().meta.events.register("before-send.s3.PutObject", die)
        ds3.archive({path!r}, {url!r}, client=loc.s3())
        print("archive finished without being killed")
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    n_sealed = len(sealed_files(path))
    assert len([k for k in keys(s3, bucket) if "/segments/" in k]) == n_sealed
    assert not [k for k in keys(s3, bucket) if "/manifests/" in k]
    res = ds3.archive(path, url)
    assert res.manifest_written and res.uploaded == [] and len(res.already) == n_sealed
    plan, report = ds3.restore(url, tmp_path / "r.durkv")
    assert report.ok and report.next_lsn == 30


def test_store_archive_seal_includes_every_commit(tmp_path, s3, bucket):
    with durkv.open(str(tmp_path / "a.durkv"), index_every=0) as store:
        for i in range(5):
            put(store, i)
        res = store.archive(f"s3://{bucket}/p", seal=True)
    assert res.next_lsn == 5
    with durkv.open("memory://") as mem, pytest.raises(ConfigError, match="only a local"):
        mem.archive(f"s3://{bucket}/p")


def test_zstd_objects_restore_to_the_same_bytes(tmp_path, s3, bucket):
    path = make_store(tmp_path / "a.durkv", 20)
    url = f"s3://{bucket}/z"
    res = ds3.archive(path, url, encoding="zstd")
    head = s3.head_object(Bucket=bucket, Key=f"z/segments/{res.uploaded[0]:020d}.seg")
    assert head["Metadata"]["durkv-encoding"] == "zstd"
    assert ds3.archive(path, url).puts == 0      # same content, whatever the encoding
    ds3.restore(url, tmp_path / "r.durkv")
    assert segment_files(tmp_path / "r.durkv") == sealed_files(path)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DURKV_SLOW_TESTS") != "1", reason="DURKV_SLOW_TESTS=1")
def test_more_than_a_thousand_manifests_page_with_the_default_page_size(tmp_path, s3, bucket):
    """1,001 manifests under one prefix: ListObjectsV2 returns at most 1,000 keys per page,
    so finding the highest number (archive) and choosing one (restore) needs the second
    page. (The bounded form with a page size of 3 is test_listing_pages_through_many_manifests.)"""
    path = make_store(tmp_path / "a.durkv", 8)
    url = f"s3://{bucket}/p"
    ds3.archive(path, url)
    doc = json.loads(s3.get_object(Bucket=bucket, Key="p/manifests/00000000000000000000.json")[
        "Body"].read())
    for n in range(1, 1001):
        doc["manifest_no"], doc["prev_manifest_no"] = n, n - 1
        s3.put_object(Bucket=bucket, Key=f"p/manifests/{n:020d}.json",
                      Body=json.dumps(doc).encode(), IfNoneMatch="*")
    assert len(keys(s3, bucket)) > 1000
    assert ds3.latest_manifest(ds3.S3Location.parse(url)).manifest_no == 1000
    with durkv.open(path, index_every=0) as store:
        put(store, 8)
        assert store.archive(url, seal=True).manifest_no == 1001
    plan, report = ds3.restore(url, tmp_path / "r.durkv")
    assert plan.manifest_no == 1001 and report.next_lsn == 9


def test_two_concurrent_archivers_of_one_store_both_succeed(tmp_path, s3_env, s3, bucket):
    import threading

    path = make_store(tmp_path / "a.durkv", 30)
    url = f"s3://{bucket}/p"
    results, errors = [], []

    def run():
        try:
            results.append(ds3.archive(path, url))
        except Exception as exc:       # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 2
    n_sealed = len(sealed_files(path))
    a, b = results
    # each segment was PUT by exactly one of them; the other found it there (412, same)
    assert sorted(a.uploaded + b.uploaded) == list(range(n_sealed))
    assert sorted(a.uploaded + a.already) == sorted(b.uploaded + b.already) == list(range(n_sealed))
    assert [k for k in keys(s3, bucket) if "/manifests/" in k] == [
        "p/manifests/00000000000000000000.json"]
    assert {r.manifest_no for r in results} == {0}


def test_a_damaged_local_store_is_not_archived(tmp_path, s3, bucket):
    path = make_store(tmp_path / "a.durkv", 12)
    name, data = list(sealed_files(path).items())[2]
    flipped = bytearray(data)
    flipped[100] ^= 0x04
    (tmp_path / "a.durkv" / name).write_bytes(bytes(flipped))
    with pytest.raises(CorruptionError, match="nothing archived") as err:
        ds3.archive(path, f"s3://{bucket}/p")
    assert err.value.segment == name
    assert keys(s3, bucket) == []


def test_a_later_archive_in_one_process_needs_no_list_and_survives_a_stale_view(
        tmp_path, s3_env, s3, bucket):
    """This process remembers the manifest it wrote (one HEAD instead of LIST + GET next
    time). Another process archiving meanwhile makes that stale: the create-only
    manifest PUT then gets 412 and the archive rebases. A wiped prefix is noticed too."""
    path = make_store(tmp_path / "a.durkv", 10)
    url = f"s3://{bucket}/p"
    loc = ds3.S3Location.parse(url)
    calls: list[str] = []
    loc.s3().meta.events.register("before-call.s3", lambda event_name, **kw: calls.append(
        event_name.split(".")[-1]))
    ds3.archive(path, url, client=loc.s3())
    with durkv.open(path, segment_bytes=2048, index_every=0) as store:
        put(store, 10)
        calls.clear()
        store.archive(url, seal=True, client=loc.s3())
        assert "ListObjectsV2" not in calls and calls.count("PutObject") == 2
        put(store, 11)
    child = f"from durkv.backends import s3; s3.archive({path!r}, {url!r}, seal=True)"
    subprocess.run([sys.executable, "-c", child], check=True, env=os.environ.copy(),
                   timeout=60)                               # manifest 2, unknown to us
    with durkv.open(path, segment_bytes=2048, index_every=0) as store:
        put(store, 12)
        res = store.archive(url, seal=True, client=loc.s3())
    assert res.manifest_no == 3 and res.next_lsn == 13
    for k in keys(s3, bucket):
        s3.delete_object(Bucket=bucket, Key=k)               # an operator wiped the prefix
    res = ds3.archive(path, url, client=loc.s3())
    assert res.manifest_no == 0 and len(res.uploaded) == len(sealed_files(path))
    plan, report = ds3.restore(url, tmp_path / "r.durkv")
    assert report.ok and report.next_lsn == 13


def test_commits_go_on_while_store_archive_uploads(tmp_path, s3_env, bucket):
    """Store.archive holds the store's lock only to seal: a put made while segments are
    uploading (each PUT slowed to 0.5 s here) returns without waiting for the upload."""
    import threading
    import time

    path = make_store(tmp_path / "a.durkv", 12)
    loc = ds3.S3Location.parse(f"s3://{bucket}/p")
    uploading = threading.Event()

    def slow(request, **kw):
        if "/segments/" in request.url:
            uploading.set()
            time.sleep(0.5)

    client = loc.s3()
    client.meta.events.register("before-send.s3.PutObject", slow)
    try:
        with durkv.open(path, index_every=0) as store:
            t = threading.Thread(target=store.archive, args=(loc.url,),
                                 kwargs={"seal": True, "client": client})
            t.start()
            assert uploading.wait(10)
            t0 = time.monotonic()
            put(store, 12)
            took = time.monotonic() - t0
            upload_busy = t.is_alive()
            t.join()
    finally:
        client.meta.events.unregister("before-send.s3.PutObject", slow)
    assert upload_busy and took < 0.5
