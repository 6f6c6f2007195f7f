"""Agents for test_runtime_hostile.py (issue 15), run in a child that SIGKILLs itself at a
chosen instant and then again in the test process with the same code, through a sync
driver (``with store.run``) or an async one (``async with store.arun``).

Usage: hostile_agents.py STORE WORKDIR AGENT KILL_AT MODE   (MODE: sync | async)

Every tool call appends ``<what> <idempotency key>`` to WORKDIR/effects.log and fsyncs
(journal_agents.effect): that file is what the outside world saw. A child that was not
killed exits 0, which the test reports as a failure.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys

from journal_agents import effect, effects

import durkv


class Verbs:
    """The run's verbs as coroutines, sync (``run.tool``) or async (``await run.atool``):
    one agent's code serves both drivers."""

    def __init__(self, run, mode: str) -> None:
        self.run, self.mode = run, mode

    async def step(self, *a, **k):
        return await self.run.astep(*a, **k) if self.mode == "async" else self.run.step(*a, **k)

    async def tool(self, *a, **k):
        return await self.run.atool(*a, **k) if self.mode == "async" else self.run.tool(*a, **k)


async def drive(store, run_id: str, mode: str, agent, *args):
    """Execute ``agent(Verbs, *args)`` in run ``run_id`` with the chosen driver."""
    if mode == "async":
        async with store.arun(run_id) as run:
            return await agent(Verbs(run, mode), *args)
    with store.run(run_id) as run:
        return await agent(Verbs(run, mode), *args)


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def pay_agent(v: Verbs, work: str, kill_at: str | None = None):
    """An at-most-once payment (killed after the service saw it when kill_at == "pay")."""

    @durkv.tool(at_most_once=True, name="pay", version="1")
    def pay(amount, *, idempotency_key):
        effect(work, "pay", idempotency_key)
        if kill_at == "pay":
            _kill()
        return {"paid": amount}

    await v.step("plan", lambda: "plan-1")
    return await v.tool(pay, 10)


async def flaky_agent(v: Verbs, work: str, kill_at: str | None = None, what: str = "tool"):
    """A tool (or a step: ``what``) that always fails, with Retry(3); killed (kill_at
    "attempt2") inside the second attempt, after the outside world saw it."""

    def attempt(key: str) -> None:
        effect(work, what, key)
        if kill_at == "attempt2" and len(effects(work)) == 2:
            _kill()
        raise ConnectionError(f"{what} down")

    @durkv.tool(name="charge")
    def charge(*, idempotency_key):
        attempt(idempotency_key)

    retry = durkv.Retry(3, backoff=0.0)
    if what == "step":
        return await v.step("model", attempt, "-", retry=retry)
    return await v.tool(charge, retry=retry)


N_ITEMS = 8


async def fanout_agent(v: Verbs, work: str, kill_at: str | None = None):
    """asyncio.gather of per-item pipelines (a model step, a tool, a note step), whose
    awaits complete in a random order; the child is killed (inside a note step) once 4
    tools have taken effect."""
    rnd = random.Random()     # another order in every execution

    async def model(i):
        await asyncio.sleep(rnd.random() / 200)
        return f"m{i}"

    async def note(r):
        await asyncio.sleep(rnd.random() / 1000)
        if kill_at == "fanout" and len(effects(work)) >= 4:
            _kill()
        return f"noted {r}"

    @durkv.tool(name="deliver")
    async def deliver(i, m, *, idempotency_key):
        await asyncio.sleep(rnd.random() / 20)
        effect(work, f"deliver-{i}", idempotency_key)
        return f"{m}:{i}"

    async def pipeline(i):
        m = await v.run.astep("model", model, i)
        r = await v.run.atool(deliver, i, m)
        return await v.run.astep("note", note, r)

    first = await v.run.astep("plan", model, -1)       # the run's own task: id "0"
    out = await asyncio.gather(*(pipeline(i) for i in range(N_ITEMS)))
    return [first, *out]


AGENTS = {"pay": (pay_agent,), "flaky-tool": (flaky_agent, "tool"),
          "flaky-step": (flaky_agent, "step"), "fanout": (fanout_agent,)}


def main() -> None:
    path, work, agent, kill_at, mode = sys.argv[1:6]
    fn, *extra = AGENTS[agent]
    with durkv.open(path, durability="async") as store:
        asyncio.run(drive(store, agent, mode, fn, work, kill_at, *extra))


if __name__ == "__main__":
    main()
