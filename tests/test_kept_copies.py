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

import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

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
