"""The ``durkv`` command line, through click's CliRunner (``--json`` output is parsed).

Logs are built with the real segment log and damaged with ``logtools`` byte
surgery, so these tests check what a user sees for each state of a log:
the output, the exit code (0 ok, 1 operational, 2 usage, 3 corruption) and
that the files changed exactly as promised.
"""

from __future__ import annotations

import json
import os

import click
import durkv
import logtools as lt
import pytest
from click.testing import CliRunner
from durkv import errors
from durkv.cli import cli
from durkv.cli.output import EXIT_CODES, exit_code_for
from durkv.log import SegmentLog


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False)

    return invoke


@pytest.fixture
def clean_log(tmp_path):
    """8 frames in two sealed segments, then 2 in the active one."""
    d = tmp_path / "agent.durkv"
    lt.make_log(d, 8, size=40, per_segment=4, seal=True, tail=2)
    return d


def _json(result) -> dict:
    return json.loads(result.stdout)  # stdout must hold exactly one JSON document


def _tear_tail(d) -> lt.Frame:
    """Cut the last frame of the active segment short, as a crash mid-write would."""
    act = lt.segments(d)[-1]
    last = act.frames[-1]
    lt.truncate(act.path, last.end - 4)
    return last


def _flip_mid_log(d) -> tuple[lt.Segment, lt.Frame]:
    """Flip a payload bit of a frame in the first sealed segment (valid frames follow it)."""
    seg = lt.segments(d)[0]
    frame = seg.frames[1]
    lt.flip_byte(seg.path, frame.offset + lt.FRAME_HDR + 5)
    return seg, frame


# ---- help, version, usage ------------------------------------------------------------------


def test_every_command_has_help_and_an_example(run):
    assert cli.commands, "no commands registered"
    for name, cmd in cli.commands.items():
        if cmd.hidden:
            continue
        assert cmd.get_short_help_str().strip(), f"durkv {name} has no summary line"
        result = run(name, "--help")
        assert result.exit_code == 0, (name, result.output)
        assert "Example:" in result.output, f"durkv {name} --help has no Example: block"
        assert f"durkv {name}" in result.output.split("Example:", 1)[1], name


# Commands that need no --json, each with why (a command that lists things has one).
NO_JSON: dict[str, str] = {}
# Commands not run by the walk below, each with why; their own tests parse their --json.
NOT_RUN = {
    "demo": "runs an agent for a minute",
    "bench": "times the machine for a minute (tests/test_cli_bench.py runs --quick --json)",
}


def _has_json(cmd) -> bool:
    return any("--json" in p.opts for p in cmd.params)


def test_every_command_has_json_output(run):
    """Every registered command, those added later included, takes --json, or says in
    NO_JSON why it does not."""
    lacking = sorted(n for n, c in cli.commands.items()
                     if not c.hidden and not _has_json(c) and n not in NO_JSON)
    assert not lacking, f"commands without --json (add it, or a reason in NO_JSON): {lacking}"


def _args_for(cmd, store, tmp_path) -> list[str]:
    """The command's required arguments: the store for STORE/PATH, a new path for DEST,
    a plain word for the rest (a run, a step, a URL that is not s3:// and so never
    reaches the network)."""
    args = []
    for p in cmd.params:
        if isinstance(p, click.Argument) and p.required:
            name = p.name.lower()
            args.append(str(store) if name in ("store", "path") else
                        str(tmp_path / "dest") if name in ("dest", "dir", "directory") else "x")
    return args


@pytest.fixture
def journal_store(tmp_path):
    """A store with checkpoints, pending writes and a run journal."""
    d = tmp_path / "agent.durkv"
    with durkv.open(str(d)) as s:
        for i in range(3):
            s.put("t", "", f"{i:04d}", checkpoint={}, metadata={"step": i},
                  values={"msgs": ["m"] * (i + 1)}, versions={"msgs": i})
            s.put_writes("t", "", f"{i:04d}", "task", [(0, "out", i)])
        s.append_journal("r1", {"e": 1, "t": 0.0}, durable=True)
    return d


