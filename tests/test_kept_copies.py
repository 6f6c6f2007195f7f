"""A list channel's plain-data items kept as durkv's own decoded-form copies.

Under LangGraph's JsonPlusSerializer the newest state keeps a plain-data item (dicts
with str keys, lists, str/bytes/int/float/bool/None leaves) as a copy in the form
deserializing its bytes builds, and get() hands out a fresh copy of that instead of
deserializing (kernel/store/delta.py, ``_kept_items``). What must hold: get() returns
exactly what deserializing the stored bytes returns -- the same values and types, for
every value whose round trip through the serializer changes it too -- and the caller
owns it; the copy is of the value that was serialized, whatever is done to the caller's
object after the put; a serializer that reads otherwise gets bytes, not copies.
"""

from __future__ import annotations

import datetime
import math
import threading
from typing import Annotated

import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

import durkv
from durkv._listprefix import decoded_copy
from durkv.errors import SerializationError
from durkv.langgraph_serde import LangGraphSerde, same_typed


class Str(str):
    pass


class Int(int):
    pass


def _deep(n):
    v = {"leaf": 1}
    for _ in range(n):
        v = {"in": v}
    return v


# each: a value whose read back decoded_copy must match, or refuse to copy
HOSTILE = [
    {"role": "ai", "content": "x" * 3000, "id": "m1"},
    {"é": "\u4e2d\U0001f600", "n": None, "t": True, "f": False},
    {"lone": "\ud800"},                          # surrogate: packed as U+FFFD
    {"key\udfff": 1},
    {"big": 2 ** 64 - 1, "neg": -2 ** 63},
    {"over": 2 ** 64},                           # past msgpack's ints
    {"under": -2 ** 63 - 1},
    {"tuple": (1, 2, [3])},                      # read back as a list
    {"nan": math.nan, "negzero": -0.0, "inf": math.inf, "tiny": 5e-324},
    {"bytes": b"\x00\xff", "empty": b""},
    {"bytearray": bytearray(b"ab")},
    {"str_sub": Str("s")},
    {"int_sub": Int(3)},
    {1: "int key"},
    {"set": {1, 2}},
    {"when": datetime.datetime(2026, 12, 5, 12, 0)},
    {"msg": AIMessage(content="hi", id="a1")},
    [1, [2, [3, {"x": []}]], {}],
    [],
    {},
    _deep(63),
    _deep(70),                                   # past the copy's depth: bytes
    {"order": 1, "by": 2, "insertion": 3},
    "a\ud800b",                                  # an item itself: kept as bytes, not itself
    2 ** 64,
    -2 ** 63 - 1,
]


def _serde():
    return LangGraphSerde(JsonPlusSerializer())


def _read_back(serde, v):
    try:
        b = serde.dumps(v)
    except Exception:   # noqa: BLE001 - the serializer refuses it: nothing to compare
        return None
    return (serde.loads(b),)


def _put(s, cid, parent, items):
    s.put("t", "", cid, checkpoint={}, metadata={}, values={"m": items},
          versions={"m": int(cid[1:])}, parent_id=parent)


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_a_plain_item_reads_back_as_the_serializer_reads_it(tmp_path, value):
    serde = _serde()
    want = _read_back(serde, value)
    path = str(tmp_path / "s.durkv")
    if want is None:            # the serializer refuses it: so does the put, keeping none
        with durkv.open(path, serde=_serde()) as s:
            _put(s, "c1", None, [{"ok": 1}])
            with pytest.raises(SerializationError):
                _put(s, "c2", "c1", [{"ok": 1}, value])
            assert s.get("t", "").values["m"] == [{"ok": 1}]
        return
    with durkv.open(path, serde=_serde()) as s:
        _put(s, "c1", None, [value])                  # FULL
        _put(s, "c2", "c1", [value, value])           # a DELTA on it
        got = s.get("t", "").values["m"]
        assert same_typed(got, [want[0], want[0]])
        assert got[0] is not got[1] or type(got[0]) not in (dict, list)
        hist = [h.values["m"] for h in s.history("t", "")]
    with durkv.open(path, serde=_serde()) as s:        # the log's bytes, decoded
        assert same_typed(s.get("t", "").values["m"], got)
        _put(s, "c3", "c2", [value, value, value])    # the loaded state extended
        assert same_typed(s.get("t", "").values["m"], [want[0]] * 3)
    assert same_typed(hist, [[want[0]] * 2, [want[0]]])


