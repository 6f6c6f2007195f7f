"""The journal record types (kernel/runtime/records.py) against docs/FORMAT.md 5a.

Each type's fields are read from FORMAT.md's table of events, so a field added to the
code and not the doc (or the other way round) fails here. The bytes the writers produce
are pinned frame for frame by tests/test_runtime_records.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgpack
import pytest

from durkv.runtime import records as R

FORMAT = Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md"
IDENT = re.compile(r"[a-z][a-z0-9_]*")
# fields FORMAT.md documents outside 5a's table (the sentence that says so must be there)
ADDED = {"INTENT": ("cut", "An INTENT written by the repair guard (§6a) carries `cut`"),
         "DECISION": ("dq", "`dq` is an addition to §5a's DECISION and RESOLVE"),
         "RESOLVE": ("dq", "`dq` is an addition to §5a's DECISION and RESOLVE")}
NO_STEP = ("RUN", "STATUS", "REPAIR", "REPAIR_ACK")   # not a step's events: no `s`/`g`


def _section_5a() -> str:
    text = FORMAT.read_text()
    start = text.index("## 5a. Run journal records")
    return text[start:text.index("\n## ", start + 1)]


def documented_events() -> dict[int, tuple[str, set[str]]]:
    """FORMAT.md 5a's table: event number -> (name, the keys its records may carry).

    A row's fields are its backticked names, leaving out parenthesised remarks (the
    values a field takes), a value named in a remark (a `sleep`'s) and everything after
    the row's first sentence (notes that mention other events' fields)."""
    events = {}
    for line in _section_5a().splitlines():
        m = re.fullmatch(r"\| (\d+) \| (\w+) \| (.*) \|", line)
        if not m:
            continue
        fields = re.sub(r"\([^)]*\)", "", m.group(3))
        fields = fields.split(". ")[0]
        keys = {k for k in re.findall(r"`([^`]+)`(?!')", fields) if IDENT.fullmatch(k)}
        name = m.group(2)
        keys |= {"e", "t"} | (set() if name in NO_STEP else {"s", "g"})
        events[int(m.group(1))] = (name, keys)
    return events


def _name(cls: type) -> str:
    """The event's name in FORMAT.md: RepairAckRecord -> REPAIR_ACK."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__.removesuffix("Record")).upper()


def test_the_table_is_read():
    events = documented_events()
    assert events[2] == ("STEP", {"e", "t", "s", "g", "k", "n", "fp", "in", "ir", "pv", "r",
                                  "err", "tries", "t0"})
    assert events[8] == ("STATUS", {"e", "t", "st", "until", "s", "msg"})


@pytest.mark.parametrize("cls", R.RECORD_TYPES, ids=_name)
def test_each_type_writes_the_fields_format_5a_lists(cls):
    events = documented_events()
    assert cls.E in events, f"event {cls.E} ({cls.__name__}) is not in FORMAT.md 5a's table"
    name, documented = events[cls.E]
    assert name == _name(cls)
    if name in ADDED:
        key, sentence = ADDED[name]
        assert sentence in FORMAT.read_text()
        documented = documented | {key}
    assert {"e", *cls.KEYS} == documented


@pytest.mark.parametrize("cls", R.RECORD_TYPES, ids=_name)
def test_pack_writes_every_field_set_and_of_reads_it_back(cls):
    values = [f"v{i}" for i in range(len(cls.KEYS))]    # every field set: every key written
    rec = cls(*values)
    packed = rec.pack()
    assert list(packed) == ["e", *cls.KEYS]
    assert packed["e"] == cls.E and packed["t"] == "v0"
    assert cls.of(msgpack.unpackb(msgpack.packb(packed), raw=False)) == rec


def test_optional_fields_are_left_out_as_the_writers_always_did():
    step = R.StepRecord(1.5, "0", "step", "plan", 7, 1.0, 0, None, None, [], None, b"\x01")
    assert msgpack.packb(step.pack()) == msgpack.packb(
        {"e": 2, "t": 1.5, "s": "0", "k": "step", "n": "plan", "fp": 7, "t0": 1.0, "r": b"\x01"})
    assert R.RunRecord(2.0, None, 1).pack() == {"e": 1, "t": 2.0, "fp": None, "tid": 1}
    assert R.IntentRecord(3.0, "1", "pay", 9, "k1", 0, 2, at_most_once=True).pack() == {
        "e": 3, "t": 3.0, "s": "1", "n": "pay", "fp": 9, "key": "k1", "g": 2, "amo": True}
    # the run's default key and retry 0 are left out: every reader derives them
    assert R.IntentRecord(3.0, "1", "pay", 9, None, 1).pack() == {
        "e": 3, "t": 3.0, "s": "1", "n": "pay", "fp": 9, "rc": 1}
    assert R.StatusRecord(4.0, "sleeping", until=9.0).pack() == {
        "e": 8, "t": 4.0, "st": "sleeping", "until": 9.0}


def test_a_record_of_an_older_or_newer_writer_reads():
    """Older writers left fields out (the defaults hold); a newer writer's unknown keys are
    passed over."""
    old = R.StepRecord.of({"e": 2, "t": 1.0, "s": "3", "n": "x", "r": b"\x01"})
    assert (old.kind, old.gen, old.fp, old.t0, old.tries) == ("step", 0, 0, None, None)
    newer = R.TryRecord.of({"e": 10, "t": 1.0, "s": "3", "err": ["E", "m"], "zz": 1})
    assert (newer.step, newer.err, newer.kind) == ("3", ["E", "m"], None)


def test_a_misspelt_field_is_an_error_where_the_record_is_built():
    with pytest.raises(TypeError):
        R.StepRecord(1.0, "0", prompt_verison="v1")
    with pytest.raises(AttributeError):
        R.StatusRecord(1.0, "running").stauts
