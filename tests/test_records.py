"""Typed record heads (issue 8 item 2): each record kind has one NamedTuple whose bytes are
those of the msgpack list the store always wrote, and one checked decoder, read_head.

The literal lists below are the heads as the code before the typed heads wrote them
(``msgpack.packb([...], use_bin_type=True)``); the fixture store of the first release is
decoded frame by frame and packed again to the same bytes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import msgpack
import pytest

import durkv
from durkv.payload import decode_head, encode_commit
from durkv.errors import CorruptionError
from durkv.store import records as r
from storeinternals import append_frame, backend_of

FIXTURE = Path(__file__).parent / "fixtures" / "v1-store"

CASES = [
    (r.CkptHead(r.K_CKPT, "t", "", "c2", "c1", b"ck", b"me", {"a": 2, "b": "v.1", "c": 1.5},
                {"a": [3, 0], "b": [1, 2]}),
     [1, "t", "", "c2", "c1", b"ck", b"me", {"a": 2, "b": "v.1", "c": 1.5},
      {"a": [3, 0], "b": [1, 2]}]),
    (r.CkptHead(r.K_COPY_CKPT, "t", "ns", "c1", None, b"", b"\x80", {}, {}),
     [8, "t", "ns", "c1", None, b"", b"\x80", {}, {}]),
    (r.WritesHead(r.K_WRITES, "t", "", "c1", "task", "p|1", False,
                  [[0, "ch", b"v"], [1, "xs", 0], [2, "ys", [5, 1]]]),
     [2, "t", "", "c1", "task", "p|1", False, [[0, "ch", b"v"], [1, "xs", 0], [2, "ys", [5, 1]]]]),
    (r.WritesHead(r.K_COPY_WRITES, "t", "", "c1", "task", "", True, []),
     [9, "t", "", "c1", "task", "", True, []]),
    (r.DelThreadHead(r.K_DEL_THREAD, "t"), [3, "t"]),
    (r.CopyThreadHead(r.K_COPY_THREAD, "src", "dst"), [4, "src", "dst"]),
    (r.RemoveHead(r.K_REMOVE, [["t", "", ["c1", "c2"]]]), [5, [["t", "", ["c1", "c2"]]]]),
    (r.CompactBeginHead(r.K_COMPACT_BEGIN), [6]),
    (r.CompactEndHead(r.K_COMPACT_END, 41), [7, 41]),
    # version 3: the layout of 2, in a log that may hold delta checkpoint heads
    (r.IndexHead(r.K_INDEX, r.INDEX_VERSION, 99, -1, [["t", []]], [["run", b"\1"]]),
     [10, 3, 99, -1, [["t", []]], [["run", b"\1"]]]),
    (r.CkptDeltaHead(r.K_CKPT, "t", "", "c3", 17, b"(\xb5/\xfd"),
     [1, "t", "", "c3", 17, b"(\xb5/\xfd"]),
    (r.JournalHead(r.K_JOURNAL, "run-1", {"kind": "step", "n": 1}),
     [11, "run-1", {"kind": "step", "n": 1}]),
    (r.JournalHead(r.K_COPY_JOURNAL, "run-1", b"opaque"), [12, "run-1", b"opaque"]),
    (r.DelJournalHead(r.K_DEL_JOURNAL, ["run-1", "run-2"]), [13, ["run-1", "run-2"]]),
    (r.RepairHead(r.K_REPAIR, ["run-1", "run-2"], {"e": 20, "rep": "x"}),
     [14, ["run-1", "run-2"], {"e": 20, "rep": "x"}]),
]


@pytest.mark.parametrize("typed, literal", CASES, ids=lambda x: type(x).__name__)
def test_each_typed_head_packs_to_the_bytes_of_the_old_list(typed, literal):
    old = msgpack.packb(literal, use_bin_type=True)
    assert typed.pack() == old
    assert r.pack_head(typed) == old
    assert msgpack.Packer(use_bin_type=True).pack(typed) == old    # the store's put path
    payload = encode_commit(old, ())
    h = r.read_head(payload, 7)
    assert h == literal
    assert type(typed).of(h, 7) == typed


def test_the_first_release_store_decodes_and_packs_back_byte_for_byte(tmp_path):
    d = tmp_path / "v1.durkv"
    shutil.copytree(FIXTURE, d)
    (d / "expected.json").unlink()
    typed = {r.K_CKPT: r.CkptHead, r.K_COPY_CKPT: r.CkptHead, r.K_WRITES: r.WritesHead,
             r.K_COPY_WRITES: r.WritesHead, r.K_DEL_THREAD: r.DelThreadHead,
             r.K_COPY_THREAD: r.CopyThreadHead, r.K_REMOVE: r.RemoveHead,
             r.K_COMPACT_BEGIN: r.CompactBeginHead, r.K_COMPACT_END: r.CompactEndHead,
             r.K_JOURNAL: r.JournalHead, r.K_COPY_JOURNAL: r.JournalHead,
             r.K_DEL_JOURNAL: r.DelJournalHead}
    seen = set()
    with durkv.open(str(d), read_only=True) as s:
        for lsn, payload in backend_of(s).scan(backend_of(s).start_lsn):
            h = r.read_head(payload, lsn)
            if h[0] not in typed:     # K_INDEX of version 1 (5 fields) is passed over on open
                continue
            t = typed[h[0]].of(h, lsn)
            assert t.pack() == bytes(decode_head(payload)), f"frame {lsn}"
            seen.add(h[0])
    assert {r.K_CKPT, r.K_COMPACT_BEGIN, r.K_COPY_CKPT, r.K_COPY_WRITES, r.K_COMPACT_END} <= seen


@pytest.mark.parametrize("payload, says", [
    (b"", "shorter than 8 bytes"),
    (b"\x05\0\0\0\x91\x01", "shorter than 8 bytes"),
    (b"\x40\0\0\0\x91\x01\0\0\0\0", "head length past the end"),
    (encode_commit(b"\xc1", ()), "not msgpack"),
    (encode_commit(b"\x91", ()), "not msgpack"),                   # a list cut short
    (encode_commit(msgpack.packb(7), ()), "int, not a non-empty list"),
    (encode_commit(msgpack.packb("abc"), ()), "str, not a non-empty list"),
    (encode_commit(msgpack.packb({"a": 1}), ()), "dict, not a non-empty list"),
    (encode_commit(msgpack.packb([]), ()), "list, not a non-empty list"),
])
def test_a_malformed_head_is_a_corruption_error_naming_the_frame(payload, says):
    with pytest.raises(CorruptionError, match=rf"frame 12\b.*{says}") as ei:
        r.read_head(payload, 12)
    assert ei.value.context["lsn"] == 12


@pytest.mark.parametrize("cls, short", [
    (r.CkptHead, [1, "t", "", "c"]), (r.WritesHead, [2, "t"]), (r.IndexHead, [10, 2, 5, -1, []]),
    (r.JournalHead, [11, "run"]), (r.CopyThreadHead, [4, "a"]), (r.CompactEndHead, [7]),
])
def test_a_head_too_short_for_its_kind_is_a_corruption_error(cls, short):
    with pytest.raises(CorruptionError, match=f"frame 3 .*{cls.__name__} head has"):
        cls.of(short, 3)


def test_a_longer_head_keeps_its_known_fields():
    """A later version may add fields at the end: this reader keeps the ones it knows."""
    assert r.DelThreadHead.of([3, "t", "extra"], 1) == r.DelThreadHead(3, "t")


@pytest.mark.parametrize("head", [[r.K_CKPT, "t"], [r.K_WRITES, "t", ""], [r.K_COPY_THREAD, "a"],
                                  [r.K_DEL_THREAD], [r.K_JOURNAL, "run"]])
def test_opening_a_store_with_a_short_record_is_a_corruption_error(tmp_path, head):
    """Replay took ``h[1]``.. of any head: a short one escaped as an IndexError."""
    path = str(tmp_path / "s.durkv")
    with durkv.open(path, index_every=0) as s:
        append_frame(s, encode_commit(msgpack.packb(head, use_bin_type=True), ()), "sync")
        lsn = backend_of(s).next_lsn - 1
    with pytest.raises(CorruptionError, match=f"frame {lsn} ") as ei:
        durkv.open(path, index_every=0)
    assert ei.value.context["lsn"] == lsn


def test_compaction_copies_the_fields_a_later_version_added(tmp_path):
    """A checkpoint head with fields after the known ones (a newer writer's) keeps them
    when this version compacts it (the typed head reads only its own fields)."""
    path = str(tmp_path / "s.durkv")
    with durkv.open(path, index_every=0) as s:
        head = [r.K_CKPT, "t", "", "c1", None, s.serde.dumps({"id": "c1"}),
                s.serde.dumps({}), {}, {}, "a later field"]
        append_frame(s, encode_commit(msgpack.packb(head, use_bin_type=True), ()), "sync")
    with durkv.open(path, index_every=0) as s:       # replayed: the index holds c1
        s.compact()
        copies = [r.read_head(p, lsn) for lsn, p in backend_of(s).scan(backend_of(s).start_lsn)
                  if r.read_head(p, lsn)[0] == r.K_COPY_CKPT]
        assert copies == [[r.K_COPY_CKPT, *head[1:]]]
        assert s.get("t", "", "c1").checkpoint == {"id": "c1"}
