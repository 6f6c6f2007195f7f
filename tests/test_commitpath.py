"""The commit path's C loops (durkv._commitpath) give what the Python path gives.

``Writer.encode_writes`` runs LangGraph's plain ``(int, str, value)`` writes in one C call
and leaves everything else to ``Writer.encode_writes_py``, the definition. Here the two are
compared over hostile writes -- odd values, unicode channels (left to Python), empty and
huge lists, values that compress, bytes that look like zstd frames, special channels,
malformed writes, serializers that raise or return odd things -- and, through whole
stores, the frames in the log and what reads back, with the C call on and forced off.
"""

from __future__ import annotations

import random

import pytest

import durkv
from durkv.errors import ConfigError, SerializationError
from durkv.store import writer as writer_mod

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _open(tmp_path, name, **kw):
    return durkv.open(str(tmp_path / name), durability="async", **kw)


def _values():
    big = "x" * 5000
    return [None, 0, -1, 2 ** 63 - 1, -(2 ** 63), 2 ** 70, 1.5, float("inf"), True, "",
            "é", "\U0001F600" * 300, b"", _ZSTD_MAGIC, _ZSTD_MAGIC + b"tail", b"\0" * 3000,
            bytearray(b"ab"), big, {"a": [1, 2, {"b": big}]}, (1, 2), [], [1], ["a", big],
            [[], [big]], [None] * 50, list(range(300)), {"k": "v" * 2000}, [_ZSTD_MAGIC]]


def _writes_cases():
    vals = _values()
    rng = random.Random(20)
    cases = [
        [(0, "messages", [{"role": "ai", "content": "hi" * 600}])],
        [(0, "__error__", "boom"), (1, "__interrupt__", [{"value": 1}])],
        [(-1, "__error__", ValueError("x").args), (-2, "__scheduled__", None)],
        [(0, "__resume__", 1), (1, "n", 2)],
        [(2 ** 63 - 1, "a", 1), (-(2 ** 63), "b", [])],
        [(i, f"ch{i}", v) for i, v in enumerate(vals)],
        [(i, "same", v) for i, v in enumerate(vals)],
    ]
    for _ in range(40):
        cases.append([(rng.randrange(-5, 5), rng.choice(["a", "__error__", "m", "z" * 200]),
                       rng.choice(vals)) for _ in range(rng.randrange(1, 8))])
    return cases


def _same(a, b):
    assert a[0] == b[0] and a[2] is b[2]
    assert [tuple(x) for x in a[1]] == [tuple(x) for x in b[1]]
    for (ra, *_), (rb, *_) in zip(a[1], b[1]):
        assert type(ra) is list and type(rb) is list
    # the same types too (a serde's bytearray stays one on both paths)
    flat = [lambda r: [y for x in r[0] for y in x],
            lambda r: [y for x in r[1] for y in x[2] + x[3]]]
    for f in flat:
        assert [type(x) for x in f(a)] == [type(x) for x in f(b)]


@pytest.mark.parametrize("writes", _writes_cases())
def test_encode_writes_c_equals_python(tmp_path, writes):
    with _open(tmp_path, "s") as s:
        w = s._writer
        got = writer_mod._encode_writes(writes, w._dumps, w._codec.pack, w._codec.min_bytes,
                                        writer_mod.SPECIAL_WRITE_CHANNELS, writer_mod.F_ZSTD)
        assert got is not None      # these are the shapes the C call takes
        _same(got, w.encode_writes_py("task", writes))
        _same(w.encode_writes("task", tuple(writes)), w.encode_writes_py("task", writes))


