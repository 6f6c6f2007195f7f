"""Checkpoint heads stored as zstd deltas against a keyframe (docs/FORMAT.md section 5,
"Checkpoint heads"): small, read back exactly everywhere, and never another frame's."""

from __future__ import annotations

import operator
import os
import statistics
from typing import Annotated

import msgpack
import pytest
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

import durkv
import durkv.store.replay as replay_mod
from durkv.payload import decode_head, encode_commit
from durkv.store import ckpthead
from durkv.store.ckpthead import KEYFRAME_EVERY
from durkv.errors import NotFoundError
from durkv.langgraph import DurkvSaver
from durkv.store.records import K_CKPT, K_COPY_CKPT, CkptHead, read_head
from durkv.serde import default_serde
from storeinternals import append_frame, backend_of, full_head, heads_of, index_of

_FILLER = "tool call result plan step observe think answer retry search read write " * 14


def _is_delta(h: list) -> bool:
    return h[0] in (K_CKPT, K_COPY_CKPT) and type(h[4]) is int


def _ckpt_frames(s) -> list[tuple[int, bytes, list]]:
    """(lsn, head bytes, head) of every checkpoint frame in the log."""
    out = []
    for lsn, p in backend_of(s).scan(backend_of(s).start_lsn):
        h = read_head(p, lsn)
        if h[0] in (K_CKPT, K_COPY_CKPT):
            out.append((lsn, bytes(decode_head(p, lsn)), h))
    return out


# -- through LangGraph: a superstep that appends one message costs little more than it ---


class AgentState(TypedDict):
    messages: Annotated[list, operator.add]


def _agent(n: int):
    def agent(s):
        i = len(s["messages"])
        return {"messages": [{"role": "assistant", "id": f"m{i}", "content": f"{i} {_FILLER}"}]}

    g = StateGraph(AgentState)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: END if len(s["messages"]) >= n else "agent")
    return g


def _cfg(thread: str, n: int) -> dict:
    return {"configurable": {"thread_id": thread}, "recursion_limit": n + 10}


def test_an_appended_message_costs_a_small_head_through_langgraph(tmp_path):
    """The head of a checkpoint whose only change is one appended message is at most 40%
    of the full head it stands for (it was the full head: ~355 bytes of a ~470-byte
    checkpoint frame), measured from the frames."""
    n = 150
    with DurkvSaver.open(str(tmp_path / "s.durkv"), durability="async") as saver:
        _agent(n).compile(checkpointer=saver).invoke({"messages": []}, _cfg("t", n))
        s = saver.store
        frames = _ckpt_frames(s)
        ratios = []
        for lsn, hb, h in frames:
            if _is_delta(h):
                full = full_head(s, lsn)
                ratios.append(len(hb) / len(full.pack()))
        assert len(frames) > n
        assert len(ratios) >= 0.95 * len(frames), "most checkpoint heads are deltas"
        assert statistics.mean(ratios) <= 0.40, statistics.mean(ratios)
        assert max(ratios) <= 0.5
        # over every checkpoint frame, keyframes included
        whole = sum(len(full_head(s, lsn).pack()) for lsn, _hb, _h in frames)
        assert sum(len(hb) for _l, hb, _h in frames) <= 0.45 * whole


# -- round trips ---------------------------------------------------------------------------


class AesSerde:
    """The default serde's bytes under AES-GCM: ciphertext that does not compress."""

    def __init__(self) -> None:
        from Crypto.Cipher import AES
        self._aes = AES
        self._key = b"0123456789abcdef"

    def dumps(self, obj) -> bytes:
        nonce = os.urandom(12)
        c = self._aes.new(self._key, self._aes.MODE_GCM, nonce=nonce)
        ct, tag = c.encrypt_and_digest(default_serde.dumps(obj))
        return nonce + tag + ct

    def loads(self, b: bytes):
        c = self._aes.new(self._key, self._aes.MODE_GCM, nonce=b[:12])
        return default_serde.loads(c.decrypt_and_verify(b[28:], b[12:28]))


def _serde(name: str):
    if name == "aes":
        pytest.importorskip("Crypto")
        return AesSerde()
    return None


def _put_run(s, thread: str, ns: str, n: int, start: int = 0, prefix: str = "c",
             gen: int = 0) -> None:
    """An agent loop of ``n`` checkpoints with LangGraph-sized heads."""
    got = s.get(thread, ns)
    msgs = list(got.values["msgs"]) if got is not None else []
    parent = got.checkpoint_id if got is not None else None
    for i in range(start, start + n):
        cid = f"{prefix}{i:05d}"
        msgs = msgs + [{"role": "assistant", "content": f"{thread} {i}"}]
        s.put(thread, ns, cid, parent_id=parent,
              checkpoint={"v": 4, "ts": f"2026-11-30T22:02:{i % 60:02d}.{i:06d}+00:00",
                          "versions_seen": {"__input__": {}, "__start__": {"__start__": 1},
                                            "agent": {"branch:to:agent": i}},
                          "updated_channels": ["messages"]},
              metadata={"source": "loop", "step": i, "parents": {},
                        "run_id": f"run-{thread}-{i // 50}", **({"gen": gen} if gen else {})},
              values={"msgs": msgs, "branch:to:agent": None},
              versions={"__start__": 2, "msgs": i + 3, "branch:to:agent": i + 3})
        parent = cid


