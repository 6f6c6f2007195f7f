"""The COMMIT payload laid out in C (``durkv._commitframe``) is FORMAT.md section 5's layout.

``encode_commit`` became one C call (issue 20: the commit path's Python); these tests hold
its bytes to the layout written out here with ``struct`` (the Python version it replaced),
over many inputs -- odd channels, empty entries and items, big and unicode-derived items,
compressed and plain items, F_REFS deltas and SNAPs -- and through a real store and a real
LangGraph graph: every frame decodes to what was encoded, and a bad field raises before
anything is returned.
"""

from __future__ import annotations

import operator
import random
import struct
from typing import Annotated, TypedDict

import pytest
import zstandard

from durkv.payload import (DELTA, F_REFS, F_VALUE, F_ZSTD, FULL, SNAP, CommitEntry,
                           decode_commit, encode_commit, pack_ref)


def layout(head: bytes, entries) -> bytes:
    """FORMAT.md section 5, written out: ``head_len head n_entries`` then each entry's
    24-byte header and its length-prefixed items (little-endian)."""
    out = [struct.pack("<I", len(head)), bytes(head), struct.pack("<I", len(entries))]
    for kind, items, flags, depth, prev_lsn, prev_idx in entries:
        out.append(struct.pack("<BBHIQII", kind, flags, 0, depth, prev_lsn, prev_idx,
                               len(items)))
        for it in items:
            out.append(struct.pack("<I", len(it)))
            out.append(bytes(it))
    return b"".join(out)


def _item(rng: random.Random) -> bytes:
    pick = rng.randrange(7)
    if pick == 0:
        return b""
    if pick == 1:
        return "héllo wörld ✓ 日本語 🙂".encode() * rng.randrange(1, 5)
    if pick == 2:
        return zstandard.ZstdCompressor(level=3).compress(rng.randbytes(rng.randrange(2000)))
    if pick == 3:
        return pack_ref(rng.randrange(1 << 64), rng.randrange(1 << 32))
    if pick == 4:
        return rng.randbytes(rng.randrange(1 << 17))      # a big value
    return rng.randbytes(rng.randrange(64))


def _entry(rng: random.Random):
    kind = rng.choice((FULL, DELTA, SNAP))
    flags = rng.choice((0, F_ZSTD, F_VALUE, F_VALUE | F_ZSTD) + ((F_REFS,) * (kind == DELTA)))
    items = [_item(rng) for _ in range(rng.choice((0, 1, 1, 2, 3, 9)))]
    e = (kind, items, flags, rng.randrange(1 << 32), rng.randrange(1 << 64),
         rng.randrange(1 << 32))
    return CommitEntry(*e) if rng.random() < 0.3 else e


def test_random_payloads_match_the_layout_byte_for_byte():
    rng = random.Random(20)
    for _ in range(400):
        head = rng.randbytes(rng.choice((0, 1, 7, 96, 331, 5000)))
        entries = [_entry(rng) for _ in range(rng.choice((0, 1, 2, 3, 5, 17)))]
        got = encode_commit(head, entries)
        assert got == layout(head, entries)
        assert type(got) is bytes
        h, decoded = decode_commit(got)
        assert h == head
        assert [tuple(e) for e in decoded] == [
            (k, list(i), f, d, pl, pi) for k, i, f, d, pl, pi in entries]


def test_edge_values_tuples_and_buffers():
    big = (1 << 64) - 1, (1 << 32) - 1
    entries = (
        (FULL, (), 0, 0, 0, 0),                             # no items, a tuple of them
        (DELTA, [b""], F_REFS, big[1], big[0], big[1]),     # the largest fields
        (SNAP, [bytearray(b"ab"), memoryview(b"cd")], 0, 0, 0, 0),    # bytes-like items
        (True, [b"x"], False, 0, 0, 0),                     # bools are ints, as for struct
    )
    assert encode_commit(b"", entries) == layout(b"", entries)
    assert encode_commit(bytearray(b"hd"), []) == layout(b"hd", [])
    assert encode_commit(b"hd", ()) == b"\x02\0\0\0hd\0\0\0\0"