@pytest.mark.parametrize("writes", [
    [(True, "a", 1)],                   # a bool is not an exact int
    [(2 ** 63, "a", 1)],                # over 64 bits
    [(0, "é", 1)],                      # not ASCII: the Python path's check_id decides
    [(0, "", 1)],
    [[0, "a", 1]],                      # a list, not a tuple
    [(0, "a")],
    [(0, b"a", 1)],
    [(0, "a", 1), "bad"],
])
def test_c_leaves_other_shapes_to_python(tmp_path, writes):
    with _open(tmp_path, "s") as s:
        w = s._writer
        assert writer_mod._encode_writes(writes, w._dumps, w._codec.pack, w._codec.min_bytes,
                                         writer_mod.SPECIAL_WRITE_CHANNELS,
                                         writer_mod.F_ZSTD) is None
        try:
            want = w.encode_writes_py("task", writes)
        except Exception as e:      # noqa: BLE001 - the same error either way
            with pytest.raises(type(e)):
                w.encode_writes("task", writes)
        else:
            _same(w.encode_writes("task", writes), want)


def test_a_generator_and_a_subclassed_tuple_take_the_python_path(tmp_path):
    class T(tuple):
        pass

    with _open(tmp_path, "s") as s:
        w = s._writer
        want = w.encode_writes_py("t", [(0, "a", [1, 2])])
        _same(w.encode_writes("t", (x for x in [(0, "a", [1, 2])])), want)
        _same(w.encode_writes("t", [T((0, "a", [1, 2]))]), want)


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("no")


def test_a_value_the_serde_refuses_raises_the_typed_error(tmp_path):
    with _open(tmp_path, "s") as s:
        for writes in ([(0, "a", 1), (1, "bad", _Unpicklable())],
                       [(0, "bad", [1, _Unpicklable()])]):
            with pytest.raises(SerializationError, match="channel 'bad'") as ei:
                s._writer.encode_writes("task", writes)
            assert ei.value.context == {"channel": "bad"}
            with pytest.raises(SerializationError):
                s.put_writes("t", "", "c1", "task", writes)


class _OddSerde:
    """A serde whose dumps returns a bytearray (not bytes): the codec decides, as in Python."""

    def dumps(self, obj):
        return bytearray(repr(obj).encode() * (400 if obj == "big" else 1))

    def loads(self, data):
        return bytes(data).decode()


def test_odd_serde_and_raising_pack(tmp_path):
    with _open(tmp_path, "s", serde=_OddSerde()) as s:
        w = s._writer
        writes = [(0, "a", "big"), (1, "b", ["big", 1]), (2, "c", 3)]
        _same(w.encode_writes("t", writes), w.encode_writes_py("t", writes))

    def boom(data):
        raise RuntimeError("codec")

    with _open(tmp_path, "s2") as s:
        w = s._writer
        got = None
        with pytest.raises(RuntimeError):
            got = writer_mod._encode_writes([(0, "a", "x" * 5000)], w._dumps, boom, 1024,
                                            writer_mod.SPECIAL_WRITE_CHANNELS, 1)
        assert got is None


def test_no_reference_to_the_callers_values_is_kept(tmp_path):
    import sys

    with _open(tmp_path, "s") as s:
        v = [{"a": 1}]
        item = v[0]
        before = sys.getrefcount(v), sys.getrefcount(item)
        recs, lists, _ = s._writer.encode_writes("t", [(0, "m", v)])
        assert (sys.getrefcount(v), sys.getrefcount(item)) == before
        del recs, lists


def _run(store, rng):
    """A run of puts and put_writes with hostile values; the frames it leaves."""
    vals = _values()
    parent = None
    msgs: list = []
    for i in range(30):
        cid = f"c{i:04d}"
        msgs = msgs + [{"role": "ai", "content": "m" * rng.randrange(0, 3000)}]
        if parent is not None:
            store.put_writes("t", "ns|é", parent, f"task{i}", [(0, "messages", msgs[-1:])])
            store.put_writes("t", "ns|é", parent, f"task{i}",
                             [(j, rng.choice(["x", "__error__", "__interrupt__"]),
                               rng.choice(vals)) for j in range(rng.randrange(0, 5))])
            store.put_writes("t", "ns|é", parent, "ta\u00efsk", [(0, "y", rng.choice(vals))])
        store.put("t", "ns|é", cid, checkpoint={"ts": i}, metadata={"step": i},
                  values={"messages": msgs, "n": i}, versions={"messages": i, "n": i},
                  parent_id=parent)
        parent = cid
    return store


