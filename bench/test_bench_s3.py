"""Archive and restore on S3 vs plain boto3, side by side against one moto server.

| benchmark       | measures                                                    | target     |
|-----------------|-------------------------------------------------------------|------------|
| s3-archive      | MB/s of ``durkv archive`` (create-only PUT with CRC-32C per  | >= 0.8x    |
|                 | segment, 4 in flight, one LIST + GET of the manifest, one   |            |
|                 | manifest PUT, the local C verify first) vs a plain loop of  |            |
|                 | ``put_object`` of the same files' bytes (a plain loop with  |            |
|                 | 4 in flight is reported too)                                |            |
| s3-restore      | MB/s of ``durkv restore`` (GETs 4 in flight, size/CRC-32C   | >= 0.8x    |
|                 | checks, write + fsync, C verify, rename) vs a plain loop of |            |
|                 | ``get_object`` of the same keys into memory (and with 4 in  |            |
|                 | flight)                                                     |            |
| s3-requests     | PUTs per archived segment (1, plus one manifest per call),  | == 1 + 1/n |
|                 | and no LIST once the manifest number is known               |            |

moto's server (Flask, in this process, on 127.0.0.1) is the S3 here: absolute MB/s
measure moto on this machine, not S3; the ratios are what durkv adds.
Env: DURKV_BENCH_QUICK=1 (8 MiB instead of 32 MiB), DURKV_BENCH_DIR.
"""

from __future__ import annotations

import itertools
import logging
import operator
import os
import shutil
import statistics
from typing import Annotated, TypedDict

import pytest
from benchlib import QUICK, median_time, record

import durkv
from durkv.log import SegmentLog

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")
from durkv.backends import s3 as ds3  # noqa: E402
from durkv.backends.s3.client import PARALLEL, in_order  # noqa: E402

