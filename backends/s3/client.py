"""An ``s3://bucket/prefix`` location: the boto3 client, paged listing, and S3 errors
turned into durkv's error tree.

Credentials come from boto3's standard chain (environment, shared config and
credentials files, ``AWS_PROFILE``, instance/container roles); durkv never reads,
stores or prints them. The endpoint and region come from the arguments or, when
those are ``None``, from boto3's usual variables (``AWS_ENDPOINT_URL``,
``AWS_ENDPOINT_URL_S3``, ``AWS_REGION``, ``AWS_DEFAULT_REGION``) and config files,
so any S3-compatible store works.

>>> loc = S3Location.parse("s3://my-bucket/agents/prod")
>>> (loc.bucket, loc.prefix, loc.key("manifests/x.json"))
('my-bucket', 'agents/prod', 'agents/prod/manifests/x.json')
"""

from __future__ import annotations

import base64
import itertools
import os
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from durkv.errors import (
    AccessDeniedError, BackendError, ConfigError, NoSuchBucketError,
)

__all__ = ["S3Location", "crc32c_b64", "translate", "KeyExistsError", "NoSuchKeyError",
           "MAX_ATTEMPTS", "CONNECT_TIMEOUT", "READ_TIMEOUT", "safe_endpoint", "in_order",
           "PARALLEL"]

T = TypeVar("T")
R = TypeVar("R")

# botocore's "standard" retry mode: exponential backoff with jitter on 5xx, throttling
# (503 SlowDown, 429...) and connection errors; 4xx other than throttling are not retried.
MAX_ATTEMPTS = 5

# Seconds to open a connection, and to wait for each read (or send) on it. botocore's 60 s
# default made a stalled endpoint (a hung proxy, a partitioned network) hold an archive or
# a live store's commit for 5 x 60 s before one error; S3 answers within a second or two
# (AWS's own guidance is to time out and retry a slow request), so a stall now fails after
# MAX_ATTEMPTS x READ_TIMEOUT = 50 s plus backoff (an archive to a SIGSTOPped endpoint: 61 s,
# was 385 s), with one line saying so.
CONNECT_TIMEOUT = 5
READ_TIMEOUT = 10


def crc32c_b64(crc: int) -> str:
    """S3's wire form of a CRC-32C: base64 of its 4 big-endian bytes."""
    return base64.b64encode(struct.pack(">I", crc)).decode("ascii")


def _code(exc: Any) -> tuple[str, int]:
    resp = getattr(exc, "response", None) or {}
    code = str(resp.get("Error", {}).get("Code", ""))
    status = int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


class KeyExistsError(BackendError):
    """A create-only PUT found its key taken (HTTP 412). Callers that expect it (the
    archive's re-run and conflict checks) catch it; anywhere else it is one error line."""

    code = "key_exists"


class NoSuchKeyError(BackendError):
    """A GET/HEAD of a key that does not exist, in a bucket that does (HTTP 404)."""

    code = "no_such_key"


@dataclass
class S3Location:
    """Where an archive lives, and the client that talks to it."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    client: Any = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str, *, endpoint_url: str | None = None, region: str | None = None,
              client: Any = None) -> S3Location:
        """``s3://bucket[/prefix]``; ConfigError (exit 2) for anything else."""
        if not isinstance(url, str) or not url.startswith("s3://"):
            raise ConfigError(f"an archive URL must look like s3://BUCKET/PREFIX, got {url!r}")
        rest = url[len("s3://"):].partition("?")[0]
        bucket, _, prefix = rest.partition("/")
        prefix = prefix.strip("/")
        if not bucket:
            raise ConfigError(f"no bucket in {url!r}; use s3://BUCKET/PREFIX")
        if any(p in (".", "..") for p in prefix.split("/")) or "//" in prefix:
            raise ConfigError(f"bad prefix in {url!r}: no empty, '.' or '..' parts")
        return cls(bucket, prefix, endpoint_url, region, client)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def s3(self) -> Any:
        """The boto3 client (made on first use)."""
        if self.client is None:
            self.client = make_client(self.endpoint_url, self.region)
        return self.client

    def delete_keys(self, rels: list[str], what: str = "objects") -> None:
        """Delete the objects at ``rels`` (relative to PREFIX), 1,000 a request
        (DeleteObjects' limit). A missing one is no error: a re-run deletes again."""
        for i in range(0, len(rels), 1000):
            chunk = rels[i:i + 1000]
            with translate(self, f"delete {len(chunk)} {what}"):
                self.s3().delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": self.key(r)} for r in chunk], "Quiet": True})

    def list_keys(self, rel_prefix: str, *, page_size: int = 1000,
                  start_after: str | None = None) -> Iterator[str]:
        """Every key under ``PREFIX/rel_prefix`` (after ``start_after``, relative to
        PREFIX too), in key order, relative to PREFIX (ListObjectsV2, ``page_size`` keys
        per request)."""
        for rel, _ in self.list_objects(rel_prefix, page_size=page_size,
                                        start_after=start_after):
            yield rel

    def list_objects(self, rel_prefix: str, *, page_size: int = 1000,
                     start_after: str | None = None) -> Iterator[tuple[str, dict]]:
        """``list_keys`` with each key's listing entry (``ETag``, ``Size``,
        ``LastModified``; the page's ``Date`` answer, the server's clock, as ``_date``)."""
        full = self.key(rel_prefix)
        strip = len(self.key(""))
        token = None
        while True:
            kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full, "MaxKeys": page_size}
            if start_after:
                kw["StartAfter"] = self.key(start_after)
            if token:
                kw["ContinuationToken"] = token
            with translate(self, "list " + full):
                page = self.s3().list_objects_v2(**kw)
            date = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            for obj in page.get("Contents", ()):
                yield obj["Key"][strip:], {**obj, "_date": date}
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")
            if not token:
                raise BackendError(f"{self.url}: a truncated listing without a continuation "
                                   "token; the S3 endpoint does not page correctly")


