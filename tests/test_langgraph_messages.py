"""LangChain messages encoded from their fields give LangGraph's serializer's bytes, exactly.

``durkv.langgraph_messages`` (used by ``LangGraphSerde.dumps_items``, which the run journal
calls on a step's items) packs a message's own field dict instead of ``model_dump()``, and
takes the bytes of a list's unchanged prefix from the previous call when its field dicts
pack to the same bytes.
Whatever it encodes itself must be byte for byte what ``JsonPlusSerializer`` writes (the
journal's fingerprints and references are of those bytes, GUARANTEES 16.8, 16.10); what it
cannot be sure of goes to the serializer. Each case here is compared with the serializer
itself, on every message class LangChain exports and on generated odd contents.
"""

from __future__ import annotations

import collections
import datetime
import enum
import math
import uuid

import pytest

pytest.importorskip("langgraph")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from langchain_core import messages as lc  # noqa: E402
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer  # noqa: E402
from pydantic import field_serializer  # noqa: E402

from durkv import langgraph_messages as lm  # noqa: E402
from durkv.langgraph_serde import LangGraphSerde  # noqa: E402

SERDE = LangGraphSerde(JsonPlusSerializer())


class _Asked(JsonPlusSerializer):
    """JsonPlusSerializer as a subclass: LangGraphSerde asks its dumps_typed for every value
    (no fast path of its own), so REF's bytes are the serializer's, the expectation here."""


REF = LangGraphSerde(_Asked())


def _many(objs: list, serde: LangGraphSerde = SERDE) -> list[bytes]:
    return serde.dumps_items(objs)[0]


def _same(objs: list) -> None:
    assert _many(objs) == [REF.dumps(x) for x in objs]


def _fast(obj) -> bool:
    """Whether the message was encoded from its fields (no call of the serializer)."""
    out = lm.dumps_messages([obj], lambda x: None)[0]
    return out[0] is not None


