"""What get_state reads back is what was put: the C decoding of a list channel's items
(``durkv._msgunpack``, issue 20 "get_state") against LangGraph's own serializer.

The C decoder builds the objects ``ormsgpack.unpackb`` builds for the msgpack a
``JsonPlusSerializer`` writes, LangGraph's ext hook building messages; anything outside
its subset makes it answer None, and the serializer decodes instead. These tests hold it
to the serializer value by value (equal, and the same type at every level), on crafted
bytes it must refuse, and through real graphs whose state is read back fresh, newest and
older checkpoints, before and after a reopen, across delta chains and keyframes.
"""

from __future__ import annotations

import operator
import random
from typing import Annotated, Any

import ormsgpack
import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from typing_extensions import TypedDict  # noqa: E402

from durkv._msgunpack import unpack_items  # noqa: E402
from durkv.langgraph import DurkvSaver  # noqa: E402
from durkv.langgraph_serde import LangGraphSerde, c_ext_hook, same_typed  # noqa: E402

SER = JsonPlusSerializer()
LGS = LangGraphSerde(SER)
HOOK = SER._unpack_ext_hook
MSGPACK = 1


def reference(raw: bytes) -> Any:
    """The serializer's own reading of one stored item."""
    return LGS.loads(raw)


NON_STR_KEYS = [{1: "int key"}, {"nested": {1: 2}}]     # ormsgpack's rules: not the C subset
ODD = [
    None, True, False, 0, 1, -1, -32, -33, 127, 128, -128, -129, 255, 256, -32768, -32769,
    65535, 65536, 2 ** 31, -2 ** 31 - 1, 2 ** 32, 2 ** 63 - 1, -2 ** 63, 2 ** 64 - 1,
    0.0, -0.0, 1.5, 1e-310, float("inf"), float("-inf"), "", "a", "é" * 31, "é" * 32,
    "\u4e2d\u6587\U0001f600 mixed", "x" * 255, "x" * 256, "y" * 65536, "\x00nul", b"",
    b"\x00\xff" * 200, bytearray(b"ba"), [], {}, [[[[]]]], {"": {"": [None]}},
    list(range(40)), {f"k{i}": i for i in range(40)}, ("tuple", 1, [2]), {1, 2, 3},
    frozenset({"a"}), *NON_STR_KEYS, {"a": 1, "b": {"c": None}},
    AIMessage(content="hi", id="a1"),
    AIMessage(content="", tool_calls=[{"name": "f", "args": {"q": "ü"}, "id": "c1"}]),
    HumanMessage(content=[{"type": "text", "text": "Grüße"}], id="h1"),
    ToolMessage(content="result", tool_call_id="c1"),
    {"messages": [AIMessage(content="in a dict"), {"inner": [HumanMessage(content="deep")]}]},
    {"role": "assistant", "id": "msg-1", "content": "chat-like text " * 70},
]


def test_each_odd_value_reads_back_as_the_serializer_reads_it():
    raws = [LGS.dumps(v) for v in ODD]
    for v, raw in zip(ODD, raws):
        got = unpack_items([raw, raw], MSGPACK, HOOK)
        if raw[0] != MSGPACK:
            assert got is None, v       # null/bytes/bytearray tags: the serializer's
            continue
        if any(v is x for x in NON_STR_KEYS):
            assert got is None, v       # a non-str key: the serializer's rules
            continue
        assert got is not None, f"{v!r:.60}: outside the C subset"
        ref = reference(raw)
        assert same_typed(got[0], ref) and same_typed(got[1], ref), f"{v!r:.60}"
    # the whole odd list as one channel: the store's call, with its fallbacks
    assert same_typed(LGS.loads_many(raws), [reference(r) for r in raws])


def test_a_non_str_map_key_is_left_to_the_serializer():
    raw = LGS.dumps({1: "int key"})
    assert unpack_items([raw], MSGPACK, HOOK) is None
    assert same_typed(LGS.loads_many([raw, raw]), [{1: "int key"}, {1: "int key"}])


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["int", "bigint", "float", "str", "bool", "none", "bytes"]
    if depth < 4:
        kinds += ["list", "dict", "dict", "msg"]
    k = rng.choice(kinds)
    if k == "int":
        return rng.randint(-200, 200)
    if k == "bigint":
        return rng.choice([1, -1]) * rng.randint(0, 2 ** 63 - 1)
    if k == "float":
        return rng.uniform(-1e6, 1e6)
    if k == "str":
        return "".join(rng.choice("ab é\u4e2d\U0001f600\n") for _ in range(rng.randint(0, 40)))
    if k == "bool":
        return rng.random() < 0.5
    if k == "none":
        return None
    if k == "bytes":
        return rng.randbytes(rng.randint(0, 20))
    if k == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    if k == "msg":
        return AIMessage(content="m" * rng.randint(0, 3), id=str(rng.randint(0, 99)),
                         additional_kwargs={"x": _random_value(rng, 3)})
    return {f"k{rng.randint(0, 9)}": _random_value(rng, depth + 1)
            for _ in range(rng.randint(0, 5))}


