"""The default serde: msgpack with extension types, never pickle; what it stores reads
back as an equal value of the same type, or is refused (docs/FORMAT.md section 5b)."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import os
import re
import subprocess
import sys
import uuid
import zoneinfo
from collections import Counter, OrderedDict, defaultdict, namedtuple
from typing import Any, NamedTuple

import msgpack

import pytest
from samevalue import same
from hypothesis import given
from hypothesis import strategies as st

from durkv.errors import SerializationError
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


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    R = 1
    W = 2


class Mode(str, enum.Enum):
    EMAIL = "email"
    PAGE = "page"


Point = namedtuple("Point", "x y")


class Span(NamedTuple):
    start: int
    end: Any


NY = zoneinfo.ZoneInfo("America/New_York")

FAITHFUL = [
    Color.RED, Level.HIGH, Perm.R | Perm.W, Mode.PAGE, Point(1, (2, 3)), Span(1, [Color.RED]),
    Counter({"a": 2, (1, 2): -1}), defaultdict(list, {"k": [1]}), defaultdict(None, {1: 2}),
    OrderedDict([("b", 1), ("a", OrderedDict(z=1))]), bytearray(b"\x00ab"),
    dt.datetime(2026, 3, 8, 1, 30, tzinfo=NY), dt.datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=NY),
    dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1), "CET")),
    {"deep": [{Level.LOW}, (Mode.EMAIL, Counter("aab"))], Color.RED: frozenset({Level.HIGH})},
]


@pytest.mark.parametrize("value", FAITHFUL, ids=lambda v: type(v).__name__)
def test_enums_namedtuples_collections_and_zones_read_back_as_their_own_type(value):
    out = s.loads(s.dumps(value))
    same(value, out)
    if isinstance(value, defaultdict):
        assert out.default_factory is value.default_factory
    if isinstance(value, dt.datetime):
        assert out.tzinfo is value.tzinfo or out.tzname() == value.tzname()
        assert out.fold == value.fold


def test_checkpoint_values_keep_their_type_after_reopen(tmp_path):
    """The default serde is the store's: channel values (a list stored as deltas too),
    pending writes and metadata read back as the types that were put."""
    import durkv

    path = str(tmp_path / "s.durkv")
    items = [Color.RED, Point(1, 2), OrderedDict(b=1, a=2)]
    with durkv.open(path) as s:
        for i in range(3):
            s.put("t", "", f"{i}", checkpoint={}, metadata={"mode": Mode.PAGE},
                  values={"log": items[:i + 1], "when": dt.datetime(2026, 3, 7, tzinfo=NY),
                          "n": Counter(a=i)},
                  versions={"log": i + 1, "when": 1, "n": i + 1},
                  parent_id=None if i == 0 else f"{i - 1}")
        s.put_writes("t", "", "2", "task", [(0, "log", [Level.HIGH])])
    with durkv.open(path) as s:
        got = s.get("t")
        same(got.values, {"log": items, "when": dt.datetime(2026, 3, 7, tzinfo=NY),
                          "n": Counter(a=2)})
        same(got.metadata, {"mode": Mode.PAGE})
        same(got.writes[0].value, [Level.HIGH])


@pytest.mark.parametrize("value", [
    dt.datetime(2021, 11, 7, 1, 30, fold=1),                              # naive
    dt.datetime(2021, 11, 7, 1, 30, fold=1, tzinfo=dt.timezone.utc),      # fixed offset
    dt.time(1, 30, fold=1), dt.time(1, 30, 5, 7, tzinfo=dt.timezone.utc, fold=1),
    dt.datetime(2021, 11, 7, 1, 30), dt.time(1, 30),
])
def test_fold_reads_back_for_naive_and_fixed_offset_values(value):
    """isoformat() has no fold: a naive 01:30 with fold=1 in a repeated hour read back
    with fold=0, an hour off in local time (FORMAT.md codes 18, 19)."""
    out = s.loads(s.dumps(value))
    same(value, out)
    assert out.fold == value.fold and repr(out) == repr(value)
    import msgpack

    code = msgpack.unpackb(s.dumps(value), ext_hook=lambda c, d: c)
    # fold=0: codes 4 and 6, the bytes older durkv wrote and reads
    assert code == {(dt.datetime, 0): 4, (dt.time, 0): 6, (dt.datetime, 1): 18,
                    (dt.time, 1): 19}[type(value), value.fold]


def test_a_zoneinfo_datetime_keeps_its_zone_across_dst():
    """A fixed offset would give 12:00 EDT the day after a 12:00 EST: an hour off."""
    before = dt.datetime(2026, 3, 7, 12, 0, tzinfo=NY)
    back = s.loads(s.dumps(before))
    assert back.tzinfo is NY
    assert (back + dt.timedelta(days=1)).utcoffset() == dt.timedelta(hours=-4)
    assert (back + dt.timedelta(days=1)).isoformat() == "2026-03-08T12:00:00-04:00"


class Thing:
    pass


class Text(str):
    pass


class Bag(dict):
    pass


class Items(list):
    pass


class Offset(dt.tzinfo):
    def utcoffset(self, d):
        return dt.timedelta(hours=2)


def _local_enum():
    class Local(enum.Enum):
        A = 1
    return Local.A


@pytest.mark.parametrize("value, kind, where", [
    ({"a": [1, Text("x")]}, "Text", "at ['a'][1]"),
    ([Bag(a=1)], "Bag", "at [0]"),
    ({"k": (1, Items())}, "Items", "at ['k'][1]"),
    ([Thing()], "Thing", "at [0]"),
    ({"e": _local_enum()}, "Local", "at ['e']"),
    (memoryview(b"ab"), "memoryview", "at the top level"),
    ({"d": defaultdict(lambda: 0)}, "defaultdict", "at ['d']"),
    ([dt.datetime(2026, 1, 1, tzinfo=Offset())], "datetime", "at [0]"),
    (dt.time(1, 2, tzinfo=NY), "time", "at the top level"),
    ({Text("k"): 1}, "Text", "(a key 'k')"),
])
def test_a_value_without_a_faithful_encoding_is_refused_naming_its_type_and_path(
        value, kind, where):
    with pytest.raises(SerializationError) as ei:
        s.dumps(value)
    msg = str(ei.value)
    assert msg.startswith("cannot store a ") and f"{kind} (" in msg and where in msg, msg
    assert isinstance(ei.value, TypeError)
    assert s.loads(s.dumps([1, 2])) == [1, 2]     # the reused packer was reset


def _cycles():
    d: dict = {}
    d["me"] = d
    a: list = []
    a.append({"a": a})
    t: tuple = ([],)
    t[0].append(t)
    return [(d, "dict", "['me']"), (a, "list", "[0]['a']"), (t, "tuple", "[0][0]")]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("value, kind, where", _cycles())
def test_a_container_inside_itself_is_refused_naming_where_not_walked_for_ever(
        value, kind, where):
    """msgpack gives up at its depth limit; finding the item at fault must not follow the
    cycle (it once looped for ever, through store.put, run.step and a graph's update)."""
    with pytest.raises(SerializationError, match=rf"a {kind} that contains itself \(at "
                                                  rf"{re.escape(where)}\)"):
        s.dumps(value)
    with pytest.raises(SerializationError, match="that contains itself"):
        MsgpackSerde(fallback=repr).dumps(value)     # the fingerprints' serde too
    assert s.loads(s.dumps([1, (2,)])) == [1, (2,)]


@pytest.mark.timeout(20)
def test_a_value_nested_too_deep_is_refused_at_once():
    deep: list = []
    cur = deep
    for _ in range(3000):
        cur.append([])
        cur = cur[0]
    shared = [1]
    for _ in range(60):          # 2**60 paths, 61 containers: no cycle, walked once each
        shared = [shared, shared]
    cur.append(shared)
    with pytest.raises(SerializationError, match="nested this deep"):
        s.dumps(deep)


# written by durkv 70cd864 (format version 1): codes 1-10 read back as they always did
V1_BYTES = bytes.fromhex(
    "9ad6019201a161d5029102d5039103c72004323032362d30312d30325430333a30343a30352e3030303030"
    "362b30303a3030c70a05323032362d30312d3032d70630313a30323a3030d60793010203d808000000000000"
    "00000000000000000005d609312e3130c7160a31313830353931363230373137343131333033343234")


def test_version_1_bytes_decode_as_before():
    out = s.loads(V1_BYTES)
    want = [(1, "a"), {2}, frozenset({3}), dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone.utc),
            dt.date(2026, 1, 2), dt.time(1, 2), dt.timedelta(1, 2, 3), uuid.UUID(int=5),
            decimal.Decimal("1.10"), 2**70]
    same(want, out)
    assert s.dumps(want) == V1_BYTES       # and are still written the same way


