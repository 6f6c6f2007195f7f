"""The local cache of a live ``s3://`` store: its objects as files on this machine, and
the decoded frames of the few objects read last (FORMAT.md section 11, "Local cache").

Objects are immutable (create-only), so a file named by the object's key and tag (its
ETag, or the CRC-32C a manifest gives) holds exactly that object; its crc is still
checked on every read, and a damaged file is dropped and fetched again. Memory is
bounded by ``budget`` bytes of decoded frames (whatever the size of the store).
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections import OrderedDict
from typing import Callable

from durkv.errors import ConfigError, CorruptionError

from .livefmt import decode_batch

__all__ = ["LiveCache", "default_cache_dir"]


def default_cache_dir(endpoint: str | None, bucket: str, prefix: str) -> str:
    base = os.environ.get("DURKV_S3_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "durkv", "s3")
    digest = hashlib.sha256(f"{endpoint or ''}\0{bucket}\0{prefix}".encode()).hexdigest()
    return os.path.join(base, digest[:24])


class LiveCache:
    def __init__(self, root: str, budget: int = 64 << 20) -> None:
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the s3:// cache directory {root}: {exc}; set "
                              "DURKV_S3_CACHE_DIR or pass cache_dir= to a writable "
                              "directory") from exc
        self.root = root
        self._budget = budget
        self._lru: OrderedDict[str, tuple[int, list[bytes]]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def _path(self, rel: str, tag: str) -> str:
        return os.path.join(self.root, f"{rel.replace('/', '~')}.{tag}")

    def store(self, rel: str, tag: str, data: bytes) -> None:
        """Keep an object's bytes (atomic rename: a concurrent reader sees all or none)."""
        path = self._path(rel, tag)
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def drop(self, rel: str, tag: str) -> None:
        """Forget an object that was deleted from S3 (its file and its frames)."""
        with self._lock:
            entry = self._lru.pop(rel, None)
            if entry:
                self._held -= entry[0]
        try:
            os.unlink(self._path(rel, tag))
        except FileNotFoundError:
            pass

    def remember(self, rel: str, frames: list[bytes]) -> None:
        size = sum(len(f) for f in frames) + 64
        with self._lock:
            old = self._lru.pop(rel, None)
            if old:
                self._held -= old[0]
            self._lru[rel] = (size, frames)
            self._held += size
            while self._held > self._budget and len(self._lru) > 1:
                _, (n, _) = self._lru.popitem(last=False)
                self._held -= n

    def frames(self, rel: str, tag: str, fetch: Callable[[], bytes]) -> list[bytes]:
        """The frames of object ``rel``: from memory, else the cache file, else ``fetch()``
        (kept as a file for next time)."""
        with self._lock:
            hit = self._lru.get(rel)
            if hit is not None:
                self._lru.move_to_end(rel)
                return hit[1]
        path = self._path(rel, tag)
        frames = None
        try:
            with open(path, "rb") as f:
                frames = decode_batch(f.read(), path)[2]
        except FileNotFoundError:
            pass
        except CorruptionError:
            os.unlink(path)         # a damaged cache file: fetch the object again
        if frames is None:
            data = fetch()
            frames = decode_batch(data, rel)[2]
            self.store(rel, tag, data)
        self.remember(rel, frames)
        return frames

    def held_bytes(self) -> int:
        return self._held
