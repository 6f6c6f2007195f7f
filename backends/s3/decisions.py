"""Decision objects: approvals and resolutions given from another machine to a live
``s3://`` store's one writer (FORMAT.md section 13).

This module is the objects' side only -- keys, encodings, the create-only PUT, the
ack, the listing, the wait and the clean-up. What a decision means (which request is
pending, what is recorded) is the runtime's (``durkv.runtime.remote``): it hands the
writer's intake a function that takes one decision object into the journal and says
what to acknowledge.

>>> DecisionBox.object_rel("r1", request_id(["approval", "r1", 1.5, "0", 0, 2.5, 0, 7]))
'live/decisions/82f3e9c695dc6b8d/9277f3f2c34b0469dde0278546d6589d.json'
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Iterator
from urllib.parse import parse_qs

from durkv.errors import (
    ApprovalMismatchError, BackendError, ConfigError, CorruptionError, DecisionConflictError,
    DurkvError, FencedError, FrameTooLargeError, NotFoundError, StoreClosedError,
)
from durkv.log import crc32c

from .client import KeyExistsError, NoSuchKeyError, S3Location, crc32c_b64, translate
from .livefmt import EPOCHS, newest_numbered

__all__ = ["DECISIONS", "DecisionBox", "DecisionPendingError", "Intake", "request_id",
           "run_dir", "refusal", "ack_error", "encode_result", "decode_result", "OPTIONS"]

log = logging.getLogger("durkv")

DECISIONS = "live/decisions/"
OPTIONS = ("decision_poll_ms", "decision_wait_ms")     # URL options (FORMAT.md section 13)
POLL_MS = 1000          # the writer's intake pass, in the background
WAIT_MS = 60_000        # how long a decider waits for the writer's ack
GRACE_S = 600           # an acknowledged pair is deleted once its ack is this old
_FIRST_DELAY, _MAX_DELAY = 0.01, 0.05    # the decider's GETs of the ack (cheap: ~1/s... 20/s)
_WRITER_CHECK_S = 0.5   # no ack by then: is any writer open at all?

# refusal codes an ack may carry, and the error each is on the decider's side
_ERRORS: dict[str, type[DurkvError]] = {
    c.code: c for c in (DecisionConflictError, ApprovalMismatchError, NotFoundError,
                        ConfigError, FrameTooLargeError)}


class DecisionPendingError(BackendError):
    """A decision object is in S3 but no writer took it into the journal within the
    wait: it stands (the first object for a request holds) and the next intake pass of a
    writer -- this one's next poll, or the next writer's open -- takes it in."""

    code = "decision_pending"


def request_id(request: list) -> str:
    """``Q``: the key of the decision objects that answer ``request``.

    >>> request_id(["approval", "r1", 1.5, "0", 0, 2.5, 0, 7])
    '9277f3f2c34b0469dde0278546d6589d'
    """
    text = json.dumps(request, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def run_dir(run_id: str) -> str:
    """``live/decisions/<R>/``: the prefix of one run's decision objects.

    >>> run_dir("r1")
    'live/decisions/82f3e9c695dc6b8d/'
    """
    return f"{DECISIONS}{hashlib.sha256(run_id.encode()).hexdigest()[:16]}/"


def encode_result(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def decode_result(text: Any) -> bytes | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError("the result must be base64 text")
    return base64.b64decode(text.encode("ascii"), validate=True)


def refusal(exc: DurkvError) -> dict:
    """The ack fields of a refused decision."""
    return {"ok": False, "code": exc.code, "message": exc.message}


def ack_error(ack: dict) -> DurkvError:
    """The error a refusing ack stands for, on the decider's side."""
    cls = _ERRORS.get(str(ack.get("code")), BackendError)
    msg = str(ack.get("message") or "the store's writer refused the decision")
    return cls(f"{msg} (refused by the writer)", q=ack.get("q"))


