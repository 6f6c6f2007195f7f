"""A put's channels encoded in C (durkv._chanenc) give what ChannelEncoder.encode_py gives.

Two stores take the same hostile run of puts and pending writes -- growing lists, items
replaced, copied (equal, not the same objects), lists that shrink or stop being lists, scalars and None items, items that
compress or look like zstd frames, unicode channels and ids, snapshots every few deltas,
pending writes whose items the next checkpoint refers to (F_REFS), forks off an older
checkpoint, a list subclass, many channels -- one with the C encoder, one with it forced
off. The frames in the log, each newest state the store keeps and every read must be the
same; errors must be the same typed errors.
"""

from __future__ import annotations

import copy
import random

import pytest

import durkv
from durkv.errors import SerializationError
from durkv.store import delta as delta_mod

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class _Off:
    """ChanEncoder forced off: every case and every put's channels to the Python path."""

    def __init__(self, *args):
        pass

    def __call__(self, *args):
        return None

    def channels(self, *args):
        return None


def _off(monkeypatch):
    monkeypatch.setattr(delta_mod, "ChanEncoder", _Off)


def _item(rng, i):
    return rng.choice([
        {"role": "ai", "content": "m" * rng.randrange(0, 3000), "i": i},
        "é" * rng.randrange(0, 600), i, None, 1.5, b"b" * rng.randrange(0, 2000),
        _ZSTD_MAGIC + bytes([i % 256]), True, [i, [i]], ("t", i)])


