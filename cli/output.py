"""Exit codes, error lines and output for the ``durkv`` command line: all in one place.

Every command follows the same habits (docs: README "Command line"):

- ``--json`` puts exactly one strict JSON document on stdout and nothing else:
  the result, or on an error ``{"error": code, "message": ..., "exit_code": n}``.
  Stored values JSON cannot hold are encoded by :mod:`durkv.cli.strict_json`.
  Messages, hints and the error line go to stderr.
- Long work (verify, recover, compact, archive, restore, bench) shows a progress bar
  on stderr when stderr is a terminal and the output is for humans: none when piped,
  with ``--json``, or with ``-q`` (:func:`with_progress`).
- An error is one line on stderr, ``error: <message>``, optionally followed by a
  ``Try: ...`` hint, and the exit code of :data:`EXIT_CODES`; no traceback unless
  ``durkv --debug``.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from ..errors import (
    BackendError,
    ConfigError,
    CorruptionError,
    DurkvError,
    FencedError,
    LogFailedError,
    NotFoundError,
    StoreClosedError,
    StoreLockedError,
)
from . import strict_json

EXIT_OK = 0
EXIT_ERROR = 1       # operational: lock held, fenced, I/O, missing store
EXIT_USAGE = 2       # bad arguments or configuration
EXIT_CORRUPT = 3     # corruption found (or left in place)

# Most specific first: the first matching class decides. Anything else that is a
# DurkvError or an OSError is an operational error (1).
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (CorruptionError, EXIT_CORRUPT),
    (ConfigError, EXIT_USAGE),           # includes FrameTooLargeError
    (StoreLockedError, EXIT_ERROR),
    (StoreClosedError, EXIT_ERROR),      # operational: a handle used after close()
    (FencedError, EXIT_ERROR),
    (LogFailedError, EXIT_ERROR),
    (BackendError, EXIT_ERROR),
    (NotFoundError, EXIT_ERROR),
    (DurkvError, EXIT_ERROR),
    (OSError, EXIT_ERROR),
)

JSON_KEY = "durkv.json"   # ctx.meta flag: the running command was asked for --json

# Every PATH argument. click's default Path(readable=True) turns an unreadable store into a
# usage error (exit 2 and the usage text); it is an operational one: the command opens it
# and reports the file and strerror on one line, exit 1.
STORE_PATH = click.Path(path_type=Path, readable=False)


def json_option(f):
    return click.option("--json", "as_json", is_flag=True,
                        help="Print only JSON on stdout (errors too); messages go to stderr.")(f)


def quiet_option(f):
    return click.option("-q", "--quiet", is_flag=True,
                        help="Print nothing on success; the exit code tells.")(f)


def exit_code_for(exc: BaseException) -> int:
    """The process exit code for an error that reached the command line."""
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return EXIT_ERROR


def hint_for(exc: BaseException) -> str | None:
    """A ``Try:`` line for errors where the next step is not obvious."""
    if isinstance(exc, CorruptionError) and exc.context.get("kind") != "bad_repair_note":
        # (a damaged repair note's message says what to do; recover cuts nothing there)
        return ("Try: durkv verify PATH to see every finding, then "
                "durkv recover --skip-corrupt PATH (copies removed bytes to PATH/quarantine/)")
    return None


def message_for(exc: BaseException) -> str:
    """One line: the error's own message, never a repr or a traceback."""
    if isinstance(exc, DurkvError):
        text = exc.message
    elif isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())  # one line, whatever the message held


def error_dict(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, DurkvError):
        data = exc.to_dict()
        data["message"] = message_for(exc)
    else:
        data = {"error": "os_error" if isinstance(exc, OSError) else "error",
                "message": message_for(exc)}
    data["exit_code"] = exit_code_for(exc)
    return data


def report_error(ctx: click.Context, exc: BaseException, hint: str | None = None) -> int:
    """Print one error line (and the JSON error object under --json); return the exit code.

    ``hint`` replaces the default ``Try:`` line of :func:`hint_for`.
    """
    if ctx.meta.get(JSON_KEY):
        emit_json(error_dict(exc))
    click.echo(f"error: {message_for(exc)}", err=True)
    hint = hint or hint_for(exc)
    if hint:
        click.echo(hint, err=True)
    return exit_code_for(exc)


def emit_json(data: Any) -> None:
    """Write one strict JSON document to stdout: values JSON lacks become the markers of
    :mod:`durkv.cli.strict_json`, never ``NaN`` tokens, never dropped."""
    click.echo(strict_json.dumps(data, indent=2))


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _one_line(cell: str) -> str:
    if cell.isprintable():
        return cell
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in cell)


def table(rows: list[tuple[str, ...]], headers: tuple[str, ...],
          right: frozenset[int] = frozenset()) -> str:
    """A plain aligned text table; column indexes in ``right`` are right-aligned. A cell's
    control characters (a newline in a thread id) are escaped: one row is one line."""
    rows = [tuple(_one_line(c) for c in row) for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = []
    for row in (headers, *rows):
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


class ProgressBar:
    """A progress callback ``bar(done, total)``: draws a bar on stderr, only when stderr
    is a terminal and ``enabled`` (the command's output is for humans: no ``-q``, no
    ``--json``). Piped or quiet, it is a no-op, so long work can always report to it."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self.bar: Any = None
        self.done = 0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr)
            self.bar.__enter__()
        self.bar.update(max(0, done - self.done))
        self.done = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def with_progress(label: str, enabled: bool, fn: Callable[[ProgressBar], Any]) -> Any:
    """``fn(bar)`` with a :class:`ProgressBar` that is closed however ``fn`` ends."""
    bar = ProgressBar(label, enabled)
    try:
        return fn(bar)
    finally:
        bar.close()


@contextmanager
def sigint_deferred() -> Iterator[list[bool]]:
    """Ctrl-C noted, not raised, for a block that must not stop midway (a repair: its
    cut and its record): yields a one-item list, True once SIGINT came."""
    got = [False]
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def note(signum: int, frame: Any) -> None:
        got[0] = True

    old = signal.signal(signal.SIGINT, note)
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, old)