@pytest.mark.parametrize("entry, error", [
    ((256, [], 0, 0, 0, 0), OverflowError),                 # kind is a u8
    ((FULL, [], -1, 0, 0, 0), OverflowError),               # flags is a u8
    ((FULL, [], 0, 1 << 32, 0, 0), OverflowError),          # depth is a u32
    ((FULL, [], 0, 0, 1 << 64, 0), OverflowError),          # prev_lsn is a u64
    ((FULL, [], 0, 0, 0, -5), OverflowError),               # prev_idx is a u32
    ((FULL, [], 0, 0, 0), ValueError),                      # 5 fields
    ((FULL, [], 0.0, 0, 0, 0), TypeError),                  # a float field
    ((FULL, [b"a", "text"], 0, 0, 0, 0), TypeError),        # a str item
    ((FULL, b"items", 0, 0, 0, 0), TypeError),              # items not a list
    ("entry", TypeError),
])
def test_a_bad_entry_raises_as_struct_did(entry, error):
    with pytest.raises(error):
        encode_commit(b"head", [(FULL, [b"ok"], 0, 0, 0, 0), entry])
    with pytest.raises(TypeError):
        encode_commit(b"head", iter([]))            # entries: a list or a tuple
    with pytest.raises(TypeError):
        encode_commit("head", [])                   # the head: bytes


def test_store_frames_read_back_through_a_real_store(tmp_path):
    """Checkpoints (FULL, DELTA, SNAP, values) and pending writes whose frames the C
    function lays out read back what was put, after a reopen (the log's C reader)."""
    import durkv

    msgs = []
    with durkv.open(str(tmp_path / "s.durkv"), snapshot_every=4) as s:
        for i in range(12):
            msgs = msgs + [{"i": i, "text": "ü" * (i * 300), "blob": bytes(range(i))}]
            s.put_writes("t", "", f"c{i - 1:03d}" if i else "c000", "task",
                         [(0, "messages", msgs[-1:])])
            s.put("t", "", f"c{i:03d}", checkpoint={"k": i}, metadata={"step": i},
                  values={"messages": msgs, "n": i, "s": "x" * (i * 200)},
                  versions={"messages": i + 1, "n": i + 1, "s": i + 1},
                  parent_id=f"c{i - 1:03d}" if i else None)
    with durkv.open(str(tmp_path / "s.durkv")) as s:
        got = s.get("t", "", "c011")
        assert got.values == {"messages": msgs, "n": 11, "s": "x" * 2200}
        assert s.get("t", "", "c005").values["messages"] == msgs[:6]


def test_odd_channels_empty_values_and_writes_read_back(tmp_path):
    """Channel names of any text, empty lists and strings, a value that starts with the
    zstd magic, an empty put_writes and one of many writes: every frame reads back."""
    import durkv

    odd = {"": [], "ünï cödé ✓": "", "sp ace/\\x": [b"", b"\x28\xb5\x2f\xfd not zstd"],
           "🙂" * 40: {"k": ["v"] * 300}, "n": 0}
    path = str(tmp_path / "s.durkv")
    with durkv.open(path) as s:
        s.put_writes("t", "", "c0", "task", [])
        s.put_writes("t", "", "c0", "task", [(i, f"ch{i}", [i] * i) for i in range(20)])
        s.put("t", "", "c0", checkpoint={}, metadata={}, values=odd,
              versions={k: 1 for k in odd})
    with durkv.open(path) as s:
        assert s.get("t", "", "c0").values == odd
        got = {(w.channel, w.idx): w.value for w in s.get("t", "", "c0").writes}
        assert got == {(f"ch{i}", i): [i] * i for i in range(20)}


def test_a_langgraph_run_reads_back_after_reopen(tmp_path):
    from langgraph.graph import END, START, StateGraph

    from durkv.langgraph import DurkvSaver

    class State(TypedDict):
        n: int
        messages: Annotated[list, operator.add]

    def agent(s):
        return {"n": s["n"] + 1, "messages": [{"n": s["n"], "text": "ø" * 700}]}

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["n"] < 40 else END)
    cfg = {"configurable": {"thread_id": "t"}, "recursion_limit": 60}
    path = str(tmp_path / "g.durkv")
    with DurkvSaver.open(path) as saver:
        g.compile(checkpointer=saver).invoke({"n": 0, "messages": []}, cfg,
                                             durability="async")
    with DurkvSaver.open(path) as saver:
        st = g.compile(checkpointer=saver).get_state(cfg)
    assert st.values["n"] == 40
    assert st.values["messages"] == [{"n": i, "text": "ø" * 700} for i in range(40)]
