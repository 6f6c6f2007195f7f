"""The checkpoint store: round trips, delta chains, forks, prunes, compaction, bad input."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

import durkv
from durkv.payload import DELTA, FULL, SNAP, decode_commit
from durkv.store import K_CKPT
from storeinternals import backend_of, full_head, index_of





def put_step(store, i, msgs, *, thread="t", ns="", parent=None, **kw):
    cid = f"{i:06d}"
    store.put(thread, ns, cid, checkpoint={"id": cid}, metadata={"step": i, **kw},
              values={"msgs": msgs, "n": i}, versions={"msgs": i, "n": i}, parent_id=parent)
    return cid


def agent_run(store, steps, *, thread="t", ns="", start=0, msgs=None, parent=None):
    """LangGraph-style: each step builds a new list holding the same item objects."""
    msgs = list(msgs or [])
    expect = {}
    for i in range(start, start + steps):
        msgs = msgs + [{"i": i, "text": f"message {i}"}]
        parent = put_step(store, i, msgs, thread=thread, ns=ns, parent=parent)
        expect[parent] = list(msgs)
    return expect, msgs, parent


def entry_kinds(store, cid, thread="t", ns=""):
    lane = index_of(store).ix.lane(thread, ns)
    payload = backend_of(store).read(lane.lsns[lane.find(cid)])
    return [e.kind for e in decode_commit(payload)[1]]


def test_round_trip_every_field(url):
    with durkv.open(url) as s:
        vals = {"list": [1, "a", None], "when": dt.datetime(2026, 1, 2, 3, 4, 5),
                "id": uuid.UUID(int=7), "tup": (1, 2), "set": {3}, "blob": b"\x00\xff"}
        s.put("t1", "ns", "c1", checkpoint={"v": 1, "ts": "x"}, metadata={"source": "input"},
              values=vals, versions={k: 1 for k in vals})
        s.put_writes("t1", "ns", "c1", "task-a", [(0, "list", [9]), (1, "x", "y")],
                     task_path="p")
        for reopen in (False, True):
            if reopen:
                s.close()
                s = durkv.open(url)
            cp = s.get("t1", "ns")
            assert (cp.thread_id, cp.checkpoint_ns, cp.checkpoint_id, cp.parent_id) == (
                "t1", "ns", "c1", None)
            assert cp.checkpoint == {"v": 1, "ts": "x"}
            assert cp.metadata == {"source": "input"}
            assert cp.values == vals
            assert cp.versions == {k: 1 for k in vals}
            assert [(w.task_id, w.channel, w.value, w.idx, w.task_path) for w in cp.writes] == [
                ("task-a", "list", [9], 0, "p"), ("task-a", "x", "y", 1, "p")]
            assert s.get("t1", "ns", "c1") == cp
            assert s.get("t1", "") is None and s.get("nope") is None
            assert s.get("t1", "ns", "missing") is None
            assert s.threads() == ["t1"] and s.namespaces("t1") == ["ns"]
        s.close()


def test_delta_chain_across_snapshots(url):
    with durkv.open(url, snapshot_every=3) as s:
        expect, _, last = agent_run(s, 11)
        kinds = [entry_kinds(s, cid) for cid in sorted(expect)]
        assert kinds[0] == [FULL, FULL]                     # first list: FULL
        assert kinds[1] == [DELTA, FULL] and kinds[2] == [DELTA, FULL]
        assert kinds[3] == [DELTA, SNAP, FULL]             # 3rd delta: SNAP follows
        assert kinds[4] == [DELTA, FULL]
        for reopen in (False, True):
            if reopen:
                s.close()
                s = durkv.open(url, snapshot_every=3)
            for cid, msgs in expect.items():
                assert s.get("t", "", cid).values["msgs"] == msgs
            assert s.get("t").values["msgs"] == expect[last]
            # deltas continue after reopen (chain state is rebuilt from the log)
            more, _, last = agent_run(s, 4, start=len(expect), msgs=expect[last], parent=last)
            expect.update(more)
            assert entry_kinds(s, last)[0] == DELTA
        for cid, msgs in expect.items():
            assert s.get("t", "", cid).values["msgs"] == msgs
        s.close()


def test_delta_only_serializes_new_items():
    calls = []

    class Counting(durkv.serde.MsgpackSerde):
        def dumps(self, obj):
            calls.append(obj)
            return super().dumps(obj)

    with durkv.open("memory://", serde=Counting()) as s:
        _, msgs, last = agent_run(s, 50)
        calls.clear()
        msgs = msgs + [{"new": 1}]
        put_step(s, 50, msgs, parent=last)
        item_calls = [c for c in calls if c == {"new": 1}]
        assert len(item_calls) == 1 and len(calls) == 4   # checkpoint, metadata, item, n


def test_in_place_append_is_a_delta_and_mutation_of_scalars_is_caught():
    with durkv.open("memory://") as s:
        msgs = ["a", "b", "c"]
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"m": msgs}, versions={"m": 1})
        msgs.append("d")                                   # in place, same list object
        s.put("t", "", "2", checkpoint={}, metadata={}, values={"m": msgs}, versions={"m": 2})
        assert entry_kinds(s, "2")[0] == DELTA
        # equal-looking scalars at the checked positions but a changed middle: FULL
        s.put("t", "", "3", checkpoint={}, metadata={}, values={"m": ["a", "X", "c", "d", "e"]},
              versions={"m": 3})
        assert entry_kinds(s, "3")[0] == FULL
        assert s.get("t", "", "2").values["m"] == ["a", "b", "c", "d"]
        assert s.get("t", "", "3").values["m"] == ["a", "X", "c", "d", "e"]
        # a shorter list, a non-list, then a list again
        for cid, v in (("4", ["a"]), ("5", "text"), ("6", ["z"])):
            s.put("t", "", cid, checkpoint={}, metadata={}, values={"m": v}, versions={"m": cid})
            assert s.get("t").values["m"] == v
        assert s.get("t", "", "4").values["m"] == ["a"]


def test_latest_values_are_safe_to_mutate(url):
    with durkv.open(url) as s:
        s.put("t", "", "1", checkpoint={"c": [1]}, metadata={"m": 1},
              values={"l": [1, 2], "d": {"k": [1]}}, versions={"l": 1, "d": 1})
        cp = s.get("t")
        cp.values["l"].append(3)
        cp.values["d"]["k"].append(2)
        cp.checkpoint["c"].append(2)
        cp.metadata["m"] = 2
        again = s.get("t")
        assert again.values == {"l": [1, 2], "d": {"k": [1]}}
        assert again.checkpoint == {"c": [1]} and again.metadata == {"m": 1}


def test_a_list_edited_in_place_and_put_again_keeps_the_edit(url):
    """issue 7 item 1: the store kept the caller's list, so an in-place replacement
    plus an append, put again, wrote only the append (lost at reopen) and get() showed
    edits that were never committed."""
    with durkv.open(url) as s:
        lst = ["a", "b"]
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"l": lst}, versions={"l": 1})
        lst[0] = "X"                        # not put: get() shows what is committed
        lst.append("c")
        assert s.get("t").values["l"] == ["a", "b"]
        s.put("t", "", "2", checkpoint={}, metadata={}, values={"l": lst}, versions={"l": 2},
              parent_id="1")
        assert entry_kinds(s, "2") == [FULL]
        assert s.get("t").values["l"] == ["X", "b", "c"]
        lst.append("d")                     # in place, same object: still a delta
        s.put("t", "", "3", checkpoint={}, metadata={}, values={"l": lst}, versions={"l": 3},
              parent_id="2")
        assert entry_kinds(s, "3") == [DELTA]
        lst[1] = "Y"
        assert [s.get("t", "", c).values["l"] for c in "123"] == [
            ["a", "b"], ["X", "b", "c"], ["X", "b", "c", "d"]]
    if url != "memory://":
        with durkv.open(url) as s:
            assert s.get("t").values["l"] == ["X", "b", "c", "d"]


def test_items_handed_out_by_get_are_not_the_committed_ones(url):
    """An edit of an item get() returned changes neither the store nor the objects that
    were put (LangGraph's HITL edit of get_state() output), and put again it is stored."""
    with durkv.open(url) as s:
        put_items = [{"k": 1}, {"k": 2}]
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"l": put_items},
              versions={"l": 1})
        got = s.get("t").values["l"]
        got[1]["k"] = 20
        assert put_items == [{"k": 1}, {"k": 2}]
        assert s.get("t").values["l"] == [{"k": 1}, {"k": 2}]
        s.put("t", "", "2", checkpoint={}, metadata={}, values={"l": got + [{"k": 3}]},
              versions={"l": 2}, parent_id="1")
        assert entry_kinds(s, "2") == [FULL]
        assert s.get("t").values["l"] == [{"k": 1}, {"k": 20}, {"k": 3}]
        # equal items from get() still make a delta (compared by value)
        s.put("t", "", "3", checkpoint={}, metadata={},
              values={"l": s.get("t").values["l"] + [{"k": 4}]}, versions={"l": 3},
              parent_id="2")
        assert entry_kinds(s, "3") == [DELTA]
    if url != "memory://":
        with durkv.open(url) as s:
            assert s.get("t").values["l"] == [{"k": 1}, {"k": 20}, {"k": 3}, {"k": 4}]


