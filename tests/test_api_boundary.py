"""Bad arguments at the public boundary raise a durkv error, never another exception.

issue 7 item 13: ``get(t, '', 3)``, ``history(limit='2')``, ``put_writes(writes=[1])``,
an index of ``2**70``, a surrogate ``task_id`` and ``open(segment_bytes='4096')``
raised TypeError, OverflowError or UnicodeEncodeError from inside the store, and
``delete_runs('run-1')`` deleted the runs named by its characters. Item 3: a store
path with a NUL in it was cut at the NUL. Item 9: a non-string channel name or a
non-scalar version was committed, and then ``durkv ls`` failed for the whole store.

Every public method is called with one argument at a time replaced by junk; the
call may succeed (some junk is valid) or raise a ``DurkvError``; nothing else.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durkv
from durkv import ConfigError, DurkvError

JUNK = [None, 0, 3, -1, 2**70, -(2**70), 1.5, float("nan"), True, "", "2", "\ud800",
        "a\0b", b"x", ["a"], [1], [(1,)], ("a", 1), {"a": 1}, {1: 2}, object(), set()]


def _run(fn):
    """Call, consuming an iterator; only DurkvError may escape."""
    try:
        out = fn()
        if hasattr(out, "__next__"):
            list(out)
    except DurkvError:
        pass


def _seeded(url="memory://"):
    s = durkv.open(url)
    s.put("t", "", "c1", checkpoint={}, metadata={"run_id": "r"}, values={"a": [1]},
          versions={"a": 1})
    s.put_writes("t", "", "c1", "task", [(0, "a", 1)])
    return s


STORE_CALLS = {
    "put": (("t", "", "c2"), dict(checkpoint={}, metadata={}, values={"a": [1, 2]},
                                   versions={"a": 2}, parent_id="c1", durability=None,
                                   all_values=None)),
    "put_writes": (("t", "", "c1", "task2", [(0, "a", 1)]), dict(task_path="",
                                                                  durability=None)),
    "get": (("t", "", "c1"), {}),
    "history": (("t", ""), dict(before=None, limit=None, filter=None)),
    "channel_entries": (("t", "", "a"), dict(before=None, limit=None)),
    "namespaces": (("t",), {}),
    "delete_runs": ((["r"],), {}),
    "prune": ((["t"],), dict(keep_last=1)),
    "delete_thread": (("t",), {}),
    "copy_thread": (("t", "u"), {}),
}


def _cases(calls):
    for name, (args, kw) in calls.items():
        for i in range(len(args)):
            yield name, i
        for k in kw:
            yield name, k


@pytest.mark.parametrize("name,slot", list(_cases(STORE_CALLS)))
def test_store_methods_raise_only_durkv_errors(name, slot):
    args, kw = STORE_CALLS[name]
    for junk in JUNK:
        with _seeded() as s:
            a, k = list(args), dict(kw)
            if isinstance(slot, int):
                a[slot] = junk
            else:
                k[slot] = junk
            _run(lambda: getattr(s, name)(*a, **k))


OPEN_OPTIONS = dict(durability="sync", read_only=False, serde=None, snapshot_every=64,
                    compress_min_bytes=1024, segment_bytes=None, flush_interval_ms=10,
                    recovery="tolerate_tail", max_commit_bytes=1 << 20, delta_check="prefix",
                    index_every=100)


@pytest.mark.parametrize("option", ["url", *OPEN_OPTIONS])
def test_open_raises_only_durkv_errors(option, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)         # junk such as "2" is a relative path
    for i, junk in enumerate(JUNK):
        kw = dict(OPEN_OPTIONS)
        url = str(tmp_path / f"s{i}")
        if option == "url":
            url = junk
        else:
            kw[option] = junk
        try:
            durkv.open(url, **kw).close()
        except DurkvError:
            pass


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(sorted(STORE_CALLS)), data=st.data())
def test_store_methods_with_random_junk(name, data):
    junk = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(),
                     st.binary(), st.lists(st.integers(), max_size=3),
                     st.lists(st.tuples(st.integers(), st.text(), st.integers()), max_size=2),
                     st.dictionaries(st.one_of(st.text(), st.integers()), st.integers(),
                                     max_size=2))
    args, kw = STORE_CALLS[name]
    a = [data.draw(st.one_of(st.just(x), junk)) for x in args]
    k = {key: data.draw(st.one_of(st.just(v), junk)) for key, v in kw.items()}
    with _seeded() as s:
        _run(lambda: getattr(s, name)(*a, **k))


def test_the_reported_cases(tmp_path):
    with _seeded() as s:
        for call in (lambda: s.get("t", "", 3), lambda: list(s.history("t", limit="2")),
                     lambda: s.put_writes("t", "", "c1", "task", [1]),
                     lambda: s.put_writes("t", "", "c1", "task", [(2**70, "a", 1)]),
                     lambda: s.put_writes("t", "", "c1", "\ud800", [(0, "a", 1)])):
            with pytest.raises(ConfigError):
                call()
        with pytest.raises(ConfigError):
            s.history("t", limit="2")          # at the call, not at the first next()
        s.put("t", "", "c9", checkpoint={}, metadata=5, values={}, versions={})
        assert [c.checkpoint_id for c in s.history("t", filter={"run_id": "r"})] == ["c1"]
    with pytest.raises(ConfigError, match="segment_bytes"):
        durkv.open(str(tmp_path / "x"), segment_bytes="4096")


def test_a_bare_string_is_one_run_id():
    with durkv.open("memory://") as s:
        for i, run in enumerate(("r", "u", "n", "run-1")):
            s.put("t", "", f"c{i}", checkpoint={}, metadata={"run_id": run}, values={},
                  versions={})
        s.delete_runs("run-1")
        assert [c.checkpoint_id for c in s.history("t")] == ["c2", "c1", "c0"]
        s.prune("t", keep_last=1)
        assert [c.checkpoint_id for c in s.history("t")] == ["c2"]


def test_bad_channel_names_and_versions_are_refused_and_ls_still_works(tmp_path):
    path = str(tmp_path / "s")
    with durkv.open(path) as s:
        s.put("t", "", "c1", checkpoint={}, metadata={}, values={"a": 1}, versions={"a": 1})
        for values, versions in (({1: "x"}, {1: 1}), ({}, {("a",): 1}), ({"a": 1}, {"a": [1]}),
                                 ({"a": 1}, {"a": {"x": 1}}), ({"a": 1}, {"a": None}),
                                 ({"a": 1}, {"a": 2**70}), ({"\ud800": 1}, {"\ud800": 1})):
            with pytest.raises(ConfigError):
                s.put("t", "", "c2", checkpoint={}, metadata={}, values=values,
                      versions=versions)
    from click.testing import CliRunner

    from durkv.cli import cli

    result = CliRunner().invoke(cli, ["ls", path])
    assert result.exit_code == 0, result.output


def test_a_path_with_a_nul_is_refused(tmp_path):
    base = str(tmp_path / "d3")
    for url in (base + "\0A", base + "\0B", "file://" + base + "\0A"):
        with pytest.raises(ConfigError, match="NUL"):
            durkv.open(url)
        with pytest.raises(ValueError):          # as os refuses it
            durkv.open(url)
    assert not os.path.exists(base)
    with pytest.raises(ValueError):
        os.open(base + "\0A", os.O_RDONLY)


# ---- DurkvSaver ----------------------------------------------------------------------------

pytest.importorskip("langgraph")
from durkv.langgraph import DurkvSaver  # noqa: E402


def _cfg(cid=None):
    conf = {"thread_id": "t", "checkpoint_ns": ""}
    if cid:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def _ckpt(cid):
    return {"v": 4, "id": cid, "ts": "2026-01-01T00:00:00+00:00",
            "channel_values": {"a": [1]}, "channel_versions": {"a": 1}, "versions_seen": {}}


SAVER_CALLS = {
    "put": ((_cfg(), _ckpt("c2"), {"source": "loop", "step": 1}, {"a": 1}), {}),
    "put_writes": ((_cfg("c1"), [("a", 1)], "task"), dict(task_path="")),
    "get_tuple": ((_cfg("c1"),), {}),
    "list": ((_cfg(),), dict(filter=None, before=None, limit=None)),
    "delete_thread": (("t",), {}),
    "delete_for_runs": ((["r"],), {}),
    "copy_thread": (("t", "u"), {}),
    "prune": ((["t"],), dict(strategy="keep_latest")),
    "get_next_version": ((1, None), {}),
    "get_delta_channel_history": ((), dict(config=_cfg("c1"), channels=["a"])),
}


@pytest.mark.parametrize("name,slot", list(_cases(SAVER_CALLS)))
def test_saver_methods_raise_only_durkv_errors(name, slot):
    args, kw = SAVER_CALLS[name]
    configs = [{"configurable": c} for c in (None, [], {"x": 1}, {"thread_id": 3},
                                                {"thread_id": "\ud800"},
                                                {"thread_id": "t", "checkpoint_ns": 5},
                                                {"thread_id": "t", "checkpoint_id": 7})]
    for junk in [*JUNK, *configs]:
        with DurkvSaver.open("memory://") as saver:
            saver.put(_cfg(), _ckpt("c1"), {"run_id": "r"}, {"a": 1})
            a, k = list(args), dict(kw)
            if isinstance(slot, int):
                a[slot] = junk
            else:
                k[slot] = junk
            _run(lambda: getattr(saver, name)(*a, **k))


def test_saver_delete_for_runs_takes_a_bare_string_as_one_run():
    with DurkvSaver.open("memory://") as saver:
        for i, run in enumerate(("r", "u", "n", "run-1")):
            saver.put(_cfg(), _ckpt(f"c{i}"), {"run_id": run}, {"a": 1})
        saver.delete_for_runs("run-1")
        assert [t.checkpoint["id"] for t in saver.list(_cfg())] == ["c2", "c1", "c0"]


def test_delete_runs_passes_over_a_run_id_that_is_not_text():
    """A put accepts any metadata; a list as `run_id` made every later delete_runs of the
    store fail with a raw TypeError (unhashable), deleting nothing."""
    with durkv.open("memory://") as s:
        s.put("a", "", "1", checkpoint={}, metadata={"run_id": "r1"}, values={}, versions={})
        s.put("b", "", "1", checkpoint={}, metadata={"run_id": ["batch", 7]}, values={},
              versions={})
        s.delete_runs(["r1"])
        assert s.get("a") is None and s.get("b") is not None


def test_a_serde_whose_dumps_returns_str_is_refused_at_open():
    import json

    class JsonSerde:
        def dumps(self, o):
            return json.dumps(o)

        def loads(self, b):
            return json.loads(b)

    with pytest.raises(ConfigError, match=r"must return bytes, got str.*\.encode\(\)"):
        durkv.open("memory://", serde=JsonSerde())


def test_an_unknown_open_option_is_named_with_the_closest_one():
    with pytest.raises(ConfigError, match="no option 'durabilty'; did you mean 'durability'"):
        durkv.open("memory://", durabilty="async")
    with pytest.raises(ConfigError, match="read_only must be True or False"):
        durkv.open("memory://", read_only=None)
    for option in ("snapshot_every", "compress_min_bytes", "max_commit_bytes"):
        with pytest.raises(ConfigError, match=option):      # True is no count
            durkv.open("memory://", **{option: True})


def test_a_negative_limit_is_refused_not_an_empty_listing():
    with durkv.open("memory://") as s:
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"m": [1]}, versions={"m": 1})
        for call in (lambda: s.history("t", limit=-1),
                     lambda: s.channel_entries("t", "", "m", limit=-1)):
            with pytest.raises(ConfigError, match="limit must be >= 0"):
                call()
        assert len(list(s.history("t", limit=0))) == 0


def test_a_lone_surrogate_in_a_version_or_channel_name_is_a_config_error(tmp_path):
    """They were a SerializationError about 'the head of checkpoint 1' (a version, a
    channel only in values) instead of a ConfigError naming the argument."""
    with durkv.open(str(tmp_path / "s")) as s:
        for values, versions, says in (({}, {"a": "v\ud800"}, "version of channel 'a'"),
                                       ({"\udc00": 1}, {}, "channel name"),
                                       ({"\udc00": 1}, {"\udc00": 1}, "channel name")):
            with pytest.raises(ConfigError, match=f"{says}.*lone surrogate"):
                s.put("t", "", "1", checkpoint={}, metadata={}, values=values,
                      versions=versions)
        assert s.get("t") is None
        s.put("t", "", "1", checkpoint={}, metadata={}, values={"ü": 1}, versions={"ü": "é"})
        assert s.get("t").values == {"ü": 1} and s.get("t").versions == {"ü": "é"}


def test_a_saver_reading_a_thread_another_serde_wrote_says_so(tmp_path):
    """DurkvSaver on a thread written by durkv.open's default serde raised a raw
    ValueError ('not a LangGraphSerde value')."""
    pytest.importorskip("langgraph")
    from durkv.errors import SerializationError
    from durkv.langgraph import DurkvSaver

    path = str(tmp_path / "s")
    cid = "1ef00000-0000-6000-8000-000000000001"
    with durkv.open(path) as s:
        s.put("t", "", cid, checkpoint={"v": 1, "id": cid, "ts": "", "channel_versions": {},
                                        "versions_seen": {}},
              metadata={}, values={"a": 1}, versions={"a": 1})
    with DurkvSaver.open(path, read_only=True) as saver:
        with pytest.raises(SerializationError, match="another serde.*durkv.open"):
            saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
