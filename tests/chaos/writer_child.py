"""Child process for the kill -9 tests: append numbered payloads until killed.

    python writer_child.py DIR POLICY RUN [--segment-bytes N] [--flush-every M]
                           [--threads T] [--max-size S] [--compact-every K]

Opens the log (tolerate_tail), prints ``READY <next_lsn>``, then appends forever.
After each append returns it prints ``<lsn> <digest>`` (blake2b-64 of the payload)
and flushes stdout, so every printed line is an acknowledged append. In ``exit``
mode it calls ``flush()`` every M appends and prints ``FLUSHED <lsn>`` after
it returns (every frame up to and including lsn is then durable).

Payloads embed RUN and a counter, so a frame from an earlier child can never
match a later child's digest by accident.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import threading

from durkv.log import SegmentLog


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("policy", choices=["sync", "async", "exit"])
    ap.add_argument("run", type=int)
    ap.add_argument("--segment-bytes", type=int, default=16 << 10)
    ap.add_argument("--flush-every", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-size", type=int, default=700)
    ap.add_argument("--compact-every", type=int, default=0,
                    help="every N appends: seal(new_start_lsn=lsn-20), a prefix removal")
    a = ap.parse_args(argv)

    log = SegmentLog.open(a.dir, durability=a.policy, segment_bytes=a.segment_bytes,
                          recovery="tolerate_tail", flush_interval_ms=5)
    out = sys.stdout
    lock = threading.Lock()

    def emit(line: str) -> None:
        with lock:
            out.write(line + "\n")
            out.flush()

    emit(f"READY {log.next_lsn}")

    def writer(t: int) -> None:
        rnd = random.Random(a.run * 1000 + t)
        i = 0
        while True:
            size = rnd.randint(0, a.max_size)
            head = f"run{a.run}:t{t}:{i}:".encode()
            body = head + os.urandom(max(0, size - len(head)))
            lsn = log.append(body)
            emit(f"{lsn} {hashlib.blake2b(body, digest_size=8).hexdigest()}")
            i += 1
            if a.policy == "exit" and i % a.flush_every == 0:
                log.flush()
                emit(f"FLUSHED {lsn}")
            if a.compact_every and i % a.compact_every == 0:
                start = max(log.start_lsn, lsn - 20)
                log.seal(new_start_lsn=start)
                emit(f"COMPACTED {start}")

    ths = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(a.threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()


if __name__ == "__main__":
    main()
