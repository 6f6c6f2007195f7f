"""LangGraph checkpointer on a durkv store: :class:`DurkvSaver`.

A drop-in for ``SqliteSaver``/``PostgresSaver``: every ``BaseCheckpointSaver``
method, sync and async, plus the extended ones (``delete_for_runs``,
``copy_thread``, ``prune``) and a native ``get_delta_channel_history``.

What it adds over them:

- **Bytes that grow with the change, not the state.** A checkpoint stores
  only the channels whose version moved (LangGraph's ``new_versions``); the
  store writes an ``operator.add`` list as the items appended since the
  parent, so N supersteps of an agent loop cost O(N) bytes, not O(N^2). And
  each message is stored once: the checkpoint that appends it refers to the
  bytes of the task's pending write that carried it (or the write to the
  checkpoint's, whichever was committed first; docs/FORMAT.md section 5).
- **Durability that follows LangGraph's ``durability=``.** LangGraph decides
  when ``put`` is called; durkv decides when the bytes are safe:

  ============  ==================  ==========================================
  LangGraph     durkv commit         why
  ============  ==================  ==========================================
  ``"sync"``    ``sync``             fdatasync before the next step starts
  ``"async"``   ``async``            written to the OS at once (survives kill
                                     -9), fsync'd by the flusher within 10 ms
  ``"exit"``    ``async``            LangGraph already batched the run into one
                                     commit at graph exit; it must survive a
                                     kill after ``invoke`` returns
  ============  ==================  ==========================================

  Pending writes (``put_writes``) are committed ``async``: a process kill
  never loses them, and the next ``sync`` checkpoint's fdatasync covers them.
  Writes that end a run without a following checkpoint (``__interrupt__``,
  ``__error__``) get the run's own policy.

  ``DurkvSaver.open(url, durability="sync")`` (or ``DurkvSaver(store,
  durability=...)``) pins one policy for every checkpoint, whatever LangGraph
  asks (pending writes still ride on the next checkpoint, as above, except
  under a pinned ``"exit"``, which buffers them too); ``durability=None``
  (the default) follows LangGraph per call.

  Under LangGraph's ``"async"`` the loop does not wait for a save, and saves that
  release the GIL trail a busy loop without bound; once one lands more than 20 ms
  late, the loop's next ``get_next_version`` waits until the saves have caught up
  (docs/GUARANTEES.md section 1).

- **DeltaChannel without walking blobs.** A channel whose version moved with
  no value stored (LangGraph's ``DeltaChannel`` between snapshots) is stored
  as :data:`~durkv.langgraph_serde.EMPTY` and read back as absent;
  ``get_delta_channel_history`` walks the parent chain in one streamed pass,
  and ``prune`` keeps the ancestors a delta channel still needs.

>>> from langgraph.graph import StateGraph, START, END
>>> from typing_extensions import TypedDict
>>> class S(TypedDict):
...     n: int
>>> g = StateGraph(S)
>>> _ = g.add_node("inc", lambda s: {"n": s["n"] + 1})
>>> _ = g.add_edge(START, "inc"); _ = g.add_edge("inc", END)
>>> with DurkvSaver.open("memory://") as saver:
...     graph = g.compile(checkpointer=saver)
...     graph.invoke({"n": 1}, {"configurable": {"thread_id": "t1"}})["n"]
2
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import ChainMap, deque
from collections.abc import AsyncIterator, Collection, Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime
from types import TracebackType
from typing import Any

from langchain_core.runnables import RunnableConfig

try:
    from langgraph.checkpoint.base import (
        EXCLUDED_METADATA_KEYS,
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        DeltaChannelHistory,
        PendingWrite,
        SerializerProtocol,
        _with_msgpack_allowlist,
        writes_sort_key,
    )
except ImportError as e:  # an older langgraph-checkpoint than the extra declares
    raise ImportError(
        f"durkv.langgraph needs langgraph-checkpoint>=4.3.0 ({e}); "
        "run: pip install -U 'durkv[langgraph]'") from e
from langgraph.checkpoint.serde.base import maybe_add_typed_methods
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from .durability import DURABILITIES
from .errors import ConfigError, RunBusyError
from .langgraph_claim import claim_for_loop
from .langgraph_serde import (EMPTY, LangGraphSerde, checkpoint_metadata_c, put_args_c,
                              put_writes_args_c)
from .runtime.langgraph_steps import (
    CONFIG_KEY_DURABILITY, astep, atool, forget_thread, step, thread_key, tool,
)

# step/tool/astep/atool: durable steps and tools inside nodes (kept in the runtime,
# re-exported here: the public names are durkv.langgraph.step / tool)
__all__ = ["DurkvSaver", "LangGraphSerde", "POLICY_FOR_MODE", "step", "tool", "astep", "atool"]

POLICY_FOR_MODE = {"sync": "sync", "async": "async", "exit": "async"}
"""durkv commit policy for each LangGraph ``durability=`` mode (see module doc)."""

_POLICIES = frozenset(DURABILITIES)
_DEFAULT_MODE = "async"  # what LangGraph uses when invoke/stream get no durability=
# an `async` checkpoint saved more than _LAG_S after LangGraph made it is late: the loop
# then waits, at most _WAIT_SAVES_S, for the saves to catch up (DurkvSaver._wait_for_saves)
_LAG_S = 0.02
_WAIT_SAVES_S = 0.1
_RUN_ENDING = frozenset((INTERRUPT, ERROR))
# how long aget_tuple waits for a claim this process holds: an `astream` broken out of
# is closed by the event loop's async-generator finalizer (tens of ms to cancel its
# tasks); a live invocation of the thread is refused after it, as from another process
_OWN_CLAIM_WAIT = 0.25
_MISSING_THREAD = (
    "checkpointer needs configurable.thread_id; "
    "pass config={'configurable': {'thread_id': ...}}"
)


class _LoopSaves:
    """One LangGraph loop's `async` saves, as DurkvSaver's lateness wait sees them.

    LangGraph's `async` loop saves each checkpoint in its executor, each save after the
    previous one; a save that releases the GIL (a write, a compression) waits up to the
    interpreter's switch interval for the busy loop to give it back, so the saves fall
    behind without bound (docs/GUARANTEES.md section 1). A save that lands late (its
    checkpoint older than _LAG_S) marks its loop late, and that loop's next
    get_next_version waits until its saves have caught up with it.

    One per loop, never per saver: graphs that share a saver (a server's threads, a
    subgraph) neither wake nor hold up each other's loops. A loop makes its own as it
    enters (get_tuple) in its context (_LOOP_SAVES); LangGraph's executor runs each save
    in a copy of the loop thread's context, so the save finds the same one."""

    __slots__ = ("late", "saved", "wanted", "caught_up")

    def __init__(self) -> None:
        self.late = 0.0         # the monotonic time a save landed late, else 0.0
        self.saved = 0          # the newest version a save landed
        self.wanted = 0         # the version the waiting loop made last
        self.caught_up = threading.Event()