def test_unchanged_channels_carry_over_and_absent_channels_drop(url):
    with durkv.open(url) as s:
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"a": 1, "b": [1]},
              versions={"a": 1, "b": 1})
        s.put("t", "", "2", checkpoint={}, metadata={}, values={"a": 2},
              versions={"a": 2, "b": 1}, parent_id="1")
        s.put("t", "", "3", checkpoint={}, metadata={}, values={}, versions={"b": 1},
              parent_id="2")
        assert s.get("t", "", "2").values == {"a": 2, "b": [1]}
        assert s.get("t").values == {"b": [1]}
        lane = index_of(s).ix.lane("t", "")
        head2 = full_head(s, lane.lsns[1])     # the full head, if a delta
        assert head2.kind == K_CKPT and head2.chans["b"][0] == lane.lsns[0]   # a ref, no copy


def test_a_copy_saved_whole_reads_back_its_own_values(url):
    """issue 7 A: with ``all_values``, a channel the base holds at another version is
    stored from all_values -- a copy saved with nothing in ``values`` reads back its
    own state, not its base's -- and a channel at the base's version stays a reference."""
    with durkv.open(url) as s:
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"a": 1, "b": [1], "c": "k"},
              versions={"a": 1, "b": 1, "c": 1})
        s.put("t", "", "2", checkpoint={}, metadata={}, values={"a": 2, "b": [1, 2]},
              versions={"a": 2, "b": 2, "c": 1}, parent_id="1")
        two = {"a": 2, "b": [1, 2], "c": "k"}
        # a copy of "2" with "1" as its parent (LangGraph's __copy__), then one of the
        # root "1" with no parent (its base is then the newest: "3")
        s.put("t", "", "3", checkpoint={}, metadata={}, values={}, parent_id="1",
              versions={"a": 2, "b": 2, "c": 1}, all_values=two)
        s.put("t", "", "4", checkpoint={}, metadata={}, values={},
              versions={"a": 1, "b": 1, "c": 1}, all_values={"a": 1, "b": [1], "c": "k"})
        assert s.get("t", "", "3").values == two
        assert s.get("t", "", "4").values == {"a": 1, "b": [1], "c": "k"}
        lane = index_of(s).ix.lane("t", "")
        head3 = full_head(s, lane.lsns[2])
        assert head3.chans["c"][0] == lane.lsns[0]          # same version as the base: a ref
    if url != "memory://":
        with durkv.open(url) as s:
            assert s.get("t", "", "3").values == two


