"""durkv.store: the checkpoint store, a package of one concept per module.

=============  =================================================================
module         owns
=============  =================================================================
``records``    the frame heads (one typed definition per record kind, one checked
               decoder) and the result types (Checkpoint, PendingWrite, ...)
``ckpthead``   checkpoint heads stored whole (keyframes) or as zstd deltas of one
``index``      the in-memory index: per (thread, ns) lane, checkpoint ids and LSNs
``appender``   frames to the backend: the next LSN, the policy, small records
``replay``     the index as the log builds it: replay, K_INDEX snapshots
``delta``      channel encoding (deltas, SNAPs) and a lane's materialized newest state
``writer``     put, put_writes and journal records (the commit paths)
``reads``      get: the newest checkpoint from memory, an older one from its frame
``history``    newest-first streams of checkpoints and of a channel's entries
``edits``      delete_thread, copy_thread, delete_runs, prune
``compact``    compaction: copy the live data, switch to it, drop the prefix
``store``      :class:`Store`, the facade composing them, and ``Store.open``
=============  =================================================================

Each object gets what it uses in its constructor (no mixin reads another's
attributes), and imports point down (records, index < ckpthead < appender < replay < delta <
writer, reads < history, edits, compact < store: the ranks of tests/test_layers.py).
The package re-exports the public names, as the module ``durkv.store`` did.
"""

from .records import (  # noqa: F401 - the store's public types and record kinds
    DURABILITIES, INDEX_VERSION, K_CKPT, K_COMPACT_BEGIN, K_COMPACT_END, K_COPY_CKPT,
    K_COPY_JOURNAL, K_COPY_THREAD, K_COPY_WRITES, K_DEL_JOURNAL, K_DEL_THREAD, K_INDEX,
    K_JOURNAL, K_REMOVE, K_WRITES, SPECIAL_WRITE_CHANNELS, ChannelEntry, Checkpoint,
    PendingWrite, check_id, check_ids, is_placed_item, pack_head, read_head,
)
from .store import Store, open_store

__all__ = ["Store", "Checkpoint", "PendingWrite", "ChannelEntry", "open_store"]
