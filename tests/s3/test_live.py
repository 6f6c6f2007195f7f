"""The live ``s3://`` store (first version): round trip, one writer, takeover fences the
zombie, kill -9 keeps every acknowledged sync commit, group commit, lost responses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import durkv
from durkv.backends.s3.live import S3Backend
from durkv.errors import ConfigError, FencedError, StoreLockedError

from .storetools import keys, put


def ids(store, thread="t"):
    return [c.checkpoint_id for c in store.history(thread)]


def test_round_trip_and_reopen(s3_env, bucket):
    url = f"s3://{bucket}/live"
    with durkv.open(url) as store:
        for i in range(5):
            put(store, i)
    with durkv.open(url, read_only=True) as reader:
        assert ids(reader)[0] == "000004" and reader.get("t").values["n"] == 4
    with durkv.open(url, durability="async") as store:
        put(store, 5)
        assert store.get("t").values["n"] == 5
    with durkv.open(url, read_only=True) as reader:
        assert ids(reader) == [f"{i:06d}" for i in range(5, -1, -1)]


def test_a_second_writer_is_refused_naming_the_holder(s3_env, bucket):
    url = f"s3://{bucket}/live"
    with durkv.open(url) as store:
        put(store, 0)
        with pytest.raises(StoreLockedError, match="is held by .*takeover=True") as err:
            durkv.open(url)
        assert err.value.context["owner"].split(":")[1] == str(os.getpid())
    with durkv.open(url) as store:      # closed: the next writer needs no takeover
        put(store, 1)


def test_racing_writers_exactly_one_wins(s3_env, bucket):
    url = f"s3://{bucket}/race"
    results: list[object] = []
    barrier = threading.Barrier(4)

    def open_one():
        barrier.wait()
        try:
            results.append(S3Backend(url))
        except StoreLockedError as exc:
            results.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if isinstance(r, S3Backend)]
    assert len(winners) == 1 and len(results) == 4
    winners[0].close()


def test_takeover_fences_the_zombie_and_its_write_is_invisible(s3_env, s3, bucket):
    url = f"s3://{bucket}/live"
    zombie = durkv.open(url)
    put(zombie, 0)
    with durkv.open(url, takeover=True) as heir:
        assert ids(heir) == ["000000"]
        put(heir, 1)
        with pytest.raises(FencedError, match="fenced"):
            put(zombie, 99)
        with pytest.raises(FencedError):
            put(zombie, 100)      # fails closed: every later call raises too
        put(heir, 2)
    zombie.close()
    with durkv.open(url, read_only=True) as reader:
        assert ids(reader) == ["000002", "000001", "000000"]


def test_takeover_is_an_option_of_open_and_of_the_saver_and_a_url_query(s3_env, bucket):
    url = f"s3://{bucket}/live"
    zombie = durkv.open(url)
    put(zombie, 0)
    with durkv.open(url + "?takeover=1") as heir:      # the URL form still works
        put(heir, 1)
    zombie2 = durkv.open(url)
    pytest.importorskip("langgraph")
    from durkv.langgraph import DurkvSaver

    with pytest.raises(StoreLockedError):
        DurkvSaver.open(url)
    with DurkvSaver.open(url, takeover=True):
        pass
    with pytest.raises(FencedError):
        put(zombie2, 2)
    with pytest.raises(FencedError):
        zombie.close()      # its close writes an index snapshot: fenced too
    zombie2.close()
    with durkv.open(url, read_only=True) as reader:
        assert ids(reader) == ["000001", "000000"]
    with pytest.raises(ConfigError, match="s3:// stores only"):
        durkv.open("memory://", takeover=True)


def test_kill_9_of_a_sync_writer_keeps_every_acknowledged_commit(tmp_path, s3_env, bucket):
    url = f"s3://{bucket}/kill"
    child = textwrap.dedent(f"""
        import sys, durkv
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.dirname(__file__)))!r})
        from tests.s3.storetools import put
        store = durkv.open({url!r})
        i = 0
        while True:
            put(store, i)
            print(f"acked {{i}}", flush=True)
            i += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=os.environ.copy())
    lines: list[str] = []
    deadline = time.monotonic() + 30
    while len(lines) < 15 and time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            break
        lines.append(line)
    proc.send_signal(signal.SIGKILL)
    rest = proc.stdout.read().decode()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    whole = ("".join(lines) + rest).split("\n")[:-1]     # a line the kill cut is dropped
    acked = [int(x.split()[1]) for x in whole if x.startswith("acked ")]
    assert len(acked) >= 15
    with pytest.raises(StoreLockedError):
        durkv.open(url)                             # the dead writer never closed
    with durkv.open(url, takeover=True) as heir:
        have = set(ids(heir))
        assert {f"{i:06d}" for i in acked} <= have
        put(heir, 10_000)


