"""LangGraph's serializer as a durkv serde, and the "no value" marker.

The store speaks a two-method serde (``dumps(obj) -> bytes``,
``loads(bytes) -> obj``); LangGraph speaks ``dumps_typed``/``loads_typed``
with a ``(type, bytes)`` pair. :class:`LangGraphSerde` packs the pair into
one value so that LangGraph's own serializer -- its msgpack allowlist, an
``EncryptedSerializer``, a pickle fallback -- decides what is stored and what
may be loaded back.

Layout of one stored value: a tag byte, then the payload.

- ``0x00``: :data:`EMPTY` (no payload; see below)
- ``0x01``-``0x06``: the common type names (msgpack, null, bytes, bytearray,
  json, pickle) followed by the serializer's bytes
- ``0x7f``: any other type name -- one length byte, the UTF-8 name, then the
  serializer's bytes (e.g. ``msgpack+aes`` from an ``EncryptedSerializer``)

:data:`EMPTY` marks a channel whose version moved without a stored value.
LangGraph's ``DeltaChannel`` does that on every step between snapshots; a
reader must see the channel as absent there (the ancestor walk of
``get_delta_channel_history`` rebuilds it), not inherit an older value.

>>> from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
>>> s = LangGraphSerde(JsonPlusSerializer())
>>> s.loads(s.dumps({"n": 1}))
{'n': 1}
>>> s.loads(s.dumps(EMPTY)) is EMPTY
True
"""

from __future__ import annotations

from typing import Any, Callable

from langgraph.checkpoint.serde.base import SerializerProtocol, maybe_add_typed_methods
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ._lgcommit import Dumps as _Dumps
from .errors import SerializationError
from ._lgcommit import checkpoint_metadata as checkpoint_metadata_c
from ._lgcommit import put_args as put_args_c
from ._lgcommit import put_writes_args as put_writes_args_c
from ._msgunpack import model_kept, model_of, unpack_items, unpack_kept
from .langgraph_messages import dumps_messages, is_jsonplus, pack_msgpack
from .store.delta import join_tagged, kept_values

__all__ = ["EMPTY", "LangGraphSerde", "checkpoint_metadata_c", "put_args_c",
           "put_writes_args_c"]


