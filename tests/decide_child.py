"""Child processes of tests/test_decide_processes.py and bench/test_bench_decide.py.

``agent STORE OUTBOX RUN[,RUN...] [POLL_S]``: drives every run to its end. A run asks
for an approval of ``send``, then calls the mutating tool ``send`` with the decision
(one line per effect in OUTBOX, idempotent on its key, as a real tool's server is).
While a run waits, the agent polls its journal for the decision and runs it again
once there is one. It prints ``waiting RUN STEP`` when a run first waits, and ``done
RUN APPROVED T`` (T: the wall clock when the step after the approval began).
``DURKV_TEST_KILL_AFTER_SEEN=1``: SIGKILL itself right after it read the decision, before
acting on it.

``decider STORE``: opens the store once, then for each line ``RUN STEP yes|no`` on
stdin decides and prints one JSON line: ``{"ok": true, "approved": ...}`` or
``{"ok": false, "error": code}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import durkv
from durkv.errors import DurkvError
from durkv.runtime.view import describe


def agent(path: str, outbox: str, run_ids: list[str], poll_s: float) -> None:
    @durkv.tool(version="1")
    def send(to: str, ok: bool, *, idempotency_key: str) -> bool:
        try:
            with open(outbox) as f:
                if any(json.loads(ln)[0] == idempotency_key for ln in f):
                    return ok       # the effect was made before: the server's dedup
        except FileNotFoundError:
            pass
        with open(outbox, "a") as f:
            f.write(json.dumps([idempotency_key, to, ok]) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return ok

    kill_after_seen = os.environ.get("DURKV_TEST_KILL_AFTER_SEEN") == "1"
    store = durkv.open(path)
    todo = list(run_ids)
    waiting: dict[str, str] = {}
    while todo:
        for rid in list(todo):
            step = waiting.get(rid)
            if step is not None:
                st = next(e for e in describe(store, rid) if e.step_id == step)
                if st.approval_status == "pending":
                    continue
                if kill_after_seen:
                    os.kill(os.getpid(), signal.SIGKILL)
            with store.run(rid, input={"rid": rid}) as run:
                d = run.approve("send", {"to": rid})
                t = time.time()
                run.tool(send, rid, d.approved)
            if run.status == "waiting":
                if rid not in waiting:
                    waiting[rid] = run.interrupt.step_id
                    print(f"waiting {rid} {run.interrupt.step_id}", flush=True)
                continue
            print(f"done {rid} {d.approved} {t!r}", flush=True)
            todo.remove(rid)
        time.sleep(poll_s)
    store.close()


def decider(path: str) -> None:
    with durkv.open(path, index_every=0) as store:
        print("ready", flush=True)
        for line in sys.stdin:
            rid, step, yes = line.split()
            try:
                d = store.decide(rid, step, yes == "yes", by=f"pid {os.getpid()}")
                out = {"ok": True, "approved": d.approved}
            except DurkvError as exc:
                out = {"ok": False, "error": exc.code}
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "agent":
        agent(sys.argv[2], sys.argv[3], sys.argv[4].split(","),
              float(sys.argv[5]) if len(sys.argv) > 5 else 0.005)
    else:
        decider(sys.argv[2])