def test_sync_committers_share_puts(s3_env, bucket):
    url = f"s3://{bucket}/group"
    backend = S3Backend(url)
    n_threads, per = 8, 10

    def commit(t):
        for i in range(per):
            backend.append(f"{t}:{i}".encode())

    threads = [threading.Thread(target=commit, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert backend.next_lsn == n_threads * per
    assert backend.puts < n_threads * per       # group commit: fewer PUTs than commits
    backend.close()
    reader = S3Backend(url, read_only=True)
    assert sorted(p for _, p in reader.scan()) == sorted(
        f"{t}:{i}".encode() for t in range(n_threads) for i in range(per))


def test_a_lost_batch_response_is_success_by_put_id(s3_env, s3, bucket, proxy):
    handler, endpoint = proxy
    url = f"s3://{bucket}/lost"
    handler.drop = {"/live/wal/00000000000000000002.batch": 1}
    backend = S3Backend(f"{url}?endpoint_url={endpoint}")
    backend.append(b"one")       # batch 1 (batch 0 is the fence)
    backend.append(b"two")       # batch 2: lands, its answer is dropped, the retry gets 412
    assert handler.drop["/live/wal/00000000000000000002.batch"] == 0
    backend.append(b"three")
    backend.close()
    assert [p for _, p in S3Backend(url, read_only=True).scan()] == [b"one", b"two", b"three"]
    assert len([k for k in keys(s3, bucket) if "/wal/" in k]) == 4


def test_a_langgraph_run_continues_on_live_s3_in_a_new_process(s3_env, bucket):
    """A run crashes in this process; another process (another machine, as far as the
    store can tell) opens the same s3:// URL and finishes it: the uninterrupted result."""
    pytest.importorskip("langgraph")
    from durkv.langgraph import DurkvSaver

    from .lg_graph import Crash, build

    n, config = 12, {"configurable": {"thread_id": "run-1"}, "recursion_limit": 100}
    want = build(n).invoke({"step": 0, "log": []}, config)
    url = f"s3://{bucket}/lg"
    with DurkvSaver.open(url, durability="sync") as saver:
        with pytest.raises(Crash):
            build(n, fail_at=7, checkpointer=saver).invoke({"step": 0, "log": []}, config)
    child = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.dirname(__file__)))!r})
        from durkv.langgraph import DurkvSaver
        from tests.s3.lg_graph import build
        config = {config!r}
        with DurkvSaver.open({url!r}) as saver:
            graph = build({n}, checkpointer=saver)
            start = graph.get_state(config).values["step"]
            print(json.dumps({{"from": start, "final": graph.invoke(None, config)}}))
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         env=os.environ.copy(), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout)
    assert got["from"] == 7 and got["final"] == want


def test_a_reader_of_nothing_is_told_so(s3_env, bucket):
    from durkv.errors import NotFoundError

    with pytest.raises(NotFoundError, match="no durkv store"):
        durkv.open(f"s3://{bucket}/nothing", read_only=True)


def test_run_journal_reads_back_after_reopen(s3_env, bucket):
    """Store.journal on a live S3 store: the batched head read (read_heads) of this
    backend returns every record of the run, in order, before and after a reopen."""
    url = f"s3://{bucket}/journal"
    with durkv.open(url) as store:
        for i in range(5):
            store.append_journal("r", {"e": 2, "s": str(i), "i": i}, durable=i % 2 == 0)
        store.append_journal("other", {"e": 2, "s": "0", "i": 99})
        assert [r["i"] for r in store.journal("r")] == list(range(5))
    with durkv.open(url, read_only=True) as reader:
        assert [r["i"] for r in reader.journal("r")] == list(range(5))
        assert [r["i"] for r in reader.journal("other")] == [99]


def test_verify_is_the_same_report_type_as_local(s3_env, bucket):
    from durkv.backends.base import VerifyReport

    url = f"s3://{bucket}/verified"
    with durkv.open(url) as store:
        for i in range(3):
            put(store, i)
        report = store.verify(deep=True)
    assert type(report) is VerifyReport and report.ok and report.damage == ()
    assert report.frames == report.next_lsn - report.start_lsn >= 3
    assert report.details["objects"] >= 1


def test_an_exactly_once_agent_shares_its_messages_on_live_s3(tmp_path, s3_env, bucket):
    """docs/FORMAT.md 5 `jref` / 5a `ir` places on a live S3 store: the agent's writes name
    its journal results, and a new handle (another process, as far as the store can tell)
    reads every state and journaled input as a local store of the plain agent does."""
    pytest.importorskip("langgraph")
    from durkv.langgraph import DurkvSaver
    from durkv.payload import JREF_MAGIC, decode_commit

    sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
    from test_journal_shared import model_inputs, readback, react

    url = f"s3://{bucket}/react"
    config = {"configurable": {"thread_id": "t"}, "recursion_limit": 100}
    start = {"messages": []}
    with DurkvSaver.open(url) as saver:
        react(12, "s3", True).compile(checkpointer=saver).invoke(start, config,
                                                                 durability="async")
    plain = tmp_path / "plain.durkv"
    with DurkvSaver.open(str(plain)) as saver:
        react(12, "s3", False).compile(checkpointer=saver).invoke(start, config,
                                                                  durability="async")
    items = [x for _lsn, p in S3Backend(url, read_only=True).scan()
             for e in decode_commit(p)[1] for x in e.items]
    assert sum(x[:4] == JREF_MAGIC for x in items) >= 10
    with DurkvSaver.open(url) as saver:
        g = react(12, "s3", False).compile(checkpointer=saver)
        hist = [([m.model_dump() for m in s.values.get("messages", [])], s.next)
                for s in g.get_state_history(config)]
        calls = model_inputs(saver.store)
    assert hist == readback(plain, "s3")[0]
    assert len(calls) == 7 and all(isinstance(c, list) for c in calls)   # 0, 2, .. 12
