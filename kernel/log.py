"""The segment log: a Pythonic API over the C library ``durkv._seglog``.

This is the only module that imports the compiled library. Everything else in durkv
sees :class:`SegmentLog` (the local log of one store directory), the module functions
:func:`verify` / :func:`recover`. The COMMIT payload codec every backend shares is
:mod:`durkv.payload`. The on-disk format is docs/FORMAT.md.

>>> import tempfile, os
>>> d = os.path.join(tempfile.mkdtemp(), "agent.durkv")
>>> with SegmentLog.open(d) as log:
...     lsn = log.append(b"hi")
...     log.read(lsn)
b'hi'
"""

from __future__ import annotations

import atexit
import errno as _errno
import os
import struct
import sys
import threading
import weakref
from array import array
from collections.abc import Iterator
from typing import Any, Callable
from dataclasses import asdict, dataclass, field

from ._seglog import ffi, lib
from ._heldcall import append as _held_append, append_one as _held_append_one
from ._heldcall import begin as _held_begin, bind as _held_bind
from ._heldcall import end as _held_end, end_async as _held_end_async
from . import repairnotes
from .durability import ASYNC, DURABILITIES, EXIT, SYNC
from .errors import (
    ConfigError, CorruptionError, DurkvError, FrameTooLargeError, LogFailedError,
    NotFoundError, ReadOnlyError, StaleReaderError, StoreClosedError, StoreLockedError,
)

FRAME_DATA = 1
FRAME_COMMIT = 2

_NO_LSN = (1 << 64) - 1
_DURABILITY = {SYNC: lib.DKV_SYNC, ASYNC: lib.DKV_ASYNC, EXIT: lib.DKV_EXIT}
DURABILITY_CODES = dict(_DURABILITY)    # policy name -> the C library's code
_RECOVERY = {
    "tolerate_tail": lib.DKV_RECOVER_TOLERATE_TAIL, "strict": lib.DKV_RECOVER_STRICT,
    "point_in_time": lib.DKV_RECOVER_POINT_IN_TIME, "salvage": lib.DKV_RECOVER_SALVAGE,
}
_FAULT_OPS = {"write": 1, "fdatasync": 2, "dirfsync": 3}

# Cached for the hot paths.
_from_buffer = ffi.from_buffer
_new = ffi.new
_buffer = ffi.buffer
_append_lsn = lib.dkv_append_lsn
_append_one = lib.dkv_append_one
_MOVED = lib.DKV_MOVED
_append_packed = lib.dkv_append_packed
# dkv_append_one's and dkv_append_one_try's addresses, for a C caller that appends through
# a handle's `_addr` (the try first, with the GIL held: see HELD_CALLS below)
APPEND_ONE_ADDRESS = tuple(int(ffi.cast("uintptr_t", ffi.addressof(lib, f)))
                           for f in ("dkv_append_one", "dkv_append_one_try"))
# A commit's short log calls keep the GIL (csrc/heldcall.c): a cffi call hands it over,
# and a graph's loop thread waits for it. A try call that would wait (or write 64 KiB or
# more) returns _WOULD_WAIT and the cffi call (releasing the GIL) is made.
# HELD_CALLS False makes every call through cffi (bench/: the two side by side).
HELD_CALLS = True
_WOULD_WAIT = lib.DKV_WOULD_WAIT
_held_bind(*(int(ffi.cast("uintptr_t", ffi.addressof(lib, f))) for f in (
    "dkv_write_begin_try", "dkv_append_try", "dkv_write_end_try", "dkv_append_one_try")))
_read_alloc = lib.dkv_read_alloc
_free = lib.dkv_free


# ---------------------------------------------------------------- reports

@dataclass
class Damage:
    """One finding: which segment file, at which byte offset, what kind, what it costs."""

    segment: str
    offset: int
    kind: str
    lost_first_lsn: int | None = None
    lost_last_lsn: int | None = None
    detail: str = ""


@dataclass
class SegmentReport:
    segment: str
    sealed: bool
    segment_no: int
    base_lsn: int
    frames_ok: int
    bytes: int
    kind: str | None = None
    bad_offset: int | None = None
    detail: str = ""


@dataclass
class Report:
    """What :func:`verify` or :func:`recover` found. ``ok`` means no damage at all (a torn
    tail counts: a writer's open, or ``recover``, repairs it)."""

    ok: bool
    segments: list[SegmentReport] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    frames_ok: int = 0
    next_lsn: int = 0
    repair: str | None = None   # recover: the id of the repair note of a cut (FORMAT.md 6a)
    # recover: the <segment>.tmp / HEAD.tmp files a killed writer left that it removed
    # (under dry_run: found, and left)
    transients: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SegmentInfo:
    name: str
    segment_no: int
    base_lsn: int
    sealed: bool
    frames: int
    bytes: int


def _s(chars) -> str:
    return ffi.string(chars).decode("utf-8", "replace")