def test_json_output_is_one_json_document_for_every_command(run, journal_store, tmp_path,
                                                            monkeypatch):
    """Every registered command with --json, on a store and on a path with no store (and
    with a usage error): stdout holds exactly one JSON document, an error one carrying
    the exit code; nothing else, ever."""
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):   # nothing may leave the host
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    ran = []
    for name, cmd in sorted(cli.commands.items()):
        if cmd.hidden or name in NOT_RUN or not _has_json(cmd):
            continue
        for store in (journal_store, tmp_path / "no-store-here"):
            args = [name, "--json", *_args_for(cmd, store, tmp_path)]
            result = run(*args)
            try:
                doc = json.loads(result.stdout)
            except ValueError:
                pytest.fail(f"durkv {' '.join(args)} printed not one JSON document on stdout "
                            f"(exit {result.exit_code}): {result.stdout[:500]!r}")
            if result.exit_code != 0:
                assert isinstance(doc, dict) and doc.get("exit_code") == result.exit_code, \
                    (args, doc)
                assert "Traceback" not in result.output, args
        usage = run(name, "--json", "--no-such-option")
        assert usage.exit_code == 2
        assert json.loads(usage.stdout) == {"error": "usage", "exit_code": 2,
                                            "message": "No such option '--no-such-option'."}
        ran.append(name)
    assert {"verify", "recover", "compact", "stats", "ls"} <= set(ran), ran


def test_group_help_and_version(run):
    for flag in ("-h", "--help"):
        result = run(flag)
        assert result.exit_code == 0
        for name in cli.commands:
            assert name in result.output
    result = run("--version")
    assert result.exit_code == 0 and "durkv" in result.output


def test_usage_errors_exit_2(run, clean_log):
    assert run("verify").exit_code == 2                       # missing PATH
    assert run("verify", clean_log, "--no-such-option").exit_code == 2
    assert run("no-such-command").exit_code == 2


def test_exit_codes_are_mapped_in_one_place():
    expect = {
        errors.CorruptionError("x"): 3, errors.ConfigError("x"): 2,
        errors.FrameTooLargeError("x"): 2, errors.StoreLockedError("x"): 1,
        errors.FencedError("x"): 1, errors.LogFailedError("x"): 1, errors.BackendError("x"): 1,
        errors.NotFoundError("x"): 1, errors.DurkvError("x"): 1, OSError(5, "EIO"): 1,
        errors.StoreClosedError("x"): 1,
    }
    for exc, code in expect.items():
        assert exit_code_for(exc) == code, type(exc).__name__
    assert all(issubclass(cls, BaseException) for cls, _ in EXIT_CODES)


# ---- verify -----------------------------------------------------------------------------------


def test_verify_clean_log(run, clean_log):
    result = run("verify", clean_log)
    assert result.exit_code == 0, result.output
    for seg in lt.segment_files(clean_log):
        assert seg.name in result.stdout
    assert "sealed" in result.stdout and "active" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("ok:")

    rep = _json(run("verify", "--json", clean_log))
    assert rep["ok"] is True
    assert rep["frames_ok"] == 10 and rep["next_lsn"] == 10
    assert len(rep["segments"]) == 3 and rep["damage"] == []

    quiet = run("verify", "-q", clean_log)
    assert quiet.exit_code == 0 and quiet.output == ""


def test_verify_deep(run, clean_log):
    result = run("verify", "--deep", "--json", clean_log)
    assert result.exit_code == 0, result.output
    assert _json(result)["ok"] is True


def test_verify_flipped_byte_names_segment_and_offset(run, clean_log):
    seg, frame = _flip_mid_log(clean_log)
    result = run("verify", "--json", clean_log)
    assert result.exit_code == 3
    rep = _json(result)
    assert rep["ok"] is False
    first = rep["damage"][0]
    assert first["segment"] == seg.name and first["offset"] == frame.offset
    assert first["kind"] != "torn_tail"

    human = run("verify", clean_log)
    assert human.exit_code == 3
    assert f"{seg.name} offset {frame.offset}" in human.stdout
    assert "DAMAGED" in human.stdout
    assert "Try: durkv recover --skip-corrupt" in human.stderr


def test_verify_torn_tail_is_reported(run, clean_log):
    last = _tear_tail(clean_log)
    result = run("verify", "--json", clean_log)
    assert result.exit_code == 3
    kinds = [d["kind"] for d in _json(result)["damage"]]
    assert kinds == ["torn_tail"], kinds
    assert _json(result)["damage"][0]["offset"] == last.offset
    assert "Try: durkv recover " in run("verify", clean_log).stderr