def _frames(store):
    b = store._b
    return [b.read(lsn) for lsn in range(b.next_lsn)]


def test_log_bytes_and_read_back_are_the_python_paths(tmp_path, monkeypatch):
    with _open(tmp_path, "c") as s:
        _run(s, random.Random(7))
        s.flush()
        c_frames = _frames(s)
        c_got = s.get("t", "ns|é")
        c_hist = [(h.checkpoint_id, h.values, [(w.task_id, w.channel, w.value)
                                                for w in h.writes]) for h in s.history("t")]
    monkeypatch.setattr(writer_mod, "_encode_writes", lambda *a: None)
    with _open(tmp_path, "p") as s:
        _run(s, random.Random(7))
        s.flush()
        assert _frames(s) == c_frames
        got = s.get("t", "ns|é")
        assert (got.values, got.writes) == (c_got.values, c_got.writes)
        assert [(h.checkpoint_id, h.values, [(w.task_id, w.channel, w.value)
                                             for w in h.writes])
                for h in s.history("t")] == c_hist


def test_malformed_writes_still_raise_config_errors(tmp_path):
    with _open(tmp_path, "s") as s:
        for writes in ([(0, "", 1)], [(True, "a", 1)], [(0, "a")], [(2 ** 64, "a", 1)]):
            with pytest.raises(ConfigError):
                s.put_writes("t", "", "c1", "task", writes)


# -- LangGraphSerde.dumps (durkv._lgcommit.Dumps) against its definition, _dumps_py -----------

def _lg_values():
    import datetime
    import uuid

    lc = pytest.importorskip("langchain_core.messages")
    from durkv.langgraph_serde import EMPTY

    return [EMPTY, None, b"", b"x", bytearray(b"y"), 0, 2 ** 64, -(2 ** 63) - 1, 2 ** 70, 1.5,
            "é\U0001F600", {"a": [1, (2, 3)]}, {1: "int key"}, [EMPTY], set([1]), object(),
            datetime.datetime(2026, 1, 1), uuid.UUID(int=5), lc.AIMessage("hi", id="m"),
            type("B", (bytes,), {})(b"sub"), *_values()]


def _outcome(f, v):
    try:
        return ("ok", f(v))
    except Exception as e:      # noqa: BLE001 - the same error either way
        return ("err", type(e), str(e))


@pytest.mark.parametrize("pickle_fallback", [False, True])
def test_serde_dumps_c_equals_python(pickle_fallback):
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from durkv.langgraph_serde import LangGraphSerde

    class Sub(JsonPlusSerializer):
        pass

    for ser in (JsonPlusSerializer(pickle_fallback=pickle_fallback),
                Sub(pickle_fallback=pickle_fallback)):
        s = LangGraphSerde(ser)
        dumps = s.dumps
        for v in _lg_values():
            assert _outcome(dumps, v) == _outcome(s._dumps_py, v), v


def test_serde_dumps_follows_a_swapped_serializer_and_passes_base_exceptions():
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from durkv.langgraph_serde import LangGraphSerde

    class Tagged(JsonPlusSerializer):
        def dumps_typed(self, obj):
            return "json", b"asked"

    s = LangGraphSerde(JsonPlusSerializer())
    dumps = s.dumps                 # held, as the writer holds it
    assert dumps(5) == s._dumps_py(5) == b"\x01\x05"
    assert dumps(None) == s._dumps_py(None) == b"\x02"     # the serializer's "null"
    s.serde = Tagged()
    assert dumps(5) == s._dumps_py(5) == b"\x05asked"
    assert dumps(None) == s._dumps_py(None) == b"\x05asked"

    class Stop(BaseException):
        pass

    def hook(obj):
        raise Stop

    from durkv import langgraph_serde as lgs

    d = lgs._Dumps(s, lgs.EMPTY, b"\x00", b"\x01", hook, LangGraphSerde._asked)
    s.serde = JsonPlusSerializer()
    with pytest.raises(Stop):
        d(5)
    with pytest.raises(TypeError):
        d(1, 2)


