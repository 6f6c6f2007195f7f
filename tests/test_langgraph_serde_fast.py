"""LangGraphSerde.dumps packs a plain JsonPlusSerializer's "msgpack" values itself: same bytes.

Under exactly LangGraph's ``JsonPlusSerializer`` the commit path's values (a checkpoint's
record and metadata, channel values, pending writes) are packed by one ormsgpack call with
the serializer's own hook and options (``langgraph_messages.pack_msgpack``) instead of
through ``dumps_typed``. What is stored must be what the serializer writes (GUARANTEES 10:
what is read back is what was put), so every value here is compared with the serializer's
own bytes -- the tag byte, then ``dumps_typed``'s -- and read back: plain data, unicode,
big values, odd types the hook handles (datetimes, UUIDs, enums, sets, tuples, pydantic
models, dataclasses, LangGraph's Send/Interrupt/Command), values ormsgpack refuses (the
serializer's own error, or its pickle fallback), ``None``/``bytes``/``bytearray`` (stored as
themselves), and serializers the fast path must leave alone (a subclass, an encrypting
wrapper, an instance whose ``dumps_typed`` was replaced).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import pathlib
import uuid
from collections import OrderedDict, deque, namedtuple

import pytest

pytest.importorskip("langgraph")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from langchain_core import messages as lc  # noqa: E402
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer  # noqa: E402
from langgraph.types import Command, Interrupt, Send  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from durkv.langgraph_serde import EMPTY, LangGraphSerde  # noqa: E402


class _Asked(JsonPlusSerializer):
    """The same serializer as a subclass: LangGraphSerde asks its dumps_typed, always."""


def _reference(serializer, obj) -> bytes:
    """What LangGraphSerde stores for ``obj``, from the serializer's own dumps_typed."""
    return LangGraphSerde(_Asked(pickle_fallback=serializer.pickle_fallback)).dumps(obj)


class Color(enum.Enum):
    RED = "red"


class Model(BaseModel):
    name: str
    n: int = 0


@dataclasses.dataclass
class Point:
    x: int
    y: float


Pair = namedtuple("Pair", "a b")


class MyStr(str):
    pass


class MyBytes(bytes):
    pass


def _values() -> list:
    big = {"k": "v" * 5000, "items": list(range(3000)), "nested": [{"a": [1.5, None]}] * 200}
    return [
        0, -1, 1 << 62, -(1 << 63), (1 << 64) - 1, 3.25, float("inf"), True, False, "",
        "ascii", "ünïcødé ✓ 漢字 🙂", "\x00nul", {"a": 1}, {}, [], [1, "x", None], (1, 2),
        {1: "int key", "s": b"bytes inside"}, big, [big, big],
        {"messages": [{"role": "user", "content": "hi" * 400}]},
        datetime.datetime(2026, 12, 3, 20, 0, tzinfo=datetime.timezone.utc),
        datetime.date(2026, 1, 2), datetime.timedelta(seconds=5), uuid.UUID(int=7),
        Color.RED, {1, 2}, frozenset({"a"}), decimal.Decimal("1.5"), pathlib.Path("/x"),
        Model(name="m", n=2), Point(1, 2.5), Pair(1, "b"), OrderedDict(a=1), deque([1]),
        MyStr("sub"), Send("node", {"arg": 1}), Interrupt(value="ask", id="i1"),
        Command(goto="n", update={"k": 1}),
        lc.AIMessage(content="a", id="x", tool_calls=[{"name": "t", "args": {}, "id": "c"}]),
        [lc.HumanMessage(content="q"), lc.ToolMessage(content="r", tool_call_id="c")],
        None, b"raw", bytearray(b"arr"), MyBytes(b"sub-bytes"), b"", EMPTY,
    ]


@pytest.mark.parametrize("pickle_fallback", [False, True])
def test_every_value_is_stored_as_the_serializer_writes_it(pickle_fallback):
    serializer = JsonPlusSerializer(pickle_fallback=pickle_fallback)
    serde = LangGraphSerde(serializer)
    for v in _values():
        want = _reference(serializer, v)
        got = serde.dumps(v)
        assert got == want, v
        back = serde.loads(got)
        assert back is EMPTY if v is EMPTY else _reference(serializer, back) == want


@pytest.mark.parametrize("pickle_fallback", [False, True])
def test_a_value_ormsgpack_refuses_gets_the_serializers_answer(pickle_fallback):
    """An int over 64 bits, an object of no known kind: the serializer's pickle, or the
    serializer's own error -- never other bytes, never a half-written value."""
    serializer = JsonPlusSerializer(pickle_fallback=pickle_fallback)
    serde = LangGraphSerde(serializer)
    for v in (1 << 70, {"deep": [1 << 80]}):
        try:
            want = _reference(serializer, v)
        except Exception as e:
            with pytest.raises(type(e)):
                serde.dumps(v)
        else:
            assert pickle_fallback and serde.dumps(v) == want
            assert serde.loads(serde.dumps(v)) == v


_plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats(
        allow_nan=False) | st.text(max_size=40) | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(
        st.text(max_size=8) | st.integers(-5, 5), inner, max_size=6) | st.tuples(inner, inner),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_plain)
def test_generated_values_are_the_serializers_bytes(value):
    serializer = JsonPlusSerializer()
    assert LangGraphSerde(serializer).dumps(value) == _reference(serializer, value)


def test_serializers_the_fast_path_leaves_alone():
    """A subclass, an instance whose dumps_typed was replaced, an encrypting wrapper: their
    own dumps_typed decides every value."""
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    marked = JsonPlusSerializer()
    real = marked.dumps_typed
    marked.dumps_typed = lambda obj: (lambda t: (t[0], t[1] + b"!"))(real(obj))
    assert LangGraphSerde(marked).dumps({"a": 1}).endswith(b"!")

    class Tagged(JsonPlusSerializer):
        def dumps_typed(self, obj):
            return "json", b"{}"
    assert LangGraphSerde(Tagged()).dumps({"a": 1}) == b"\x05{}"

    pytest.importorskip("Crypto")
    enc = EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 16)
    serde = LangGraphSerde(enc)
    stored = serde.dumps({"secret": "v"})
    assert b"secret" not in stored and serde.loads(stored) == {"secret": "v"}


def test_swapping_the_serializer_turns_the_fast_path_on_and_off():
    """``saver.serde = ...`` (encryption, a wider allowlist) replaces the store's serializer:
    the next value follows the new one."""
    serde = LangGraphSerde(JsonPlusSerializer())

    class Tagged(JsonPlusSerializer):
        def dumps_typed(self, obj):
            return "json", b"[]"
    serde.serde = Tagged()
    assert serde.dumps({"a": 1}) == b"\x05[]"
    serde.serde = JsonPlusSerializer()
    assert serde.dumps({"a": 1}) == _reference(JsonPlusSerializer(), {"a": 1})
