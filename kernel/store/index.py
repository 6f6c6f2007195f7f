"""The store's in-memory index: where each checkpoint and pending write lives.

Rebuilt at open by replaying the heads of the COMMIT frames after the newest
``K_INDEX`` record (:func:`load_index` of its state), or of every frame. Per
(thread, namespace) a :class:`Lane` keeps compact parallel arrays -- no Python
object per checkpoint besides its id string:

- ``ids``: checkpoint ids, sorted ascending (LangGraph ids are uuid6, so puts
  append; an out-of-order id is inserted with bisect);
- ``lsns``: ``array('Q')``, the frame LSN of each checkpoint;
- ``wk``/``wv``: ``array('Q')`` pairs (checkpoint frame LSN, pending-write
  frame LSN), sorted by ``wk``, present only for checkpoints that have writes;
- ``orphans``: writes to a checkpoint id not (yet) in the lane.

Everything else about a checkpoint (parent, metadata, versions, channel refs)
is in its frame head and read on demand. The newest checkpoint's state is kept
materialized in ``Lane.newest`` by the store (see :mod:`durkv.store.delta`).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right
from itertools import islice
from operator import lt
from typing import Any, Iterable

from ..log import check_lsns

__all__ = ["Lane", "Index", "dump_index", "load_index", "dump_journals", "load_journals"]

_SWAP = sys.byteorder != "little"    # K_INDEX arrays are little-endian u64


class Lane:
    """Checkpoints and pending writes of one (thread, namespace)."""

    __slots__ = ("ids", "lsns", "wk", "wv", "orphans", "newest")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.lsns = array("Q")
        self.wk = array("Q")
        self.wv = array("Q")
        self.orphans: dict[str, list[int]] | None = None
        self.newest: Any = None   # the store's materialized latest state, or None (load lazily)

    def __len__(self) -> int:
        return len(self.ids)

    def find(self, cid: str) -> int:
        ids = self.ids
        if ids and ids[-1] == cid:
            return len(ids) - 1     # the newest: a pending write of the running superstep
        pos = bisect_left(ids, cid)
        if pos < len(ids) and ids[pos] == cid:
            return pos
        return -1

    def add(self, cid: str, lsn: int) -> int:
        """Record checkpoint ``cid`` at frame ``lsn`` (a re-put replaces); returns its position."""
        ids = self.ids
        if not ids or cid > ids[-1]:
            ids.append(cid)
            self.lsns.append(lsn)
            pos = len(ids) - 1
        else:
            pos = bisect_left(ids, cid)
            if pos < len(ids) and ids[pos] == cid:
                old = self.lsns[pos]
                self.lsns[pos] = lsn
                moved = self.writes_of(old)
                if moved:
                    self._drop_writes({old})
                    for w in moved:
                        self._insert_write(lsn, w)
            else:
                ids.insert(pos, cid)
                self.lsns.insert(pos, lsn)
        if self.orphans:
            self.add_orphans(cid, lsn)
        return pos

    def add_orphans(self, cid: str, lsn: int) -> None:
        """Attach writes that arrived before checkpoint ``cid`` (now at ``lsn``)."""
        ws = self.orphans.pop(cid, None) if self.orphans else None
        for w in ws or ():
            self._insert_write(lsn, w)

    def add_write(self, cid: str, wlsn: int) -> None:
        pos = self.find(cid)
        if pos < 0:
            if self.orphans is None:
                self.orphans = {}
            self.orphans.setdefault(cid, []).append(wlsn)
        else:
            self._insert_write(self.lsns[pos], wlsn)

    def _insert_write(self, key: int, wlsn: int) -> None:
        wk = self.wk
        if not wk or key >= wk[-1]:
            wk.append(key)
            self.wv.append(wlsn)
        else:
            i = bisect_right(wk, key)
            wk.insert(i, key)
            self.wv.insert(i, wlsn)

    def writes_of(self, ckpt_lsn: int) -> list[int]:
        """Pending-write frame LSNs of the checkpoint stored at ``ckpt_lsn``, in append order."""
        wk = self.wk
        if not wk:
            return []
        lo = bisect_left(wk, ckpt_lsn)
        hi = bisect_right(wk, ckpt_lsn, lo)
        return sorted(self.wv[lo:hi]) if hi > lo else []

    def orphan_writes(self) -> dict[str, list[int]]:
        return dict(self.orphans) if self.orphans else {}

    def _drop_writes(self, ckpt_lsns: set[int]) -> None:
        keep = [(k, v) for k, v in zip(self.wk, self.wv) if k not in ckpt_lsns]
        self.wk = array("Q", [k for k, _ in keep])
        self.wv = array("Q", [v for _, v in keep])

    def remove(self, cids: Iterable[str]) -> bool:
        """Drop checkpoints (and their writes); returns True if the newest one went."""
        doomed = set(cids)
        if not doomed or not self.ids:
            return False
        latest = self.ids[-1]
        gone: set[int] = set()
        ids, lsns = [], array("Q")
        for cid, lsn in zip(self.ids, self.lsns):
            if cid in doomed:
                gone.add(lsn)
            else:
                ids.append(cid)
                lsns.append(lsn)
        self.ids, self.lsns = ids, lsns
        if self.orphans:
            for cid in doomed:
                self.orphans.pop(cid, None)
        if gone:
            self._drop_writes(gone)
        return latest in doomed

    def copy(self) -> "Lane":
        other = Lane()
        other.ids = list(self.ids)
        other.lsns = array("Q", self.lsns)
        other.wk = array("Q", self.wk)
        other.wv = array("Q", self.wv)
        other.orphans = {k: list(v) for k, v in self.orphans.items()} if self.orphans else None
        return other

    def merge_from(self, src: "Lane") -> None:
        """Add every checkpoint and write of ``src`` (same frames) to this lane."""
        by_lsn: dict[int, list[int]] = {}
        for k, v in zip(src.wk, src.wv):
            by_lsn.setdefault(k, []).append(v)
        for cid, lsn in zip(src.ids, src.lsns):
            self.add(cid, lsn)
            for w in by_lsn.get(lsn, ()):
                self._insert_write(lsn, w)
        for cid, ws in src.orphan_writes().items():
            for w in ws:
                self.add_write(cid, w)


class Index:
    """thread id -> namespace -> :class:`Lane`; run id -> its journal records' LSNs."""

    __slots__ = ("threads", "journals")

    def __init__(self) -> None:
        self.threads: dict[str, dict[str, Lane]] = {}
        self.journals: dict[str, array] = {}

    def add_journal(self, run_id: str, lsn: int) -> None:
        lsns = self.journals.get(run_id)
        if lsns is None:
            lsns = self.journals[run_id] = array("Q")
        lsns.append(lsn)

    def copy_journal(self, src: str, dst: str) -> None:
        """The target's journal becomes the union of both (a copy shares the frames)."""
        lsns = self.journals.get(src)
        if not lsns or src == dst:
            return
        have = self.journals.get(dst)
        self.journals[dst] = array("Q", sorted(set(have) | set(lsns)) if have else lsns)

    def lane(self, thread_id: str, ns: str, create: bool = False) -> Lane | None:
        nss = self.threads.get(thread_id)
        if nss is None:
            if not create:
                return None
            nss = self.threads[thread_id] = {}
        lane = nss.get(ns)
        if lane is None and create:
            lane = nss[ns] = Lane()
        return lane

    def add_checkpoint(self, thread_id: str, ns: str, cid: str, lsn: int) -> Lane:
        lane = self.lane(thread_id, ns, True)
        lane.add(cid, lsn)
        if lane.newest is not None and cid >= lane.newest.cid:
            lane.newest = None
        return lane

    def add_write(self, thread_id: str, ns: str, cid: str, lsn: int) -> None:
        self.lane(thread_id, ns, True).add_write(cid, lsn)

    def delete_thread(self, thread_id: str) -> None:
        self.threads.pop(thread_id, None)
        self.journals.pop(thread_id, None)

    def copy_thread(self, src: str, dst: str) -> None:
        self.copy_journal(src, dst)
        nss = self.threads.get(src)
        if not nss or src == dst:
            return
        out = self.threads.setdefault(dst, {})
        for ns, lane in nss.items():
            have = out.get(ns)
            if have is None or not (have.ids or have.orphans):
                out[ns] = lane.copy()
            else:
                have.merge_from(lane)
                have.newest = None

    def remove(self, thread_id: str, ns: str, cids: Iterable[str]) -> None:
        lane = self.lane(thread_id, ns)
        if lane is None:
            return
        if lane.remove(cids):
            lane.newest = None
        if not lane.ids and not lane.orphans:
            nss = self.threads[thread_id]
            del nss[ns]
            if not nss:
                del self.threads[thread_id]

    def lanes(self, thread_id: str | None = None, ns: str | None = None):
        """``(thread, ns, lane)`` of the matching lanes (sorted by thread, then ns)."""
        threads = [thread_id] if thread_id is not None else sorted(self.threads)
        for t in threads:
            nss = self.threads.get(t)
            if not nss:
                continue
            for n in ([ns] if ns is not None else sorted(nss)):
                lane = nss.get(n)
                if lane is not None:
                    yield t, n, lane


