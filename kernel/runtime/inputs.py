"""A call's inputs as items: each recorded once per run, the rest by reference.

docs/FORMAT.md 5a (``ir``): the inputs ``[args, kwargs]`` of a step or tool are a
sequence of items -- the elements of each positional argument that is a ``list``, every
other positional argument, then the keyword arguments. An agent passes its growing
message list to its model step on every turn; a record keeps the items the previous
record of that step name did not have (and a step's own result, which comes back as an
item of the next call, as a reference to it), so the journal grows by the new messages,
not by the history.

Two sides, both exact (the items' bytes decide, never an object's identity):

- :class:`InputRefs` (the writer, one per :class:`durkv.Run`): encodes a call's items,
  finds what an earlier record of the run already holds, and builds the record's fields;
- :func:`by_ref` (the fold) links an ``ir`` to the records it names, as they stand at
  that record, and :func:`decoded` rebuilds the value ``[args, kwargs]`` from the links.
"""

from __future__ import annotations

from typing import Any, Callable

from ..store import is_placed_item

__all__ = ["InputRefs", "Encoded", "ByRef", "Unreadable", "Placed", "by_ref", "decoded",
           "flatten", "item_bytes", "SMALL_INPUTS", "RECENT_RESULTS", "PLACED_ITEMS"]

# default serde: inputs up to this many bytes are journaled whole (`in`), as before items:
# a reference saves little there, and one encode of the whole value is the fastest path
SMALL_INPUTS = 1024
RECENT_RESULTS = 256     # step results a new item may refer to (the newest ones)
PLACED_ITEMS = 64        # items at least this long may be named by their place in the log


def flatten(args: Any, kwargs: Any) -> tuple[list[int], list]:
    """``(shape, items)`` of the inputs ``[args, kwargs]`` (FORMAT.md 5a ``ir``)."""
    shape: list[int] = []
    items: list = []
    for a in args:
        if type(a) is list:
            shape.append(len(a))
            items.extend(a)
        else:
            shape.append(-1)
            items.append(a)
    items.append(kwargs)
    return shape, items


def _unflatten(shape: list[int], items: list) -> list:
    args, i = [], 0
    for n in shape:
        if n < 0:
            args.append(items[i])
            i += 1
        else:
            args.append(items[i:i + n])
            i += n
    if i != len(items) - 1:
        raise Unreadable(f"the record's shape names {i + 1} items, it holds {len(items)}")
    return [args, items[i]]


def _count(shape: list[int]) -> int:
    return sum(1 if n < 0 else n for n in shape) + 1


# A call's inputs as a record keeps them, a plain tuple (built on every step, replayed or
# new: a NamedTuple's Python-level __new__ costs ~0.7 us more):
# (inputs: the `in` bytes or None, refs: the `ir` or None -- neither: secret or too
# large --, fp: the fingerprint, memo: what a later record referring to this one needs --
# (the serde bytes of every item, their canonical encodings or None, the serde's state of
# them or None) -- else None)
Encoded = tuple


