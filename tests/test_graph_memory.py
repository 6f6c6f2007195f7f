"""What a durkv.Graph run keeps in memory (issue 18: "resident memory within 2x the final
state's size over the whole run, no per-superstep growth"): the newest state once, as the
objects, not also as their serialized bytes; no memory of every superstep's new items."""

from __future__ import annotations

import gc
import tracemalloc

import durkv

ITEM = 2048     # bytes of text each superstep appends


def text_loop(n: int) -> durkv.Graph:
    g = durkv.Graph({"messages": durkv.Append()})

    @g.node
    def agent(state, ctx):
        i = len(state["messages"])
        return {"messages": [(f"step {i} " * ITEM)[:ITEM]]}

    g.add_edge(durkv.START, "agent")
    g.add_conditional_edges("agent",
                            lambda s: "agent" if len(s["messages"]) < n else durkv.END)
    return g


def _held_after_run(store, n: int, run_id: str) -> tuple[int, int]:
    """(bytes allocated and still held once the run returned, the state's text bytes)."""
    app = text_loop(n).compile(store, max_supersteps=n + 1)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        res = app.run({}, run_id=run_id)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert res.status == "finished" and len(res.state["messages"]) == n
    return held, sum(len(m) for m in res.state["messages"])


def test_a_text_loop_keeps_its_newest_state_once(tmp_path):
    """The store kept each appended str twice (the object and its serialized bytes) and
    every recent checkpoint's new items (4,096 of them) for a late pending write: ~2x the
    state. Immutable items are their own copy; one checkpoint's items per lane suffice."""
    with durkv.open(str(tmp_path / "m.durkv"), durability="async") as store:
        _held_after_run(store, 3, "warm")   # the serializer's per-thread buffers: not state
        held, payload = _held_after_run(store, 800, "r")
        # the texts themselves are ~1.02x (a str's header), the index's checkpoint ids ~0.03x
        assert held <= 1.2 * payload, (held, payload)
        # and the state read back is the state put, as it is after a reopen
        want = store.get("r").values["messages"]
    with durkv.open(str(tmp_path / "m.durkv")) as again:
        assert again.get("r").values["messages"] == want
        assert len(want) == 800 and all(len(m) == ITEM for m in want)


def test_no_per_superstep_growth_beyond_the_state(tmp_path):
    """Twice the supersteps hold twice the state, not more: what grows per superstep is
    the new item (plus the checkpoint's id in the index), not a copy of it."""
    with durkv.open(str(tmp_path / "m.durkv"), durability="async") as store:
        small, p_small = _held_after_run(store, 300, "a")
        big, p_big = _held_after_run(store, 900, "b")
    per_step = (big - small) / (900 - 300)
    assert per_step <= 1.25 * ITEM, (per_step, small, big)
    assert p_big == 3 * p_small


def test_a_list_of_texts_and_dicts_reads_back_fresh_and_equal(tmp_path):
    """Texts are handed out as themselves (immutable); every other item is deserialized
    afresh, so an edit of what get() returned never reaches the committed state."""
    with durkv.open(str(tmp_path / "m.durkv")) as s:
        v = ["a", {"k": [1]}, b"raw", 7, None]
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"l": v}, versions={"l": 1})
        v2 = v + [{"k": [2]}, "b"]
        s.put("t", "", "2", checkpoint={}, metadata={}, values={"l": v2}, versions={"l": 2},
              parent_id="1")
        got = s.get("t").values["l"]
        assert got == v2 and [type(x) for x in got] == [type(x) for x in v2]
        assert got[1] is not v2[1] and got[5] is not v2[5]
        got[1]["k"].append(9)
        got.append("extra")
        assert s.get("t").values["l"] == v2
        s.put("t", "", "3", checkpoint={}, metadata={}, values={"l": v2 + ["c"]},
              versions={"l": 3}, parent_id="2")
    with durkv.open(str(tmp_path / "m.durkv")) as s:
        assert s.get("t").values["l"] == v2 + ["c"]
        assert s.get("t", "", "2").values["l"] == v2


def _undo(result, *, idempotency_key):
    return None


@durkv.tool(compensate=_undo)
def _act(i, *, idempotency_key):
    return f"receipt {i} " * 200        # ~2 KiB


def durable_loop(n: int) -> durkv.Graph:
    """Each superstep records a model call and a compensable tool call (~2 KiB each)."""
    g = durkv.Graph({"count": durkv.Last(0)})

    @g.node
    def agent(state, ctx):
        ctx.step("model", lambda i: f"reply {i} " * 200, state["count"])
        ctx.tool(_act, state["count"])
        return {"count": state["count"] + 1}

    g.add_edge(durkv.START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["count"] < n else durkv.END)
    return g


def _peak_of_run(store, n: int, run_id: str) -> int:
    app = durable_loop(n).compile(store, max_supersteps=n + 1)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        res = app.run({}, run_id=run_id)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert res.status == "finished" and res.state == {"count": n}
    return peak


def test_a_run_with_durable_calls_holds_one_supersteps_records(tmp_path):
    """The run's folded journal kept every recorded result of the execution, and its undo
    list every compensable tool's result (the graph's undos are each task's ctx's): ~4 KiB
    more per superstep here, for the whole run. Committed supersteps' records are settled."""
    with durkv.open(str(tmp_path / "d.durkv"), durability="async") as store:
        _peak_of_run(store, 3, "warm")
        small = _peak_of_run(store, 100, "a")
        big = _peak_of_run(store, 500, "b")
        # the state is one int: what a superstep leaves behind is its checkpoint's index
        # entry and the journal's (~0.2 KiB), never its 4 KiB of results
        assert (big - small) / 400 <= 512, (small, big)
        # and the results are recorded: a finished run replays from its journal
        assert len(store.journal("b")) >= 2 * 500
