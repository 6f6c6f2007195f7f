"""Under LangGraph's ``durability="async"`` the saves keep up with the loop.

LangGraph's async loop hands each checkpoint to its executor and goes on; each save runs
after the previous one. A save that releases the GIL (a write, a compression, an
fdatasync) then waits up to the interpreter's switch interval for the busy loop to give
it back: the saves fell behind without bound. At superstep 3,000 of an agent loop 2,951
checkpoints were not saved yet (a kill lost them), and every queued checkpoint held its
own copy of the growing state (1.2 GB at 16,000 supersteps). DurkvSaver now makes the
loop wait, as it versions a superstep's writes, once a save lands more than 20 ms after
its checkpoint was made, until the saves have caught up (docs/GUARANTEES.md section 1).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
import pytest

pytest.importorskip("langgraph.checkpoint.base")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402

from durkv.cli.benchgraph import agent_graph, cfg  # noqa: E402
from durkv.cli.benchwork import message  # noqa: E402
from durkv.langgraph import DurkvSaver  # noqa: E402

N = 2000


def loop_graph(n: int, at_step):
    """The agent loop (one ~1 KiB message a superstep); ``at_step(i)`` runs in the node."""
    def make(i):
        at_step(i)
        return message(i)

    return agent_graph(n, make=make)


def test_the_saves_keep_up_with_an_async_loop(tmp_path):
    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:
        saved = [0]
        put = saver.put

        def counting_put(*args, **kwargs):
            out = put(*args, **kwargs)
            saved[0] += 1
            return out

        saver.put = counting_put
        behind: list[int] = []

        def look(i):
            if i >= 200 and i % 100 == 0:
                behind.append(i + 1 - saved[0])   # checkpoints made (input's included)

        graph = loop_graph(N, look).compile(checkpointer=saver)
        graph.invoke({"n": 0, "messages": []}, cfg("t", N), durability="async")
        # before: the saves reached ~3% of the loop (1,940 behind at 2,000)
        assert max(behind) <= N // 4, behind
        assert saved[0] == N + 2       # every checkpoint saved in the end, in order
        assert saver.get_tuple(cfg("t", N)).checkpoint["channel_values"]["n"] == N


_KILLED = """
import os, sys
sys.path.insert(0, {tests!r})
from test_langgraph_async_saves import loop_graph
from durkv.cli.benchgraph import cfg
from durkv.langgraph import DurkvSaver

def kill_at(i):
    if i == {kill_at}:
        os.kill(os.getpid(), 9)

saver = DurkvSaver.open({path!r})
graph = loop_graph(10 ** 6, kill_at).compile(checkpointer=saver)
graph.invoke({{"n": 0, "messages": []}}, cfg("t", 10 ** 6), durability="async")
"""


def test_a_kill_under_async_loses_only_the_last_moments(tmp_path):
    path = str(tmp_path / "k.durkv")
    kill_at = 1500
    child = _KILLED.format(tests=str(__import__("pathlib").Path(__file__).parent),
                           kill_at=kill_at, path=path)
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=300)
    assert p.returncode == -9, p.stderr.decode()[-2000:]
    with DurkvSaver.open(path) as saver:
        n = saver.get_tuple(cfg("t", 0)).checkpoint["channel_values"]["n"]
    # before: the newest checkpoint on disk was from superstep ~30 (1,470 lost)
    assert kill_at - 400 <= n <= kill_at, n


def _old_put(saver: DurkvSaver) -> None:
    """A checkpoint made an hour ago, put as LangGraph's executor puts one."""
    ck = empty_checkpoint()
    ck["ts"] = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat()
    ck["channel_versions"] = {"n": 3}
    saver.put({"configurable": {"thread_id": "old", "checkpoint_ns": ""}}, ck,
              {"source": "update", "step": 1}, {"n": 3})


def test_an_old_checkpoint_put_costs_at_most_one_short_wait(tmp_path):
    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:
        t = threading.Thread(target=_old_put, args=(saver,))
        t.start()
        t.join()
        t0 = time.monotonic()
        assert saver.get_next_version(7, None) == 8
        first = time.monotonic() - t0
        t0 = time.monotonic()
        assert saver.get_next_version(8, None) == 9
        second = time.monotonic() - t0
        assert first < 1.0 and second < 0.05, (first, second)


def test_a_late_save_of_the_newest_checkpoint_needs_no_wait(tmp_path):
    """The loop waits for the save of the newest version it made; when the late save is
    that one (durkv.langgraph.step/tool waited for it), there is nothing to wait for."""
    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:
        ck = empty_checkpoint()
        ck["ts"] = (datetime.now(timezone.utc) - timedelta(seconds=0.5)).isoformat()
        ck["channel_versions"] = {"n": 7, "messages": 6}
        saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, ck,
                  {"source": "loop", "step": 6}, {"n": 7})
        assert saver._late      # it was late
        t0 = time.monotonic()
        assert saver.get_next_version(7, None) == 8
        assert time.monotonic() - t0 < 0.08     # not the 0.1 s wait for a save to come


def test_an_event_loop_never_waits_for_saves(tmp_path):
    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:
        _old_put(saver)

        async def version():
            t0 = time.monotonic()
            v = saver.get_next_version(7, None)
            return v, time.monotonic() - t0

        v, took = asyncio.run(version())
        assert v == 8 and took < 0.05, took


def test_an_async_graph_on_an_event_loop_saves_every_checkpoint(tmp_path):
    async def run(saver):
        graph = loop_graph(300, lambda i: None).compile(checkpointer=saver)
        await graph.ainvoke({"n": 0, "messages": []}, cfg("a", 300), durability="async")

    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:
        asyncio.run(run(saver))
        assert len(list(saver.list(cfg("a", 0)))) == 302
        assert saver.get_tuple(cfg("a", 0)).checkpoint["channel_values"]["n"] == 300
