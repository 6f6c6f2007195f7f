"""``same``: equal AND of the same type, recursively -- what a replay or a read must give back
(shared by the serde and the runtime value tests)."""

from __future__ import annotations

import datetime as dt
from typing import Any


def same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (a, b)
    assert a == b
    if isinstance(a, (dt.datetime, dt.time)):       # == compares instants, not zones
        assert a.tzinfo == b.tzinfo and a.fold == b.fold, (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        for x, y in zip(a, b):
            same(x, y)
