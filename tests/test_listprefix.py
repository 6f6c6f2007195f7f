"""durkv._listprefix.has_prefix: the exact prefix test behind delta encoding."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durkv._listprefix import has_prefix


def test_identical_items_and_lengths():
    old = [object() for _ in range(1000)]
    assert has_prefix(old + [1], old, 1000)
    assert has_prefix(old, old, 1000)
    assert has_prefix(old, old, 0) and has_prefix([], [], 0)
    assert not has_prefix(old[:999], old, 1000)         # new too short
    assert not has_prefix(old + [1], old, 1001)         # old too short
    assert not has_prefix(old, old, -1)


def test_equal_but_not_identical_items_count_as_equal():
    old = [{"id": i, "text": f"m{i}"} for i in range(50)]
    new = [dict(m) for m in old] + [{"id": 50}]
    assert has_prefix(new, old, 50)


def test_a_replaced_item_anywhere_is_seen():
    old = [{"id": i} for i in range(100)]
    for pos in (0, 1, 37, 98, 99):
        new = list(old) + [{"id": 100}]
        new[pos] = {"id": pos, "edited": True}
        assert not has_prefix(new, old, 100), pos


def test_eq_raising_propagates_and_eq_mutating_is_safe():
    class Boom:
        def __eq__(self, other):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        has_prefix([Boom()], [Boom()], 1)

    old = [1, 2, 3]

    class Shrinks:
        def __eq__(self, other):
            old.clear()
            return True

    assert not has_prefix([Shrinks(), 2, 3], old, 3)


def test_only_lists():
    with pytest.raises(TypeError):
        has_prefix((1, 2), [1, 2], 2)


@given(st.lists(st.integers(-3, 3), max_size=30), st.lists(st.integers(-3, 3), max_size=30),
       st.integers(0, 31))
def test_matches_list_slicing(a, b, n):
    expected = len(a) >= n and len(b) >= n and a[:n] == b[:n]
    assert has_prefix(a, b, n) == expected


def test_join_tagged():
    from durkv._listprefix import join_tagged

    assert join_tagged(b"H", [b"\x01ab", b"\x01", b"\x01c"], 1) == b"Habc"
    assert join_tagged(b"", [], 1) == b""
    for bad in ([b"\x02a"], [b"\x01a", b""], [b"\x01a", "x"], [b"\x01a", bytearray(b"\x01")]):
        assert join_tagged(b"H", bad, 1) is None