def test_decoding_builds_only_an_enum_or_a_namedtuple_of_the_named_class():
    """A stored class name is looked up, checked, and only then used: never a pickle."""
    ext = msgpack.ExtType
    not_an_enum = msgpack.packb(ext(11, msgpack.packb(["collections", "OrderedDict", 1])))
    with pytest.raises(SerializationError, match="not an Enum class"):
        s.loads(not_an_enum)
    not_a_tuple = msgpack.packb(ext(12, msgpack.packb(["os", "system", ["echo hi"]])))
    with pytest.raises(SerializationError, match="not a class|not an? namedtuple"):
        s.loads(not_a_tuple)
    gone = msgpack.packb(ext(11, msgpack.packb(["durkv_no_such_module", "E", 1])))
    with pytest.raises(SerializationError, match="durkv_no_such_module.E.*cannot be found"):
        s.loads(gone)


def test_decoding_imports_the_module_of_a_class(tmp_path):
    """A reader that never imported the module of a stored Enum imports it (a process
    that replays a journal does not import everything the first one did)."""
    (tmp_path / "durkv_test_enum_mod.py").write_text(
        "import enum, collections\n"
        "class Channel(enum.Enum):\n    EMAIL = 'email'\n    PAGE = 'page'\n"
        "Pair = collections.namedtuple('Pair', 'a b')\n")
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *inherited])}
    write = ("import sys, durkv_test_enum_mod as m\nfrom durkv.serde import default_serde as s\n"
             "sys.stdout.buffer.write(s.dumps([m.Channel.PAGE, m.Pair(1, m.Channel.EMAIL)]))")
    data = subprocess.run([sys.executable, "-c", write], env=env, check=True,
                          capture_output=True).stdout
    read = ("import sys\nfrom durkv.serde import default_serde as s\n"
            "assert 'durkv_test_enum_mod' not in sys.modules\n"
            "v = s.loads(sys.stdin.buffer.read())\n"
            "print(type(v[0]).__module__, type(v[0]).__name__, v[0].name, type(v[1]).__name__, "
            "v[1].b.name)")
    out = subprocess.run([sys.executable, "-c", read], env=env, input=data, check=True,
                         capture_output=True).stdout.decode().split()
    assert out == ["durkv_test_enum_mod", "Channel", "PAGE", "Pair", "EMAIL"]


def test_unserializable_raises_type_error_and_packer_recovers():
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


faithful_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    | st.binary() | st.sampled_from([Color.RED, Level.LOW, Mode.PAGE, Perm.W])
    | st.binary().map(bytearray) | st.datetimes(timezones=st.just(NY)),
    lambda children: st.lists(children) | st.tuples(children, children)
    | st.builds(Point, children, children)
    | st.dictionaries(st.text(), children).map(OrderedDict)
    | st.dictionaries(st.text(), st.integers()).map(Counter)
    | st.dictionaries(st.text(), children).map(lambda d: defaultdict(list, d)),
    max_leaves=20)


@given(faithful_values)
def test_property_round_trip_keeps_every_type(value):
    same(value, s.loads(s.dumps(value)))
