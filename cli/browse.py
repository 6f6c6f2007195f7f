"""``durkv ls``, ``history``, and ``show``'s checkpoint: read a store's threads and
checkpoints.

They open the store read-only (no lock: safe next to a running writer). The
store does not record which serializer wrote it, so ``--serde auto`` (the
default) decodes the newest checkpoint with durkv's msgpack serde and, if that
fails, with LangGraph's (what ``DurkvSaver`` writes).

A store written with LangGraph's ``EncryptedSerializer`` is listed all the same:
ids, times (the checkpoint id's, a time-based UUID) and sizes are readable
without the key; each encrypted value is printed as an ``$encrypted`` marker with
its size, and one line on stderr says that the values need the key.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from .. import open as open_store
from ..errors import ConfigError, DurkvError, NotFoundError, SerializationError
from . import output, strict_json
from .output import JSON_KEY
from .strict_json import Encrypted
from .stores import log_dir

SERDES = ("auto", "msgpack", "langgraph")


def serde_option(f):
    return click.option("--serde", type=click.Choice(SERDES), default="auto", show_default=True,
                        help="How values were serialized: durkv's msgpack or LangGraph's "
                             "(DurkvSaver); auto tries both.")(f)


def ns_option(f):
    return click.option("--ns", "ns", default="", show_default=False, metavar="NS",
                        help="Checkpoint namespace (default: the root namespace '').")(f)


_NOTED = "durkv.encrypted_noted"    # ctx.meta: the "values need the key" line was printed


class _WithoutKey:
    """LangGraph's serializer for a reader that has no key: a value written by an
    ``EncryptedSerializer`` (stored type ``"<type>+<cipher>"``, e.g. ``msgpack+aes``, which
    nothing but that serializer with its key can load) loads as an :class:`Encrypted`
    marker of its size; every other value as ``JsonPlusSerializer`` loads it. ``ciphers``
    collects the cipher names met (``aes``), for the one line that says so."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.ciphers: set[str] = set()

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return self.inner.dumps_typed(obj)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, payload = data
        if "+" in type_:
            self.ciphers.add(type_.split("+", 1)[1])
            return Encrypted(type_, len(payload))
        return self.inner.loads_typed(data)


def _langgraph_serde() -> tuple[Any, _WithoutKey]:
    """LangGraph's serde for reading, and the part of it that notes encrypted values."""
    try:   # imported on use: durkv reads msgpack stores without langgraph installed
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

        from ..langgraph_serde import LangGraphSerde
    except ImportError as exc:
        raise ConfigError(f"reading a store written by LangGraph needs langgraph ({exc}); "
                          "pip install -e '.[langgraph]'") from exc
    keyless = _WithoutKey(JsonPlusSerializer())
    return LangGraphSerde(keyless), keyless


def _note_encrypted(ciphers: set[str]) -> None:
    """Say once per command, on stderr, that values were encrypted and need the key."""
    ctx = click.get_current_context(silent=True)
    if not ciphers or (ctx is not None and ctx.meta.get(_NOTED)):
        return
    if ctx is not None:
        ctx.meta[_NOTED] = True
    click.echo(f"note: the values are encrypted ({', '.join(sorted(ciphers))}): shown are "
               "ids, times and sizes; reading them needs the key (DurkvSaver with "
               "saver.serde = EncryptedSerializer(...))", err=True)


def _decodes(store: Any, tries: int = 8) -> bool:
    """True if the newest checkpoint of the first thread that has one decodes (or no
    thread has one). A thread a live writer deletes between the listing and the read
    has none: the next one decides (on a LangGraph store whose app deleted the first
    thread, the msgpack serde was chosen and every read of it failed)."""
    for thread in store.threads()[:tries]:
        for ns in store.namespaces(thread)[:1]:
            try:
                if store.get(thread, ns) is None:
                    continue
            except DurkvError as exc:
                if not isinstance(exc, SerializationError):
                    raise
                return False
            except (ValueError, TypeError):   # msgpack's decode errors are ValueErrors
                return False
            return True
    return True


def _undecodable(serde: str, cause: str) -> SerializationError:
    other = "msgpack" if serde == "langgraph" else "langgraph"
    return SerializationError(f"cannot decode a stored value with the {serde} serde "
                              f"({cause}); try --serde {other}")


