"""Property test: any sequence of store operations matches a plain in-memory model.

Runs on the local backend in a temporary directory (reopen replays the log).
DURKV_SLOW_TESTS=1 runs many more examples.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durkv

SLOW = os.environ.get("DURKV_SLOW_TESTS") == "1"
THREADS = ["a", "b", "c"]
NSS = ["", "sub"]

op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(THREADS), st.sampled_from(NSS),
              st.integers(0, 3), st.booleans(), st.integers(0, 5)),
    st.tuples(st.just("writes"), st.sampled_from(THREADS), st.sampled_from(NSS),
              st.sampled_from(["x", "y"]),
              st.lists(st.tuples(st.sampled_from([0, 1, 2, -1]), st.integers(0, 9)),
                       min_size=1, max_size=3)),
    # the agent loop: a task's list write to "m", and the checkpoint that appends it (in
    # either order: LangGraph's executor may commit the checkpoint first); the store keeps
    # the items once, shared by the write and the checkpoint (FORMAT.md section 5)
    st.tuples(st.just("step"), st.sampled_from(THREADS), st.sampled_from(NSS),
              st.integers(0, 3), st.booleans(), st.booleans()),
    # a list write to "m" that no checkpoint folds in (stored as a FULL entry all the same)
    st.tuples(st.just("lwrites"), st.sampled_from(THREADS), st.sampled_from(NSS),
              st.sampled_from(["agent", "tool"]), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("delete"), st.sampled_from(THREADS)),
    st.tuples(st.just("copy"), st.sampled_from(THREADS), st.sampled_from(THREADS)),
    st.tuples(st.just("prune"), st.sampled_from(THREADS), st.integers(0, 2)),
    st.tuples(st.just("delete_runs"), st.sampled_from(["r0", "r1", "r2"])),
    st.tuples(st.just("compact")),
    st.tuples(st.just("reopen")),
)


class Model:
    def __init__(self) -> None:
        # thread -> ns -> cid -> {"values": dict, "writes": {(task, idx): (channel, value)}}
        self.t: dict[str, dict[str, dict[str, dict]]] = {}

    def lane(self, t, ns):
        return self.t.get(t, {}).get(ns, {})


def check(store, model: Model) -> None:
    assert store.threads() == sorted(t for t, nss in model.t.items() if any(nss.values()))
    for t, nss in model.t.items():
        for ns, cps in nss.items():
            got = list(store.history(t, ns))
            assert [c.checkpoint_id for c in got] == sorted(cps, reverse=True)
            for c in got:
                want = cps[c.checkpoint_id]
                assert c.values == want["values"], (t, ns, c.checkpoint_id)
                ws = sorted((w.task_id, w.idx, w.channel, w.value) for w in c.writes)
                if want.get("wild"):     # a merge met two values of one write key
                    continue
                assert ws == sorted((k[0], k[1], ch, v) for k, (ch, v) in want["writes"].items())
            if cps:
                latest = store.get(t, ns)
                assert latest.checkpoint_id == max(cps)
                assert latest.values == cps[max(cps)]["values"]
            for ch in ("m", "s"):
                check_entries(store, t, ns, ch, cps)


def check_entries(store, t, ns, ch, cps) -> list:
    """channel_entries against the model: an "append" is what the checkpoint's value adds
    to its parent's, any other entry its whole value, a checkpoint left out holds its
    parent's value, and one whose parent the lane no longer holds is listed."""
    got = [(e.checkpoint_id, e.kind, e.value) for e in store.channel_entries(t, ns, ch)]
    assert [c for c, _k, _v in got] == sorted((c for c, _k, _v in got), reverse=True)
    listed = {c: (k, v) for c, k, v in got}
    assert set(listed) <= set(cps)
    for cid, cp in cps.items():
        value = cp["values"][ch]
        parent = cp["parent"] if cp["parent"] in cps else None
        if cid not in listed:
            assert parent is not None and cps[parent]["values"][ch] == value, (t, ns, ch, cid)
        elif listed[cid][0] == "append":
            assert parent is not None, (t, ns, ch, cid)
            assert cps[parent]["values"][ch] + listed[cid][1] == value, (t, ns, ch, cid)
        else:
            assert listed[cid] == ("full" if ch == "m" else "value", value), (t, ns, ch, cid)
    return got


def all_entries(store, model: Model) -> dict:
    return {(t, ns, ch): [(e.checkpoint_id, e.kind, e.value)
                          for e in store.channel_entries(t, ns, ch)]
            for t, nss in model.t.items() for ns in nss for ch in ("m", "s")}


