"""DurkvSaver's metadata merge is LangGraph's ``get_checkpoint_metadata``, made cheaper.

``durkv.langgraph.checkpoint_metadata`` replaces LangGraph's function on the commit path
(it skips ChainMap's Python-level iteration). It must give the same dict -- keys, their
order and values -- for every config LangGraph or a user can pass; these cases hold the
two equal, and a real graph's stored metadata is what LangGraph's function makes.
"""

from __future__ import annotations

from collections import ChainMap, OrderedDict

import pytest

pytest.importorskip("langgraph.checkpoint.base")

from langgraph.checkpoint.base import get_checkpoint_metadata  # noqa: E402

from durkv.langgraph import DurkvSaver, checkpoint_metadata  # noqa: E402


class Text(str):
    pass


META = {"source": "loop", "step": 3, "parents": {}, "note": "a\x00b", "who": Text("x\x00")}
CONFIGS = [
    {},
    {"configurable": {"thread_id": "t", "checkpoint_ns": "", "__pregel_x": 1}},
    # LangGraph's loop: metadata is a ChainMap of one dict
    {"metadata": ChainMap({"thread_id": "t", "user": "u\x00v", "n": 2}),
     "configurable": {"thread_id": "t", "checkpoint_id": "c", "run": 7, "flag": True,
                      "ratio": 0.5, "obj": object(), "__pregel_runtime": object()}},
    # several maps: the first holding a key wins, in ChainMap's key order
    {"metadata": ChainMap({"a": 1, "b": "first"}, {"b": "second", "c": 3}, {"d": "x"})},
    # maps that are not plain dicts, nested ChainMaps
    {"metadata": ChainMap(OrderedDict(z=1, y=2), ChainMap({"y": 9, "w": "q"}))},
    {"metadata": ChainMap()},
    {"metadata": {"step": 99, "source": "not this", "extra": "e", "__hidden": 1}},
    {"metadata": OrderedDict(k="v"), "configurable": ChainMap({"m": 1}, {"m": 2, "o": "p"})},
    {"metadata": {"langgraph_step": 1, "langgraph_node": "n", "checkpoint_map": {},
                  "bytes": b"x", "none": None, "list": [1]}},
]


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
@pytest.mark.parametrize("metadata", [META, {}, ChainMap({"source": "input"})])
def test_same_as_langgraphs(config, metadata):
    want = get_checkpoint_metadata(config, metadata)
    got = checkpoint_metadata(config, metadata)
    assert got == want
    assert list(got) == list(want)                       # the same key order
    assert [type(v) for v in got.values()] == [type(v) for v in want.values()]


def test_a_graphs_stored_metadata_is_langgraphs():
    from durkv.cli.benchgraph import agent_graph, cfg

    seen = []

    class Recording(DurkvSaver):
        def put(self, config, checkpoint, metadata, new_versions):
            seen.append(get_checkpoint_metadata(config, metadata))
            return super().put(config, checkpoint, metadata, new_versions)

    with Recording.open("memory://") as saver:
        graph = agent_graph(3).compile(checkpointer=saver)
        config = cfg("t", 3)
        config["metadata"] = {"user": "ann", "attempt": 2}
        graph.invoke({"n": 0, "messages": []}, config)
        stored = [t.metadata for t in saver.list({"configurable": {"thread_id": "t"}})]
    assert stored[::-1] == seen
    assert all(m["user"] == "ann" and m["attempt"] == 2 for m in stored)


def test_a_filter_on_a_missing_key_matches_as_the_reference_savers_do(tmp_path):
    """{key: None} matches the checkpoints whose metadata lacks key: InMemorySaver and
    SqliteSaver read a missing key as None. (Before: DurkvSaver matched none, but did
    match with a checkpoint_id.)"""
    from langgraph.checkpoint.memory import InMemorySaver

    from durkv.langgraph import DurkvSaver

    cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    counts = {}
    with DurkvSaver.open(str(tmp_path / "s")) as durkv_saver:
        for name, saver in (("memory", InMemorySaver()), ("durkv", durkv_saver)):
            parent = cfg
            for i in range(3):
                ck = {"v": 1, "id": f"1ef00000-0000-6000-8000-00000000000{i}", "ts": "",
                      "channel_values": {}, "channel_versions": {}, "versions_seen": {}}
                parent = saver.put(parent, ck, {"step": i}, {})
            counts[name] = (len(list(saver.list(cfg, filter={"no_such_key": None}))),
                            len(list(saver.list(cfg, filter={"step": None}))),
                            len(list(saver.list(cfg, filter={"no_such_key": 1}))))
    assert counts["durkv"] == counts["memory"] == (3, 0, 0)
