"""LangGraph's official checkpointer conformance suite, run against DurkvSaver.

``langgraph-checkpoint-conformance`` detects which capabilities a saver
implements (base: put, put_writes, get_tuple, list, delete_thread; extended:
delete_for_runs, copy_thread, prune) and runs each capability's suite on a
fresh saver. DurkvSaver must implement and pass all of them, on memory://
and on a local store.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability

from durkv.langgraph import DurkvSaver


@pytest.mark.parametrize("where", ["memory", "local"])
def test_conformance(where, tmp_path):
    fresh = itertools.count()

    @checkpointer_test(name=f"DurkvSaver[{where}]")
    async def durkv_saver():
        url = "memory://" if where == "memory" else str(tmp_path / f"c{next(fresh)}.durkv")
        with DurkvSaver.open(url) as saver:
            yield saver

    report = asyncio.run(validate(durkv_saver))
    problems = {
        cap.value: (result.detected, result.failures)
        for cap in Capability
        if not (result := report.results[cap.value]).detected or not result.passed
    }
    assert not problems, problems
    assert all(report.results[c.value].tests_failed == 0 for c in Capability)
