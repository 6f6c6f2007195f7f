"""Compact step ids in journal heads (docs/FORMAT.md 5a, "Compact step ids").

A step called inside a LangGraph node has the id ``<task_id>:<index>``: a UUID's 36
characters of text, a colon and a decimal index, in four places of an agent's tool cycle.
In a segment whose header has flag ``STEP_IDS`` (FORMAT.md section 2) the writer packs such
a str as msgpack extension type 1 -- the UUID's 16 bytes, then the index big-endian in the
fewest bytes (none for 0) -- and every reader of heads turns it back into the very str.
csrc/recpack.c packs it in C; :func:`with_step_ids` is the same rule for the Python path
(tests/test_recpack.py holds the two to the same bytes).
"""

from __future__ import annotations

from typing import Any

import msgpack

__all__ = ["STEP_ID_EXT", "step_id_data", "step_id_text", "with_step_ids", "unpackb"]

STEP_ID_EXT = 1
_HEX = frozenset("0123456789abcdef")
_DASHES = (8, 13, 18, 23)


def step_id_data(s: str) -> bytes | None:
    """The extension data of ``s`` when it is ``U:N`` (U a canonical lowercase UUID, N a
    decimal below 2**64 with no leading zero), else None.

    >>> step_id_data("0a46480b-33fa-f0f3-b8f3-a45efaa708b5:0").hex()
    '0a46480b33faf0f3b8f3a45efaa708b5'
    >>> step_id_data("0a46480b-33fa-f0f3-b8f3-a45efaa708b5:01") is None
    True
    """
    if not 38 <= len(s) <= 57 or s[36] != ":" or any(s[i] != "-" for i in _DASHES):
        return None
    hexpart = s[:8] + s[9:13] + s[14:18] + s[19:23] + s[24:36]
    digits = s[37:]
    if not set(hexpart) <= _HEX or not digits.isascii() or not digits.isdigit():
        return None
    if len(digits) > 1 and digits[0] == "0":
        return None
    n = int(digits)
    if n >= 1 << 64:
        return None
    return bytes.fromhex(hexpart) + n.to_bytes((n.bit_length() + 7) // 8, "big")


def step_id_text(data: bytes) -> str:
    """The str a compact step id stands for. Raises ValueError for data that no writer
    makes (another length, an index with a leading zero byte).

    >>> step_id_text(bytes(16) + b"\\x07")
    '00000000-0000-0000-0000-000000000000:7'
    """
    if not 16 <= len(data) <= 24 or (len(data) > 16 and data[16] == 0):
        raise ValueError(f"a compact step id of {len(data)} bytes {data.hex()!r:.60} is not "
                         "one any writer makes (docs/FORMAT.md 5a)")
    h = data[:16].hex()
    return (f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}:"
            f"{int.from_bytes(data[16:], 'big')}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == STEP_ID_EXT:
        return step_id_text(data)
    return msgpack.ExtType(code, data)


def unpackb(b: Any) -> Any:
    """A record head decoded: str as str, arrays as lists (msgpack's defaults), a compact
    step id as its str. Raises what msgpack raises, or ValueError for a bad compact id."""
    return msgpack.unpackb(b, strict_map_key=False, ext_hook=_ext_hook)


def with_step_ids(v: Any, depth: int = 0) -> Any:
    """``v`` (a journal record's map) with every str value of the compact form replaced by
    its extension (map keys left alone): what csrc/recpack.c writes, for the records it
    hands to the Python path. Containers msgpack packs as maps and arrays are walked; a str
    subclass is left as it is (msgpack packs it as a str)."""
    if type(v) is str:
        data = step_id_data(v)
        return v if data is None else msgpack.ExtType(STEP_ID_EXT, data)
    if depth > 520:         # msgpack refuses it anyway: leave it to say so
        return v
    if isinstance(v, dict):
        return {k: with_step_ids(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [with_step_ids(x, depth + 1) for x in v]
    return v
