"""The checkpoint store: threads, checkpoints, delta-encoded channels, pending writes.

Every change is ONE log frame (a COMMIT payload, docs/FORMAT.md section 5)
whose head is a msgpack list starting with a record kind; deletes, copies and
prunes are small records too, so a reopen replays them. The index is rebuilt at
open from the frame heads only: from the newest ``K_INDEX`` snapshot on, when the
log has one (``index_every``).

>>> import durkv
>>> with durkv.open("memory://") as store:
...     store.put("t", "", "1", checkpoint={}, metadata={}, values={"msgs": ["hi"]},
...               versions={"msgs": 1})
...     store.put("t", "", "2", checkpoint={}, metadata={}, values={"msgs": ["hi", "yo"]},
...               versions={"msgs": 2}, parent_id="1")
...     [c.values["msgs"] for c in store.history("t")]
[['hi', 'yo'], ['hi']]

:class:`Store` is the facade: it checks arguments, holds the lock and the open/closed
state, and composes the objects that do the work, each of its own module --
:class:`~durkv.store.appender.Appender` (frames to the backend),
:class:`~durkv.store.replay.LogIndex` (the index, replay, snapshots),
:class:`~durkv.store.ckpthead.CkptHeads` (checkpoint heads: keyframes and deltas),
:class:`~durkv.store.delta.ChannelEncoder` (channel encoding, the newest state),
:class:`~durkv.store.writer.Writer` (put, put_writes, journal records),
:class:`~durkv.store.reads.Reads` and :class:`~durkv.store.history.History`,
:class:`~durkv.store.edits.Edits` (deletes, copies, prunes) and
:class:`~durkv.store.compact.Compaction`.
"""

from __future__ import annotations

import os
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

from .. import repairnotes
from ..backends.base import VerifyReport
from ..errors import ConfigError, DurkvError, ReadOnlyError, StoreClosedError
from ..payload import Codec, encode_record
from ..serde import Serde, default_serde
from .appender import Appender
from .ckpthead import CkptHeads
from . import drivers
from .compact import Compaction
from .delta import ChannelEncoder
from .drivers import DriverClaim
from .edits import Edits
from .history import History
from .reads import Reads
from .records import (
    DURABILITIES, K_JOURNAL, K_REPAIR, ChannelEntry, Checkpoint, check_id, check_ids, check_limit,
    check_opt_id, heads_of, JournalHead, RepairHead,
)
from .repair import CutContents, local_path, read_cut
from .replay import LogIndex
from .stats import StoreStats
from .stats import collect as collect_stats
from .writer import PackedRecord, Writer, check_put, check_writes, journal_payload

__all__ = ["Store", "open_store"]

FRAME_HEADER_BYTES = 24     # every frame's header in a segment (FORMAT.md section 3)
_stores: weakref.WeakSet = weakref.WeakSet()     # every Store of this process (see below)


def _disown_all_in_child() -> None:
    """In a child made by ``os.fork()``: every store handle the parent opened refuses all
    work from now on (docs/GUARANTEES.md section 8). Its index and its backend are the
    parent's; a write would interleave with the parent's frames and a close would flush
    and snapshot into the parent's log. The backend's log lets go of its files itself
    (``durkv.log``). Runs once per fork: nothing is checked per commit."""
    for store in list(_stores):
        store._disown()


os.register_at_fork(after_in_child=_disown_all_in_child)


class _Section:
    """What :meth:`Store._writing` returns: one reusable object per store, whose state is
    the store's ``_wdepth``/``_wopen`` (sections nest). A class rather than a generator
    context manager: every commit and every current read enters one, and the generator's
    machinery was ~10% of a lone process's ``exit`` commit (issue 17)."""

    __slots__ = ("_s",)

    def __init__(self, store: "Store") -> None:
        self._s = store

    def __enter__(self) -> None:
        s = self._s
        s._lock.acquire()
        if not s._shared or s._wdepth or s._closed:
            if s._failure is not None and not s._wdepth and not s._closed:
                err = s._failure()      # a backend that failed closed (an s3:// writer
                if err is not None:     # fenced, or whose PUT failed): every call raises,
                    s._lock.release()   # reads too -- its index holds frames S3 may not
                    raise err
            s._wdepth += 1
            return
        try:
            s._b.write_begin()
        except BaseException:
            s._lock.release()
            raise
        s._wdepth = 1
        s._wopen = True
        try:
            s._catch_up()
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: Any) -> bool:
        s = self._s
        try:
            s._wdepth -= 1
            if not s._wdepth and s._wopen:
                s._wopen = False
                b = s._b
                # every frame since the catch-up is this process's, taken into the index
                # by the writer itself: replay goes on after them next time
                end = b.next_lsn
                s._index.scan_pos = max(s._index.scan_pos, end)
                if s._owe_flush:
                    # an async commit's wait, in the section's end: one call (a GIL
                    # hand-off) fewer per commit (Store._settle)
                    s._owe_flush = False
                    if b.write_end_async():
                        s._written_to = end
                else:
                    b.write_end()
        finally:
            s._lock.release()
        return False


