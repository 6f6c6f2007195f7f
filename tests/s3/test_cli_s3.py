"""``durkv archive`` / ``durkv restore`` on the command line: output, exit codes, and no
credential in any output line (run as real processes, with and without --debug)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from durkv.cli.main import cli

from .conftest import ACCESS_KEY, SECRET
from .storetools import make_store


def durkv_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "durkv.cli", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=60)


def assert_no_secret(proc: subprocess.CompletedProcess) -> None:
    for line in (proc.stdout + proc.stderr).splitlines():
        assert SECRET not in line and ACCESS_KEY not in line, line


def test_archive_then_restore_json(tmp_path, s3_env, bucket):
    path = make_store(tmp_path / "a.durkv", 12)
    url = f"s3://{bucket}/cli"
    runner = CliRunner()
    r = runner.invoke(cli, ["archive", "--json", path, url])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["manifest_no"] == 0
    r = runner.invoke(cli, ["archive", path, url])
    assert r.exit_code == 0 and "no new segment; manifest 0 is current" in r.stdout
    r = runner.invoke(cli, ["restore", "--dry-run", url, str(tmp_path / "r.durkv")])
    assert r.exit_code == 0 and r.stdout.startswith("dry run: would restore")
    assert not (tmp_path / "r.durkv").exists()
    r = runner.invoke(cli, ["restore", "--json", "--to-lsn", "5", url, str(tmp_path / "r.durkv")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["next_lsn"] == 6 and doc["verify"]["ok"]
    r = runner.invoke(cli, ["verify", str(tmp_path / "r.durkv")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["restore", "--json", "--dry-run", "--to-time",
                            "2100-01-01T00:00:00Z", url, str(tmp_path / "t.durkv")])
    assert r.exit_code == 0 and json.loads(r.stdout)["next_lsn"] == 12
    r = runner.invoke(cli, ["restore", "--to-time", "yesterday", url, str(tmp_path / "t")])
    assert r.exit_code == 2 and "ISO 8601" in r.stderr


def test_exit_codes_conflict_damage_and_usage(tmp_path, s3_env, s3, bucket):
    url = f"s3://{bucket}/cli"
    runner = CliRunner()
    assert runner.invoke(cli, ["archive", make_store(tmp_path / "a.durkv", 6), url]).exit_code == 0
    r = runner.invoke(cli, ["archive", make_store(tmp_path / "b.durkv", 6), url])
    assert r.exit_code == 1 and "error: " in r.stderr and "archive of log" in r.stderr
    key = "cli/segments/00000000000000000000.seg"
    s3.put_object(Bucket=bucket, Key=key, Body=b"DKVSEG")
    r = runner.invoke(cli, ["restore", url, str(tmp_path / "r.durkv")])
    assert r.exit_code == 3 and key in r.stderr and not (tmp_path / "r.durkv").exists()
    r = runner.invoke(cli, ["restore", "--to-lsn", "1", "--to-time", "0", url, str(tmp_path / "x")])
    assert r.exit_code == 2
    r = runner.invoke(cli, ["archive", str(tmp_path / "a.durkv"), "http://not-s3"])
    assert r.exit_code == 2 and "s3://BUCKET/PREFIX" in r.stderr


def test_no_such_bucket_is_one_line_and_no_secret_is_printed(tmp_path, s3_env):
    path = make_store(tmp_path / "a.durkv", 3)
    for debug in ([], ["--debug"]):
        proc = durkv_cli(*debug, "archive", path, "s3://durkv-no-such-bucket/p")
        assert proc.returncode == 1
        assert_no_secret(proc)
        if not debug:
            assert proc.stderr.splitlines() == [
                f"error: bucket 'durkv-no-such-bucket' does not exist at "
                f"{s3_env['AWS_ENDPOINT_URL']}; create it or fix the URL"]


class _Scripted(BaseHTTPRequestHandler):
    """Answers each request with the next status of ``script`` (the last one repeats)."""

    script: list[int] = []
    seen: list[str] = []

    def _answer(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        status = self.script[min(len(self.seen), len(self.script)) - 1]
        code = {403: "AccessDenied", 503: "SlowDown", 500: "InternalError"}[status]
        body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                f"<Message>{code}</Message></Error>").encode()
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def scripted_s3():
    """An HTTP endpoint on 127.0.0.1 that answers what the test scripts."""
    _Scripted.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield _Scripted, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_throttling_is_retried_and_403_is_one_line(tmp_path, s3_env, scripted_s3):
    handler, endpoint = scripted_s3
    handler.script = [503, 403]
    for debug in ([], ["--debug"]):
        handler.seen.clear()
        proc = durkv_cli(*debug, "restore", "--endpoint-url", endpoint, "s3://bkt/p",
                         str(tmp_path / "r.durkv"))
        assert proc.returncode == 1
        assert_no_secret(proc)
        # the 503 was retried once (botocore standard mode), the 403 was not
        assert len(handler.seen) == 2 and handler.seen[0] == handler.seen[1]
        if not debug:
            lines = proc.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith(
                f"error: access denied to s3://bkt/p (list p/manifests/) by {endpoint}")
    assert not (tmp_path / "r.durkv").exists()


def test_archive_seal_of_a_store_held_by_a_writer_seals_alongside_it(tmp_path, s3_env, bucket):
    import durkv

    path = make_store(tmp_path / "a.durkv", 4)
    runner = CliRunner()
    with durkv.open(path) as s:
        # a local store takes several writers (FORMAT.md 12): the seal is one more section
        r = runner.invoke(cli, ["archive", "--seal", path, f"s3://{bucket}/p"])
        assert r.exit_code == 0, r.output
        s.put("t", "", "z", checkpoint={}, metadata={}, values={"a": 1}, versions={"a": 1})
        assert s.get("t").values == {"a": 1}         # the writer goes on after the seal
        r = runner.invoke(cli, ["archive", path, f"s3://{bucket}/p"])   # no lock needed
        assert r.exit_code == 0, r.output


def test_archive_without_seal_into_another_logs_prefix_is_refused(tmp_path, s3_env, s3, bucket):
    # B has nothing sealed: the prefix's log is compared with its active segment's, and
    # A's manifest is never reported as B's archive
    url = f"s3://{bucket}/shared"
    a = make_store(tmp_path / "a.durkv", 12)
    b = make_store(tmp_path / "b.durkv", 1, segment_bytes=1 << 20, seal=False)
    runner = CliRunner()
    assert runner.invoke(cli, ["archive", a, url]).exit_code == 0
    before = s3.list_objects_v2(Bucket=bucket)["KeyCount"]
    for seal in ([], ["--seal"]):
        r = runner.invoke(cli, ["archive", *seal, b, url])
        assert r.exit_code == 1 and r.stdout == "", r.output
        assert r.stderr.splitlines() == [r.stderr.strip()]
        assert "holds the archive of log" in r.stderr
        assert r.stderr.rstrip().endswith("archive it to another prefix")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == before
    # A with nothing new sealed still finds its own archive current
    r = runner.invoke(cli, ["archive", a, url])
    assert r.exit_code == 0 and "manifest 0 is current" in r.stdout, r.output


@pytest.mark.parametrize("when", ["inf", "1e400", "-inf", "nan", "1e12"])
def test_restore_to_a_time_out_of_range_is_one_line_and_exit_2(tmp_path, s3_env, when):
    # inf and 1e400 were an OverflowError traceback
    for dry in ([], ["--dry-run"]):
        r = CliRunner().invoke(cli, ["restore", *dry, "--to-time", when, "s3://b/p",
                                     str(tmp_path / "r")])
        assert r.exit_code == 2 and r.stdout == "", r.output
        assert r.stderr.splitlines() == [
            f"error: time {when!r} is out of range: give seconds since the epoch up to "
            "253402300799 (year 9999), or ISO 8601 (2026-11-30T18:00:00Z)"]
    assert not (tmp_path / "r").exists()


def test_an_archive_prefix_read_as_a_live_store_and_a_damaged_object_give_the_right_advice(
        tmp_path, s3_env, s3, bucket):
    url = f"s3://{bucket}/arch"
    runner = CliRunner()
    assert runner.invoke(cli, ["archive", make_store(tmp_path / "a.durkv", 6), url]
                         ).exit_code == 0
    # stats said "open it for writing first", which would make a live store beside it
    r = runner.invoke(cli, ["stats", url])
    assert r.exit_code == 1 and r.stderr.splitlines() == [
        f"error: {url} holds a durkv archive, not a live store: restore it into a local "
        f"directory (durkv restore {url} ./DIR) and use ./DIR"]
    r = runner.invoke(cli, ["stats", f"s3://{bucket}/empty"])
    assert r.exit_code == 1 and "open it for writing first" in r.stderr
    # a damaged object: the hint was to verify/recover a local PATH
    key = "arch/segments/00000000000000000000.seg"
    s3.put_object(Bucket=bucket, Key=key, Body=b"DKVSEG")
    r = runner.invoke(cli, ["restore", url, str(tmp_path / "new" / "r")])
    lines = r.stderr.splitlines()
    assert r.exit_code == 3 and len(lines) == 2 and key in lines[0], r.output
    assert lines[1].startswith("Try: restore an earlier point, before the damaged object")
    assert not (tmp_path / "new").exists()      # nor the parent the restore made