def _abytes(a: array) -> bytes:
    if _SWAP:
        a = array("Q", a)
        a.byteswap()
    return a.tobytes()


def _aload(b: Any, lo: int, hi: int, order: int = 0) -> array:
    """A snapshot's u64 array, each LSN in ``[lo, hi)`` and in ``order`` (0 any, 1
    non-decreasing, 2 ascending), checked in one C pass over the bytes."""
    if type(b) is not bytes or len(b) % 8:
        raise ValueError("array field is not a u64 byte string")
    bad = check_lsns(b, lo, hi, order)
    if bad:
        raise ValueError(f"an LSN outside [{lo}, {hi})" if bad == 1 else
                         "LSNs out of order" if order == 1 else "LSNs not ascending")
    a = array("Q")
    a.frombytes(b)
    if _SWAP:
        a.byteswap()
    return a


def dump_index(ix: Index) -> list:
    """The index as msgpack-able lists (the state of a ``K_INDEX`` record, in dict order):
    ``[[thread, [[ns, ids, lsns, wk, wv, orphans|None], ...]], ...]``; ``lsns``/``wk``/``wv``
    are little-endian u64 byte strings. Materialized heads are not part of it."""
    return [[t, [[n, lane.ids, _abytes(lane.lsns), _abytes(lane.wk), _abytes(lane.wv),
                  lane.orphans] for n, lane in nss.items()]]
            for t, nss in ix.threads.items()]