def test_verify_reads_while_a_writer_holds_the_lock(run, tmp_path):
    d = tmp_path / "live.durkv"
    with SegmentLog.open(str(d), durability="sync") as log:
        for i in range(5):
            log.append(lt.payload(i))
        result = run("verify", "--json", d)
        assert result.exit_code == 0, result.output
        assert _json(result)["frames_ok"] == 5


# ---- missing path, locked store, --debug -------------------------------------------------------


@pytest.mark.parametrize("what", ["missing", "file", "empty_dir"])
def test_no_log_at_path_is_one_error_line(run, tmp_path, what):
    p = tmp_path / "nothing"
    if what == "file":
        p.write_text("not a log")
    elif what == "empty_dir":
        p.mkdir()
    for cmd in ("verify", "recover"):
        result = run(cmd, p)
        assert result.exit_code == 1, result.output
        assert result.stdout == ""
        assert result.stderr.splitlines() == [result.stderr.strip()]
        assert result.stderr.startswith(f"error: no durkv log at {p}")
    if what == "missing":
        assert not p.exists(), "a read command created the directory"


@pytest.mark.parametrize("cmd", [["ls"], ["show"], ["history"], ["verify"], ["recover"],
                                 ["show", "--json"]])
def test_an_s3_url_where_a_local_store_goes_says_to_restore_it_first(run, tmp_path,
                                                                    monkeypatch, cmd):
    # click's Path made it "s3:/b/p", reported as a missing directory
    monkeypatch.chdir(tmp_path)
    args = [*cmd, "s3://b/agents/p"] + (["t"] if cmd[0] in ("show", "history") else [])
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        f"error: s3://b/agents/p is on S3, and durkv {cmd[0]} reads a local store directory: "
        f"restore it into one first (durkv restore s3://b/agents/p ./DIR), then "
        f"durkv {cmd[0]} ./DIR"]
    if "--json" in cmd:
        assert _json(result)["error"] == "config"
    assert os.listdir(tmp_path) == []


def test_error_under_json_is_json_on_stdout(run, tmp_path):
    result = run("verify", "--json", tmp_path / "nothing")
    assert result.exit_code == 1
    err = _json(result)
    assert err["error"] == "not_found" and err["exit_code"] == 1
    assert result.stderr.startswith("error: ")


def test_recover_on_a_locked_store_is_one_line_exit_1(run, tmp_path):
    d = tmp_path / "locked.durkv"
    with SegmentLog.open(str(d), durability="sync") as log:
        log.append(b"x")
        before = lt.snapshot(d)
        for args in ((), ("--skip-corrupt",)):
            result = run("recover", *args, d)
            assert result.exit_code == 1, (args, result.output)
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), lines
            assert "Traceback" not in result.output
            # the holder by its pid (writers share LOCK and write none into it: "pid ?")
            assert f"locked by pid {os.getpid()};" in lines[0], lines
        assert run("recover", "--dry-run", d).exit_code == 0   # a plan reads, without the lock
        assert lt.snapshot(d) == before


def test_debug_shows_the_exception(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["--debug", "verify", str(tmp_path / "nothing")])
    assert isinstance(result.exception, errors.NotFoundError)
    plain = runner.invoke(cli, ["verify", str(tmp_path / "nothing")])
    assert plain.exit_code == 1 and not isinstance(plain.exception, errors.DurkvError)


# ---- recover ----------------------------------------------------------------------------------


def test_recover_torn_tail_quarantines_then_is_a_noop(run, clean_log):
    last = _tear_tail(clean_log)
    total = lt.total_bytes(clean_log)
    result = run("recover", clean_log)
    assert result.exit_code == 0, result.output
    assert "torn_tail" in result.stdout and "quarantine" in result.stdout
    q = lt.quarantine_files(clean_log)
    assert len(q) == 1 and str(last.offset) in q[0].name
    assert lt.total_bytes(clean_log) >= total, "recover dropped bytes without a copy"
    assert run("verify", clean_log).exit_code == 0

    after = lt.snapshot(clean_log)
    again = run("recover", "--json", clean_log)
    assert again.exit_code == 0
    rep = _json(again)
    assert rep["ok"] is True and rep["report"]["damage"] == [] and rep["quarantined"] == []
    assert "nothing to recover" in run("recover", clean_log).stdout
    assert lt.snapshot(clean_log) == after, "second recover changed bytes"