def _snapshot(s) -> dict:
    """Everything a reader sees of every checkpoint: get by id, history, channel entries
    (those of pruned threads and of copy_thread targets included: a compaction keeps
    them, see tests/test_store_compact.py)."""
    out = {}
    for t in s.threads():
        for ns in s.namespaces(t):
            hist = [(c.checkpoint_id, c.parent_id, c.checkpoint, c.metadata, c.versions,
                     c.values) for c in s.history(t, ns)]
            by_id = {}
            for cid, *_ in hist:
                c = s.get(t, ns, cid)
                by_id[cid] = (c.parent_id, c.checkpoint, c.metadata, c.versions, c.values)
            entries = [(e.checkpoint_id, e.kind, e.value)
                       for e in s.channel_entries(t, ns, "msgs")]
            heads = [(c.checkpoint_id, c.metadata) for c in s.history(t, ns, values=False)]
            out[(t, ns)] = (hist, by_id, entries, heads)
    return out


@pytest.mark.parametrize("serde", ["default", "aes"])
def test_every_checkpoint_reads_back_the_same_after_reopen_prune_copy_compact(
        tmp_path, monkeypatch, serde):
    path = str(tmp_path / "s.durkv")
    # AES: every read decrypts (one item at a time), so fewer checkpoints
    n, nb = (KEYFRAME_EVERY + 40, 70) if serde == "default" else (30, 55)
    # ciphertext saves ~10% against a keyframe, under the quarter the writer asks for:
    # have it write deltas all the same, so that they are what reads back here
    monkeypatch.setattr(ckpthead, "KEEP", 1.0)
    with durkv.open(path, serde=_serde(serde), durability="exit") as s:
        _put_run(s, "a", "", n)
        _put_run(s, "a", "sub", 30)
        _put_run(s, "b", "", nb)
        _put_run(s, "doomed", "", 20)
        frames = _ckpt_frames(s)
        deltas = [h for _l, _hb, h in frames if _is_delta(h)]
        assert len(deltas) >= 0.9 * len(frames)
        before = _snapshot(s)
    with durkv.open(path, serde=_serde(serde)) as s:
        assert _snapshot(s) == before                            # reopen
        lane = index_of(s).ix.lane("a", "")
        kept = set(lane.lsns[-20:])
        if serde == "default":
            # prune drops the keyframe that a kept delta names
            bases = {read_head(backend_of(s).read(lsn), lsn)[4] for lsn in kept}
            assert bases - kept, "a kept checkpoint's keyframe is pruned"
        s.prune(["a"], keep_last=20)
        s.delete_thread("doomed")
        s.delete_runs(["run-b-0"])
        s.copy_thread("a", "c")
        expect = _snapshot(s)
        assert expect[("a", "")][0] == before[("a", "")][0][:20]
        assert expect[("c", "sub")][1] == expect[("a", "sub")][1]
        assert ("doomed", "") not in expect
        _put_run(s, "c", "", 10, start=n, prefix="c")            # puts after the copy
        _put_run(s, "b", "", 10, start=nb)
        expect = _snapshot(s)
        s.compact()
        assert _snapshot(s) == expect         # compacted, same handle
        copies = [h for _l, _hb, h in _ckpt_frames(s)]
        assert all(h[0] == K_COPY_CKPT for h in copies)
        assert sum(_is_delta(h) for h in copies) >= 0.8 * len(copies)
        _put_run(s, "b", "", 5, start=nb + 10)                        # puts after the compaction
        expect = _snapshot(s)
    with durkv.open(path, serde=_serde(serde), read_only=True) as s:
        assert _snapshot(s) == expect         # reopened after compaction
        assert s.verify(deep=True).ok