_LOOP_SAVES: ContextVar[_LoopSaves | None] = ContextVar("durkv_loop_saves", default=None)


def _deadline(timeout: float | None) -> float:
    """The monotonic time a wait of ``timeout`` seconds ends (None: never)."""
    if timeout is None:
        return float("inf")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout != timeout:
        raise ConfigError(f"timeout must be a number of seconds or None, not {timeout!r}")
    try:
        return time.monotonic() + timeout
    except OverflowError:       # an int past a float's range: no limit either
        return float("inf")


def _newest_version(checkpoint: Mapping[str, Any]) -> int:
    """The highest of ``checkpoint``'s channel versions, or 0 if they are not ints."""
    try:
        v = max(checkpoint["channel_versions"].values(), default=0)
    except (KeyError, TypeError, AttributeError):
        return 0
    return v if type(v) is int else 0


def _age(checkpoint: Mapping[str, Any]) -> float:
    """Seconds since LangGraph made ``checkpoint`` (its ``ts``, UTC); 0.0 if unreadable."""
    try:
        return time.time() - datetime.fromisoformat(checkpoint["ts"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return 0.0


def _conf(config: RunnableConfig | None) -> dict[str, Any]:
    try:
        conf = config["configurable"]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ConfigError(_MISSING_THREAD) from None
    if type(conf) is not dict and not isinstance(conf, Mapping):   # dict: no ABC check
        raise ConfigError(_MISSING_THREAD)
    return conf


def _one_or_many(name: str, ids: Any) -> list[str]:
    """``Sequence[str]`` arguments as a list of strings. A bare string is ONE id
    (``delete_for_runs("run-1")``), never its characters; other ids are str()'d."""
    if isinstance(ids, str):
        return [ids]
    try:
        return [r if type(r) is str else str(r) for r in ids]
    except TypeError:
        raise ConfigError(f"{name} must be a list of ids, got {type(ids).__name__}") from None


def _check_checkpoint(checkpoint: Any, new_versions: Any) -> None:
    if not (isinstance(checkpoint, dict) and isinstance(checkpoint.get("id"), str)
            and isinstance(checkpoint.get("channel_values"), dict)
            and isinstance(checkpoint.get("channel_versions"), dict)):
        raise ConfigError("checkpoint must be a LangGraph Checkpoint dict with a string 'id', "
                          "and dicts 'channel_values' and 'channel_versions'")
    if type(new_versions) is not dict and not isinstance(new_versions, Mapping):
        raise ConfigError(f"new_versions must be a dict of channel versions, got "
                          f"{type(new_versions).__name__}")


def _config_scalars(obj: Any) -> Any:
    """``obj.items()`` of a config's ``metadata`` or ``configurable``. LangGraph passes a
    ChainMap of one dict as ``metadata``: its own ``items()`` builds a dict in Python and
    then looks every key up again through the maps; merging plain dicts in C gives the same
    keys, order and values."""
    if type(obj) is dict:
        return obj.items()
    if type(obj) is ChainMap:
        maps = obj.maps
        if len(maps) == 1 and type(maps[0]) is dict:
            return maps[0].items()
    return obj.items()


def checkpoint_metadata(config: Mapping[str, Any], metadata: Mapping[str, Any]) -> dict:
    """LangGraph's ``get_checkpoint_metadata(config, metadata)``: the metadata with NULs
    taken out of its strings, plus the scalars of the config's ``metadata`` and
    ``configurable`` it does not hold (except LangGraph's own keys). The same rule, made
    cheaper for a put (``tests/test_langgraph_metadata.py`` holds the two equal): plain
    dicts (what LangGraph's loop passes) in one C call (``csrc/lgcommit.c``), anything
    else here."""
    got = checkpoint_metadata_c(config, metadata, EXCLUDED_METADATA_KEYS, ChainMap)
    if got is not None:
        return got
    return checkpoint_metadata_py(config, metadata)


def checkpoint_metadata_py(config: Mapping[str, Any], metadata: Mapping[str, Any]) -> dict:
    """:func:`checkpoint_metadata` in Python: the definition the C call is held to."""
    md = {k: v.replace("\u0000", "") if isinstance(v, str) else v
          for k, v in metadata.items()}
    for obj in (config.get("metadata"), config.get("configurable")):
        if not obj:
            continue
        for key, v in _config_scalars(obj):
            if key in md or key in EXCLUDED_METADATA_KEYS or key.startswith("__"):
                continue
            if isinstance(v, str):
                md[key] = v.replace("\u0000", "")
            elif isinstance(v, (int, bool, float)):
                md[key] = v
    return md


def put_args_py(config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> tuple:
    """``DurkvSaver.put``'s arguments checked and taken apart: ``(conf, thread_id, ns, cid,
    all_values, record, versions, parent_id, values)``. The definition
    ``langgraph_serde.put_args_c`` is held to (``tests/test_commitpath.py``)."""
    conf = _conf(config)
    thread_id = _thread_id(conf)
    ns = conf.get("checkpoint_ns") or ""
    _check_checkpoint(checkpoint, new_versions)
    if type(metadata) is not dict and not isinstance(metadata, Mapping):
        raise ConfigError(f"metadata must be a dict, got {type(metadata).__name__}")
    cid = checkpoint["id"]
    all_values = checkpoint["channel_values"]
    record = dict(checkpoint)  # the record: all but values and versions (stored apart)
    del record["channel_values"]
    record.pop("channel_versions", None)
    del record["id"]           # the frame head holds it (checkpoint_id): not twice
    versions = checkpoint["channel_versions"]
    parent_id = conf.get("checkpoint_id")
    # the channels whose version moved; the store takes every other value from the
    # base (the parent) where the base holds the same version, and from all_values
    # where it does not: a copy (update_state(..., as_node="__copy__")) is saved
    # whole with an empty new_versions and must read back its own values
    changed = versions if parent_id is None else new_versions  # a root inherits nothing
    values = {k: all_values.get(k, EMPTY) for k in changed}
    return conf, thread_id, ns, cid, all_values, record, versions, parent_id, values


def put_writes_args_py(config: Any, writes: Any) -> tuple:
    """``DurkvSaver.put_writes``' arguments checked and taken apart: ``(conf, thread_id, ns,
    cid, items)``, items the ``(idx, channel, value)`` writes of the store (a special
    channel's idx LangGraph's). The definition ``langgraph_serde.put_writes_args_c`` is
    held to (``tests/test_commitpath.py``)."""
    conf = _conf(config)
    idx_map = WRITES_IDX_MAP
    try:
        items = [(idx_map.get(ch, i), ch, v) for i, (ch, v) in enumerate(writes)]
    except (TypeError, ValueError):
        raise ConfigError(f"writes must be a list of (channel, value) pairs, got "
                          f"{writes!r:.80}") from None
    cid = conf.get("checkpoint_id")
    if cid is None:
        raise ConfigError("put_writes needs configurable.checkpoint_id: the checkpoint "
                          "the writes belong to")
    return conf, _thread_id(conf), conf.get("checkpoint_ns") or "", cid, items


def _thread_id(conf: Mapping[str, Any]) -> str:
    return thread_key(conf.get("thread_id"))


def _check_durability(durability: str | None) -> None:
    if durability is not None and durability not in _POLICIES:
        raise ConfigError(f"durability must be 'sync', 'async', 'exit' or None "
                          f"(follow LangGraph's durability=), not {durability!r}")


class DurkvSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer that commits to a durkv store.

    Args:
        store: an open store whose serde is a :class:`LangGraphSerde`
            (``DurkvSaver.open`` arranges that; durkv's default msgpack serde
            cannot hold LangGraph objects such as messages, ``Send`` or
            ``Interrupt``, so any other store is refused with ConfigError).
        serde: LangGraph serializer; defaults to the one the store's
            LangGraphSerde wraps (given, it replaces it in the store).
        durability: ``None`` to follow LangGraph's ``durability=`` per call,
            or ``"sync"``/``"async"``/``"exit"`` to pin one durkv policy.

    Use :meth:`open` to get a saver that owns (and closes) its store.
    """

    def __init__(self, store: Any, *, serde: SerializerProtocol | None = None,
                 durability: str | None = None) -> None:
        store_serde = getattr(store, "serde", None)
        if not isinstance(store_serde, LangGraphSerde):
            raise ConfigError(
                "DurkvSaver needs a store that serializes with LangGraph's serializer "
                "(messages, Send, Interrupt); use DurkvSaver.open(url), or open the store "
                "with durkv.open(url, serde=LangGraphSerde(JsonPlusSerializer())) "
                "(from durkv.langgraph import LangGraphSerde)")
        if serde is None:
            serde = store_serde.serde
        _check_durability(durability)
        self._store_serde = store_serde
        super().__init__(serde=serde)     # through the serde setter below
        self.store = store
        self.durability = durability
        self._owns_store = False
        # guards the read-modify-write of prune, which spans several store calls
        self._prune_lock = threading.Lock()
        # notified after a put while a thread waits on it: durkv.langgraph.step/tool wait
        # for the checkpoint their task runs on (wait_for_checkpoint). _waiting counts those
        # threads, so that a put with none (every put of a graph without them) skips the
        # condition (~1.5 us); a waiter counts itself under the condition's lock before it
        # looks for its checkpoint, so a put that lands after that look sees it counted
        self._landed = threading.Condition()
        self._waiting = 0

    # ---- lifecycle -------------------------------------------------------------------

    @classmethod
    def open(cls, url: str, *, durability: str | None = None,
             serde: SerializerProtocol | None = None, **store_options: Any) -> DurkvSaver:
        """Open a store at ``url`` and return a saver that owns it.

        Use it as a context manager (sync or async) or call :meth:`close`.

        Args:
            url: a path or ``file://`` URL (local log), or ``memory://`` (also
                ``":memory:"``, as for SqliteSaver). ``read_only=True`` (a store option)
                opens a reader that follows a writer in another process.
            durability: ``None`` follows LangGraph's ``durability=`` per call;
                a policy name pins it for every commit.
            serde: LangGraph serializer (default ``JsonPlusSerializer``).
            **store_options: passed to ``durkv.open`` (``snapshot_every``,
                ``compress_min_bytes``, ...).

        >>> with DurkvSaver.open("memory://") as saver:
        ...     saver.get_tuple({"configurable": {"thread_id": "nobody"}}) is None
        True
        """
        from . import open as open_store
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

        _check_durability(durability)
        if str(url) == ":memory:":      # SqliteSaver's idiom for a saver in memory
            url = "memory://"
        adapter = LangGraphSerde(serde if serde is not None else JsonPlusSerializer())
        store_options.setdefault("durability", durability or "async")
        store = open_store(url, serde=adapter, **store_options)
        try:
            saver = cls(store, serde=adapter.serde, durability=durability)
        except BaseException:
            store.close()
            raise
        saver._owns_store = True
        return saver

    @classmethod
    def from_conn_string(cls, conn_string: str, **options: Any) -> DurkvSaver:
        """:meth:`open`, under the name SqliteSaver, PostgresSaver and AsyncSqliteSaver
        give it: ``with DurkvSaver.from_conn_string(path) as saver`` (or ``async with``)
        in code written for them works unchanged."""
        return cls.open(conn_string, **options)

    def setup(self) -> None:
        """Nothing to create (PostgresSaver's idiom): a store is made by its first open."""

    async def asetup(self) -> None:
        """Async :meth:`setup` (AsyncSqliteSaver's idiom): nothing to create."""

    def close(self) -> None:
        """Close the store if this saver opened it (flushing everything)."""
        if self._owns_store:
            self._owns_store = False
            self.store.close()

    def flush(self) -> None:
        """Make every commit so far durable, whatever policy it had."""
        self.store.flush()

    def refresh(self) -> None:
        """Read-only savers: see what a writer committed since. Reads on a local store do
        this themselves whenever the log grew (one ``stat`` per read finds out)."""
        self.store.refresh()

    def _catch_up(self) -> None:
        if self.store.read_only:
            self.store.refresh_if_moved()

    def __enter__(self) -> DurkvSaver:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> DurkvSaver:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def serde(self) -> SerializerProtocol:  # type: ignore[override]
        """The LangGraph serializer every value, pending write, checkpoint record and
        metadata is written with -- the store's own.

        Assigning it (``saver.serde = EncryptedSerializer.from_pycryptodome_aes(...)``,
        LangGraph's documented way to turn on encryption) switches the store's
        serializer: every commit from then on goes through it. Values written before
        stay as they were and still read back (an ``EncryptedSerializer`` reads
        plaintext values too). Savers sharing one store share its serializer.
        """
        return self._store_serde.serde

    @serde.setter
    def serde(self, serde: SerializerProtocol) -> None:
        if not ((callable(getattr(serde, "dumps_typed", None))
                 and callable(getattr(serde, "loads_typed", None)))
                or (callable(getattr(serde, "dumps", None))
                    and callable(getattr(serde, "loads", None)))):
            raise ConfigError(f"serde must be a LangGraph serializer (dumps_typed/loads_typed), "
                              f"not {type(serde).__name__}")
        self._store_serde.serde = maybe_add_typed_methods(serde)

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> DurkvSaver:
        """Widen the msgpack allowlist (LangGraph calls this at compile time).

        Graphs compiled on one saver share one store, whose serde decodes for
        all of them, so the allowlist is widened in place: the store reads
        with the union of the allowlists of every graph compiled on it.
        """
        serde = _with_msgpack_allowlist(self.serde, extra_allowlist)
        if serde is not self.serde:
            self.serde = serde
        return self

    # ---- policy ----------------------------------------------------------------------

    def _policy(self, conf: Mapping[str, Any]) -> str:
        if self.durability is not None:
            return self.durability
        return POLICY_FOR_MODE.get(conf.get(CONFIG_KEY_DURABILITY) or _DEFAULT_MODE, "async")

    def _writes_policy(self, conf: Mapping[str, Any], writes: Sequence[tuple[str, Any]]) -> str:
        # pending writes ride on the next checkpoint's fsync, except those that
        # end a run without one (an interrupt, an error) under "sync"
        policy = self._policy(conf)
        if policy == "sync" and any(ch in _RUN_ENDING for ch, _ in writes):
            return "sync"
        return "exit" if policy == "exit" else "async"

    # ---- writes ----------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint,
            metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        """Commit one checkpoint: its changed channels, versions and metadata, as one frame."""
        return self._put(config, checkpoint, metadata, new_versions, True)

    def _put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
             new_versions: ChannelVersions, threaded: bool) -> RunnableConfig:
        """:meth:`put`; ``threaded``: called by a sync loop's executor, whose lateness the
        loop's thread waits out (an async loop's ``aput`` runs on its event loop, or in a
        thread the event loop awaits: that loop must never block for it)."""
        # put_args_py in one C call for LangGraph's plain dicts (csrc/lgcommit.c)
        got = put_args_c(config, checkpoint, metadata, new_versions, EMPTY)
        if got is None:
            got = put_args_py(config, checkpoint, metadata, new_versions)
        conf, thread_id, ns, cid, all_values, record, versions, parent_id, values = got
        metadata = checkpoint_metadata(config, metadata)
        self.store.put(thread_id, ns, cid, checkpoint=record, metadata=metadata, values=values,
                       versions=versions, parent_id=parent_id, durability=self._policy(conf),
                       all_values=all_values)
        # LangGraph's `async` loop goes on while this runs (whatever durkv policy is pinned)
        if threaded and (conf.get(CONFIG_KEY_DURABILITY) or _DEFAULT_MODE) == "async":
            loop = _LOOP_SAVES.get()    # the loop that made it (None: not a loop's save)
            if loop is not None:
                loop.saved = saved = _newest_version(checkpoint)  # how far the saves came
                if loop.late:       # the loop waits, or will
                    if saved >= loop.wanted:
                        loop.caught_up.set()
                elif _age(checkpoint) > _LAG_S:
                    loop.late = time.monotonic()
        if self._waiting:
            with self._landed:
                self._landed.notify_all()
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                 "checkpoint_id": cid}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        """Commit a task's writes; idempotent on (task_id, idx) like SqliteSaver."""
        # put_writes_args_py in one C call for LangGraph's plain shapes (csrc/lgcommit.c)
        got = put_writes_args_c(config, writes, WRITES_IDX_MAP, deque)
        if got is None:
            got = put_writes_args_py(config, writes)
        conf, thread_id, ns, cid, items = got
        self.store.put_writes(thread_id, ns, cid, task_id, items, task_path=task_path,
                              durability=self._writes_policy(conf, writes))

    # ---- reads -----------------------------------------------------------------------

    def _tuple(self, ck: Any, config: RunnableConfig | None = None) -> CheckpointTuple:
        thread_id, ns = ck.thread_id, ck.checkpoint_ns
        checkpoint: dict[str, Any] = dict(ck.checkpoint)
        checkpoint["id"] = ck.checkpoint_id    # older stores kept it in the record too
        checkpoint["channel_versions"] = dict(ck.versions)
        seen = checkpoint.get("versions_seen")
        if seen:
            checkpoint["versions_seen"] = {k: dict(v) for k, v in seen.items()}
        checkpoint["channel_values"] = {k: v for k, v in ck.values.items() if v is not EMPTY}
        writes = ck.writes
        if len(writes) > 1:
            writes = sorted(writes, key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
        return CheckpointTuple(
            config=config or {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                               "checkpoint_id": ck.checkpoint_id}},
            checkpoint=checkpoint,  # type: ignore[arg-type]
            metadata=ck.metadata,
            parent_config=(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                  "checkpoint_id": ck.parent_id}}
                if ck.parent_id else None
            ),
            pending_writes=[(w.task_id, w.channel, w.value) for w in writes],
        )

    # ---- the checkpoint a task runs on -----------------------------------------------

    def wait_for_checkpoint(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str,
                            timeout: float | None = 60.0) -> bool:
        """Block until checkpoint ``checkpoint_id`` is committed (True), or ``timeout``
        seconds pass (False; None: no limit). Under ``durability="async"`` LangGraph saves
        a checkpoint in the background while the tasks it names already run:
        durkv.langgraph.step and tool wait here so that no journal record precedes its
        task's checkpoint."""
        # this handle's own puts land in its index at once, and notify: a look there needs
        # no write section (a flock and a catch-up, ~15-30 us). Another handle's or
        # process's put does not notify: looked for with a section each time a wait ends
        # without a notification (after 1 ms, then twice as long each time, up to 50 ms).
        held, has = self.store.holds_checkpoint, self.store.has_checkpoint
        deadline = _deadline(timeout)
        if held(thread_id, checkpoint_ns, checkpoint_id):
            return True
        pause = 0.001
        with self._landed:
            self._waiting += 1      # before the look below: a put after it will notify
            try:
                while not held(thread_id, checkpoint_ns, checkpoint_id):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    if not self._landed.wait(min(left, pause)):
                        if has(thread_id, checkpoint_ns, checkpoint_id):
                            break   # committed by another handle or process
                        pause = min(2 * pause, 0.05)
            finally:
                self._waiting -= 1
        return True

    async def await_checkpoint(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str,
                               timeout: float | None = 60.0) -> bool:
        """:meth:`wait_for_checkpoint` for async nodes: polls, so that an ``aput`` on the
        same event loop can run meanwhile."""
        held, has = self.store.holds_checkpoint, self.store.has_checkpoint
        deadline = _deadline(timeout)
        delay = 0.0002
        while not (held(thread_id, checkpoint_ns, checkpoint_id)
                   or has(thread_id, checkpoint_ns, checkpoint_id)):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)
        return True

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (its latest if no checkpoint_id), or None.

        Called by a root graph's pregel loop as it enters, it first claims the thread for
        that invocation: RunBusyError naming the holder's pid if another invocation, here
        or in another process, drives it (:mod:`durkv.langgraph_claim`)."""
        conf = _conf(config)
        cid = conf.get("checkpoint_id") or None     # "": the latest, as LangGraph's savers
        claim_for_loop(self, _thread_id(conf), conf.get("checkpoint_ns") or "")
        # a loop entering: the lateness of its own saves, and no other's (an earlier
        # invocation's late saves, drained as it returned, are nothing for it to wait for)
        _LOOP_SAVES.set(_LoopSaves())
        self._catch_up()
        ck = self.store.get(_thread_id(conf), conf.get("checkpoint_ns") or "", cid)
        if ck is None:
            return None
        return self._tuple(ck, config if cid else None)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, by thread/namespace, metadata ``filter``, ``before``."""
        thread_id = ns = cid = None
        if config is not None:
            conf = _conf(config)
            if conf.get("thread_id") is not None:
                thread_id = _thread_id(conf)
            ns = conf.get("checkpoint_ns")
            cid = conf.get("checkpoint_id") or None     # "": none, as LangGraph's savers
        before_id = (_conf(before).get("checkpoint_id") or None) if before is not None else None
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
            raise ConfigError(f"limit must be an int or None, got {limit!r}")
        if filter is not None and not isinstance(filter, dict):
            raise ConfigError(f"filter must be a dict, got {type(filter).__name__}")
        if limit is not None and limit <= 0:
            return
        self._catch_up()
        if cid is not None:  # one checkpoint, if it passes the other filters
            if thread_id is None or (before_id is not None and cid >= before_id):
                return
            for ns_ in ([ns] if ns is not None else self.store.namespaces(thread_id)):
                ck = self.store.get(thread_id, ns_, cid)
                if ck is not None and (not filter or all(
                        ck.metadata.get(k) == v for k, v in filter.items())):
                    yield self._tuple(ck)
                    return
            return
        for ck in self.store.history(thread_id, ns, before=before_id, limit=limit,
                                     filter=filter or None):
            yield self._tuple(ck)

    def get_delta_channel_history(self, *, config: RunnableConfig,
                                  channels: Sequence[str]) -> Mapping[str, DeltaChannelHistory]:
        """Per-channel writes and seed along the target's parent chain, in one pass.

        Walks the ancestors of the checkpoint named by ``config`` newest first,
        collecting each requested channel's pending writes (``writes_sort_key``
        order within a checkpoint) until the nearest ancestor that has a value
        stored for the channel, which becomes its ``seed``. Same contract as
        ``BaseCheckpointSaver.get_delta_channel_history``.
        """
        channels = _one_or_many("channels", channels)
        if not channels:
            return {}
        conf = _conf(config)
        thread_id = _thread_id(conf)
        ns = conf.get("checkpoint_ns") or ""
        self._catch_up()
        remaining = set(channels)
        collected: dict[str, list[PendingWrite]] = {c: [] for c in channels}
        seeds: dict[str, Any] = {}
        for ck in self._ancestors(thread_id, ns, conf.get("checkpoint_id")):
            writes = [w for w in ck.writes if w.channel in remaining]
            if writes:
                writes.sort(key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx),
                            reverse=True)
                for w in writes:
                    collected[w.channel].append((w.task_id, w.channel, w.value))
            values = ck.values
            for ch in [c for c in remaining if values.get(c, EMPTY) is not EMPTY]:
                seeds[ch] = values[ch]
                remaining.discard(ch)
            if not remaining:
                break
        result: dict[str, DeltaChannelHistory] = {}
        for ch in channels:
            entry: DeltaChannelHistory = {"writes": collected[ch][::-1]}
            if ch in seeds:
                entry["seed"] = seeds[ch]
            result[ch] = entry
        return result

    def _ancestors(self, thread_id: str, ns: str, checkpoint_id: str | None) -> Iterator[Any]:
        """The strict ancestors of a checkpoint, nearest first, following parent ids."""
        target = self.store.get(thread_id, ns, checkpoint_id)
        if target is None:
            return
        want = target.parent_id
        seen = {target.checkpoint_id}
        if want is None:
            return
        # one streamed pass, newest first: parents sort before their children's ids
        for ck in self.store.history(thread_id, ns, before=target.checkpoint_id):
            if ck.checkpoint_id != want:
                continue
            yield ck
            seen.add(want)
            want = ck.parent_id
            if want is None or want in seen:
                return
        while want is not None and want not in seen:  # a parent with a larger id (clock skew)
            ck = self.store.get(thread_id, ns, want)
            if ck is None:
                return
            yield ck
            seen.add(want)
            want = ck.parent_id

    # ---- deletes, copies, pruning ----------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of a thread, in every namespace."""
        self.store.delete_thread(thread_key(thread_id))
        forget_thread(self, thread_id)      # the journal's Run cached for its steps/tools

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata run_id is in ``run_ids``.

        A bare string is one run id: ``delete_for_runs("run-1")`` deletes run
        ``run-1`` (a str is a ``Sequence[str]`` of its characters, which no caller means).
        """
        run_ids = _one_or_many("run_ids", run_ids)
        if run_ids:
            self.store.delete_runs(run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy a thread's whole history (every namespace, parent chain and writes)."""
        self.store.copy_thread(thread_key(source_thread_id), thread_key(target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Drop old checkpoints: ``"keep_latest"`` per namespace, or ``"delete"`` all.

        DeltaChannel-safe: when the latest checkpoint of a namespace holds a
        delta channel without a stored value, the ancestors back to that
        channel's nearest stored value (and their writes) are kept too, so
        the channel still rebuilds; with no stored value anywhere, the
        namespace keeps its whole chain.
        """
        if strategy not in ("keep_latest", "delete"):
            raise ConfigError(f"prune strategy must be 'keep_latest' or 'delete', not {strategy!r}")
        thread_ids = _one_or_many("thread_ids", thread_ids)   # a bare string is one id
        with self._prune_lock:
            for tid in thread_ids:
                if strategy == "delete":
                    self.delete_thread(tid)
                    continue
                keep = {}
                for ns in self.store.namespaces(tid):
                    ids = self._needed_ids(tid, ns)
                    if ids:
                        keep[(tid, ns)] = ids
                self.store.prune([tid], keep=keep)

    def _needed_ids(self, thread_id: str, ns: str) -> set[str]:
        """The checkpoint ids of (thread, ns) that rebuild its latest checkpoint: the
        latest and, for its delta channels, its ancestors back to each one's nearest
        stored value (by parent id: after a fork or a copy the newest ids are not the
        latest's ancestors, and keeping the newest lost the seed)."""
        latest = self.store.get(thread_id, ns)
        if latest is None:
            return set()
        ids = {latest.checkpoint_id}
        # the delta channels LangGraph rebuilds by replay: no value stored here,
        # and counted in the metadata since their last snapshot (other channels
        # without a value, e.g. consumed triggers, are simply empty)
        counters = latest.metadata.get("counters_since_delta_snapshot") or {}
        pending = {k for k in counters if latest.values.get(k, EMPTY) is EMPTY}
        if not pending:
            return ids
        for ck in self._ancestors(thread_id, ns, latest.checkpoint_id):
            ids.add(ck.checkpoint_id)
            pending = {c for c in pending if ck.values.get(c, EMPTY) is EMPTY}
            if not pending:
                break
        return ids      # no stored value anywhere: the whole chain

    # ---- versions --------------------------------------------------------------------

    def get_next_version(self, current: int | str | None, channel: None = None) -> int:
        """Next channel version: ``current + 1`` as an int.

        durkv keys values by checkpoint, not by (channel, version), so it needs
        none of the random suffix SqliteSaver adds against cross-fork blob
        collisions; small ints keep every stored ``versions`` map small. A
        string version (a thread migrated from another saver) continues in
        SqliteSaver's format so versions stay comparable.
        """
        loop = _LOOP_SAVES.get()
        if loop is not None and loop.late:
            self._wait_for_saves(loop, current)
        if current is None:
            return 1
        try:
            if isinstance(current, str):
                import random

                nxt = int(current.split(".")[0]) + 1
                return f"{nxt:032}.{random.random():016}"  # type: ignore[return-value]
            return int(current) + 1
        except (TypeError, ValueError, OverflowError):      # OverflowError: inf
            raise ConfigError(f"not a channel version: {current!r} (an int, or a string in "
                              "SqliteSaver's format)") from None

    @staticmethod
    def _wait_for_saves(loop: _LoopSaves, current: Any) -> None:
        """Called by LangGraph's loop as it versions a superstep's writes, after one of its
        saves landed late: wait (GIL released) until the newest checkpoint the loop made,
        of version ``current``, is saved, so that its saves keep up with it
        (docs/GUARANTEES.md section 1). At most _WAIT_SAVES_S; a lateness seen more than a
        second ago (an old checkpoint put again) and string versions wait for nothing."""
        if time.monotonic() - loop.late < 1.0 and type(current) is int:
            loop.caught_up.clear()
            loop.wanted = current       # before the look below: a save after it will set
            if loop.saved < current:
                loop.caught_up.wait(_WAIT_SAVES_S)
        loop.late = 0.0

    # ---- async -----------------------------------------------------------------------
    #
    # Reads and "async"/"exit" commits take microseconds (an in-memory index
    # and a write(2)), less than a hop to a worker thread, so they run inline.
    # A "sync" commit waits for fdatasync: it runs in a worker thread so the
    # event loop keeps serving other graphs, whose commits then share the
    # store's group commit.

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        try:
            return self.get_tuple(config)
        except RunBusyError as e:
            if str(e.context.get("holder_pid")) != str(os.getpid()):
                raise
        # held in this process: by an `astream` the caller broke out of, whose async
        # generator the event loop closes a moment later (its finalizer runs on this
        # loop), or by a live invocation. Let the loop run, then claim again: the first
        # lets go within its own cancellation; a live one is still refused
        deadline = time.monotonic() + _OWN_CLAIM_WAIT
        while True:
            await asyncio.sleep(0.005)
            try:
                return self.get_tuple(config)
            except RunBusyError:
                if time.monotonic() >= deadline:
                    raise

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        for tup in self.list(config, filter=filter, before=before, limit=limit):
            yield tup

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        if self._policy(_conf(config)) == "sync":
            return await asyncio.to_thread(self._put, config, checkpoint, metadata,
                                           new_versions, False)
        return self._put(config, checkpoint, metadata, new_versions, False)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        if self._writes_policy(_conf(config), writes) == "sync":
            await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)
        else:
            self.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    async def aget_delta_channel_history(
            self, *, config: RunnableConfig,
            channels: Sequence[str]) -> Mapping[str, DeltaChannelHistory]:
        return self.get_delta_channel_history(config=config, channels=channels)