def test_recover_dry_run_changes_nothing(run, clean_log):
    _tear_tail(clean_log)
    before = lt.snapshot(clean_log)
    result = run("recover", "--dry-run", clean_log)
    assert result.exit_code == 0, result.output
    assert "would remove" in result.stdout and "torn_tail" in result.stdout
    rep = _json(run("recover", "--dry-run", "--json", clean_log))
    assert rep["dry_run"] is True and rep["after"] is None
    assert [d["kind"] for d in rep["report"]["damage"]] == ["torn_tail"]
    assert lt.snapshot(clean_log) == before
    assert not (clean_log / "quarantine").exists() or not lt.quarantine_files(clean_log)


def test_recover_tells_the_operator_of_a_killed_writers_leftover_files(run, clean_log):
    """A writer killed mid-roll can leave <segment>.tmp / HEAD.tmp (FORMAT.md 1): no frame
    in them, no reader lists them. recover removes them and says so; --dry-run only says."""
    leftovers = [clean_log / "00000000000000aa.seg.tmp", clean_log / "HEAD.tmp"]
    for p in leftovers:
        p.write_bytes(b"DKVSEG01" + bytes(56))
    plan = run("recover", "--dry-run", clean_log)
    assert plan.exit_code == 0, plan.output
    assert "would remove: 2 file(s) a writer killed mid-roll left" in plan.stdout
    assert "nothing to recover" not in plan.stdout
    assert all(p.exists() for p in leftovers)
    assert _json(run("recover", "--dry-run", "--json", clean_log))["report"]["transients"] == 2
    done = run("recover", "--json", clean_log)
    assert done.exit_code == 0 and _json(done)["report"]["transients"] == 2
    assert not any(p.exists() for p in leftovers)
    assert run("verify", clean_log).exit_code == 0
    again = run("recover", clean_log)
    assert "nothing to recover" in again.stdout and "file(s)" not in again.stdout


def test_recover_refuses_mid_log_corruption_then_skip_corrupt(run, clean_log):
    seg, frame = _flip_mid_log(clean_log)
    before = lt.snapshot(clean_log)

    refused = run("recover", clean_log)
    assert refused.exit_code == 3, refused.output
    assert f"Try: durkv recover --skip-corrupt {clean_log}" in refused.stderr
    assert "quarantine/" in refused.stderr
    assert "Traceback" not in refused.output
    assert run("recover", "--dry-run", clean_log).exit_code == 3
    assert lt.snapshot(clean_log) == before, "a refused recover changed bytes"

    plan = run("recover", "--skip-corrupt", "--dry-run", "--json", clean_log)
    assert plan.exit_code == 0, plan.output
    assert _json(plan)["report"]["damage"][0]["segment"] == seg.name
    assert lt.snapshot(clean_log) == before, "--dry-run changed bytes"

    total = lt.total_bytes(clean_log)
    result = run("recover", "--skip-corrupt", "--json", clean_log)
    assert result.exit_code == 0, result.output
    rep = _json(result)
    assert rep["ok"] is True and rep["after"]["ok"] is True
    assert rep["report"]["damage"][0]["segment"] == seg.name
    assert rep["quarantined"], "no copy of the removed bytes"
    assert lt.quarantine_files(clean_log)
    assert lt.total_bytes(clean_log) >= total
    assert run("verify", clean_log).exit_code == 0
    with SegmentLog.open(str(clean_log), durability="sync") as log:
        assert log.next_lsn >= frame.lsn


# ---- ls, history, show ----------------------------------------------------------------------


@pytest.fixture
def store_path(tmp_path):
    import durkv

    d = tmp_path / "store.durkv"
    with durkv.open(str(d)) as store:
        msgs: list[str] = []
        for i in range(1, 6):
            msgs = msgs + [f"m{i}"]
            store.put("t1", "", f"{i:04d}", checkpoint={}, metadata={"step": i},
                      values={"msgs": msgs}, versions={"msgs": i},
                      parent_id=f"{i - 1:04d}" if i > 1 else None)
        store.put("t2", "sub", "0001", checkpoint={}, metadata={}, values={"x": 1},
                  versions={"x": 1})
    return d


def test_ls(run, store_path):
    result = run("ls", store_path)
    assert result.exit_code == 0, result.output
    assert "t1" in result.stdout and "0005" in result.stdout and "sub" in result.stdout
    threads = _json(run("ls", "--json", store_path))["threads"]
    assert [(t["thread_id"], t["checkpoint_ns"], t["checkpoint_id"]) for t in threads] == \
        [("t1", "", "0005"), ("t2", "sub", "0001")]
    assert threads[0]["channels"] == ["msgs"]


