"""A LangGraph worker of tests/chaos/test_kill_lg_workers.py: one of several processes
serving the threads of one graph through one local store, as a web server's workers do.

Usage: lg_worker_child.py --spawner STORE EFFECTS

The spawner imports everything once (seconds on a loaded machine), then forks a fresh
worker per ``FORK <in fifo> <out fifo> <stderr file>`` line on its stdin and answers
``PID <pid>``; the worker reads its commands from the first FIFO and writes its lines
to the second (the parent opens them in the same order, write end first). Nothing is
open in the spawner when it forks: each worker opens the store itself, as a freshly
started process would. Killed workers are reaped by the kernel (SIGCHLD ignored).

``RUN <thread> <k>`` drives invocation k of the thread to its end and prints
``START <thread> <k>`` then ``DONE <thread> <k> <json of the state>``. Driving is
idempotent, so the parent re-sends the command of a worker it killed to another one:
if the thread's state already belongs to invocation k it is resumed
(``invoke(None)``) or, finished (no task left), just reported; otherwise k is invoked
with its input.
End of stdin: the worker closes the store and exits 0.

The graph: ``act`` runs STEPS times per invocation; each time it sends one effect
through ``durkv.langgraph.tool`` (a mutating tool called with an idempotency key,
appending ``<key> <thread>:<k>:<step>`` to EFFECTS and fsyncing) and appends the
tool's result to ``log``. Threads alternate LangGraph's ``sync`` and ``async``
durability. :func:`build` also makes the single-process reference run.
"""

from __future__ import annotations

import json
import operator
import os
import random
import signal
import sys
import threading
import time
from typing import Annotated

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

import durkv
from durkv.langgraph import DurkvSaver
from durkv.langgraph import tool as lg_tool
from forkserver import run_child            # this file runs as a script from its directory

STEPS = 3


class State(TypedDict):
    inv: int
    step: int
    log: Annotated[list, operator.add]


_out = 1


def say(line: str) -> None:
    try:
        os.write(_out, (line + "\n").encode())  # one write: a kill cuts only between lines
    except BrokenPipeError:     # the parent closed us before we said READY (the run's end):
        raise SystemExit(0) from None   # nothing left to report; close the store and go


def durability(thread: str) -> str:
    return "sync" if int(thread[1:]) % 2 == 0 else "async"


def build(effects: str | None, nap: float = 0.0):
    """The graph; ``effects`` None: the tool records nothing (the reference run)."""

    @durkv.tool(name="record")
    def record(what: str, *, idempotency_key: str) -> str:
        if effects is not None:
            time.sleep(random.uniform(0, nap))
            fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{idempotency_key} {what}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        return f"done {what}"

    def act(state: State, config) -> dict:
        thread = config["configurable"]["thread_id"]
        receipt = lg_tool(record, f"{thread}:{state['inv']}:{state['step']}")
        return {"step": state["step"] + 1, "log": [receipt]}

    g = StateGraph(State)
    g.add_node("act", act)
    g.add_edge(START, "act")
    g.add_conditional_edges("act", lambda s: "act" if s["step"] < STEPS else END)
    return g


def drive(graph, thread: str, k: int) -> dict:
    """Invocation k of ``thread``, started, resumed or found done (see module doc)."""
    cfg = {"configurable": {"thread_id": thread}}
    state = graph.get_state(cfg)
    if state.values.get("inv") != k:
        return graph.invoke({"inv": k, "step": 0}, cfg, durability=durability(thread))
    # Started. Finished only when no task is left: not `state.next`, nor the values, which
    # get_state shows with the saved writes of finished tasks applied. A worker killed
    # after its last task's writes were saved, before the checkpoint that applies them,
    # leaves `next == ()` and the final-looking values; a new input would then start
    # from that checkpoint without those writes (they are lost). invoke(None) applies
    # them (without running the task again) and saves the checkpoint.
    if state.tasks:
        return graph.invoke(None, cfg, durability=durability(thread))
    return state.values


def serve(store: str, effects: str, commands) -> None:
    with DurkvSaver.open(store) as saver:
        graph = build(effects, nap=0.01).compile(checkpointer=saver)
        say("READY")
        for line in commands:
            cmd, thread, k = line.split()
            assert cmd == "RUN", line
            say(f"START {thread} {k}")
            out = drive(graph, thread, int(k))
            say(f"DONE {thread} {k} {json.dumps(out, sort_keys=True)}")


def _worker(argv: list[str]) -> None:
    """A forked worker's main: its commands and lines go through the two FIFOs."""
    global _out
    store, effects, fifo_in, fifo_out = argv
    commands = open(fifo_in)                     # the parent opens the write end first
    _out = os.open(fifo_out, os.O_WRONLY)
    serve(store, effects, commands)


def spawner(store: str, effects: str) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    os.write(1, b"SPAWNER READY\n")
    for line in sys.stdin:
        cmd, fifo_in, fifo_out, err = line.split()
        assert cmd == "FORK", line
        assert threading.active_count() == 1, threading.enumerate()  # fork copies one
        pid = os.fork()
        if pid == 0:        # never returns: SIGKILL, or _exit at the end of its commands
            run_child(_worker, [store, effects, fifo_in, fifo_out], err)
        os.write(1, f"PID {pid}\n".encode())


if __name__ == "__main__":
    assert sys.argv[1] == "--spawner", sys.argv
    spawner(sys.argv[2], sys.argv[3])
