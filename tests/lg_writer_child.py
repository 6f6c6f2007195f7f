"""Child of test_langgraph.py's read-only follower test: a writer process that runs one
``graph.invoke`` on thread ``t`` (a node appending ``n`` to ``log``) per line read from
stdin, printing ``DONE n`` after each; ``quit`` ends it.

Usage: lg_writer_child.py STORE SEGMENT_BYTES   (small segments: the writer rolls often)
"""

from __future__ import annotations

import operator
import sys
from typing import Annotated

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from durkv.langgraph import DurkvSaver


class State(TypedDict):
    n: int
    log: Annotated[list, operator.add]


def main(path: str, segment_bytes: int) -> None:
    g = StateGraph(State)
    g.add_node("add", lambda s: {"log": [s["n"]]})
    g.add_edge(START, "add")
    g.add_edge("add", END)
    with DurkvSaver.open(path, durability="sync", segment_bytes=segment_bytes) as saver:
        graph = g.compile(checkpointer=saver)
        n = 0
        for line in sys.stdin:
            if line.strip() == "quit":
                break
            graph.invoke({"n": n, "log": []}, {"configurable": {"thread_id": "t"}})
            print(f"DONE {n}", flush=True)
            n += 1


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