# -- the metadata merge of a put (checkpoint_metadata) against its definition ---------------------

def test_checkpoint_metadata_c_equals_python():
    pytest.importorskip("langgraph.checkpoint.base")
    from collections import ChainMap, OrderedDict

    from durkv.langgraph_serde import checkpoint_metadata_c as c_md
    from durkv.langgraph import EXCLUDED_METADATA_KEYS, checkpoint_metadata_py

    class Text(str):
        pass

    class Num(int):
        pass

    metas = [{}, {"source": "loop", "step": 3, "parents": {}}, {"a": "x\0y\0", "b": b"\0"},
             {"who": Text("x\0")}, {1: "int key"}, {"é\0": "\0", "n": None},
             OrderedDict(k="v"), ChainMap({"source": "input"})]
    configs = [{}, {"metadata": None, "configurable": None},
               {"configurable": {"thread_id": "t", "checkpoint_ns": "", "__pregel_x": 1,
                                 "_one": 1, "__": 2, "x\0": "y\0z"}},
               {"metadata": ChainMap({"thread_id": "t", "user": "u\x00v", "n": 2}),
                "configurable": {"thread_id": "t", "run": 7, "flag": True, "r": 0.5,
                                 "num": Num(3), "o": object(), "l": [1], "step": 1}},
               {"metadata": ChainMap({})}, {"metadata": ChainMap({"a": 1}, {"b": 2})},
               {"metadata": ChainMap(OrderedDict(z=1))}, {"metadata": {"t": Text("s")}},
               {"metadata": {5: "int key"}}, {"metadata": 0}, {"metadata": "",
                                                               "configurable": {"q": "w"}},
               ChainMap({"metadata": {"a": 1}})]
    handled = 0
    for config in configs:
        for meta in metas:
            want = _outcome(lambda m: checkpoint_metadata_py(config, m), meta)
            got = c_md(config, meta, EXCLUDED_METADATA_KEYS, ChainMap)
            if got is None:
                continue
            handled += 1
            assert ("ok", got) == want
            assert list(got) == list(want[1])
            assert [type(v) for v in got.values()] == [type(v) for v in want[1].values()]
    assert handled >= 20        # the plain shapes are the C call's (20 here)


# -- check_put's common case (put_args_ok) never passes what check_put refuses ---------------

def test_put_args_ok_agrees_with_check_put():
    from durkv._commitpath import put_args_ok
    from durkv.store.writer import check_put

    class S(str):
        pass

    ids = ["t", "", "é", S("t"), 1, None, "\udc80"]
    parents = [None, "p", "", S("p"), 5]
    vals = [{}, {"a": 1}, {S("a"): 1}, {1: 1}, [], None]
    vers = [{}, {"a": 1}, {"a": "v"}, {"a": 1.5}, {"a": float("nan")}, {"a": True},
            {"a": 2 ** 64 - 1}, {"a": 2 ** 64}, {"a": -(2 ** 63)}, {"a": -(2 ** 63) - 1},
            {"a": None}, {S("a"): 1}, {"a": S("v")}, {1: 1}, None]
    alls = [None, {}, {"a": 1}, [], "x"]
    fast = 0
    for tid in ids:
        for cid in ids:
            for ns in ("", "n", S("n"), 3):
                for parent in parents[:3]:
                    for v in vals:
                        for ver in vers:
                            for av in alls[:3] if tid == "t" else alls[:1]:
                                args = (tid, ns, cid, parent, v, ver, av)
                                if put_args_ok(*args):
                                    fast += 1
                                    check_put(*args)    # passes: nothing to raise
    assert fast > 50
    for args in [("t", "", "c", 5, {}, {}, None), ("t", "", "c", None, {}, {}, [])]:
        assert not put_args_ok(*args)


# -- DurkvSaver.put's arguments (put_args_c) against put_args_py ----------------------------------

