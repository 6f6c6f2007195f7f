"""A live store on S3: ``durkv.open("s3://bucket/prefix")`` (FORMAT.md section 11).

One writer at a time, fenced by epochs: opening for writing wins a create-only
epoch object and writes a fence batch, so a previous writer that is still running
(a zombie) fails its next PUT with ``FencedError``. Each flush is one create-only
batch object; concurrent ``sync`` committers share one PUT (group commit). Frames are
read through a local cache directory (livecache.py: memory stays bounded); the writer
merges sealed batches into segment objects in the background (livemerge.py), so the
object count stays bounded, and ``compact()`` drops whole segment objects.
"""

from __future__ import annotations

import atexit
import bisect
import json
import os
import socket
import sys
import threading
import time
import uuid
import weakref
from contextlib import contextmanager
from email.utils import parsedate_to_datetime
from typing import Any, Iterator
from urllib.parse import parse_qs

from durkv.backends.base import ReadsByPayload, VerifyReport
from durkv.errors import (
    ConfigError, CorruptionError, DurkvError, FencedError, NotFoundError, ReadOnlyError,
    StoreClosedError, StoreLockedError,
)
from durkv.log import crc32c

from .client import KeyExistsError, NoSuchKeyError, S3Location, crc32c_b64, translate
from .livecache import LiveCache, default_cache_dir
from .livefmt import (
    EPOCHS, FENCE_BYTES, LEASES, LIVE_MANIFESTS, WAL, LiveManifest, Piece, decode_batch,
    encode_batch, newest_numbered, num_key, num_of,
)
from .livemerge import Merger
from .manifest import MANIFESTS as ARCHIVE_MANIFESTS

__all__ = ["S3Backend", "encode_batch", "decode_batch"]

_GATHER = 0.002     # seconds a group-commit leader waits for the committers it expects
# the last two: decision objects (decisions.py, FORMAT.md section 13)
_OPTIONS = ("takeover", "endpoint_url", "region", "cache_dir", "merge_batches", "lease_ms",
            "decision_poll_ms", "decision_wait_ms")


class _Moved(Exception):
    """A batch vanished or a gap appeared while loading: a merge moved batches into a
    segment meanwhile; re-read the manifest."""


def _etag(value: str | None) -> str:
    return (value or "").strip('"') or "none"


