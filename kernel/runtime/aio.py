"""The awaitable forms of a run's verbs: ``astep``, ``atool``, ``aapprove``, ``asleep``.

Each claims its step id when called (not when awaited), so calls issued together
(``asyncio.gather``) get ids in the order they were issued. Tools' intent and
receipt fsyncs run in a worker thread (concurrent calls share them: group commit).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from itertools import count
from typing import Any, Callable

from .plan import ONCE, Plan, err_type
from .tools import Retry

__all__ = ["AsyncVerbs"]


class AsyncVerbs:
    """Mixed into :class:`durkv.runtime.Run` (uses its planning and recording methods)."""

    def astep(self, name: str, fn: Callable, *args: Any, prompt_version: Any = None,
              retry: Retry | None = None, key: str | None = None, secret: bool = False,
              retry_failed: bool = False, **kwargs: Any):
        """Awaitable :meth:`step`; ``fn`` may be a coroutine function."""
        sid = self._sid(key)
        inputs, fp = self._inputs("step", name, args, kwargs, secret)
        p = self._plan_step(sid, "step", name, fp, inputs, prompt_version, retry_failed)
        return self._astep(p, fn, args, kwargs, retry)

    async def _astep(self, p: Plan, fn: Callable, args: tuple, kwargs: dict,
                     retry: Retry | None) -> Any:
        if p.replay:
            return self._outcome(p.entry)
        r = retry or ONCE
        tries: list = []
        for i in count():
            try:
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                break
            except Exception as exc:
                tries.append([err_type(exc), str(exc)])
                if not r.retries(exc, i):
                    self._record_step(p, exc=exc, tries=tries)
                    raise
                await _asleep(r.sleep, r.delay(i))
        self._record_step(p, result, tries=tries)
        return result

    def atool(self, fn: Callable, *args: Any, retry: Retry | None = None,
              key: str | None = None, secret: bool = False, retry_failed: bool = False,
              **kwargs: Any):
        """Awaitable :meth:`tool`; ``fn`` may be a coroutine function. The intent and
        receipt fsyncs run in a worker thread (concurrent calls share them)."""
        spec = self._spec(fn, kwargs)
        p = self._plan_tool(self._sid(key), spec, args, kwargs, secret,
                            retry_failed=retry_failed)
        return self._atool(p, fn, args, kwargs, retry)

    async def _atool(self, p: Plan, fn: Callable, args: tuple, kwargs: dict,
                     retry: Retry | None) -> Any:
        if p.replay:
            return self._done(p, self._outcome(p.entry))
        r = retry or ONCE
        tries: list = []
        for i in count():
            await asyncio.to_thread(self._intent, p)
            try:
                result = fn(*args, idempotency_key=p.key, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                break
            except Exception as exc:
                tries.append([err_type(exc), str(exc)])
                if not r.retries(exc, i):
                    await asyncio.to_thread(self._receipt, p, None, exc, tries)
                    raise
                await _asleep(r.sleep, r.delay(i))
                p.rc += 1
        await asyncio.to_thread(self._receipt, p, result, None, tries)
        return self._done(p, result)

    def aapprove(self, action: str, payload: Any = None, *, key: str | None = None):
        """Awaitable :meth:`approve`."""
        sid = self._sid(key)

        async def go() -> Any:      # a durkv.runtime.Decision
            return self._approve_at(sid, action, payload)
        return go()

    def asleep(self, seconds: float, *, key: str | None = None):
        """Awaitable :meth:`sleep`."""
        left, slept = self._plan_sleep(seconds, key)

        async def go() -> None:
            if slept:
                await _asleep(self._sleep, left)
                self._status("running")
        return go()


async def _asleep(sleep: Callable[[float], Any], seconds: float) -> None:
    if sleep is time.sleep:
        await asyncio.sleep(seconds)
    else:
        r = sleep(seconds)      # an injected (fake) sleep
        if inspect.isawaitable(r):
            await r