# One client per endpoint, region and credential source, shared by every S3Location of
# the process: making a client costs ~100 ms (botocore loads the service model) and a
# shared one keeps its HTTP connections alive. Clients are thread-safe; botocore
# refreshes expiring credentials inside the client.
_CLIENTS: dict[tuple, Any] = {}
_CLIENTS_LOCK = threading.Lock()
_ENV_KEYS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
             "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_CONFIG_FILE",
             "AWS_SHARED_CREDENTIALS_FILE")


# Requests in flight at once for the segments of one archive or restore: S3 answers a
# PUT/GET in tens of milliseconds whatever its size, so a few at a time hide the latency
# (and a restore's writes and fsyncs overlap its downloads). Each holds one segment in
# memory.
PARALLEL = 4


def in_order(fn: Callable[[T], R], items: Iterable[T], workers: int = PARALLEL
             ) -> Iterator[R]:
    """``map(fn, items)`` with up to ``workers`` calls running at once, results in order.

    At most ``workers`` results wait unconsumed; an exception from ``fn`` is raised where
    its result would have been. Nothing ever waits for a call whose result is not taken:
    when the consumer stops (an exception, Ctrl-C, ``close()``), the calls in flight are
    left to end on their own (the client's timeouts) or with the process. Each runs in a
    daemon thread of its own because a ThreadPoolExecutor joins its workers at shutdown
    and again at interpreter exit: a Ctrl-C of an archive whose S3 endpoint stalled
    waited minutes for botocore's retries. Abandoning a call is safe for every caller:
    an archive's PUTs are create-only (the next run finds what landed), a restore's
    GETs only return bytes (the consumer alone writes files)."""
    it = iter(items)
    pending: deque[_Call[R]] = deque(_Call(fn, item) for item in itertools.islice(it, workers))
    while pending:
        result = pending.popleft().result()
        pending.extend(_Call(fn, item) for item in itertools.islice(it, 1))
        yield result


class _Call(Generic[R]):
    """``fn(item)`` running in a daemon thread; ``result()`` waits for it (a Ctrl-C
    interrupts the wait: it is a plain lock wait in the main thread)."""

    def __init__(self, fn: Callable[[T], R], item: T) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn, item), name="durkv-s3",
                         daemon=True).start()

    def _run(self, fn: Callable[[T], R], item: T) -> None:
        try:
            self._value = fn(item)
        except BaseException as exc:    # handed to the consumer, raised where it waits
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> R:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


def make_client(endpoint_url: str | None, region: str | None) -> Any:
    """The shared boto3 S3 client for this endpoint/region and the current environment."""
    key = (endpoint_url, region, *(os.environ.get(k) for k in _ENV_KEYS))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = _new_client(endpoint_url, region)
        return client