def test_decoded_copy_refuses_what_the_round_trip_changes():
    for v in ({"t": (1,)}, {"s": "\ud800"}, {"k\ud800": 1}, {"i": 2 ** 64}, {"i": -2 ** 63 - 1},
              {"x": Str("a")}, {"x": Int(1)}, {1: 2}, {"x": bytearray()}, _deep(70), (1,),
              AIMessage(content="x")):
        assert decoded_copy(v) is None, v
    v = {"a": [1, {"b": "c"}], "d": b"e"}
    c = decoded_copy(v)
    assert c == v and c is not v and c["a"] is not v["a"] and c["a"][1] is not v["a"][1]
    assert c["d"] is v["d"]                       # an immutable leaf is shared


def test_the_caller_owns_what_get_returns_and_the_put_objects_stay_theirs(tmp_path):
    with durkv.open(str(tmp_path / "s.durkv"), serde=_serde()) as s:
        item = {"role": "ai", "content": "one", "tags": ["a"]}
        _put(s, "c1", None, [item])
        item["content"] = "edited after the put"     # the caller's object, changed
        item["tags"].append("b")
        got = s.get("t", "").values["m"]
        assert got == [{"role": "ai", "content": "one", "tags": ["a"]}]
        got[0]["content"] = "edited get() output"
        got[0]["tags"].append("c")
        got.append("more")
        assert s.get("t", "").values["m"] == [{"role": "ai", "content": "one", "tags": ["a"]}]
        c = s._index.ix.lane("t", "").newest.chans["m"]
        assert type(c.raw[0]) is dict and c.as_is      # kept as a copy, not bytes


def test_a_copy_is_of_the_value_serialized_while_another_thread_edits_it(tmp_path):
    """The put copies an item before serializing and serializes the copy: what get()
    hands out from memory is what the log holds, however a racing thread edits it."""
    path = str(tmp_path / "s.durkv")
    stop = threading.Event()
    item = {"n": 0, "xs": []}

    def edit():
        i = 0
        while not stop.is_set():
            i += 1
            item["n"] = i
            item["xs"].append(i)
            if len(item["xs"]) > 50:
                item["xs"].clear()

    t = threading.Thread(target=edit)
    t.start()
    try:
        with durkv.open(path, serde=_serde()) as s:
            items = []
            for i in range(1, 200):
                items = items + [item]
                _put(s, f"c{i}", f"c{i - 1}" if i > 1 else None, items)
            mem = s.get("t", "").values["m"]
    finally:
        stop.set()
        t.join()
    with durkv.open(path, serde=_serde()) as s:
        assert same_typed(s.get("t", "").values["m"], mem)


class _OtherSerde(JsonPlusSerializer):
    """A serializer of its own (a subclass): its reading is not taken for LangGraph's."""


def test_another_serializer_gets_bytes_not_copies(tmp_path):
    serde = _serde()
    with durkv.open(str(tmp_path / "s.durkv"), serde=serde) as s:
        _put(s, "c1", None, [{"a": 1}])
        serde.serde = _OtherSerde()                    # swapped in place, as saver.serde=
        _put(s, "c2", "c1", [{"a": 1}, {"b": 2}])
        c = s._index.ix.lane("t", "").newest.chans["m"]
        assert type(c.raw[0]) is dict and type(c.raw[1]) is bytes
        assert s.get("t", "").values["m"] == [{"a": 1}, {"b": 2}]
    assert LangGraphSerde(_OtherSerde()).plain_tag is None
    with durkv.open(str(tmp_path / "d.durkv")) as s:   # durkv's own serde: bytes
        _put(s, "c1", None, [{"a": 1}])
        assert type(s._index.ix.lane("t", "").newest.chans["m"].raw[0]) is bytes