def run_ops(ops, snapshot_every):
    d = tempfile.mkdtemp(prefix="durkv-model-")
    path = os.path.join(d, "s")
    opts = dict(snapshot_every=snapshot_every, durability="exit", compress_min_bytes=40,
                index_every=3)     # periodic index snapshots between the reopens too
    store = durkv.open(path, **opts)
    model = Model()
    counter = 0
    try:
        for o in ops:
            kind = o[0]
            if kind == "put":
                _, t, ns, n_new, fork, s_val = o
                lane = model.lane(t, ns)
                counter += 1
                cid = f"{counter:06d}"
                if lane:
                    ids = sorted(lane)
                    parent = ids[(s_val * 7) % len(ids)] if fork else ids[-1]
                    pv = lane[parent]["values"]
                    got = store.get(t, ns, parent).values
                    old = got.get("m", [])
                else:
                    parent, pv, old = None, {}, []
                new = old + [f"{cid}-{k}" * (k + 1) for k in range(n_new)]
                values = {"m": new}
                versions = {"m": cid, "s": 1}
                if s_val % 2 or "s" not in pv:
                    values["s"] = {"v": s_val, "cid": cid}
                model_vals = {"m": new, "s": values.get("s", pv.get("s"))}
                run = f"r{(counter * 7) % 3}"
                store.put(t, ns, cid, checkpoint={"c": cid}, metadata={"run_id": run},
                          values=values, versions=versions, parent_id=parent)
                model.t.setdefault(t, {}).setdefault(ns, {})[cid] = {
                    "values": model_vals, "writes": {}, "run": run, "parent": parent}
            elif kind == "writes":
                _, t, ns, task, ws = o
                lane = model.lane(t, ns)
                if not lane:
                    continue
                cid = sorted(lane)[len(ws) % len(lane)]
                writes = [(idx, "__error__" if idx < 0 else f"ch{idx}", v) for idx, v in ws]
                store.put_writes(t, ns, cid, task, writes)
                mw = lane[cid]["writes"]
                replace = all(idx < 0 for idx, _ in ws)
                for idx, ch, v in writes:
                    if replace or (task, idx) not in mw:
                        mw[(task, idx)] = (ch, v)
            elif kind == "step":
                _, t, ns, n_new, late, extra = o
                lane = model.lane(t, ns)
                if not lane:
                    continue
                parent = max(lane)
                pv = lane[parent]["values"]
                counter += 1
                cid = f"{counter:06d}"
                items = [f"{cid}-step-{k}" * (k + 2) for k in range(n_new)]
                # extra: the reducer adds an item the write did not carry
                new = pv["m"] + items + ([f"{cid}-extra"] if extra else [])
                run = f"r{(counter * 7) % 3}"

                def commit(t=t, ns=ns, cid=cid, new=new, run=run, parent=parent):
                    store.put(t, ns, cid, checkpoint={"c": cid}, metadata={"run_id": run},
                              values={"m": new}, versions={"m": cid, "s": 1}, parent_id=parent)

                if late:
                    commit()
                store.put_writes(t, ns, parent, "agent", [(0, "m", items)])
                if not late:
                    commit()
                lane[parent]["writes"].setdefault(("agent", 0), ("m", items))
                lane[cid] = {"values": {"m": new, "s": pv["s"]}, "writes": {}, "run": run,
                             "parent": parent}
            elif kind == "lwrites":
                _, t, ns, task, idx, n = o
                lane = model.lane(t, ns)
                if not lane:
                    continue
                cid = sorted(lane)[n % len(lane)]
                val = [f"lw-{cid}-{k}" * (k + 3) for k in range(n)]
                store.put_writes(t, ns, cid, task, [(idx, "m", val)])
                lane[cid]["writes"].setdefault((task, idx), ("m", val))
            elif kind == "delete":
                store.delete_thread(o[1])
                model.t.pop(o[1], None)
            elif kind == "copy":
                _, src, dst = o
                if src == dst or not any(model.t.get(src, {}).values()):
                    continue
                store.copy_thread(src, dst)
                # merged into an existing target: the source's checkpoints and writes are
                # added; where both hold a value for one (task, idx) of one checkpoint, which
                # one reads back depends on the frames' order (compaction reorders it), so
                # the model stops checking that checkpoint's writes ("wild")
                tgt = model.t.setdefault(dst, {})
                for ns, cps in model.t[src].items():
                    for cid, cp in cps.items():
                        have = tgt.setdefault(ns, {}).get(cid)
                        if have is None:
                            tgt[ns][cid] = {"values": cp["values"], "writes": dict(cp["writes"]),
                                           "run": cp["run"], "wild": cp.get("wild", False),
                                           "parent": cp["parent"]}
                        else:
                            for wk, wv in cp["writes"].items():
                                if wk in have["writes"] and have["writes"][wk] != wv:
                                    have["wild"] = True
                                have["writes"][wk] = wv
                            if cp.get("wild"):
                                have["wild"] = True
            elif kind == "prune":
                _, t, keep = o
                store.prune([t], keep_last=keep)
                for ns, cps in model.t.get(t, {}).items():
                    for cid in sorted(cps)[:max(0, len(cps) - keep)]:
                        del cps[cid]
            elif kind == "delete_runs":
                store.delete_runs([o[1]])
                for nss in model.t.values():
                    for cps in nss.values():
                        for cid in [c for c, cp in cps.items() if cp["run"] == o[1]]:
                            del cps[cid]
            elif kind == "compact":
                # what each checkpoint wrote reads the same wherever its entries were copied
                before = all_entries(store, model)
                store.compact()
                assert all_entries(store, model) == before
            elif kind == "reopen":
                before = all_entries(store, model)
                store.close()
                store = durkv.open(path, **opts)
                assert all_entries(store, model) == before
            for t in list(model.t):
                model.t[t] = {ns: cps for ns, cps in model.t[t].items() if cps}
                if not model.t[t]:
                    del model.t[t]
            check(store, model)
        store.close()
        store = durkv.open(path, **opts)
        check(store, model)
    finally:
        store.close()
        shutil.rmtree(d, ignore_errors=True)


@settings(max_examples=300 if SLOW else 40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=40), st.sampled_from([1, 2, 3, 64]))
def test_store_matches_model(ops, snapshot_every):
    run_ops(ops, snapshot_every)
