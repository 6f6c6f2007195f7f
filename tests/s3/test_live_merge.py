"""The live ``s3://`` store's local cache, merged segment objects, compaction and lease
(FORMAT.md section 11; GUARANTEES.md section 15)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import durkv
from durkv.backends.s3.live import S3Backend
from durkv.backends.s3.livefmt import FENCE_BYTES, LiveManifest, num_of
from durkv.errors import FencedError, StoreLockedError

from .storetools import put

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ids(store, thread="t"):
    return [c.checkpoint_id for c in store.history(thread)]


def live_objects(s3, bucket, prefix):
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                              Prefix=f"{prefix}/live/"):
        for o in page.get("Contents", ()):
            out[o["Key"][len(prefix) + 1:]] = o["Size"]
    return out


def current_manifest(s3, bucket, prefix) -> LiveManifest:
    objs = live_objects(s3, bucket, prefix)
    rel = max(k for k in objs if k.startswith("live/manifests/"))
    body = s3.get_object(Bucket=bucket, Key=f"{prefix}/{rel}")["Body"].read()
    return LiveManifest.from_json(body, rel)


def assert_tidy(s3, bucket, prefix):
    """Nothing the current manifest does not need is left: no merged batch (fences
    stay), no unreferenced segment object."""
    m = current_manifest(s3, bucket, prefix)
    objs = live_objects(s3, bucket, prefix)
    listed = {s.key for s in m.segments}
    assert {k for k in objs if k.startswith("live/seg/")} == listed
    for k, size in objs.items():
        n = num_of("live/wal/", k, ".batch")
        if n is not None and n < m.next_batch:
            assert size == FENCE_BYTES, k


SLOW = os.environ.get("DURKV_SLOW_TESTS") == "1"


def test_object_count_stays_bounded_over_many_flushes(s3_env, s3, bucket):
    url = f"s3://{bucket}/many?merge_batches=8"
    n = 2000 if SLOW else 160
    counts = []
    with durkv.open(url) as store:
        for i in range(n):
            put(store, i)
            if i % 20 == 19:
                counts.append(len(live_objects(s3, bucket, "many")))
    # n flushes (one batch object each) never left more than a few dozen objects
    assert max(counts) <= 40, counts
    with durkv.open(url, read_only=True) as reader:
        assert ids(reader) == [f"{i:06d}" for i in range(n - 1, -1, -1)]
        assert reader.get("t").values["n"] == n - 1
    m = current_manifest(s3, bucket, "many")
    assert m.next_batch > n - 30 and len(m.segments) <= 12


def test_reads_come_from_the_local_cache_and_memory_stays_bounded(s3_env, s3, bucket,
                                                                  tmp_path):
    url = f"s3://{bucket}/cache?merge_batches=4"
    backend = S3Backend(url)
    payloads = [os.urandom(50) + bytes([i % 256]) * 2000 for i in range(60)]
    for p in payloads:
        backend.append(p)
    backend.merger.merge(force=True)
    backend.close()
    assert current_manifest(s3, bucket, "cache").segments

    # the same machine: every object is in the cache, no GET reads a frame
    reader = S3Backend(url, read_only=True)
    gets: list[str] = []
    real_get = reader.get
    reader.get = lambda rel: gets.append(rel) or real_get(rel)
    assert [p for _, p in reader.scan()] == payloads
    assert gets == []

    # another machine (a fresh cache): frames are fetched, kept on disk, memory bounded
    other = S3Backend(url, read_only=True, cache_dir=str(tmp_path / "other"),
                      memory_bytes=16_000)
    assert [p for _, p in other.scan()] == payloads
    assert other.cache.held_bytes() <= 16_000 + max(s.bytes for s in other.manifest.segments)
    assert len(os.listdir(tmp_path / "other")) == len(other.manifest.segments) + len(
        [p for p in other._pieces if p.batch_no >= 0])
    # a damaged cache file is fetched again, not believed
    for name in os.listdir(tmp_path / "other"):
        with open(tmp_path / "other" / name, "r+b") as f:
            f.seek(40)
            f.write(b"\xff")
    third = S3Backend(url, read_only=True, cache_dir=str(tmp_path / "other"))
    assert [p for _, p in third.scan()] == payloads


_CHILD = textwrap.dedent("""
    import os, signal, sys, threading
    sys.path.insert(0, {root!r})
    import durkv
    from durkv.backends.s3.live import S3Backend
    from tests.s3.storetools import put

    point = sys.argv[1]
    real_put, real_delete = S3Backend.put, S3Backend.delete

    def in_merger():
        return threading.current_thread().name == "durkv-s3-merger"

    def put_(self, rel, body, meta):
        if point == "manifest" and in_merger() and rel.startswith("live/manifests/"):
            os.kill(os.getpid(), signal.SIGKILL)     # its segment object is in S3 already
        return real_put(self, rel, body, meta)

    def delete_(self, rels):
        if point == "delete" and in_merger():
            os.kill(os.getpid(), signal.SIGKILL)     # the manifest is current, nothing deleted
        return real_delete(self, rels)

    S3Backend.put, S3Backend.delete = put_, delete_
    store = durkv.open({url!r})
    for i in range(10_000):
        put(store, i)
        print(f"acked {{i}}", flush=True)