class InputRefs:
    """The writer's memory of what the run's journal holds: per ``(kind, name)`` the items
    of the latest record it appended with inputs, and its newest step results by their
    bytes' fingerprint. Only records already appended are remembered (see
    :meth:`recorded`): a reference never points forward in the log. A name this writer has
    not recorded yet starts from the journal's latest entry of that name (``latest``, the
    run's folded state): a resumed conversation refers to the history recorded before."""

    __slots__ = ("values", "limit", "bases", "results", "whole", "latest", "seeded", "place",
                 "read")

    def __init__(self, values: Any, limit: int,
                 latest: Callable[[str, str], Any] | None = None,
                 place: Callable[[bytes], Any] | None = None,
                 read: Callable[[int, int, int], bytes] | None = None) -> None:
        self.values = values        # durkv.runtime.values.Values of the store's serde
        self.limit = limit          # the most new bytes a record keeps (MAX_INLINE_INPUTS)
        self.latest = latest        # (kind, name) -> the latest folded CallState with inputs
        # the store's Store.item_place / write_item: an item a pending write stored (a
        # ToolMessage in the run's checkpoints) is named by its place, not journaled again
        self.place = place
        self.read = read
        self.seeded: set[tuple[str, str]] = set()
        # the default serde is compositional: its whole encoding is the items' bytes joined
        self.whole = values.encode if values.default_serde else None
        # (kind, name) -> (step id, generation, its items' bytes, their canonical encodings
        # or None, the serde's state of its items or None: Values.dumps_items)
        self.bases: dict[tuple[str, str], tuple] = {}
        self.results: dict[int, tuple[str, int, bytes]] = {}

    def encode(self, kind: str, name: str, args: tuple, kwargs: dict,
               secret: bool) -> Encoded:
        """The record fields of a call's inputs (raises what the serde raises)."""
        v = self.values
        if self.whole is not None:
            whole, fp = self.whole([list(args), kwargs])
            if len(whole) <= SMALL_INPUTS or secret:    # the hot path: as before items
                return None if secret else whole, None, fp, None
            shape, objs = flatten(args, kwargs)
            items = [v.dumps(x) for x in objs]
            base = self._base(kind, name)
            return self._fields(shape, items, fp, whole, base, self._shared(base, items),
                                None, None)
        shape, objs = flatten(args, kwargs)
        if secret:
            items = v.dumps_items(objs, None)[0]
            return None, None, v.fingerprint_items(shape, v.canonical_items(objs, items)), None
        base = self._base(kind, name)
        # the serde may take the bytes of an unchanged prefix from the base's (it compares
        # bytes: LangGraphSerde, langgraph_messages.py)
        items, state = v.dumps_items(objs, None if base is None else base[4])
        k = self._shared(base, items)
        # the items shared with the base have its bytes: their canonical encodings are the
        # base's when they are of a type the canonical form takes as bytes (values.py)
        canon = v.canonical_items(objs, items, None if base is None else base[3], k)
        return self._fields(shape, items, v.fingerprint_items(shape, canon), None, base, k,
                            canon, state)

    def _base(self, kind: str, name: str) -> tuple | None:
        """The record of ``(kind, name)`` a new one may refer to (see ``bases``)."""
        base = self.bases.get((kind, name))
        if base is None and self.latest is not None and (kind, name) not in self.seeded:
            self.seeded.add((kind, name))       # once: the scan is O(entries)
            base = self._seed(kind, name)
            if base is not None:
                self.bases[(kind, name)] = base
        return base

    @staticmethod
    def _shared(base: tuple | None, items: list[bytes]) -> int:
        """How many first items ``items`` shares with ``base``, byte for byte."""
        k = 0
        if base is not None:
            bitems = base[2]
            n = min(len(items), len(bitems))
            if items[:n] == bitems[:n]:
                return n
            # the common case: a list grown at its end, the keyword arguments (the last
            # item) after it; list == list compares in C (bytes objects the serde took from
            # the base's are the same objects: no byte compared twice)
            if n > 1 and items[:n - 1] == bitems[:n - 1]:
                return n - 1
            while k < n and items[k] == bitems[k]:
                k += 1
        return k

    def _fields(self, shape: list[int], items: list[bytes], fp: int, whole: bytes | None,
                base: tuple | None, k: int, canon: tuple | None, state: Any) -> Encoded:
        ref = [base[0], base[1], k] if k else None
        new: list = []
        size = 0
        results, fingerprint, place = self.results, self.values.fingerprint, self.place
        for b in items[k:]:
            hit = results.get(fingerprint(b)) if results else None
            if hit is not None and hit[2] == b:
                # [g]: a result of the base's own step (the previous model call's answer)
                new.append([hit[1]] if ref is not None and hit[0] == ref[0]
                           else [hit[0], hit[1]])
                continue
            at = place(b) if place is not None and len(b) >= PLACED_ITEMS else None
            if at is not None:
                new.append(list(at))
            else:
                new.append(b)
                size += len(b)
        memo = (items, canon, state)
        if ref is None and whole is not None and all(type(x) is bytes for x in new):
            # nothing shared: the record is written as before items existed
            keep = whole if len(whole) <= self.limit else None
            return keep, None, fp, memo if keep is not None else None
        if size > self.limit:
            return None, None, fp, None
        return None, [shape, ref, new], fp, memo

    def _seed(self, kind: str, name: str) -> tuple | None:
        """The journal's latest entry of ``(kind, name)`` as a base: its items' bytes."""
        e = self.latest(kind, name)
        items = None if e is None else item_bytes(e.inputs, self.values, self.read)
        return None if items is None else (e.step_id, e.gen, items, None, None)

    def recorded(self, sid: str, gen: int, kind: str, name: str, enc: Encoded | None,
                 result: bytes | None) -> None:
        """A record of step ``(sid, gen)`` was appended: later records may refer to its
        inputs (``enc``) and its ``result``."""
        bases = self.bases
        if enc is not None and enc[3] is not None:
            bases[(kind, name)] = (sid, gen, *enc[3])
        elif bases and enc is not None:     # kept no items to refer to (secret, too large,
            bases.pop((kind, name), None)   # small): the reader's (sid, gen) may hold none
        if result is not None and bases:    # only a run with items to encode looks results up
            results = self.results
            results[self.values.fingerprint(result)] = (sid, gen, result)
            if len(results) > RECENT_RESULTS:
                try:        # the oldest (dicts keep their order)
                    del results[next(iter(results))]
                except (RuntimeError, KeyError, StopIteration):
                    pass    # another thread (steps with key=) changed it: it evicts next time


# ---- the reader's side ------------------------------------------------------------------

class Unreadable(Exception):
    """A record's inputs cannot be rebuilt: a record it refers to is not in the journal
    (cut by a repair), or the record is malformed."""


