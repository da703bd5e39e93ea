"""ShardedMap: a map with an entry per task (by task id, submission id, key) whose growth never pauses for long.

A Python dict grows by building a new table and moving every entry into it,
in one go, when it is two-thirds full: at a million task ids that is one
pause of about 30 ms, and the broker's maps of live tasks (the book's
records, the core's tasks, a tenant's submission ids) grow in lockstep, so
they used to pause together, in the same batch of submits. Here the keys
are spread over SHARDS dicts by their hash (a str caches its hash, so the
choice costs no hashing; a tuple of them hashes its items' cached ones):
each dict grows on its own, at its own moment, and moves only its share of
the entries.

A small map would pay for SHARDS empty dicts (about 16 KiB) and gains
nothing: a map starts as one dict, and splits into SHARDS once it holds
more than SPLIT_AT keys (moving SPLIT_AT entries once, about a
millisecond). It never merges back.

Cost: choosing a shard (`hash(key) % count`) costs about 50 ns, more than
the dict operation; a method call on this class about 70 ns more. So the
broker's hottest paths (a few operations per task) choose the shard
themselves, and a map that has not split skips the hashing:

    shard = m.whole or m.shards[hash(key) % m.count]   # `whole`: the one dict, until the map splits
    shard.get(key); shard.pop(key, None)               # look up, remove: as in any dict
    shard[key] = value                                 # insert: then let the map split if it must
    if len(shard) > m.split_at:
        m.split()

(An empty `whole` is falsy: the second branch then finds that same dict.)

Order: iteration goes shard by shard, in no order a caller can rely on —
not the order keys were inserted in. Callers that need an order keep it
elsewhere (the core's arrival numbers, cronoq.book.taskbook.TaskBook.kept).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence, Sized
from itertools import chain
from typing import Any, Hashable, TypeVar, overload

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")

SHARDS = 251
"""Dicts a large map is split into. A prime: a key's shard is `hash(key) % SHARDS`, which leaves the low bits of
the hash — those a dict places its keys by — as varied inside a shard as among all keys. (With `hash & 255` every
key of a shard shares its low 8 bits, and a shard's table fills 1 slot in 256 first: lookups cost a third more.)
At 10^6 keys a shard holds about 4,000: a resize moves that many entries (about 0.2 ms), where one dict moved
them all."""

SPLIT_AT = 8_192
"""Keys past which a map splits into SHARDS. Below it, one dict: a resize moves at most this many entries."""

_MISSING: Any = object()


class ShardedMap(MutableMapping[K, V]):
    """A mutable mapping, held in one dict, or in SHARDS dicts once it is large (see the module).

    It answers as a dict would (same contents, same lookups, `==` with any mapping), but iterates shard by
    shard: in no particular order. `keys()`, `values()` and `items()` are iterators, not views. The
    attributes are read-only but for the inline operations the module describes.
    """

    __slots__ = ("whole", "shards", "count", "split_at")
    whole: dict[K, V] | None
    """The one dict that holds every entry, until the map splits; then None."""
    shards: list[dict[K, V]]
    """The dicts that hold the entries: `[whole]`, or SHARDS of them once the map has split."""
    count: int
    """How many shards: `hash(key) % count` is the index of the key's shard."""
    split_at: int
    """Past this many entries in its one dict, the map splits (`split()`); once split, never again."""

    def __init__(self, pairs: Mapping[K, V] | Iterable[tuple[K, V]] = (), *, split_at: int = SPLIT_AT) -> None:
        """`split_at`: keys past which the map splits (SPLIT_AT; tests make it split early)."""
        self.whole = {}
        self.shards = [self.whole]
        self.count = 1
        self.split_at = split_at
        if pairs:
            self.update(pairs)

    def __getitem__(self, key: K) -> V:
        return (self.whole or self.shards[hash(key) % self.count])[key]

    def get(self, key: K, default: Any = None) -> Any:
        return (self.whole or self.shards[hash(key) % self.count]).get(key, default)

    def __contains__(self, key: object) -> bool:
        try:
            return key in (self.whole or self.shards[hash(key) % self.count])
        except TypeError:  # unhashable: in no dict
            return False

    def __setitem__(self, key: K, value: V) -> None:
        shard = self.whole or self.shards[hash(key) % self.count]
        shard[key] = value
        if len(shard) > self.split_at:
            self.split()

    def setdefault(self, key: K, default: V) -> V:  # type: ignore[override]
        """The value of `key`, inserting `default` first if it has none (one lookup for both)."""
        shard = self.whole or self.shards[hash(key) % self.count]
        value = shard.setdefault(key, default)
        if len(shard) > self.split_at:
            self.split()
        return value

    def __delitem__(self, key: K) -> None:
        del (self.whole or self.shards[hash(key) % self.count])[key]

    @overload
    def pop(self, key: K) -> V: ...
    @overload
    def pop(self, key: K, default: V | D) -> V | D: ...

    def pop(self, key: K, default: Any = _MISSING) -> Any:
        shard = self.whole or self.shards[hash(key) % self.count]
        if default is _MISSING:
            return shard.pop(key)
        return shard.pop(key, default)

    def update(self, pairs: Mapping[K, V] | Iterable[tuple[K, V]] = (), /, **more: V) -> None:  # type: ignore[override]
        """Insert every (key, value) of a mapping or of an iterable of pairs."""
        if not isinstance(pairs, Sized):  # a generator or a zip (a restart's submission ids): counted at C speed
            pairs = list(pairs)
        items: Iterable[tuple[K, V]] = chain(pairs.items() if isinstance(pairs, Mapping) else pairs, more.items())
        if self.whole is not None and len(self) + len(pairs) > self.split_at:
            self.split()  # it will split anyway: now, before the bulk comes (a restart's million records)
        if self.whole is None:  # split: no check per key
            shards, count = self.shards, self.count
            for key, value in items:
                shards[hash(key) % count][key] = value  # type: ignore[index]
            return
        for key, value in items:
            self[key] = value

    def put_all(self, keys: Sequence[K], values: Sequence[V]) -> None:
        """`self[keys[i]] = values[i]` for each i, in that order (as many values as keys): a restart's bulk,
        without a tuple per pair, and one dict update while the map has not split."""
        whole = self.whole
        if whole is not None:
            if len(whole) + len(keys) <= self.split_at:
                whole.update(zip(keys, values))
                return
            self.split()
        shards, count = self.shards, self.count
        for key, value in zip(keys, values):
            shards[hash(key) % count][key] = value

    def clear(self) -> None:
        for shard in self.shards:
            shard.clear()

    def __len__(self) -> int:
        """O(shards): the sum of the shards' sizes."""
        return sum(map(len, self.shards))

    def __bool__(self) -> bool:
        return any(self.shards)

    def __iter__(self) -> Iterator[K]:
        return chain.from_iterable(self.shards)

    def keys(self) -> Iterator[K]:  # type: ignore[override]
        return chain.from_iterable(self.shards)

    def values(self) -> Iterator[V]:  # type: ignore[override]
        return chain.from_iterable(map(dict.values, self.shards))

    def items(self) -> Iterator[tuple[K, V]]:  # type: ignore[override]
        return chain.from_iterable(map(dict.items, self.shards))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(self) == len(other) and dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"ShardedMap({dict(self.items())!r})"

    def split(self) -> None:
        """Spread the one dict's entries over SHARDS dicts; from now on each grows on its own."""
        whole = self.whole
        if whole is None:
            return
        shards: list[dict[K, V]] = [{} for _ in range(SHARDS)]
        count = SHARDS
        for key, value in whole.items():
            shards[hash(key) % count][key] = value
        self.whole, self.shards, self.count, self.split_at = None, shards, count, 1 << 62
