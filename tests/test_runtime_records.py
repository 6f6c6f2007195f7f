"""Journals on disk across versions of the runtime (issue 16 items 2 and 4).

tests/fixtures/make_journal_store.py writes a store whose journals hold every record
kind of docs/FORMAT.md 5a, every timestamp pinned. Its store as written by 70cd864
must read to the entries 70cd864 read from it; the same script run by the current code
must write, frame for frame, the payload bytes written by 2ea939e (the runtime just
before its call protocol was rewritten) -- records are the format, not the code that
builds them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from storeinternals import backend_of

import durkv
from durkv.payload import decode_commit, encode_record

FIXTURES = Path(__file__).parent / "fixtures"
SCRIPT = FIXTURES / "make_journal_store.py"
KINDS = {1: "RUN", 2: "STEP", 3: "INTENT", 4: "RECEIPT", 5: "APPROVAL", 6: "DECISION",
         7: "RESOLVE", 8: "STATUS", 9: "WARN", 10: "TRY"}


def _copy(name: str, tmp_path: Path) -> str:
    d = tmp_path / name
    shutil.copytree(FIXTURES / name, d)
    return str(d)


def _payloads(path: str) -> list[bytes]:
    with durkv.open(path) as s:
        b = backend_of(s)
        return [bytes(p) for _, p in b.scan(b.start_lsn)]


def _entries(path: str) -> dict:
    sys.path.insert(0, str(FIXTURES))
    try:
        import make_journal_store
    finally:
        sys.path.remove(str(FIXTURES))
    return make_journal_store.entries(path)


@pytest.fixture(scope="module")
def written_now(tmp_path_factory) -> str:
    """The script's store, written by the code under test (in its own process: the
    script pins time.time for the whole interpreter)."""
    d = tmp_path_factory.mktemp("journal") / "now"
    subprocess.run([sys.executable, str(SCRIPT), str(d)], check=True, capture_output=True)
    return str(d)


def test_the_fixture_holds_every_record_kind(written_now):
    with durkv.open(written_now) as s:
        events = {r["e"] for run in ("agent", "doubt", "drift") for r in s.journal(run)}
    assert {KINDS[e] for e in events} == set(KINDS.values())


def _as_written_since_issue_20(payload: bytes) -> bytes:
    """The payload this code writes for a record 2ea939e wrote as ``payload``: the same
    bytes, but an INTENT leaves out its key when it is the run's default and its retry
    count when 0 (FORMAT.md 5a, issue 20), which every reader derives."""
    head, entries = decode_commit(payload)
    h = msgpack.unpackb(head, raw=False, strict_map_key=False)
    if entries or h[0] != 11 or h[2].get("e") != 3:
        return payload
    kind, run_id, rec = h
    if rec.get("key") == f"{run_id}:{rec['s']}":
        del rec["key"]
    if rec.get("rc") == 0:
        del rec["rc"]
    return encode_record(msgpack.packb([kind, run_id, rec], use_bin_type=True))


def test_the_same_operations_write_the_same_bytes(written_now, tmp_path):
    before = _payloads(_copy("journal-2ea939e", tmp_path))
    now = _payloads(written_now)
    assert len(now) == len(before)
    intents = 0
    for i, (a, b) in enumerate(zip(before, now)):
        want = _as_written_since_issue_20(a)
        intents += want != a
        assert want == b, f"frame {i}: {want!r}\n   now: {b!r}"
    assert intents > 0          # the fixture's intents are written the newer way


def test_the_same_store_reads_to_the_same_entries(written_now):
    expected = json.loads((FIXTURES / "journal-2ea939e.json").read_text())
    assert _entries(written_now) == expected


def test_a_journal_written_by_70cd864_reads_to_the_entries_70cd864_read(tmp_path):
    expected = json.loads((FIXTURES / "journal-70cd864.json").read_text())
    got = _entries(_copy("journal-70cd864", tmp_path))
    assert got.keys() == expected.keys()
    for run, entries in expected.items():
        assert len(got[run]) == len(entries), run
        for old, new in zip(entries, got[run]):
            assert {k: new.get(k) for k in old} == old, (run, old["step_id"])
