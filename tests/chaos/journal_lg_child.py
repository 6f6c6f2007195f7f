"""Child process of test_kill_journal.py's LangGraph case: a looping graph whose node
makes a recorded model call (``durkv.langgraph.step``: appends ``EXEC i`` to
WORKDIR/models.log when it really runs) and a mutating tool call
(``durkv.langgraph.tool``: appends its key to WORKDIR/effects.log and fsyncs).

Usage: journal_lg_child.py STORE WORKDIR EXEC STEPS   (prints READY, GO once the graph is
built and about to run, then END DONE <digest>, and waits to be killed). The test
runs it through forkserver.py (``main(argv)`` in a fork of a process that imported
this module once); each line is one ``os.write``, so lines of successive children
never interleave.
"""

from __future__ import annotations

import operator
import os
import sys
import time
from typing import Annotated

import xxhash
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

import durkv
import durkv.backends.local  # noqa: F401 - imported once in the fork server: a child that
# compiled it (CI writes no bytecode) spent ~45 ms of its 30 ms kill window doing so
from durkv.langgraph import DurkvSaver, step, tool

THREAD = "lg-agent"
# enough for the default run's 50 kills: a kill lets ~6-7 supersteps through (the graph
# finished after 43-46 kills of 300 once commits kept the GIL)
STEPS = 500


class State(TypedDict):
    n: int
    log: Annotated[list, operator.add]


def build(saver, work: str, exe: int, steps: int = STEPS):
    def model(i):
        time.sleep(0.003)
        with open(os.path.join(work, "models.log"), "a") as f:
            f.write(f"{exe} {i}\n")
        return f"m{i}"

    @durkv.tool(version="1", name="effect")
    def effect(i, *, idempotency_key):
        fd = os.open(os.path.join(work, "effects.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                     0o644)
        try:
            os.write(fd, f"{idempotency_key}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return f"r{i}"

    def act(state):
        i = state["n"]
        m = step("model", model, i)
        r = tool(effect, i)
        return {"n": i + 1, "log": [f"{m}{r}"]}

    g = StateGraph(State)
    g.add_node("act", act)
    g.add_edge(START, "act")
    g.add_conditional_edges("act", lambda s: END if s["n"] >= steps else "act")
    return g.compile(checkpointer=saver)


def drive(saver, work: str, exe: int, steps: int = STEPS, ready=lambda: None) -> str:
    graph = build(saver, work, exe, steps)
    cfg = {"configurable": {"thread_id": THREAD}, "recursion_limit": steps + 10}
    started = saver.get_tuple(cfg) is not None
    ready()
    out = graph.invoke(None if started else {"n": 0, "log": []}, cfg)
    return xxhash.xxh3_64_hexdigest(repr(out["log"]).encode())


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())


def main(argv: list[str] | None = None) -> None:
    path, work, exe, steps = argv if argv is not None else sys.argv[1:5]
    with DurkvSaver.open(path, durability="sync") as saver:
        say("READY")
        digest = drive(saver, work, int(exe), int(steps), ready=lambda: say("GO"))
    say(f"END DONE {digest}")
    time.sleep(600)


if __name__ == "__main__":
    main()