def _damage(d) -> Damage:
    first, last = int(d.lost_first_lsn), int(d.lost_last_lsn)
    return Damage(
        segment=_s(d.segment), offset=int(d.offset), kind=_s(lib.dkv_damage_name(d.kind)),
        lost_first_lsn=None if first == _NO_LSN else first,
        lost_last_lsn=None if last == _NO_LSN or first > last else last,
        detail=_s(d.detail),
    )


def _report(r) -> Report:
    segs = []
    for i in range(r.n_segments):
        s = r.segments[i]
        segs.append(SegmentReport(
            segment=_s(s.segment), sealed=bool(s.sealed), segment_no=int(s.segment_no),
            base_lsn=int(s.base_lsn), frames_ok=int(s.frames_ok), bytes=int(s.bytes),
            kind=_s(lib.dkv_damage_name(s.kind)) if s.kind else None,
            bad_offset=int(s.bad_offset) if s.kind else None, detail=_s(s.detail),
        ))
    damage = [_damage(r.damage[i]) for i in range(r.n_damage)]
    return Report(ok=not damage, segments=segs, damage=damage, frames_ok=int(r.frames_ok),
                  next_lsn=int(r.next_lsn), transients=int(r.transients))


# ---------------------------------------------------------------- errors

# What each DKV_E* code is in the DurkvError tree (DKV_ECORRUPT, ECLOSED and ENOMEM need
# more than a class: see _error).
ERROR_CLASSES: dict[int, type[DurkvError]] = {
    lib.DKV_EIO: LogFailedError,
    lib.DKV_EFAILED: LogFailedError,
    lib.DKV_ELOCKED: StoreLockedError,
    lib.DKV_EINVAL: ConfigError,
    lib.DKV_ETOOBIG: FrameTooLargeError,
    lib.DKV_ENOLSN: NotFoundError,
    lib.DKV_ENOENT: NotFoundError,
    lib.DKV_EREADONLY: ReadOnlyError,
    lib.DKV_ESTALE: StaleReaderError,
    lib.DKV_EFORKED: ConfigError,   # a handle used in a fork of the process that opened it
}


def _error(rc: int, handle=None, path: str = "", what: str = "", *,
           thread: bool = False) -> DurkvError:
    """Translate a DKV_E* code (and the handle's message and errno) into the DurkvError
    tree. ``thread``: the error of a call without a handle (verify, recover), which C keeps
    per calling thread. The errno's name goes in the error's context (``errno``)."""
    h = ffi.NULL if handle is None else handle
    have_msg = thread or h != ffi.NULL
    msg = _s(lib.dkv_last_error(h)) if have_msg else ""
    if not msg:
        msg = f"{what or 'log operation'} on {path}: {_s(lib.dkv_strerror(rc))}"
    context: dict = {"path": path}
    err_no = lib.dkv_last_errno(h) if have_msg else 0
    if err_no:
        context["errno"] = _errno.errorcode.get(err_no, str(err_no))
    if rc == lib.DKV_ECORRUPT:
        d = ffi.new("dkv_damage *")
        if h != ffi.NULL and lib.dkv_last_damage(h, d) == 0:
            dm = _damage(d)
            return CorruptionError(msg, segment=dm.segment, offset=dm.offset, kind=dm.kind,
                                   lost_first_lsn=dm.lost_first_lsn,
                                   lost_last_lsn=dm.lost_last_lsn, **context)
        return CorruptionError(msg, **context)
    if rc == lib.DKV_ECLOSED:
        return StoreClosedError(f"the log {path} is closed; open it again", path=path)
    if rc == lib.DKV_ENOMEM:
        raise MemoryError(msg)
    return ERROR_CLASSES.get(rc, DurkvError)(msg, **context)


# ---------------------------------------------------------------- the log

_open_logs: weakref.WeakSet[SegmentLog] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """The `exit` policy's promise: a clean interpreter exit flushes and closes every log.

    A flush that fails here has no caller left to raise to: it is said on stderr, one line
    per log, naming the store and how many commits were not made durable.
    """
    for log in list(_open_logs):
        if log.closed:
            log.close()     # another thread's close is flushing it: wait for that flush
            continue
        try:
            appended = log.next_lsn     # before a failed batch hand-off could drop the count
            try:
                log.flush()
            except DurkvError as e:
                lost = appended - log.durable_lsn
                if lost > 0:
                    sys.stderr.write(f"durkv: {lost} commit{'s' if lost != 1 else ''} to "
                                     f"{log.path} not made durable at exit: "
                                     f"{' '.join(e.message.split())}\n")
                    sys.stderr.flush()
            log.close()
        except (DurkvError, OSError, ValueError):
            pass    # reported above, or stderr is gone: nothing else can be done at exit


def _disown_all_in_child() -> None:
    """In a child made by ``os.fork()``: let go of every log the parent had open.

    The handles are the parent's: the child's writes would interleave with the parent's at
    the same offsets, and its exit (``_close_all``) or garbage collection would write and
    fsync the parent's buffered `exit` frames a second time. Each is closed here without a
    flush (C closes only the child's copies of its descriptors, so the parent's writer lock
    no longer depends on the child's lifetime); any later use raises ConfigError saying to
    open the store again in the child. Runs once per fork: nothing on the append path.
    """
    for log in list(_open_logs):
        log._disown()


