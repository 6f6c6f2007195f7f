"""Fixtures for the benchmark suites (bench/test_bench_*.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import benchlib
import pytest


@pytest.fixture(scope="session")
def baseline():
    """The C baseline (raw_fsync_loop, raw_write_loop)."""
    return benchlib.baseline()


@pytest.fixture(scope="session")
def bench_root():
    """Scratch space on a real disk (DURKV_BENCH_DIR, default the temp dir): never tmpfs
    if you want fsync figures that mean anything."""
    base = os.environ.get("DURKV_BENCH_DIR") or None
    d = Path(tempfile.mkdtemp(prefix="durkv-bench-", dir=base))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    if not benchlib.RESULTS:
        return
    tr = terminalreporter
    tr.section("durkv: ratios vs targets")
    width = max(len(r["name"]) for r in benchlib.RESULTS)
    for r in benchlib.RESULTS:
        tr.write_line(f"{r['name']:<{width}}  {r['ratio']:>8.3f}  target {r['target']:<34} "
                      f"{'ok' if r['ok'] else 'MISSED'}")