def _every_class() -> list:
    tc = {"name": "lookup", "args": {"q": "x", "n": 2}, "id": "c1"}
    return [
        lc.HumanMessage(content="find it", id="h0"),
        lc.HumanMessage(content=[{"type": "text", "text": "hi"},
                                 {"type": "image_url", "image_url": {"url": "data:x"}}]),
        lc.SystemMessage(content="be brief", name="sys"),
        lc.AIMessage(content="", tool_calls=[tc], id="a1",
                     usage_metadata={"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
                     response_metadata={"model": "m", "finish_reason": "tool_calls"}),
        lc.AIMessage(content="plain", additional_kwargs={"refusal": None}),
        lc.AIMessage(content="x", invalid_tool_calls=[
            {"name": "n", "args": "{bad", "id": "i", "error": "json"}]),
        lc.AIMessageChunk(content="chunk", tool_call_chunks=[
            {"name": "lookup", "args": '{"q"', "id": "c1", "index": 0}]),
        lc.ToolMessage(content="result", tool_call_id="c1", id="t1"),
        lc.ToolMessage(content="err", tool_call_id="c1", status="error", artifact={"raw": [1]}),
        lc.ToolMessageChunk(content="part", tool_call_id="c1"),
        lc.ChatMessage(content="x", role="critic"),
        lc.ChatMessageChunk(content="x", role="critic"),
        lc.FunctionMessage(content="r", name="f"),
        lc.FunctionMessageChunk(content="r", name="f"),
        lc.HumanMessageChunk(content="h"),
        lc.SystemMessageChunk(content="s"),
        lc.RemoveMessage(id="gone"),
    ]


def test_every_message_class_is_encoded_from_its_fields_to_the_serializers_bytes():
    msgs = _every_class()
    _same(msgs)
    assert all(_fast(m) for m in msgs), [type(m).__name__ for m in msgs if not _fast(m)]
    # read back through the serializer as the messages themselves
    assert [SERDE.loads(b) for b in _many(msgs)] == msgs


class Color(enum.Enum):
    RED = "red"


class Tag(str):
    pass


def _odd_values() -> list:
    """Values inside a message that the fields' encoding must not take as plain."""
    return [(1, 2), {1, 2}, frozenset([1]), Color.RED, Tag("t"), collections.OrderedDict(a=1),
            collections.Counter(a=1), datetime.datetime(2026, 1, 1), uuid.UUID(int=5),
            lc.HumanMessage(content="nested"), 2 ** 70, -(2 ** 64)]


@pytest.mark.parametrize("odd", _odd_values(), ids=lambda v: type(v).__name__)
def test_a_value_that_is_not_exactly_plain_goes_to_the_serializer(odd):
    msgs = [lc.AIMessage(content="x", additional_kwargs={"v": odd}),
            lc.ToolMessage(content="x", tool_call_id="c", artifact=odd),
            lc.HumanMessage(content="x", response_metadata={"deep": [{"v": odd}]})]
    for m in msgs:
        assert not _fast(m)
        try:
            want = REF.dumps(m)
        except Exception as e:      # the serializer refuses (an int over 64 bits): so does this
            with pytest.raises(type(e)):
                _many([m])
        else:
            assert _many([m]) == [want]


@pytest.mark.filterwarnings("ignore::UserWarning")      # pydantic's, on the mutated fields
def test_extras_a_reordered_dict_and_mutated_fields_are_exact():
    extra = lc.HumanMessage(content="x", mood="calm")          # an extra field
    assert extra.__pydantic_extra__ and not _fast(extra)
    reordered = lc.AIMessage(content="x", id="a")
    d = dict(reversed(list(reordered.__dict__.items())))
    object.__setattr__(reordered, "__dict__", d)               # model_dump keeps field order
    assert not _fast(reordered)
    mutated = lc.AIMessage(content="x", tool_calls=[{"name": "n", "args": {}, "id": "i"}],
                           usage_metadata={"input_tokens": 1, "output_tokens": 1,
                                           "total_tokens": 2})
    mutated.content = 5                                        # no validation on assignment
    mutated.tool_calls[0]["zzz"] = 1.5
    mutated.tool_calls.append({"args": {"x": True}, "id": "j", "name": "m"})
    mutated.usage_metadata["input_tokens"] = 1.0               # a float where an int is typed
    mutated.name = -0.0
    assert _fast(mutated)
    nan = lc.AIMessage(content="x", response_metadata={"t": math.nan, "i": math.inf,
                                                       "b": bytearray(b"x")})
    _same([extra, reordered, mutated, nan, lc.HumanMessage(content="lone \ud800 surrogate")])


def test_a_class_that_serializes_otherwise_or_another_serializer_goes_to_the_serializer():
    class Shouting(lc.AIMessage):
        @field_serializer("content")
        def _loud(self, v):
            return v.upper() if isinstance(v, str) else v

    class Counted(lc.HumanMessage):
        count: int = 0

    loud, counted = Shouting(content="quiet"), Counted(content="x", count=3)
    assert lm.eligible(Shouting) is None and not _fast(loud)
    assert lm.eligible(Counted) is not None and _fast(counted)
    _same([loud, counted])

    class Mine(JsonPlusSerializer):
        pass

    assert not lm.is_jsonplus(Mine()) and lm.is_jsonplus(JsonPlusSerializer())
    other = LangGraphSerde(Mine())
    assert _many([loud, counted], other) == [other.dumps(loud), other.dumps(counted)]


_leaf = (st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
         | st.floats(allow_nan=True) | st.text(max_size=20) | st.binary(max_size=10))
_plain = st.recursive(_leaf, lambda kids: st.lists(kids, max_size=4)
                      | st.dictionaries(st.text(max_size=6) | st.integers(-5, 5), kids,
                                        max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(content=st.text() | st.lists(st.text() | st.dictionaries(st.text(max_size=5), _plain,
                                                                 max_size=3), max_size=3),
       kwargs=st.dictionaries(st.text(max_size=8), _plain, max_size=4),
       args=st.dictionaries(st.text(max_size=8), _plain, max_size=4),
       artifact=_plain, name=st.none() | st.text(max_size=10))
def test_generated_contents_encode_to_the_serializers_bytes(content, kwargs, args, artifact,
                                                           name):
    msgs = [lc.AIMessage(content=content, additional_kwargs=kwargs, name=name,
                         tool_calls=[{"name": "t", "args": args, "id": "c"}]),
            lc.ToolMessage(content=content, tool_call_id="c", artifact=artifact,
                           response_metadata=kwargs),
            lc.HumanMessage(content=content, additional_kwargs={"a": artifact})]
    out = []
    for m in msgs:
        try:
            out.append(REF.dumps(m))
        except Exception as e:       # a big int: both refuse alike
            with pytest.raises(type(e)):
                _many([m])
            out.append(None)
    got = [_many([m])[0] if b is not None else None for m, b in zip(msgs, out)]
    assert got == out


# ---- a growing list: the unchanged prefix from the previous call, checked by bytes -------

def _grow(msgs: list, prior):
    """One call as the journal makes it: the bytes must be the serializer's, every time."""
    items, state = SERDE.dumps_items(msgs, prior)
    assert items == [REF.dumps(x) for x in msgs]
    return items, state


def test_an_unchanged_prefix_takes_the_previous_calls_bytes():
    msgs = _every_class()[:4]
    items, state = _grow(msgs, None)
    assert state is not None and len(state.items) == 4
    msgs = msgs + [lc.AIMessage(content="new")]
    items2, state2 = _grow(msgs, state)
    assert all(a is b for a, b in zip(items2, items))       # not encoded again
    assert len(state2.items) == 5


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("change", [
    lambda m: setattr(m, "content", "edited"),
    lambda m: m.additional_kwargs.update(k=1),
    lambda m: m.additional_kwargs.update(k=1.0),
    lambda m: m.additional_kwargs.update(k=True),
    lambda m: m.additional_kwargs.update(k=(1,)),             # a tuple: the serializer
    lambda m: setattr(m, "mood", "extra"),                    # an extra field
    lambda m: object.__setattr__(m, "__dict__", dict(reversed(m.__dict__.items()))),
    lambda m: setattr(m, "name", -0.0),
    # nested, in place: durkv compares with its own copy, never the caller's containers
    lambda m: m.additional_kwargs["nest"]["args"].update(q="other"),
    lambda m: m.additional_kwargs["nest"]["args"].update(q=1.0),
    lambda m: m.additional_kwargs["nest"]["list"].append(None),
    lambda m: m.additional_kwargs["nest"]["list"].__setitem__(0, 1.0),
    lambda m: m.additional_kwargs["nest"]["list"].__setitem__(0, True),
    lambda m: m.additional_kwargs["nest"].update(list=tuple(m.additional_kwargs["nest"]["list"])),
    lambda m: m.additional_kwargs["nest"].update(args=m.additional_kwargs["nest"].pop("args")),
    lambda m: m.additional_kwargs["nest"].update(big=2 ** 70),
    lambda m: setattr(m, "content", type("S", (str,), {})("q")),   # a str subclass
    lambda m: m.additional_kwargs["nest"].update(f=float("-nan")),
], ids=["content", "int", "float", "bool", "tuple", "extra", "reordered", "negzero",
        "nested-str", "nested-int-to-float", "nested-append", "nested-float", "nested-bool",
        "nested-tuple", "nested-reordered", "nested-bigint", "str-subclass", "nested-nan"])
def test_a_prefix_item_changed_in_place_is_encoded_again(change):
    def nest() -> dict:
        return {"k": 0.0, "nest": {"args": {"q": 1}, "list": [1, "x"], "f": float("nan")}}
    msgs = [lc.HumanMessage(content="q", id="h", additional_kwargs=nest()),
            lc.AIMessage(content="a", id="a", additional_kwargs=nest())]
    _, state = _grow(msgs, None)
    assert state.copies is not None     # the history is checked against durkv's copies
    change(msgs[0])                     # the same objects, passed again
    grown = msgs + [lc.ToolMessage(content="t", tool_call_id="c")]
    assert lm._same_prefix(grown, state) == 0       # not taken as unchanged: encoded again
    try:
        REF.dumps(msgs[0])
    except TypeError:                   # a big int: the serializer refuses it as well
        return
    _grow(grown, state)                 # to the serializer's bytes (a tuple, a str subclass:
                                        # the same bytes as before, found by encoding)


class _Watched(lc.AIMessage):
    """A message class with a __getattribute__ of its own: its fields are read through the
    attribute protocol, not from where pydantic keeps them."""

    def __getattribute__(self, name):
        return super().__getattribute__(name)


def test_a_class_with_its_own_getattribute_is_checked_through_it():
    msgs = [_Watched(content="a", id="a", additional_kwargs={"n": [1]}),
            lc.AIMessage(content="b", id="b", additional_kwargs={"n": [1]})]
    _, state = _grow(msgs, None)
    assert state.copies is not None and lm._same_prefix(msgs, state) == 2
    msgs[0].additional_kwargs["n"].append(2)
    assert lm._same_prefix(msgs, state) == 0
    msgs[0].additional_kwargs["n"].pop()
    msgs[1].additional_kwargs["n"][0] = 1.0
    assert lm._same_prefix(msgs, state) == 0
    _grow(msgs, state)


def test_equal_values_in_new_objects_keep_the_prefix():
    """What decides is the value, as msgpack encodes it: a field replaced by an equal
    str, int or float (the same bits) in a new object, or a copied container, keeps
    the previous bytes."""
    msgs = [lc.AIMessage(content="a" * 40, id="a",
                         additional_kwargs={"n": 10 ** 12, "f": 0.5, "l": [{"x": "y"}]})]
    items, state = _grow(msgs, None)
    m = msgs[0]
    m.content = "".join(["a"] * 40)                       # another str object, same value
    m.additional_kwargs = {"n": int("1" + "0" * 12), "f": float("0.5"), "l": [{"x": "y"}]}
    items2, state2 = _grow(msgs + [lc.HumanMessage(content="next")], state)
    assert items2[0] is items[0] and len(state2.items) == 2


_nested = st.recursive(_plain, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(first=_nested, second=_nested)
def test_the_copies_decide_as_the_bytes_would(first, second):
    """Differential: for any two plain values a field goes from and to, the history check
    against durkv's copies keeps the prefix exactly when packing the fields again gives the
    same bytes (the check it replaces)."""
    msgs = [lc.AIMessage(content="a", id="a", additional_kwargs={"v": first})]
    try:
        _, state = _grow(msgs, None)
    except Exception:       # a value the serializer refuses (a big int): nothing to check
        return
    if state is None or state.copies is None:
        return
    packed = b"".join(lm.ormsgpack.packb(c.fields(), option=lm._OPTION) for c in state.copies)
    by_bytes = lm.EncodedPrefix(state.types, packed, state.items, None)
    msgs[0].additional_kwargs["v"] = second
    assert lm._same_prefix(msgs, state) == lm._same_prefix(msgs, by_bytes)


@settings(max_examples=150, deadline=None)
@given(value=_nested)
def test_a_flattened_copy_is_the_copy(value):
    """The history keeps each copy flattened (``durkv._msgfields.Fields``): built again it
    is the copy -- the same keys in the same order, the same exact types, the very
    leaves -- so it packs to the same bytes, and a message whose fields are the copy's
    matches it while one whose value differs does not."""
    from durkv._msgfields import copy_fields, same_fields, witness

    fields = {"content": "c", "additional_kwargs": {"v": value}, "id": None}
    copy = copy_fields(fields)
    if copy is None:                    # nested past the limit
        return
    w = witness(copy, lc.AIMessage)
    again = w.fields()

    def shape(v):
        if type(v) is dict:
            return ("d", [(k, shape(x)) for k, x in v.items()])
        if type(v) in (list, tuple):
            return (type(v).__name__, [shape(x) for x in v])
        return id(v)                    # a leaf: the very object
    assert shape(again) == shape(copy) and again is not copy
    def packed(v):
        try:
            return lm.ormsgpack.packb(v, option=lm._OPTION)
        except TypeError as e:          # an int past 64 bits: refused alike
            return str(e)
    assert packed(again) == packed(copy)
    msg = lc.AIMessage(content="c", additional_kwargs={"v": value})
    w = witness(copy_fields(msg.__dict__), lc.AIMessage)
    assert same_fields([msg], [w]) and same_fields([msg, "more"], [w])
    assert not same_fields([msg], [witness(copy_fields(msg.__dict__), lc.AIMessageChunk)])
    msg.additional_kwargs["v"] = [value]
    assert not same_fields([msg], [w])


def test_a_flattened_copy_is_made_of_plain_data_only():
    from durkv._msgfields import Fields, copy_fields, same_fields, witness

    for bad in ({"s": {1, 2}}, {1: "int key"}, [1], "text", {"m": lc.AIMessage(content="x")}):
        with pytest.raises(TypeError, match="plain data"):
            witness(bad, lc.AIMessage)
    msg = lc.AIMessage(content="x")
    copy = copy_fields(msg.__dict__)
    with pytest.raises(TypeError):
        witness(copy, "AIMessage")              # a class, not its name
    assert isinstance(witness(copy, lc.AIMessage), Fields)
    assert not same_fields([msg], [copy])       # only a Fields is a witness
    assert same_fields([msg], [witness(copy, lc.AIMessage)])
    assert not same_fields([], [witness(copy, lc.AIMessage)])   # fewer objects than copies
    with pytest.raises(TypeError):
        Fields()                                # made by witness() only


def test_an_item_replaced_by_another_class_with_the_same_fields_is_encoded_again():
    msgs = [lc.HumanMessage(content="q", id="h"), lc.AIMessage(content="a", id="a")]
    _, state = _grow(msgs, None)
    msgs[0] = lc.HumanMessageChunk(content="q", id="h")
    msgs[0].type = "human"              # the same field dict, another class
    items, _ = _grow(msgs, state)
    assert items[0] != state.items[0]


_edits = st.lists(st.tuples(st.sampled_from(["append", "mutate", "replace", "drop"]),
                            st.integers(0, 50), _plain), min_size=1, max_size=12)


@settings(max_examples=100, deadline=None)
@given(edits=_edits)
def test_generated_histories_edited_between_calls_encode_to_the_serializers_bytes(edits):
    msgs: list = [lc.HumanMessage(content="start")]
    prior = None
    for op, i, value in edits:
        if op == "append":
            msgs.append(lc.AIMessage(content="x", additional_kwargs={"v": value}))
        elif op == "mutate":
            msgs[i % len(msgs)].additional_kwargs["v"] = value
        elif op == "replace":
            msgs[i % len(msgs)] = lc.ToolMessage(content="t", tool_call_id="c", artifact=value)
        elif len(msgs) > 1:
            del msgs[i % len(msgs)]
        try:
            want = [REF.dumps(x) for x in msgs]
        except Exception:               # a big int: the serializer refuses
            return
        items, prior = SERDE.dumps_items(msgs, prior)
        assert items == want


def test_a_serializer_that_encodes_otherwise_turns_the_fields_path_off(monkeypatch):
    """Before its first use the module checks its bytes against the serializer's: a
    LangGraph that encodes messages otherwise (a new version) gets the serializer's path."""
    import langgraph.checkpoint.serde.jsonplus as jp
    monkeypatch.setattr(lm, "_agreed", [])
    assert lm.is_jsonplus(JsonPlusSerializer())
    monkeypatch.setattr(lm, "_agreed", [])
    real = jp.JsonPlusSerializer.dumps_typed
    monkeypatch.setattr(jp.JsonPlusSerializer, "dumps_typed",
                        lambda self, obj: (lambda t: (t[0], t[1] + b"\xc0"))(real(self, obj)))
    assert not lm.is_jsonplus(JsonPlusSerializer())
    m = lc.AIMessage(content="x")
    changed = LangGraphSerde(JsonPlusSerializer())   # opened under that LangGraph
    want = REF.dumps(m)                              # the serializer's (changed) bytes
    assert want.endswith(b"\xc0")
    assert _many([m], changed) == [want]
    assert [changed.dumps(x) for x in (m, {"n": 1}, 7)] == [REF.dumps(x) for x in (m, {"n": 1}, 7)]
