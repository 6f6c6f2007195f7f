"""csrc/recpack.c: a journal record's frame payload packed in C is the Python path's, byte
for byte (docs/FORMAT.md 5, 5a: FORMAT does not change with the code that packs it).

The Python path is the truth: ``encode_record(Packer(use_bin_type=True).pack([K_JOURNAL,
run_id, record.pack()]))``, with ``with_step_ids`` applied to the map when step ids are
compact (FORMAT.md 5a). ``journal_payload`` either answers exactly those bytes or None (a
value it leaves to that path); the store appends a typed record either way and reads back
the map ``record.pack()`` builds.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import durkv
from durkv._recpack import journal_payload
from durkv.errors import SerializationError
from durkv.payload import encode_record
from durkv.runtime.records import RECORD_TYPES, StepRecord
from durkv.store.records import K_JOURNAL
from durkv.store.stepids import with_step_ids

_packer = msgpack.Packer(use_bin_type=True)


def python_payload(run_id, rec, ids=False):
    m = rec.pack()
    return encode_record(_packer.pack([K_JOURNAL, run_id, with_step_ids(m) if ids else m]))


def c_payload(run_id, rec, ids=False):
    cls = type(rec)
    return journal_payload(K_JOURNAL, run_id, rec, cls.E, cls.KEYS, cls.KEEP, ids)


def same(run_id, rec):
    """The typed record and its map both pack in C to the Python path's bytes, with step
    ids as text and compact."""
    for ids in (False, True):
        got = c_payload(run_id, rec, ids)
        assert got is not None, rec
        assert got == python_payload(run_id, rec, ids), rec
        assert journal_payload(K_JOURNAL, run_id, rec.pack(), ids) == got, rec


INTS = [0, 1, 31, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63,
        2**64 - 1, -1, -31, -32, -33, -127, -128, -129, -32768, -32769, -2**31, -2**31 - 1,
        -2**63]


@pytest.mark.parametrize("n", INTS)
def test_every_int_form(n):
    same("r", StepRecord(1.0, "0", fp=n, gen=n, prompt_version=n))


@pytest.mark.parametrize("size", [0, 1, 31, 32, 255, 256, 65535, 65536, 70_000])
def test_every_str_and_bin_length(size):
    same("r", StepRecord(2.5, "s" * size, name="é" * size, inputs=b"x" * size,
                         result=b"\x00" * size, tries=[["E", "m" * size]] * (size % 20)))


def test_odd_step_records():
    same("run-ü", StepRecord(1.5, "0", "step", "model", 2**64 - 1, 1.25, 0,
                             b"\x92\x91\x01\x80", None, None, None, b"\x82", None))
    # a failure with tries, a version, references, generation > 0
    same("r", StepRecord(1.5, "12", "step", "m" * 40, 7, None, 3, None, "v1",
                         [["a.B", "x"], ["a.B", "y"]], ["T", "msg", b"a"], None,
                         [[-1, 2], [0, 0, 3], [b"x", ["1", 0]]]))
    # None version, no t0, inputs None (secret), a huge gen, -0.0 and an empty result
    same("r" * 300, StepRecord(-0.0, "1/2", "now", "", 0, None, 2**40, None, None, [],
                               None, b"", None))
    # falsy TRUE fields are left out, truthy ones kept; a version of any plain type
    same("r", StepRecord(1e300, "1", gen=0, tries=[], prompt_version={
        "a": [1, -33, 1.5, True, False, None, "😀", b"", {"k": [[]]}, (1, 2)]}))
    same("r", StepRecord(float("inf"), "\u2028", prompt_version=[1, [2, [3, [4]]]]))


def test_every_record_type():
    """The packer reads each type's E, KEYS and KEEP: every record of FORMAT.md 5a."""
    for cls in RECORD_TYPES:
        n = len(cls.KEYS)
        full = tuple(1.0 if i == 0 else f"v{i}" for i in range(n))
        same("r", tuple.__new__(cls, full))
        sparse = tuple(2.0 if i == 0 else None for i in range(n))
        same("r", tuple.__new__(cls, sparse))


