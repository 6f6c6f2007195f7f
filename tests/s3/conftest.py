"""A real HTTP S3 for the tests: moto's server on 127.0.0.1, one per session.

Every test gets its own bucket (``bucket``), so tests never see each other's
objects. Credentials are fixed dummies exported through the standard AWS
variables, so code under test finds them through boto3's usual chain; the
secret is a unique string the tests grep every output line for.
"""

from __future__ import annotations

import itertools
import logging

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
def s3_env(s3_server, monkeypatch):
    """The standard AWS variables pointing at the moto server (boto3 reads them itself)."""
    env = {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1"}
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
