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


@pytest.mark.parametrize("old, new", [
    (1, True), (1, 1.0), (0.0, -0.0), (1, 2 ** 64 // 2 ** 64), ("a", b"a"),
    ({"a": 1}, {"a": True}), ({"a": 1, "b": 2}, {"b": 2, "a": 1}), ([1], (1,)),
    ([[1.0]], [[1]]), ({"k": [0.0]}, {"k": [-0.0]}), ((1, "x"), (1.0, "x")),
])
def test_equal_values_of_another_type_or_form_are_not_the_same(old, new):
    """== takes each pair as equal; the serializer would store each differently (the
    first pair of int 1 and 2**64 // 2**64 is the same value: only the check of it)."""
    same = type(old) is type(new) and old == new and repr(old) == repr(new)
    assert has_prefix([new, "tail"], [old], 1) is same
    assert has_prefix([new], [old], 1, [None if type(old) in (int, str) else old]) is same


def test_other_objects_are_decided_by_the_callback_and_its_errors_propagate():
    class Boom:
        def __eq__(self, other):
            raise RuntimeError("== is never asked")

    assert not has_prefix([Boom()], [Boom()], 1)             # no callback: not the same
    seen = []

    def same(x, kept, old):
        seen.append((type(x), kept, type(old)))
        return True

    assert has_prefix([Boom()], [Boom()], 1, [b"bytes"], same)
    assert seen == [(Boom, b"bytes", Boom)]

    def boom(x, kept, old):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        has_prefix([Boom()], [Boom()], 1, [b"b"], boom)

    old = [Boom(), 2, 3]

    def shrinks(x, kept, o):
        old.clear()
        return True

    assert not has_prefix([Boom(), 2, 3], old, 3, [b"b", None, None], shrinks)


def test_plain_data_is_compared_against_the_kept_copy():
    """A plain item is compared with the copy the store keeps (what was stored), not the
    object that was put (edited in place since)."""
    put = {"a": [1]}
    kept = {"a": [1]}
    put["a"].append(2)                       # the caller edited it after the put
    assert has_prefix([{"a": [1]}], [put], 1, [kept])
    assert not has_prefix([{"a": [1, 2]}], [put], 1, [kept])


def test_only_lists():
    with pytest.raises(TypeError):
        has_prefix((1, 2), [1, 2], 2)


@given(st.lists(st.integers(-3, 3), max_size=30), st.lists(st.integers(-3, 3), max_size=30),
       st.integers(0, 31))
def test_matches_list_slicing(a, b, n):
    expected = len(a) >= n and len(b) >= n and a[:n] == b[:n]     # ints only: == is exact
    assert has_prefix(a, b, n) == expected


def test_join_tagged():
    from durkv._listprefix import join_tagged

    assert join_tagged(b"H", [b"\x01ab", b"\x01", b"\x01c"], 1) == b"Habc"
    assert join_tagged(b"", [], 1) == b""
    for bad in ([b"\x02a"], [b"\x01a", b""], [b"\x01a", "x"], [b"\x01a", bytearray(b"\x01")]):
        assert join_tagged(b"H", bad, 1) is None
