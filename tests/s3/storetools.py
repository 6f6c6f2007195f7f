"""Stores with many small sealed segments, for the archive tests."""

from __future__ import annotations

import os
from pathlib import Path

import durkv
from durkv.log import SegmentLog


def put(store, i: int, thread: str = "t") -> None:
    store.put(thread, "", f"{i:06d}", checkpoint={"i": i}, metadata={"step": i},
              values={"msgs": [f"message {j} " * 8 for j in range(i % 7 + 1)], "n": i},
              versions={"msgs": i, "n": i})


def make_store(path: Path, commits: int, *, start: int = 0, segment_bytes: int = 1200,
               seal: bool = True) -> str:
    """A local store with ``commits`` checkpoints in many small segments, closed; every
    commit sealed when ``seal`` (an index snapshot at close goes to a new active one)."""
    with durkv.open(str(path), segment_bytes=segment_bytes, index_every=0,
                    durability="exit") as store:
        for i in range(start, start + commits):
            put(store, i)
    if seal:
        with SegmentLog.open(str(path)) as log:
            log.seal()
    return str(path)


def segment_files(path: str | Path) -> dict[str, bytes]:
    return {n: Path(path, n).read_bytes() for n in sorted(os.listdir(path)) if n.endswith(".seg")}


def sealed_files(path: str | Path) -> dict[str, bytes]:
    """The sealed segments: every segment file but the newest (the active one)."""
    files = segment_files(path)
    return dict(list(files.items())[:-1])


def keys(s3, bucket: str) -> list[str]:
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        out += [o["Key"] for o in page.get("Contents", ())]
    return out
