"""The default serde: msgpack with extension types, never pickle."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import uuid
from collections import OrderedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durkv.serde import MsgpackSerde, Serde, default_serde

s = default_serde


class Color(enum.Enum):
    RED = "red"


@pytest.mark.parametrize("value", [
    None, True, False, 0, -1, 2**63, -(2**70), 1.5, float("inf"), "", "héllo", b"\x00\xff",
    [], [1, [2, [3]]], {}, {"a": {"b": [1, 2]}}, {1: "int key", (1, 2): "tuple key"},
    (), (1, "a", (2,)), {1, 2}, frozenset({"x"}),
    dt.datetime(2026, 11, 29, 9, 6, 24, 123456), dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    dt.date(2026, 2, 3), dt.time(4, 5, 6), dt.timedelta(days=-1, seconds=5, microseconds=7),
    uuid.uuid4(), decimal.Decimal("1.10"), [uuid.UUID(int=1), (dt.date(2020, 1, 1),)],
])
def test_round_trip(value):
    out = s.loads(s.dumps(value))
    assert out == value and type(out) is type(value)


def test_subclasses_become_their_base_type():
    assert s.loads(s.dumps(Color.RED)) == "red"
    assert s.loads(s.dumps(OrderedDict(a=1))) == {"a": 1}
    assert s.loads(s.dumps(bytearray(b"ab"))) == b"ab"


def test_unserializable_raises_type_error_and_packer_recovers():
    class Thing:
        pass

    with pytest.raises(TypeError, match="Thing"):
        s.dumps({"a": [1, Thing()]})
    assert s.loads(s.dumps([1, 2])) == [1, 2]     # the reused packer was reset


def test_protocol():
    assert isinstance(MsgpackSerde(), Serde)


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    | st.binary() | st.datetimes() | st.uuids(),
    lambda children: st.lists(children) | st.tuples(children, children)
    | st.dictionaries(st.text(), children),
    max_leaves=20)


@given(values)
def test_property_round_trip(value):
    assert s.loads(s.dumps(value)) == value
