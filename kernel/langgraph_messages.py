"""LangChain messages encoded from their fields, byte for byte as LangGraph's serializer does.

LangGraph's ``JsonPlusSerializer`` encodes a pydantic model through ormsgpack's
``default`` hook: ``model_dump()`` packed as ``[module, class name, fields,
"model_validate_json"]`` inside msgpack extension 5. ``model_dump()`` is most of that
cost (~5 us for a short message). An agent's model step takes the whole message list on
every turn, and durkv encodes every item to fingerprint it and to find what an earlier
record holds (docs/GUARANTEES.md 16.8, 16.10: items are compared by their bytes, never
by identity): the history is encoded again on every turn.

For a LangChain message whose fields hold plain data only (str, int, float, bool, None,
bytes, and exact ``dict``/``list`` of those), ``model_dump()`` returns those same values
in the same order: the fields' own dicts can be packed directly, in one ormsgpack call
(C), with the serializer's own options. :func:`dumps_messages` does that, and asks the
serializer whenever that equality is not certain:

- the class is not a ``BaseMessage`` subclass whose pydantic schema serializes every
  field as it is stored (no field or model serializer, computed field, excluded or
  aliased field; checked once per class, from the schema);
- the instance has extra fields, or its ``__dict__`` is not exactly its fields in order;
- any value inside is not of an exact plain type: a subclass (an ``Enum``, an
  ``OrderedDict``), a tuple, a set, a datetime, a nested model... (ormsgpack hands it to
  ``default``, which refuses), or does not encode (an int over 64 bits).

A history passed again (the model step's, every turn) is not packed again: each message's
field dict was copied when it was encoded (durkv's own copy: containers copied, immutable
leaves shared) and packed from the copy, the copy is kept flattened into one array, and
the next call compares the fields with it by value, as msgpack would see them
(``durkv._msgfields``, csrc/msgfields.c). A message whose fields cannot be copied so keeps
the byte comparison.

``tests/test_langgraph_messages.py`` compares the bytes with the serializer's on every
message class and on generated odd contents; and before its first use in a process,
:func:`is_jsonplus` compares them on a few messages, so that a LangGraph that encodes
otherwise (a new version) turns this path off instead of writing other bytes.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from ._msgfields import copy_fields, same_fields, witness

__all__ = ["EncodedPrefix", "dumps_messages", "eligible", "is_jsonplus", "pack_msgpack"]

try:
    import ormsgpack
    from langchain_core.messages import BaseMessage
    from langgraph.checkpoint.serde.jsonplus import EXT_PYDANTIC_V2, JsonPlusSerializer
    from langgraph.checkpoint.serde.jsonplus import _msgpack_default
    from langgraph.checkpoint.serde.jsonplus import _option as _SERDE_OPTION
    from pydantic import BaseModel
    # the serializer's options, with every type that is not exactly plain sent to `default`
    _OPTION = (_SERDE_OPTION | ormsgpack.OPT_PASSTHROUGH_SUBCLASS
               | ormsgpack.OPT_PASSTHROUGH_TUPLE | ormsgpack.OPT_PASSTHROUGH_BIG_INT)
    # a message's body is [module, name, fields, "model_validate_json"]: the last one's bytes
    _TAIL = len(ormsgpack.packb("model_validate_json"))
    # JsonPlusSerializer.dumps_typed's "msgpack" bytes of a value, by one C call: its
    # ormsgpack.packb with its own default hook and options, without the two Python calls
    # around it (dumps_typed, _msgpack_enc) -- ~0.6 us of ~1.1-1.5 a value, and a commit
    # encodes ~8 (the LangGraphSerde fast path; _agrees checks the bytes once)
    pack_msgpack = partial(ormsgpack.packb, default=_msgpack_default, option=_SERDE_OPTION)
except (ImportError, AttributeError):     # pragma: no cover - another LangGraph/LangChain
    JsonPlusSerializer = None
    pack_msgpack = None

_SCHEMA_CHANGES = ("serialization", "serialization_exclude", "serialization_alias",
                   "serialization_exclude_if")

# class -> eligible(class): its field names in order, module, name, ... ; or None
_classes: dict[type, Any] = {}


def _plain_schema(schema: Any) -> bool:
    """Whether a pydantic core schema serializes every value as it is stored: nowhere a
    serializer, a computed field, an excluded or aliased field."""
    stack = [schema]
    while stack:
        s = stack.pop()
        if isinstance(s, dict):
            for k, v in s.items():
                if (k in _SCHEMA_CHANGES and v) or (k == "computed_fields" and v):
                    return False
                stack.append(v)
        elif isinstance(s, list):
            stack.extend(s)
    return True


def eligible(cls: type) -> Any:
    """``(fields, module, name, where its field dict starts in its body)`` of a message
    class whose instances may be encoded from their fields, or None (checked once per
    class)."""
    try:
        return _classes[cls]
    except KeyError:
        pass
    out = None
    if (JsonPlusSerializer is not None and issubclass(cls, BaseMessage)
            and cls.model_dump is BaseModel.model_dump
            and not getattr(cls, "__pydantic_root_model__", False)
            and _plain_schema(getattr(cls, "__pydantic_core_schema__", {"serialization": 1}))):
        head = 1 + len(ormsgpack.packb(cls.__module__)) + len(ormsgpack.packb(cls.__name__))
        out = (tuple(cls.model_fields), cls.__module__, cls.__name__, head)
    _classes[cls] = out
    return out


def _refuse(obj: Any) -> Any:
    raise TypeError(type(obj).__qualname__)


def _ext5_header(n: int) -> bytes:
    """LangGraphSerde's tag and msgpack's header of an extension 5 value of ``n`` bytes
    (a message's body is never 1, 2, 4, 8 or 16 bytes: no fixext)."""
    if n < 256:
        return bytes((1, 0xC7, n, EXT_PYDANTIC_V2))
    if n < 65536:
        return b"\x01\xc8" + n.to_bytes(2, "big") + bytes((EXT_PYDANTIC_V2,))
    return b"\x01\xc9" + n.to_bytes(4, "big") + bytes((EXT_PYDANTIC_V2,))


class EncodedPrefix:
    """What :func:`dumps_messages` proved about a list it encoded, for the next call on the
    list grown from it: its leading ``n`` items are messages of the classes ``types``
    encoded from their fields, and their bytes are ``items``; ``copies`` holds durkv's own
    copy of each one's field dict, as it was packed (``durkv._msgfields``), or, when some
    could not be copied, ``copies`` is None and ``fields`` is their field dicts packed one
    after the other."""

    __slots__ = ("types", "fields", "items", "copies")

    def __init__(self, types: list, fields: bytes | None, items: list[bytes],
                 copies: list[dict] | None) -> None:
        self.types, self.fields, self.items, self.copies = types, fields, items, copies


def _same_prefix(objs: list, prior: EncodedPrefix) -> int:
    """How many leading items of ``objs`` have the bytes of ``prior``'s: all of them when
    the same classes, no extra fields, and field dicts equal to ``prior``'s by value, as
    msgpack encodes them (one C call for the whole prefix, against durkv's own copies:
    same exact types, keys in the same order, the same float bits; a leaf is taken as
    unchanged only when it is the very immutable object copied) -- or, without copies,
    that pack to the same bytes; else 0. Those messages then have the fields, in the
    order and of the exact plain types, that were checked when ``prior`` was encoded:
    their serializer's bytes are ``prior``'s."""
    n = len(prior.types)
    if not n or len(objs) < n:
        return 0
    if prior.copies is not None:    # the classes too, in the same pass
        return n if same_fields(objs, prior.copies) else 0
    prefix = objs[:n]
    if list(map(type, prefix)) != prior.types:
        return 0
    try:
        if any([x.__pydantic_extra__ for x in prefix]):
            return 0
        packed = ormsgpack.packb([x.__dict__ for x in prefix], option=_OPTION,
                                 default=_refuse)
    except Exception:
        return 0
    head = 1 if n < 16 else 3 if n < 65536 else 5       # the array's msgpack header
    same = len(packed) - head == len(prior.fields) and packed.startswith(prior.fields, head)
    return n if same else 0         # (startswith: a memcmp; a memoryview compares by item)


def dumps_messages(objs: list, dumps: Callable[[Any], bytes], prior: EncodedPrefix | None = None
                   ) -> tuple[list[bytes], EncodedPrefix | None]:
    """``[dumps(x) for x in objs]``, where ``dumps`` is ``LangGraphSerde.dumps`` over a plain
    ``JsonPlusSerializer``, and what the next call may start from (:class:`EncodedPrefix`):

    - the leading items whose bytes are ``prior``'s (``objs`` grew from the list ``prior``
      describes, unchanged: :func:`_same_prefix`) take ``prior``'s bytes;
    - a LangChain message of plain data is encoded from its fields (the same bytes, one C
      call); anything else by ``dumps``.

    One loop, no call per item on the fast path: an agent's history is encoded on every
    model call."""
    k = 0 if prior is None else _same_prefix(objs, prior)
    out = prior.items[:k] if k else []
    types = prior.types[:k] if k else []
    # the leading items' field dicts: copied (the common case), or else packed
    copies = (prior.copies[:k] if prior.copies is not None else None) if k else []
    fields = [prior.fields] if k and copies is None else []
    leading = True          # every item so far encoded from its fields
    classes, packb, option = _classes, ormsgpack.packb, _OPTION
    for x in objs[k:] if k else objs:
        spec = classes.get(type(x), False)
        if spec is False:
            spec = eligible(type(x))
        if spec is not None:
            d = x.__dict__
            if not x.__pydantic_extra__ and tuple(d) == spec[0]:
                # packed from durkv's copy when one can be taken (no caller's code runs
                # between the copy and the pack: the bytes are the copy's)
                c = copy_fields(d) if leading and copies is not None else None
                try:
                    body = packb([spec[1], spec[2], d if c is None else c,
                                  "model_validate_json"], option=option, default=_refuse)
                except Exception:   # something not exactly plain inside, or not encodable
                    pass
                else:
                    out.append(_ext5_header(len(body)) + body)
                    if leading:     # the field dict's own bytes: between the class's name
                        types.append(type(x))           # and the method's
                        if copies is not None and c is None:    # no copy: pack them all
                            fields = [packb([w.fields() for w in copies], option=option)[
                                1 if len(copies) < 16 else 3 if len(copies) < 65536 else 5:]]
                            copies = None
                        if copies is None:
                            fields.append(body[spec[3]:-_TAIL])
                        else:
                            copies.append(witness(c, type(x)))
                    continue
        out.append(dumps(x))
        leading = False
    if not types:
        return out, None
    return out, EncodedPrefix(types, None if copies is not None else b"".join(fields),
                              out[:len(types)], copies)


def _agrees() -> bool:
    """Whether this process's serializer writes the bytes :func:`dumps_messages` does, on a
    few messages of the common shapes (checked once: see the module docstring)."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    serializer = JsonPlusSerializer()
    sample = [HumanMessage(content=[{"type": "text", "text": "q"}], id="h"),
              AIMessage(content="a", id="a", tool_calls=[{"name": "t", "args": {"q": 1.5},
                                                          "id": "c"}],
                        usage_metadata={"input_tokens": 1, "output_tokens": 2,
                                        "total_tokens": 3}),
              ToolMessage(content="r", tool_call_id="c", artifact={"k": [None, True]})]
    try:
        fast = dumps_messages(sample, lambda x: b"")[0]
        # LangGraphSerde's bytes of a "msgpack" value: its tag 1, then the serializer's
        want = [(1, *serializer.dumps_typed(x)) for x in sample]
        if fast != [bytes((t,)) + b for t, name, b in want if name == "msgpack"]:
            return False
        # and pack_msgpack's, on the messages and the plain values of a checkpoint
        plain = [*sample, {"n": 1, "messages": [sample[0]], "s": "x", "f": 0.5}, 7, "t",
                 [1, None, True], {1: b"k"}]
        return all(serializer.dumps_typed(x) == ("msgpack", pack_msgpack(x)) for x in plain)
    except Exception:
        return False


_agreed: list[bool] = []      # [whether _agrees()], once computed


def is_jsonplus(serde: Any) -> bool:
    """Whether ``serde`` is exactly LangGraph's ``JsonPlusSerializer`` (a subclass or a
    wrapper, an ``EncryptedSerializer``, may encode otherwise), and encodes messages as
    this module does."""
    if JsonPlusSerializer is None or type(serde) is not JsonPlusSerializer:
        return False
    if not _agreed:
        _agreed.append(_agrees())
    return _agreed[0]
