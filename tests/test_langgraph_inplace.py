"""A node that edits an item of the state in place and writes it again.

LangGraph hands nodes the channel values themselves. A node may edit a message of the
state in place and return it: ``add_messages`` replaces it by id with the same object. The
graph's result has the edit, and so do SqliteSaver's and InMemorySaver's checkpoints,
which serialize the whole state. durkv compares list items by object (one memcmp), so
before this test the same object at the same position read as unchanged: ``get_state``
and a reopened store kept the old text (review rev2, seventeenth session). A task's
pending writes name the objects it wrote; one the newest list state holds makes the next
put store that channel whole.
"""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402

import durkv  # noqa: E402
from durkv.langgraph import DurkvSaver  # noqa: E402

CFG = {"configurable": {"thread_id": "t"}}


class State(TypedDict):
    messages: Annotated[list, add_messages]
    notes: list
    log: Annotated[list, operator.add]


def _graph(edit):
    def draft(s):
        return {"messages": [AIMessage("draft reply", id="ai-1")], "notes": [{"n": 1}],
                "log": ["drafted"]}
    b = StateGraph(State)
    b.add_node("draft", draft)
    b.add_node("edit", edit)
    b.add_edge(START, "draft")
    b.add_edge("draft", "edit")
    b.add_edge("edit", END)
    return b


def _redact(s):
    m = s["messages"][-1]
    m.content = "REDACTED reply"        # in place, and returned: replaced by id
    s["notes"][0]["n"] = 2              # a dict of a plain list, in place, the list returned
    return {"messages": [m], "notes": s["notes"], "log": ["redacted"]}


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_an_item_edited_in_place_and_returned_is_checkpointed(tmp_path, durability):
    path = str(tmp_path / "s.durkv")
    with DurkvSaver.open(path) as saver:
        g = _graph(_redact).compile(checkpointer=saver)
        out = g.invoke({"messages": [HumanMessage("hi", id="h-1")], "notes": [], "log": []},
                       CFG, durability=durability)
        assert out["messages"][-1].content == "REDACTED reply"
        st = g.get_state(CFG).values
        assert st["messages"][-1].content == "REDACTED reply"
        assert st["notes"] == [{"n": 2}] and st["log"] == ["drafted", "redacted"]
        assert type(st["messages"][-1]) is AIMessage
    with DurkvSaver.open(path) as saver:
        st = _graph(_redact).compile(checkpointer=saver).get_state(CFG).values
        assert [m.content for m in st["messages"]] == ["hi", "REDACTED reply"]
        assert st["notes"] == [{"n": 2}]
    assert durkv.log.verify(str(tmp_path / "s.durkv")).ok


def test_a_message_returned_again_unchanged_stays_once(tmp_path):
    """The same object returned without an edit: stored whole once more, read back the
    same (no second copy of the message in the state)."""
    def again(s):
        return {"messages": [s["messages"][-1]]}
    path = str(tmp_path / "s.durkv")
    with DurkvSaver.open(path) as saver:
        g = _graph(again).compile(checkpointer=saver)
        g.invoke({"messages": [HumanMessage("hi", id="h-1")], "notes": [], "log": []}, CFG)
    with DurkvSaver.open(path) as saver:
        st = _graph(again).compile(checkpointer=saver).get_state(CFG).values
        assert [(m.id, m.content) for m in st["messages"]] == [("h-1", "hi"),
                                                               ("ai-1", "draft reply")]


def test_the_store_sees_an_item_written_again_by_a_task(tmp_path):
    """The same at the store: a list put, one of its items edited in place and written
    by a task, the same list put again: the edit is stored."""
    with durkv.open(str(tmp_path / "s.durkv")) as store:
        item = {"text": "draft"}
        items = [{"text": "hi"}, item]
        store.put("t", "", "0001", checkpoint={}, metadata={}, values={"m": items},
                  versions={"m": 1})
        item["text"] = "REDACTED"
        store.put_writes("t", "", "0001", "task-1", [(0, "m", [item])])
        store.put("t", "", "0002", checkpoint={}, metadata={}, values={"m": items},
                  versions={"m": 2}, parent_id="0001")
        assert store.get("t").values["m"] == [{"text": "hi"}, {"text": "REDACTED"}]
    with durkv.open(str(tmp_path / "s.durkv"), read_only=True) as store:
        assert store.get("t").values["m"] == [{"text": "hi"}, {"text": "REDACTED"}]
        assert store.get("t", "", "0001").values["m"] == [{"text": "hi"}, {"text": "draft"}]


def test_a_late_write_flags_only_items_its_task_saw(tmp_path):
    """Under LangGraph's ``async`` a task's writes may land after later checkpoints. Its
    task saw only the items of its own checkpoint: a late write of an item added after
    it (serialized by the put that added it, after the task ran) flags nothing -- the
    next put stays a delta -- while one of an item its checkpoint held still does."""
    with durkv.open(str(tmp_path / "s.durkv")) as store:
        old, new = {"text": "old"}, {"text": "new"}
        items = [old]
        store.put("t", "", "0001", checkpoint={}, metadata={}, values={"m": items},
                  versions={"m": 1})
        items.append(new)       # the task on 0001 made `new`; 0002 holds it
        store.put("t", "", "0002", checkpoint={}, metadata={}, values={"m": items},
                  versions={"m": 2}, parent_id="0001")
        chans = store._writer._index.ix.lane("t", "").newest.chans
        store.put_writes("t", "", "0001", "task-1", [(0, "m", [new])])     # late
        assert not chans["m"].rewritten
        old["text"] = "edited"
        store.put_writes("t", "", "0001", "task-2", [(0, "m", [old])])     # late, seen by it
        assert chans["m"].rewritten
        store.put("t", "", "0003", checkpoint={}, metadata={}, values={"m": items},
                  versions={"m": 3}, parent_id="0002")
        assert store.get("t").values["m"] == [{"text": "edited"}, {"text": "new"}]
