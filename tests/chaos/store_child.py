"""Child process of test_kill_store.py: commit checkpoints until killed.

Usage: store_child.py PATH MODE   (MODE: put | compact)

Continues thread "t" from its newest checkpoint. Checkpoint i holds
``msgs = [item(0) .. item(i)]`` (one new item per step, delta-encoded) and
``n = i``, and gets one pending write ``(0, "w", i)``. Prints ``ACK <cid>``
once a ``sync`` put returned and ``WACK <cid>`` once its pending write did.
In ``compact`` mode every few steps it also writes and deletes a scratch
thread and runs ``compact()`` (printing ``COMPACTED``).
"""

from __future__ import annotations

import sys

import durkv


def item(j: int) -> str:
    return f"m{j}-" + "x" * (50 + j % 200)


def cid_of(i: int) -> str:
    return f"{i:08d}"


def main() -> None:
    path, mode = sys.argv[1], sys.argv[2]
    store = durkv.open(path, durability="sync", snapshot_every=4, compress_min_bytes=128)
    latest = store.get("t")
    if latest is None:
        i, msgs, parent = 0, [], None
    else:
        i, msgs, parent = latest.values["n"] + 1, latest.values["msgs"], latest.checkpoint_id
    print("READY", flush=True)
    while True:
        msgs = msgs + [item(i)]
        cid = cid_of(i)
        store.put("t", "", cid, checkpoint={"i": i}, metadata={"step": i},
                  values={"msgs": msgs, "n": i}, versions={"msgs": i, "n": i}, parent_id=parent)
        print("ACK", cid, flush=True)
        store.put_writes("t", "", cid, "task", [(0, "w", i)])
        print("WACK", cid, flush=True)
        parent = cid
        i += 1
        if mode == "compact" and i % 3 == 0:
            for k in range(2):
                store.put("scratch", "", f"{i}-{k}", checkpoint={}, metadata={},
                          values={"junk": "j" * 500}, versions={"junk": k})
            store.delete_thread("scratch")
            print("COMPACTING", flush=True)
            store.compact()
            print("COMPACTED", flush=True)


if __name__ == "__main__":
    main()
