"""An S3 endpoint that stops answering mid-transfer: Ctrl-C stops ``durkv archive`` and
``durkv restore`` at once (the archive resumes, the restore leaves nothing), and without
Ctrl-C the client's timeouts end the command with one error line.

The stall is a loopback proxy in front of the session's moto server that holds every
request matching ``stall`` (method, path part) without answering, as a hung endpoint or a
partitioned network would, until the test ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from durkv.backends.s3 import client as s3client
from durkv.cli.main import cli

from .conftest import RelayProxy
from .storetools import make_store, sealed_files, segment_files

# Ctrl-C must stop the command within about a second; the bound leaves room for a loaded
# machine (the old code waited for botocore's retries: minutes).
CTRL_C_EXIT_S = 5.0


class _StallingProxy(RelayProxy):
    """Relays to ``upstream``; holds a request matching ``stall`` until ``release``."""

    stall: tuple[str, str] = ("", "")
    stalled: threading.Event
    release: threading.Event

    def _relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        method, part = self.stall
        if self.command == method and part in self.path:
            self.stalled.set()
            self.release.wait(120)
            self.close_connection = True        # no answer, ever
            return
        self._answer(*self._forward(body))


@pytest.fixture
def stalling(s3_server):
    handler = type("Stalling", (_StallingProxy,), {
        "upstream": s3_server, "stalled": threading.Event(), "release": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    handler.release.set()
    server.shutdown()
    server.server_close()


def _ctrl_c_when_stalled(args: list[str], endpoint: str, handler) -> tuple[
        subprocess.CompletedProcess, float]:
    """Run ``durkv ARGS`` against ``endpoint``, Ctrl-C it once a request is held; the
    finished process and the seconds from the Ctrl-C to its exit."""
    # SIGINT back to its default in the child: a test run started in the background of a
    # non-interactive shell ignores it, and the child would inherit that
    proc = subprocess.Popen(
        [sys.executable, "-m", "durkv.cli", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "AWS_ENDPOINT_URL": endpoint},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert handler.stalled.wait(60), "the command never reached the stalled request"
        time.sleep(0.3)             # the other calls in flight reach the proxy too
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=CTRL_C_EXIT_S * 3)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"durkv {args[0]} still ran {CTRL_C_EXIT_S * 3} s after Ctrl-C")
    waited = time.monotonic() - t0
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), waited


def test_ctrl_c_stops_an_archive_whose_endpoint_stalled_and_the_next_run_resumes(
        tmp_path, s3_env, bucket, stalling):
    handler, endpoint = stalling
    handler.stall = ("PUT", "/segments/")
    path = make_store(tmp_path / "a.durkv", 30)
    url = f"s3://{bucket}/p"
    proc, waited = _ctrl_c_when_stalled(["archive", path, url], endpoint, handler)
    assert waited < CTRL_C_EXIT_S, f"{waited:.1f} s from Ctrl-C to exit"
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    assert "interrupted: " in proc.stderr      # not click's "Aborted!", exit 1
    # the next run (endpoint back) completes the archive, and it restores every segment
    r = CliRunner().invoke(cli, ["archive", path, url])
    assert r.exit_code == 0 and "wrote manifest 0" in r.stdout, r.output
    r = CliRunner().invoke(cli, ["restore", "-q", url, str(tmp_path / "r.durkv")])
    assert r.exit_code == 0, r.output
    assert segment_files(tmp_path / "r.durkv") == sealed_files(path)


@pytest.mark.parametrize("dest_exists", [False, True])
def test_ctrl_c_stops_a_restore_whose_endpoint_stalled_and_leaves_nothing(
        tmp_path, s3_env, bucket, stalling, dest_exists):
    handler, endpoint = stalling
    handler.stall = ("GET", "/segments/")
    url = f"s3://{bucket}/p"
    r = CliRunner().invoke(cli, ["archive", make_store(tmp_path / "a.durkv", 30), url])
    assert r.exit_code == 0, r.output
    parent = tmp_path / "parent"
    (parent / "dest" if dest_exists else parent).mkdir(parents=True)
    before = os.listdir(parent)
    proc, waited = _ctrl_c_when_stalled(["restore", url, str(parent / "dest")], endpoint,
                                        handler)
    assert waited < CTRL_C_EXIT_S, f"{waited:.1f} s from Ctrl-C to exit"
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    assert "interrupted: " in proc.stderr      # not click's "Aborted!", exit 1
    # no temporary directory; DEST not made, or still there and empty
    assert os.listdir(parent) == before
    assert not dest_exists or os.listdir(parent / "dest") == []


def test_the_client_times_out_a_stalled_endpoint_in_tens_of_seconds():
    config = s3client._new_client("http://127.0.0.1:9", "us-east-1").meta.config
    assert config.connect_timeout <= 10 and config.read_timeout <= 15
    assert config.retries["total_max_attempts"] == s3client.MAX_ATTEMPTS == 5
    assert s3client.MAX_ATTEMPTS * config.read_timeout <= 60


def test_a_stalled_endpoint_fails_with_one_line_and_the_archive_resumes(
        tmp_path, s3_env, bucket, stalling, monkeypatch):
    # the real client path with the timeouts scaled down (the defaults take ~50 s)
    monkeypatch.setattr(s3client, "READ_TIMEOUT", 2)
    monkeypatch.setattr(s3client, "MAX_ATTEMPTS", 2)
    monkeypatch.setattr(s3client, "_CLIENTS", {})
    handler, endpoint = stalling
    handler.stall = ("PUT", "/segments/")
    path = make_store(tmp_path / "a.durkv", 12)
    url = f"s3://{bucket}/p"
    t0 = time.monotonic()
    r = CliRunner().invoke(cli, ["archive", "--endpoint-url", endpoint, path, url])
    assert time.monotonic() - t0 < 20
    assert r.exit_code == 1, r.output
    assert r.stderr.splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith(f"error: {endpoint} stopped answering {url} (put p/segments/")
    assert "no answer within 2 s, 2 attempts; check the endpoint and the network" in r.stderr
    r = CliRunner().invoke(cli, ["archive", path, url])
    assert r.exit_code == 0 and "wrote manifest 0" in r.stdout, r.output