def _new_client(endpoint_url: str | None, region: str | None) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise ConfigError("s3:// needs boto3: pip install 'durkv[s3]'") from exc
    config = Config(
        # total_max_attempts counts the first try; botocore's max_attempts does not (it
        # made 6 attempts, not the 5 GUARANTEES.md 14 says)
        retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
        connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT,
        # durkv sends its own precomputed CRC-32C on every PUT and checks every byte it
        # reads; the SDK's default extra checksums (aws-chunked trailers) break several
        # S3-compatible stores and CRC-32C would need the CRT package.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    try:
        return boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url or None, region_name=region or None, config=config)
    except Exception as exc:    # botocore raises ValueError & co for a bad endpoint/region
        raise ConfigError(f"cannot make an S3 client (endpoint {endpoint_url or 'default'}, "
                          f"region {region or 'default'}): {type(exc).__name__}: {exc}") from exc


class translate:
    """Context manager: botocore errors -> one-line durkv errors (raised ``from`` them).

    Only the error code, HTTP status and S3's own message are used: they never hold
    credentials (the request's signature and keys are not in them)."""

    def __init__(self, loc: S3Location, what: str) -> None:
        self.loc = loc
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: Any, exc: Any, tb: Any) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        from botocore import exceptions as bx

        where = f"{self.loc.url} ({self.what})"
        if isinstance(exc, bx.ClientError):
            code, status = _code(exc)
            if code == "NoSuchBucket":
                raise NoSuchBucketError(
                    f"bucket {self.loc.bucket!r} does not exist at "
                    f"{self._endpoint()}; create it or fix the URL", url=self.loc.url) from exc
            if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId",
                                         "SignatureDoesNotMatch", "ExpiredToken"):
                raise AccessDeniedError(
                    f"access denied to {where} by {self._endpoint()} ({code or status}); check "
                    "the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID...) and the bucket policy",
                    url=self.loc.url) from exc
            if status == 412 or code == "PreconditionFailed":
                raise KeyExistsError(f"{where}: the key exists (412)", url=self.loc.url) from exc
            if status == 404 or code in ("NoSuchKey", "NotFound"):
                raise NoSuchKeyError(f"{where}: no such key", url=self.loc.url) from exc
            raise client_error(self.loc, self.what, exc) from exc
        if isinstance(exc, bx.NoCredentialsError):
            raise AccessDeniedError(
                f"no S3 credentials found for {self.loc.url}; set AWS_PROFILE or "
                "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run on a host with a role",
                url=self.loc.url) from exc
        if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectionError)):
            raise BackendError(f"cannot reach {self._endpoint()} for {where} after "
                               f"{MAX_ATTEMPTS} attempts: {type(exc).__name__}",
                               url=self.loc.url) from exc
        if isinstance(exc, bx.ReadTimeoutError):
            wait, tries = self._patience()
            raise BackendError(f"{self._endpoint()} stopped answering {where}: no answer "
                               f"within {wait} s, {tries} attempts; "
                               "check the endpoint and the network, then run the command "
                               "again", url=self.loc.url) from exc
        if isinstance(exc, bx.BotoCoreError):
            raise BackendError(f"{where}: {type(exc).__name__}: {exc}", url=self.loc.url) from exc
        return False

    def _patience(self) -> tuple[Any, Any]:
        """The client's read timeout and attempts (a caller may bring its own client)."""
        config = getattr(getattr(self.loc.client, "meta", None), "config", None)
        retries = getattr(config, "retries", None) or {}
        tries = retries.get("total_max_attempts") or (
            retries["max_attempts"] + 1 if "max_attempts" in retries else MAX_ATTEMPTS)
        return getattr(config, "read_timeout", None) or READ_TIMEOUT, tries

    def _endpoint(self) -> str:
        client = self.loc.client
        ep = getattr(getattr(client, "meta", None), "endpoint_url", None)
        return safe_endpoint(ep or self.loc.endpoint_url) or "the default S3 endpoint"


def safe_endpoint(url: str | None) -> str | None:
    """An endpoint URL fit to print: any ``user:password@`` part is dropped."""
    if not url or "@" not in url:
        return url
    scheme, sep, rest = url.rpartition("://")
    return f"{scheme}{sep}{rest.rsplit('@', 1)[1]}"


def client_error(loc: S3Location, what: str, exc: Exception) -> BackendError:
    """Any S3 error the caller did not expect, as one line."""
    code, status = _code(exc)
    msg = (getattr(exc, "response", None) or {}).get("Error", {}).get("Message", "")
    return BackendError(f"{loc.url} ({what}): S3 answered {status} {code} {msg}".rstrip(),
                        url=loc.url, s3_code=code, status=status)