def test_fork_from_old_checkpoint_writes_full_and_reads_right(url):
    with durkv.open(url, snapshot_every=4) as s:
        expect, msgs, last = agent_run(s, 8)
        base = "000003"
        forked = expect[base] + [{"fork": 1}]
        s.put("t", "", "000100", checkpoint={}, metadata={}, values={"msgs": forked},
              versions={"msgs": 100, "n": 3}, parent_id=base)
        assert entry_kinds(s, "000100") == [FULL]
        cp = s.get("t")
        assert cp.checkpoint_id == "000100" and cp.values == {"msgs": forked, "n": 3}
        # the fork continues with deltas against itself
        nxt = forked + [{"fork": 2}]
        s.put("t", "", "000101", checkpoint={}, metadata={}, values={"msgs": nxt},
              versions={"msgs": 101, "n": 3}, parent_id="000100")
        assert entry_kinds(s, "000101")[0] == DELTA
        assert s.get("t").values["msgs"] == nxt
        for cid, m in expect.items():
            assert s.get("t", "", cid).values["msgs"] == m


def test_out_of_order_ids_and_reput(url):
    with durkv.open(url) as s:
        s.put("t", "", "b", checkpoint={}, metadata={}, values={"x": 2}, versions={"x": 2})
        s.put("t", "", "a", checkpoint={}, metadata={}, values={"x": 1}, versions={"x": 1})
        assert s.get("t").checkpoint_id == "b"                       # latest = max id
        assert [c.checkpoint_id for c in s.history("t")] == ["b", "a"]
        s.put("t", "", "b", checkpoint={}, metadata={}, values={"x": 3}, versions={"x": 3})
        assert s.get("t").values == {"x": 3}
        assert [c.checkpoint_id for c in s.history("t")] == ["b", "a"]
        s.close()
        s = durkv.open(url)
        assert s.get("t").values == {"x": 3} and s.get("t", "", "a").values == {"x": 1}
        s.close()


