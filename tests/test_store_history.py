"""``Store.history``: older list values derived from newer ones, headers-only listings.

Every test compares what ``history`` yields with what was put and with what
``get`` reads for the same checkpoint (``get`` of an older checkpoint reads its
channels from the log with ``read_channel``: an independent path); the long loop
also checks ``channel_entries`` against what was put (``check_entries``).
"""

from __future__ import annotations



import durkv
from storeinternals import backend_of, full_head, index_of





def msg(tag, i):
    return {"role": "ai", "id": f"{tag}-{i}", "content": f"message {i} of {tag} " * 3}


class Loop:
    """An agent loop on one thread that records what each checkpoint holds.

    Each step builds a NEW list holding the same message objects (LangGraph's
    ``operator.add``); most steps append one message, some several, some none
    (the channel is then left out of ``values``: unchanged, same entry), and now
    and then a step replaces an item (a FULL entry). ``state`` (a dict) changes
    every 5 steps, ``n`` (an int) every step.
    """

    def __init__(self, store, thread, expect, *, tag=None, start=0):
        self.store, self.thread, self.expect = store, thread, expect
        self.tag = tag or thread
        self.msgs: list = []
        self.state: dict = {}
        self.parent: str | None = None
        self.i = start

    def cid(self, i):
        return f"{i:06d}"

    def step(self, *, cid=None, parent="head", count=None):
        i = self.i
        self.i += 1
        cid = cid or self.cid(i)
        values = {"n": i}
        k = count if count is not None else (0 if i % 7 == 3 else 3 if i % 11 == 5 else 1)
        if i % 53 == 52 and self.msgs:
            self.msgs = [msg(self.tag, -i)] + self.msgs[1:]       # replaced: a FULL entry
            values["msgs"] = self.msgs
        if k:
            self.msgs = self.msgs + [msg(self.tag, f"{i}.{j}") for j in range(k)]
            values["msgs"] = self.msgs
        if i % 5 == 0 or not self.state:
            self.state = {"plan": f"plan {i // 5}", "todo": list(range(i % 4))}
            values["state"] = self.state
        par = self.parent if parent == "head" else parent
        self.store.put(self.thread, "", cid, checkpoint={"id": cid, "i": i},
                       metadata={"step": i, "source": "loop"}, values=values,
                       versions={"msgs": i, "n": i, "state": i}, parent_id=par)
        self.expect[(self.thread, cid)] = {
            "values": {"msgs": list(self.msgs), "n": i, "state": dict(self.state)},
            "parent": par, "metadata": {"step": i, "source": "loop"}}
        self.parent = cid
        return cid

    def run(self, n):
        for _ in range(n):
            self.step()


def check(store, expect, thread=None, *, compare_get=True):
    """history(thread) yields exactly the expected checkpoints, newest first, with the
    values that were put and that get() reads; returns the yielded checkpoints."""
    want = {k: v for k, v in expect.items() if thread is None or k[0] == thread}
    got = list(store.history(thread))
    ids = [c.checkpoint_id for c in got]
    assert ids == sorted(ids, reverse=True)
    assert sorted((c.thread_id, c.checkpoint_id) for c in got) == sorted(want)
    for c in got:
        w = want[(c.thread_id, c.checkpoint_id)]
        assert c.values == w["values"], (c.thread_id, c.checkpoint_id)
        assert c.parent_id == w["parent"]
        assert c.metadata == w["metadata"]
        if compare_get:
            g = store.get(c.thread_id, "", c.checkpoint_id)
            assert g.values == c.values, (c.thread_id, c.checkpoint_id)
            assert [(x.task_id, x.idx, x.value) for x in g.writes] == [
                (x.task_id, x.idx, x.value) for x in c.writes]
    return got