@pytest.mark.parametrize("odd", [
    "\ud800",                        # not UTF-8 encodable: msgpack raises
    2**64,                           # out of msgpack's range: OverflowError
    -2**63 - 1,
    bytearray(b"x"),                 # a type it leaves to msgpack
    memoryview(b"x"),
    type("S", (str,), {})("sub"),    # subclasses: msgpack's own rules
    type("I", (int,), {})(3),
    {1: object()},                   # a value msgpack refuses
])
def test_what_it_does_not_pack_is_left_to_the_python_path(odd):
    rec = StepRecord(1.0, "0", prompt_version=odd)
    assert c_payload("r", rec) is None
    assert journal_payload(K_JOURNAL, "r", rec.pack(), False) is None


def test_too_deep_is_left_to_the_python_path():
    v: list = []
    for _ in range(600):
        v = [v]
    assert c_payload("r", StepRecord(1.0, "0", prompt_version=v)) is None


class Truthy:
    def __bool__(self):
        return True


def test_a_bool_of_its_own_is_left_to_the_python_path():
    assert c_payload("r", StepRecord(1.0, "0", tries=Truthy())) is None


def test_bad_arguments_raise():
    with pytest.raises(TypeError):
        journal_payload(K_JOURNAL, b"r", StepRecord(1.0, "0"), 2, StepRecord.KEYS,
                        StepRecord.KEEP, False)
    with pytest.raises(ValueError):
        journal_payload(K_JOURNAL, "r", (1.0,), 2, StepRecord.KEYS, StepRecord.KEEP, False)
    with pytest.raises(TypeError):
        journal_payload(K_JOURNAL, "r", [1.0], False)     # a map is a dict
    with pytest.raises(TypeError):
        journal_payload(K_JOURNAL, "r", {})               # ids is not optional
    with pytest.raises(TypeError):
        journal_payload(K_JOURNAL, "r")


# step ids of the compact form (FORMAT.md 5a) and near misses: another case, a leading zero,
# an index past 2**64, a character too many or too few, a digit that is not ASCII
_ids = st.builds(lambda u, n: f"{u}:{n}", st.uuids(), st.integers(0, 2**64 + 5))
step_ids = _ids | st.tuples(_ids, st.sampled_from(
    [str.upper, lambda s: s.replace(":", ":0"), lambda s: s[1:], lambda s: s + "x",
     lambda s: s.replace("-", "_", 1), lambda s: s + "\u0661", lambda s: "a" + s])).map(
        lambda p: p[1](p[0]))

plain = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
    | st.text() | st.binary() | step_ids,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(run_id=st.text(min_size=1), sid=st.text(min_size=1) | step_ids, name=st.text(),
       fp=st.integers(0, 2**64 - 1), t=st.floats(), gen=st.integers(0, 2**40),
       inputs=st.none() | st.binary(), version=plain,
       tries=st.none() | st.lists(st.lists(st.text(), min_size=2, max_size=2), max_size=3),
       err=st.none() | st.tuples(st.text(), st.text(), st.binary()).map(list),
       result=st.none() | st.binary(), refs=st.none() | plain)
def test_any_step_record(run_id, sid, name, fp, t, gen, inputs, version, tries, err, result,
                         refs):
    rec = StepRecord(t, sid, "step", name, fp, t, gen, inputs, version, tries, err, result,
                     refs)
    for ids in (False, True):
        got = c_payload(run_id, rec, ids)
        try:
            want = python_payload(run_id, rec, ids)
        except (UnicodeEncodeError, OverflowError, ValueError, TypeError):
            assert got is None      # the Python path raises: so does the store (below)
            return
        assert got == want      # st.text() makes no lone surrogate: C packs every one of these
        assert journal_payload(K_JOURNAL, run_id, rec.pack(), ids) == want


@settings(max_examples=200, deadline=None)
@given(rec=st.dictionaries(st.text(max_size=6), plain, max_size=8))
def test_any_map(rec):
    got = journal_payload(K_JOURNAL, "r", rec, False)
    assert got == encode_record(_packer.pack([K_JOURNAL, "r", rec]))
    got = journal_payload(K_JOURNAL, "r", rec, True)
    assert got == encode_record(_packer.pack([K_JOURNAL, "r", with_step_ids(rec)]))