def test_random_nested_values_read_back_as_the_serializer_reads_them():
    rng = random.Random(20)
    for _ in range(60):
        vals = [_random_value(rng) for _ in range(rng.randint(2, 12))]
        raws = [LGS.dumps(v) for v in vals]
        want = [reference(r) for r in raws]
        got = LGS.loads_many(raws)
        assert same_typed(got, want)
        c = unpack_items(raws, MSGPACK, HOOK)
        if c is not None:
            assert same_typed(c, want)


@pytest.mark.parametrize("bad", [
    b"\x01",                          # no value at all
    b"\x01\xc1",                      # the reserved byte
    b"\x01\xa3ab",                    # a str cut short
    b"\x01\x92\x01",                  # an array cut short
    b"\x01\x81\xa1a",                 # a map without its value
    b"\x01\xdc\xff\xff",              # an array longer than its bytes
    b"\x01\x01\x02",                  # bytes after the value
    b"\x01\xa2\xc3\x28",              # invalid UTF-8
    b"\x01\xa3\xed\xa0\x80",          # an encoded surrogate
    b"\x01" + b"\x91" * 600 + b"\xc0",   # nested deeper than the C decoder goes
    b"\x01\x81\x01\x02",              # an int map key
    b"\x01\x81\x91\x01\x02",          # an array map key (ormsgpack: a tuple)
], ids=lambda b: b[:12].hex())
def test_bytes_outside_the_subset_are_left_to_the_serializer(bad):
    good = LGS.dumps({"ok": 1})
    assert unpack_items([good, bad], MSGPACK, HOOK) is None
    try:
        want = [reference(good), reference(bad)]
    except Exception as e:          # noqa: BLE001 - then the store's call fails alike
        with pytest.raises(type(e)):
            LGS.loads_many([good, bad])
    else:
        got = LGS.loads_many([good, bad])
        assert got == want and [type(x) for x in got] == [type(x) for x in want]


def test_items_of_other_tags_or_types_are_refused():
    good = LGS.dumps([1])
    assert unpack_items([good, LGS.dumps(None)], MSGPACK, HOOK) is None
    assert unpack_items([good, bytearray(good)], MSGPACK, HOOK) is None
    assert unpack_items([], MSGPACK, HOOK) == []


def test_an_ext_hook_that_raises_hands_over_to_the_serializer():
    raw = LGS.dumps(AIMessage(content="x"))
    calls = []

    def failing(code, data):
        calls.append(code)
        raise KeyError("no")

    assert unpack_items([raw], MSGPACK, failing) is None
    assert calls
    with pytest.raises(ValueError):        # ormsgpack's answer to the same hook
        ormsgpack.unpackb(raw[1:], ext_hook=failing)

    def interrupted(code, data):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # not an Exception: never swallowed
        unpack_items([raw], MSGPACK, interrupted)


def test_each_call_builds_new_objects():
    raws = [LGS.dumps({"a": [1, {"b": "c" * 50}]}), LGS.dumps(AIMessage(content="m", id="1"))]
    one, two = unpack_items(raws, MSGPACK, HOOK), unpack_items(raws, MSGPACK, HOOK)
    assert one == two and one is not two
    assert one[0] is not two[0] and one[0]["a"] is not two[0]["a"]
    assert one[0]["a"][1] is not two[0]["a"][1] and one[1] is not two[1]
    one[0]["a"].append("edited")
    assert unpack_items(raws, MSGPACK, HOOK)[0] == {"a": [1, {"b": "c" * 50}]}


# ---- through real graphs ------------------------------------------------------------------


class State(TypedDict):
    n: int
    messages: Annotated[list, operator.add]
    odd: Annotated[list, operator.add]
    empty: Annotated[list, operator.add]
    last: Any