""")


@pytest.mark.parametrize("point", ["manifest", "delete"])
def test_kill_9_mid_merge_leaves_a_readable_store_and_the_next_writer_finishes(
        s3_env, s3, bucket, point):
    url = f"s3://{bucket}/crash?merge_batches=4"
    proc = subprocess.run([sys.executable, "-c", _CHILD.format(root=ROOT, url=url), point],
                          capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    acked = [int(x.split()[1]) for x in proc.stdout.split("\n")[:-1] if x.startswith("acked")]
    assert len(acked) >= 3      # the merge starts after the 3rd batch: its kill may be next
    objs = live_objects(s3, bucket, "crash")
    if point == "manifest":     # the merge's segment object is there, no manifest lists it
        assert any(k.startswith("live/seg/") for k in objs)
        assert not current_manifest(s3, bucket, "crash").segments
    else:                       # the merged batches are still there
        assert current_manifest(s3, bucket, "crash").segments
    with durkv.open(url, read_only=True) as reader:
        assert {f"{i:06d}" for i in acked} <= set(ids(reader))
    with pytest.raises(StoreLockedError):
        durkv.open(url)
    with durkv.open(url, takeover=True) as heir:
        put(heir, 10_000)
    last = S3Backend(url)
    last.merger.merge(force=True)       # finishes what the killed merge left
    last.close()
    assert_tidy(s3, bucket, "crash")
    with durkv.open(url, read_only=True) as reader:
        assert {f"{i:06d}" for i in acked} | {"010000"} <= set(ids(reader))


def test_compaction_reads_back_exactly_and_drops_objects(s3_env, s3, bucket, tmp_path):
    url = f"s3://{bucket}/compact?merge_batches=4"
    threads = ["a", "b", "c"]
    with durkv.open(url) as store:
        for i in range(60):
            put(store, i, thread=threads[i % 3])
        store.prune(threads, keep_last=2)
        want = {t: (ids(store, t), store.get(t).values) for t in threads}
        before = sum(live_objects(s3, bucket, "compact").values())
        report = store.compact()
        assert report["bytes_after"] < report["bytes_before"]
        assert {t: (ids(store, t), store.get(t).values) for t in threads} == want
        put(store, 100, thread="a")
        want["a"] = (ids(store, "a"), store.get("a").values)
    m = current_manifest(s3, bucket, "compact")
    assert m.start_lsn > 0 and m.segments[0].first_lsn == m.start_lsn
    assert sum(live_objects(s3, bucket, "compact").values()) < before
    assert_tidy(s3, bucket, "compact")
    # another machine reads exactly the same, and the next writer goes on from there
    os.environ["DURKV_S3_CACHE_DIR"] = str(tmp_path / "fresh")
    with durkv.open(url, read_only=True) as reader:
        assert {t: (ids(reader, t), reader.get(t).values) for t in threads} == want
    with durkv.open(url) as store:
        put(store, 101, thread="b")
        assert ids(store, "b")[0] == "000101"


def test_a_zombie_is_fenced_in_its_writes_and_its_merges(s3_env, s3, bucket):
    url = f"s3://{bucket}/zombie?merge_batches=1000"
    zombie = S3Backend(url)
    for i in range(5):
        zombie.append(b"z%d" % i)
        if i == 2:
            assert zombie.merger.merge(force=True)  # its manifest: it trusts it from now on
    heir = S3Backend(url, takeover=True)
    heir.append(b"heir")
    with pytest.raises(FencedError):
        zombie.merger.merge(force=True)     # the heir's manifest has a higher epoch
    with pytest.raises(FencedError):
        zombie.append(b"lost")
    heir.merger.merge(force=True)
    heir.close()
    zombie.close()
    reader = S3Backend(url, read_only=True)
    assert [p for _, p in reader.scan()] == [b"z0", b"z1", b"z2", b"z3", b"z4", b"heir"]
    assert_tidy(s3, bucket, "zombie")


def test_a_lease_lets_the_next_writer_in_once_the_holder_is_dead(s3_env, bucket):
    url = f"s3://{bucket}/lease?lease_ms=1000"
    child = textwrap.dedent(f"""
        import sys, time, durkv
        store = durkv.open({url!r})
        print("open", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE,
                            env=os.environ.copy())
    try:
        assert proc.stdout.readline().strip() == b"open"
        time.sleep(1.5)         # longer than the lease: renewals keep it held
        with pytest.raises(StoreLockedError, match="is held by"):
            durkv.open(url)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed = time.monotonic()
    while True:
        try:
            store = durkv.open(url)
            break
        except StoreLockedError:
            assert time.monotonic() - killed < 10
            time.sleep(0.25)
    assert time.monotonic() - killed >= 0.9      # not before the lease ran out
    store.close()


