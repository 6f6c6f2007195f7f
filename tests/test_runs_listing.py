"""`store.runs()` and `durkv runs` read each journal the lazy way (its plain STEP records
scanned, not decoded): every field they report equals what the eager fold of the same
records gives (GUARANTEES 16.11), and a run's size is what its frames take in the log."""

from __future__ import annotations

import durkv
import pytest
from durkv.runtime.control import overview
from durkv.runtime.journal import fold


@durkv.tool(name="send")
def send(to, *, idempotency_key):
    return f"sent to {to}"


def _runs(store):
    with store.run("finished") as run:
        for i in range(50):
            run.step("model", lambda i: {"i": i}, i)
        run.tool(send, "ann")
        run.step("model", lambda: 1, key="named")
    with pytest.raises(ValueError):
        with store.run("failed") as run:
            run.step("model", lambda: 2)
            run.step("boom", lambda: (_ for _ in ()).throw(ValueError("no")))
    with store.run("waiting") as run:
        run.step("draft", lambda: "text")
        run.approve("publish", {"title": "x"})
    with store.run("retried") as run:
        calls = iter([RuntimeError("flaky"), None])

        def flaky():
            e = next(calls)
            if e:
                raise e
            return 3
        run.step("flaky", flaky, retry=durkv.Retry(2, backoff=0))
        run.step("model", lambda: 4)
        run.step("model", lambda: 4)


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_runs_report_the_eager_folds_answers(tmp_path, backend):
    path = str(tmp_path / "s") if backend == "local" else "memory://"
    with durkv.open(path) as store:
        _runs(store)
        infos = {i.run_id: i for i in store.runs()}
        assert set(infos) == {"finished", "failed", "waiting", "retried"}
        for rid, info in infos.items():
            st = fold(rid, store.journal(rid))
            assert not st.lazy
            assert (info.status, info.step, info.steps, info.message, info.created,
                    info.updated, info.until) == (
                st.status, st.status_step, len(st.order), st.message, st.created,
                st.updated, st.until), rid
        assert infos["finished"].steps == 52
        assert infos["waiting"].status == "waiting"
        rows = {r["run_id"]: r for r in overview(store)}
        assert rows["waiting"]["action"] == "publish"
        for rid, row in rows.items():
            lsns = len(store.journal(rid))
            assert row["bytes"] > 24 * lsns, rid
        one = store.journal_bytes("finished")
        assert one == rows["finished"]["bytes"]


def test_a_runs_size_is_its_frames_in_the_log_on_a_local_store(tmp_path):
    from durkv.log import SegmentLog
    path = str(tmp_path / "s")
    with durkv.open(path, durability="exit") as store:
        _runs(store)
        sizes = {rid: store.journal_bytes(rid) for rid in store.journal_runs()}
    with durkv.open(path) as store:
        lsns = {rid: [r for r in store._index.ix.journals[rid]] for rid in sizes}
    with SegmentLog.open(path, read_only=True) as log:
        for rid, want in sizes.items():
            assert want == sum(24 + len(log.read(lsn)) for lsn in lsns[rid]), rid