def test_put_args_c_equals_python():
    pytest.importorskip("langgraph.checkpoint.base")
    from durkv.langgraph import put_args_py
    from durkv.langgraph_serde import EMPTY, put_args_c

    class S(str):
        pass

    def ck(**kw):
        c = {"v": 4, "ts": "2026", "id": "c2", "channel_values": {"m": [1], "n": 2},
             "channel_versions": {"m": 3, "n": "v", "gone": 1}, "versions_seen": {"a": {}},
             "updated_channels": ["m"]}
        c.update(kw)
        return c

    confs = [{"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"},
             {"thread_id": "t"}, {"thread_id": "é", "checkpoint_ns": None},
             {"thread_id": "t", "checkpoint_ns": "a|b", "checkpoint_id": None},
             {"thread_id": 5}, {"thread_id": ""}, {"thread_id": S("t")},
             {"thread_id": "t", "checkpoint_ns": 0}, {"thread_id": "t", "checkpoint_ns": S("n")}]
    configs = [{"configurable": c} for c in confs] + [{}, {"configurable": None}, []]
    cks = [ck(), ck(id=S("c2")), ck(id=3), ck(channel_values=[]), ck(channel_versions={}),
           ck(channel_versions={1: 1}), {"id": "x", "channel_values": {}}, "nope"]
    metas = [{}, {"step": 1}, None, [("a", 1)]]
    newvs = [{}, {"m": 3}, {"m": 3, "absent": 9}, {5: 1}, None]
    handled = 0
    for config in configs:
        for c in cks:
            for md in metas:
                for nv in newvs:
                    want = _outcome(lambda x: put_args_py(*x), (config, c, md, nv))
                    got = put_args_c(config, c, md, nv, EMPTY)
                    if got is None:
                        continue
                    handled += 1
                    assert want[0] == "ok" and got == want[1]
                    assert [type(x) for x in got] == [type(x) for x in want[1]]
                    assert got[5] is not c and got[8] is not c["channel_values"]
                    assert all(got[8][k] is want[1][8][k] for k in got[8])   # EMPTY itself
    assert handled >= 30


def test_put_writes_args_c_equals_python():
    pytest.importorskip("langgraph.checkpoint.base")
    from collections import deque

    from langgraph.checkpoint.base import WRITES_IDX_MAP

    from durkv.langgraph import put_writes_args_py
    from durkv.langgraph_serde import put_writes_args_c

    class S(str):
        pass

    confs = [{"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"},
             {"thread_id": "t", "checkpoint_id": "c1"},
             {"thread_id": "é", "checkpoint_ns": None, "checkpoint_id": "ç"},
             {"thread_id": "t", "checkpoint_ns": "a|b", "checkpoint_id": None},
             {"thread_id": 5, "checkpoint_id": "c"}, {"thread_id": "", "checkpoint_id": "c"},
             {"thread_id": "t", "checkpoint_id": S("c")}, {"thread_id": "t"},
             {"thread_id": "t", "checkpoint_ns": 0, "checkpoint_id": "c"}]
    configs = [{"configurable": c} for c in confs] + [{}, {"configurable": None}]
    pairs = [("messages", [1]), ("__error__", "e"), ("__interrupt__", None), ("n", 2),
             ("__resume__", 1), ("__scheduled__", {}), ("x", b"")]
    writes_list = [[], pairs, tuple(pairs), deque(pairs), deque(), [("a", 1, 2)],
                   [["a", 1]], [(S("a"), 1)], [(1, 2)], "ab", None, iter(pairs)]
    handled = 0
    for config in configs:
        for writes in writes_list:
            want = _outcome(lambda x: put_writes_args_py(*x), (config, writes))
            got = put_writes_args_c(config, writes, WRITES_IDX_MAP, deque)
            if got is None:
                continue
            handled += 1
            assert want[0] == "ok" and got == want[1]
            assert [type(x) for x in got] == [type(x) for x in want[1]]
            assert [tuple(map(type, x)) for x in got[4]] == \
                [tuple(map(type, x)) for x in want[1][4]]
    assert handled >= 15