def test_history_filters_before_limit_and_all_threads(url):
    with durkv.open(url) as s:
        for t in ("t1", "t2"):
            for i in range(5):
                s.put(t, "", f"{t}-{i}", checkpoint={}, metadata={"i": i, "odd": i % 2},
                      values={"v": i}, versions={"v": i})
        s.put("t1", "sub", "t1-9", checkpoint={}, metadata={"i": 9}, values={}, versions={})
        ids = lambda it: [c.checkpoint_id for c in it]  # noqa: E731
        assert ids(s.history("t1", "")) == [f"t1-{i}" for i in range(4, -1, -1)]
        assert ids(s.history("t1")) == ["t1-9"] + [f"t1-{i}" for i in range(4, -1, -1)]
        assert ids(s.history("t1", "", before="t1-3")) == ["t1-2", "t1-1", "t1-0"]
        assert ids(s.history("t1", "", limit=2)) == ["t1-4", "t1-3"]
        assert ids(s.history("t1", "", filter={"odd": 1})) == ["t1-3", "t1-1"]
        assert ids(s.history("t1", "", filter={"odd": 1, "i": 1})) == ["t1-1"]
        # a missing key equals None, as InMemorySaver and SqliteSaver match it
        assert ids(s.history("t1", "", filter={"missing": None})) == \
            [f"t1-{i}" for i in range(4, -1, -1)]
        assert ids(s.history("t1", "", filter={"missing": 0})) == []
        assert ids(s.history(limit=3)) == ["t2-4", "t2-3", "t2-2"]
        assert len(ids(s.history())) == 11
        assert ids(s.history(checkpoint_ns="sub")) == ["t1-9"]
        h = s.history("t1")
        assert next(h).checkpoint_id == "t1-9"    # a generator: streamed


def test_pending_writes_idempotency(url):
    with durkv.open(url) as s:
        s.put("t", "", "c", checkpoint={}, metadata={}, values={}, versions={})
        s.put_writes("t", "", "c", "task", [(0, "a", 1), (1, "b", 2)])
        s.put_writes("t", "", "c", "task", [(0, "a", 99), (1, "b", 98), (2, "c", 3)])
        before = backend_of(s).next_lsn
        s.put_writes("t", "", "c", "task", [(0, "a", 99), (1, "b", 98), (2, "c", 3)])
        assert backend_of(s).next_lsn == before          # an identical retry appends nothing (xxh3)
        s.put_writes("t", "", "c", "task", [(-1, "__error__", "e1")])
        s.put_writes("t", "", "c", "task", [(-1, "__error__", "e2")])     # special: overwrites
        s.put_writes("t", "", "c", "other", [(0, "a", "o")])
        s.put_writes("t", "", "early", "task", [(0, "a", "before checkpoint")])
        s.put("t", "", "early", checkpoint={}, metadata={}, values={}, versions={})
        want = [("other", "a", "o", 0), ("task", "__error__", "e2", -1), ("task", "a", 1, 0),
                ("task", "b", 2, 1), ("task", "c", 3, 2)]
        got = lambda cp: [(w.task_id, w.channel, w.value, w.idx) for w in cp.writes]  # noqa
        assert got(s.get("t", "", "c")) == want
        s.close()
        s = durkv.open(url)
        assert got(s.get("t", "", "c")) == want
        assert got(s.get("t", "", "early")) == [("task", "a", "before checkpoint", 0)]
        s.close()


def test_delete_copy_prune_delete_runs_replay(url):
    with durkv.open(url, snapshot_every=3) as s:
        e1, _, _ = agent_run(s, 10, thread="a")
        e2, _, _ = agent_run(s, 4, thread="b")
        s.put_writes("a", "", "000009", "task", [(0, "x", "w")])
        s.copy_thread("a", "c")
        s.delete_thread("b")
        s.prune(["a"], keep_last=2)
        # delete_runs: tag run ids via metadata of a fresh thread
        for i in range(4):
            s.put("r", "", f"{i}", checkpoint={}, metadata={"run_id": f"run{i % 2}"},
                  values={"v": i}, versions={"v": i})
        s.delete_runs(["run1"])

        def check(st):
            assert st.threads() == ["a", "c", "r"]
            assert [c.checkpoint_id for c in st.history("a")] == ["000009", "000008"]
            assert [c.checkpoint_id for c in st.history("c")] == sorted(e1, reverse=True)
            for cid, msgs in e1.items():
                assert st.get("c", "", cid).values["msgs"] == msgs
            for cid in ("000009", "000008"):
                assert st.get("a", "", cid).values["msgs"] == e1[cid]
            assert [w.value for w in st.get("c", "", "000009").writes] == ["w"]
            assert [w.value for w in st.get("a", "", "000009").writes] == ["w"]
            assert [c.checkpoint_id for c in st.history("r")] == ["2", "0"]
            assert st.get("r").checkpoint_id == "2" and st.get("b") is None

        check(s)
        s.close()
        s = durkv.open(url, snapshot_every=3)
        check(s)
        report = s.compact()
        assert report["checkpoints_kept"] == 2 + 10 + 2
        assert report["bytes_after"] < report["bytes_before"]
        check(s)
        s.close()
        s = durkv.open(url, snapshot_every=3)
        check(s)
        s.close()


