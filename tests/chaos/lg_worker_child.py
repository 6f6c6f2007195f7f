"""A LangGraph worker of tests/chaos/test_kill_lg_workers.py: one of several processes
serving the threads of one graph through one local store, as a web server's workers do.

Usage: lg_worker_child.py STORE EFFECTS     (commands on stdin, one per line)

``RUN <thread> <k>`` drives invocation k of the thread to its end and prints
``START <thread> <k>`` then ``DONE <thread> <k> <json of the state>``. Driving is
idempotent, so the parent re-sends the command of a worker it killed to another one:
if the thread's state already belongs to invocation k it is resumed
(``invoke(None)``) or, finished (STEPS steps done), just reported; otherwise k is
invoked with its input.
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
import sys
import time
from typing import Annotated

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

import durkv
from durkv.langgraph import DurkvSaver
from durkv.langgraph import tool as lg_tool

STEPS = 3


class State(TypedDict):
    inv: int
    step: int
    log: Annotated[list, operator.add]


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())     # one write: a kill cuts only between lines


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
    if state.values["step"] < STEPS:    # not `state.next`: a task whose writes were
        return graph.invoke(None, cfg, durability=durability(thread))   # saved is not in it
    return state.values


def main(store: str, effects: str) -> None:
    with DurkvSaver.open(store) as saver:
        graph = build(effects, nap=0.01).compile(checkpointer=saver)
        say("READY")
        for line in sys.stdin:
            cmd, thread, k = line.split()
            assert cmd == "RUN", line
            say(f"START {thread} {k}")
            out = drive(graph, thread, int(k))
            say(f"DONE {thread} {k} {json.dumps(out, sort_keys=True)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