@contextmanager
def open_reader(path: Path, serde: str) -> Iterator[Any]:
    """The store at ``path``, read-only, with the serializer that can decode it."""
    where = log_dir(path)
    keyless = None
    if serde == "langgraph":
        lg, keyless = _langgraph_serde()
        store = open_store(where, read_only=True, serde=lg)
    else:
        store = open_store(where, read_only=True)
        if serde == "auto" and not _decodes(store):
            store.close()
            lg, keyless = _langgraph_serde()
            store = open_store(where, read_only=True, serde=lg)
    try:
        yield store
    except DurkvError as exc:
        if not isinstance(exc, SerializationError) or "cause" not in exc.context:
            raise
        # durkv's serde on bytes it cannot read (its message gives the library's fix)
        raise _undecodable(serde, exc.context["cause"]) from exc
    # a value the chosen serde cannot decode (NotImplementedError: LangGraph's unknown type)
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise _undecodable(serde, f"{type(exc).__name__}: {exc}") from exc
    finally:
        store.close()
    if keyless is not None:
        _note_encrypted(keyless.ciphers)


def _present(store: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The channels that hold a value: without the marker a serde may load for "version
    moved, no value stored" (LangGraph's ``EMPTY``; the serde that writes it knows it)."""
    is_empty = getattr(store.serde, "is_empty", None)
    if is_empty is None:
        return dict(values)
    return {k: v for k, v in values.items() if not is_empty(v)}


def brief(value: Any, width: int = 60) -> str:
    """One line of strict JSON (the --json encoding), abbreviated to ``width``."""
    text = strict_json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= width else text[:width - 3] + "..."


_UUID_EPOCH = 0x01B21DD213814000     # 100 ns ticks from 1582-10-15 to 1970-01-01


def _id_time(checkpoint_id: str) -> float | None:
    """The Unix time a time-based UUID holds (v1, v6 -- LangGraph's checkpoint ids -- and
    v7), or None for any other id."""
    try:
        u = uuid.UUID(checkpoint_id)
    except ValueError:
        return None
    if u.version == 6:
        ticks = (u.time_low << 28) | (u.time_mid << 12) | (u.time_hi_version & 0x0FFF)
    elif u.version == 1:
        ticks = u.time
    elif u.version == 7:
        return (u.int >> 80) / 1000
    else:
        return None
    return (ticks - _UUID_EPOCH) / 1e7


def _time(ck: Any) -> str | None:
    """When the checkpoint was taken: the record's ``ts`` (LangGraph's), else the time in
    its id when the id is a time-based UUID (readable even when the record is encrypted)."""
    rec = ck.checkpoint
    if isinstance(rec, dict) and isinstance(rec.get("ts"), str):
        return rec["ts"]
    t = _id_time(ck.checkpoint_id)
    return None if t is None else dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat()


def _checkpoint_dict(store: Any, ck: Any, values: bool = True) -> dict[str, Any]:
    out = {
        "thread_id": ck.thread_id, "checkpoint_ns": ck.checkpoint_ns,
        "checkpoint_id": ck.checkpoint_id, "parent_id": ck.parent_id, "time": _time(ck),
        "metadata": ck.metadata, "versions": ck.versions,
    }
    if values:
        out["checkpoint"] = ck.checkpoint
        out["values"] = _present(store, ck.values)
        out["pending_writes"] = [
            {"task_id": w.task_id, "channel": w.channel, "idx": w.idx, "value": w.value,
             "task_path": w.task_path} for w in ck.writes]
    return out


def _step(meta: Any) -> str:
    return str(meta.get("step", "")) if isinstance(meta, dict) else ""


@click.command("ls")
@click.argument("path", type=output.STORE_PATH)
@serde_option
@output.json_option
@click.pass_context
def ls(ctx: click.Context, path: Path, serde: str, as_json: bool) -> None:
    """List the threads of a store with their newest checkpoint.

    One line per (thread, namespace): the newest checkpoint id, its parent, the
    metadata's step, and the channels it holds. Opens the store read-only.

    \b
    Example:
        durkv ls ./agent.durkv
        durkv ls --json ./agent.durkv | jq -r '.threads[].thread_id'
    """
    ctx.meta[JSON_KEY] = as_json
    rows, items = [], []
    with open_reader(path, serde) as store:
        for thread in store.threads():
            for ns in store.namespaces(thread):
                ck = store.get(thread, ns)
                if ck is None:
                    continue
                channels = sorted(_present(store, ck.values))
                items.append({**_checkpoint_dict(store, ck, values=False), "channels": channels})
                rows.append((thread, ns or "-", ck.checkpoint_id, _time(ck) or "-",
                             ck.parent_id or "-", _step(ck.metadata), ", ".join(channels)))
    if as_json:
        output.emit_json({"path": str(path), "threads": items})
    elif rows:
        click.echo(output.table(rows, ("thread", "ns", "latest checkpoint", "time", "parent",
                                       "step", "channels")))
    else:
        click.echo("no threads", err=True)


@click.command()
@click.argument("path", type=output.STORE_PATH)
@click.argument("thread")
@ns_option
@click.option("-n", "--limit", default=20, show_default=True, type=click.IntRange(min=0),
              help="Show at most this many checkpoints; 0 for all.")
@serde_option
@output.json_option
@click.pass_context
def history(ctx: click.Context, path: Path, thread: str, ns: str, limit: int, serde: str,
            as_json: bool) -> None:
    """List a thread's checkpoints, newest first.

    \b
    Example:
        durkv history ./agent.durkv t1
        durkv history -n 0 --json ./agent.durkv t1 | jq '.checkpoints | length'
    """
    ctx.meta[JSON_KEY] = as_json
    with open_reader(path, serde) as store:
        if ns not in store.namespaces(thread):
            raise NotFoundError(f"no thread {thread!r} (namespace {ns!r}) in {path}; "
                                f"durkv ls {path} lists the threads")
        # headers only: no channel value is shown, so none is read or deserialized
        cks = list(store.history(thread, ns, limit=limit or None, values=False))
        found = [_checkpoint_dict(store, ck, values=False) for ck in cks]
    if as_json:
        output.emit_json({"path": str(path), "thread_id": thread, "checkpoint_ns": ns,
                          "checkpoints": found})
        return
    rows = [(ck.checkpoint_id, _time(ck) or "-", ck.parent_id or "-", _step(ck.metadata),
             brief(ck.metadata)) for ck in cks]
    click.echo(output.table(rows, ("checkpoint", "time", "parent", "step", "metadata")))


def checkpoint_data(store: Any, path: Path, thread: str, checkpoint_id: str | None,
                    ns: str) -> dict[str, Any]:
    """A checkpoint of ``thread`` in the open ``store`` (read from ``path``) as plain
    data: metadata, versions, values and pending writes, whole. Without
    ``checkpoint_id``, the newest; NotFoundError when none."""
    ck = store.get(thread, ns, checkpoint_id)
    if ck is None:
        what = f"checkpoint {checkpoint_id!r} of thread {thread!r}" if checkpoint_id \
            else f"thread {thread!r}"
        raise NotFoundError(f"no {what} (namespace {ns!r}) in {path}; "
                            f"durkv ls {path} lists the threads")
    return _checkpoint_dict(store, ck)


def print_checkpoint(path: Path, thread: str, checkpoint_id: str | None, ns: str,
                     serde: str, as_json: bool) -> None:
    """``durkv show``'s checkpoint (:mod:`durkv.cli.journal_view` has the command): its
    metadata, versions, values and pending writes, long values abbreviated; ``as_json``:
    all of it whole, as one document. Without ``checkpoint_id``, the newest."""
    with open_reader(path, serde) as store:
        data = checkpoint_data(store, path, thread, checkpoint_id, ns)
    if as_json:
        output.emit_json(data)
    else:
        echo_checkpoint(data)


def echo_checkpoint(data: dict[str, Any]) -> None:
    """A checkpoint's plain data (:func:`checkpoint_data`) as text, long values
    abbreviated."""
    for key in ("thread_id", "checkpoint_ns", "checkpoint_id", "parent_id", "time"):
        click.echo(f"{key + ':':15}{data[key] or '-'}")
    click.echo(f"{'metadata:':15}{brief(data['metadata'], 200)}")
    click.echo(f"{'versions:':15}{brief(data['versions'], 200)}")
    click.echo("values:")
    for name, value in data["values"].items():
        if isinstance(value, list):
            last = f", last: {brief(value[-1], 80)}" if value else ""
            click.echo(f"  {name}: [{len(value)} items{last}]")
        else:
            click.echo(f"  {name}: {brief(value, 120)}")
    click.echo(f"pending writes: {len(data['pending_writes'])}")
    for w in data["pending_writes"]:
        click.echo(f"  {w['task_id']} -> {w['channel']}: {brief(w['value'], 80)}")
