"""fsync of a file or a directory by path: what makes a new file's bytes, or a directory's
new entry (a created, renamed or removed file), survive a power loss.

The segment log does its own in C; these serve the Python writers of whole files (repair
notes, a restored store) and of directories (a new store's parents).
"""

from __future__ import annotations

import os

__all__ = ["fsync_dir", "fsync_file"]


def _fsync(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str) -> None:
    """Make the file's bytes durable."""
    _fsync(path, os.O_RDONLY)


def fsync_dir(path: str) -> None:
    """Make the directory's entries durable (after a create, rename or unlink in it)."""
    _fsync(path, os.O_RDONLY | os.O_DIRECTORY)
