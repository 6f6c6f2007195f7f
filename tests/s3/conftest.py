"""A real HTTP S3 for the tests: moto's server on 127.0.0.1, one per session.

Every test gets its own bucket (``bucket``), so tests never see each other's
objects. Credentials are fixed dummies exported through the standard AWS
variables, so code under test finds them through boto3's usual chain; the
secret is a unique string the tests grep every output line for.
"""

from __future__ import annotations

import http.client
import itertools
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

SECRET = "durkv-test-secret-7f3a9c"        # must never appear in any output
ACCESS_KEY = "AKIADURKVTEST0000000"
_buckets = itertools.count()


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/s3/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.s3)


@pytest.fixture(scope="session")
def s3_server():
    """``http://127.0.0.1:PORT`` of a moto S3 server running for the whole session."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)   # no access log lines
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path):
    """The standard AWS variables pointing at the moto server (boto3 reads them itself),
    and the live store's local cache in this test's own directory."""
    env = {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
           "DURKV_S3_CACHE_DIR": str(tmp_path / "s3-cache")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(k, raising=False)
    return env


@pytest.fixture
def s3(s3_env):
    """A plain boto3 client on the moto server (for setting up and inspecting)."""
    return boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")


@pytest.fixture
def bucket(s3):
    name = f"durkv-test-{next(_buckets)}"
    s3.create_bucket(Bucket=name)
    return name


class RelayProxy(BaseHTTPRequestHandler):
    """A loopback proxy relaying every request to ``upstream`` (the moto server); the
    tests' proxies change what happens around the relay (``_relay``)."""

    upstream = ""
    protocol_version = "HTTP/1.1"

    def _forward(self, body: bytes) -> tuple[int, list, bytes]:
        """The request, sent on to ``upstream``: its answer's status, headers and body."""
        up = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, resp.getheaders(), data

    def _answer(self, status: int, headers: list, data: bytes) -> None:
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(*self._forward(body))

    def do_GET(self) -> None:
        self._relay()

    do_PUT = do_HEAD = do_POST = do_DELETE = do_GET

    def log_message(self, *args) -> None:
        pass


class _DroppingProxy(RelayProxy):
    """Forwards every request to ``upstream``; for the first PUT whose path holds each of
    ``drop``, forwards it, lets the upstream answer, then closes the connection instead of
    relaying the answer."""

    drop: dict[str, int] = {}
    lock = threading.Lock()

    def _relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        answer = self._forward(body)
        with self.lock:
            hit = next((p for p, n in self.drop.items()
                        if n > 0 and self.command == "PUT" and p in self.path), None)
            if hit:
                self.drop[hit] -= 1
        if hit:
            self.close_connection = True        # the write landed; its answer never comes
            return
        self._answer(*answer)


@pytest.fixture
def proxy(s3_server):
    _DroppingProxy.upstream = s3_server
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DroppingProxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield _DroppingProxy, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