def _ms_option(url: str, name: str, default: int) -> int:
    query = {k: v[0] for k, v in parse_qs(url.partition("?")[2]).items()}
    text = query.get(name)
    if text is None:
        return default
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"{name} must be an int >= 0 (milliseconds), got {text!r}")
    return n


class DecisionBox:
    """The decision objects of one ``s3://`` store: ``live/decisions/`` under its prefix.

    Args:
        url: the store's URL, options included (``endpoint_url=``, ``region=``,
            ``decision_poll_ms=``, ``decision_wait_ms=``).
    """

    def __init__(self, url: str, *, client: Any = None) -> None:
        query = {k: v[0] for k, v in parse_qs(url.partition("?")[2]).items()}
        self.loc = S3Location.parse(url, endpoint_url=query.get("endpoint_url"),
                                    region=query.get("region"), client=client)
        self.poll_ms = _ms_option(url, "decision_poll_ms", POLL_MS)
        self.wait_ms = _ms_option(url, "decision_wait_ms", WAIT_MS)
        self.puts = 0           # decision and ack PUTs made (the benchmark counts them)

    # -- keys and documents -------------------------------------------------------------

    @staticmethod
    def object_rel(run_id: str, q: str) -> str:
        return f"{run_dir(run_id)}{q}.json"

    @staticmethod
    def ack_rel(run_id: str, q: str) -> str:
        return f"{run_dir(run_id)}{q}.ack.json"

    @staticmethod
    def make(request: list, answer: dict, *, by: Any, note: Any, t: float) -> dict:
        """A decision object answering ``request`` (``[kind, run_id, ...]``)."""
        return {"format": "durkv-decision", "version": 1, "q": request_id(request),
                "request": request, "kind": request[0], "run": request[1],
                "step": request[3], "answer": answer, "by": by, "note": note, "t": t,
                "nonce": uuid.uuid4().hex, "from": f"{socket.gethostname()}:{os.getpid()}"}

    def _doc(self, rel: str, body: bytes, fmt: str) -> dict:
        key = self.loc.key(rel)
        try:
            doc = json.loads(body)
            if not isinstance(doc, dict) or doc.get("format") != fmt or doc.get("version") != 1:
                raise ValueError(f"not a {fmt} version 1 object")
        except ValueError as exc:
            raise CorruptionError(f"decision object {key} cannot be read: {exc}",
                                  segment=key, kind="bad_decision") from exc
        return doc

    def check(self, doc: dict) -> None:
        """ConfigError unless ``doc`` is a well-formed decision object whose ``q`` is the
        id of its request (what a writer refuses to take in)."""
        req = doc.get("request")
        ok = (isinstance(req, list) and len(req) == 8 and req[0] in ("approval", "resolve")
              and isinstance(req[1], str) and isinstance(req[3], str)
              and doc.get("q") == request_id(req) and doc.get("kind") == req[0]
              and doc.get("run") == req[1] and doc.get("step") == req[3]
              and isinstance(doc.get("answer"), dict) and isinstance(doc.get("nonce"), str)
              and isinstance(doc.get("t"), (int, float)))
        if not ok:
            raise ConfigError(f"decision object {doc.get('q')!r} of {self.loc.url} is not "
                              "well-formed (FORMAT.md section 13); write decisions with "
                              "store.decide / store.resolve")

    # -- requests -----------------------------------------------------------------------

    def _put(self, rel: str, doc: dict, put_id: str) -> bool:
        """Create-only PUT; False if the key holds another PUT's object."""
        body = json.dumps(doc, separators=(",", ":")).encode()
        key = self.loc.key(rel)
        self.puts += 1
        try:
            with translate(self.loc, "put " + key):
                self.loc.s3().put_object(
                    Bucket=self.loc.bucket, Key=key, Body=body, IfNoneMatch="*",
                    ContentType="application/json", ChecksumAlgorithm="CRC32C",
                    ChecksumCRC32C=crc32c_b64(crc32c(body)),
                    Metadata={"durkv-put-id": put_id})
        except KeyExistsError:
            with translate(self.loc, "head " + key):
                head = self.loc.s3().head_object(Bucket=self.loc.bucket, Key=key)
            # our own PUT whose answer was lost and that botocore retried is ours
            return head.get("Metadata", {}).get("durkv-put-id") == put_id
        return True

    def _get(self, rel: str) -> bytes | None:
        key = self.loc.key(rel)
        try:
            with translate(self.loc, "get " + key):
                return self.loc.s3().get_object(Bucket=self.loc.bucket, Key=key)["Body"].read()
        except NoSuchKeyError:
            return None

    def submit(self, doc: dict) -> dict:
        """PUT ``doc`` create-only; the decision object that holds its request now: ``doc``
        itself, or the one another decider PUT first."""
        rel = self.object_rel(doc["run"], doc["q"])
        for _ in range(5):
            if self._put(rel, doc, doc["nonce"]):
                return doc
            body = self._get(rel)
            if body is not None:
                return self._doc(rel, body, "durkv-decision")
            # taken, then deleted by a clean-up before we could read it: try again
        raise BackendError(f"{self.loc.url}: decision object {self.loc.key(rel)} keeps "
                           "appearing and vanishing; try again", url=self.loc.url)

    def read_ack(self, run_id: str, q: str) -> dict | None:
        rel = self.ack_rel(run_id, q)
        body = self._get(rel)
        return None if body is None else self._doc(rel, body, "durkv-decision-ack")

    def exists(self, run_id: str, q: str) -> bool:
        key = self.loc.key(self.object_rel(run_id, q))
        try:
            with translate(self.loc, "head " + key):
                self.loc.s3().head_object(Bucket=self.loc.bucket, Key=key)
        except NoSuchKeyError:
            return False
        return True

    def write_ack(self, doc: dict, fields: dict, writer_epoch: int = 0) -> dict:
        """The writer's answer to ``doc`` (``fields``: ``ok`` and the rest); the ack that
        stands (ours, or one written before for the same object)."""
        ack = {"format": "durkv-decision-ack", "version": 1, "q": doc.get("q"),
               "nonce": doc.get("nonce"), **fields, "writer_epoch": writer_epoch}
        rel = self.ack_rel(doc["run"], doc["q"])
        if not self._put(rel, ack, uuid.uuid4().hex):
            held = self.read_ack(doc["run"], doc["q"])
            return held if held is not None else ack
        return ack

    def writer_open(self) -> bool:
        """Whether the store's newest epoch object says a writer holds it (``state:
        open``): when none does, no ack can come until one opens."""
        best = newest_numbered(self.loc, EPOCHS, ".json")
        if best is None:
            return False
        body = self._get(best[0])
        try:
            return body is None or json.loads(body).get("state") == "open"
        except ValueError:
            return True

    def wait(self, doc: dict, held: dict, wait_ms: int | None = None) -> dict | None:
        """GET the ack of ``held`` (the object that holds ``doc``'s request) until it
        exists: the ack; None if the wait ran out; ``{"gone": True}`` if the object and
        its ack were cleaned up meanwhile (the caller reads the journal again)."""
        ms = self.wait_ms if wait_ms is None else wait_ms
        start = time.monotonic()
        deadline = start + ms / 1000.0
        nonces = {doc.get("nonce"), held.get("nonce")}
        delay, polls, checked = _FIRST_DELAY, 0, False
        while True:
            ack = self.read_ack(held["run"], held["q"])
            if ack is not None:
                if ack.get("nonce") in nonces:
                    return ack
                return {"gone": True}        # a later object's ack: ours was cleaned up
            polls += 1
            if polls % 16 == 0 and not self.exists(held["run"], held["q"]):
                return {"gone": True}
            if not checked and time.monotonic() > start + _WRITER_CHECK_S:
                checked = True
                if not self.writer_open():
                    return None     # no writer: the next one takes it in when it opens
            if time.monotonic() + delay > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY)

    # -- the writer's side ----------------------------------------------------------------

    def pending(self, run_id: str | None = None) -> Iterator[tuple[str, dict | None]]:
        """(rel, object) of every decision object with no ack (of ``run_id``'s, or all);
        the object is None when it cannot be read as one (refused by the caller). Cleans
        up, on the way, the pairs acknowledged more than GRACE_S ago."""
        objects: dict[str, str] = {}
        acks: dict[str, tuple[str, Any, Any]] = {}
        for rel, entry in self.loc.list_objects(run_dir(run_id) if run_id else DECISIONS):
            if rel.endswith(".ack.json"):
                acks[rel[:-len(".ack.json")]] = (rel, entry.get("LastModified"),
                                                 entry.get("_date"))
            elif rel.endswith(".json"):
                objects[rel[:-len(".json")]] = rel
        old_acks, old_objects = [], []
        for stem, (rel, modified, date) in acks.items():
            if modified is not None and date and (
                    parsedate_to_datetime(date) - modified).total_seconds() > GRACE_S:
                old_acks.append(rel)
                if stem in objects:
                    old_objects.append(objects[stem])
        if old_acks:        # the ack first: an object never stands beside another's ack
            self.loc.delete_keys(old_acks, "decision objects")
            self.loc.delete_keys(old_objects, "decision objects")
        for stem, rel in objects.items():
            if stem in acks:
                continue
            body = self._get(rel)
            if body is None:
                continue
            try:
                doc = self._doc(rel, body, "durkv-decision")
            except CorruptionError:
                yield rel, None
                continue
            yield rel, doc

    def refuse_unreadable(self, rel: str) -> None:
        """Ack an object at ``rel`` that is not a decision object (its key still names a
        request: the ack lets the clean-up remove it)."""
        stem = rel[len(DECISIONS):-len(".json")]
        r, _, q = stem.partition("/")
        ack = {"format": "durkv-decision-ack", "version": 1, "q": q, "nonce": None,
               "ok": False, "code": ConfigError.code,
               "message": f"{self.loc.key(rel)} is not a decision object"}
        self._put(f"{DECISIONS}{r}/{q}.ack.json", ack, uuid.uuid4().hex)


