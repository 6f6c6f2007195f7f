"""The log a command names: its directory checked, and the compiled log that reads it.

Shared by every command module (``main``'s verify/recover, ``browse``, ``demo``),
so that none of them imports another command module.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError, DurkvError, NotFoundError


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
    """The log directory at ``path``, or NotFoundError (exit 1) saying what is there instead
    (ConfigError, exit 2, for an ``s3://`` URL: these commands read a local directory)."""
    if not path.exists():
        _refuse_s3_url(path)
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


def _refuse_s3_url(path: Path) -> None:
    """ConfigError for an ``s3://`` URL given where a local store directory goes. click's
    Path made it ``s3:/BUCKET/PREFIX`` (one slash), which read as a missing directory."""
    text = str(path)
    if not text.startswith("s3:/"):
        return
    url = "s3://" + text[len("s3:/"):].lstrip("/")
    ctx = click.get_current_context(silent=True)
    cmd = f"durkv {ctx.info_name}" if ctx is not None and ctx.info_name else "this command"
    raise ConfigError(f"{url} is on S3, and {cmd} reads a local store directory: restore it "
                      f"into one first (durkv restore {url} ./DIR), then {cmd} ./DIR")
