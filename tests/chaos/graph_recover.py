"""The graph of test_kill_graph.py::test_recover_resumes_every_run_killed_mid_flight: one
node looping STEPS supersteps, each a recorded model call and a mutating tool call."""

from __future__ import annotations

import os
import time

import durkv

STEPS = 12


def make_graph(work: str, model_s: float = 0.0) -> durkv.Graph:
    """``model_s``: how long a model call takes (the killed driver's, so that every run is
    mid-flight at the kill; the recovering process does not wait)."""
    @durkv.tool(version="1", name="effect")
    def effect(what, *, idempotency_key):
        fd = os.open(os.path.join(work, "effects.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                     0o644)
        try:
            os.write(fd, f"{idempotency_key}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return what

    def model(i):
        time.sleep(model_s)
        return f"m{i}"

    def step(state, ctx):
        i = state["n"]
        return {"log": [ctx.tool(effect, ctx.step("model", model, i))], "n": i + 1}

    g = durkv.Graph({"log": durkv.Append(), "n": durkv.Last(0)})
    g.add_node("step", step)
    g.add_edge(durkv.START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["n"] < STEPS else durkv.END)
    return g


def expected_state() -> dict:
    return {"log": ["start"] + [f"m{i}" for i in range(STEPS)], "n": STEPS}