class Store:
    """A checkpoint store over one backend. Create with :func:`durkv.open`."""

    def __init__(self, backend: Any, *, url: str, durability: str = "sync",
                 read_only: bool = False, serde: Serde | None = None, snapshot_every: int = 64,
                 compress_min_bytes: int = 1024, max_commit_bytes: int = 256 << 20,
                 delta_check: str = "prefix", index_every: int = 50_000) -> None:
        self._b = backend
        self.url = url
        self.read_only = read_only = bool(read_only or backend.read_only)
        self.serde = serde = serde if serde is not None else default_serde
        self._dumps, self._loads = serde.dumps, serde.loads
        self._delta_check = delta_check
        self._lock = threading.RLock()
        self._wdepth = 0            # write sections open (under _lock): see _writing
        self._wopen = False         # the outermost of them holds a section of the log
        self._section = _Section(self)
        # an async commit in the open section: its end also hands the frames to the flusher
        self._owe_flush = False
        self._written_to = 0        # frames below: written and owed an fdatasync (_settle)
        # a local store several processes write: sections take its cross-process write lock
        self._shared = not read_only and hasattr(backend, "write_begin")
        # the error a backend failed with, for one that fails closed on its own (s3://; a
        # local log raises from write_begin)
        self._failure: Callable[[], DurkvError | None] | None = getattr(backend, "failure",
                                                                         None)
        self._closed = False
        self._pid = os.getpid()     # the process that opened it
        self._forked = False        # this process is a fork of that one
        codec = Codec(compress_min_bytes)
        self._appender = Appender(backend, durability, max_commit_bytes)
        self._index = LogIndex(backend, self._appender, url, index_every)
        # checkpoint heads: the writer's keyframes, the readers' delta bases (FORMAT.md 5)
        self._heads = heads = CkptHeads()
        self._encoder = ChannelEncoder(backend, serde, codec, heads,
                                       snapshot_every=snapshot_every, delta_check=delta_check)
        self._writer = Writer(self._appender, self._index, self._encoder, heads, serde, codec,
                              url)
        self._reads = Reads(backend, self._index, self._encoder, heads, serde, codec, url)
        self._history = History(self._lock, self._check_open, backend, self._index,
                                self._reads)
        self._edits = Edits(self._appender, self._index, self._writer, self._reads)
        self._load_index()
        self._fast_journal = self._journal_fast_path(durability)
        # a cut by `recover --skip-corrupt` leaves a note (FORMAT.md 6a): looked for once
        # here, so that a store never repaired costs its runs nothing
        self._path = local_path(backend)
        self._repaired = self._path is not None and repairnotes.any_notes(self._path)
        if not read_only:
            self._index.end_shadow()    # a compaction cut short: its copies are dead (or all)
            if self._index.compacted_at > backend.start_lsn:
                # a compaction finished (END is durable) but its old frames were not removed
                backend.remove_prefix(self._index.compacted_at)
        _stores.add(self)

    def _journal_fast_path(self, durability: str) -> tuple | None:
        """What run.step's C entry needs to append a new step's record itself, as
        :meth:`append_journal`'s one-call path does (csrc/journalscan.c, fast_append): on
        a local log several processes share, under a policy no one waits for the record
        under; else None (the Python path). The entry checks that the store's
        ``pack_journal`` and ``append_journal`` are still these (not overridden or
        wrapped) at every record."""
        b = self._b
        if not self._shared or durability == "sync" or not hasattr(b, "journal_fast_path"):
            return None
        fast = b.journal_fast_path(durability)
        if fast is None:
            return None
        return (self._lock.acquire, self._writer, self._index, self._appender, *fast,
                journal_payload, K_JOURNAL, Store.pack_journal, Store.append_journal,
                self._lock.release)

    # -- the index, as the log builds it (durkv.store.replay) --------------------------------

    def _load_index(self) -> None:
        """Build the index from the log: the newest snapshot, then the frames after it."""
        self._index.reset()
        self._written_to = 0    # a repaired log may reuse LSNs: nothing is known written
        self._heads.forget()    # after a repair an LSN may hold another frame (FORMAT.md 2a)
        self._reads.forget_results()
        self._writer.results.clear()
        self._writer.items.clear()
        self._restore_index()
        self._replay()

    def _restore_index(self) -> None:
        self._index.restore()

    def _replay(self) -> None:
        self._index.replay()

    # -- several writers (FORMAT.md "Several writers") ---------------------------------------

    def _writing(self) -> "_Section":
        """The store's lock and, on a local store, a write section of its log: this
        process holds the store's write lock and the index has taken in every frame
        other processes committed, so a check-then-append (idempotent writes, deltas
        on the newest checkpoint, a decision) is atomic across processes. The frames
        are written to the OS when the section ends; fsyncs are waited for after it,
        outside every lock (group commit). Use as ``with self._writing():``."""
        return self._section

    def _catch_up(self) -> None:
        """In a write section: replay the frames other processes appended since ours."""
        if self._b.next_lsn > self._index.scan_pos:
            self._appender.forget()
            self._writer.forget_retries()   # a foreign delete may change what a retry means
            self._index.catch_up()

    @contextmanager
    def _current(self) -> Iterator[None]:
        """The store's lock, with the index current: a writer catches up with other
        processes' frames (a write section: a flock and an fstat when nothing moved); a
        read-only handle on a local store refreshes if the log's tail moved (one stat)."""
        if self.read_only:
            with self._lock:
                if not self._closed:
                    self.refresh_if_moved()
                yield
            return
        with self._writing():
            yield

    def claim_driver(self, kind: str, key: str) -> DriverClaim | None:
        """Claim run (``kind="run"``) or LangGraph thread (``"thread"``) ``key`` for this
        driver, across processes (:mod:`durkv.store.drivers`): RunBusyError naming the
        holder's pid if another driver holds it. None on a store that is not a local
        directory (a memory store has one process; an s3:// store one writer)."""
        self._check_open()
        if self._path is None:
            return None
        return drivers.claim(self._path, kind, key)

    def driver_pid(self, kind: str, key: str) -> int | None:
        """The pid of the process driving run (``kind="run"``) or LangGraph thread
        (``"thread"``) ``key`` now, or None (:func:`durkv.store.drivers.driver_pid`; None
        on a store that is not a local directory). Takes no lock: safe beside the driver."""
        self._check_open()
        return None if self._path is None else drivers.driver_pid(self._path, kind, key)

    def claim_held(self, kind: str, key: str) -> int | None:
        """Whether a driver holds run/thread ``key`` now, by its lock
        (:func:`durkv.store.drivers.claim_held`: its pid, never a reused one), else None
        (always None on a store that is not a local directory)."""
        self._check_open()
        return None if self._path is None else drivers.claim_held(self._path, kind, key)

    # the store's options, each held once by the object that uses it (read-only: reopen the
    # store to change one)
    durability = property(lambda self: self._appender.durability)
    max_commit_bytes = property(lambda self: self._appender.max_commit_bytes)
    snapshot_every = property(lambda self: self._encoder.snapshot_every)
    delta_check = property(lambda self: self._delta_check)

    @property
    def commits_survive_kill(self) -> bool:
        """Whether a returned commit survives a process kill under this store's policy:
        under ``sync`` everywhere, and under every policy on a local store (its frames are
        written when their write section ends, docs/GUARANTEES.md 18); not under
        ``async``/``exit`` on ``s3://`` (frames wait in memory for a PUT) or ``memory://``.
        The runtime reads it to decide which journal records need an fdatasync of their
        own (docs/GUARANTEES.md 16.9)."""
        return self._shared or self.durability == "sync"

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else self.durability
        return f"<durkv.Store {self.url} {mode}{' closed' if self._closed else ''}>"

    def flush(self) -> None:
        """Make every commit so far durable, under any policy."""
        with self._lock:
            self._check_open()
            self._appender.flush()

    def close(self, *, snapshot: bool = True) -> None:
        """Flush and release the backend. Idempotent. A writer appends an index snapshot
        first when frames were committed since the last one (the next open replays
        less); ``snapshot=False`` skips it: a handle whose work was refused (a ``durkv
        compact`` beside a running agent would add a snapshot of the whole index per
        try, for the agent's commits)."""
        with self._lock:
            if self._closed:
                return
            try:
                if not self.read_only and snapshot:
                    with self._writing():
                        if self._index.stale():
                            self._index.write_snapshot()
            except Exception:
                pass    # a snapshot is only a shortcut; the log is intact without it
            finally:
                self._closed = True
                self._b.close()

    def verify(self, deep: bool = False) -> VerifyReport:
        """Check the stored bytes (``deep``: decode every frame and resolve its channel
        references too, and on a local store its references to journal records): a
        :class:`durkv.backends.base.VerifyReport`, the same shape for every backend.

        >>> import durkv
        >>> with durkv.open("memory://") as s:
        ...     s.verify().ok
        True
        """
        return self._b.verify(deep)

    def refresh(self) -> None:
        """See frames a concurrent writer committed since open (read-only handles; a
        writer's index is always current, so this is a no-op for it)."""
        with self._lock:
            self._check_open()
            if self.read_only:
                if self._b.refresh():
                    self._load_index()      # the log was repaired under us: remap from scratch
                else:
                    self._replay()

    def refresh_if_moved(self) -> bool:
        """Read-only handles on a local store: :meth:`refresh` if a writer appended since
        the last one (one ``stat`` decides: the cost of a read that finds nothing new does
        not grow with the store). True if it refreshed. Other backends: False (call
        :meth:`refresh`); writers: False (always current)."""
        self._check_open()      # closed, or a fork's copy: refused, never "nothing moved"
        moved = getattr(self._b, "tail_moved", None)
        if not self.read_only or moved is None or not moved():
            return False
        self.refresh()
        return True

    def size_bytes(self) -> int:
        self._check_open()      # a fork's copy would measure the parent's files as of the fork
        return self._b.size_bytes()

    def _check_open(self) -> None:
        if self._closed:
            if self._forked:
                raise ConfigError(
                    f"store {self.url} was opened by process {self._pid} and this process "
                    f"({os.getpid()}) is a fork of it: a store handle is never used across "
                    "fork(); open the store again in this process (durkv.open after the "
                    "fork, e.g. in gunicorn's post_fork or a multiprocessing initializer)")
            raise StoreClosedError(f"store {self.url} is closed; open it again with durkv.open()")

    def _disown(self) -> None:
        """In a forked child: closed for good, without a flush, a snapshot or a backend
        close (see :func:`_disown_all_in_child`). The lock may have been held by a thread
        the child does not have: it is made new, as CPython's own modules (threading,
        logging) do with theirs after a fork, so a call raises instead of hanging."""
        self._lock._at_fork_reinit()
        self._closed = True
        self._forked = True

    def _check_write(self) -> None:
        self._check_open()
        if self.read_only:
            raise ReadOnlyError(f"store {self.url} is open read-only; "
                                "open it without read_only=True to write")

    def _durability(self, durability: str | None) -> str | None:
        if durability is not None and durability not in DURABILITIES:
            raise ConfigError(f"unknown durability {durability!r}; use one of "
                              + ", ".join(DURABILITIES))
        return durability

    # -- writes (durkv.store.writer) ---------------------------------------------------------

    def put(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, *, checkpoint: dict,
            metadata: dict, values: dict[str, Any], versions: dict[str, Any],
            parent_id: str | None = None, durability: str | None = None,
            all_values: dict[str, Any] | None = None) -> None:
        """Commit one checkpoint as one frame.

        Args:
            checkpoint: opaque record (LangGraph: its checkpoint dict minus channel_values).
            metadata: metadata dict (``history(filter=...)`` matches on it).
            values: new values of the channels whose version changed.
            versions: ALL channel versions of this checkpoint. A channel in ``versions``
                but not in ``values`` keeps its entry of the base -- the parent (or
                newest) checkpoint -- when ``all_values`` is None; a channel absent from
                both has no value.
            parent_id: the checkpoint this one follows (None: the newest of the thread+ns).
            durability: override the store's policy for this commit.
            all_values: every value of the checkpoint (LangGraph: ``channel_values``).
                Given, a channel in ``versions`` but not in ``values`` keeps the base's
                entry only when the base holds it at the same version (a version names
                one value, as LangGraph's savers key blobs by it); otherwise it is
                stored from ``all_values`` (or has no value if absent there). A copy or
                fork -- saved whole with nothing in ``values`` -- then reads back its
                own values, never its base's; a linear put still costs only its change.

        Raises:
            ConfigError: missing/empty ids. SerializationError: a value the serde
                cannot encode (nothing is committed). FrameTooLargeError: the commit
                exceeds ``max_commit_bytes``.
        """
        check_put(thread_id, checkpoint_ns, checkpoint_id, parent_id, values, versions,
                  all_values)
        if durability is not None:
            self._durability(durability)
        dur = durability or self.durability
        writer = self._writer
        ckpt_b, meta_b = writer.serialize(checkpoint, metadata, checkpoint_id, thread_id)
        with self._writing():
            if self._closed or self.read_only:
                self._check_write()
            lsn = writer.put(thread_id, checkpoint_ns, checkpoint_id, parent_id, ckpt_b, meta_b,
                             values, versions, all_values)
            self._owe_flush |= dur == "async"
        # outside the lock, so that concurrent committers share one write and one fsync
        self._settle(lsn, dur)

    def put_writes(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str,
                   writes: Sequence[tuple[int, str, Any]], *, task_path: str = "",
                   durability: str | None = None) -> None:
        """Store pending writes ``(idx, channel, value)`` of a task against a checkpoint.

        Idempotent on (thread, ns, checkpoint, task, idx), as LangGraph's savers: a
        later write to an existing key is ignored, unless every write of the call
        is to a special channel (``__error__``, ``__interrupt__``, ...), which
        overwrite. Default durability: written to the OS (``async``) -- they ride
        on the next commit's fsync and survive a process kill -- or buffered under
        the ``exit`` policy.
        """
        check_writes(thread_id, checkpoint_ns, checkpoint_id, task_id, writes, task_path)
        dur = self._durability(durability)
        if dur is None:
            dur = "exit" if self.durability == "exit" else "async"
        if not writes:
            return
        recs, lists, replace = self._writer.encode_writes(task_id, writes)
        with self._writing():
            self._check_write()
            self._writer.note_rewritten(thread_id, checkpoint_ns, checkpoint_id, writes)
            lsn = self._writer.put_writes(thread_id, checkpoint_ns, checkpoint_id, task_id,
                                          task_path, recs, lists, replace, dur)
            self._owe_flush |= dur == "async"
        self._settle(lsn, dur)      # outside the lock (group commit)

    def _settle(self, lsn: int, durability: str) -> None:
        """Outside the lock: give frame ``lsn`` its promise (:meth:`Appender.settle`). An
        ``async`` frame that the end of its write section already wrote and handed to the
        flusher (``_written_to``, under the lock; it only grows) needs no call."""
        if durability == "async" and lsn < self._written_to:
            return
        self._appender.settle(lsn, durability)

    # -- reads (durkv.store.reads, durkv.store.history) --------------------------------------

    def get(self, thread_id: str, checkpoint_ns: str = "",
            checkpoint_id: str | None = None) -> Checkpoint | None:
        """A checkpoint with its values and pending writes; ``None`` id = the newest.

        Returns None when there is no such checkpoint.
        """
        check_id("thread_id", thread_id)
        check_id("checkpoint_ns", checkpoint_ns, allow_empty=True)
        check_opt_id("checkpoint_id", checkpoint_id)
        with self._current():
            self._check_open()
            return self._reads.get(thread_id, checkpoint_ns, checkpoint_id)

    def history(self, thread_id: str | None = None, checkpoint_ns: str | None = None, *,
                before: str | None = None, limit: int | None = None,
                filter: dict | None = None,  # noqa: A002
                values: bool = True) -> Iterator[Checkpoint]:
        """Checkpoints newest first (by id, across threads too), streamed.

        Args:
            thread_id: one thread, or None for all.
            checkpoint_ns: one namespace, or None for all.
            before: only checkpoints with an id lower than this.
            limit: at most this many.
            filter: metadata keys that must equal the given values (a key the metadata
                lacks equals None, as in LangGraph's savers).
            values: False yields headers only -- ids, parent, checkpoint record,
                metadata and versions, with ``values == {}`` and ``writes == []``:
                one frame read per checkpoint, no channel read, no deserialized value.

        Each yielded checkpoint has its own ``values`` dict and, for a list channel,
        its own list object (mutating it changes no other checkpoint), as ``get``
        returns; non-list values are deserialized afresh per checkpoint (immutable
        scalars may be shared). The **items** of list channels may be shared
        between the checkpoints of one walk: an older checkpoint's list is a prefix
        slice of a newer one's whenever the newer entry extends the older (the
        agent-loop case), which makes a full listing O(total items) rather than
        O(N^2) reads and deserializations (see the module docstring). Do not mutate
        the items in place if you keep several checkpoints' values.
        """
        if thread_id is not None:
            check_id("thread_id", thread_id)
        if checkpoint_ns is not None:
            check_id("checkpoint_ns", checkpoint_ns, allow_empty=True)
        check_opt_id("before", before)
        check_limit(limit)
        if filter is not None and not isinstance(filter, dict):
            raise ConfigError(f"filter must be a dict of metadata keys and values, got "
                              f"{type(filter).__name__}")
        with self._current():       # other processes' commits count (FORMAT.md 12)
            self._check_open()
        return self._history.checkpoints(thread_id, checkpoint_ns, before, limit, filter,
                                         values)

    def channel_entries(self, thread_id: str, checkpoint_ns: str, channel: str, *,
                        before: str | None = None,
                        limit: int | None = None) -> Iterator[ChannelEntry]:
        """What each checkpoint wrote to ``channel``, newest first, relative to its parent.

        Yields a :class:`ChannelEntry` per checkpoint of (thread, ns) whose entry for
        the channel is not its parent's (checkpoints that left it unchanged or have no
        value are skipped): ``"append"`` with only the items it appended to its
        parent's value, ``"full"`` with the whole list, or ``"value"`` for a non-list
        value. A checkpoint whose parent the thread no longer holds (the oldest kept
        after :meth:`prune`, the first after a :meth:`delete_runs` gap) or that was put
        without a ``parent_id`` reports its whole value (``"full"``/``"value"``): its
        history before it is gone or unknown, and no checkpoint is said to have
        appended another's items. So reading the appends back to the nearest
        ``"full"`` rebuilds each checkpoint's list without reading it whole at every
        step. The same before and after :meth:`compact` and a reopen; a
        :meth:`copy_thread` target lists its source's entries (docs/GUARANTEES.md
        section 10).
        """
        check_id("thread_id", thread_id)
        check_id("checkpoint_ns", checkpoint_ns, allow_empty=True)
        check_id("channel", channel)
        check_opt_id("before", before)
        check_limit(limit)
        return self._history.channel_entries(thread_id, checkpoint_ns, channel, before, limit)

    def threads(self) -> list[str]:
        """Ids of the threads that have at least one checkpoint, sorted."""
        with self._current():
            return sorted(t for t, nss in self._index.ix.threads.items()
                          if any(lane.ids for lane in nss.values()))

    def has_checkpoint(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> bool:
        """Whether checkpoint ``checkpoint_id`` of the thread and namespace is committed
        (an index lookup: no frame is read)."""
        check_id("thread_id", thread_id)
        check_id("checkpoint_ns", checkpoint_ns, allow_empty=True)
        check_id("checkpoint_id", checkpoint_id)
        with self._current():
            return self._in_index(thread_id, checkpoint_ns, checkpoint_id)

    def holds_checkpoint(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> bool:
        """:meth:`has_checkpoint` as this handle's index stands, without catching up with
        other processes (no write section: one lookup under the lock). True for every
        checkpoint this handle committed, as soon as its put returned (or, for a put
        that runs in another thread, as soon as its frame was queued: any record appended
        after this answer lands after it in the log). False may be stale: ask
        :meth:`has_checkpoint` for a checkpoint another process commits."""
        with self._lock:
            self._check_open()
            return self._in_index(thread_id, checkpoint_ns, checkpoint_id)

    def _in_index(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> bool:
        lane = self._index.ix.lane(thread_id, checkpoint_ns)
        return lane is not None and lane.find(checkpoint_id) >= 0

    def namespaces(self, thread_id: str) -> list[str]:
        """Namespaces of a thread that have at least one checkpoint, sorted."""
        check_id("thread_id", thread_id)
        with self._current():
            nss = self._index.ix.threads.get(thread_id, {})
            return sorted(n for n, lane in nss.items() if lane.ids)

    # -- deletes, copies, prunes (durkv.store.edits) -----------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Remove a thread: every namespace, checkpoint and pending write."""
        check_id("thread_id", thread_id)
        with self._writing():
            self._check_write()
            self._edits.delete_thread(thread_id)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every namespace, checkpoint and pending write of a thread to another
        (merged into the target if it exists). The copy shares the source's frames.

        Raises:
            RunConflictError: both threads have a run journal. Two journals merged in
                log order would make the target replay the source's recorded results
                (and effects) as its own; nothing is written.
        """
        check_id("thread_id", source_thread_id)
        check_id("thread_id", target_thread_id)
        with self._writing():
            self._check_write()
            self._edits.copy_thread(source_thread_id, target_thread_id)

    def delete_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints (and their writes) whose ``metadata["run_id"]`` is in
        ``run_ids``. Reads every checkpoint's metadata: O(checkpoints). A bare string
        is one run id (``delete_runs("run-1")``), never a set of characters."""
        runs = set(check_ids("run_ids", run_ids))    # a bare string is one run id
        if not runs:
            return
        with self._writing():
            self._check_write()
            self._edits.delete_runs(runs)

    def prune(self, thread_ids: Sequence[str], *, keep_last: int = 1,
              keep: Mapping[tuple[str, str], Collection[str]] | None = None) -> None:
        """Per (thread, ns) of the given threads keep only the newest ``keep_last``
        checkpoints (0: remove all) -- or, for a (thread, ns) in ``keep``, exactly the
        checkpoint ids given there and any newer than the newest of them (a fork's
        chain is not the newest ids). Kept checkpoints still read correctly: their
        delta chains stay in the log until :meth:`compact` copies what they need."""
        thread_ids = check_ids("thread_ids", thread_ids)    # a bare string is one id
        if not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 0:
            raise ConfigError(f"keep_last must be an int >= 0, got {keep_last!r}")
        if keep is not None:
            keep = _keep_map(keep)
        with self._writing():
            self._check_write()
            self._edits.prune(thread_ids, keep_last, keep)

    # -- run journals (the records of durkv.runtime; docs/FORMAT.md section 5a) -------------

    def append_journal(self, run_id: str, record: Any, *, durable: bool = False,
                       defer: bool = False, written: bool = False) -> int:
        """Append one journal record of ``run_id``; return its LSN.

        ``record`` is a msgpack-able dict (user values already serde bytes), or a typed
        record whose type gives its map (durkv.runtime.records: ``E``, ``KEYS``, ``KEEP``,
        ``pack()``; its frame is packed in C from the fields, csrc/recpack.c), or what
        :meth:`pack_journal` made of one for this run (the caller keeps its bytes). With
        ``durable=True`` it is fdatasync'd before this returns whatever the store's
        policy (concurrent callers share one fsync); otherwise the store's policy applies.
        ``defer=True``: a record owed an fdatasync is only queued; the caller then calls
        :meth:`wait_journal` with the LSN (an async verb, in a worker thread).
        ``written=True``: whatever the policy, the record is appended as ``async`` appends
        it (no wait for its fdatasync; the caller waits for what it needs: a keyed tool's
        intent under ``sync``, docs/GUARANTEES.md 16.9).
        """
        if type(run_id) is not str or not run_id:
            check_id("run_id", run_id)
        # the policy from the appender, not through the property (a Python frame a record)
        wait = not written and (durable or self._appender.durability == "sync")
        if not wait and self._shared:
            # the hot path of a running agent: a record no one waits for, by a thread in no
            # write section, is appended in a section of its own in one backend call
            with self._lock:
                if not self._wdepth and not self._closed:
                    lsn = self._writer.append_journal_alone(run_id, record)
                    if lsn >= 0:
                        return lsn
        with self._writing():
            if self._closed or self.read_only:
                self._check_write()
            lsn = self._writer.append_journal(run_id, record, wait)
        if wait and not defer:
            self._appender.settle(lsn, "sync")      # outside the lock: group commit
        return lsn

    def pack_journal(self, run_id: str, record: Any) -> PackedRecord:
        """``record`` packed as :meth:`append_journal` would append it (raises what it would
        raise for it: ConfigError, SerializationError, FrameTooLargeError): its ``payload``
        is the bytes the log gets; appended by ``append_journal(run_id, packed)``."""
        return self._writer.pack_journal(run_id, record)

    def append_journal_if(self, run_id: str,
                          make: Callable[[list[dict]], dict | None]) -> int | None:
        """Append the journal record ``make(records)`` returns, ``records`` being the run's
        journal as it is at the moment of the append: the read, ``make``'s check and the
        append are one step, across threads and (on a local store) across processes --
        inside one write section, after catching up with every other process's frames.
        ``make`` returns None to append nothing, or raises to refuse (nothing appended).
        The record is fdatasync'd before this returns, whatever the store's policy.
        Returns its LSN, or None. (``decide``/``resolve``: of two contradictory answers,
        the second sees the first.)"""
        if type(run_id) is not str or not run_id:
            check_id("run_id", run_id)
        with self._writing():
            self._check_write()
            rec = make(self.journal(run_id))
            if rec is None:
                return None
            lsn = self._writer.append_journal(run_id, rec, True)
        self._appender.settle(lsn, "sync")      # outside the lock: group commit
        return lsn

    def item_place(self, item: bytes) -> list[int] | None:
        """Where a recent pending write of this process stored a list item whose serialized
        bytes are ``item``: ``[lsn, entry, index]`` (a run's journal record names it there
        rather than journal it again: FORMAT.md 5a ``ir``), or None. The first call turns
        the store's memory of such items on."""
        items = self._writer.items
        if not items.wanted:
            items.wanted = True
            return None
        return items.recent.get(item)

    def write_item(self, lsn: int, entry: int, index: int) -> bytes:
        """The serialized bytes of the pending-write item a journal record's ``ir`` names
        (``[lsn, entry, index]``, :meth:`item_place`); raises CorruptionError when frame
        ``lsn`` holds no such item, NotFoundError when the log no longer holds it."""
        with self._current():
            self._check_open()
            return self._reads.write_item(lsn, entry, index)

    def journal_bytes(self, run_id: str) -> int:
        """The bytes of the run's journal frames in the log (each frame's payload and its
        24-byte frame header, FORMAT.md 3): what its records cost on disk. A local store
        counts them from its segments' frame offsets; others read each frame once.
        (``s3://``: what they take in a segment.)"""
        with self._current():
            self._check_open()
            lsns = self._index.ix.journals.get(run_id) or ()
            return FRAME_HEADER_BYTES * len(lsns) + self._b.payload_bytes(lsns)

    def wait_journal(self, lsn: int) -> None:
        """Block until journal record ``lsn`` (and all before it) is fdatasync'd: the wait
        an ``append_journal(..., defer=True)`` left to its caller."""
        self._appender.settle(lsn, "sync")

    def journal(self, run_id: str, *, start: int = 0) -> list[dict]:
        """The journal records of ``run_id`` in log order (read by LSN, no scan); from
        the ``start``-th on (a resume that needs only the newest records reads only them)."""
        with self._current():
            lsns = self._journal_lsns(run_id, start)
            if not lsns:
                return []
            # one read of every record's head and one decode (not one binding call each)
            return [JournalHead.of(h, lsn).rec
                    for h, lsn in zip(heads_of(self._b.read_heads(lsns)), lsns)]

    def journal_heads(self, run_id: str, *, start: int = 0) -> Any:
        """The frame heads of :meth:`journal`'s records, undecoded: one msgpack array (a
        bytes-like buffer) of ``[kind, id, record]`` lists, in one read (a replay decodes
        only what it needs of them: durkv.runtime.journal.fold_lazy)."""
        with self._current():
            lsns = self._journal_lsns(run_id, start)
            return self._b.read_heads(lsns) if lsns else b"\x90"

    def _journal_lsns(self, run_id: str, start: int) -> Any:
        """The LSNs of ``run_id``'s journal records from the ``start``-th on (under the lock)."""
        if type(start) is not int or start < 0:
            raise ConfigError(f"start must be an int >= 0, got {start!r}")
        self._check_open()
        lsns = self._index.ix.journals.get(run_id)
        return lsns[start:] if start and lsns else lsns

    def journal_length(self, run_id: str) -> int:
        """How many journal records ``run_id`` has (O(1): a reader's staleness check)."""
        lsns = self._index.ix.journals.get(run_id)
        return len(lsns) if lsns is not None else 0

    def journal_runs(self) -> list[str]:
        """Ids of the runs that have a journal, sorted."""
        with self._current():
            self._check_open()
            return sorted(self._index.ix.journals)

    # -- repairs of the log (docs/FORMAT.md 6a; durkv.runtime.repair decides their runs) ----

    @property
    def repaired(self) -> bool:
        """Whether ``recover --skip-corrupt`` ever cut this store's log (a note in
        ``repairs/``, looked for at open): only then may a run's journal hold a repair."""
        return self._repaired

    def pending_repairs(self) -> list[dict]:
        """The notes of cuts no REPAIR record names yet (a writer's job: none when
        read-only), oldest first."""
        self._check_open()
        if self._path is None or self.read_only:
            return []
        return repairnotes.pending(self._path)

    def repair_note(self, note_id: str) -> Any:
        """``with store.repair_note(id) as note:`` -- the note as it is on disk, under its
        exclusive lock (one process records a cut; the others find it recorded)."""
        return repairnotes.locked(self._path, note_id)

    def cut_contents(self, note: dict) -> CutContents:
        """The run and thread ids read from the quarantined bytes of a note's cut (a
        ``planned`` note: whatever quarantine/ gained since it was written)."""
        files = note.get("files")
        if files is None:
            before = set(note.get("before", ()))
            files = [n for n in repairnotes.quarantine_names(self._path) if n not in before]
        return read_cut(self._path, files, note["lost_first_lsn"])

    def record_repair(self, note: dict, run_ids: list[str], rec: dict) -> int:
        """Append the REPAIR record (``rec`` becomes a journal record of every run in
        ``run_ids``; fdatasync'd), then mark ``note`` recorded. Returns the record's LSN."""
        payload = encode_record(RepairHead(K_REPAIR, run_ids, rec).pack())
        with self._writing():
            self._check_write()
            lsn = self._appender.queue(payload)
            self._index.apply(lsn, [K_REPAIR, run_ids, rec])
        self._appender.settle(lsn, "sync")      # outside the lock
        repairnotes.write(self._path, dict(note, state="recorded", repair_lsn=lsn,
                                           runs=run_ids, threads=rec.get("threads", [])))
        self._repaired = True
        return lsn

    # -- compaction, archive -----------------------------------------------------------------

    def compact(self, progress: Callable[[int, int], None] | None = None) -> dict:
        """Copy live data to the tail and drop everything older (crash-safe).

        Returns ``{"bytes_before", "bytes_after", "checkpoints_kept",
        "journal_records_kept"}``. ``progress(done, total)`` is called as the
        checkpoints are copied (a command's progress bar).
        """
        with self._writing():
            self._check_write()
            # other processes' indexes point at the frames it moves: it runs with the
            # store alone (StoreLockedError while another process has it open to write)
            alone = getattr(self._b, "exclusive", None)
            if self._shared and alone is not None:
                alone(True)
            try:
                self._writer.forget_frames()     # every LSN is about to move
                return Compaction(self._b, self._appender, self._index, self._reads,
                                  self._heads, self.url).run(progress)
            finally:
                if self._shared and alone is not None:
                    alone(False)

    def stats(self, progress: Callable[[int, int], None] | None = None, *,
              whole_values: bool = True) -> StoreStats:
        """What the store holds and where its bytes go (:mod:`durkv.store.stats`): one
        scan of the log, then (``whole_values``) what every live checkpoint's channel
        values would take stored whole. Works on a read-only handle alongside a writer
        (the figures are those of the log's tail when it starts). ``progress(done,
        total)`` as it goes.

        >>> import durkv
        >>> with durkv.open("memory://") as s:
        ...     s.put("t", "", "1", checkpoint={}, metadata={}, values={"x": [1, 2]},
        ...           versions={"x": 1})
        ...     st = s.stats()
        >>> st.threads, st.checkpoints, st.frames
        (1, 1, 1)
        """
        with self._current():
            self._check_open()
            return collect_stats(self._b, self._index, self._heads, self.url, self._path,
                                 progress, whole_values)

    def archive(self, url: str, *, seal: bool = False, **options: Any) -> Any:
        """Archive this (local) store's sealed segments to ``s3://bucket/prefix``; with
        ``seal``, seal the active segment first so that every commit so far goes too.
        Options and result: :func:`durkv.backends.s3.archive` (needs ``durkv[s3]``)."""
        from durkv.backends.s3 import archive_backend

        with self._lock:
            self._check_open()
        # the lock is held only to seal: commits go on while sealed segments upload
        return archive_backend(self._b, url, seal=seal, lock=self._lock, **options)

    # -- open --------------------------------------------------------------------------------

    @classmethod
    def open(cls, url: str, *, durability: str = "sync", read_only: bool = False,
             serde: Serde | None = None, snapshot_every: int = 64,
             compress_min_bytes: int = 1024, segment_bytes: int | None = None,
             flush_interval_ms: int = 10, recovery: str = "tolerate_tail",
             max_commit_bytes: int = 256 << 20, delta_check: str = "prefix",
             index_every: int = 50_000, takeover: bool = False) -> Any:
        """Open (creating if needed) a store.

        Args:
            url: a path or ``file://path`` (local C log), ``memory://`` (private) or
                ``memory://name`` (shared within the process).
            durability: ``sync`` | ``async`` | ``exit`` (see DESIGN.md).
            read_only: a reader: no lock, no writes; call ``refresh()`` to see new commits.
            serde: an object with ``dumps``/``loads``; default msgpack with extension types.
            snapshot_every: deltas between SNAP entries of a list channel (K).
            compress_min_bytes: zstd-compress serialized items at least this large.
            segment_bytes, flush_interval_ms, recovery: passed to the local log.
            max_commit_bytes: refuse (FrameTooLargeError) a commit larger than this.
            delta_check: how a new list is recognised as the old one plus appended items:
                ``"prefix"`` (the default; exact: the whole committed prefix is compared,
                one memcmp of item pointers, ~0.15 ns per item, and any difference writes a
                FULL entry) or
                ``"identity"`` (O(1): first/middle/last items must be the same objects; only
                for callers whose lists change by appending alone -- a replacement at another
                position plus an append in one step is NOT seen). See :mod:`durkv.store.delta`.
            index_every: append an index snapshot (``K_INDEX``) every this many frames, and
                at close and after a compaction when anything was committed since the last
                one, so that open replays only the frames after it. 0: write none (open
                still uses the snapshots already in the log).
            takeover: ``s3://`` only: take the store over from a writer that died; that
                writer is fenced (its next commit fails with ``FencedError``).

        >>> import durkv
        >>> store = durkv.open("memory://")
        >>> store.put("t", "", "1", checkpoint={}, metadata={}, values={"x": 1}, versions={"x": 1})
        >>> store.get("t").values
        {'x': 1}
        """
        from durkv.backends import open_backend

        url = _check_url(url)
        _check_options(segment_bytes, flush_interval_ms, recovery, durability, snapshot_every,
                       compress_min_bytes, index_every, delta_check, max_commit_bytes, serde)
        backend = open_backend(url, durability=durability, read_only=read_only,
                               segment_bytes=segment_bytes, flush_interval_ms=flush_interval_ms,
                               recovery=recovery, takeover=takeover)
        try:
            return cls(backend, url=str(url), durability=durability, read_only=read_only,
                       serde=serde, snapshot_every=snapshot_every,
                       compress_min_bytes=compress_min_bytes,
                       max_commit_bytes=max_commit_bytes, delta_check=delta_check,
                       index_every=index_every)
        except BaseException:
            backend.close()
            raise


# ``durkv.store.open_store(url, ...)``: a plain :class:`Store` (``durkv.open`` gives one
# with the runtime's verbs, :class:`durkv.runtime.RuntimeStore`)
open_store = Store.open


def _check_url(url: Any) -> str:
    """A store URL as a string; a NUL in it is refused, as ``os`` refuses it in a path
    (the C layer would cut the path there: '/w/d3\\0A' opened /w/d3)."""
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str):
        raise ConfigError(f"store URL must be a string or path, got {type(url).__name__}")
    if "\0" in url:
        raise ConfigError(f"store URL {url!r} contains a NUL character, which no path can "
                          "hold; pass the path without it")
    try:
        url.encode()
    except UnicodeEncodeError:
        raise ConfigError(f"store URL {url!r} is not valid Unicode text") from None
    return url



def _check_options(segment_bytes: Any, flush_interval_ms: Any, recovery: Any, durability: Any,
                   snapshot_every: Any, compress_min_bytes: Any, index_every: Any,
                   delta_check: Any, max_commit_bytes: Any, serde: Any) -> None:
    """The options of :meth:`Store.open`, checked before anything is opened."""
    if segment_bytes is not None and (type(segment_bytes) is not int
                                      or not 0 < segment_bytes < (1 << 48)):
        raise ConfigError(f"segment_bytes must be a positive int (bytes), got {segment_bytes!r}")
    if type(flush_interval_ms) is not int or not 0 < flush_interval_ms < (1 << 31):
        raise ConfigError(f"flush_interval_ms must be a positive int, got {flush_interval_ms!r}")
    if not isinstance(recovery, str):
        raise ConfigError(f"recovery must be a string such as 'tolerate_tail', got {recovery!r}")
    if not isinstance(durability, str) or durability not in DURABILITIES:
        raise ConfigError(f"unknown durability {durability!r}; use one of "
                          + ", ".join(DURABILITIES))
    if type(snapshot_every) is not int or snapshot_every < 1:      # True is no count
        raise ConfigError(f"snapshot_every must be an int >= 1, got {snapshot_every!r}")
    if type(compress_min_bytes) is not int or compress_min_bytes < 0:
        raise ConfigError(f"compress_min_bytes must be an int >= 0, got {compress_min_bytes!r}")
    if type(index_every) is not int or index_every < 0:
        raise ConfigError(f"index_every must be an int >= 0, got {index_every!r}")
    if delta_check not in ("identity", "prefix"):
        raise ConfigError(f"delta_check must be 'identity' or 'prefix', got {delta_check!r}")
    if type(max_commit_bytes) is not int or not 0 < max_commit_bytes < (1 << 30):
        raise ConfigError("max_commit_bytes must be between 1 and 1 GiB - 1, "
                          f"got {max_commit_bytes!r}")
    if serde is not None and not (callable(getattr(serde, "dumps", None))
                                  and callable(getattr(serde, "loads", None))):
        raise ConfigError("serde must have dumps(obj) -> bytes and loads(bytes) -> obj")
    if serde is not None:
        # one probe for the common mistake (a json.dumps serde returns str): refused here,
        # not as a TypeError from inside the first put
        try:
            probe = serde.dumps({"probe": [1, "x"]})
        except Exception:   # noqa: BLE001 - a serde of other types: its puts will say
            probe = b""
        if not isinstance(probe, (bytes, bytearray, memoryview)):
            raise ConfigError(f"serde.dumps must return bytes, got {type(probe).__name__} "
                              f"from {type(serde).__name__}.dumps; encode it, e.g. "
                              "json.dumps(obj).encode()")


def _keep_map(keep: Any) -> dict:
    """``prune``'s ``keep``, checked: ``{(thread_id, checkpoint_ns): frozenset(ids)}``."""
    if not isinstance(keep, Mapping):
        raise ConfigError(f"keep must map (thread_id, checkpoint_ns) to checkpoint ids, got "
                          f"{type(keep).__name__}")
    out = {}
    for key, ids in keep.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise ConfigError(f"keep must map (thread_id, checkpoint_ns) to checkpoint ids, "
                              f"got the key {key!r}")
        check_id("thread_id", key[0])
        check_id("checkpoint_ns", key[1], allow_empty=True)
        out[key] = frozenset(check_ids("checkpoint_ids", ids))
    return out