@pytest.mark.parametrize("serde", ["default", "aes"])
def test_langgraph_state_history_reads_back_the_same_after_compaction(tmp_path, monkeypatch,
                                                                      serde):
    path = str(tmp_path / "s.durkv")
    n = KEYFRAME_EVERY + 20
    monkeypatch.setattr(ckpthead, "KEEP", 1.0)      # deltas even for ciphertext (see above)

    def state_history(saver):
        app = _agent(n).compile(checkpointer=saver)
        return [(st.values, st.config, st.metadata, st.next, st.parent_config, st.created_at)
                for st in app.get_state_history(_cfg("t", n))]

    def open_saver(**kw):
        saver = DurkvSaver.open(path, **kw)
        if serde == "aes":
            from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
            saver.serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
        return saver

    if serde == "aes":
        pytest.importorskip("Crypto")
    with open_saver(durability="async") as saver:
        _agent(n).compile(checkpointer=saver).invoke({"messages": []}, _cfg("t", n))
        before = state_history(saver)
        tup = saver.get_tuple(_cfg("t", n))
        frames = _ckpt_frames(saver.store)
        assert sum(_is_delta(h) for _l, _hb, h in frames) >= 0.9 * len(frames)
    assert len(before) > n
    with open_saver() as saver:
        assert state_history(saver) == before
        saver.store.compact()
        assert state_history(saver) == before
    with open_saver() as saver:
        assert state_history(saver) == before
        assert saver.get_tuple(_cfg("t", n)) == tup


def test_history_reads_each_keyframe_once(tmp_path):
    """A history walk reads a delta's base once, not once per checkpoint."""
    path = str(tmp_path / "s.durkv")
    n = 3 * KEYFRAME_EVERY
    with durkv.open(path) as s:
        _put_run(s, "t", "", n)
    with durkv.open(path, read_only=True) as s:
        reads: dict[int, int] = {}
        real = backend_of(s).read

        def counting(lsn):
            reads[lsn] = reads.get(lsn, 0) + 1
            return real(lsn)

        backend_of(s).read = counting
        got = list(s.history("t", values=False))
        assert len(got) == n
        keyframes = [lsn for lsn, _hb, h in _ckpt_frames(s) if not _is_delta(h)]
        assert len(keyframes) == 3
        # each frame once, and each keyframe once more as the base of its deltas
        assert sum(reads.values()) == n + len(keyframes)
        assert {lsn for lsn, k in reads.items() if k == 2} == set(keyframes)


# -- a delta head never reads as another frame -----------------------------------------------


def _crafted(s, head: list) -> int:
    return append_frame(s, encode_commit(msgpack.packb(head, use_bin_type=True), ()), "sync")


@pytest.mark.parametrize("base", ["writes", "other-thread", "other-ns", "delta", "later",
                                  "journal", "wrong-keyframe", "garbage", "gone"])
def test_a_delta_whose_base_is_not_its_keyframe_is_corruption(tmp_path, base):
    path = str(tmp_path / "s.durkv")
    with durkv.open(path, index_every=0) as s:
        _put_run(s, "t", "", KEYFRAME_EVERY + 5)
        _put_run(s, "u", "", 3)
        _put_run(s, "t", "ns", 3)
        s.put_writes("t", "", "c00003", "task", [(0, "x", 1)])
        wlsn = backend_of(s).next_lsn - 1
        jlsn = s.append_journal("t", {"e": 1})
        frames = {h[3] if h[1] == "t" and h[2] == "" else (h[1], h[2], h[3]): (lsn, h)
                  for lsn, _hb, h in _ckpt_frames(s)}
        lsn5, h5 = frames["c00005"]
        assert _is_delta(h5)
        z = h5[5]
        other = {"writes": wlsn, "other-thread": frames[("u", "", "c00000")][0],
                 "other-ns": frames[("t", "ns", "c00000")][0], "delta": frames["c00004"][0],
                 "later": backend_of(s).next_lsn + 5, "journal": jlsn,
                 "wrong-keyframe": frames[f"c{KEYFRAME_EVERY + 1:05d}"][0],
                 "garbage": h5[4], "gone": h5[4]}[base]
        assert not _is_delta(read_head(backend_of(s).read(frames[f"c{KEYFRAME_EVERY + 1:05d}"][0])))
        if base == "garbage":
            z = z[:-6] + bytes(6)
        lsn = _crafted(s, [K_CKPT, "t", "", "c99999", other, z])
    with durkv.open(path, read_only=True) as s:
        if base == "gone":
            # a keyframe the log no longer holds (as if compacted away under its delta)
            def read(x, real=backend_of(s).read):
                if x == other:
                    raise NotFoundError(f"frame {x} is not in the log")
                return real(x)
            backend_of(s).read = read
        # a keyframe the log no longer holds: NotFoundError, as for any frame a stale
        # reader misses; anything else: CorruptionError; both name the delta's frame
        err = NotFoundError if base == "gone" else durkv.CorruptionError
        with pytest.raises(err, match=f"frame {lsn}") as ei:
            s.get("t", "", "c99999")
        assert ei.value.context["lsn"] == lsn
        with pytest.raises(err):
            list(s.history("t", "", values=False))
        if base != "gone":
            assert s.get("t", "", "c00005").checkpoint_id == "c00005"   # the real one reads


