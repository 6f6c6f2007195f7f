"""One scenario, two drivers: the runtime's protocol tests run through the sync verbs
(``with store.run`` + ``run.step/tool/approve/sleep/compensate``) and through the async
ones (``async with store.arun`` + ``astep/atool/aapprove/asleep/acompensate``).

A scenario is ``async def scenario(v)``; ``v.step(...)``, ``v.tool(...)`` ... take the
sync verbs' arguments and are awaited. Under the sync driver each awaits nothing (the
sync verb runs when awaited); under the async driver each is the awaitable verb, called
(its step id claimed) when ``v.step(...)`` is.

    def test_x(url, drive):
        async def scenario(v):
            return await v.step("plan", model, "p")
        with durkv.open(url) as s:
            assert drive(s, "r", scenario) == ...
            drive.run.status        # the Run of the last execution
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

VERBS = ("step", "tool", "approve", "sleep", "compensate", "now", "random", "uuid")


class SyncVerbs:
    """The sync verbs, as awaitables (run when awaited)."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def __getattr__(self, verb: str) -> Callable:
        f = getattr(self.run, verb)

        async def call(*a: Any, **k: Any) -> Any:
            return f(*a, **k)
        return call


class AsyncVerbs:
    """The awaitable verbs (``now``/``random``/``uuid`` have none: the sync ones)."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def __getattr__(self, verb: str) -> Callable:
        if verb in ("now", "random", "uuid"):
            return SyncVerbs(self.run).__getattr__(verb)
        return getattr(self.run, "a" + verb)


class Driver:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.run: Any = None

    def __repr__(self) -> str:
        return self.mode

    def __call__(self, store: Any, run_id: str, scenario: Callable, **run_kw: Any) -> Any:
        """One execution of ``scenario`` on run ``run_id``: its result (None when the
        execution paused for an approval: ``self.run.status == "waiting"``)."""
        return asyncio.run(self._go(store, run_id, scenario, run_kw))

    async def _go(self, store: Any, run_id: str, scenario: Callable, run_kw: dict) -> Any:
        out = None
        if self.mode == "sync":
            self.run = store.run(run_id, **run_kw)
            with self.run:
                out = await scenario(SyncVerbs(self.run))
        else:
            self.run = store.arun(run_id, **run_kw)
            async with self.run:
                out = await scenario(AsyncVerbs(self.run))
        return out


@pytest.fixture(params=["sync", "async"])
def drive(request: Any) -> Driver:
    """Runs a scenario through the sync verbs or the async ones (module docstring)."""
    return Driver(request.param)
