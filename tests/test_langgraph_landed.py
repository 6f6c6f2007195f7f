"""A put wakes a thread waiting for its checkpoint; a put with no waiter skips the condition.

``DurkvSaver.wait_for_checkpoint`` (durkv.langgraph.step/tool under LangGraph's async
durability) blocks until the task's checkpoint is committed. Since issue 20 a put notifies
only while a waiter is counted; these tests hold that a waiter is woken by the put's
notify (not by its 50 ms re-check), that several waiters are, and that the count returns
to zero however the wait ends.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("langgraph.checkpoint.base")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402

from durkv import ConfigError  # noqa: E402
from durkv.langgraph import DurkvSaver  # noqa: E402


class RecordingCondition(threading.Condition):
    """A real condition that records what each wait returned (True: notified).

    With ``notify_only`` a wait ignores its short pause and lasts up to 30 s, so that only
    a notify can end it: a waiter whose pause ran out just after the put committed (and
    before it notified) would otherwise find the checkpoint by its re-check, a legitimate
    path these tests must not mistake for the notify (it made them flaky under load)."""

    def __init__(self, notify_only: bool = False) -> None:
        super().__init__()
        self.results: list[bool] = []
        self.notify_only = notify_only

    def wait(self, timeout=None):
        got = super().wait(30 if self.notify_only else timeout)
        self.results.append(got)
        return got


def _put(saver: DurkvSaver, cid: str) -> None:
    ck = empty_checkpoint()
    ck["id"] = cid
    saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, ck,
              {"source": "input", "step": -1}, {})


def test_a_put_notifies_the_waiters(tmp_path):
    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:
        saver._landed = cond = RecordingCondition(notify_only=True)
        got: list[bool] = []
        waiters = [threading.Thread(target=lambda: got.append(
            saver.wait_for_checkpoint("t", "", "c1", timeout=10))) for _ in range(3)]
        for w in waiters:
            w.start()
        deadline = time.monotonic() + 10
        while saver._waiting < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert saver._waiting == 3
        _put(saver, "c1")
        for w in waiters:
            w.join(10)
        assert got == [True, True, True]
        assert cond.results == [True, True, True]   # each woken by the put's notify
        assert saver._waiting == 0


def test_the_count_returns_to_zero_after_a_timeout_and_a_put_without_waiters(tmp_path):
    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:
        assert saver.wait_for_checkpoint("t", "", "never", timeout=0.06) is False
        assert saver._waiting == 0
        saver._landed = cond = RecordingCondition()
        _put(saver, "c1")                       # nobody waits: no notify needed
        assert saver.wait_for_checkpoint("t", "", "c1", timeout=1) is True
        assert cond.results == [] and saver._waiting == 0


def test_waiting_for_this_handles_put_takes_no_write_section(tmp_path):
    """The wait looks in this handle's index (no flock, no catch-up): the put's own write
    section is the only one while a waiter is woken by it."""
    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:
        backend = saver.store._b
        begin = backend.write_begin
        sections: list[int] = []
        backend.write_begin = lambda: (sections.append(1), begin())[1]
        saver._landed = cond = RecordingCondition(notify_only=True)
        got: list[bool] = []
        w = threading.Thread(target=lambda: got.append(
            saver.wait_for_checkpoint("t", "", "c1", timeout=10)))
        w.start()
        deadline = time.monotonic() + 10
        while saver._waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        before = len(sections)
        _put(saver, "c1")
        w.join(10)
        assert got == [True] and cond.results == [True]
        assert len(sections) - before == 1      # the put's
        assert saver.wait_for_checkpoint("t", "", "c1", timeout=1) is True
        assert len(sections) - before == 1      # held: answered from the index


def test_a_checkpoint_another_process_commits_ends_the_wait(tmp_path):
    """A put by another process does not notify this handle: the wait looks for it with a
    catch-up each time a pause ends (1 ms, doubling up to 50 ms), and returns True."""
    path = str(tmp_path / "s.durkv")
    code = ("import time\n"
            "from langgraph.checkpoint.base import empty_checkpoint\n"
            "from durkv.langgraph import DurkvSaver\n"
            f"with DurkvSaver.open({path!r}) as s:\n"
            "    time.sleep(0.3)\n"
            "    ck = empty_checkpoint(); ck['id'] = 'c9'\n"
            "    s.put({'configurable': {'thread_id': 't', 'checkpoint_ns': ''}}, ck,\n"
            "          {'source': 'input', 'step': -1}, {})\n")
    with DurkvSaver.open(path) as saver:
        child = subprocess.Popen([sys.executable, "-c", code])
        try:
            t0 = time.monotonic()
            assert saver.wait_for_checkpoint("t", "", "c9", timeout=30) is True
            assert time.monotonic() - t0 < 10
        finally:
            assert child.wait(30) == 0
        assert saver._waiting == 0


def test_a_closed_store_is_refused_by_the_wait(tmp_path):
    from durkv.errors import DurkvError

    saver = DurkvSaver.open(str(tmp_path / "s.durkv"))
    _put(saver, "c1")
    saver.close()
    with pytest.raises(DurkvError, match="closed"):
        saver.wait_for_checkpoint("t", "", "c1", timeout=1)


def test_a_wait_without_a_limit_and_bad_timeouts(tmp_path):
    """``timeout=None`` waits as long as it takes; a timeout that is not a number of
    seconds is a ConfigError, never a TypeError from inside the wait."""
    import asyncio

    with DurkvSaver.open(str(tmp_path / "s.durkv")) as saver:
        t = threading.Timer(0.05, _put, args=(saver, "c1"))
        t.start()
        assert saver.wait_for_checkpoint("t", "", "c1", timeout=None) is True
        t.join()
        assert asyncio.run(saver.await_checkpoint("t", "", "c1", timeout=None)) is True
        assert saver.wait_for_checkpoint("t", "", "c1", timeout=10 ** 400) is True

        class Seconds(float):       # a float subclass (numpy's float64 is one)
            pass
        assert saver.wait_for_checkpoint("t", "", "c1", timeout=Seconds(2.5)) is True
        for bad in ("1", True, float("nan"), [1]):
            with pytest.raises(ConfigError, match="timeout"):
                saver.wait_for_checkpoint("t", "", "c1", timeout=bad)
            with pytest.raises(ConfigError, match="timeout"):
                asyncio.run(saver.await_checkpoint("t", "", "c1", timeout=bad))
        assert saver._waiting == 0