class Placed:
    """A new item named by its place in the log, ``[lsn, entry, index]`` (an item of a
    pending write: FORMAT.md 5a), read when the inputs are rebuilt."""

    __slots__ = ("lsn", "entry", "index")

    def __init__(self, lsn: int, entry: int, index: int) -> None:
        self.lsn, self.entry, self.index = lsn, entry, index

    def bytes_with(self, read: Callable[[int, int, int], bytes] | None) -> bytes:
        """The item's bytes, read by ``read`` (Store.write_item). Raises Unreadable."""
        if read is None:
            raise Unreadable(f"an item is in frame {self.lsn} of the store, and no store "
                             "was given to read it")
        try:
            return read(self.lsn, self.entry, self.index)
        except Exception as e:
            raise Unreadable(f"item {self.index} of entry {self.entry} of frame {self.lsn}, "
                             f"one of its items, cannot be read ({type(e).__name__}: "
                             f"{e})") from None


class ByRef:
    """A record's ``ir`` linked to what it refers to, as the journal stood at the record:
    ``base`` the referred record's inputs (``in`` bytes, a ByRef, or an
    :class:`Unreadable` when it was not found), ``new`` the new items' bytes (or an
    Unreadable)."""

    __slots__ = ("shape", "base", "k", "new", "items")

    def __init__(self, shape: list[int], base: Any, k: int, new: list) -> None:
        self.shape, self.base, self.k, self.new = shape, base, k, new
        self.items: list | None = None      # the decoded items, once rebuilt


def by_ref(ir: Any, find: Callable[[str, int], Any]) -> ByRef:
    """Link the ``ir`` of a record; ``find(step_id, gen)`` gives the folded entry (its
    ``inputs`` and ``result`` as of this record) or None."""
    try:
        shape, base, new = ir
        k = 0
        ref: Any = None
        if base is not None:
            s, g, k = base
            e = find(s, g)
            ref = e.inputs if e is not None and e.inputs is not None else Unreadable(
                f"step {s} generation {g}, whose inputs it shares, is not in the journal")
        items = []
        for x in new:
            if is_placed_item(x):
                x = Placed(*x)
            elif type(x) is not bytes:
                # [s, g], or [g]: a result of the base's step (a base is required)
                rs, rg = (base[0], x[0]) if len(x) == 1 and base is not None else x
                e = find(rs, rg)
                x = e.result if e is not None and e.result is not None else Unreadable(
                    f"step {rs} generation {rg}, whose result is one of its items, is not in "
                    "the journal")
            items.append(x)
        if type(k) is not int or k < 0 or k + len(items) != _count(shape):
            raise ValueError(f"{k} shared and {len(items)} new items for shape {shape}")
    except Exception as e:
        return ByRef([], Unreadable(f"a malformed `ir` ({type(e).__name__}: {e})"), 0, [])
    return ByRef(shape, ref, k, items)


def item_bytes(inputs: Any, values: Any,
               read: Callable[[int, int, int], bytes] | None = None) -> list[bytes] | None:
    """The serde bytes of every item of a folded record's inputs, as a reader rebuilds
    them (None: not rebuildable without decoding what another serde wrote, or lost);
    ``read``: Store.write_item, for items named by their place in the log."""
    chain = []
    while type(inputs) is ByRef:
        chain.append(inputs)
        inputs = inputs.base
    items: list = []
    if inputs is not None:      # an `in`: split by decoding it (the default serde only)
        if type(inputs) is not bytes or not values.default_serde:
            return None
        try:
            v = values.loads(inputs)
            items = [values.dumps(x) for x in flatten(v[0], v[1])[1]]
        except Exception:
            return None
    for y in reversed(chain):
        if y.k > len(items):
            return None
        new = []
        for b in y.new:
            if type(b) is Placed:
                try:
                    b = b.bytes_with(read)
                except Unreadable:
                    return None
            elif type(b) is not bytes:
                return None
            new.append(b)
        items = items[:y.k] + new
    return items


def decoded(inputs: Any, loads: Callable[[bytes], Any],
            read: Callable[[int, int, int], bytes] | None = None) -> Any:
    """The value ``[args, kwargs]`` of a record's inputs (``in`` bytes or a :class:`ByRef`);
    ``read``: Store.write_item, for items named by their place in the log.

    Raises:
        Unreadable: a record or an item it refers to is missing; an item does not decode.
    """
    if type(inputs) is bytes:
        return loads(inputs)
    return _unflatten(inputs.shape, _items(inputs, loads, read))


def _items(x: ByRef, loads: Callable[[bytes], Any],
           read: Callable[[int, int, int], bytes] | None) -> list:
    """The decoded items of ``x``: its chain of bases walked without recursion (a chain is
    as long as the run), each link's items kept for the records that refer to it."""
    chain = []
    link: Any = x
    while type(link) is ByRef and link.items is None:
        chain.append(link)
        link = link.base
    if isinstance(link, Unreadable):
        raise link
    if link is None:
        prefix: list = []
    elif type(link) is bytes:        # an `in`: split by the same rule (the default serde)
        v = loads(link)
        prefix = flatten(v[0], v[1])[1]
    else:
        prefix = link.items
    for y in reversed(chain):
        if y.k > len(prefix):
            raise Unreadable(f"it shares {y.k} items of a record that holds {len(prefix)}")
        new = []
        for b in y.new:
            if isinstance(b, Unreadable):
                raise b
            new.append(loads(b.bytes_with(read) if type(b) is Placed else b))
        y.items = prefix = prefix[:y.k] + new
    return x.items
