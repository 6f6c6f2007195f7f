"""Kept for compatibility: the store's records are :mod:`durkv.store.records`.

``durkv.records`` was their home before the store became a package (issue 8); code
and tests that import it keep working. New code imports :mod:`durkv.store.records`.
"""

from .store.records import *  # noqa: F401,F403
from .store.records import (  # noqa: F401 - the record kinds and heads, as before
    INDEX_VERSION, INDEX_VERSIONS, K_CKPT, K_COMPACT_BEGIN, K_COMPACT_END, K_COPY_CKPT, K_COPY_JOURNAL,
    K_COPY_THREAD, K_COPY_WRITES, K_DEL_JOURNAL, K_DEL_THREAD, K_INDEX, K_JOURNAL, K_REMOVE,
    K_WRITES, CkptDeltaHead, CkptHead, CompactBeginHead, CompactEndHead, CopyThreadHead, DelJournalHead,
    DelThreadHead, IndexHead, JournalHead, RemoveHead, WritesHead, heads_of, pack_head,
    read_head,
)