def test_prune_keeps_kept_checkpoints_readable_through_compaction(url):
    with durkv.open(url, snapshot_every=3) as s:
        expect, msgs, last = agent_run(s, 20)
        s.prune(["t"], keep_last=1)
        assert s.get("t").values["msgs"] == expect[last]
        s.compact()
        assert [c.checkpoint_id for c in s.history("t")] == [last]
        assert s.get("t").values["msgs"] == expect[last]
        # the running agent keeps appending deltas after the compaction
        more, _, last2 = agent_run(s, 3, start=20, msgs=msgs, parent=last)
        assert entry_kinds(s, last2)[0] == DELTA
        s.close()
        s = durkv.open(url, snapshot_every=3)
        assert s.get("t").values["msgs"] == more[last2]
        s.prune(["t"], keep_last=0)
        assert s.threads() == [] and s.get("t") is None
        s.close()


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_values_equal_after_reopen_each_policy(tmp_path, durability):
    path = str(tmp_path / "s")
    with durkv.open(path, durability=durability, snapshot_every=5) as s:
        expect, _, last = agent_run(s, 12)
        s.put_writes("t", "", last, "task", [(0, "a", 1)])
    with durkv.open(path, durability=durability) as s:
        for cid, msgs in expect.items():
            assert s.get("t", "", cid).values["msgs"] == msgs
        assert [w.value for w in s.get("t").writes] == [1]


def test_compression_round_trip_and_magic_collision():
    with durkv.open("memory://", compress_min_bytes=64) as s:
        big = "x" * 5000
        magic = b"\x28\xb5\x2f\xfd raw bytes"

        class Raw:
            def dumps(self, obj):
                if isinstance(obj, bytes) and obj.startswith(b"\x28\xb5"):
                    return obj        # a serde whose output starts with the zstd magic
                return durkv.serde.default_serde.dumps(obj)

            def loads(self, b):
                return b if b.startswith(b"\x28\xb5") else durkv.serde.default_serde.loads(b)

        s.put("t", "", "1", checkpoint={}, metadata={}, values={"l": [big, "s"], "v": big},
              versions={"l": 1, "v": 1})
        payload = backend_of(s).read(0)
        assert len(payload) < 2000
        assert s.get("t", "", "1").values == {"l": [big, "s"], "v": big}
        s.put_writes("t", "", "1", "k", [(0, "w", big)])
        assert s.get("t").writes[0].value == big
    with durkv.open("memory://", serde=Raw()) as s:
        s.put("t", "", "1", checkpoint=b"", metadata=b"", values={"v": magic}, versions={"v": 1})
        s.put("t", "", "2", checkpoint=b"", metadata=b"", values={"v": b"n"}, versions={"v": 2})
        assert s.get("t", "", "1").values == {"v": magic}


def test_channel_entries(url):
    with durkv.open(url, snapshot_every=2) as s:
        s.put("t", "", "0", checkpoint={}, metadata={}, values={"m": ["a"], "s": 1},
              versions={"m": 1, "s": 1})
        m = s.get("t").values["m"]
        for i, extra in enumerate(["b", "c", "d"], start=1):
            m = m + [extra]
            s.put("t", "", str(i), checkpoint={}, metadata={}, values={"m": m},
                  versions={"m": i + 1, "s": 1}, parent_id=str(i - 1))
        got = [(e.checkpoint_id, e.kind, e.value) for e in s.channel_entries("t", "", "m")]
        assert got == [("3", "append", ["d"]), ("2", "append", ["c"]), ("1", "append", ["b"]),
                       ("0", "full", ["a"])]
        assert [(e.checkpoint_id, e.kind, e.value)
                for e in s.channel_entries("t", "", "s")] == [("0", "value", 1)]
        assert [e.checkpoint_id for e in s.channel_entries("t", "", "m", before="3",
                                                           limit=1)] == ["2"]
        assert list(s.channel_entries("nobody", "", "m")) == []


# -- bad input: clear errors, nothing committed, the store stays usable -----------------------

def test_missing_thread_id(url):
    with durkv.open(url) as s:
        for bad in ("", None, 3):
            with pytest.raises(durkv.ConfigError, match="thread_id"):
                s.put(bad, "", "1", checkpoint={}, metadata={}, values={}, versions={})
            with pytest.raises(durkv.ConfigError, match="thread_id"):
                s.get(bad)
        with pytest.raises(durkv.ConfigError, match="checkpoint_id"):
            s.put("t", "", "", checkpoint={}, metadata={}, values={}, versions={})
        with pytest.raises(ValueError):       # ConfigError is a ValueError too
            s.put_writes("", "", "1", "task", [(0, "a", 1)])
        assert s.threads() == []


