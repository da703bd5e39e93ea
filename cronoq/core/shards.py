"""ShardedMap: a map keyed by str (task ids, submission ids) whose growth never pauses its owner for long.

A Python dict grows by building a new table and moving every entry into it,
in one go, when it is two-thirds full: at a million task ids that is one
pause of about 30 ms, and the broker's maps of live tasks (the book's
records, the core's tasks, a tenant's submission ids) grow in lockstep, so
they used to pause together, in the same batch of submits. Here the keys
are spread over SHARDS dicts by their hash (a str caches its hash, so the
choice costs no hashing): each dict grows on its own, at its own moment,
and moves only its share of the entries.

A small map would pay for SHARDS empty dicts (about 16 KiB) and gains
nothing: a map starts as one dict, and splits into SHARDS once it holds
more than SPLIT_AT keys (moving SPLIT_AT entries once, well under a
millisecond). It never merges back.

Order: iteration goes shard by shard, in no order a caller can rely on —
not the order keys were inserted in. Callers that need an order keep it
elsewhere (the core's arrival numbers, cronoq.book.TaskBook.kept).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sized
from itertools import chain
from typing import Any, TypeVar, overload

V = TypeVar("V")
D = TypeVar("D")

SHARDS = 256
"""Dicts a large map is split into (a power of two: the shard is `hash(key) & (SHARDS - 1)`). At 10^6 keys, a
shard holds about 4,000: a resize moves that many entries (about 0.2 ms), where one dict moved them all."""

SPLIT_AT = 8_192
"""Keys past which a map splits into SHARDS. Below it, one dict: a resize moves at most this many entries."""

_MISSING: Any = object()


class ShardedMap(MutableMapping[str, V]):
    """A mutable mapping of str keys to values, held in one dict, or in SHARDS once it is large (see the module).

    It answers as a dict would (same contents, same lookups, `==` with any mapping), but iterates shard by
    shard: in no particular order. `keys()`, `values()` and `items()` are iterators, not views.

    A caller on a hot path may look up or remove a key in its shard itself, `m.shards[hash(key) & m.mask]`,
    saving a method call (more than the dict operation costs); never insert there (the map would not split),
    and read both attributes afresh after any insert (a split replaces them).
    """

    __slots__ = ("shards", "mask", "_split_at")
    shards: list[dict[str, V]]
    """The dicts that hold the entries: one, or SHARDS once the map has split (read-only)."""
    mask: int
    """`hash(key) & mask` is the index of the key's shard (read-only)."""

    def __init__(self, pairs: Mapping[str, V] | Iterable[tuple[str, V]] = (), *, split_at: int = SPLIT_AT) -> None:
        """`split_at`: keys past which the map splits (SPLIT_AT; tests make it split early)."""
        self.shards = [{}]
        self.mask = 0
        self._split_at = split_at
        if pairs:
            self.update(pairs)

    # The methods below each choose the shard inline (`hash(key) & self.mask`): they run several times
    # per task, and a helper call would cost more than the dict operation itself.

    def __getitem__(self, key: str) -> V:
        return self.shards[hash(key) & self.mask][key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.shards[hash(key) & self.mask].get(key, default)

    def __contains__(self, key: object) -> bool:
        try:
            return key in self.shards[hash(key) & self.mask]
        except TypeError:  # unhashable: in no dict
            return False

    def __setitem__(self, key: str, value: V) -> None:
        shard = self.shards[hash(key) & self.mask]
        shard[key] = value
        if len(shard) > self._split_at:
            self._split()

    def setdefault(self, key: str, default: V) -> V:  # type: ignore[override]
        """The value of `key`, inserting `default` first if it has none (one lookup for both)."""
        shard = self.shards[hash(key) & self.mask]
        value = shard.setdefault(key, default)
        if len(shard) > self._split_at:
            self._split()
        return value

    def __delitem__(self, key: str) -> None:
        del self.shards[hash(key) & self.mask][key]

    @overload
    def pop(self, key: str) -> V: ...
    @overload
    def pop(self, key: str, default: V | D) -> V | D: ...

    def pop(self, key: str, default: Any = _MISSING) -> Any:
        shard = self.shards[hash(key) & self.mask]
        if default is _MISSING:
            return shard.pop(key)
        return shard.pop(key, default)

    def update(self, pairs: Mapping[str, V] | Iterable[tuple[str, V]] = (), /, **more: V) -> None:  # type: ignore[override]
        """Insert every (key, value) of a mapping or of an iterable of pairs."""
        items: Iterable[tuple[str, V]] = chain(pairs.items() if isinstance(pairs, Mapping) else pairs, more.items())
        if not self.mask and isinstance(pairs, Sized) and len(self) + len(pairs) > self._split_at:
            self._split()  # it will split anyway: now, before the bulk comes (a restart's million records)
        if self.mask:  # split: no check per key
            shards, mask = self.shards, self.mask
            for key, value in items:
                shards[hash(key) & mask][key] = value
            return
        for key, value in items:
            shard = self.shards[hash(key) & self.mask]
            shard[key] = value
            if len(shard) > self._split_at:
                self._split()

    def clear(self) -> None:
        for shard in self.shards:
            shard.clear()

    def __len__(self) -> int:
        """O(shards): sum of the shards' sizes."""
        return sum(map(len, self.shards))

    def __bool__(self) -> bool:
        return any(self.shards)

    def __iter__(self) -> Iterator[str]:
        return chain.from_iterable(self.shards)

    def keys(self) -> Iterator[str]:  # type: ignore[override]
        return chain.from_iterable(self.shards)

    def values(self) -> Iterator[V]:  # type: ignore[override]
        return chain.from_iterable(map(dict.values, self.shards))

    def items(self) -> Iterator[tuple[str, V]]:  # type: ignore[override]
        return chain.from_iterable(map(dict.items, self.shards))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardedMap):
            other = dict(other.items())
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(self) == len(other) and dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"ShardedMap({dict(self.items())!r})"

    @property
    def split(self) -> bool:
        """Whether the map is held in SHARDS dicts (it held more than SPLIT_AT keys once)."""
        return self.mask != 0

    def _split(self) -> None:
        """Spread the one dict's entries over SHARDS dicts; from now on each grows on its own."""
        (whole,) = self.shards
        shards: list[dict[str, V]] = [{} for _ in range(SHARDS)]
        mask = SHARDS - 1
        for key, value in whole.items():
            shards[hash(key) & mask][key] = value
        self.shards, self.mask, self._split_at = shards, mask, 1 << 62