def test_restore_of_a_live_store_into_a_directory(s3_env, s3, bucket, tmp_path):
    from click.testing import CliRunner

    from durkv.backends import s3 as ds3
    from durkv.cli import cli

    url = f"s3://{bucket}/tolocal?merge_batches=4"
    with durkv.open(url) as store:
        for i in range(20):
            put(store, i)
        want = (ids(store), store.get("t").values)
    plan, report = ds3.restore(url, tmp_path / "here")
    assert report.ok and plan.next_lsn == report.next_lsn
    with durkv.open(str(tmp_path / "here")) as local:       # resumes: same LSNs, writable
        assert (ids(local), local.get("t").values) == want
        put(local, 20)
        assert ids(local)[0] == "000020"
    plan, _ = ds3.restore(url, tmp_path / "part", to_lsn=9)
    with durkv.open(str(tmp_path / "part"), read_only=True) as part:
        assert ids(part) == [f"{i:06d}" for i in range(9, -1, -1)]
    res = CliRunner().invoke(cli, ["restore", url.partition("?")[0], str(tmp_path / "cli")])
    assert res.exit_code == 0 and "live store" in res.output, res.output
    with durkv.open(url) as store:
        store.prune(["t"], keep_last=1)
        store.compact()
    with pytest.raises(durkv.ConfigError, match="compacted"):
        ds3.restore(url, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_an_unwritable_cache_directory_is_one_clear_error(s3_env, bucket, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(durkv.ConfigError, match="DURKV_S3_CACHE_DIR"):
        S3Backend(f"s3://{bucket}/c", cache_dir=str(blocker / "sub"))


def test_archive_of_a_live_store_continues_one_log_and_restores(s3_env, s3, bucket,
                                                                tmp_path, monkeypatch):
    from click.testing import CliRunner

    from durkv.backends import s3 as ds3
    from durkv.cli import cli

    live, arch = f"s3://{bucket}/live-a", f"s3://{bucket}/arch"
    with durkv.open(live) as store:
        for i in range(8):
            put(store, i)
        first = store.archive(arch)             # the writer's own handle
        assert first.manifest_written and first.uploaded
        again = store.archive(arch)
        assert not again.uploaded and not again.manifest_written     # nothing new
        for i in range(8, 12):
            put(store, i)
    # another machine (no mirror in its cache) continues the same archive from the CLI
    monkeypatch.setenv("DURKV_S3_CACHE_DIR", str(tmp_path / "machine-2"))
    res = CliRunner().invoke(cli, ["archive", live, arch])
    assert res.exit_code == 0, res.output
    plan, report = ds3.restore(arch, tmp_path / "restored")
    with durkv.open(str(tmp_path / "restored"), read_only=True) as local:
        assert ids(local) == [f"{i:06d}" for i in range(11, -1, -1)]
    # another live store into the same archive prefix is refused, nothing uploaded
    other = f"s3://{bucket}/live-b"
    with durkv.open(other) as store:
        for i in range(14):
            put(store, 100 + i)
    def archived():
        return {o["Key"]: o["ETag"] for o in s3.list_objects_v2(
            Bucket=bucket, Prefix="arch/").get("Contents", ())}

    before = archived()
    assert any("/segments/" in k for k in before)
    with pytest.raises(durkv.errors.ArchiveConflictError, match="another log"):
        ds3.archive(other, arch)
    assert archived() == before


def test_a_prefix_reused_by_a_new_store_is_not_read_from_the_old_ones_cache(
        s3_env, s3, bucket, tmp_path):
    """A segment object's CRC was taken over bytes ending with their own CRC: the same
    constant for every object, which the cache used as its tag. A store wiped and written
    again at the same prefix was read, through a cache that saw the old one, as the old
    store's frames."""
    url = f"s3://{bucket}/reused?merge_batches=4"
    cache = str(tmp_path / "cache")

    def write(tag):
        backend = S3Backend(url, cache_dir=str(tmp_path / f"w-{tag}"))
        for i in range(12):
            backend.append(f"{tag} {i}".encode())
        backend.merger.merge(force=True)
        backend.close()
        crcs = {s.crc32c for s in current_manifest(s3, bucket, "reused").segments}
        assert len(crcs) == len(current_manifest(s3, bucket, "reused").segments)

    write("old")
    old = S3Backend(url, read_only=True, cache_dir=cache)
    assert [p for _, p in old.scan()][:2] == [b"old 0", b"old 1"]
    old.close()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="reused/"):
        for o in page.get("Contents", ()):
            s3.delete_object(Bucket=bucket, Key=o["Key"])
    write("new")
    again = S3Backend(url, read_only=True, cache_dir=cache)
    assert [p for _, p in again.scan()] == [f"new {i}".encode() for i in range(12)]
    again.close()