def test_unserializable_value_commits_nothing(url):
    with durkv.open(url) as s:
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"a": [1]}, versions={"a": 1})
        before = backend_of(s).next_lsn
        for bad in ({"a": [1, object()]}, {"a": object()}):
            with pytest.raises(durkv.SerializationError, match="'a'"):
                s.put("t", "", "2", checkpoint={}, metadata={}, values=bad, versions={"a": 2})
        with pytest.raises(durkv.SerializationError):
            s.put("t", "", "2", checkpoint={"x": object()}, metadata={}, values={}, versions={})
        with pytest.raises(durkv.SerializationError, match="'w'"):
            s.put_writes("t", "", "1", "task", [(0, "w", object())])
        with pytest.raises(TypeError):          # SerializationError is a TypeError too
            s.put("new", "", "1", checkpoint={}, metadata={}, values={"a": object()},
                  versions={"a": 1})
        assert backend_of(s).next_lsn == before and s.threads() == ["t"]
        s.put("t", "", "2", checkpoint={}, metadata={}, values={"a": [1, 2]}, versions={"a": 2})
        assert s.get("t").values == {"a": [1, 2]}
        assert s.get("t", "", "1").values == {"a": [1]}


def test_oversized_commit(url):
    with durkv.open(url, max_commit_bytes=10_000, compress_min_bytes=1 << 30) as s:
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"a": "ok"}, versions={"a": 1})
        with pytest.raises(durkv.FrameTooLargeError, match="max_commit_bytes"):
            s.put("t", "", "2", checkpoint={}, metadata={}, values={"a": "x" * 20_000},
                  versions={"a": 2})
        with pytest.raises(durkv.FrameTooLargeError):
            s.put_writes("t", "", "1", "task", [(0, "a", "x" * 20_000)])
        assert s.get("t").values == {"a": "ok"}
        s.put("t", "", "2", checkpoint={}, metadata={}, values={"a": "fine"}, versions={"a": 2})
        assert s.get("t").checkpoint_id == "2"


def test_bad_urls_and_options(tmp_path):
    with pytest.raises(durkv.ConfigError, match="memory://"):
        durkv.open("ftp://host/x")
    with pytest.raises(durkv.ConfigError, match="durability"):
        durkv.open("memory://", durability="sometimes")
    with pytest.raises(durkv.ConfigError, match="snapshot_every"):
        durkv.open("memory://", snapshot_every=0)
    with durkv.open(f"file://{tmp_path}/f") as s:
        s.put("t", "", "1", checkpoint={}, metadata={}, values={}, versions={})
    with durkv.open(str(tmp_path / "f")) as s:
        assert s.get("t").checkpoint_id == "1"
        with pytest.raises(durkv.ConfigError, match="durability"):
            s.put("t", "", "2", checkpoint={}, metadata={}, values={}, versions={},
                  durability="never")


def test_writer_creates_missing_parent_directories(tmp_path):
    path = tmp_path / "data" / "agents" / "a.durkv"
    with pytest.raises(durkv.NotFoundError):
        durkv.open(str(path), read_only=True)        # a reader never creates anything
    assert not (tmp_path / "data").exists()
    with durkv.open(str(path)) as s:
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"n": 1}, versions={"n": 1})
    with durkv.open(str(path), read_only=True) as s:
        assert s.get("t").values == {"n": 1}


def test_second_writer_is_refused(url):
    if not url.startswith("memory://"):
        pytest.skip("a local store takes several writers: test_second_writer_shares")
    with durkv.open(url) as s:
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"a": 1}, versions={"a": 1})
        with pytest.raises(durkv.StoreLockedError):
            durkv.open(url)
        s.put("t", "", "2", checkpoint={}, metadata={}, values={"a": 2}, versions={"a": 2})
        assert s.get("t").values == {"a": 2}


def test_second_writer_shares(tmp_path):
    # a local store: a second handle (here in the same process) writes too, and each
    # sees the other's commits on its next read (FORMAT.md 12)
    url = str(tmp_path / "s.durkv")
    with durkv.open(url) as s, durkv.open(url) as t:
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"a": 1}, versions={"a": 1})
        assert t.get("t").values == {"a": 1}
        t.put("t", "", "2", checkpoint={}, metadata={}, values={"a": 2}, versions={"a": 2})
        assert s.get("t").values == {"a": 2}
        s.append_journal("r", {"n": 1})
        t.append_journal("r", {"n": 2})
        assert [r["n"] for r in s.journal("r")] == [1, 2] == [r["n"] for r in t.journal("r")]
        with pytest.raises(durkv.StoreLockedError, match="alone"):
            s.compact()
    with durkv.open(url) as s:
        assert s.get("t").values == {"a": 2}
        s.compact()
        assert s.get("t").values == {"a": 2}
        assert s.verify().ok