def check_entries(store, expect, thread, channel="msgs"):
    """channel_entries(thread) keeps its promise against what was put: an "append" is
    exactly what the checkpoint's value adds to its parent's, a "full" is its whole
    value, a checkpoint whose parent the thread no longer holds (or has none) is listed
    whole, and one left out holds its parent's value. Returns the entries."""
    want = {cid: v for (t, cid), v in expect.items() if t == thread}
    got = [(e.checkpoint_id, e.kind, e.value)
           for e in store.channel_entries(thread, "", channel)]
    assert [c for c, _k, _v in got] == sorted((c for c, _k, _v in got), reverse=True)
    listed = {c: (k, v) for c, k, v in got}
    for cid, w in want.items():
        value = w["values"][channel]
        parent = w["parent"] if w["parent"] in want else None
        if cid not in listed:
            assert parent is not None and want[parent]["values"][channel] == value, cid
            continue
        kind, v = listed[cid]
        if kind == "append":
            assert parent is not None, cid
            assert want[parent]["values"][channel] + v == value, cid
        else:       # a fork's, a replaced item's or one whose parent is gone: whole
            assert (kind, v) == ("full", value), cid
    return got


def forget(expect, thread, keep):
    for k in [k for k in expect if k[0] == thread and k[1] not in keep]:
        del expect[k]


def test_long_loop_with_forks_copies_prunes_compaction_and_reopen(url):
    opts = dict(snapshot_every=4, durability="exit", compress_min_bytes=64)
    expect: dict = {}
    s = durkv.open(url, **opts)
    try:
        a = Loop(s, "a", expect)
        a.run(150)
        s.put_writes("a", "", a.cid(120), "task-1", [(0, "msgs", ["w"]), (1, "x", 1)])
        # a fork off step 100 (time travel), continued for 40 steps: FULL entries at the fork
        fork = Loop(s, "a", expect, tag="fork", start=1000)
        base = expect[("a", a.cid(100))]["values"]
        fork.msgs, fork.state = list(base["msgs"]), dict(base["state"])
        fork.step(parent=a.cid(100))
        fork.run(39)
        a.i = 2000         # the main branch goes on after the fork (ids above the fork's)
        a.run(150)
        check(s, expect, "a")
        # a second thread, ids interleaved with a's: history() over all threads alternates
        b = Loop(s, "b", expect)
        b.i = 3000
        for _ in range(60):
            b.step()
            a.step()
        check(s, expect)
        # copy a thread (shares its frames), then continue the copy
        s.copy_thread("a", "c")
        for (t, cid), v in list(expect.items()):
            if t == "a":
                expect[("c", cid)] = v
        c = Loop(s, "c", expect)
        c.msgs, c.state, c.parent, c.i = list(a.msgs), dict(a.state), a.parent, 5000
        c.run(30)
        check(s, expect)
        entries = {t: check_entries(s, expect, t) for t in "abc"}
        assert entries["c"][-len(entries["a"]):] == entries["a"]     # the copy's history
        s.compact()
        check(s, expect)
        assert {t: check_entries(s, expect, t) for t in "abc"} == entries
        s.prune(["b"], keep_last=25)
        forget(expect, "b", {b.cid(i) for i in range(b.i - 25, b.i)})
        check(s, expect, "b")
        entries["b"] = check_entries(s, expect, "b")
        assert entries["b"][-1][1] == "full"          # the oldest kept: its parent is gone
        s.close()
        s = durkv.open(url, **opts)
        check(s, expect)
        assert {t: check_entries(s, expect, t) for t in "abc"} == entries
        s.compact()
        check(s, expect)
        assert {t: check_entries(s, expect, t) for t in "abc"} == entries
        b.store = s
        b.run(20)                      # reopened and compacted: the chains go on
        s.prune(["b"], keep_last=30)
        forget(expect, "b", {b.cid(i) for i in range(b.i - 30, b.i)})
        entries["b"] = check_entries(s, expect, "b")
        s.close()
        s = durkv.open(url, read_only=True)
        check(s, expect)
        assert {t: check_entries(s, expect, t) for t in "abc"} == entries
    finally:
        s.close()