def test_the_store_appends_a_typed_record_as_its_map(tmp_path):
    with durkv.open(str(tmp_path / "s"), durability="async") as s:
        recs = [StepRecord(1.0, "0", "step", "m", 5, 0.5, 0, b"\x90", None, None, None,
                           b"\xc0", None),
                StepRecord(2.0, "1", prompt_version=bytearray(b"ab")),   # the Python path
                StepRecord(3.0, "2", err=["E", "m", b""], tries=[["E", "m"]])]
        for r in recs:
            s.append_journal("run", r)
            s.append_journal("run", r.pack())
        assert s.journal("run") == [msgpack.unpackb(msgpack.packb(r.pack()))
                                    for r in recs for _ in (0, 1)]
        for bad in (StepRecord(4.0, "\ud800"), {"e": 2, "s": "\ud800"}):
            with pytest.raises(SerializationError):
                s.append_journal("run", bad)
        assert len(s.journal("run")) == 6


_U = "0a46480b-33fa-f0f3-b8f3-a45efaa708b5"
_UB = bytes.fromhex(_U.replace("-", ""))


@pytest.mark.parametrize("sid, ext", [
    (f"{_U}:0", b"\xd8\x01" + _UB),                            # fixext 16: 18 bytes, not 40
    (f"{_U}:7", b"\xc7\x11\x01" + _UB + b"\x07"),
    (f"{_U}:256", b"\xc7\x12\x01" + _UB + b"\x01\x00"),
    (f"{_U}:{2**64 - 1}", b"\xc7\x18\x01" + _UB + b"\xff" * 8),
])
def test_a_step_id_is_packed_compact(sid, ext):
    """FORMAT.md 5a's bytes, in every place of a record (never a key), and read back as
    the very str."""
    rec = StepRecord(1.0, sid, inputs_by_ref=[[1], [sid, 0, 1], [[0], [sid, 2]]],
                     prompt_version={sid: sid})
    got = c_payload("r", rec, True)
    assert got.count(ext) == 4                  # s, the base, the item, the version's value
    assert got.count(sid.encode()) == 1         # the version's key stays a str
    assert got == python_payload("r", rec, True)
    assert c_payload("r", rec, False).count(sid.encode()) == 5
    from durkv.store.stepids import unpackb
    assert unpackb(got[4:-4])[2] == rec.pack()


@pytest.mark.parametrize("sid", [
    f"{_U}:{2**64}", f"{_U}:01", f"{_U}:", f"{_U.upper()}:0", f"{_U}:1x", f"{_U[1:]}:0",
    f"{_U}:\u0661", f"{_U}0", "x" + f"{_U}:0", f"{_U}:1:2", f"{_U.replace('-', '')}:0",
])
def test_what_is_not_a_compact_step_id_stays_a_str(sid):
    rec = StepRecord(1.0, sid)
    got = c_payload("r", rec, True)
    assert got == c_payload("r", rec, False) == python_payload("r", rec, True)


@pytest.mark.parametrize("data", [b"", _UB[:15], _UB + b"\x00", _UB + b"\x00\x01",
                                  _UB + b"\x01" * 9])
def test_a_compact_step_id_no_writer_makes_is_refused(data):
    """Data of another length, or an index with a leading zero byte: a damaged head."""
    from durkv.errors import CorruptionError
    from durkv.store.records import read_head
    head = msgpack.packb([K_JOURNAL, "r", {"e": 2, "s": msgpack.ExtType(1, data)}])
    with pytest.raises(CorruptionError, match="compact step id"):
        read_head(encode_record(head), 7)
    other = msgpack.packb([K_JOURNAL, "r", {"e": 2, "x": msgpack.ExtType(5, data)}])
    assert read_head(encode_record(other))[2]["x"] == msgpack.ExtType(5, data)


@settings(max_examples=300, deadline=None)
@given(sid=step_ids)
def test_any_step_id_reads_back_as_the_str_it_was(sid):
    """Compact or not, C's bytes decode to the very str (the type too), in every place."""
    from durkv.store.stepids import unpackb
    rec = StepRecord(1.0, sid, inputs_by_ref=[[1], [sid, 0, 1], [[0], [sid, 2]]])
    got = unpackb(c_payload("r", rec, True)[4:-4])[2]
    assert got == rec.pack()
    assert type(got["s"]) is str and got["s"] == sid
