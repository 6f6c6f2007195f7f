"""What ``durkv show`` / ``history`` print for values JSON cannot hold (issue 7, items 7 and 8).

The stores hold NaN, bytes, tuples, sets, dates and dicts keyed by tuples or bytes;
the command line must print every one of them without a traceback, and ``--json``
must be strict JSON (no ``NaN``/``Infinity`` tokens) whose markers
(``durkv.cli.strict_json``, README "Command line") decode back to the stored value.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import json
import math
import subprocess
import sys
import uuid
from pathlib import Path

import durkv
import msgpack
import pytest
from click.testing import CliRunner
from durkv.cli import cli
from durkv.cli.strict_json import dumps, plain

ROOT = Path(__file__).resolve().parent.parent


def _refuse(token: str):
    raise ValueError(f"not strict JSON: {token}")


def strict_loads(text: str):
    """json.loads as a strict parser reads it: NaN, Infinity and -Infinity are errors."""
    return json.loads(text, parse_constant=_refuse)


_UNMARK = {
    "$float": float,                       # float() reads "NaN", "Infinity", "-Infinity"
    "$bytes": bytes.fromhex,
    "$tuple": lambda v: tuple(unmark(i) for i in v),
    "$set": lambda v: {unmark(i) for i in v},
    "$frozenset": lambda v: frozenset(unmark(i) for i in v),
    "$map": lambda v: {unmark(k): unmark(x) for k, x in v},
    "$datetime": dt.datetime.fromisoformat,
    "$date": dt.date.fromisoformat,
    "$time": dt.time.fromisoformat,
    "$timedelta": lambda v: dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "$uuid": uuid.UUID,
    "$decimal": decimal.Decimal,
    "$ext": lambda v: msgpack.ExtType(v[0], bytes.fromhex(v[1])),
}


def unmark(x):
    """The documented decoding: an object with one ``$`` key is a marker, any other a dict."""
    if isinstance(x, list):
        return [unmark(i) for i in x]
    if isinstance(x, dict):
        if len(x) == 1 and next(iter(x)).startswith("$"):
            (tag, v), = x.items()
            return _UNMARK[tag](v)
        assert not any(k.startswith("$") for k in x), x
        return {k: unmark(v) for k, v in x.items()}
    return x


# Everything MsgpackSerde stores, NaN aside (NaN != NaN: checked on its own below)
VALUE = {
    ("x", 2): float("inf"), b"\xff": -float("inf"), 3: {1, 2}, None: 1.5, 2.5: -0.0,
    frozenset({"f"}): "frozenset key", True: "bool key",
    "when": dt.datetime(2026, 1, 1, 12, 30, 1, 5, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    "day": dt.date(2026, 2, 3), "at": dt.time(4, 5, 6, 7),
    "span": dt.timedelta(days=-1, seconds=5, microseconds=6),
    "id": uuid.UUID(int=7), "price": decimal.Decimal("1.10"), "big": 2**80, "neg": -2**70,
    "raw": b"\x00\x01", "sets": [frozenset([(1, 2)]), set(), {"b", "a"}],
    "t": (1, (2, "3"), []), "$dollar": "a user key that looks like a marker",
    "nested": {"ok": {"deeper": [{"k": (b"v",)}]}},
}
META = {"step": 3, ("a", 1): "tuple key", b"k": "bytes key", "nan": float("nan")}


@pytest.fixture
def odd_store(tmp_path):
    d = tmp_path / "odd.durkv"
    with durkv.open(str(d)) as store:
        store.put("t", "", "0001", checkpoint={}, metadata=META, values={"v": VALUE},
                  versions={"v": 1})
        store.put_writes("t", "", "0001", "task-1", [(0, "v", {(1,): float("nan")})])
    return d


def _run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result


def _check_meta(meta):
    got = unmark(meta)
    assert math.isnan(got.pop("nan"))
    assert got == {k: v for k, v in META.items() if k != "nan"}


def test_show_json_is_strict_and_decodes_to_the_stored_values(odd_store):
    doc = strict_loads(_run("show", "--json", odd_store, "t").stdout)
    assert unmark(doc["values"]["v"]) == VALUE
    _check_meta(doc["metadata"])
    (write,) = doc["pending_writes"]
    (key, nan), = unmark(write["value"]).items()
    assert key == (1,) and math.isnan(nan)


def test_history_json_is_strict_with_tuple_and_bytes_keys(odd_store):
    doc = strict_loads(_run("history", "--json", odd_store, "t").stdout)
    (ck,) = doc["checkpoints"]
    _check_meta(ck["metadata"])
    assert strict_loads(_run("ls", "--json", odd_store).stdout)["threads"][0]["channels"] == ["v"]


def test_show_and_history_text_print_the_same_markers(odd_store):
    shown = _run("show", odd_store, "t").stdout
    assert '[{"$tuple": ["a", 1]}, "tuple key"]' in shown and '{"$float": "NaN"}' in shown
    assert "task-1 -> v:" in shown
    listed = _run("history", odd_store, "t").stdout
    assert listed.splitlines()[1].startswith("0001") and '{"$map": [["step", 3]' in listed


def test_the_console_script_prints_strict_json(odd_store):
    """The real ``durkv`` script, in its own process, as a user's pipeline runs it."""
    script = Path(sys.executable).with_name("durkv")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "durkv.cli"]
    for args in (["show", "--json", str(odd_store), "t"],
                 ["history", "--json", str(odd_store), "t"]):
        out = subprocess.run(cmd + args, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and not out.stderr, out.stderr
        strict_loads(out.stdout)


def test_a_langgraph_store_prints_strict_json(tmp_path):
    pytest.importorskip("langgraph")
    from durkv.langgraph import DurkvSaver
    from langchain_core.messages import AIMessage

    d = tmp_path / "lg.durkv"
    values = {"msgs": [AIMessage(content="hi", additional_kwargs={"score": float("nan")})],
              "seen": {"a", "b"}, "keyed": {("a", 1): b"\x01", 2: float("-inf")},
              "when": dt.datetime(2026, 1, 1)}
    with DurkvSaver.open(str(d)) as saver:
        config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        checkpoint = {"v": 4, "id": "1ef0000000000001", "ts": "2026-01-01T00:00:00+00:00",
                      "channel_values": values, "channel_versions": {k: 1 for k in values},
                      "versions_seen": {}, "updated_channels": list(values)}
        saver.put(config, checkpoint, {"source": "input", "step": -1, "w": float("inf")},
                  {k: 1 for k in values})
    doc = strict_loads(_run("show", "--json", d, "t1").stdout)
    (msg,) = doc["values"]["msgs"]          # a message prints as its fields
    assert msg["content"] == "hi" and msg["additional_kwargs"] == {"score": {"$float": "NaN"}}
    assert unmark(doc["values"]["seen"]) == {"a", "b"}
    assert unmark(doc["values"]["keyed"]) == {("a", 1): b"\x01", 2: float("-inf")}
    assert doc["metadata"]["w"] == {"$float": "Infinity"}
    strict_loads(_run("history", "--json", d, "t1").stdout)


# ---- the encoding's rules, one by one ----------------------------------------------------------


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


Point = collections.namedtuple("Point", "x y")


@dataclasses.dataclass
class Record:
    name: str
    tags: set


class Model:
    def model_dump(self):
        return {"when": dt.date(2026, 1, 1), "score": float("nan")}


class SelfDict:
    def to_dict(self):
        return self


class BadRepr:
    def __repr__(self):
        raise RuntimeError("no")


def test_strict_json_rules():
    assert plain(Color.RED) == "red" and plain(Level.HIGH) == 3 and type(plain(Level.HIGH)) is int
    assert plain(Point(1, b"\x02")) == {"x": 1, "y": {"$bytes": "02"}}
    assert plain(Record("r", {2, 1})) == {"name": "r", "tags": {"$set": [1, 2]}}
    assert plain(Model()) == {"when": {"$date": "2026-01-01"}, "score": {"$float": "NaN"}}
    assert plain(msgpack.ExtType(42, b"\x01")) == {"$ext": [42, "01"]}
    assert plain({"$tuple": [1]}) == {"$map": [["$tuple", [1]]]}   # a user dict is never a marker
    assert plain({1: "a", "1": "b"}) == {"$map": [[1, "a"], ["1", "b"]]}   # no key collision
    assert plain(bytearray(b"\x03")) == plain(memoryview(b"\x03")) == {"$bytes": "03"}
    assert plain(decimal.Decimal("NaN")) == {"$decimal": "NaN"}
    loop: list = [1]
    loop.append(loop)
    assert plain(loop) == [1, {"$repr": "<the enclosing list>"}]
    assert plain(SelfDict()) == {"$repr": "<the enclosing SelfDict>"}
    assert plain(BadRepr())["$repr"].startswith("<BadRepr (repr failed")
    assert plain(object)["$repr"] == "<class 'object'>"
    for value in (loop, SelfDict(), float("nan"), [float("inf")], {(1,): -float("inf")}):
        strict_loads(dumps(value))


def test_values_nested_as_deep_as_msgpack_stores_print(tmp_path):
    deep: object = 1
    for _ in range(510):
        deep = [deep]
    d = tmp_path / "deep.durkv"
    with durkv.open(str(d)) as store:
        store.put("t", "", "1", checkpoint={}, metadata={}, values={"d": deep}, versions={"d": 1})
    assert strict_loads(_run("show", "--json", d, "t").stdout)["values"]["d"] == deep
    _run("show", d, "t")
    limit = sys.getrecursionlimit()
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(durkv.SerializationError, match="nested too deep to print"):
        dumps(deep)
    assert sys.getrecursionlimit() == limit


def test_the_readme_documents_every_marker():
    readme = (ROOT / "README.md").read_text()
    for marker in (*_UNMARK, "$repr"):
        assert f'"{marker}"' in readme, f"README does not document {marker}"


def test_a_channel_langgraph_left_without_a_value_is_not_shown(tmp_path):
    """LangGraph moves a channel's version without a value (DurkvSaver stores EMPTY):
    ``ls`` and ``show`` list it as absent, as LangGraph reads it."""
    pytest.importorskip("langgraph")
    from durkv.langgraph import DurkvSaver

    d = tmp_path / "lg.durkv"
    with DurkvSaver.open(str(d)) as saver:
        config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        checkpoint = {"v": 4, "id": "1ef0000000000001", "ts": "2026-01-01T00:00:00+00:00",
                      "channel_values": {"kept": 1}, "channel_versions": {"kept": 1, "moved": 1},
                      "versions_seen": {}, "updated_channels": ["kept", "moved"]}
        saver.put(config, checkpoint, {"step": 0}, {"kept": 1, "moved": 1})
    with durkv.open(str(d), read_only=True, serde=saver.store.serde) as store:
        assert store.serde.is_empty(store.get("t1").values["moved"])   # stored as EMPTY
    assert strict_loads(_run("show", "--json", d, "t1").stdout)["values"] == {"kept": 1}
    assert strict_loads(_run("ls", "--json", d).stdout)["threads"][0]["channels"] == ["kept"]
    assert "moved" not in _run("show", d, "t1").stdout.split("values:")[1]
