"""The one door from the tests into a :class:`durkv.store.Store`'s insides.

The store's public API is what the tests use first. Some tests must see more: the
backend under the store (to read a frame's raw bytes), the replay state (which LSN
holds the newest K_INDEX snapshot), the checkpoint-head cache, or an append of a
hand-built frame. They reach those through the functions here, so a rename inside
the store changes this file and no test.
"""

from __future__ import annotations

from typing import Any

from durkv.store import Store


def backend_of(store: Store) -> Any:
    """The backend the store writes to (``append``/``read``/``scan``, LSNs)."""
    return store._b


def index_of(store: Store) -> Any:
    """The store's replay state (:class:`durkv.store.replay.LogIndex`): ``ix`` (the
    in-memory index), ``index_lsn`` (the newest K_INDEX snapshot), ``shadow``,
    ``shadow_begin``, ``compacted_at``, ``scan_pos`` and ``write_snapshot()``."""
    return store._index


def heads_of(store: Store) -> Any:
    """The store's checkpoint-head cache (:class:`durkv.store.ckpthead.CkptHeads`)."""
    return store._heads


def full_head(store: Store, lsn: int) -> Any:
    """The checkpoint head at ``lsn``, whole (a delta applied to its keyframe)."""
    return store._heads.load(store._b.read, lsn)


def lock_of(store: Store) -> Any:
    """The lock every store call takes (to hold it from a test and see who waits)."""
    return store._lock


def append_frame(store: Store, payload: bytes, durability: str | None = "sync") -> int:
    """Append a hand-built commit payload as the store commits one: queued in a write
    section (its lock, and the log's write lock on a local store), then settled under
    ``durability`` (None: the store's policy) outside it. Returns its LSN."""
    with store._writing():
        lsn = store._appender.queue(payload)
    store._appender.settle(lsn, durability or store.durability)
    return lsn


def crash_store(store: Store) -> None:
    """Abandon a store as a crash would: the backend released, no close-time snapshot."""
    store._closed = True
    store._b.close()


def run_state_of(run: Any) -> Any:
    """What a :class:`durkv.runtime.Run` holds of its journal, folded
    (:class:`durkv.runtime.journal.RunState`): its entries, in call order and by step id."""
    return run._st