def test_read_only_sees_a_consistent_prefix(url):
    with durkv.open(url, durability="async", snapshot_every=3) as w:
        expect, msgs, last = agent_run(w, 5)
        w.flush()
        r = durkv.open(url, read_only=True)
        with pytest.raises(durkv.ReadOnlyError):
            r.put("t", "", "x", checkpoint={}, metadata={}, values={}, versions={})
        seen = len(list(r.history("t")))
        assert seen == 5
        for k in range(3):
            more, msgs, last = agent_run(w, 3, start=5 + 3 * k, msgs=msgs, parent=last)
            expect.update(more)
            w.flush()
            r.refresh()
            cps = list(r.history("t"))
            assert len(cps) == 5 + 3 * (k + 1)
            for cp in cps:
                assert cp.values["msgs"] == expect[cp.checkpoint_id]
            assert r.get("t").values["msgs"] == expect[last]
        w.compact()
        r.refresh()
        assert r.get("t").values["msgs"] == expect[last]
        assert len(list(r.history("t"))) == len(expect)
        r.close()


def test_closed_store_refuses(url):
    s = durkv.open(url)
    s.close()
    s.close()
    with pytest.raises(durkv.StoreClosedError, match="closed; open it again"):
        s.get("t")


def test_commit_codec_round_trip_and_strictness():
    from durkv.payload import CommitEntry, decode_commit, encode_commit

    entries = [CommitEntry(FULL, [b"a", b"", b"bc"], 2), CommitEntry(DELTA, [b"x"], 1, 3, 77, 1),
               CommitEntry(SNAP, [b"\x01" * 12], 0)]
    payload = encode_commit(b"head", entries)
    assert decode_commit(payload) == (b"head", entries)
    with pytest.raises(durkv.CorruptionError):
        decode_commit(payload + b"\0")                    # trailing bytes
    bad_kind = bytearray(payload)
    bad_kind[4 + 4 + 4] = 9                                # first entry's kind byte
    with pytest.raises(durkv.CorruptionError):
        decode_commit(bytes(bad_kind))


def test_local_read_channel_agrees_with_python(tmp_path):
    from durkv.payload import resolve_channel

    with durkv.open(str(tmp_path / "s"), snapshot_every=3) as s:
        agent_run(s, 10)
        lane = index_of(s).ix.lane("t", "")
        for lsn in lane.lsns:
            ref = full_head(s, lsn).chans["msgs"]
            assert backend_of(s).read_channel(*ref) == resolve_channel(backend_of(s).read, *ref)
        assert s.verify(deep=True).ok


def test_concurrent_writers_threads(url):
    """Several Python threads committing at once (sync: they share fsyncs)."""
    import threading

    results: dict[str, dict] = {}
    errors = []
    with durkv.open(url, durability="sync", snapshot_every=4) as s:
        def worker(k):
            try:
                results[f"w{k}"] = agent_run(s, 25, thread=f"w{k}")[0]
                s.put_writes(f"w{k}", "", "000024", "task", [(0, "x", k)])
            except Exception as e:      # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        s.close()
        s = durkv.open(url)
        for t, expect in results.items():
            for cid, msgs in expect.items():
                assert s.get(t, "", cid).values["msgs"] == msgs
            assert [w.value for w in s.get(t).writes] == [int(t[1:])]
        s.close()


def test_history_walks_long_lanes_in_chunks_while_writing():
    with durkv.open("memory://") as s:
        for i in range(300):
            s.put("t", "", f"{i:04d}", checkpoint={}, metadata={}, values={"v": i},
                  versions={"v": i})
        ids = [c.checkpoint_id for c in s.history("t")]
        assert ids == [f"{i:04d}" for i in range(299, -1, -1)]
        assert [c.checkpoint_id for c in s.history("t", before="0200", limit=150)] == [
            f"{i:04d}" for i in range(199, 49, -1)]
        seen = []
        for k, c in enumerate(s.history("t")):
            seen.append(c.checkpoint_id)
            if k == 10:        # writes during the walk: newer ids are not yielded, none repeat
                s.put("t", "", "9999", checkpoint={}, metadata={}, values={}, versions={})
                s.prune(["t"], keep_last=250)
        assert seen == [f"{i:04d}" for i in range(299, 50, -1)]   # 0000..0050 pruned


class Msg:
    """A message object compared by value (like LangChain's messages)."""

    def __init__(self, id, text):
        self.id, self.text = id, text

    def __eq__(self, other):
        return isinstance(other, Msg) and (self.id, self.text) == (other.id, other.text)


class MsgSerde(durkv.serde.MsgpackSerde):
    def dumps(self, obj):
        return super().dumps([obj.id, obj.text] if isinstance(obj, Msg) else obj)

    def loads(self, b):
        v = super().loads(b)
        return Msg(*v) if isinstance(v, list) and len(v) == 2 else v


def _replace_at(msgs, pos, text):
    new = list(msgs)          # add_messages: copy, replace by id at its position
    new[pos] = Msg(msgs[pos].id, text)
    return new