def test_values_match_get_and_history_reads_each_chain_once(url):
    """A linear loop reads the list channel from the log once for the whole listing,
    and each distinct non-list entry once; the rest is derived."""
    expect: dict = {}
    with durkv.open(url, snapshot_every=4) as s:
        loop = Loop(s, "t", expect)
        loop.run(300)
        calls = []
        real = backend_of(s).read_channel

        def counting(lsn, idx):
            calls.append((lsn, idx))
            return real(lsn, idx)

        backend_of(s).read_channel = counting
        got = list(s.history("t"))
        backend_of(s).read_channel = real
        assert len(got) == 300
        for c in got:
            assert c.values == expect[("t", c.checkpoint_id)]["values"]
        refs = {(ch, tuple(r)) for c in got for ch, r in _refs(s, c.checkpoint_id).items()}
        list_reads = [r for r in calls if ("msgs", r) in refs]
        state_refs = {r for ch, r in refs if ch == "state"}
        n_refs = {r for ch, r in refs if ch == "n"}
        full_msgs = 1 + sum(1 for i in range(300) if i % 53 == 52)   # replaced = FULL
        assert len(list_reads) <= full_msgs
        assert len(set(calls)) == len(calls)          # no entry is read twice
        assert len(calls) - len(list_reads) <= len(state_refs) + len(n_refs)
        check(s, expect, "t")


def _refs(store, cid, thread="t"):
    lane = index_of(store).ix.lane(thread, "")
    return full_head(store, lane.lsns[lane.find(cid)]).chans   # delta or not


def test_mutating_a_yielded_value_does_not_leak_into_the_next(url):
    expect: dict = {}
    with durkv.open(url, snapshot_every=4) as s:
        Loop(s, "t", expect).run(60)
        seen = 0
        for c in s.history("t"):
            assert c.values == expect[("t", c.checkpoint_id)]["values"]
            c.values["msgs"].append("junk")
            c.values["msgs"][0] = "junk"
            c.values["state"]["plan"] = "junk"       # a dict: deserialized afresh each time
            c.values["state"]["todo"].append(99)
            del c.values["n"]
            seen += 1
        assert seen == 60
        # two checkpoints with the same value get two list objects
        a, b = list(s.history("t", limit=2))
        assert a.values["msgs"] is not b.values["msgs"]


def test_list_edge_cases(url):
    """Shrinks, replacements, empty lists, non-list values turning into lists and back."""
    with durkv.open(url, snapshot_every=2) as s:
        seq = [[], [1], [1, 2], [1, 2], [1, 2, 3, 4, 5], [9, 2, 3], [9, 2, 3, 4], "text",
               ["x"], ["x", "y"], ["x", "y"], {"d": 1}, {"d": 1}, [], [[1], [2]], [[1], [2], 3]]
        for i, v in enumerate(seq):
            s.put("t", "", f"{i:03d}", checkpoint={}, metadata={"i": i}, values={"v": v},
                  versions={"v": i})
        got = list(s.history("t"))
        assert [c.values["v"] for c in got] == seq[::-1]
        for c in got:
            assert s.get("t", "", c.checkpoint_id).values == c.values
        # a channel left unchanged (same entry) for several checkpoints
        s.put("t", "", "100", checkpoint={}, metadata={}, values={"w": 1},
              versions={"v": 99, "w": 1})
        s.put("t", "", "101", checkpoint={}, metadata={}, values={"w": 2},
              versions={"v": 99, "w": 2})
        vs = [c.values for c in s.history("t", limit=3)]
        assert vs == [{"v": [[1], [2], 3], "w": 2}, {"v": [[1], [2], 3], "w": 1},
                      {"v": [[1], [2], 3]}]


def test_before_limit_and_filter_still_derive_correctly(url):
    expect: dict = {}
    with durkv.open(url, snapshot_every=3) as s:
        loop = Loop(s, "t", expect)
        loop.run(80)
        for before in (None, loop.cid(50), loop.cid(7)):
            for c in s.history("t", before=before, limit=20):
                assert c.values == expect[("t", c.checkpoint_id)]["values"]
        odd = list(s.history("t", filter={"source": "loop"}))
        assert len(odd) == 80
        for c in odd:
            assert c.values == expect[("t", c.checkpoint_id)]["values"]