def load_index(state: Any, lo: int, hi: int) -> Index:
    """Rebuild an :class:`Index` from :func:`dump_index` output; every LSN must lie in
    ``[lo, hi)``. Raises ValueError (or TypeError) on anything malformed."""
    ix = Index()
    threads = ix.threads
    for t, lanes in state:
        if type(t) is not str or t in threads:
            raise ValueError("bad thread id")
        nss = threads[t] = {}
        for n, ids, lsns, wk, wv, orphans in lanes:
            if type(n) is not str or n in nss or type(ids) is not list:
                raise ValueError("bad lane")
            lane = Lane()
            lane.lsns = _aload(lsns, lo, hi)
            lane.wk = _aload(wk, lo, hi, 1)    # write keys: sorted
            lane.wv = _aload(wv, lo, hi)
            if len(ids) != len(lane.lsns) or len(lane.wk) != len(lane.wv):
                raise ValueError("array lengths differ")
            if not (all(type(c) is str for c in ids) and all(map(lt, ids, islice(ids, 1, None)))):
                raise ValueError("checkpoint ids are not sorted strings")
            if orphans is not None:
                if type(orphans) is not dict:
                    raise ValueError("bad orphans")
                for cid, ws in orphans.items():
                    if type(cid) is not str or type(ws) is not list or any(
                            type(w) is not int or not lo <= w < hi for w in ws):
                        raise ValueError("bad orphan writes")
            lane.ids = ids
            lane.orphans = orphans
            nss[n] = lane
    return ix


def dump_journals(ix: Index) -> list:
    """The journals' LSNs as ``[[run_id, lsns], ...]`` (little-endian u64 bytes): the sixth
    element of a version 2 ``K_INDEX`` record."""
    return [[r, _abytes(lsns)] for r, lsns in ix.journals.items()]


def load_journals(ix: Index, state: Any, lo: int, hi: int) -> None:
    """Restore :func:`dump_journals` output into ``ix``; raises ValueError on anything
    malformed (every LSN in ``[lo, hi)``, ascending, one list per run)."""
    journals = ix.journals
    for r, b in state:
        if type(r) is not str or r in journals:
            raise ValueError("bad journal run id")
        journals[r] = _aload(b, lo, hi, 2)     # a journal's LSNs: ascending