class S3Backend(ReadsByPayload):
    """The Backend protocol (backends/base.py) over create-only S3 objects."""

    def __init__(self, url: str, *, durability: str = "sync", read_only: bool = False,
                 flush_interval_ms: int = 10, takeover: bool = False,
                 segment_bytes: int | None = None, cache_dir: str | None = None,
                 merge_batches: int | None = None, lease_ms: int | None = None,
                 memory_bytes: int = 64 << 20, client: Any = None, **_options: Any) -> None:
        query = {k: v[0] for k, v in parse_qs(url.partition("?")[2]).items()}
        unknown = set(query) - set(_OPTIONS)
        if unknown:
            raise ConfigError(f"unknown option(s) {', '.join(sorted(unknown))} in {url!r}; "
                              "known: " + ", ".join(f"{o}=..." for o in _OPTIONS))
        self.loc = S3Location.parse(url, endpoint_url=query.get("endpoint_url"),
                                    region=query.get("region"), client=client)
        self.url = url.partition("?")[0]
        self.read_only = read_only
        self.durability = durability
        self._interval = flush_interval_ms / 1000.0
        self.merge_batches = _int_option("merge_batches", merge_batches,
                                         query.get("merge_batches"), 32)
        self.segment_bytes = segment_bytes or (8 << 20)
        self.lease_ms = _int_option("lease_ms", lease_ms, query.get("lease_ms"), 0)
        self.cache = LiveCache(cache_dir or query.get("cache_dir") or default_cache_dir(
            self.loc.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL"), self.loc.bucket, self.loc.prefix),
            budget=memory_bytes)
        self._pieces: list[Piece] = []    # durable frames, by first_lsn (segments, batches)
        self._starts: list[int] = []
        self._pending: list[bytes] = []   # frames [durable, next_lsn): not in S3 yet
        self._durable = 0                 # frames below this LSN are in S3
        self._seq = 0                     # number of the next batch to read or write
        self._last_epoch = 0
        self._fences: set[int] = set()    # batch numbers holding a fence (never deleted)
        self.manifest = LiveManifest()
        self._cond = threading.Condition(threading.Lock())
        self._flushing = False
        self._paused = False              # the merger is checking the next batch number
        self._gathering = False
        self._last_group = 1              # frames the last PUT carried (group commit)
        self._failed: DurkvError | None = None
        self._closed = False
        self.puts = 0                     # batch PUTs made (group commit is measured by it)
        self._epoch = 0
        self._epoch_no = -1
        self._owner = ""
        self._load()
        if read_only and self._seq == 0 and self.manifest.manifest_no < 0 and not any(
                True for _ in self.loc.list_keys(EPOCHS)):
            raise NotFoundError(self._no_store(), url=self.url)
        self.merger: Merger | None = None
        if not read_only:
            self._acquire(takeover=bool(takeover) or
                          query.get("takeover", "0") in ("1", "true", "yes"))
            self.merger = Merger(self)
            self.merger.start()
            if durability == "async":
                self._start(self._flush_loop, "durkv-s3-flusher")
            if self.lease_ms:
                self._start(self._lease_loop, "durkv-s3-lease")
            self._pid = os.getpid()
            _open_writers.add(self)

    def _no_store(self) -> str:
        """Why a reader finds no live store here: an archive's prefix (``durkv archive``
        wrote manifests/) is told apart from an empty one, with the way to read it."""
        if any(True for _ in self.loc.list_keys(ARCHIVE_MANIFESTS, page_size=1)):
            return (f"{self.url} holds a durkv archive, not a live store: restore it into a "
                    f"local directory (durkv restore {self.url} ./DIR) and use ./DIR")
        return f"no durkv store at {self.url}; open it for writing first"

    def _start(self, target: Any, name: str) -> None:
        threading.Thread(target=target, daemon=True, name=name).start()

    # -- objects ------------------------------------------------------------------------

    def get(self, rel: str) -> bytes:
        key = self.loc.key(rel)
        with translate(self.loc, "get " + key):
            return self.loc.s3().get_object(Bucket=self.loc.bucket, Key=key)["Body"].read()

    def put(self, rel: str, body: bytes, meta: dict[str, str]) -> str | None:
        """Create-only PUT; the new object's ETag, or None if the key holds someone
        else's object (put-id check: our own PUT whose response was lost and that
        botocore retried counts as ours)."""
        key = self.loc.key(rel)
        put_id = uuid.uuid4().hex
        try:
            with translate(self.loc, "put " + key):
                resp = self.loc.s3().put_object(
                    Bucket=self.loc.bucket, Key=key, Body=body, IfNoneMatch="*",
                    ChecksumAlgorithm="CRC32C", ChecksumCRC32C=crc32c_b64(crc32c(body)),
                    Metadata={**meta, "durkv-put-id": put_id})
        except KeyExistsError:
            head = self.head(rel)
            if head.get("Metadata", {}).get("durkv-put-id") != put_id:
                return None
            resp = head
        return _etag(resp.get("ETag"))

    def head(self, rel: str) -> dict:
        key = self.loc.key(rel)
        with translate(self.loc, "head " + key):
            return self.loc.s3().head_object(Bucket=self.loc.bucket, Key=key)

    def delete(self, rels: list[str]) -> None:
        """Delete objects (a missing one is no error: a re-run deletes again)."""
        self.loc.delete_keys(rels)

    def _get_json(self, rel: str) -> dict:
        body = self.get(rel)
        try:
            return json.loads(body)
        except ValueError as exc:
            key = self.loc.key(rel)
            raise CorruptionError(f"live object {key} is not JSON", segment=key,
                                  kind="bad_manifest") from exc

    # -- epochs, fencing and the lease --------------------------------------------------

    def _latest_epoch(self) -> tuple[dict, dict] | None:
        best = newest_numbered(self.loc, EPOCHS, ".json")
        if not best:
            return None
        doc = self._get_json(best[0])
        # what the open reads of it, checked: a damaged epoch object is refused, never
        # taken for "no writer yet" (an open would then fence at a lower epoch)
        if (type(doc) is not dict or type(doc.get("epoch_no")) is not int
                or type(doc.get("writer_epoch")) is not int
                or doc.get("state") not in ("open", "closed")
                or best[0] != num_key(EPOCHS, doc["epoch_no"], ".json")):
            key = self.loc.key(best[0])
            raise CorruptionError(f"live object {key} is not a writer epoch record "
                                  f"({str(doc)[:80]}); nothing was changed", segment=key,
                                  kind="bad_manifest")
        return doc, best[1]

    def _lease_expired(self, doc: dict, entry: dict) -> bool:
        """The holder's lease ran out, by the S3 server's clock alone."""
        lease = int(doc.get("lease_ms") or 0)
        if not lease:
            return False
        newest, date = entry["LastModified"], entry.get("_date")
        prefix = num_key(LEASES, int(doc.get("writer_epoch", 0)), "-")
        for _, e in self.loc.list_objects(prefix):
            newest, date = max(newest, e["LastModified"]), e.get("_date") or date
        if not date:
            return False
        age_ms = (parsedate_to_datetime(date) - newest).total_seconds() * 1000
        return age_ms > lease + 1000        # LastModified has 1 s resolution

    def _acquire(self, takeover: bool) -> None:
        found = self._latest_epoch()
        latest = found[0] if found else None
        if latest and latest.get("state") == "open" and not takeover:
            if not self._lease_expired(latest, found[1]):
                raise StoreLockedError(
                    f"store {self.url} is held by {latest.get('owner')} (writer epoch "
                    f"{latest.get('writer_epoch')}); close it there, or if that writer is dead "
                    "open it with takeover=True", url=self.url, owner=latest.get("owner"))
        n = latest["epoch_no"] + 1 if latest else 0
        epoch = (latest["writer_epoch"] if latest else 0) + 1
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        doc = {"format": "durkv-live", "version": 1, "epoch_no": n, "writer_epoch": epoch,
               "state": "open", "owner": owner, "created_at_ns": time.time_ns()}
        if self.lease_ms:
            doc["lease_ms"] = self.lease_ms
        if not self.put(num_key(EPOCHS, n, ".json"), json.dumps(doc).encode(),
                        {"durkv-epoch": str(epoch)}):
            winner = self._get_json(num_key(EPOCHS, n, ".json"))
            raise StoreLockedError(
                f"store {self.url} was just opened by {winner.get('owner')} (writer epoch "
                f"{winner.get('writer_epoch')}); this open lost the race", url=self.url,
                owner=winner.get("owner"))
        self._epoch, self._epoch_no, self._owner = epoch, n, owner
        self._lease_no = 0
        # Fence: a batch with no frames at the next number. A previous writer still
        # running finds the number taken on its next PUT and stops (FencedError).
        while True:
            self._load()
            if self.put(num_key(WAL, self._seq, ".batch"), encode_batch(epoch, self._durable, []),
                        {"durkv-epoch": str(epoch)}):
                self._fences.add(self._seq)
                self._seq += 1
                self._last_epoch = epoch
                break
        # A manifest of this epoch: from now on a fenced writer's merger gets 412 and
        # stops (it never writes over a higher epoch), FORMAT.md section 11.
        assert self.merger is None
        Merger(self).publish(lambda m: m)
        if n >= 2:      # older epoch objects say nothing the current ones do not
            self.delete([num_key(EPOCHS, k, ".json") for k in range(max(0, n - 8), n - 1)])

    def _lease_loop(self) -> None:
        every = self.lease_ms / 3000.0
        while not self._closed and self._failed is None:
            rel = num_key(LEASES, self._epoch, f"-{self._lease_no:020d}.json")
            try:
                self.put(rel, b"{}", {"durkv-epoch": str(self._epoch)})
                if self._lease_no:
                    self.delete([num_key(LEASES, self._epoch,
                                         f"-{self._lease_no - 1:020d}.json")])
            except DurkvError:
                pass        # a missed renewal only lets a takeover come sooner
            self._lease_no += 1
            with self._cond:
                self._cond.wait_for(lambda: self._closed, timeout=every)

    # -- reading the log ----------------------------------------------------------------

    def _load(self) -> None:
        """Adopt the current manifest, then apply the batches written after it."""
        for _ in range(8):
            try:
                self.adopt_manifest()
                self._load_batches()
                return
            except _Moved:
                continue
        raise CorruptionError(f"live store {self.url}: batches keep vanishing while read "
                              "(a merge moved them, and no manifest lists them)",
                              segment=self.loc.key(WAL), kind="missing_segment")

    def latest_manifest(self) -> LiveManifest:
        for _ in range(8):
            best = newest_numbered(self.loc, LIVE_MANIFESTS, ".json")
            if best is None:
                return LiveManifest()
            try:
                return LiveManifest.from_json(self.get(best[0]), self.loc.key(best[0]))
            except NoSuchKeyError:
                continue        # pruned right after a newer one was written: list again
        raise CorruptionError(f"live store {self.url}: its newest manifest keeps vanishing "
                              "while read", segment=self.loc.key(LIVE_MANIFESTS),
                              kind="missing_segment")

    def adopt_manifest(self, m: LiveManifest | None = None) -> None:
        """Make ``m`` (default: the newest in S3) this handle's manifest if it is newer:
        its segments replace the batches it merged (the merger calls this after it
        publishes one)."""
        m = m if m is not None else self.latest_manifest()
        with self._cond:
            if m.manifest_no <= self.manifest.manifest_no:
                return
            if self._durable < m.next_lsn and self._seq > m.next_batch:
                raise CorruptionError(f"live store {self.url}: manifest {m.manifest_no} ends at "
                                      f"lsn {m.next_lsn} batch {m.next_batch}, past what the "
                                      "batches hold", segment=self.url, kind="bad_manifest")
            old = self._pieces
            segs = [Piece(s.first_lsn, s.count, s.key, f"{s.crc32c:08x}", size=s.bytes)
                    for s in m.segments]
            batches = [p for p in old if p.batch_no >= m.next_batch]
            self._set_pieces(segs + batches)
            if self._seq < m.next_batch:
                self._seq = m.next_batch
                self._durable = m.next_lsn
            self.manifest = m
        keep = {p.rel for p in self._pieces}
        for p in old:
            if p.rel not in keep:
                self.cache.drop(p.rel, p.tag)

    def _set_pieces(self, pieces: list[Piece]) -> None:
        self._pieces = pieces
        self._starts = [p.first_lsn for p in pieces]

    def _load_batches(self) -> None:
        after = num_key(WAL, self._seq - 1, ".batch") if self._seq else None
        for rel, entry in self.loc.list_objects(WAL, start_after=after):
            n = num_of(WAL, rel, ".batch")
            if n is None:
                continue
            if n < self._seq:
                continue
            if n > self._seq:
                if self.latest_manifest().manifest_no > self.manifest.manifest_no:
                    raise _Moved()
                raise CorruptionError(f"live store {self.url}: batch {self._seq} is missing "
                                      f"(next is {rel})", segment=self.loc.key(rel),
                                      kind="missing_segment")
            tag = _etag(entry.get("ETag"))
            try:
                data = self.get(rel)
            except NoSuchKeyError:
                raise _Moved() from None
            epoch, first, frames = decode_batch(data, self.loc.key(rel))
            if first != self._durable or epoch < self._last_epoch:
                raise CorruptionError(f"live batch {self.loc.key(rel)}: lsn {first} epoch "
                                      f"{epoch} does not follow lsn {self._durable} epoch "
                                      f"{self._last_epoch}", segment=self.loc.key(rel),
                                      kind="lsn_gap")
            if frames:
                self.cache.store(rel, tag, data)
            self._add_batch(n, rel, tag, epoch, first, frames, len(data))

    def _add_batch(self, n: int, rel: str, tag: str, epoch: int, first: int,
                   frames: list[bytes], size: int) -> None:
        with self._cond:
            if size == FENCE_BYTES:
                self._fences.add(n)
            if frames:
                piece = Piece(first, len(frames), rel, tag, n, size, epoch)
                self._pieces.append(piece)
                self._starts.append(first)
                self.cache.remember(rel, frames)
            self._seq = n + 1
            self._durable = first + len(frames)
            self._last_epoch = epoch

    def _piece_at(self, lsn: int) -> Piece | None:
        with self._cond:
            i = bisect.bisect_right(self._starts, lsn) - 1
            if i < 0:
                return None
            p = self._pieces[i]
            return p if lsn < p.first_lsn + p.count else None

    def piece_frames(self, p: Piece) -> list[bytes]:
        """The frames of one object, through the cache; a segment whose object a newer
        manifest replaced is found again after re-reading the manifest."""
        frames = self.cache.frames(p.rel, p.tag, lambda: self.get(p.rel))
        if len(frames) != p.count:
            raise CorruptionError(f"live object {self.loc.key(p.rel)} holds {len(frames)} "
                                  f"frames, its manifest says {p.count}",
                                  segment=self.loc.key(p.rel), kind="bad_manifest")
        return frames

    # -- writing ------------------------------------------------------------------------

    def _check_write(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"{self.url} is open read-only; reopen without read_only=True")
        if self._closed:
            raise StoreClosedError(f"{self.url} is closed; open it again")
        if self._failed is not None:
            raise self._failed

    def append(self, payload: bytes, durability: str | None = None) -> int:
        with self._cond:
            self._check_write()
            self._pending.append(bytes(payload))
            lsn = self._durable + len(self._pending) - 1
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
                if self._flushing or self._paused:
                    self._cond.wait()
                    continue
                self._flushing = True
                if len(self._pending) < self._last_group:
                    # The committers the last PUT served are appending again: give them
                    # a moment (at most _GATHER) to join this PUT instead of the next.
                    self._gathering = True
                    self._cond.wait_for(lambda: len(self._pending) >= self._last_group,
                                        timeout=_GATHER)
                    self._gathering = False
                start, frames, seq = self._durable, self._pending[:], self._seq
                self._cond.release()
                err: DurkvError | None = None
                rel = num_key(WAL, seq, ".batch")
                try:
                    body = encode_batch(self._epoch, start, frames)
                    tag = self.put(rel, body, {"durkv-epoch": str(self._epoch)})
                    if tag is None:
                        err = FencedError(
                            f"store {self.url}: writer epoch {self._epoch} was fenced (batch "
                            f"{seq} exists: another writer took the store over); this handle "
                            "stops, nothing after its last acknowledged commit was written",
                            url=self.url)
                    else:
                        self.cache.store(rel, tag, body)
                except DurkvError as exc:
                    err = exc
                except OSError as exc:      # the cache disk: the PUT itself is done
                    err = DurkvError(f"{self.url}: cannot write the local cache "
                                     f"{self.cache.root}: {exc}")
                finally:
                    self._cond.acquire()
                    self._flushing = False
                    self.puts += 1
                if err is None:
                    self._add_batch_locked(seq, rel, tag, start, frames, len(body))
                    del self._pending[:len(frames)]
                    self._last_group = len(frames)
                else:
                    self._failed = err      # fail closed: a PUT that may or may not be there
                self._cond.notify_all()
        if self.merger is not None and self.merge_due():
            self.merger.wake()

    # -- what the merger (livemerge.Merger) needs of its writer --------------------------

    @property
    def epoch(self) -> int:
        """This writer's epoch: what its objects are tagged with and fenced by."""
        return self._epoch

    @property
    def writing(self) -> bool:
        """Open and not failed: the merger stops when this turns False."""
        return self._failed is None and not self._closed

    def merge_due(self) -> bool:
        """``merge_batches`` batches or more are durable and not merged yet."""
        return self._seq - self.manifest.next_batch >= self.merge_batches

    def durable_batches(self, since: int) -> tuple[int, int, list[Piece]]:
        """(the next batch number, the first LSN not durable, the batch pieces numbered
        from ``since``), read together."""
        with self._cond:
            return (self._seq, self._durable,
                    [p for p in self._pieces if since <= p.batch_no < self._seq])

    @contextmanager
    def batches_paused(self) -> Iterator[int]:
        """No batch PUT of this handle while inside: waits for one in flight, then yields
        the number the next batch will have (the merger checks that no other writer has
        fenced it before it deletes)."""
        with self._cond:
            self._paused = True
            while self._flushing:
                self._cond.wait()
            seq = self._seq
        try:
            yield seq
        finally:
            with self._cond:
                self._paused = False
                self._cond.notify_all()

    def _add_batch_locked(self, n: int, rel: str, tag: str, first: int, frames: list[bytes],
                          size: int) -> None:
        piece = Piece(first, len(frames), rel, tag, n, size, self._epoch)
        self._pieces.append(piece)
        self._starts.append(first)
        self.cache.remember(rel, frames)
        self._seq = n + 1
        self._durable = first + len(frames)

    def _flush_loop(self) -> None:
        while True:
            time.sleep(self._interval)
            with self._cond:
                if self._closed or self._failed is not None:
                    return
                target = self._durable + len(self._pending)
            if target > self._durable:
                try:
                    self._flush_to(target)
                except DurkvError:
                    return          # recorded in _failed; the next append raises it

    def flush(self) -> None:
        if not self.read_only:
            with self._cond:
                self._check_write()
                target = self._durable + len(self._pending)
            self._flush_to(target)

    def wait_durable(self, lsn: int) -> None:
        if not self.read_only:
            self._flush_to(lsn + 1)

    def wait_written(self, lsn: int) -> None:
        """An ``async`` append here returns once queued (the flusher PUTs it within its
        interval): nothing more to wait for."""

    # -- the rest of the protocol -------------------------------------------------------

    def failure(self) -> DurkvError | None:
        """The error this writer failed closed with (a fence, a failed PUT), or None: the
        store raises it from every call, as a local log raises LogFailedError."""
        return self._failed

    @property
    def next_lsn(self) -> int:
        return self._durable + len(self._pending)

    @property
    def start_lsn(self) -> int:
        return self.manifest.start_lsn

    def read(self, lsn: int) -> bytes:
        for attempt in range(3):
            with self._cond:
                if self._failed is not None:    # fail closed (GUARANTEES 7): its pending
                    raise self._failed          # frames may never be in S3
                if lsn >= self._durable:
                    i = lsn - self._durable
                    if 0 <= i < len(self._pending):
                        return self._pending[i]
                    raise NotFoundError(f"{self.url}: no frame at LSN {lsn}", lsn=lsn)
                if lsn < self.manifest.start_lsn:
                    raise NotFoundError(f"{self.url}: LSN {lsn} was compacted away "
                                        f"(start_lsn {self.manifest.start_lsn})", lsn=lsn)
            p = self._piece_at(lsn)
            if p is None:
                raise NotFoundError(f"{self.url}: no frame at LSN {lsn}", lsn=lsn)
            try:
                return self.piece_frames(p)[lsn - p.first_lsn]
            except NoSuchKeyError:
                if attempt == 2:
                    raise
                # a merge or a compaction replaced the object: re-read the manifest (a
                # writer knows its own batches; only a reader looks for new ones)
                if self.read_only:
                    self._load()
                else:
                    self.adopt_manifest()
        raise AssertionError("unreachable")

    def scan(self, from_lsn: int = 0) -> Iterator[tuple[int, bytes]]:
        lsn = max(from_lsn, self.start_lsn)
        while lsn < self.next_lsn:
            yield lsn, self.read(lsn)
            lsn += 1

    def refresh(self) -> None:
        if self.read_only:
            self._load()

    def roll(self) -> None:
        pass        # compaction rewrites the segment it cuts (remove_prefix)

    def remove_prefix(self, new_start_lsn: int) -> None:
        """compact(): merge everything, then a manifest with ``start_lsn = new_start_lsn``
        (FORMAT.md section 11); the dropped objects are deleted once it is current."""
        if self.read_only or self.merger is None:
            raise ReadOnlyError(f"{self.url} is open read-only; compaction needs the writer")
        self.flush()
        self.merger.compact(new_start_lsn)

    def object_count(self) -> int:
        return sum(1 for _ in self.loc.list_keys("live/"))

    def size_bytes(self) -> int:
        with self._cond:
            return sum(p.size for p in self._pieces)

    def verify(self, deep: bool = False) -> VerifyReport:
        damage = []
        if deep:
            for p in list(self._pieces):
                try:
                    self.piece_frames(p)
                except DurkvError as exc:
                    damage.append(str(exc))
        return VerifyReport(url=self.url, ok=not damage, frames=self.next_lsn - self.start_lsn,
                            start_lsn=self.start_lsn, next_lsn=self.next_lsn,
                            damage=tuple(damage),
                            details={"objects": len(self._pieces), "batches": self._seq,
                                     "writer_epoch": self._epoch or self._last_epoch})

    def close(self) -> None:
        if self._closed:
            return
        try:
            if not self.read_only and self._failed is None:
                self.flush()
                if self.merger is not None:
                    self.merger.stop()
                doc = {"format": "durkv-live", "version": 1, "epoch_no": self._epoch_no + 1,
                       "writer_epoch": self._epoch, "state": "closed", "owner": self._owner,
                       "created_at_ns": time.time_ns()}
                # taken: a newer writer took over meanwhile, and its epoch object stands
                self.put(num_key(EPOCHS, self._epoch_no + 1, ".json"),
                         json.dumps(doc).encode(), {"durkv-epoch": str(self._epoch)})
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            if self.merger is not None:
                self.merger.stop()


_open_writers: weakref.WeakSet[S3Backend] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """The `exit` (and `async`) policy's promise on s3://, as kernel/log.py's for a local
    log: a clean interpreter exit PUTs what is pending and closes every writer (its epoch
    record says closed, so the next open needs no takeover). Not in a forked child: the
    handles are its parent's. A PUT that fails here is said on stderr."""
    for b in list(_open_writers):
        if b._pid != os.getpid() or b._closed:
            continue
        pending = len(b._pending)
        try:
            b.close()
        except DurkvError as e:
            try:
                sys.stderr.write(f"durkv: {pending} commit(s) to {b.url} not made durable at "
                                 f"exit: {' '.join(e.message.split())}\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass    # stderr is gone: nothing else can be done at exit


def _int_option(name: str, given: int | None, text: str | None, default: int) -> int:
    value: Any = given if given is not None else text
    if value is None:
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = -1
    if n < 0 or isinstance(value, bool):
        raise ConfigError(f"{name} must be an int >= 0, got {value!r}")
    return n
