"""Child of test_kill_langgraph.py's ToolNode case: an agent node emits one AIMessage with
six tool calls; LangGraph's prebuilt ``ToolNode`` runs them in threads, and each tool sends
through ``durkv.langgraph.tool`` (no ``key=``), appending ``key to`` to WORKDIR/effects and
fsyncing. The tool calls reach durkv in an order set by EXEC: execution 1 in call order,
0.2 s apart (the parent SIGKILLs it after the third effect), later executions in reverse
order -- threads give no order, so a resume must not depend on one.

Usage: langgraph_toolnode_child.py STORE WORKDIR EXEC   (prints the final tool messages)
"""

from __future__ import annotations

import os
import sys
import time

from langchain_core.messages import AIMessage
from langchain_core.tools import tool as lc_tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

import durkv
from durkv.langgraph import DurkvSaver
from durkv.langgraph import tool as lg_tool

CALLS = 6


def build(saver, work: str, exe: int):
    @durkv.tool(name="send_email")
    def send_email(to, *, idempotency_key):
        fd = os.open(os.path.join(work, "effects"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{idempotency_key} {to}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return f"sent to {to}"

    @lc_tool
    def email(i: int) -> str:
        """Email recipient i."""
        time.sleep(0.2 * i if exe == 1 else 0.05 * (CALLS - i))
        return lg_tool(send_email, f"user{i}@example.com")

    def agent(state):
        return {"messages": [AIMessage("", tool_calls=[
            {"name": "email", "args": {"i": i}, "id": f"call_{i}"} for i in range(CALLS)])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([email]))
    g.add_edge(START, "agent")
    g.add_edge("agent", "tools")
    g.add_edge("tools", END)
    return g.compile(checkpointer=saver)


def main(path: str, work: str, exe: int) -> None:
    cfg = {"configurable": {"thread_id": "agent"}}
    with DurkvSaver.open(path, durability="sync") as saver:
        graph = build(saver, work, exe)
        out = graph.invoke(None if saver.get_tuple(cfg) else {"messages": []}, cfg)
    print(sorted(m.content for m in out["messages"] if m.type == "tool"), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