def _run(path, seed, langgraph=False, **kw):
    """``langgraph``: puts as DurkvSaver makes them -- only the channels whose version
    moved in ``values``, every version, every value in ``all_values`` (a channel only in
    versions is kept from the base at the same version, else stored from all_values)."""
    rng = random.Random(seed)
    states = []
    with durkv.open(path, durability="async", snapshot_every=3, **kw) as s:
        lists = {"messages": [], "ü": [], "log": []}
        ids = []
        for i in range(60):
            cid = f"c{i:04d}"
            parent = ids[-1] if ids else None
            if ids and rng.random() < 0.1:
                parent = rng.choice(ids)          # a fork: FULL entries
            for ch, cur in lists.items():
                r = rng.random()
                if r < 0.6:
                    cur = cur + [_item(rng, i) for _ in range(rng.randrange(0, 3))]
                elif r < 0.7 and cur:
                    cur = list(cur)
                    cur[rng.randrange(len(cur))] = _item(rng, i)     # replaced: FULL
                elif r < 0.75:
                    cur = cur[:len(cur) // 2]                        # shorter: FULL
                elif r < 0.8:
                    cur = copy.deepcopy(cur) + [i]     # equal items, not the same objects
                lists[ch] = cur
            if parent is not None and rng.random() < 0.7:
                new = [_item(rng, i)]
                s.put_writes("t", "ns", parent, f"task{i}", [(0, "messages", new)])
                lists["messages"] = lists["messages"] + new    # the next put refers to it
            values = {ch: list(v) for ch, v in lists.items()}
            if rng.random() < 0.1:
                values["ü"] = "not a list now"
                lists["ü"] = []
            values["n"] = i
            values["none"] = None
            values["big"] = "x" * rng.choice([0, 5000])
            values["magic"] = _ZSTD_MAGIC
            values.update({f"c{j}": j * i for j in range(rng.randrange(0, 20))})
            versions = {ch: i for ch in values}
            all_values = None
            if langgraph:
                all_values = values
                kept = [ch for ch in values if rng.random() < 0.4]
                versions = {ch: (0 if ch in kept else i) for ch in values}
                versions["nan"] = float("nan")      # never equal, even to itself
                all_values = dict(values, nan=i)
                values = {ch: v for ch, v in values.items() if ch not in kept}
            s.put("t", "ns", cid, checkpoint={"ts": i}, metadata={"step": i},
                  values=values, versions=versions, parent_id=parent, all_values=all_values)
            ids.append(cid)
            newest = s._index.ix.lane("t", "ns").newest
            states.append({ch: _state(c) for ch, c in newest.chans.items()})
        s.flush()
        frames = [s._b.read(lsn) for lsn in range(s._b.next_lsn)]
        got = [s.get("t", "ns", c).values for c in ids]
        hist = [(h.checkpoint_id, h.values) for h in s.history("t", "ns")]
    return frames, states, got, hist


def _state(c):
    return (c.ref, c.loaded, c.is_list, c.n, c.as_is, c.vbytes, c.base, list(c.deltas),
            None if c.raw is None else list(c.raw[:c.n]),
            None if c.obj is None else [id(x) for x in c.obj[:c.n]],
            id(c.first), id(c.last), id(c.mid), c.fresh)


def _serde(kind):
    """durkv's own serde, or LangGraph's as DurkvSaver wraps it (its plain-data items are
    kept as copies, not bytes: ChanState.raw)."""
    if kind == "durkv":
        return {}
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from durkv.langgraph_serde import LangGraphSerde
    return {"serde": LangGraphSerde(JsonPlusSerializer())}


@pytest.mark.parametrize("serde", ["durkv", "langgraph"])
@pytest.mark.parametrize("langgraph", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_c_and_python_encoders_write_the_same_log(tmp_path, monkeypatch, seed, langgraph,
                                                  serde):
    c_run = _run(str(tmp_path / "c"), seed, langgraph, **_serde(serde))
    _off(monkeypatch)
    p_run = _run(str(tmp_path / "p"), seed, langgraph, **_serde(serde))
    assert p_run[0] == c_run[0]                 # the frames, byte for byte
    # the newest state, field by field, but the item identities (each run makes its own)
    assert [{k: v[:9] for k, v in st.items()} for st in p_run[1]] == \
        [{k: v[:9] for k, v in st.items()} for st in c_run[1]]
    assert p_run[2] == c_run[2]
    assert p_run[3] == c_run[3]


def test_the_state_keeps_the_items_put_not_the_callers_list(tmp_path):
    with durkv.open(str(tmp_path / "s"), durability="async") as s:
        a, b = {"k": 1}, {"k": 2}
        msgs = [a]
        s.put("t", "", "c1", checkpoint={}, metadata={}, values={"m": msgs}, versions={"m": 1})
        msgs2 = msgs + [b]
        s.put("t", "", "c2", checkpoint={}, metadata={}, values={"m": msgs2},
              versions={"m": 2}, parent_id="c1")
        c = s._index.ix.lane("t", "").newest.chans["m"]
        assert c.obj is not msgs2 and c.obj[0] is a and c.obj[1] is b
        msgs2.append({"k": 3})
        msgs2[0] = {"k": 0}
        assert s.get("t", "").values["m"] == [{"k": 1}, {"k": 2}]


class _Bad:
    def __reduce__(self):
        raise TypeError("cannot pickle _Bad")


@pytest.mark.parametrize("value", [_Bad(), [1, _Bad()], [_Bad()]])
def test_errors_are_the_python_paths(tmp_path, monkeypatch, value):
    def attempt(name):
        with durkv.open(str(tmp_path / name), durability="async") as s:
            s.put("t", "", "c1", checkpoint={}, metadata={}, values={"m": [1]},
                  versions={"m": 1})
            with pytest.raises(SerializationError) as ei:
                s.put("t", "", "c2", checkpoint={}, metadata={}, values={"m": value},
                      versions={"m": 2}, parent_id="c1")
            e = ei.value
            assert s.get("t", "").checkpoint_id == "c1"     # nothing committed
            return str(e), e.context, type(e.__cause__), str(e.__cause__)

    with_c = attempt("c")
    _off(monkeypatch)
    assert attempt("p") == with_c


def test_a_serializer_that_shortens_the_list_while_encoding(tmp_path, monkeypatch):
    def attempt(name):
        box = {}

        class Shrinking:
            def __reduce__(self):
                box["v"].pop()
                return (int, (1,))

        with durkv.open(str(tmp_path / name), durability="async") as s:
            v = box["v"] = [Shrinking(), 1, 2]
            try:
                s.put("t", "", "c1", checkpoint={}, metadata={}, values={"m": v},
                      versions={"m": 1})
            except SerializationError as e:
                return ("err", str(e), type(e.__cause__))
            return ("ok", s.get("t", "").values)

    with_c = attempt("c")
    _off(monkeypatch)
    assert attempt("p") == with_c


def test_identity_mode_and_unloaded_states_take_the_python_path(tmp_path):
    with durkv.open(str(tmp_path / "s"), durability="async", delta_check="identity") as s:
        enc = s._writer._encoder
        assert enc.encode_c("m", [1], None, 5, [], None) is None
        assert enc.encode_c("m", 1, None, 5, [], None) is not None   # a value: C either way
    with durkv.open(str(tmp_path / "s2"), durability="async") as s:
        s.put("t", "", "c1", checkpoint={}, metadata={}, values={"m": [1]}, versions={"m": 1})
    with durkv.open(str(tmp_path / "s2"), durability="async") as s:
        enc = s._writer._encoder
        lane = s._index.ix.lane("t", "")
        newest = enc.newest(lane)
        assert not newest.chans["m"].loaded
        assert enc.encode_c("m", [1, 2], newest.chans["m"], 9, [], None) is None
        s.put("t", "", "c2", checkpoint={}, metadata={}, values={"m": [1, 2]},
              versions={"m": 2}, parent_id="c1")
        assert s.get("t", "").values["m"] == [1, 2]
