"""A create-only PUT lands but its response is lost: botocore retries it and gets 412 for
its own write. The archive must take that as success (same content), not as a conflict."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from durkv.backends import s3 as ds3

from .storetools import keys, make_store


class _DroppingProxy(BaseHTTPRequestHandler):
    """Forwards every request to ``upstream``; for the first PUT whose path holds each of
    ``drop``, forwards it, lets the upstream answer, then closes the connection instead of
    relaying the answer."""

    upstream = ""
    drop: dict[str, int] = {}
    lock = threading.Lock()
    protocol_version = "HTTP/1.1"

    def _relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        up = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        with self.lock:
            hit = next((p for p, n in self.drop.items()
                        if n > 0 and self.command == "PUT" and p in self.path), None)
            if hit:
                self.drop[hit] -= 1
        if hit:
            self.close_connection = True        # the write landed; its answer never comes
            return
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _relay

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def proxy(s3_server):
    _DroppingProxy.upstream = s3_server
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DroppingProxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield _DroppingProxy, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_lost_responses_of_a_segment_and_a_manifest_put_are_success(tmp_path, s3_env, s3,
                                                                      bucket, proxy):
    handler, endpoint = proxy
    handler.drop = {"/segments/00000000000000000001.seg": 1, "/manifests/": 1}
    path = make_store(tmp_path / "a.durkv", 12)
    url = f"s3://{bucket}/p"
    res = ds3.archive(path, url, endpoint_url=endpoint)
    assert handler.drop == {"/segments/00000000000000000001.seg": 0, "/manifests/": 0}
    assert 1 in res.already and 1 not in res.uploaded     # its retry found our own write
    assert res.manifest_no == 0
    assert [k for k in keys(s3, bucket) if "/manifests/" in k] == [
        "p/manifests/00000000000000000000.json"]
    plan, report = ds3.restore(url, tmp_path / "r.durkv")
    assert report.ok and report.next_lsn == 12
