"""Storage backends of durkv, chosen by URL.

>>> from durkv.backends import open_backend
>>> b = open_backend("memory://")
>>> b.append(b"\\x00" * 8)
0
"""

from __future__ import annotations

import os
from typing import Any

from durkv.errors import ConfigError

from .base import DURABILITIES, Backend

__all__ = ["Backend", "open_backend", "SCHEMES", "DURABILITIES"]

SCHEMES = ("file://", "memory://", "s3://")


def open_backend(url: str, **options: Any) -> Backend:
    """Open the backend a URL names: a path or ``file://path`` (local), ``memory://[name]``,
    ``s3://bucket/prefix`` (a live store on S3, :mod:`durkv.backends.s3.live`;
    ``takeover=True`` or ``?takeover=1`` takes it over from a writer that died).

    Options are those of :func:`durkv.store.open_store` that concern storage
    (durability, read_only, segment_bytes, flush_interval_ms, recovery, takeover).
    """
    if not isinstance(url, (str, os.PathLike)):
        raise ConfigError(f"store URL must be a string or path, got {type(url).__name__}")
    url = os.fspath(url)
    if options.get("takeover") and not url.startswith("s3://"):
        raise ConfigError(f"takeover=True applies to s3:// stores only, not {url!r}: a local "
                          "store's lock is released by the system when its writer dies")
    if not url:
        raise ConfigError("store URL is empty; pass a path such as './agent.durkv' or 'memory://'")
    if url.startswith("memory://"):
        from .memory import MemoryBackend

        return MemoryBackend(url, read_only=options.get("read_only", False))
    if url.startswith("s3://"):
        from .s3.live import S3Backend

        return S3Backend(url, **{k: v for k, v in options.items() if k in (
            "durability", "read_only", "flush_interval_ms", "takeover", "segment_bytes")})
    if url.startswith("file://"):
        path = url[len("file://"):]
    elif "://" in url:
        scheme = url.split("://", 1)[0]
        raise ConfigError(f"unknown store URL scheme {scheme!r} in {url!r}; supported: "
                          "a path or file://PATH (local), memory:// or memory://NAME, "
                          "s3://BUCKET/PREFIX")
    else:
        path = url
    from .local import LocalBackend

    return LocalBackend(url, path, **{k: v for k, v in options.items() if k in (
        "durability", "read_only", "segment_bytes", "flush_interval_ms", "recovery")})