os.register_at_fork(after_in_child=_disown_all_in_child)


class SegmentLog:
    """One store directory's segment log (the local backend's storage).

    Open with :meth:`open`; ``append`` returns the frame's LSN (0, 1, 2, ...) once the
    durability policy's promise holds; ``read`` / ``scan`` get frames back.

    >>> import tempfile, os
    >>> log = SegmentLog.open(os.path.join(tempfile.mkdtemp(), "s"), durability="async")
    >>> log.append_many([b"a", b"b"])
    [0, 1]
    >>> [p for _, p in log.scan()]
    [b'a', b'b']
    >>> log.close()
    """

    def __init__(self, handle, path: str, durability: str, read_only: bool,
                 recovery_damage: Damage | None) -> None:
        self._h = handle
        # the handle's memory, freed (dkv_destroy) only when this object goes: after close()
        # another thread may still be in a call on it, or about to make one (it holds
        # this object meanwhile); dkv_close makes those return DKV_ECLOSED
        self._cdata = handle
        # the handle's address while it is open, else None: run.step's C entry appends
        # through it (csrc/journalscan.c, fast_append)
        self._addr = int(ffi.cast("uintptr_t", handle))
        # the log's next LSN, read in place: a cffi call hands the GIL over, and a commit
        # read it twice (a LangGraph saver commits on a thread the graph's loop contends with)
        self._next_at = lib.dkv_next_lsn_at(handle)
        self.path = path
        self.durability = durability
        self.read_only = read_only
        self._salvage = False
        self._recovery_damage = recovery_damage
        self._pid = os.getpid()     # the process that opened it (the handle is its alone)
        self._forked = False        # this process is a fork of that one: refuse everything
        self._close_done = threading.Event()    # set once close() has flushed and closed

    @classmethod
    def open(cls, path: str | os.PathLike, durability: str = "sync", *,
             segment_bytes: int = 64 << 20, flush_interval_ms: int = 10,
             recovery: str = "tolerate_tail", read_only: bool = False,
             lock_timeout_ms: int = 10_000) -> SegmentLog:
        """Open (a writer creates it if missing) the log in directory ``path``.

        Several processes may open one log for writing (FORMAT.md "Several writers"):
        each append takes the cross-process write lock, waiting up to
        ``lock_timeout_ms``. Raises StoreLockedError if recover or a compaction holds the
        log exclusively for that long, CorruptionError on damage
        the recovery mode does not accept, NotFoundError for a read-only open of nothing.
        """
        path = os.fspath(path)
        if durability not in _DURABILITY:
            raise ConfigError(f"durability must be one of {', '.join(DURABILITIES)}; "
                              f"got {durability!r}")
        if recovery not in _RECOVERY:
            raise ConfigError(f"recovery must be one of {', '.join(_RECOVERY)}; got {recovery!r}")
        if segment_bytes <= 0 or flush_interval_ms <= 0:
            raise ConfigError("segment_bytes and flush_interval_ms must be positive")
        if type(lock_timeout_ms) is not int or not 0 < lock_timeout_ms < (1 << 31):
            raise ConfigError(f"lock_timeout_ms must be a positive int; got {lock_timeout_ms!r}")
        opt = ffi.new("dkv_options *")
        opt.durability = _DURABILITY[durability]
        opt.recovery = _RECOVERY[recovery]
        opt.read_only = 1 if read_only else 0
        opt.segment_bytes = segment_bytes
        opt.flush_interval_ms = flush_interval_ms
        opt.lock_timeout_ms = lock_timeout_ms
        out = ffi.new("dkv_log **")
        rc = lib.dkv_open(os.fsencode(path), opt, out)
        h = out[0]
        if rc:
            err = _error(rc, h if h != ffi.NULL else None, path, "open")
            if h != ffi.NULL:
                lib.dkv_destroy(h)
            raise err
        d = ffi.new("dkv_damage *")
        damage = _damage(d) if lib.dkv_last_damage(h, d) == 0 else None
        ro = read_only or recovery == "salvage" or (damage is not None and
                                                    damage.kind != "torn_tail")
        self = cls(ffi.gc(h, lib.dkv_destroy), path, durability, ro, damage)
        self._salvage = recovery == "salvage"
        _open_logs.add(self)
        return self

    # -- lifecycle

    @property
    def closed(self) -> bool:
        return self._h is None

    def _handle(self):
        h = self._h
        if h is None:
            if self._forked:
                raise ConfigError(
                    f"the log {self.path} was opened by process {self._pid} and this process "
                    f"({os.getpid()}) is a fork of it: a handle is never used across fork(); "
                    "open the store again in this process (durkv.open after the fork)",
                    path=self.path)
            raise StoreClosedError(f"the log {self.path} is closed; open it again")
        return h

    def _disown(self) -> None:
        """In a forked child: close the handle without a flush (see :func:`_disown_all_in_child`)."""
        self._forked = True
        h, self._h = self._h, None
        self._addr = None
        self._next_at = None
        _open_logs.discard(self)
        if h is not None:
            lib.dkv_close(h)    # inherited: closes the fds only (and dkv_destroy frees nothing)

    def close(self) -> None:
        """Flush (every policy), stop the flusher, release the lock. Idempotent: a close
        while another thread's close is under way returns once that one has flushed."""
        h, self._h = self._h, None
        self._addr = None
        self._next_at = None
        if h is None:
            if not self._forked and os.getpid() == self._pid:
                self._close_done.wait()     # a fork's copy is never closed: no wait there
            return
        try:
            rc = lib.dkv_close(h)
        finally:
            _open_logs.discard(self)    # after the flush: an exit waits for it (_close_all)
            self._close_done.set()
        if rc:
            # the handle's memory lives until it is collected: its message, errno and
            # positions still answer. A handle that failed earlier (a background
            # fdatasync under `async`, unseen by a program that made no call since) left
            # commits it acknowledged not durable: close says so, as every call after a
            # failure does, instead of returning as if it had flushed them
            lost = lib.dkv_next_lsn(h) - lib.dkv_durable_lsn(h)
            if rc != lib.DKV_EFAILED or lost > 0:
                e = _error(rc, h, self.path, "close")
                if lost > 0:
                    e = type(e)(f"{lost} frame{'s' if lost != 1 else ''} written to "
                                f"{self.path} not made durable before close: {e.message}",
                                **e.context)
                raise e

    def __enter__(self) -> SegmentLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"next_lsn={self.next_lsn}"
        return f"<SegmentLog {self.path!r} {self.durability} {state}>"

    # -- writing

    def write_begin(self) -> None:
        """Open a write section (FORMAT.md "Several writers"): this thread holds the
        store's write lock and the log has caught up with every frame other processes
        appended, so ``next_lsn`` is the LSN the next append gets. Sections nest. Raises
        StoreLockedError (naming the holder's pid) after ``lock_timeout_ms``."""
        a = self._addr
        if a is not None and HELD_CALLS:
            rc = _held_begin(a)
            if rc == 0:
                return
            if rc != _WOULD_WAIT:
                raise _error(rc, self._h, self.path, "write_begin")
        h = self._h
        if h is None:
            h = self._handle()
        rc = lib.dkv_write_begin(h)
        if rc:
            raise _error(rc, h, self.path, "write_begin")

    def write_end(self) -> None:
        """Close the section: its frames are written to the OS (not fsync'd: ``flush`` or
        ``wait_durable`` does that, outside the lock) and the write lock is released."""
        a = self._addr
        rc = _held_end(a) if a is not None and HELD_CALLS else _WOULD_WAIT
        if rc == _WOULD_WAIT:
            rc = lib.dkv_write_end(self._handle())
        if rc:
            raise _error(rc, self._h, self.path, "write_end")

    def write_end_async(self) -> bool:
        """:meth:`write_end`, and when it ends the outermost section (True) every frame
        appended so far is written to the OS and owed an fdatasync by the flusher: what
        :meth:`wait_written` of the last of them would add, in the same call. False: it
        wrote nothing (a nested section): wait for the frames as usual."""
        a = self._addr
        rc = _held_end_async(a) if a is not None and HELD_CALLS else _WOULD_WAIT
        if rc == _WOULD_WAIT:
            rc = lib.dkv_write_end_async(self._handle())
        if rc < 0:
            raise _error(rc, self._h, self.path, "write_end")
        return rc == 0

    def exclusive(self, on: bool) -> None:
        """``True``: hold the log alone (StoreLockedError while another handle has it open
        for writing); ``False``: share it again. Compaction runs alone."""
        h = self._handle()
        rc = lib.dkv_exclusive(h, 1 if on else 0)
        if rc:
            raise _error(rc, h, self.path, "exclusive")

    def append(self, payload: bytes, *, frame_type: int = FRAME_DATA,
               durability: str | None = None) -> int:
        """Append one frame; return its LSN once ``durability`` (default: the log's) holds."""
        h = self._h
        if h is None:
            self._handle()
        if type(payload) is not bytes:
            payload = bytes(memoryview(payload))
        # bytes pass to `const char *` without a copy; the LSN is the return value. In a
        # write section an `exit` frame is only queued in C (no write, no lock): the
        # section's end writes every frame of it in one write(2)
        pol = -1 if durability is None else _DURABILITY[durability]
        a = self._addr
        if a is not None and HELD_CALLS:
            r = _held_append(a, frame_type, payload, pol)
            if r >= 0:
                return r
            if r != _WOULD_WAIT:
                raise _error(r, self._h, self.path, "append")
        r = _append_lsn(h, frame_type, payload, len(payload), pol)
        if r < 0:
            raise _error(r, h, self.path, "append")
        return r

    def append_one(self, payload: bytes, expect: int, *, frame_type: int = FRAME_DATA,
                   durability: str | None = None) -> int:
        """:meth:`write_begin`, :meth:`append`, :meth:`write_end` in one call (one GIL
        hand-off, not three), for a caller that holds no write section; ``expect`` is the
        LSN the caller's view of the log says comes next. Returns the frame's LSN, or -1
        when the log, caught up with other processes' frames, is elsewhere: nothing was
        appended, and the caller takes those frames in first (a section of its own).
        ``payload`` is ``bytes`` (passed to C without a copy)."""
        h = self._h if self._h is not None else self._handle()
        pol = _DURABILITY[durability] if durability is not None else -1
        a = self._addr      # None once closed: no held call on it
        r = (_held_append_one(a, frame_type, payload, pol, expect)
             if a is not None and HELD_CALLS else _WOULD_WAIT)
        if r == _WOULD_WAIT:
            r = _append_one(h, frame_type, payload, len(payload), pol, expect)
        if r >= 0:
            return r
        if r == _MOVED:
            return -1
        raise _error(r, h, self.path, "append")

    def append_many(self, payloads: list[bytes], *, frame_type: int = FRAME_DATA,
                    durability: str | None = None) -> list[int]:
        """Append frames as one group (one write, one fsync under sync)."""
        h = self._handle()
        n = len(payloads)
        if not n:
            return []
        pol = -1 if durability is None else _DURABILITY[durability]
        payloads = [p if type(p) is bytes else bytes(memoryview(p)) for p in payloads]
        data = b"".join(payloads)
        lens = array("I", [len(p) for p in payloads])
        out = _new("uint64_t *")
        rc = _append_packed(h, frame_type, data, _from_buffer("uint32_t[]", lens), n, pol, out)
        if rc:
            raise _error(rc, h, self.path, "append")
        first = out[0]
        return list(range(first, first + n))

    def flush(self) -> None:
        """Make every frame appended so far durable, under any policy."""
        h = self._handle()
        rc = lib.dkv_flush(h)
        if rc:
            raise _error(rc, h, self.path, "flush")

    def wait_durable(self, lsn: int) -> None:
        """Block until frame ``lsn`` (and all before it) is durable."""
        _check_lsn(lsn)
        h = self._handle()
        rc = lib.dkv_wait_durable(h, lsn)
        if rc:
            raise _error(rc, h, self.path, "wait_durable")

    def wait_written(self, lsn: int) -> None:
        """Block until frame ``lsn`` (and all before it) is written to the OS: what an
        ``async`` append promises, for a frame appended under ``exit`` (queued only)."""
        _check_lsn(lsn)
        h = self._handle()
        rc = lib.dkv_wait_written(h, lsn)
        if rc:
            raise _error(rc, h, self.path, "wait_written")

    @property
    def commit_syncs(self) -> int:
        """How many fdatasyncs group-commit leaders ran on this handle: appended frames
        per sync is the group size (concurrent durable appends share one)."""
        return lib.dkv_commit_syncs(self._handle())

    @property
    def step_ids(self) -> bool:
        """Whether the active segment's header has flag ``STEP_IDS`` (FORMAT.md sections 2,
        5a): journal records appended now may hold compact step ids. Every segment this
        version creates has it; a store an older durkv created gets it at its next segment."""
        return bool(lib.dkv_active_flags(self._handle()) & 1)

    @property
    def flusher_syncs(self) -> int:
        """How many fdatasyncs the async flusher ran on this handle: what makes ``async``
        appends (and ``wait_written`` frames) durable within ``flush_interval_ms``."""
        return lib.dkv_flusher_syncs(self._handle())

    @property
    def shared_durable(self) -> tuple[int, int] | None:
        """A writer's view of the store's shared watermark (FORMAT.md section 12):
        ``(durable, publishes)`` -- frames below ``durable`` were fdatasync'd by some
        process of the store, and ``publishes`` counts the fdatasyncs (or failures)
        published so far. None on a handle that shares none (read-only)."""
        h = self._handle()
        d, n = _new("uint64_t *"), _new("uint64_t *")
        if lib.dkv_shared_durable(h, d, n):
            return None
        return d[0], n[0]

    @property
    def durable_lsn(self) -> int:
        """Frames with lsn < durable_lsn are durable."""
        return lib.dkv_durable_lsn(self._handle())

    @property
    def next_lsn(self) -> int:
        at = self._next_at      # read on every commit (twice): no call for the common case
        if at is None:
            self._handle()      # raises: closed, or a fork's
        return at[0]

    @property
    def start_lsn(self) -> int:
        return lib.dkv_start_lsn(self._handle())

    def seal(self, new_start_lsn: int | None = None) -> None:
        """Seal the active segment and start a new one; with ``new_start_lsn``, also drop
        sealed segments wholly below it (FORMAT.md section 7)."""
        h = self._handle()
        rc = lib.dkv_seal(h, new_start_lsn or 0)
        if rc:
            raise _error(rc, h, self.path, "seal")

    def refresh(self) -> None:
        """Read-only handles: see frames a concurrent writer appended since open.

        Raises StaleReaderError when ``durkv recover`` repaired the log since this handle
        opened it (HEAD's repair epoch changed, FORMAT.md 2a): open it again."""
        h = self._handle()
        rc = lib.dkv_refresh(h)
        if rc:
            raise _error(rc, h, self.path, "refresh")

    # -- reading

    def read_frame(self, lsn: int) -> tuple[int, bytes]:
        """(frame type, payload) of frame ``lsn``; NotFoundError if the log lacks it."""
        h = self._h
        if h is None:
            self._handle()
        if type(lsn) is not int or not 0 <= lsn < (1 << 63):
            if type(lsn) is int and lsn < 0:
                raise NotFoundError(f"lsn {lsn} is not in the log")
            _check_lsn(lsn)
        buf = _new("uint8_t **")
        ln = _new("uint32_t *")
        ty = _new("uint8_t *")
        rc = _read_alloc(h, lsn, buf, ln, ty)
        if rc:
            raise _error(rc, h, self.path, "read")
        p = buf[0]
        try:
            return ty[0], _buffer(p, ln[0])[:]
        finally:
            _free(p)

    def read(self, lsn: int) -> bytes:
        return self.read_frame(lsn)[1]

    def scan_frames(self, from_lsn: int = 0) -> Iterator[tuple[int, int, bytes]]:
        """(lsn, type, payload) of every frame from ``from_lsn`` to the current end.
        Under ``recovery="salvage"`` unreadable frames are skipped."""
        lsn = max(from_lsn, self.start_lsn)
        end = self.next_lsn
        while lsn < end:
            try:
                t, p = self.read_frame(lsn)
            except (NotFoundError, CorruptionError):
                if not self._salvage:
                    raise
            else:
                yield lsn, t, p
            lsn += 1

    def scan(self, from_lsn: int = 0) -> Iterator[tuple[int, bytes]]:
        for lsn, _, p in self.scan_frames(from_lsn):
            yield lsn, p

    def payload_bytes(self, lsns: list[int]) -> int:
        """The summed payload length of the frames ``lsns``, from the segments' frame
        offsets in one C call; frames whose size the offsets do not pin down (next to a
        frame lost to damage) are read, as :meth:`read` does."""
        h = self._handle()
        want = array("Q", lsns)
        total = _new("uint64_t *")
        done = _new("size_t *")
        rc = lib.dkv_payload_bytes(h, _from_buffer("uint64_t[]", want), len(want), total, done)
        if rc:
            raise _error(rc, h, self.path, "read")
        n = done[0]
        return total[0] + sum(len(self.read(lsn)) for lsn in lsns[n:])

    def read_heads(self, lsns: list[int]) -> Any:
        """The heads of the COMMIT frames ``lsns`` as one msgpack array (a bytes-like
        buffer), in one C call (each frame crc-checked as :meth:`read_frame` does)."""
        h = self._handle()
        want = array("Q", lsns)
        buf = _new("uint8_t **")
        ln = _new("size_t *")
        rc = lib.dkv_read_heads(h, _from_buffer("uint64_t[]", want), len(want), buf, ln)
        if rc:
            raise _error(rc, h, self.path, "read")
        # no copy of what may be many MB: the buffer frees the C memory when collected
        return _buffer(ffi.gc(buf[0], _free), ln[0])

    def read_channel(self, lsn: int, idx: int) -> tuple[list[bytes], int]:
        """The materialized item list of channel entry (lsn, idx), in one C call."""
        h = self._handle()
        buf = ffi.new("uint8_t **")
        ln = ffi.new("size_t *")
        n = ffi.new("uint32_t *")
        fl = ffi.new("uint32_t *")
        rc = lib.dkv_read_channel(h, lsn, idx, buf, ln, n, fl)
        if rc:
            raise _error(rc, h, self.path, "read_channel")
        try:
            data = _buffer(buf[0], ln[0])[:]
        finally:
            _free(buf[0])
        return _split_items(data, n[0]), fl[0]

    def segments(self) -> list[SegmentInfo]:
        h = self._handle()
        out = ffi.new("dkv_report **")
        rc = lib.dkv_segments(h, out)
        if rc:
            raise _error(rc, h, self.path, "segments")
        r = out[0]
        try:
            return [SegmentInfo(name=_s(s.segment), segment_no=int(s.segment_no),
                                base_lsn=int(s.base_lsn), sealed=bool(s.sealed),
                                frames=int(s.frames_ok), bytes=int(s.bytes))
                    for s in (r.segments[i] for i in range(r.n_segments))]
        finally:
            lib.dkv_report_free(r)

    def verify(self, deep: bool = False) -> Report:
        """Verify the files of this log (like :func:`verify`; takes no lock)."""
        self._handle()
        return verify(self.path, deep=deep)

    @property
    def recovery_damage(self) -> Damage | None:
        """What open dropped or cut: a quarantined torn tail, or under point_in_time the
        damage the log was cut at (``lost_first_lsn`` on are unreadable; the handle is then
        read-only until ``durkv recover --skip-corrupt``)."""
        return self._recovery_damage