class Intake:
    """The writer's intake of decision objects (FORMAT.md section 13): a pass now and
    then, and one every ``poll_ms`` in a thread while ``owner`` is alive.

    ``take(doc)`` takes one object into the journal and returns the ack's fields; a
    DurkvError from it leaves the object pending (no ack) for a later pass; a
    FencedError or StoreClosedError stops the thread.
    """

    def __init__(self, box: DecisionBox, take: Callable[[dict], dict], owner: Any,
                 epoch: Callable[[], int] = lambda: 0) -> None:
        self.box = box
        self._take = take
        self.epoch = epoch
        self._owner = weakref.ref(owner)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.taken = 0          # objects acknowledged by this intake

    def start(self) -> None:
        if self.box.poll_ms and self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="durkv-s3-decisions")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)

    def run_pass(self, run_id: str | None = None) -> int:
        """Take in every pending decision object (of ``run_id``, or all); how many."""
        n = 0
        with self._lock:
            for rel, doc in self.box.pending(run_id):
                if doc is None:
                    self.box.refuse_unreadable(rel)
                    continue
                try:
                    self.box.check(doc)
                    fields = self._take(doc)
                except (ConfigError, NotFoundError) as exc:
                    fields = refusal(exc)
                self.box.write_ack(doc, fields, self.epoch())
                n += 1
            self.taken += n
        return n

    def _loop(self) -> None:
        every = self.box.poll_ms / 1000.0
        while not self._stop.wait(every):
            if self._owner() is None:
                return
            try:
                self.run_pass()
            except (FencedError, StoreClosedError):
                return
            except DurkvError as exc:
                log.warning("durkv: %s: a pass over decision objects failed (%s); the next "
                            "one in %d ms tries again", self.box.loc.url, exc,
                            self.box.poll_ms)
