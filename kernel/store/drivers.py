"""One driver per run and per thread, across processes (issue 17; FORMAT.md section 12).

A driver -- a ``with store.run(...)``, or a LangGraph invocation of one thread -- claims
its run or thread with an exclusive ``flock`` on ``STORE/drivers/<xxh3 of kind+id>``,
held for as long as it drives, the driver's pid (for the message) being the file's size:
a sparse file has no data block to allocate and free, which made a claim of a file
holding the pid as text cost about 1 ms (most of a small LangGraph invocation). A
second driver, in this process or another, gets :class:`RunBusyError` naming the holder;
the kernel drops the lock of a holder that dies, even by ``kill -9``, so a dead driver
releases at once. A released claim unlinks its file, so the directory holds only the
claims being held: a claimant that locked a file already unlinked (it opened it just
before) sees another inode at the path and tries again.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import weakref

import xxhash

from ..errors import BackendError, RunBusyError

__all__ = ["DriverClaim", "claim", "driver_pid", "claim_held"]


_held: weakref.WeakSet = weakref.WeakSet()     # this process's claims (see _after_fork)
# a claim may be released from two threads at once (a LangGraph invocation's exit stack,
# and the collection of its loop): one of them closes the fd, never both (the number
# could be another file's by then)
_releasing = threading.Lock()


class DriverClaim:
    """A held claim: :meth:`release` (idempotent) gives it up."""

    __slots__ = ("path", "fd", "__weakref__")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd
        _held.add(self)

    def release(self) -> None:
        with _releasing:
            fd, self.fd = self.fd, -1
        if fd < 0:
            return
        try:
            os.unlink(self.path)     # under the lock: no one holds this inode after us
        except OSError:
            pass
        os.close(fd)


def _after_fork() -> None:
    """In a forked child: close its copies of the parent's claim fds (the lock is the
    parent's; a copy would keep it held after the parent releases it or dies), and take
    a new ``_releasing`` (another thread may have held it at the fork)."""
    global _releasing
    _releasing = threading.Lock()
    for c in list(_held):
        fd, c.fd = c.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


os.register_at_fork(after_in_child=_after_fork)


def _holder(fd: int) -> str:
    try:
        return str(os.fstat(fd).st_size or "?")
    except OSError:
        return "?"


def _claim_path(store_dir: str, kind: str, key: str) -> str:
    name = xxhash.xxh3_64_hexdigest(f"{kind}\0{key}".encode())
    return os.path.join(store_dir, "drivers", name)


def driver_pid(store_dir: str, kind: str, key: str) -> int | None:
    """The pid of the process driving ``kind`` ``key`` now, else None -- without taking
    the lock (a reader's look must never make the driver's own claim fail).

    A released claim unlinks its file; a driver that died (kill -9) leaves it behind,
    unlocked, with its pid as the size: a file whose pid is not a live process is not a
    driver. (A pid the kernel gave to a new process since is shown as the driver: the
    answer is for an operator's eyes, never a lock.)"""
    try:
        pid = os.stat(_claim_path(store_dir, kind, key)).st_size
    except OSError:
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:     # alive, another user's
        pass
    if _zombie(pid):            # dead, not yet reaped by its parent: its claim is free
        return None
    return pid


def claim_held(store_dir: str, kind: str, key: str) -> int | None:
    """Whether a driver holds ``kind`` ``key`` now, by the lock itself: its pid (0 while
    a claimant has locked the file and not yet written its pid), else None. Unlike
    :func:`driver_pid` it is never fooled by a dead driver's pid given to a new process,
    for an answer a refusal rests on; the price is a shared lock held for an instant
    when no driver holds the claim (a driver claiming at that instant is refused)."""
    try:
        fd = os.open(_claim_path(store_dir, kind, key), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise BackendError(f"cannot read the claim of {kind} {key!r}: {e}") from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise BackendError(f"cannot read the claim of {kind} {key!r}: {e}") from e
            return os.fstat(fd).st_size
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits for its parent to reap it (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses, so split at the last ')'
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"Z"


def claim(store_dir: str, kind: str, key: str) -> DriverClaim:
    """Claim ``kind`` ``key`` (``"run"``/``"thread"``) of the store at ``store_dir``.

    Raises RunBusyError naming the holder's pid when another driver holds it."""
    path = _claim_path(store_dir, kind, key)
    d = os.path.dirname(path)
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            try:
                os.makedirs(d, exist_ok=True)
            except OSError as e:
                raise _claim_error(kind, key, d, e) from e
            continue
        except OSError as e:
            raise _claim_error(kind, key, path, e) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            pid = _holder(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise _claim_error(kind, key, path, e) from e
            what = "run" if kind == "run" else "LangGraph thread"
            raise RunBusyError(
                f"{what} {key!r} is being driven by pid {pid} (one driver per {kind}, "
                "across processes); let it finish, or drive another one",
                run_id=key, holder_pid=pid) from None
        same = False
        try:
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                pass
            if same:
                os.ftruncate(fd, os.getpid())       # the pid as the size: no data written
        except OSError as e:
            if same:        # ours (locked, the same inode): release it, as release() does
                try:
                    os.unlink(path)
                except OSError:
                    pass
            os.close(fd)
            raise _claim_error(kind, key, path, e) from e
        if not same:            # the file we locked was released and unlinked meanwhile
            os.close(fd)
            continue
        return DriverClaim(path, fd)
    raise BackendError(f"cannot claim {kind} {key!r}: {path} keeps being replaced", path=path)


def _claim_error(kind: str, key: str, path: str, e: OSError) -> BackendError:
    """A claim's I/O failure, naming the file and the errno (docs/GUARANTEES.md 12)."""
    return BackendError(f"cannot claim {kind} {key!r}: {path}: {e.strerror or e}", path=path,
                        errno=errno.errorcode.get(e.errno or 0, str(e.errno)))