SEGMENT = 1 << 20
TOTAL = (8 if QUICK else 32) << 20
ROUNDS = 3 if QUICK else 5
_prefixes = itertools.count()


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
                                            "DURKV_S3_CACHE_DIR")}
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=f"http://{host}:{port}",
                      DURKV_S3_CACHE_DIR=str(tmp_path_factory.mktemp("s3cache")))
    client = boto3.client("s3")
    client.create_bucket(Bucket="bench")
    yield client
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store of TOTAL bytes of commits in sealed segments of about SEGMENT bytes."""
    path = str(tmp_path_factory.mktemp("s3bench") / "a.durkv")
    blob = os.urandom(64 << 10)
    with durkv.open(path, durability="exit", segment_bytes=SEGMENT, index_every=0,
                    compress_min_bytes=1 << 30) as s:
        for i in range(TOTAL // len(blob)):
            s.put("t", "", f"{i:08d}", checkpoint={}, metadata={}, values={"blob": blob[i:] +
                  blob[:i]}, versions={"blob": i})
    with SegmentLog.open(path) as log:
        log.seal()
    files = sorted(n for n in os.listdir(path) if n.endswith(".seg"))[:-1]
    return path, files, sum(os.path.getsize(os.path.join(path, n)) for n in files)


def side_by_side(baseline, durkv_fn) -> tuple[float, float]:
    """Median seconds of each, the two alternating round by round (the machine is shared:
    a slow moment then costs both sides alike), after one warm-up call of each."""
    baseline()
    durkv_fn()
    base, mine = [], []
    for _ in range(ROUNDS):
        base.append(median_time(baseline, 1))
        mine.append(median_time(durkv_fn, 1))
    return statistics.median(base), statistics.median(mine)


def _counter(client):
    counts = {"PutObject": 0, "ListObjectsV2": 0, "GetObject": 0, "HeadObject": 0}

    def count(event_name, **kw):
        op = event_name.split(".")[-1]
        if op in counts:
            counts[op] += 1
    client.meta.events.register("before-call.s3", count)
    return counts


@pytest.mark.benchmark(group="s3")
def test_archive_and_restore_vs_plain_boto3(benchmark, moto, store, bench_root):
    path, files, nbytes = store
    blobs = [open(os.path.join(path, n), "rb").read() for n in files]
    mb = nbytes / 1e6

    def raw_put():
        p = next(_prefixes)
        for i, b in enumerate(blobs):
            moto.put_object(Bucket="bench", Key=f"raw{p}/{i:020d}", Body=b)

    def archive():
        ds3.archive(path, f"s3://bench/dk{next(_prefixes)}")

    def raw_put_parallel():     # the same PUTs, as many in flight as durkv uses
        p = next(_prefixes)
        list(in_order(lambda ib: moto.put_object(Bucket="bench", Key=f"rawp{p}/{ib[0]:020d}",
                                                 Body=ib[1]), enumerate(blobs)))

    t_raw_put, t_archive = benchmark.pedantic(lambda: side_by_side(raw_put, archive),
                                              rounds=1, iterations=1)
    t_raw_put_par = median_time(raw_put_parallel, ROUNDS)

    url = f"s3://bench/dk{next(_prefixes)}"
    loc = ds3.S3Location.parse(url)
    counts = _counter(loc.s3())
    res = ds3.archive(path, url, client=loc.s3())
    first = dict(counts)
    assert first["PutObject"] == len(files) + 1 and first["ListObjectsV2"] == 1
    keys = [loc.key(f"segments/{n:020d}.seg") for n in res.uploaded]
    restores = itertools.count()

    def raw_get():
        for k in keys:
            moto.get_object(Bucket="bench", Key=k)["Body"].read()

    def restore():
        dest = bench_root / f"restored-{next(restores)}"
        ds3.restore(url, dest)
        shutil.rmtree(dest)

    def raw_get_parallel():
        list(in_order(lambda k: moto.get_object(Bucket="bench", Key=k)["Body"].read(), keys))

    t_raw_get, t_restore = side_by_side(raw_get, restore)
    t_raw_get_par = median_time(raw_get_parallel, ROUNDS)

    # one more sealed segment: its archive call costs 1 segment PUT + 1 manifest PUT and,
    # the manifest number being known in this process, one HEAD and no LIST
    with durkv.open(path, durability="exit", segment_bytes=SEGMENT, index_every=0) as s:
        s.put("t", "", "99999999", checkpoint={}, metadata={}, values={"x": 1},
              versions={"x": 1})
        for k in counts:
            counts[k] = 0
        s.archive(url, seal=True, client=loc.s3())
    second = dict(counts)

    a_ratio = t_raw_put / t_archive
    r_ratio = t_raw_get / t_restore
    print(f"\n{len(files)} segments, {mb:.1f} MB: archive {mb / t_archive:.1f} MB/s vs "
          f"put_object {mb / t_raw_put:.1f} MB/s; restore {mb / t_restore:.1f} MB/s vs "
          f"get_object {mb / t_raw_get:.1f} MB/s; plain boto3 with {PARALLEL} in flight: put "
          f"{mb / t_raw_put_par:.1f} MB/s, get {mb / t_raw_get_par:.1f} MB/s; first archive {first}; "
          f"one-segment archive {second}")
    record(benchmark, f"s3 archive MB/s / plain put_object ({mb:.0f} MB, moto)",
           ratio=a_ratio, target="archive >= 0.8x plain put", ok=a_ratio >= 0.8,
           segments=len(files), mbytes=round(mb, 1), archive_mb_s=round(mb / t_archive, 1),
           put_mb_s=round(mb / t_raw_put, 1), put_parallel_mb_s=round(mb / t_raw_put_par, 1))
    record(benchmark, f"s3 restore MB/s / plain get_object ({mb:.0f} MB, moto)",
           ratio=r_ratio, target="restore >= 0.8x plain get", ok=r_ratio >= 0.8,
           restore_mb_s=round(mb / t_restore, 1), get_mb_s=round(mb / t_raw_get, 1),
           get_parallel_mb_s=round(mb / t_raw_get_par, 1))
    per_segment = first["PutObject"] / len(files)
    record(benchmark, "s3 PUTs per archived segment (first archive)",
           ratio=per_segment, target="1 + 1 manifest per call, no LIST once known",
           ok=first["PutObject"] == len(files) + 1 and second["PutObject"] == 2
           and second["ListObjectsV2"] == 0, first_call=first, one_segment_call=second)


# ---- the live s3:// store ----------------------------------------------------------------------

class LoopState(TypedDict):
    step: int
    log: Annotated[list, operator.add]


def _commits_per_s(backend, n_threads: int, per_thread: int, payload: bytes) -> float:
    import threading
    import time

    def run():
        for _ in range(per_thread):
            backend.append(payload)

    threads = [threading.Thread(target=run) for _ in range(n_threads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return n_threads * per_thread / (time.perf_counter() - t0)


@pytest.mark.benchmark(group="s3-live")
def test_live_commits_vs_raw_conditional_put(benchmark, moto):
    from durkv.backends.s3.live import S3Backend, encode_batch

    payload = os.urandom(1024)
    n = 30 if QUICK else 100
    body = encode_batch(1, 0, [payload])
    seq = itertools.count()

    def raw_put():
        moto.put_object(Bucket="bench", Key=f"rawc/{next(seq):020d}", Body=body,
                        IfNoneMatch="*")

    backend = S3Backend(f"s3://bench/live{next(_prefixes)}")

    def commit():
        backend.append(payload)

    t_raw, t_commit = benchmark.pedantic(
        lambda: side_by_side(lambda: [raw_put() for _ in range(n)],
                             lambda: [commit() for _ in range(n)]), rounds=1, iterations=1)
    one = _commits_per_s(backend, 1, n, payload)
    puts_before = backend.puts
    eight = _commits_per_s(backend, 8, n // 2, payload)
    eight_puts = backend.puts - puts_before
    flushes, objects, merges = backend.puts, backend.object_count(), backend.merger.merges
    backend.close()
    async_backend = S3Backend(f"s3://bench/live{next(_prefixes)}", durability="async")
    many = 5_000 if QUICK else 50_000
    async_rate = _commits_per_s(async_backend, 1, many, payload)
    async_backend.close()
    lat_ratio = t_commit / t_raw
    print(f"\nlive sync commit {t_commit / n * 1e3:.2f} ms vs raw conditional PUT "
          f"{t_raw / n * 1e3:.2f} ms; 1 thread {one:.0f}/s, 8 threads {eight:.0f}/s "
          f"({8 * (n // 2)} commits in {eight_puts} PUTs); async {async_rate:.0f}/s; "
          f"{flushes} batch PUTs left {objects} objects ({merges} merges)")
    record(benchmark, "live s3 sync commit latency / raw conditional PUT", ratio=lat_ratio,
           target="<= 1.3x", ok=lat_ratio <= 1.3, commit_ms=round(t_commit / n * 1e3, 2),
           raw_put_ms=round(t_raw / n * 1e3, 2))
    record(benchmark, "live s3 sync: 8 threads / 1 thread commits/s", ratio=eight / one,
           target=">= 4x", ok=eight / one >= 4, one_thread=round(one), eight_threads=round(eight),
           eight_thread_puts=eight_puts)
    record(benchmark, "live s3 async commits/s (1 thread) / 20,000", ratio=async_rate / 20_000,
           target=">= 20,000/s", ok=async_rate >= 20_000, async_per_s=round(async_rate))
    record(benchmark, "live s3 sync: objects left / batch PUTs made", ratio=objects / flushes,
           target="bounded (merged)", ok=objects <= 64, objects=objects, batch_puts=flushes,
           merges=merges)


@pytest.mark.benchmark(group="s3-live")
def test_live_langgraph_run_puts_and_bytes(benchmark, moto, bench_root):
    pytest.importorskip("langgraph")
    from langgraph.graph import END, START, StateGraph

    from durkv.langgraph import DurkvSaver

    State = LoopState
    n = 300 if QUICK else 2000

    def tick(s: State) -> dict:
        return {"step": s["step"] + 1, "log": [f"step {s['step']}: " + "x" * 200]}

    g = StateGraph(State)
    g.add_node("tick", tick)
    g.add_edge(START, "tick")
    g.add_conditional_edges("tick", lambda s: END if s["step"] >= n else "tick")
    config = {"configurable": {"thread_id": "bench"}, "recursion_limit": n + 10}

    def run(url):
        with DurkvSaver.open(url, durability="async") as saver:
            g.compile(checkpointer=saver).invoke({"step": 0, "log": []}, config)
            return saver

    prefix = f"live{next(_prefixes)}"
    url = f"s3://bench/{prefix}"
    loc = ds3.S3Location.parse(url)
    counts = _counter(loc.s3())
    benchmark.pedantic(lambda: run(url), rounds=1, iterations=1)
    local = bench_root / "lg-local.durkv"
    run(str(local))
    local_bytes = sum(f.stat().st_size for f in local.glob("*.seg"))
    s3_bytes = 0
    for page in moto.get_paginator("list_objects_v2").paginate(Bucket="bench",
                                                               Prefix=prefix + "/"):
        s3_bytes += sum(o["Size"] for o in page.get("Contents", ()))
    objects = sum(len(p.get("Contents", ())) for p in moto.get_paginator(
        "list_objects_v2").paginate(Bucket="bench", Prefix=prefix + "/"))
    ratio = s3_bytes / local_bytes
    print(f"\nLangGraph {n} supersteps on live s3 (async): {counts['PutObject']} PUTs, "
          f"{s3_bytes} bytes stored in {objects} objects vs {local_bytes} bytes local")
    record(benchmark, f"live s3 LangGraph {n} supersteps: bytes stored / local store",
           ratio=ratio, target="<= 1.5x", ok=ratio <= 1.5, puts=counts["PutObject"],
           s3_bytes=s3_bytes, local_bytes=local_bytes, objects=objects)


# ---- decisions from another machine (FORMAT.md section 13) -------------------------------------

@pytest.mark.benchmark(group="s3-decisions")
@pytest.mark.parametrize("poll_ms", [50, 200])
def test_decision_round_trip_vs_its_raw_requests(benchmark, moto, poll_ms):
    """``store.decide`` on a read-only handle while the writer (this process) holds the
    store, against the plain requests an exchange cannot do without: the decider's PUT,
    the writer's LIST and GET of it, its journal batch PUT, its ack PUT, the decider's
    GET of the ack. The difference is the writer's poll (on average half of
    ``decision_poll_ms``), the decider's GETs of the ack (20 ms doubling to 200 ms), its
    read of the log first, and the journal fold on both sides."""
    n = 5 if QUICK else 15
    prefix = f"dec{next(_prefixes)}"
    url = f"s3://bench/{prefix}?decision_poll_ms={poll_ms}"
    seq = itertools.count()
    body = b'{"format":"durkv-decision"}' + b" " * 400
    import time

    def raw_exchange():
        k = f"rawd{prefix}/{next(seq):020d}"
        moto.put_object(Bucket="bench", Key=k + ".json", Body=body, IfNoneMatch="*")
        moto.list_objects_v2(Bucket="bench", Prefix=f"rawd{prefix}/")
        moto.get_object(Bucket="bench", Key=k + ".json")["Body"].read()
        moto.put_object(Bucket="bench", Key=k + ".batch", Body=body, IfNoneMatch="*")
        moto.put_object(Bucket="bench", Key=k + ".ack.json", Body=body, IfNoneMatch="*")
        moto.get_object(Bucket="bench", Key=k + ".ack.json")["Body"].read()

    with durkv.open(url) as writer, durkv.open(url, read_only=True) as reader:
        for i in range(2 * n + 2):
            with writer.run(f"r{i}", input=i) as run:
                run.approve("send", {"to": i})
        runs = iter(range(2 * n + 2))
        remote_t, raw_t, own_t = [], [], []

        def remote_decide():
            t0 = time.perf_counter()
            assert reader.decide(f"r{next(runs)}", "0", True, by="bench").approved
            remote_t.append(time.perf_counter() - t0)

        def own_decide():
            t0 = time.perf_counter()
            assert writer.decide(f"r{next(runs)}", "0", False, by="bench").approved is False
            own_t.append(time.perf_counter() - t0)

        def raw():
            t0 = time.perf_counter()
            raw_exchange()
            raw_t.append(time.perf_counter() - t0)

        def rounds():
            remote_decide()     # warm-up: the reader's first log read, the clients
            raw()
            remote_t.clear()
            raw_t.clear()
            for _ in range(n):
                raw()
                remote_decide()
                own_decide()

        benchmark.pedantic(rounds, rounds=1, iterations=1)
    med = {k: statistics.median(v) * 1e3 for k, v in
           (("remote", remote_t), ("raw", raw_t), ("own", own_t))}
    p90 = sorted(remote_t)[int(0.9 * (len(remote_t) - 1))] * 1e3
    bound = poll_ms + 2 * med["raw"]
    print(f"\ndecision round trip, decision_poll_ms={poll_ms}: remote decide median "
          f"{med['remote']:.1f} ms (p90 {p90:.1f}), the writer's own decide "
          f"{med['own']:.1f} ms, the raw requests of one exchange {med['raw']:.1f} ms")
    record(benchmark, f"s3 remote decide round trip / (poll {poll_ms} ms + 2x raw exchange)",
           ratio=med["remote"] / bound, target="<= 1.0", ok=med["remote"] <= bound,
           remote_ms=round(med["remote"], 1), remote_p90_ms=round(p90, 1),
           own_decide_ms=round(med["own"], 1), raw_exchange_ms=round(med["raw"], 1),
           poll_ms=poll_ms, decisions=n)
