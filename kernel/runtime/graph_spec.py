"""What a ``durkv.Graph`` is made of: channels and their reducers, ``Send``, ``START``/``END``,
and :class:`Spec`, the checked graph a compiled app runs (``Graph.compile`` builds it).

Reducers (how the updates of a superstep's tasks fold into a channel, in task order):

- :class:`Append` -- a list that only grows: an update is a list (or tuple) of new items.
  The store writes it as a delta (only the new items), so N supersteps cost O(N) bytes.
- :class:`Last` -- the last update wins (in task order: node name, then Send index).
- any ``fn(old, new) -> value`` -- the first update of a channel without a value is
  taken as is; every later one is ``fn(old, new)``.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import GraphError

__all__ = ["START", "END", "Append", "Last", "Send", "Spec", "Task", "APPEND", "LAST", "FN",
           "reducer_of", "decode_tasks"]

START = "__start__"
END = "__end__"

APPEND, LAST, FN = 0, 1, 2      # reducer kinds


class Append:
    """A list channel that only grows: each update is a list of new items (stored as a
    delta: only the new items are written)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "durkv.Append()"


class Last:
    """A channel holding the last value written (``default`` before any write)."""

    __slots__ = ("default",)

    def __init__(self, default: Any = None) -> None:
        self.default = default

    def __repr__(self) -> str:
        return f"durkv.Last({self.default!r})"


@dataclass(frozen=True)
class Send:
    """A router's fan-out: run ``node`` as ``node(arg, ctx)`` in the next superstep (one
    task per Send)."""

    node: str
    arg: Any = None


class Task:
    """One task of a superstep: a node triggered by an edge (``arg`` is the state) or by a
    :class:`Send` (``send`` is True, ``arg`` its argument). ``index`` numbers the node's
    tasks in the superstep (the edge-triggered one first, then the Sends in order)."""

    __slots__ = ("node", "index", "send", "arg", "enc")

    def __init__(self, node: str, index: int, send: bool, arg: Any = None) -> None:
        self.node, self.index, self.send, self.arg = node, index, send, arg
        # as the checkpoint's metadata lists it (``next``); never mutated
        self.enc = [node, arg] if send else [node]

    def __repr__(self) -> str:
        return f"{self.node}[{self.index}]" + (" (Send)" if self.send else "")


def decode_tasks(enc: list) -> list[Task]:
    """The tasks of ``next`` as :meth:`Task.encode` listed them, numbered again."""
    out: list[Task] = []
    seen: dict[str, int] = {}
    for t in enc:
        i = seen.get(t[0], 0)
        seen[t[0]] = i + 1
        out.append(Task(t[0], i, len(t) > 1, t[1] if len(t) > 1 else None))
    return out


def reducer_of(ch: str, r: Any) -> tuple[int, Any]:
    if isinstance(r, Append):
        return APPEND, None
    if isinstance(r, Last):
        return LAST, r.default
    if isinstance(r, type) and r in (Append, Last):
        raise GraphError(f"channel {ch!r}: {r.__name__} is a class; use durkv.{r.__name__}()")
    if callable(r):
        return FN, r
    raise GraphError(f"channel {ch!r}: {r!r} is not a reducer; use durkv.Append(), "
                     "durkv.Last(default) or a function fn(old, new) -> value")