class _Empty:
    """The single "version moved, nothing stored" marker."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "EMPTY"

    def __reduce__(self) -> str:
        return "EMPTY"


EMPTY = _Empty()

_EMPTY_BYTES = b"\x00"
_OTHER = 0x7F
_TAGS = {"msgpack": 1, "null": 2, "bytes": 3, "bytearray": 4, "json": 5, "pickle": 6}
_TAG_BYTES = {name: bytes((tag,)) for name, tag in _TAGS.items()}
_NAMES = {tag: name for name, tag in _TAGS.items()}
_MSGPACK_TAG = _TAGS["msgpack"]
_MSGPACK_TAG_BYTE = _TAG_BYTES["msgpack"]
_NOT_MSGPACK = (bytes, bytearray)       # JsonPlusSerializer stores these as themselves


class LangGraphSerde:
    """A durkv serde over a LangGraph ``SerializerProtocol``.

    ``serde`` is public and may be swapped (``DurkvSaver.with_allowlist``
    widens it in place so that every graph sharing a store reads with the
    union of their allowlists).
    """

    __slots__ = ("_serde", "_plain", "_none")

    def __init__(self, serde: SerializerProtocol) -> None:
        self.serde = serde

    @property
    def serde(self) -> SerializerProtocol:
        return self._serde

    @serde.setter
    def serde(self, serde: SerializerProtocol) -> None:
        self._serde = maybe_add_typed_methods(serde)
        # exactly LangGraph's JsonPlusSerializer (checked to agree, once a process): a value
        # it stores as "msgpack" is packed here in one C call, to the same bytes
        # (langgraph_messages.pack_msgpack); a wrapper such as EncryptedSerializer, a
        # subclass or any other serializer is asked, always
        self._plain = (is_jsonplus(self._serde)
                       and "dumps_typed" not in getattr(self._serde, "__dict__", {}))
        # what that serializer stores for None (its "null"), asked once: a superstep stores
        # ~2 Nones (a branch channel, a write), each a Python call into the serializer
        self._none = self._asked(None) if self._plain else None

    @property
    def plain_tag(self) -> int | None:
        """The tag byte of the stored values that read back exactly as
        ``durkv._listprefix.decoded_copy`` copies plain data (dicts with str keys, lists,
        str/bytes/int/float/bool/None): msgpack under exactly LangGraph's
        ``JsonPlusSerializer`` once its decoding agreed with the C decoder's; None under
        any other serializer. The store keeps such list items as copies, not bytes."""
        if self._plain and c_ext_hook(self._serde) is not None:
            return _MSGPACK_TAG
        return None

    def loads_kept(self, kept: list, objs: list, n: int) -> list:
        """A list channel's first ``n`` items from what the store keeps of each, ``kept``
        (``None``: ``objs[i]``, an immutable scalar; a dict or list: a decoded-form copy,
        copied again; a tuple: a message kept by its fields, built again; bytes:
        deserialized), each a new object, in one C pass where the serializer's decoding is
        the C decoder's. A message of a type LangGraph always allows (:func:`kept_models`)
        that is decoded here is kept by its fields in ``kept`` from then on
        (``durkv._msgunpack``): the next read builds it as pydantic copies a model instead
        of validating it again, the same object decoding builds."""
        hook = c_ext_hook(self._serde)
        if hook is not None:
            out = unpack_kept(kept, objs, n, _MSGPACK_TAG, hook, kept_models())
            if out is not None:
                return out
        return kept_values(kept[:n], objs, self._loads_kept_one)

    def kept_form(self, obj: Any) -> tuple | None:
        """How the store keeps ``obj``, an object it decoded with this serde: a message of
        a type :func:`kept_models` names by its fields (``durkv._msgunpack.model_kept``),
        or None (keep its bytes)."""
        if type(obj) in kept_models() and c_ext_hook(self._serde) is not None:
            return model_kept(obj)
        return None

    @staticmethod
    def model_form(obj: Any) -> tuple | None:
        """What a pydantic model (a LangChain message) is stored as under LangGraph's
        serializer, comparably (``durkv._msgunpack.model_kept``: class, fields, fields
        set, extras), whatever serializer wraps it (an encrypted one too); None for
        anything else. The store compares read-back items by it where the serializer's
        bytes differ each time (durkv.store.delta)."""
        return model_kept(obj)

    def _loads_kept_one(self, k: Any) -> Any:
        return model_of(k) if type(k) is tuple else self.loads(k)

    @staticmethod
    def is_empty(value: Any) -> bool:
        """True for :data:`EMPTY`: readers (``durkv show``) show that channel as absent."""
        return value is EMPTY

    @property
    def dumps(self) -> Callable[[Any], bytes]:
        """``dumps(obj) -> bytes``: :meth:`_dumps_py` as one C call (``durkv._lgcommit.Dumps``,
        held to it by ``tests/test_commitpath.py``). A new callable each access, holding this
        serde (not held by it); it reads ``_plain`` at every call, so a serializer swapped
        in place is followed."""
        return _Dumps(self, EMPTY, _EMPTY_BYTES, _MSGPACK_TAG_BYTE, pack_msgpack,
                      LangGraphSerde._asked)

    def _dumps_py(self, obj: Any) -> bytes:
        """The definition of :attr:`dumps`."""
        if obj is EMPTY:
            return _EMPTY_BYTES
        if obj is None and self._none is not None:
            return self._none
        if self._plain and obj is not None and not isinstance(obj, _NOT_MSGPACK):
            try:
                return _MSGPACK_TAG_BYTE + pack_msgpack(obj)
            except Exception:   # noqa: S110 - ormsgpack refused: the serializer decides
                pass            # (its pickle fallback, or its own error), as below
        return self._asked(obj)

    def _asked(self, obj: Any) -> bytes:
        """``obj`` as the serializer's own ``dumps_typed`` stores it, tagged."""
        type_, data = self._serde.dumps_typed(obj)
        tag = _TAG_BYTES.get(type_)
        if tag is not None:
            return tag + data
        name = type_.encode()
        if len(name) > 255:
            raise TypeError(f"serializer type name too long to store: {type_[:40]!r}...")
        return bytes((_OTHER, len(name))) + name + data

    def dumps_items(self, objs: list, prior: Any = None) -> tuple[list[bytes], Any]:
        """``[self.dumps(x) for x in objs]``, and a state to pass as ``prior`` to the call on
        the list grown from ``objs`` (or None). Under a plain ``JsonPlusSerializer`` a
        LangChain message of plain data is encoded from its fields, to the same bytes, and
        a prefix that packs to the bytes ``prior`` describes is not encoded again
        (langgraph_messages.py: the run journal encodes an agent's whole history on every
        model call, to fingerprint it and find what an earlier record holds)."""
        if self._plain:
            return dumps_messages(objs, self.dumps, prior)
        return [self.dumps(x) for x in objs], None

    def loads(self, data: bytes) -> Any:
        tag = data[0]
        if tag == 0:
            return EMPTY
        name = _NAMES.get(tag)
        if name is not None:
            return self._serde.loads_typed((name, bytes(data[1:])))
        if tag != _OTHER:
            raise SerializationError(
                f"not a value DurkvSaver wrote (tag byte {tag:#04x}): this thread's "
                "checkpoints were written with another serde (durkv.open's default?); "
                "read them with the store that wrote them, e.g. durkv.open(path)")
        n = data[1]
        return self._serde.loads_typed((bytes(data[2:2 + n]).decode(), bytes(data[2 + n:])))

    def loads_many(self, items: list[bytes]) -> list:
        """``[self.loads(b) for b in items]``, each item a new object. Under a plain
        ``JsonPlusSerializer`` the items are decoded in one C pass where they lie
        (``durkv._msgunpack``: the objects ormsgpack builds, LangGraph's own ext hook
        building messages); a value outside that decoder's subset, or another msgpack
        serializer, has the payloads joined under one msgpack array header (in C) and
        decoded in one call of the serializer, so the per-call overhead is paid once, as a
        saver that stores the whole list as one blob pays it."""
        n = len(items)
        if n > 1:
            hook = c_ext_hook(self.serde)
            if hook is not None:
                out = unpack_items(items, _MSGPACK_TAG, hook)
                if out is not None:
                    return out
            if n < 16:
                header = bytes((0x90 | n,))
            elif n < 1 << 16:
                header = b"\xdc" + n.to_bytes(2, "big")
            else:
                header = b"\xdd" + n.to_bytes(4, "big")
            blob = join_tagged(header, items, _MSGPACK_TAG)
            if blob is not None:
                out = self._serde.loads_typed(("msgpack", blob))
                if type(out) is list and len(out) == n:
                    return out
        loads = self.loads
        return [loads(b) for b in items]


