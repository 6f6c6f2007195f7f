"""Shared pytest configuration.

Keep this file small: markers, and fixtures more than one test file needs.
"""

from __future__ import annotations

import itertools

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "chaos: kill -9 / fault-injection tests (tests/chaos/)")
    config.addinivalue_line("markers", "slow: long variants, run with DURKV_SLOW_TESTS=1")
    config.addinivalue_line("markers", "s3: tests against the moto S3 server")


# ---- segment-log fixtures (tests/test_log_*.py, tests/chaos/) -------------------------


@pytest.fixture
def log_dir(tmp_path):
    """A path for a new log directory (not created: SegmentLog.open creates it)."""
    return tmp_path / "log.durkv"


@pytest.fixture
def no_faults():
    """Disarm the process-wide fault hook before and after the test."""
    from durkv.log import fault_inject

    fault_inject(None)
    yield fault_inject
    fault_inject(None)


# ---- store fixtures (tests/test_store*.py) ---------------------------------------------

_store_names = itertools.count()


@pytest.fixture(params=["memory", "local"])
def url(request, tmp_path):
    """A fresh store URL on each backend (memory URLs are named so they can be reopened)."""
    if request.param == "memory":
        name = f"test-store-{next(_store_names)}"
        yield f"memory://{name}"
        from durkv.backends.memory import MemoryBackend

        MemoryBackend.drop(name)
    else:
        yield str(tmp_path / "s.durkv")