# ---- LangChain messages kept by their fields once decoded --------------------------------

class MessagesState(TypedDict):
    messages: Annotated[list, add_messages]


class MyAI(AIMessage):
    """A user's subclass: not a type LangGraph always allows, so never kept as fields."""


def _messages():
    from langchain_core.documents import Document
    from langchain_core.messages import (HumanMessage, RemoveMessage, SystemMessage,
                                         ToolMessage)
    return [
        SystemMessage(content="be brief", id="s0"),
        HumanMessage(content=[{"type": "text", "text": "hi"}, "there"], id="h1",
                     additional_kwargs={"meta": {"nested": [1, 2.5, None]}}),
        AIMessage(content="x" * 2000, id="a1",
                  tool_calls=[{"name": "t", "args": {"q": [1, {"r": "s"}]}, "id": "c1"}],
                  usage_metadata={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
                  response_metadata={"model": "m", "stop": None}),
        ToolMessage(content="result", tool_call_id="c1", id="t1", artifact={"rows": [1, 2]}),
        ToolMessage(content="when", tool_call_id="c2", id="t2",
                    artifact={"at": datetime.datetime(2026, 12, 5)}),   # not plain data
        AIMessage(content="extra", id="a2", custom_field=[1, 2]),       # pydantic extra
        AIMessage(content="tuple", id="a3", response_metadata={"t": (1, 2)}),
        RemoveMessage(id="a0"),
        Document(page_content="doc", metadata={"k": "v"}, id="d1"),
        MyAI(content="mine", id="m1"),
    ]


def _state_of(m):
    """Everything pydantic holds of a model, as compared values."""
    return (type(m), m.__dict__, m.__pydantic_fields_set__, m.__pydantic_extra__,
            m.__pydantic_private__)


def _same_model(a, b):
    sa, sb = _state_of(a), _state_of(b)
    return (sa[0] is sb[0] and same_typed(sa[1], sb[1]) and sa[2] == sb[2]
            and same_typed(sa[3], sb[3]) and sa[4] == sb[4] and a == b
            and a.model_dump() == b.model_dump())


def test_messages_read_again_are_what_decoding_builds(tmp_path):
    """The first read decodes each message (and keeps a LangChain one by its fields); every
    later read builds it from them: equal, field for field, to a fresh decode of the stored
    bytes, and to a reopened store's read of the log."""
    msgs = _messages()
    serde = _serde()
    want = [serde.loads(serde.dumps(m)) for m in msgs]
    path = str(tmp_path / "s.durkv")
    with durkv.open(path, serde=_serde()) as s:
        _put(s, "c1", None, msgs[:3])
        _put(s, "c2", "c1", msgs)
        reads = [s.get("t", "").values["m"] for _ in range(3)]
        kept = s._index.ix.lane("t", "").newest.chans["m"].raw
        kinds = [type(k).__name__ for k in kept]
    for got in reads:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert _same_model(g, w), (g, w)
    assert reads[1][2] is not reads[2][2]                     # new objects every read
    assert reads[1][2].tool_calls is not reads[2][2].tool_calls
    # LangChain's messages and Document by their fields; the rest as bytes
    # (a tuple in a message reads back as a list: its decoded fields are plain data)
    assert kinds == ["tuple"] * 4 + ["bytes"] + ["tuple"] * 4 + ["bytes"], kinds
    with durkv.open(path, serde=_serde()) as s:     # loaded from the log: kept the same
        for _ in range(2):
            for g, w in zip(s.get("t", "").values["m"], want):
                assert _same_model(g, w)
        assert [type(k).__name__ for k in s._index.ix.lane("t", "").newest.chans["m"].raw
                ] == kinds


def test_an_edit_of_a_read_message_reaches_no_later_read(tmp_path):
    from langchain_core.messages import HumanMessage
    with durkv.open(str(tmp_path / "s.durkv"), serde=_serde()) as s:
        ai = AIMessage(content=["part"], id="a1",
                       tool_calls=[{"name": "t", "args": {"q": [1]}, "id": "c1"}])
        _put(s, "c1", None, [HumanMessage(content="hi", id="h"), ai])
        for _ in range(2):                          # the decoding read, then a built one
            got = s.get("t", "").values["m"][1]
            got.content.append("edited")
            got.tool_calls[0]["args"]["q"].append(2)
            got.additional_kwargs["x"] = 1
            got.id = "changed"
        again = s.get("t", "").values["m"][1]
        assert again == ai and again.content == ["part"]
        assert again.tool_calls == [{"name": "t", "args": {"q": [1]}, "id": "c1",
                                     "type": "tool_call"}]


def test_messages_kept_by_fields_read_under_another_serializer(tmp_path):
    """Swapped to a serializer the C decoder does not stand in for, the messages kept by
    their fields are still built from them (the bytes were LangGraph's own)."""
    serde = _serde()
    msgs = _messages()[:4]
    with durkv.open(str(tmp_path / "s.durkv"), serde=serde) as s:
        _put(s, "c1", None, msgs)
        first = s.get("t", "").values["m"]                # decodes, keeps fields
        serde.serde = _OtherSerde()
        second = s.get("t", "").values["m"]
        for a, b in zip(first, second):
            assert _same_model(a, b)


def test_a_graph_reads_its_messages_again_as_sqlite_saver_does(tmp_path):
    """get_state of an add_messages graph, read again and again on DurkvSaver, equals
    SqliteSaver's, message for message."""
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import START, StateGraph

    from durkv.langgraph import DurkvSaver

    def node(state):
        k = len(state["messages"])
        return {"messages": [AIMessage(content=f"turn {k}", id=f"a{k}",
                                       tool_calls=[{"name": "t", "args": {"k": k},
                                                    "id": f"c{k}"}])]}

    g = StateGraph(MessagesState)
    g.add_node("n", node)
    g.add_edge(START, "n")
    cfg = {"configurable": {"thread_id": "t"}}
    conn = sqlite3.connect(str(tmp_path / "s.sqlite"), check_same_thread=False)
    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:
        graphs = [g.compile(checkpointer=saver), g.compile(checkpointer=SqliteSaver(conn))]
        for graph in graphs:
            for i in range(5):
                graph.invoke({"messages": [("user", f"q{i}")]}, cfg)
        ours = [graphs[0].get_state(cfg).values["messages"] for _ in range(3)]
        theirs = graphs[1].get_state(cfg).values["messages"]
    conn.close()
    for got in ours:
        assert len(got) == len(theirs) == 10
        for a, b in zip(got, theirs):
            # the user's messages get random ids from add_messages: all else is the same
            assert type(a) is type(b) and a.model_dump(exclude={"id"}) == b.model_dump(
                exclude={"id"})
        assert [m.id for m in got] == [m.id for m in ours[0]]


def test_kept_model_forms_refuse_what_they_cannot_build():
    from durkv._msgunpack import model_kept, model_of

    assert model_kept({"a": 1}) is None and model_kept(MyAI(content="x")) is not None
    assert model_kept(AIMessage(content="x", response_metadata={"s": {1}})) is None
    made = AIMessage(content="x", id="a")                   # fields set: content and id
    form = model_kept(made)
    assert form[0] is AIMessage and form[2] == {"content", "id"}
    assert model_of(form) == made and model_of(form).model_fields_set == {"content", "id"}
    serde = _serde()
    decoded = serde.loads(serde.dumps(made))                 # every field given: no set kept
    assert model_kept(decoded)[2] is None
    assert model_of(model_kept(decoded)).model_fields_set == decoded.model_fields_set
    for bad in [(), (AIMessage, {}, None), ("x", {}, None, None), (AIMessage, {"c": {1}}, None,
                                                                     None)]:
        with pytest.raises((TypeError, AttributeError)):
            model_of(bad)
    with pytest.raises(TypeError):
        model_of([AIMessage, {}, None, None])