def test_replaced_item_without_append_is_always_caught():
    with durkv.open("memory://", serde=MsgSerde()) as s:
        msgs = [Msg(i, f"m{i}") for i in range(10)]
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"m": msgs}, versions={"m": 1})
        new = _replace_at(s.get("t").values["m"], 3, "edited")
        s.put("t", "", "2", checkpoint={}, metadata={}, values={"m": new}, versions={"m": 2},
              parent_id="1")
        assert entry_kinds(s, "2") == [FULL]
        assert [m.text for m in s.get("t", "", "2").values["m"]][3] == "edited"


@pytest.mark.parametrize("mode", ["identity", "prefix"])
def test_replaced_item_plus_append(mode):
    with durkv.open("memory://", serde=MsgSerde(), delta_check=mode) as s:
        msgs = [Msg(i, f"m{i}") for i in range(10)]
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"m": msgs}, versions={"m": 1})
        # get() hands out new objects: the caller's own items keep the identity shortcut
        new = _replace_at(msgs, 3, "edited") + [Msg(10, "m10")]
        s.put("t", "", "2", checkpoint={}, metadata={}, values={"m": new}, versions={"m": 2},
              parent_id="1")
        # equal-by-value replacements are fine in both modes (the stored bytes are equal)
        same = [Msg(m.id, m.text) if i == 5 else m for i, m in enumerate(new)] + [Msg(11, "x")]
        s.put("t", "", "3", checkpoint={}, metadata={}, values={"m": same}, versions={"m": 3},
              parent_id="2")
        texts = [m.text for m in s.get("t", "", "2").values["m"]]     # read from the log
        if mode == "prefix":
            assert entry_kinds(s, "2") == [FULL] and texts[3] == "edited"
            assert s.get("t", "", "3").values["m"] == same
        else:
            # the documented boundary of the O(1) check: the replacement is not seen
            assert entry_kinds(s, "2") == [DELTA] and texts[3] == "m3"


# -- verify: one report shape for every backend (issue 16 item 6) ---------------------------

@pytest.mark.parametrize("kind", ["local", "memory"])
def test_verify_is_one_report_type_on_every_backend(tmp_path, kind):
    from durkv.backends.base import VerifyReport

    url = str(tmp_path / "s.durkv") if kind == "local" else "memory://verify-shape"
    with durkv.open(url) as s:
        for i in range(3):
            s.put("t", "", f"{i:04d}", checkpoint={}, metadata={}, values={"n": i},
                  versions={"n": i})
        for deep in (False, True):
            report = s.verify(deep=deep)
            assert type(report) is VerifyReport
            assert report.ok and report.damage == () and report.url == url
            assert report.frames == report.next_lsn - report.start_lsn >= 3
            assert report.to_dict()["frames"] == report.frames
        with pytest.raises(AttributeError):
            report.ok = False       # frozen


def test_verify_reports_damage_in_a_local_store(tmp_path):
    import logtools as lt

    path = tmp_path / "s.durkv"
    with durkv.open(str(path)) as s:
        for i in range(3):
            s.put("t", "", f"{i:04d}", checkpoint={}, metadata={}, values={"n": i},
                  versions={"n": i})
    lt.append_garbage(lt.segment_files(path)[-1], 40)  # a torn tail: a reader opens it
    with durkv.open(str(path), read_only=True) as s:
        report = s.verify(deep=True)
    assert not report.ok and report.damage
    assert all(isinstance(line, str) and "@" in line for line in report.damage)


def test_a_closed_handle_is_an_operational_error_on_every_layer(tmp_path):
    """Not ConfigError (exit 2, "usage"): the call was right, the handle is gone."""
    from durkv.backends import open_backend
    from durkv.cli.output import EXIT_ERROR, exit_code_for
    from durkv.log import SegmentLog

    log = SegmentLog.open(str(tmp_path / "log.durkv"))
    log.close()
    mem = open_backend("memory://closed-handle")
    mem.close()
    s = durkv.open(str(tmp_path / "s.durkv"))
    s.close()
    for call in (lambda: log.append(b"x"), lambda: mem.append(b"\0" * 8),
                 lambda: s.put("t", "", "1", checkpoint={}, metadata={}, values={},
                               versions={})):
        with pytest.raises(durkv.StoreClosedError, match="open it again") as err:
            call()
        assert not isinstance(err.value, durkv.ConfigError)
        assert err.value.code == "store_closed" and exit_code_for(err.value) == EXIT_ERROR


def test_store_prune_keeps_the_ids_given_and_any_newer(url):
    with durkv.open(url) as s:
        for i in range(6):
            s.put("t", "", f"{i:02d}", checkpoint={}, metadata={}, values={"n": i},
                  versions={"n": i + 1})
        s.prune(["t"], keep={("t", ""): ["01", "03"]})
        assert [c.checkpoint_id for c in s.history("t")] == ["05", "04", "03", "01"]
        for bad in ({"t": ["01"]}, [("t", "")], {("t", ""): [1]}):
            with pytest.raises(durkv.ConfigError):
                s.prune(["t"], keep=bad)
