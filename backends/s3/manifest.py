"""Archive manifests and object keys (FORMAT.md section 10).

>>> segment_key(42)
'segments/00000000000000000042.seg'
>>> manifest_no_of("manifests/00000000000000000007.json")
7
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from durkv.errors import CorruptionError

__all__ = ["SegmentEntry", "Manifest", "segment_key", "manifest_key", "manifest_no_of",
           "SEGMENTS", "MANIFESTS", "FORMAT_NAME", "FORMAT_VERSION"]

SEGMENTS = "segments/"
MANIFESTS = "manifests/"
FORMAT_NAME = "durkv-archive"
FORMAT_VERSION = 1
_DIGITS = 20


def segment_key(segment_no: int) -> str:
    return f"{SEGMENTS}{segment_no:0{_DIGITS}d}.seg"


def manifest_key(manifest_no: int) -> str:
    return f"{MANIFESTS}{manifest_no:0{_DIGITS}d}.json"


def manifest_no_of(rel_key: str) -> int | None:
    """The number of a manifest key (relative to the prefix); None for a foreign key."""
    name = rel_key[len(MANIFESTS):] if rel_key.startswith(MANIFESTS) else ""
    stem = name[:-len(".json")] if name.endswith(".json") else ""
    return int(stem) if len(stem) == _DIGITS and stem.isdigit() else None


# a segment file's name, as the C log makes it (csrc/format.c): a restore writes the file
# under this name inside its temporary directory, never a path a manifest chose
_SEGMENT_FILE = re.compile(r"[0-9a-f]{16}\.seg")


def _typed(name: str, value: Any) -> Any:
    """A manifest's segment field, checked: an int field holds an int (not "0", which
    would compare and add as a string), a str field a str, ``file`` a segment's name."""
    want = str if name in ("key", "file", "encoding") else int
    if type(value) is not want:
        raise TypeError(f"segment field {name!r} is {type(value).__name__} {value!r:.40}, "
                        f"not {want.__name__}")
    if name == "file" and not _SEGMENT_FILE.fullmatch(value):
        raise ValueError(f"segment file {value!r:.60} is not a segment's name")
    return value


@dataclass(frozen=True)
class SegmentEntry:
    """One archived segment, as a manifest lists it."""

    segment_no: int
    key: str                # relative to the archive prefix
    file: str               # local file name
    base_lsn: int
    last_lsn: int
    start_lsn: int          # from the segment's header: the log's first live LSN then
    frames: int
    bytes: int
    crc32c: int             # of the segment file bytes
    encoding: str           # "identity" | "zstd"
    object_bytes: int
    object_crc32c: int      # of the object bytes (what S3's checksum covers)
    sealed_at_ns: int

    def same_content(self, other: SegmentEntry) -> bool:
        return (self.segment_no, self.base_lsn, self.bytes, self.crc32c) == (
            other.segment_no, other.base_lsn, other.bytes, other.crc32c)


@dataclass
class Manifest:
    manifest_no: int
    prev_manifest_no: int | None
    log_uuid: str
    start_lsn: int
    next_lsn: int
    created_at_ns: int
    segments: list[SegmentEntry] = field(default_factory=list)
    writer_epoch: int = 0

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {"format": FORMAT_NAME, "version": FORMAT_VERSION}
        doc.update(asdict(self))
        return json.dumps(doc, indent=1, sort_keys=False).encode("utf-8") + b"\n"

    @classmethod
    def from_json(cls, data: bytes, key: str) -> Manifest:
        """Decode a manifest object; CorruptionError naming ``key`` if it is not one."""
        try:
            doc = json.loads(data.decode("utf-8"))
            if doc.get("format") != FORMAT_NAME:
                raise ValueError(f"format is {doc.get('format')!r}, not {FORMAT_NAME!r}")
            if doc.get("version") != FORMAT_VERSION:
                raise ValueError(f"version {doc.get('version')!r} is not supported "
                                 f"(this durkv reads version {FORMAT_VERSION})")
            names = SegmentEntry.__dataclass_fields__
            segs = [SegmentEntry(**{k: _typed(k, s[k]) for k in names})
                    for s in doc["segments"]]
            m = cls(manifest_no=int(doc["manifest_no"]),
                    prev_manifest_no=doc["prev_manifest_no"], log_uuid=str(doc["log_uuid"]),
                    start_lsn=int(doc["start_lsn"]), next_lsn=int(doc["next_lsn"]),
                    created_at_ns=int(doc["created_at_ns"]), segments=segs,
                    writer_epoch=int(doc.get("writer_epoch", 0)))
            m.check(key)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError) as exc:
            raise CorruptionError(f"archive manifest {key} is unreadable: {exc}",
                                  segment=key, kind="bad_manifest") from exc
        return m

    def check(self, key: str) -> None:
        """Consecutive segment numbers, LSNs without gaps, start/next LSN consistent."""
        prev = None
        for s in self.segments:
            if s.last_lsn - s.base_lsn + 1 != s.frames or s.frames < 1:
                why = f"segment {s.segment_no} has frames {s.frames} for {s.base_lsn}..{s.last_lsn}"
            elif prev is not None and (s.segment_no != prev.segment_no + 1
                                       or s.base_lsn != prev.last_lsn + 1):
                why = (f"segment {s.segment_no} (lsn {s.base_lsn}) does not follow segment "
                       f"{prev.segment_no} (last lsn {prev.last_lsn})")
            else:
                prev = s
                continue
            raise CorruptionError(f"archive manifest {key} is inconsistent: {why}",
                                  segment=key, kind="bad_manifest")
        if self.segments and not (self.segments[0].base_lsn <= self.start_lsn
                                  and self.next_lsn == self.segments[-1].last_lsn + 1):
            raise CorruptionError(
                f"archive manifest {key} is inconsistent: start_lsn {self.start_lsn} / "
                f"next_lsn {self.next_lsn} do not match its segments", segment=key,
                kind="bad_manifest")
