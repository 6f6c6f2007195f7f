"""Edits of the index by small records: delete a thread, copy one, remove checkpoints.

Each is one record appended under the store's policy and waited for (they are rare),
then applied to the index exactly as replay applies it (:mod:`durkv.store.replay`).
:class:`Edits` holds the appender, the :class:`~durkv.store.replay.LogIndex`, the
:class:`~durkv.store.writer.Writer` (whose memory of recent writes an edit voids) and
the :class:`~durkv.store.reads.Reads` (a checkpoint's metadata names its run); the store
checks the arguments and calls it under its lock.
"""

from __future__ import annotations

from typing import Any

from ..errors import RunConflictError, SerializationError
from ..payload import encode_record
from .appender import Appender
from .reads import Reads
from .records import (
    K_COPY_THREAD, K_DEL_JOURNAL, K_DEL_THREAD, K_REMOVE, CopyThreadHead, DelJournalHead,
    DelThreadHead, RemoveHead,
)
from .replay import LogIndex
from .writer import Writer

__all__ = ["Edits"]


class Edits:
    """delete_thread, copy_thread, delete_runs, prune (see :class:`durkv.store.Store`)."""

    def __init__(self, appender: Appender, index: LogIndex, writer: Writer,
                 reads: Reads) -> None:
        self._ap = appender
        self._index = index
        self._writer = writer
        self._reads = reads

    def _commit(self, head: Any) -> int:
        """Append the record ``head`` (a typed head) under the store's policy, waited for."""
        return self._ap.commit(encode_record(head.pack()))

    def delete_thread(self, thread_id: str) -> None:
        ix = self._index.ix
        if thread_id not in ix.threads and thread_id not in ix.journals:
            return
        lsn = self._commit(DelThreadHead(K_DEL_THREAD, thread_id))
        ix.delete_thread(thread_id)
        self._writer.forget_retries()
        self._index.maybe_snapshot(lsn)

    def copy_thread(self, src: str, dst: str) -> None:
        ix = self._index.ix
        if src == dst or (src not in ix.threads and src not in ix.journals):
            return
        if ix.journals.get(src) and ix.journals.get(dst):
            raise RunConflictError(
                f"copy_thread({src!r}, {dst!r}): both are runs with a journal, and merged "
                "journals would replay one run's results in the other; copy to a new id, "
                f"or delete_thread({dst!r}) first", run_id=dst)
        lsn = self._commit(CopyThreadHead(K_COPY_THREAD, src, dst))
        ix.copy_thread(src, dst)
        self._index.maybe_snapshot(lsn)

    def delete_runs(self, runs: set[str]) -> None:
        """Remove the checkpoints whose ``metadata["run_id"]`` is in ``runs`` (every
        checkpoint's metadata is read), and the runs' journals."""
        doomed = []
        for t, n, lane in list(self._index.ix.lanes()):
            cids = [cid for cid, lsn in zip(lane.ids, lane.lsns) if self._run_of(lsn) in runs]
            if cids:
                doomed.append([t, n, cids])
        self.remove(doomed)
        journals = self._index.ix.journals
        gone = sorted(r for r in runs if r in journals)
        if gone:     # the runs' journals go too (a run id is also a journal's key)
            lsn = self._commit(DelJournalHead(K_DEL_JOURNAL, gone))
            for r in gone:
                del journals[r]
            self._index.maybe_snapshot(lsn)

    def _run_of(self, lsn: int) -> str | None:
        """The checkpoint's ``metadata["run_id"]`` if it is a str (run ids are: a list
        there, which a put accepts, is no run's and must not fail the set lookup)."""
        try:
            meta = self._reads.metadata_at(lsn)
        except SerializationError:
            # another serde's checkpoint (a DurkvSaver thread in a store durkv.Graph
            # also uses): its runs are deleted through a handle with that serde
            return None
        run = meta.get("run_id") if isinstance(meta, dict) else None
        return run if isinstance(run, str) else None

    def prune(self, thread_ids: list[str], keep_last: int,
              keep: dict | None = None) -> None:
        doomed = []
        for t in thread_ids:
            for _t, n, lane in list(self._index.ix.lanes(t)):
                ids = None if keep is None else keep.get((t, n))
                if ids:
                    # the ids to keep, and every id newer than the newest of them (put
                    # since the caller chose them: never removed unseen)
                    newest = max(ids)
                    gone = [c for c in lane.ids if c < newest and c not in ids]
                else:
                    cut = len(lane.ids) - keep_last
                    gone = lane.ids[:cut] if cut > 0 else []
                if gone:
                    doomed.append([t, n, gone])
        self.remove(doomed)

    def remove(self, doomed: list) -> None:
        """Remove ``[[thread, ns, [cid, ...]], ...]`` (one K_REMOVE record)."""
        if not doomed:
            return
        lsn = self._commit(RemoveHead(K_REMOVE, doomed))
        self._writer.forget_retries()
        ix = self._index.ix
        for t, n, cids in doomed:
            ix.remove(t, n, cids)
        self._index.maybe_snapshot(lsn)
