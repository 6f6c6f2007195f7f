"""A live store on S3: ``durkv.open("s3://bucket/prefix")`` (FORMAT.md section 11).

One writer at a time, fenced by epochs: opening for writing wins a create-only
epoch object and writes a fence batch, so a previous writer that is still running
(a zombie) fails its next PUT with ``FencedError``. Each flush is one create-only
batch object; concurrent ``sync`` committers share one PUT (group commit).

First version: frames are kept in memory, there is no merging of batches into
segment objects and no ``compact()``; ``?takeover=1`` in the URL takes the store over
from a writer that died (no lease decides it).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
import uuid
from typing import Any, Iterator
from urllib.parse import parse_qs

from durkv.backends.base import heads_array
from durkv.channels import resolve_channel
from durkv.errors import (
    ConfigError, CorruptionError, DurkvError, FencedError, NotFoundError, ReadOnlyError,
    StoreLockedError,
)
from durkv.log import crc32c

from .client import KeyExistsError, S3Location, crc32c_b64, translate

__all__ = ["S3Backend", "encode_batch", "decode_batch"]

_MAGIC = b"DKVBAT\x00\x01"
_HEAD = struct.Struct("<8sQQI")
EPOCHS = "live/epochs/"
WAL = "live/wal/"
_DIGITS = 20
_GATHER = 0.002     # seconds a group-commit leader waits for the committers it expects


def encode_batch(epoch: int, first_lsn: int, frames: list[bytes]) -> bytes:
    parts = [_HEAD.pack(_MAGIC, epoch, first_lsn, len(frames))]
    for f in frames:
        parts.append(struct.pack("<I", len(f)))
        parts.append(f)
    body = b"".join(parts)
    return body + struct.pack("<I", crc32c(body))


def decode_batch(data: bytes, key: str) -> tuple[int, int, list[bytes]]:
    """(writer_epoch, first_lsn, frames); CorruptionError naming ``key`` if damaged."""
    def bad(why: str) -> CorruptionError:
        return CorruptionError(f"live batch {key}: {why}", segment=key, kind="checksum_mismatch")

    if len(data) < _HEAD.size + 4:
        raise bad(f"{len(data)} bytes is too short")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if crc != crc32c(memoryview(data)[:-4]):
        raise bad("crc32c mismatch")
    magic, epoch, first, count = _HEAD.unpack_from(data, 0)
    if magic != _MAGIC:
        raise bad("bad magic")
    frames, off, end = [], _HEAD.size, len(data) - 4
    for _ in range(count):
        if off + 4 > end:
            raise bad("frame past the end")
        (n,) = struct.unpack_from("<I", data, off)
        frames.append(data[off + 4:off + 4 + n])
        off += 4 + n
    if off != end:
        raise bad("bytes after the last frame")
    return epoch, first, frames


def _num_key(prefix: str, n: int, ext: str) -> str:
    return f"{prefix}{n:0{_DIGITS}d}{ext}"


class S3Backend:
    """The Backend protocol (backends/base.py) over create-only S3 objects."""

    def __init__(self, url: str, *, durability: str = "sync", read_only: bool = False,
                 flush_interval_ms: int = 10, client: Any = None, **_options: Any) -> None:
        query = parse_qs(url.partition("?")[2])
        unknown = set(query) - {"takeover", "endpoint_url", "region"}
        if unknown:
            raise ConfigError(f"unknown option(s) {', '.join(sorted(unknown))} in {url!r}; "
                              "known: takeover=1, endpoint_url=URL, region=NAME")
        self.loc = S3Location.parse(url, endpoint_url=(query.get("endpoint_url") or [None])[0],
                                    region=(query.get("region") or [None])[0], client=client)
        self.url = url.partition("?")[0]
        self.read_only = read_only
        self.durability = durability
        self._interval = flush_interval_ms / 1000.0
        self._frames: list[bytes] = []
        self._durable = 0                 # frames below this LSN are in S3
        self._seq = 0                     # number of the next batch to read or write
        self._last_epoch = 0
        self._cond = threading.Condition(threading.Lock())
        self._flushing = False
        self._gathering = False
        self._last_group = 1              # frames the last PUT carried (group commit)
        self._failed: DurkvError | None = None
        self._closed = False
        self.puts = 0                     # batch PUTs made (group commit is measured by it)
        self._epoch = 0
        self._epoch_no = -1
        self._load()
        if read_only and self._seq == 0 and not any(True for _ in self.loc.list_keys(EPOCHS)):
            raise NotFoundError(f"no durkv store at {self.url}; open it for writing first",
                                url=self.url)
        self._flusher: threading.Thread | None = None
        if not read_only:
            self._acquire(takeover=(query.get("takeover") or ["0"])[0] in ("1", "true", "yes"))
            if durability == "async":
                self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                                 name="durkv-s3-flusher")
                self._flusher.start()

    # -- epochs and fencing -------------------------------------------------------------

    def _latest_epoch(self) -> dict | None:
        nums = [int(stem) for stem in (k[len(EPOCHS):].removesuffix(".json")
                                       for k in self.loc.list_keys(EPOCHS)) if stem.isdigit()]
        return self._get_json(_num_key(EPOCHS, max(nums), ".json")) if nums else None

    def _get_json(self, rel: str) -> dict:
        key = self.loc.key(rel)
        with translate(self.loc, "get " + key):
            body = self.loc.s3().get_object(Bucket=self.loc.bucket, Key=key)["Body"].read()
        try:
            return json.loads(body)
        except ValueError as exc:
            raise CorruptionError(f"live epoch object {key} is not JSON", segment=key,
                                  kind="bad_manifest") from exc

    def _put(self, rel: str, body: bytes, meta: dict[str, str]) -> bool:
        """Create-only PUT; False if the key holds someone else's object (put-id check:
        our own PUT whose response was lost and that botocore retried counts as ours)."""
        key = self.loc.key(rel)
        put_id = uuid.uuid4().hex
        try:
            with translate(self.loc, "put " + key):
                self.loc.s3().put_object(
                    Bucket=self.loc.bucket, Key=key, Body=body, IfNoneMatch="*",
                    ChecksumAlgorithm="CRC32C", ChecksumCRC32C=crc32c_b64(crc32c(body)),
                    Metadata={**meta, "durkv-put-id": put_id})
        except KeyExistsError:
            with translate(self.loc, "head " + key):
                head = self.loc.s3().head_object(Bucket=self.loc.bucket, Key=key)
            return head.get("Metadata", {}).get("durkv-put-id") == put_id
        return True

    def _acquire(self, takeover: bool) -> None:
        latest = self._latest_epoch()
        if latest and latest.get("state") == "open" and not takeover:
            raise StoreLockedError(
                f"store {self.url} is held by {latest.get('owner')} (writer epoch "
                f"{latest.get('writer_epoch')}); close it there, or if that writer is dead "
                f"open {self.url}?takeover=1", url=self.url, owner=latest.get("owner"))
        n = latest["epoch_no"] + 1 if latest else 0
        epoch = (latest["writer_epoch"] if latest else 0) + 1
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        doc = {"format": "durkv-live", "version": 1, "epoch_no": n, "writer_epoch": epoch,
               "state": "open", "owner": owner, "created_at_ns": time.time_ns()}
        if not self._put(_num_key(EPOCHS, n, ".json"), json.dumps(doc).encode(),
                         {"durkv-epoch": str(epoch)}):
            winner = self._get_json(_num_key(EPOCHS, n, ".json"))
            raise StoreLockedError(
                f"store {self.url} was just opened by {winner.get('owner')} (writer epoch "
                f"{winner.get('writer_epoch')}); this open lost the race", url=self.url,
                owner=winner.get("owner"))
        self._epoch, self._epoch_no, self._owner = epoch, n, owner
        # Fence: a batch with no frames at the next number. A previous writer still
        # running finds the number taken on its next PUT and stops (FencedError).
        while True:
            self._load()
            if self._put(_num_key(WAL, self._seq, ".batch"),
                         encode_batch(epoch, len(self._frames), []),
                         {"durkv-epoch": str(epoch)}):
                self._seq += 1
                self._last_epoch = epoch
                return

    # -- reading batches ----------------------------------------------------------------

    def _load(self) -> None:
        """Apply the batches written after the last one read."""
        after = _num_key(WAL, self._seq - 1, ".batch") if self._seq else None
        for rel in self.loc.list_keys(WAL, start_after=after):
            stem = rel[len(WAL):].removesuffix(".batch")
            if not stem.isdigit():
                continue
            key = self.loc.key(rel)
            if int(stem) != self._seq:
                raise CorruptionError(f"live store {self.url}: batch {self._seq} is missing "
                                      f"(next is {rel})", segment=key, kind="missing_segment")
            with translate(self.loc, "get " + key):
                data = self.loc.s3().get_object(Bucket=self.loc.bucket, Key=key)["Body"].read()
            epoch, first, frames = decode_batch(data, key)
            if first != len(self._frames) or epoch < self._last_epoch:
                raise CorruptionError(f"live batch {key}: lsn {first} epoch {epoch} does not "
                                      f"follow lsn {len(self._frames)} epoch {self._last_epoch}",
                                      segment=key, kind="lsn_gap")
            with self._cond:
                self._frames.extend(frames)
                self._durable = len(self._frames)
            self._seq += 1
            self._last_epoch = epoch

    # -- writing ------------------------------------------------------------------------

    def _check_write(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"{self.url} is open read-only; reopen without read_only=True")
        if self._closed:
            raise ConfigError(f"{self.url} is closed")
        if self._failed is not None:
            raise self._failed

    def append(self, payload: bytes, durability: str | None = None) -> int:
        with self._cond:
            self._check_write()
            self._frames.append(bytes(payload))
            lsn = len(self._frames) - 1
            if self._gathering:
                self._cond.notify_all()
        if (durability or self.durability) == "sync":
            self._flush_to(lsn + 1)
        return lsn

    def _flush_to(self, target: int) -> None:
        """Block until frames below ``target`` are in S3; one committer PUTs for all the
        others that wait meanwhile (group commit)."""
        with self._cond:
            while self._durable < target:
                if self._failed is not None:
                    raise self._failed
                if self._flushing:
                    self._cond.wait()
                    continue
                self._flushing = True
                if len(self._frames) - self._durable < self._last_group:
                    # The committers the last PUT served are appending again: give them
                    # a moment (at most _GATHER) to join this PUT instead of the next.
                    self._gathering = True
                    self._cond.wait_for(
                        lambda: len(self._frames) - self._durable >= self._last_group,
                        timeout=_GATHER)
                    self._gathering = False
                start, frames = self._durable, self._frames[self._durable:]
                seq = self._seq
                self._cond.release()
                err: DurkvError | None = None
                try:
                    ok = self._put(_num_key(WAL, seq, ".batch"),
                                   encode_batch(self._epoch, start, frames),
                                   {"durkv-epoch": str(self._epoch)})
                    if not ok:
                        err = FencedError(
                            f"store {self.url}: writer epoch {self._epoch} was fenced (batch "
                            f"{seq} exists: another writer took the store over); this handle "
                            "stops, nothing after its last acknowledged commit was written",
                            url=self.url)
                except DurkvError as exc:
                    err = exc
                finally:
                    self._cond.acquire()
                    self._flushing = False
                    self.puts += 1
                if err is None:
                    self._seq = seq + 1
                    self._durable = start + len(frames)
                    self._last_group = len(frames)
                else:
                    self._failed = err      # fail closed: a PUT that may or may not be there
                self._cond.notify_all()

    def _flush_loop(self) -> None:
        while True:
            time.sleep(self._interval)
            with self._cond:
                if self._closed or self._failed is not None:
                    return
                target = len(self._frames)
            if target > self._durable:
                try:
                    self._flush_to(target)
                except DurkvError:
                    return          # recorded in _failed; the next append raises it

    def flush(self) -> None:
        if not self.read_only:
            with self._cond:
                self._check_write()
                target = len(self._frames)
            self._flush_to(target)

    def wait_durable(self, lsn: int) -> None:
        if not self.read_only:
            self._flush_to(lsn + 1)

    # -- the rest of the protocol -------------------------------------------------------

    @property
    def next_lsn(self) -> int:
        return len(self._frames)

    @property
    def start_lsn(self) -> int:
        return 0

    def read(self, lsn: int) -> bytes:
        if not 0 <= lsn < len(self._frames):
            raise NotFoundError(f"{self.url}: no frame at LSN {lsn}", lsn=lsn)
        return self._frames[lsn]

    def scan(self, from_lsn: int = 0) -> Iterator[tuple[int, bytes]]:
        lsn = max(from_lsn, 0)
        while lsn < len(self._frames):
            yield lsn, self._frames[lsn]
            lsn += 1

    def read_heads(self, lsns: list[int]) -> bytes:
        return heads_array(self.read, lsns)

    def read_channel(self, lsn: int, idx: int) -> tuple[list[bytes], int]:
        return resolve_channel(self.read, lsn, idx)

    def refresh(self) -> None:
        if self.read_only:
            self._load()

    def roll(self) -> None:
        pass

    def remove_prefix(self, new_start_lsn: int) -> None:
        raise ConfigError(f"compact() is not supported on a live s3:// store yet ({self.url})")

    def size_bytes(self) -> int:
        return sum(len(f) + 4 for f in self._frames) + 32 * self._seq

    def verify(self, deep: bool = False) -> dict:
        return {"url": self.url, "frames": len(self._frames), "batches": self._seq,
                "writer_epoch": self._epoch or self._last_epoch, "damage": []}

    def close(self) -> None:
        if self._closed:
            return
        try:
            if not self.read_only and self._failed is None:
                self.flush()
                doc = {"format": "durkv-live", "version": 1, "epoch_no": self._epoch_no + 1,
                       "writer_epoch": self._epoch, "state": "closed", "owner": self._owner,
                       "created_at_ns": time.time_ns()}
                # taken: a newer writer took over meanwhile, and its epoch object stands
                self._put(_num_key(EPOCHS, self._epoch_no + 1, ".json"),
                          json.dumps(doc).encode(), {"durkv-epoch": str(self._epoch)})
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