def _check_lsn(lsn: object) -> None:
    """An LSN argument is an int in the log's range (a str, a float or a negative number
    is a caller's mistake, told as one rather than as cffi's TypeError/OverflowError)."""
    if type(lsn) is not int or not 0 <= lsn < (1 << 63):
        raise ConfigError(f"an LSN is an int from 0 to 2**63-1, got {lsn!r}")


def check_lsns(le: bytes, lo: int, hi: int, order: int = 0) -> int:
    """Check LSNs stored as little-endian u64 bytes (a K_INDEX snapshot's arrays) in one
    C pass: 0 each in ``[lo, hi)`` and in ``order`` (0 any, 1 non-decreasing, 2 strictly
    ascending), 1 one outside the range, 2 out of order."""
    return lib.dkv_lsns_check(le, len(le) // 8, lo, hi, order)


def _split_items(data: bytes, n: int) -> list[bytes]:
    items = []
    off = 0
    unpack = struct.unpack_from
    for _ in range(n):
        (ln,) = unpack("<I", data, off)
        items.append(data[off + 4:off + 4 + ln])
        off += 4 + ln
    return items


# ---------------------------------------------------------------- verify / recover

class _Progress:
    """The ``progress`` given to verify/recover, and what it raised: cffi cannot pass an
    exception out of a callback (it prints a traceback and goes on), so the first one --
    a KeyboardInterrupt, often -- is kept and raised when the C call returns."""

    __slots__ = ("fn", "raised", "handle")

    def __init__(self, fn: Callable[[int, int], None]) -> None:
        self.fn = fn
        self.raised: BaseException | None = None
        self.handle = ffi.new_handle(self)

    def reraise(self) -> None:
        if self.raised is not None:
            raise self.raised


@ffi.def_extern()
def dkv_py_progress(ctx, done, total):
    """The C side's progress callback: calls the ``progress`` given to verify/recover."""
    p = ffi.from_handle(ctx)
    if p.raised is None:
        try:
            p.fn(done, total)
        except BaseException as e:  # noqa: B036 - kept, raised after the C call
            p.raised = e


def _progress_args(progress: Callable[[int, int], None] | None
                   ) -> tuple[Any, Any, _Progress | None]:
    """``(callback, ctx, holder)`` for a C call taking a progress hook; keep the holder
    alive for the call, then ``holder.reraise()``."""
    if progress is None:
        return ffi.NULL, ffi.NULL, None
    p = _Progress(progress)
    return lib.dkv_py_progress, p.handle, p


def verify(path: str | os.PathLike, deep: bool = False,
           progress: Callable[[int, int], None] | None = None) -> Report:
    """Check every segment of the log at ``path`` (no lock taken; nothing changes).

    ``deep`` also decodes COMMIT frames and checks that every DELTA/SNAP reference
    resolves, and every reference to a journal record (FORMAT.md 5 ``jref``, 5a ``ir``).
    Findings are returned, never raised. ``progress(done, total)`` is called after each
    segment file.
    """
    path = os.fspath(path)
    out = ffi.new("dkv_report **")
    cb, ctx, held = _progress_args(progress)
    rc = lib.dkv_verify(os.fsencode(path), 1 if deep else 0, cb, ctx, out)
    if held is not None and held.raised is not None:
        if not rc:
            lib.dkv_report_free(out[0])
        held.reraise()      # verify changes nothing: stopping after it is stopping it
    if rc:
        raise _error(rc, None, path, "verify", thread=True)
    try:
        return _report(out[0])
    finally:
        lib.dkv_report_free(out[0])


def _lock_holder(path: str) -> str:
    """Who holds the store's LOCK: the pids /proc/locks names (writers share LOCK and
    write no pid into it), else the pid written into it, else "?"."""
    lock = os.path.join(path, "LOCK")
    try:
        st = os.stat(lock)
        file = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as f:     # "1: FLOCK  ADVISORY  READ 4242 fe:00:77 0 EOF"
            pids = sorted({int(w[4]) for w in map(str.split, f)
                           if len(w) >= 6 and w[1] == "FLOCK" and w[5] == file})
        if pids:
            return ", ".join(map(str, pids))
        with open(lock) as f:
            return f.read().strip() or "?"
    except (OSError, ValueError):
        return "?"


def recover(path: str | os.PathLike, *, skip_corrupt: bool = False,
            dry_run: bool = False,
            progress: Callable[[int, int], None] | None = None) -> Report:
    """Repair the log at ``path``: quarantine + truncate a torn tail; with
    ``skip_corrupt``, cut the log at the first damage (every removed byte is copied to
    ``quarantine/`` first). It also removes the ``<segment>.tmp`` and ``HEAD.tmp`` a writer
    killed mid-roll can leave (no frame in them, FORMAT.md 1). Idempotent. ``dry_run``
    changes nothing and reports the plan.

    A cut of more than a torn tail is announced first by a durable note in ``repairs/``
    (docs/FORMAT.md 6a; ``report.repair`` is its id): the next store open names the runs
    it touched, even if this process dies right after the cut.

    Raises CorruptionError (with ``.report``) for mid-log damage without ``skip_corrupt``.
    ``progress(done, total)`` is called after each segment file is checked.
    """
    path = os.fspath(path)
    if dry_run or not skip_corrupt:
        return _recover(path, skip_corrupt, dry_run, progress)
    note = repairnotes.begin(path, _recover(path, True, True))
    try:
        report = _recover(path, True, False, progress)
    except StoreLockedError:
        if note is not None:        # refused before anything changed
            repairnotes.void(path, note, "the store was locked")
        raise
    if note is not None:
        report.repair = repairnotes.finish(path, note, report)["id"]
    return report


def _recover(path: str, skip_corrupt: bool, dry_run: bool,
             progress: Callable[[int, int], None] | None = None) -> Report:
    out = ffi.new("dkv_report **")
    cb, ctx, held = _progress_args(progress)
    rc = lib.dkv_recover(os.fsencode(path), 1 if skip_corrupt else 0, 1 if dry_run else 0,
                         cb, ctx, out)
    report = None
    if out[0] != ffi.NULL:
        try:
            report = _report(out[0])
        finally:
            lib.dkv_report_free(out[0])
    if held is not None:
        held.reraise()      # the repair ran to its end (it cannot stop midway)
    if rc == lib.DKV_ECORRUPT and report is not None:
        first = next((d for d in report.damage if d.kind != "torn_tail"), report.damage[0])
        err = CorruptionError(
            f"segment {first.segment} offset {first.offset}: {first.kind} ({first.detail}); "
            "the damage is not a torn tail: run recover with skip_corrupt=True "
            "(durkv recover --skip-corrupt) to cut the log there",
            segment=first.segment, offset=first.offset, kind=first.kind, path=path,
            report=report.to_dict())
        err.report = report
        raise err
    if rc == lib.DKV_ELOCKED:
        raise StoreLockedError(f"store is locked by pid {_lock_holder(path)}; close it first",
                               path=path)
    if rc:
        raise _error(rc, None, path, "recover", thread=True)
    assert report is not None
    return report


# ---------------------------------------------------------------- crc32c, test hooks

def crc32c(data, seed: int = 0) -> int:
    """CRC-32C of ``data`` continuing from ``seed`` (hardware where the CPU has it)."""
    return lib.dkv_crc32c(seed, _from_buffer(data), len(data))


def crc32c_portable(data, seed: int = 0) -> int:
    """The table-driven CRC-32C (same results as :func:`crc32c`)."""
    return lib.dkv_crc32c_portable(seed, _from_buffer(data), len(data))


def crc32c_hw() -> bool:
    """True if :func:`crc32c` uses the SSE4.2 instruction."""
    return bool(lib.dkv_crc32c_hw())


def crc32c_clmul() -> bool:
    """True if :func:`crc32c` folds buffers of 64 bytes and more with PCLMULQDQ."""
    return bool(lib.dkv_crc32c_clmul())


def fdatasync_count() -> int:
    """Successful fdatasyncs the log library made in this process, on any file (frames,
    segment headers, seals, HEAD): a witness that durable really means synced."""
    return lib.dkv_fdatasync_count()


def fault_inject(op: str | None, nth: int = 1, err: int = _errno.EIO, *,
                 kill: bool = False, pause_ms: int | None = None) -> None:
    """Test hook: make the ``nth`` next ``op`` ("write", "fdatasync", "dirfsync") in this
    process fail with errno ``err`` -- or, with ``kill``, SIGKILL the process just before
    it (a crash at an exact point); or, with ``pause_ms``, sleep that long before it and
    then run it (a slow disk at an exact point). ``op=None`` clears every injected fault."""
    if kill:
        err = lib.DKV_FAULT_KILL
    if op is None:
        for code in _FAULT_OPS.values():
            lib.dkv_fault_inject(code, 0, 0)
        return
    if op not in _FAULT_OPS:
        raise ConfigError(f"fault op must be one of {', '.join(_FAULT_OPS)}; got {op!r}")
    bad = (lib.dkv_fault_pause(_FAULT_OPS[op], nth, pause_ms) if pause_ms is not None
           else lib.dkv_fault_inject(_FAULT_OPS[op], nth, err))
    if bad:
        raise ConfigError(f"bad fault injection nth={nth} pause_ms={pause_ms}")


def raw_write_loop(path: str | os.PathLike, n: int, size: int, *, sync: bool) -> None:
    """The hardware floor under a commit: ``n`` writes of ``size`` bytes appended to
    ``path`` (created or truncated), each fdatasync'd when ``sync``. No log, no framing,
    no Python in the loop: what a ``sync`` (or, without ``sync``, an ``async``) commit is
    measured against. Raises OSError if a write or fdatasync fails."""
    if n < 0 or size < 1:
        raise ConfigError(f"raw_write_loop needs n >= 0 and size >= 1; got n={n}, size={size}")
    err = ffi.new("int *")
    rc = lib.dkv_raw_loop(os.fsencode(path), n, size, 1 if sync else 0, err)
    if rc == lib.DKV_ENOMEM:
        raise MemoryError(f"raw_write_loop: no memory for a {size}-byte buffer")
    if rc:
        raise OSError(err[0], os.strerror(err[0]), os.fspath(path))


__all__ = [
    "FRAME_DATA", "FRAME_COMMIT",
    "SegmentLog", "SegmentInfo", "Report", "SegmentReport", "Damage",
    "verify", "recover", "crc32c", "crc32c_portable", "crc32c_hw", "fault_inject",
    "fdatasync_count", "raw_write_loop",
]
