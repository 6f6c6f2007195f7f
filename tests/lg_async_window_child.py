"""Child of test_langgraph_steps.py's async-window test: a two-node graph whose first
node sends with ``durkv.langgraph.tool`` and whose second node SIGKILLs the process,
run with ``durability="async"`` and a saver whose puts lag (``slow``: each put sleeps
0.3 s first, as a busy disk would make LangGraph's background saves lag its tasks).

Usage: lg_async_window_child.py STORE WORKDIR slow|fast   (prints the final log when
the graph ends; under ``slow`` it never ends: it kills itself in the second node).
"""

from __future__ import annotations

import operator
import os
import signal
import sys
import time
from typing import Annotated

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

import durkv
from durkv.langgraph import DurkvSaver, tool


class State(TypedDict):
    log: Annotated[list, operator.add]


def main(path: str, work: str, slow: bool) -> None:
    class LaggingSaver(DurkvSaver):
        def put(self, *args, **kwargs):
            if slow:
                time.sleep(0.3)
            return super().put(*args, **kwargs)

    @durkv.tool(name="send")
    def send(to, *, idempotency_key):
        fd = os.open(os.path.join(work, "effects"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{idempotency_key}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return f"sent to {to}"

    def send_node(state):
        return {"log": [tool(send, "a@b")]}

    def die_node(state):
        if slow:      # the receipt is durable; the checkpoints may still be on their way
            os.kill(os.getpid(), signal.SIGKILL)
        return {"log": ["done"]}

    g = StateGraph(State)
    g.add_node("send", send_node)
    g.add_node("die", die_node)
    g.add_edge(START, "send")
    g.add_edge("send", "die")
    g.add_edge("die", END)
    cfg = {"configurable": {"thread_id": "t"}}
    with LaggingSaver.open(path) as saver:
        app = g.compile(checkpointer=saver)
        started = saver.get_tuple(cfg) is not None
        out = app.invoke(None if started else {"log": []}, cfg, durability="async")
    print(out["log"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] == "slow")