def kept_models() -> frozenset:
    """The types :meth:`LangGraphSerde.loads_kept` keeps by their fields once decoded: the
    pydantic v2 models among the types LangGraph's serializer always allows
    (``SAFE_MSGPACK_TYPES``: LangChain's messages and ``Document``), whose decoding -- the
    class called on the stored fields -- depends on no allowlist. Empty when LangGraph does
    not say which types those are."""
    if not _kept_models:
        _kept_models.append(_safe_models())
    return _kept_models[0]


_kept_models: list[frozenset] = []


def _safe_models() -> frozenset:
    try:
        import importlib

        import pydantic
        from langgraph.checkpoint.serde._msgpack import SAFE_MSGPACK_TYPES
    except Exception:   # noqa: BLE001 - an older or newer LangGraph: keep no message
        return frozenset()
    out = set()
    for module, name in SAFE_MSGPACK_TYPES:
        try:
            cls = getattr(importlib.import_module(module), name)
        except Exception:   # noqa: BLE001, S112 - a type this install does not have
            continue
        if isinstance(cls, type) and issubclass(cls, pydantic.BaseModel):
            out.add(cls)
    return frozenset(out)


def c_ext_hook(serde: Any) -> Any:
    """The ext hook to decode ``serde``'s msgpack items with in C, or None: only for exactly
    LangGraph's ``JsonPlusSerializer`` (whose ``loads_typed`` is ``ormsgpack.unpackb`` with
    this hook; a subclass or a wrapper may decode otherwise), and only once a probe of
    every kind of value the C decoder builds has read back the same both ways
    (:func:`_c_agrees`: a LangGraph whose decoding changed keeps its own)."""
    if type(serde) is not JsonPlusSerializer or "loads_typed" in getattr(serde, "__dict__", {}):
        return None     # a subclass, or an instance whose loads_typed was replaced
    if not _c_agreed:
        _c_agreed.append(_c_agrees(serde))
    return serde._unpack_ext_hook if _c_agreed[0] else None


_c_agreed: list[bool] = []      # [whether _c_agrees()], once computed


def _probe_values() -> list:
    from langchain_core.messages import AIMessage, HumanMessage

    return [None, True, False, 0, 127, 128, -1, -32, -33, 255, 65536, 2 ** 40, 2 ** 64 - 1,
            -2 ** 63, 0.5, -0.0, 1e300, "", "é\u4e2d\U0001f600", "x" * 300, b"\x00" * 3,
            [], {}, [1, [2, [3]]], {"a": {"b": [None, 1.25]}}, ("t", 1), {1, 2},
            AIMessage(content="hi", id="m1", tool_calls=[]),
            {"messages": [HumanMessage(content=[{"type": "text", "text": "ü"}])]}]


def _c_agrees(serde: JsonPlusSerializer) -> bool:
    """Whether the C decoder and ``serde.loads_typed`` read the probe values the same:
    equal, and of the same types all the way down."""
    try:
        raws = [b"\x01" + serde.dumps_typed([v])[1] for v in _probe_values()]
        ours = unpack_items(raws, _MSGPACK_TAG, serde._unpack_ext_hook)
        theirs = [serde.loads_typed(("msgpack", r[1:])) for r in raws]
    except Exception:   # noqa: BLE001 - any failure: keep LangGraph's own decoding
        return False
    return ours is not None and same_typed(ours, theirs)


def same_typed(a: Any, b: Any) -> bool:
    """``a == b`` with the same type at every level (and the same key order, float bits)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(same_typed(a[k], b[k]) for k in a)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(map(same_typed, a, b))
    if type(a) is float:
        return repr(a) == repr(b)
    return a == b