def test_an_older_reader_refuses_a_store_with_delta_heads_at_open(tmp_path, monkeypatch):
    """An older durkv accepts index snapshots of version 2 only and length-checks every
    checkpoint head (CkptHead.of): it replays and stops at the first delta head, loudly."""
    path = str(tmp_path / "s.durkv")
    with durkv.open(path) as s:
        _put_run(s, "t", "", 10)
    # the older reader: version 2 snapshots only, every checkpoint head read as CkptHead
    monkeypatch.setattr(replay_mod, "INDEX_VERSIONS", (2,))
    monkeypatch.setattr(replay_mod, "CkptDeltaHead", CkptHead)
    with pytest.raises(durkv.CorruptionError, match="CkptHead head has 6 fields, needs 9"):
        durkv.open(path, read_only=True)


def test_a_reader_across_recover_never_decodes_against_an_old_keyframe(tmp_path):
    """A reader that cached a keyframe, across `recover --skip-corrupt` and a writer that
    puts the same thread's checkpoint ids again at the cut LSNs (new keyframes where
    the old ones were): before refresh() it never returns the new frames' heads decoded
    against the old keyframe as checkpoints; after it, the new checkpoints read back."""
    import logtools as lt
    from durkv.log import recover
    from durkv.store import open_store

    path = tmp_path / "s.durkv"
    with durkv.open(str(path), segment_bytes=4096, index_every=0) as s:
        _put_run(s, "t", "", 30)
    reader = durkv.open(str(path), read_only=True)
    old = {c.checkpoint_id: c.metadata for c in reader.history("t", values=False)}
    base = read_head(backend_of(reader).read(index_of(reader).ix.lane("t", "").lsns[5]), 5)[4]
    assert base == 0 and 0 in heads_of(reader)._bases   # frame 0: the cached keyframe
    seg, frame = lt.frame_at(path, 0)
    lt.flip_byte(seg.path, frame.offset + lt.FRAME_HDR + 3)
    recover(str(path), skip_corrupt=True)       # cuts the whole log
    # a plain store: durkv.open would first append the cut's REPAIR record (FORMAT.md 6a)
    # at LSN 0, and the checkpoints would not land at the cut LSNs
    with open_store(str(path), index_every=0) as w:
        assert w.get("t") is None
        _put_run(w, "t", "", 30, gen=2)        # the same ids, other heads, at the same LSNs
        assert index_of(w).ix.lane("t", "").lsns[0] == 0
        for i in range(30):
            w.put_writes("t", "", f"c{i:05d}", "task", [(0, "x", i)])
    for cid in old:
        try:
            cp = reader.get("t", "", cid)
        except (durkv.CorruptionError, NotFoundError, durkv.DurkvError):
            continue
        # a read follows the log (issue 17): it may have remapped to the repaired log
        # already -- then it reads the new checkpoint whole, never new bytes decoded
        # against the old keyframe
        assert cp is None or cp.metadata == old[cid] or (
            cp.metadata["gen"] == 2 and cp.metadata["step"] == int(cid[1:]))
    reader.refresh()
    new = {c.checkpoint_id: c.metadata for c in reader.history("t", values=False)}
    assert set(new) == set(old)
    assert all(m["step"] == int(c[1:]) and m["gen"] == 2 for c, m in new.items())
    reader.close()


def _head(i: int, noise: bytes = b"") -> CkptHead:
    return CkptHead(K_CKPT, "t", "", f"c{i:05d}", f"c{i - 1:05d}",
                    b"ts 2026-11-30T22:02:%06d versions_seen agent branch:to:agent" % i + noise,
                    b"source loop step %d parents" % i, {"messages": i, "__start__": 2},
                    {"messages": [2 * i, 0], "branch:to:agent": [2 * i, 1]})


def test_the_writer_keyframes_every_64_deltas_and_backs_off_on_ciphertext(monkeypatch):
    heads = ckpthead.CkptHeads()
    kinds = []
    for i in range(300):
        hb = heads.pack(_head(i))
        heads.written(i)
        kinds.append(type(msgpack.unpackb(hb)[4]) is int)
    assert kinds.count(False) <= 300 // (KEYFRAME_EVERY + 1) + 2
    assert all(kinds[1:KEYFRAME_EVERY + 1])
    # ciphertext: no delta saves a quarter; attempts back off (not one per put)
    tries = []
    real = ckpthead._Keyframe.compress
    monkeypatch.setattr(ckpthead._Keyframe, "compress",
                        lambda self, tail: tries.append(1) or real(self, tail))
    heads = ckpthead.CkptHeads()
    for i in range(300):
        hb = heads.pack(_head(i, os.urandom(1000)))
        heads.written(i)
        assert type(msgpack.unpackb(hb)[4]) is not int
    assert len(tries) <= 12
