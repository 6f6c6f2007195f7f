"""A small LangGraph loop for the S3 tests: ``tick`` N times, each appending to a list.

``fail_at=K`` makes the tick of step K raise (the run stops there, its checkpoints
committed), as a crashed worker would; resuming with ``invoke(None, config)`` finishes.
"""

from __future__ import annotations

import operator
from typing import Annotated

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict


class State(TypedDict):
    step: int
    log: Annotated[list, operator.add]


class Crash(Exception):
    pass


def build(n_steps: int, fail_at: int | None = None, checkpointer=None):
    def tick(s: State) -> dict:
        if s["step"] == fail_at:
            raise Crash(f"crash at step {fail_at}")
        return {"step": s["step"] + 1, "log": [f"tick {s['step']}"]}

    g = StateGraph(State)
    g.add_node("tick", tick)
    g.add_edge(START, "tick")
    g.add_conditional_edges("tick", lambda s: END if s["step"] >= n_steps else "tick")
    return g.compile(checkpointer=checkpointer)
