"""Child process of test_kill_graph.py: a durkv.Graph agent of STEPS supersteps.

Usage: graph_child.py STORE WORKDIR EXEC MODE STEPS   (MODE: plain | async)

Each superstep the agent node makes a recorded model call (appending ``EXEC i`` to
WORKDIR/models.log when it really runs) and calls a mutating tool; its router fans
out with ``Send`` to two workers that call the tool in the next superstep (beside the
agent's next turn). Every 100 supersteps the agent asks an approval that the parent
decides. The tool appends its idempotency key to WORKDIR/effects.log and fsyncs.
``async``: the nodes are ``async def`` (the agent's two tool calls under
``asyncio.gather``), driven by ``app.arun``. Prints ``READY`` after opening the store,
``GO`` right before the run, then ``END DONE <digest>`` or ``END WAITING <step_id>``,
and waits to be killed. Run through forkserver.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import xxhash

import durkv

RUN = "graph-agent"
STEPS = 500
EVERY = 100


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def make_graph(work: str, exe: int, mode: str, steps: int = STEPS) -> durkv.Graph:
    def model(i):
        time.sleep(0.002)       # a model call takes time (the kills need a running agent)
        with open(os.path.join(work, "models.log"), "a") as f:
            f.write(f"{exe} {i}\n")
        return f"m{i}"

    @durkv.tool(version="1", name="effect")
    def effect(what, *, idempotency_key):
        _append(os.path.join(work, "effects.log"), f"{idempotency_key}\n")
        return f"r:{what}"

    g = durkv.Graph({"messages": durkv.Append(), "effects": durkv.Append(),
                     "count": durkv.Last(0)})

    def plain_agent(state, ctx):
        i = state["count"]
        m = ctx.step("model", model, i)
        if i % EVERY == EVERY - 1 and not ctx.approve("publish", {"i": i, "m": m}).approved:
            return {"messages": [f"{i} rejected"], "count": i + 1}
        return {"messages": [m], "effects": [ctx.tool(effect, f"a{i}")], "count": i + 1}

    def plain_worker(arg, ctx):
        return {"effects": [ctx.tool(effect, f"w{arg[0]}.{arg[1]}")]}

    async def async_agent(state, ctx):
        i = state["count"]
        m = await ctx.astep("model", model, i)
        if i % EVERY == EVERY - 1 and not (await ctx.aapprove("publish",
                                                               {"i": i, "m": m})).approved:
            return {"messages": [f"{i} rejected"], "count": i + 1}
        a, b = await asyncio.gather(ctx.atool(effect, f"a{i}"), ctx.atool(effect, f"b{i}"))
        return {"messages": [m], "effects": [a, b], "count": i + 1}

    async def async_worker(arg, ctx):
        return {"effects": [await ctx.atool(effect, f"w{arg[0]}.{arg[1]}")]}

    plain = mode == "plain"
    g.add_node("agent", plain_agent if plain else async_agent)
    g.add_node("worker", plain_worker if plain else async_worker)
    g.add_edge(durkv.START, "agent")

    def route(state):
        i = state["count"]
        return [durkv.Send("worker", [i, j]) for j in range(2)] + (
            ["agent"] if i < steps else [])

    g.add_conditional_edges("agent", route)
    return g


def digest(state: dict) -> str:
    return xxhash.xxh3_64_hexdigest(json.dumps(state, sort_keys=True).encode())


def decision_for(payload: dict) -> bool:
    """The parent's (and the reference's) decision: every approval but the second's."""
    return payload["i"] != 2 * EVERY - 1


def drive(store, work: str, exe: int, mode: str, steps: int = STEPS,
          started=lambda: None) -> tuple[str, str]:
    """One execution: ("DONE", digest) or ("WAITING", step_id)."""
    app = durkv.Graph.compile(make_graph(work, exe, mode, steps), store,
                              max_supersteps=steps + 10)
    started()
    if mode == "plain":
        res = app.run({"messages": [f"start {mode}"]}, run_id=RUN)
    else:
        res = asyncio.run(app.arun({"messages": [f"start {mode}"]}, run_id=RUN))
    app.close()
    if res.status == "waiting":
        return "WAITING", res.interrupt.step_id
    assert res.status == "finished", res
    return "DONE", digest(res.state)


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())     # one write per line: lines never interleave


def main(argv: list[str] | None = None) -> None:
    path, work, exe, mode, steps = argv if argv is not None else sys.argv[1:6]
    with durkv.open(path, durability="async") as store:
        say("READY")
        what, arg = drive(store, work, int(exe), mode, int(steps), started=lambda: say("GO"))
    say(f"END {what} {arg}")
    time.sleep(600)


if __name__ == "__main__":
    main()