def test_headers_only(url):
    expect: dict = {}
    with durkv.open(url, snapshot_every=4) as s:
        a = Loop(s, "a", expect)
        a.run(40)
        Loop(s, "b", expect).run(10)
        s.put_writes("a", "", a.cid(3), "task", [(0, "msgs", 1)])
        full = list(s.history())
        calls = []
        real = backend_of(s).read_channel
        backend_of(s).read_channel = lambda *r: calls.append(r) or real(*r)
        heads = list(s.history(values=False))
        backend_of(s).read_channel = real
        assert not calls
        assert [(c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_id, c.checkpoint,
                 c.metadata, c.versions) for c in heads] == [
            (c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_id, c.checkpoint,
             c.metadata, c.versions) for c in full]
        assert all(c.values == {} and c.writes == [] for c in heads)
        assert [c.checkpoint_id for c in s.history("a", values=False, limit=3,
                                                   before=a.cid(10))] == [
            a.cid(9), a.cid(8), a.cid(7)]
        assert [c.checkpoint_id for c in s.history("a", values=False,
                                                   filter={"step": 5})] == [a.cid(5)]


def test_compaction_and_puts_during_a_walk(url):
    """The memo is keyed by entry refs, which are never reused: a compaction in the
    middle of a walk (every ref rewritten) only costs reads, never a wrong value."""
    expect: dict = {}
    with durkv.open(url, snapshot_every=4) as s:
        loop = Loop(s, "t", expect)
        loop.run(120)
        seen = []
        for k, c in enumerate(s.history("t")):
            assert c.values == expect[("t", c.checkpoint_id)]["values"], c.checkpoint_id
            seen.append(c.checkpoint_id)
            if k == 30:
                s.compact()
            if k == 60:
                loop.run(5)                  # newer ids: not yielded by this walk
                s.prune(["t"], keep_last=100)
                s.compact()
        assert seen == [loop.cid(i) for i in range(119, 24, -1)]


def test_channel_entries_with_compaction_and_puts_during_the_walk(url):
    """A compaction in the middle of a channel_entries walk (every LSN rewritten, the
    parent heads the walk kept included) changes nothing it yields; a prune in the middle
    makes the oldest kept checkpoint report its whole value, as a new walk would."""
    expect: dict = {}
    with durkv.open(url, snapshot_every=4) as s:
        loop = Loop(s, "t", expect)
        loop.run(120)
        first = [(e.checkpoint_id, e.kind, e.value) for e in s.channel_entries("t", "", "msgs")]
        seen = []
        for k, e in enumerate(s.channel_entries("t", "", "msgs")):
            seen.append((e.checkpoint_id, e.kind, e.value))
            if k == 30:
                s.compact()
            if k == 60:
                loop.run(5)                  # newer ids: not yielded by this walk
                s.prune(["t"], keep_last=100)
                s.compact()
        last = [(e.checkpoint_id, e.kind, e.value) for e in s.channel_entries("t", "", "msgs")]
        assert seen[:62] == first[:62]
        tail = {c for c, _k, _v in seen[62:]}
        assert seen[62:] == [x for x in last if x[0] in tail]
        assert seen[-1][0] == loop.cid(25) and seen[-1][1] == "full"
        check_entries(s, {k: v for k, v in expect.items()
                          if k[1] >= loop.cid(25)}, "t")


def test_channel_entries_end_when_the_thread_is_deleted_during_the_walk(url):
    """Once the thread is deleted, a walk under way yields nothing more (its parents are
    gone too: there is nothing left to tell an append from)."""
    expect: dict = {}
    with durkv.open(url) as s:
        Loop(s, "t", expect).run(20)
        seen = []
        for e in s.channel_entries("t", "", "n"):
            seen.append(e.checkpoint_id)
            if len(seen) == 5:
                s.delete_thread("t")
        assert len(seen) == 5