def _arity(name: str, fn: Callable) -> int:
    """How many positional arguments a node takes: 1 (``fn(state)``) or 2 (``fn(state,
    ctx)``)."""
    try:
        every = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return 2
    params = [p for p in every
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    # refused here, not as a TypeError in the run's first superstep
    keyword = [p.name for p in every if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if keyword:
        raise GraphError(f"node {name!r}: {fn!r} has keyword-only parameter(s) "
                         f"{', '.join(keyword)} without a default; a node is called "
                         f"fn(state, ctx) with positional arguments: make them positional")
    needed = [p for p in params if p.kind is not p.VAR_POSITIONAL and p.default is p.empty]
    if len(needed) > 2:
        raise GraphError(f"node {name!r}: {fn!r} needs {len(needed)} arguments; a node is "
                         "fn(state, ctx) (or fn(arg, ctx) as a Send target): give the others "
                         "defaults, or bind them (functools.partial)")
    if any(p.kind is p.VAR_POSITIONAL for p in params) or len(params) >= 2:
        return 2
    if len(params) == 1:
        return 1
    raise GraphError(f"node {name!r}: {fn!r} takes no argument; a node is fn(state, ctx) "
                     "(or fn(arg, ctx) as a Send target)")


def _is_async(fn: Callable) -> bool:
    """An ``async def`` node: a coroutine function, or an object whose ``__call__`` is
    one (``inspect.iscoroutinefunction`` does not look there; its coroutine would be
    taken for the update and never awaited)."""
    return (inspect.iscoroutinefunction(fn)
            or inspect.iscoroutinefunction(getattr(fn, "__call__", None)))


class Spec:
    """A checked graph: channels, nodes, edges and routers (``Graph.compile`` builds it)."""

    def __init__(self, channels: dict[str, tuple[int, Any]], nodes: dict[str, Callable],
                 edges: dict[str, list[str]], routers: dict[str, list[tuple[Callable, Any]]]):
        self.channels = channels
        self.nodes = nodes
        self.edges = edges
        self.routers = routers
        self.arity = {n: _arity(n, fn) for n, fn in nodes.items()}
        self.is_async = {n: _is_async(fn) for n, fn in nodes.items()}
        # the agent loop's shape -- a node whose one way out is one router returning a
        # name -- skips the general fold below: its next task is a shared, immutable Task
        self._only_router = {src: rs[0][0] for src, rs in routers.items()
                             if len(rs) == 1 and not isinstance(rs[0][1], dict)
                             and not edges.get(src)}
        self._alone = {n: [Task(n, 0, False)] for n in nodes}

    def defaults(self) -> dict[str, Any]:
        """Every channel's value before any write (``Append``: [], ``Last``: its default,
        a function reducer: None); mutable defaults are copied per run."""
        out = {}
        for ch, (kind, d) in self.channels.items():
            out[ch] = [] if kind == APPEND else copy.copy(d) if kind == LAST else None
        return out

    def next_tasks(self, sources: list[str], state: dict) -> list[Task]:
        """The tasks of the next superstep: the plain edges and the routers of the
        ``sources`` (the nodes that ran, in task order), evaluated on ``state``."""
        if len(sources) == 1:
            router = self._only_router.get(sources[0])
            if router is not None:
                got = router(state)
                fast = self._alone.get(got) if type(got) is str else None
                if fast is not None:
                    return fast
                return self._tasks(*self._route(sources[0], router, None, got))
        plain: set[str] = set()
        sends: dict[str, list[Any]] = {}
        for src in sources:
            plain.update(self.edges.get(src, ()))
            for router, path_map in self.routers.get(src, ()):
                self._route(src, router, path_map, router(state), plain, sends)
        return self._tasks(plain, sends)

    def _tasks(self, plain: set, sends: dict) -> list[Task]:
        plain.discard(END)
        tasks: list[Task] = []
        for node in sorted(plain | sends.keys()):
            i = 0
            if node in plain:
                tasks.append(Task(node, 0, False))
                i = 1
            for arg in sends.get(node, ()):
                tasks.append(Task(node, i, True, arg))
                i += 1
        return tasks

    def _route(self, src: str, router: Callable, path_map: Any, got: Any,
               plain: set | None = None, sends: dict | None = None) -> tuple[set, dict]:
        """Add what a router returned to ``plain`` (names) and ``sends`` (node -> args)."""
        plain = set() if plain is None else plain
        sends = {} if sends is None else sends
        items = got if isinstance(got, (list, tuple)) else (got,)
        for x in items:
            if isinstance(x, Send):
                if x.node not in self.nodes:
                    raise self._bad_route(src, router, got, x.node)
                sends.setdefault(x.node, []).append(x.arg)
                continue
            if isinstance(path_map, dict):
                try:
                    x = path_map[x]
                except (KeyError, TypeError):   # TypeError: unhashable (a nested list)
                    name = getattr(router, "__qualname__", repr(router))
                    raise GraphError(
                        f"router {name!r} of node {src!r} returned {got!r}: {x!r} is not a "
                        f"key of its path_map (keys: {', '.join(map(repr, path_map))})",
                        node=src, router=name) from None
            if x != END and (type(x) is not str or x not in self.nodes):
                raise self._bad_route(src, router, got, x)
            plain.add(x)
        return plain, sends

    def _bad_route(self, src: str, router: Callable, got: Any, x: Any) -> GraphError:
        name = getattr(router, "__qualname__", repr(router))
        return GraphError(
            f"router {name!r} of node {src!r} returned {got!r}: {x!r} is not a node of the "
            f"graph (nodes: {', '.join(sorted(self.nodes))}; or durkv.END, durkv.Send)",
            node=src, router=name)