def _item(i: int) -> Any:
    """Step i's items: every kind the C decoder meets or refuses, small and big (the codec
    compresses items from 1 KiB), messages at the top level and nested."""
    kinds = [
        AIMessage(content=f"answer {i} ünïcödé \u4e2d", id=f"ai-{i}",
                  tool_calls=[{"name": "t", "args": {"i": i}, "id": f"c{i}"}]),
        HumanMessage(content="big " * 400 + str(i), id=f"h-{i}"),          # compressed
        {"role": "tool", "id": f"d-{i}", "content": "x" * (i * 37 % 3000)},
        {"nested": [ToolMessage(content=str(i), tool_call_id=f"c{i}")], "n": i},
        None, i, -2 ** 63 + i, i / 7, "plain text", b"raw\x00bytes", {i: "int key"},
        ("a", i), [], {}, "\U0001f600" * 300,
    ]
    return kinds[i % len(kinds)]


def _graph(steps: int, saver: Any) -> Any:
    def node(s: State) -> dict:
        i = s["n"]
        return {"n": i + 1, "messages": [_item(i)], "odd": [_item(i + 5), _item(i + 9)],
                "last": _item(i + 3)}

    g = StateGraph(State)
    g.add_node("node", node)
    g.add_edge(START, "node")
    g.add_conditional_edges("node", lambda s: "node" if s["n"] < steps else END)
    return g.compile(checkpointer=saver)


def _run(graph: Any, steps: int) -> dict:
    config = {"configurable": {"thread_id": "t"}, "recursion_limit": steps + 10}
    graph.invoke({"n": 0, "messages": [], "odd": [], "empty": [], "last": None}, config)
    return config


def _history(graph: Any, config: dict) -> list:
    return [(s.config["configurable"]["checkpoint_id"], s.values)
            for s in graph.get_state_history(config)]


@pytest.mark.parametrize("snapshot_every", [3, 64])
def test_graph_state_reads_back_as_put_newest_older_and_after_reopen(tmp_path, snapshot_every):
    steps = 40
    ref_graph = _graph(steps, InMemorySaver())
    config = _run(ref_graph, steps)
    want = ref_graph.get_state(config).values
    want_history = [v for _, v in _history(ref_graph, config)]
    assert len(want["messages"]) == steps and want["empty"] == []

    path = str(tmp_path / "s.durkv")
    with DurkvSaver.open(path, snapshot_every=snapshot_every) as saver:
        graph = _graph(steps, saver)
        _run(graph, steps)
        got = graph.get_state(config).values
        assert same_typed(got, want)
        history = _history(graph, config)
        assert same_typed([v for _, v in history], want_history)
        older = history[len(history) // 2]
        by_id = graph.get_state({"configurable": {"thread_id": "t",
                                                  "checkpoint_id": older[0]}}).values
        assert same_typed(by_id, older[1])
    with DurkvSaver.open(path, snapshot_every=snapshot_every) as saver:
        graph = _graph(steps, saver)
        assert same_typed(graph.get_state(config).values, want)    # loaded from the log
        assert same_typed(graph.get_state(config).values, want)    # from memory
        assert same_typed([v for _, v in _history(graph, config)], want_history)


def test_get_state_hands_out_new_objects_each_call(tmp_path):
    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:
        graph = _graph(12, saver)
        config = _run(graph, 12)
        a, b = graph.get_state(config).values, graph.get_state(config).values
        assert same_typed(a, b)
        for ch in ("messages", "odd"):
            assert a[ch] is not b[ch]
            for x, y in zip(a[ch], b[ch]):
                if not isinstance(x, (str, int, float, bytes, type(None), tuple)):
                    assert x is not y, x
        before = graph.get_state(config).values
        a["messages"][0].content = "edited"
        a["messages"][2]["content"] = "edited"
        a["odd"].clear()
        assert same_typed(graph.get_state(config).values, before)


def test_the_c_decoder_is_used_with_this_langgraph():
    """The one-time probe agrees with this LangGraph's serializer (else every read would
    silently take the slower path), and only an exact JsonPlusSerializer gets it."""
    assert c_ext_hook(JsonPlusSerializer()) is not None

    class Sub(JsonPlusSerializer):
        pass

    assert c_ext_hook(Sub()) is None


def test_a_serializer_whose_loads_typed_was_replaced_decodes_its_own_way():
    """An instance with its own ``loads_typed`` (a decrypting or auditing wrapper set on
    the instance) is asked for every list, as ``dumps`` asks its own ``dumps_typed``."""
    serde = JsonPlusSerializer()
    assert c_ext_hook(serde) is not None
    plain = serde.loads_typed
    calls = []

    def loads_typed(data):
        calls.append(data[0])
        return plain(data)

    serde.loads_typed = loads_typed
    assert c_ext_hook(serde) is None
    ours = LangGraphSerde(serde)
    items = [ours.dumps({"n": i, "s": "x" * i}) for i in range(5)]
    assert ours.loads_many(items) == [{"n": i, "s": "x" * i} for i in range(5)]
    assert calls, "the instance's own loads_typed was passed over"
