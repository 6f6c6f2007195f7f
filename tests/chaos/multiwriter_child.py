"""A writer among several on one store, for tests/chaos/test_kill_multiwriter.py.

``main([path, name])`` (a fork-server child, the victim): opens the store, prints GO,
then commits to run ``name`` until killed -- journal records under ``sync`` and, every
third commit, a checkpoint of thread ``name`` -- printing ``A <i>`` after commit ``i``
returned. Run as a script with a third argument (a survivor): the same loop, with each
acknowledgement and its latency appended to that file instead.
"""

from __future__ import annotations

import os
import sys
import time

import durkv


def _commit(s, name: str, i: int) -> None:
    if i % 3 == 2:
        s.put(name, "", f"{i:08d}", checkpoint={"i": i}, metadata={}, values={"v": i},
              versions={"v": i + 1})
    else:
        s.append_journal(name, {"i": i}, durable=True)


def main(argv: list[str]) -> None:
    path, name = argv[0], argv[1]
    s = durkv.open(path, segment_bytes=32768)
    os.write(1, b"GO\n")
    i = 0
    while True:
        _commit(s, name, i)
        os.write(1, f"A {name} {i}\n".encode())
        i += 1


def survive(path: str, name: str, acks: str) -> None:
    s = durkv.open(path, segment_bytes=32768)
    fd = os.open(acks, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    i = 0
    while True:
        t0 = time.monotonic()
        _commit(s, name, i)
        os.write(fd, f"{i} {time.monotonic() - t0:.4f}\n".encode())
        i += 1


if __name__ == "__main__":
    survive(*sys.argv[1:4])
