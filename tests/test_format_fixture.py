"""Stores written by earlier releases stay readable, byte for byte the same data.

tests/fixtures/v1-store was written by tests/fixtures/make_v1_store.py at commit
6e7cf49 (the first released format). The current code must open it (read-only and
for writing), read every history exactly as expected.json records it, verify it
clean, and go on appending to it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

import durkv

FIXTURE = Path(__file__).parent / "fixtures" / "v1-store"


def _maker():
    spec = importlib.util.spec_from_file_location(
        "make_v1_store", Path(__file__).parent / "fixtures" / "make_v1_store.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def v1_store(tmp_path):
    d = tmp_path / "v1.durkv"
    shutil.copytree(FIXTURE, d)
    (d / "expected.json").unlink()
    return d


def _expected() -> dict:
    return json.loads((FIXTURE / "expected.json").read_text())


@pytest.mark.parametrize("read_only", [True, False])
def test_v1_store_reads_back_exactly(v1_store, read_only):
    with durkv.open(str(v1_store), read_only=read_only) as s:
        assert _maker().dump_store(s) == _expected()
        report = s.verify(deep=True)
        assert report.ok, report


def test_v1_store_accepts_new_commits(v1_store):
    with durkv.open(str(v1_store)) as s:
        old = s.get("agent").values["messages"]
        s.put("agent", "", "0099", checkpoint={}, metadata={"step": 99},
              values={"messages": old + [{"n": 99}]}, versions={"messages": 99})
    with durkv.open(str(v1_store), read_only=True) as s:
        assert s.get("agent").values["messages"] == old + [{"n": 99}]
        assert s.verify(deep=True).ok
        expected = _expected()
        got = _maker().dump_store(s)
        assert got["agent|"][1:] == expected["agent|"]
        assert {k: v for k, v in got.items() if k != "agent|"} == \
            {k: v for k, v in expected.items() if k != "agent|"}
