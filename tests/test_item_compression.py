"""Items are written at zstd level 1 (issue 20); stores written at level 3 read alike.

The level is the writer's choice alone (FORMAT.md section 5): a reader recognises a
compressed item by the zstd magic and decompresses whatever frame is there. These tests
write a real store at the old level 3, reopen it with today's writer (level 1), extend
it, and read every checkpoint back; and check that a level-1 item is what is stored.
"""

from __future__ import annotations

import zstandard

import durkv
from durkv import payload
from durkv.store import store as store_module

BIG = {"role": "ai", "text": "lorem ipsum dolor sit amet " * 80}     # > compress_min_bytes


def _put(s, i: int, msgs: list) -> None:
    s.put("t", "", f"c{i:03d}", checkpoint={}, metadata={"step": i},
          values={"messages": msgs, "big": dict(BIG, i=i)},
          versions={"messages": i + 1, "big": i + 1},
          parent_id=f"c{i - 1:03d}" if i else None)


def test_a_store_written_at_level_3_reads_back_and_grows_at_level_1(tmp_path, monkeypatch):
    path = str(tmp_path / "s.durkv")
    msgs: list = []
    with monkeypatch.context() as m:
        m.setattr(store_module, "Codec", lambda min_bytes: payload.Codec(min_bytes, level=3))
        with durkv.open(path) as s:
            for i in range(5):
                msgs = msgs + [dict(BIG, n=i)]
                _put(s, i, msgs)
    with durkv.open(path) as s:             # today's writer: level 1
        for i in range(5, 10):
            msgs = msgs + [dict(BIG, n=i)]
            _put(s, i, msgs)
    with durkv.open(path) as s:
        for i in range(10):
            got = s.get("t", "", f"c{i:03d}").values
            assert got == {"messages": msgs[:i + 1], "big": dict(BIG, i=i)}


def test_items_are_stored_at_level_1():
    data = repr(BIG).encode()
    stored, compressed = payload.Codec().pack(data)
    assert compressed
    assert stored == zstandard.ZstdCompressor(level=1).compress(data)
    assert stored != zstandard.ZstdCompressor(level=3).compress(data)
    assert payload.Codec().unpack(stored) == data
    assert payload.Codec().unpack(zstandard.ZstdCompressor(level=19).compress(data)) == data
