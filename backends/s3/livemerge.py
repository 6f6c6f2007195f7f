"""Merging a live store's batches into segment objects, and compaction (FORMAT.md
section 11, "Merged segment objects and live manifests").

Every step is create-only except the deletes, which come last: segment objects (keyed
by their LSN range, so a re-run finds its own), then manifest ``n + 1``, then the
deletion of what it no longer needs. A kill -9 anywhere leaves manifest ``n`` or
``n + 1`` current, and each points only at objects that exist; the next merge (or the
next writer's) finishes the deletes.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable

from durkv.errors import ConfigError, CorruptionError, DurkvError, FencedError

from .client import NoSuchKeyError
from .livefmt import (
    FENCE_BYTES, LIVE_MANIFESTS, SEGS, WAL, LiveManifest, Piece, SegRef, batch_crc,
    encode_batch, num_key, num_of, seg_key,
)

__all__ = ["Merger"]


class Merger:
    """The writer's background merger (one per writer handle)."""

    def __init__(self, backend: Any) -> None:
        # backend: the live.S3Backend that owns this merger (live.py ranks above this
        # module, so the type is not imported here)
        self.b = backend
        self._lock = threading.Lock()       # one merge/compaction at a time
        self._wake = threading.Event()
        self._stopped = False
        self.merges = 0
        self.error: DurkvError | None = None
        # The handle's manifest is the newest as far as this writer knows (it wrote it):
        # the next publish PUTs n + 1 without listing; a 412 says otherwise.
        self._current = False
        self._swept = False                 # leftovers of earlier writers looked for
        self._batches: list[Piece] = []     # the batches the last _merged took
        self._thread: threading.Thread | None = None

    # -- the thread ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, daemon=True, name="durkv-s3-merger")
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=60)

    def run(self) -> None:
        while not self._stopped:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            b = self.b
            if self._stopped or not b.writing:
                return
            if b.merge_due():
                try:
                    self.merge()
                except FencedError as exc:
                    self.error = exc
                    return
                except DurkvError as exc:   # S3 trouble: the next wake tries again
                    self.error = exc

    # -- publishing a manifest ----------------------------------------------------------

    def publish(self, change: Callable[[LiveManifest], LiveManifest | None]
                ) -> tuple[LiveManifest, LiveManifest | None]:
        """Write manifest ``n + 1 = change(latest)`` create-only (re-read and retried when
        another handle wrote ``n + 1`` first). Returns (the manifest it replaced, the new
        one or None when ``change`` had nothing to do). FencedError when a newer writer
        epoch wrote the latest manifest: this writer was taken over."""
        b = self.b
        while True:
            cur = b.manifest if self._current else b.latest_manifest()
            if cur.writer_epoch > b.epoch:
                raise FencedError(f"store {b.url}: writer epoch {b.epoch} was fenced "
                                  f"(manifest {cur.manifest_no} is writer epoch "
                                  f"{cur.writer_epoch}'s)", url=b.url)
            b.adopt_manifest(cur)
            new = change(dataclasses.replace(cur, segments=list(cur.segments)))
            if new is None:
                return cur, None
            new.manifest_no, new.writer_epoch = cur.manifest_no + 1, b.epoch
            if b.put(num_key(LIVE_MANIFESTS, new.manifest_no, ".json"), new.to_json(),
                     {"durkv-epoch": str(b.epoch)}):
                b.adopt_manifest(new)
                self._current = True
                return cur, new
            self._current = False

    # -- merging ------------------------------------------------------------------------

    def merge(self, force: bool = False) -> bool:
        """Merge the durable batches into a segment object (with the small segments
        before it); True when a new manifest was written."""
        with self._lock:
            old, new = self.publish(lambda cur: self._merged(cur, force))
            if new is not None:
                self.merges += 1
                self._cleanup(old, new, self._batches)
            return new is not None

    def _merged(self, cur: LiveManifest, force: bool) -> LiveManifest | None:
        b = self.b
        seq, durable, batches = b.durable_batches(cur.next_batch)
        self._batches = batches
        if seq <= cur.next_batch or (not force and seq - cur.next_batch < b.merge_batches):
            return None
        segs = cur.segments
        sources: list[tuple[int, int, str, str]] = [
            (p.first_lsn, p.count, p.rel, p.tag) for p in batches]
        size = sum(p.size for p in batches)
        # Geometric sizes: take in the previous segment while it is small and at most
        # twice what is being merged, so the number of small segments stays logarithmic.
        while (sources and segs and segs[-1].bytes < b.segment_bytes
               and segs[-1].bytes <= 2 * size and segs[-1].bytes + size <= 2 * b.segment_bytes):
            s = segs.pop()
            sources.insert(0, (s.first_lsn, s.count, s.key, f"{s.crc32c:08x}"))
            size += s.bytes
        if sources:
            segs.append(self._write_segment(sources, cur.start_lsn))
        return LiveManifest(start_lsn=cur.start_lsn, next_batch=seq, next_lsn=durable,
                            segments=segs)

    def _write_segment(self, sources: list[tuple[int, int, str, str]], start: int) -> SegRef:
        """PUT one segment object holding the frames of ``sources`` from ``start`` on."""
        b = self.b
        frames: list[bytes] = []
        first = max(sources[0][0], start)
        for lsn, count, rel, tag in sources:
            got = b.piece_frames(Piece(lsn, count, rel, tag))
            frames.extend(got[max(0, start - lsn):])
        body = encode_batch(0, first, frames)
        rel = seg_key(first, first + len(frames))
        # the CRC the body ends with (FORMAT.md 11): the CRC of the whole body, which ends
        # with its own CRC, is the same constant for every object, and the cache took it
        # for a tag: a prefix reused by a new store read the old one's cached frames
        crc = batch_crc(body)
        if not b.put(rel, body, {"durkv-epoch": str(b.epoch), "durkv-crc32c": str(crc)}):
            # the same range always gives the same bytes: a re-run finds its own object
            # (one a version before 8201b7d wrote carries that constant: its bytes decide)
            theirs = b.head(rel).get("Metadata", {}).get("durkv-crc32c")
            if theirs != str(crc) and b.get(rel) != body:
                raise CorruptionError(f"live segment {b.loc.key(rel)} exists with other "
                                      f"content (crc {theirs}, expected {crc})",
                                      segment=b.loc.key(rel), kind="checksum_mismatch")
        tag = f"{crc:08x}"
        b.cache.store(rel, tag, body)
        b.cache.remember(rel, frames)
        return SegRef(rel, first, len(frames), len(body), crc)

    # -- compaction ---------------------------------------------------------------------

    def compact(self, new_start: int) -> None:
        with self._lock:
            old, new = self.publish(lambda cur: self._merged(cur, force=True))
            if new is not None:
                self._cleanup(old, new, self._batches)
            old, new = self.publish(lambda cur: self._cut(cur, new_start))
            if new is not None:
                self._cleanup(old, new, [])

    def _cut(self, cur: LiveManifest, new_start: int) -> LiveManifest | None:
        if new_start <= cur.start_lsn:
            return None
        if new_start > cur.next_lsn:
            raise ConfigError(f"cannot compact {self.b.url} to lsn {new_start}: the merged "
                              f"log ends at {cur.next_lsn}")
        segs = []
        for s in cur.segments:
            if s.end_lsn <= new_start:
                continue
            if s.first_lsn < new_start:
                s = self._write_segment([(s.first_lsn, s.count, s.key, f"{s.crc32c:08x}")],
                                        new_start)
            segs.append(s)
        return LiveManifest(start_lsn=new_start, next_batch=cur.next_batch,
                            next_lsn=cur.next_lsn, segments=segs)

    # -- deleting what the current manifest no longer needs ------------------------------

    def _leftovers(self, new: LiveManifest) -> list[tuple[str, str]]:
        """What earlier writers left for deletion (a merge killed before its manifest or
        its deletes): listed once per writer handle, the later merges know what they
        replace."""
        b = self.b
        found: list[tuple[str, str]] = []
        for rel, e in b.loc.list_objects(WAL):
            n = num_of(WAL, rel, ".batch")
            if n is not None and n >= new.next_batch:
                break
            if n is not None and e["Size"] != FENCE_BYTES:
                found.append((rel, (e.get("ETag") or "").strip('"')))
        keep = {s.key for s in new.segments}
        found += [(rel, "") for rel in b.loc.list_keys(SEGS) if rel not in keep]
        found += [(rel, "") for rel in b.loc.list_keys(LIVE_MANIFESTS)
                  if (num_of(LIVE_MANIFESTS, rel, ".json") or 0) < new.manifest_no - 1]
        return found

    def _cleanup(self, old: LiveManifest, new: LiveManifest, merged: list[Piece]) -> None:
        """Delete merged batches (never a fence), segments ``new`` does not list (also
        those a merge killed before its manifest left) and manifests below ``n - 1``.

        Listed first, deleted after checking that no batch sits at this writer's next
        number: a writer that took over fences that number before it reads the manifests,
        so it builds on ``new`` and never on anything listed here (FORMAT.md section 11).
        """
        b = self.b
        keep = {s.key for s in new.segments}
        doomed = [(s.key, f"{s.crc32c:08x}") for s in old.segments if s.key not in keep]
        doomed += [(p.rel, p.tag) for p in merged]
        if new.manifest_no >= 2:
            doomed.append((num_key(LIVE_MANIFESTS, new.manifest_no - 2, ".json"), ""))
        if not self._swept:
            doomed += self._leftovers(new)
        if not doomed:
            return
        with b.batches_paused() as seq:     # no batch PUT of ours while it is checked
            try:
                b.head(num_key(WAL, seq, ".batch"))
                fenced = True
            except NoSuchKeyError:
                fenced = False
        if fenced:
            raise FencedError(f"store {b.url}: writer epoch {b.epoch} was fenced (batch {seq} "
                              "exists); its merger stops", url=b.url)
        b.delete(sorted({rel for rel, _ in doomed}))
        self._swept = True
        for rel, tag in doomed:
            if tag:
                b.cache.drop(rel, tag)