def test_history_newest_first(run, store_path):
    rep = _json(run("history", "--json", store_path, "t1"))
    assert [c["checkpoint_id"] for c in rep["checkpoints"]] == ["0005", "0004", "0003", "0002",
                                                                 "0001"]
    two = _json(run("history", "--json", "-n", "2", store_path, "t1"))
    assert [c["checkpoint_id"] for c in two["checkpoints"]] == ["0005", "0004"]
    assert _json(run("history", "--json", "--ns", "sub", store_path, "t2"))["checkpoints"]
    human = run("history", store_path, "t1")
    assert human.exit_code == 0 and human.stdout.splitlines()[1].startswith("0005")


def test_show(run, store_path):
    latest = _json(run("show", "--json", store_path, "t1"))
    assert latest["checkpoint_id"] == "0005" and latest["values"]["msgs"] == [f"m{i}"
                                                                               for i in range(1, 6)]
    old = _json(run("show", "--json", store_path, "t1", "0002"))
    assert old["values"]["msgs"] == ["m1", "m2"] and old["parent_id"] == "0001"
    human = run("show", store_path, "t1")
    assert human.exit_code == 0 and "msgs: [5 items" in human.stdout


@pytest.mark.parametrize("args", [("show", "nobody"), ("show", "t1", "9999"),
                                  ("history", "nobody")])
def test_browse_unknown_thread_or_checkpoint(run, store_path, args):
    result = run(args[0], store_path, *args[1:])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no ") and len(result.stderr.splitlines()) == 1


# a LangGraph checkpoint as a saver is given it: the channel "msgs" holds ["hi"]
_LG_CHECKPOINT = {"v": 4, "id": "1ef0000000000001", "ts": "2026-01-01T00:00:00+00:00",
                  "channel_values": {"msgs": ["hi"]}, "channel_versions": {"msgs": 1},
                  "versions_seen": {}, "updated_channels": ["msgs"]}


def test_browse_reads_a_langgraph_store(run, tmp_path):
    from durkv.langgraph import DurkvSaver

    d = tmp_path / "lg.durkv"
    with DurkvSaver.open(str(d)) as saver:
        config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        checkpoint = _LG_CHECKPOINT
        saver.put(config, checkpoint, {"source": "input", "step": -1}, {"msgs": 1})
    shown = _json(run("show", "--json", d, "t1"))
    assert shown["values"]["msgs"] == ["hi"] and shown["metadata"]["step"] == -1
    forced = run("show", "--serde", "msgpack", d, "t1")
    assert forced.exit_code == 1 and "try --serde langgraph" in forced.stderr


def test_the_auto_serde_is_decided_by_a_thread_that_has_a_checkpoint(tmp_path):
    """A listing taken before a live writer deleted its first thread: that thread has no
    checkpoint to decode, so the next one decides (before: the msgpack serde was chosen
    for a LangGraph store, and ls/history/show failed on it)."""
    from durkv.cli.browse import _decodes
    from durkv.langgraph import DurkvSaver

    d = tmp_path / "lg.durkv"
    with DurkvSaver.open(str(d)) as saver:
        config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        checkpoint = _LG_CHECKPOINT
        saver.put(config, checkpoint, {"source": "input", "step": -1}, {"msgs": 1})
        saver.put({"configurable": {"thread_id": "t0", "checkpoint_ns": ""}}, checkpoint,
                  {"source": "input", "step": -1}, {"msgs": 1})
        saver.delete_thread("t0")
    with durkv.open(str(d), read_only=True) as store:
        class ListedBeforeTheDelete:
            def __getattr__(self, name):
                return getattr(store, name)

            def threads(self):
                return ["t0", *store.threads()]

            def namespaces(self, thread):
                return [""] if thread == "t0" else store.namespaces(thread)
        assert _decodes(ListedBeforeTheDelete()) is False   # t1 needs LangGraph's serde
        assert _decodes(store) is False


# ---- the README and CI agree -------------------------------------------------------------


def test_ci_runs_the_readme_test_command():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
    assert len(commands) == 2, commands
    assert commands[0] == "pip install -e . && durkv demo"
    install, test = (c.strip() for c in commands[1].split("&&"))
    ci = (root / ".ci" / "run").read_text()
    assert f"\n    {install}\n" in ci, f"CI does not install with {install!r}"
    assert f"pytest_nonempty {test}\n" in ci, f"CI does not run {test!r}"
