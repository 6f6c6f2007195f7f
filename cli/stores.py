"""The log a command names: its directory checked, and the compiled log that reads it.

Shared by every command module (``main``'s verify/recover, ``browse``, ``demo``),
so that none of them imports another command module.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import DurkvError, NotFoundError


def log_module() -> Any:
    """``durkv.log``, or one clear error when the compiled log is missing."""
    try:
        # imported here, not at the top: a missing compiled module must be one error line
        # from the command that needs it, and leave --help and the other commands working
        from .. import log
    except ImportError as exc:
        raise DurkvError(f"the compiled segment log cannot be loaded ({exc}); "
                         f"reinstall durkv: pip install -e .") from exc
    return log


def quarantined(path: str) -> dict[str, int]:
    """The files in ``path``/quarantine/ and their sizes (what recover, or a writer's
    open of a torn tail, put there)."""
    q = Path(path) / "quarantine"
    if not q.is_dir():
        return {}
    return {str(p): p.stat().st_size for p in sorted(q.rglob("*")) if p.is_file()}


def log_dir(path: Path) -> str:
    """The log directory at ``path``, or NotFoundError (exit 1) saying what is there instead."""
    if not path.exists():
        raise NotFoundError(f"no durkv log at {path}: no such directory")
    if not path.is_dir():
        raise NotFoundError(f"no durkv log at {path}: it is a file, not a log directory")
    try:
        names = os.listdir(path)
    except OSError:
        return str(path)    # unreadable: the log's own error names the file and the errno
    if not any(n.endswith(".seg") for n in names):
        raise NotFoundError(f"no durkv log at {path}: the directory holds no segment files (*.seg)")
    return str(path)
