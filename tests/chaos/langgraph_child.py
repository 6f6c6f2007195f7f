"""Child process for tests/chaos/test_kill_langgraph.py: run (or resume) a long graph.

Usage: ``python langgraph_child.py STORE THREAD_ID SIDE_FILE N_STEPS [MODE [hang]]``

MODE is LangGraph's ``durability=`` (default ``sync``); ``hang`` makes the
child sleep after ``DONE`` with the store still open, for the parent to kill.

``python langgraph_child.py --server`` imports everything once, then forks a
fresh process per ``run STORE THREAD_ID SIDE_FILE N_STEPS [MODE]`` line on
stdin (the same arguments), which prints ``READY <pid>`` and the protocol
below; the server prints ``EXIT <status>`` when it ends (killed: -9). This
keeps a kill cycle at tens of milliseconds instead of an interpreter start.

The graph loops N_STEPS times: a ``tick`` node, then three ``work`` nodes in
parallel (``Send``), each appending ``"step:worker"`` to ``results``
(``operator.add``). It runs under ``durability="sync"`` on a local store.

Protocol on stdout (each line flushed): ``READY``, then ``RESUME <step>``
(the step of the checkpoint it starts from, -1 for a fresh thread), then
``TICK <step>`` as each superstep's tick starts, and ``DONE <json state>``.

The side file (append-only, fsync'd per line) records ``start S:W`` when a
worker begins and ``saved S:W`` once its writes are committed (the saver's
``put_writes`` returned): a worker whose writes were saved must never start
again, whatever the parent kills.
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
from langgraph.types import Send
from typing_extensions import TypedDict

WORKERS = 3


class State(TypedDict):
    step: int
    results: Annotated[list, operator.add]


def say(line: str) -> None:
    """One write per line: a kill can cut the output only between lines."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def build_graph(n_steps: int, side_file: str | None = None, nap: float = 0.0):
    """The chaos graph; the parent builds it too (no side file, no naps) for the reference run."""

    def record(line: str) -> None:
        if side_file is None:
            return
        fd = os.open(side_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def tick(s: State) -> dict:
        say(f"TICK {s['step']}")
        return {"step": s["step"] + 1}

    def work(arg: dict) -> dict:
        key = f"{arg['step']}:{arg['w']}"
        record(f"start {key}")
        if nap:
            time.sleep(random.uniform(0, nap) * (1 + arg["w"]))
        return {"results": [key]}

    def fan_out(s: State):
        if s["step"] > n_steps:
            return END
        return [Send("work", {"step": s["step"], "w": w}) for w in range(WORKERS)]

    g = StateGraph(State)
    g.add_node("tick", tick)
    g.add_node("work", work)
    g.add_edge(START, "tick")
    g.add_conditional_edges("tick", fan_out, ["work", END])
    g.add_edge("work", "tick")
    return g


def main(argv: list[str]) -> None:
    store, thread_id, side_file, n_steps = argv[0], argv[1], argv[2], int(argv[3])
    mode = argv[4] if len(argv) > 4 else "sync"
    hang = len(argv) > 5 and argv[5] == "hang"
    from durkv.langgraph import DurkvSaver

    class RecordingSaver(DurkvSaver):
        def put_writes(self, config, writes, task_id, task_path=""):
            super().put_writes(config, writes, task_id, task_path)
            for ch, value in writes:
                if ch == "results":
                    for key in value:
                        fd = os.open(side_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                        os.write(fd, f"saved {key}\n".encode())
                        os.fsync(fd)
                        os.close(fd)

    say(f"READY {os.getpid()}")
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": 10 * n_steps + 20}
    with RecordingSaver.open(store) as saver:
        graph = build_graph(n_steps, side_file, nap=0.004).compile(checkpointer=saver)
        saved = saver.get_tuple(config)
        if saved is None:
            say("RESUME -1")
            out = graph.invoke({"step": 0, "results": []}, config, durability=mode)
        else:
            say(f"RESUME {graph.get_state(config).values.get('step', -1)}")
            out = graph.invoke(None, config, durability=mode)
        say("DONE " + json.dumps(out))
        while hang:
            time.sleep(1)


def serve() -> None:
    import traceback

    import durkv.langgraph  # noqa: F401 - import once, before forking
    import durkv.log  # noqa: F401 - and the compiled log: every child runs the same build

    for line in sys.stdin:
        args = line.split()
        if not args or args[0] != "run":
            continue
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                main(args[1:])
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        say(f"\nEXIT {os.waitstatus_to_exitcode(status)}")  # own line even after a cut one


if __name__ == "__main__":
    if sys.argv[1:] == ["--server"]:
        serve()
    else:
        main(sys.argv[1:])
