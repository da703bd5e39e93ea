"""ShardedMap answers exactly as a dict would, whatever the operations and whether it has split into shards."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.core.shards import SHARDS, SPLIT_AT, ShardedMap

MISSING = object()

keys = st.text(alphabet="abcdef0123", min_size=0, max_size=4)
values = st.integers(0, 5)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, values),
        st.tuples(st.just("get"), keys),
        st.tuples(st.just("getitem"), keys),
        st.tuples(st.just("contains"), keys),
        st.tuples(st.just("setdefault"), keys, values),
        st.tuples(st.just("pop"), keys),
        st.tuples(st.just("pop_default"), keys),
        st.tuples(st.just("del"), keys),
        st.tuples(st.just("update"), st.lists(st.tuples(keys, values), max_size=8)),
        st.tuples(st.just("update_mapping"), st.dictionaries(keys, values, max_size=8)),
        st.tuples(st.just("put_all"), st.lists(st.tuples(keys, values), max_size=12)),
        st.tuples(st.just("clear")),
    ),
    max_size=120,
)


def _apply(target: dict | ShardedMap, op: tuple) -> object:
    """One operation on a dict or a ShardedMap; returns its answer, or the type of what it raised."""
    name, *args = op
    try:
        match name:
            case "set":
                target[args[0]] = args[1]
                return None
            case "get":
                return target.get(args[0], MISSING)
            case "getitem":
                return target[args[0]]
            case "contains":
                return args[0] in target
            case "setdefault":
                return target.setdefault(args[0], args[1])
            case "pop":
                return target.pop(args[0])
            case "pop_default":
                return target.pop(args[0], MISSING)
            case "del":
                del target[args[0]]
                return None
            case "update" | "update_mapping":
                target.update(args[0])
                return None
            case "put_all":  # ShardedMap's bulk insert, against a dict's update with the same pairs
                if isinstance(target, ShardedMap):
                    target.put_all([key for key, _ in args[0]], [value for _, value in args[0]])
                else:
                    target.update(args[0])
                return None
            case "clear":
                target.clear()
                return None
    except KeyError:
        return KeyError
    raise AssertionError(f"unknown operation {name}")


def _same(sharded: ShardedMap, plain: dict) -> None:
    assert len(sharded) == len(plain)
    assert bool(sharded) == bool(plain)
    assert sorted(sharded) == sorted(plain)
    assert sorted(sharded.keys()) == sorted(plain.keys())
    assert sorted(sharded.values()) == sorted(plain.values())
    assert sorted(sharded.items()) == sorted(plain.items())
    assert sharded == plain and plain == sharded
    assert sharded == ShardedMap(plain)


@settings(max_examples=300, deadline=None)
@given(operations, st.sampled_from([0, 1, 3, 10, SPLIT_AT]))
def test_a_sharded_map_answers_as_a_dict_does(ops, split_at):
    sharded: ShardedMap[str, int] = ShardedMap(split_at=split_at)
    plain: dict[str, int] = {}
    for op in ops:
        assert _apply(sharded, op) == _apply(plain, op), op
        _same(sharded, plain)


def test_a_map_splits_once_past_its_threshold_and_keeps_every_key():
    sharded: ShardedMap[str, int] = ShardedMap(split_at=100)
    for n in range(100):
        sharded[f"id{n}"] = n
    assert sharded.whole is not None
    sharded["id100"] = 100
    assert sharded.whole is None
    assert sharded == {f"id{n}": n for n in range(101)}
    # Spread over the shards. String hashes change with every process (PYTHONHASHSEED), so the bound must hold
    # for any seed: at 101 keys over 251 shards (0.4 a shard) some shard gets 5 about once in 60 seeds, 11 or more
    # once in 5 billion (Poisson); a map that did not spread them would hold all 101 in one.
    assert max(len(shard) for shard in sharded.shards) <= 10


def test_a_large_map_grows_a_shard_at_a_time():
    """No insertion resizes more than one shard: at most ~1/SHARDS of the entries move at once."""
    sharded: ShardedMap[str, int] = ShardedMap()
    for n in range(SPLIT_AT + 1):
        sharded[f"task-{n}"] = n
    shards = sharded.shards
    before = [len(shard) for shard in shards]
    sharded.update((f"more-{n}", n) for n in range(SPLIT_AT))
    assert sum(len(shard) for shard in shards) == sum(before) + SPLIT_AT  # the same dicts: none rebuilt whole


def test_a_map_compares_with_mappings_only():
    sharded = ShardedMap({"a": 1})
    assert sharded == {"a": 1} and sharded != {"a": 2} and sharded != {}
    assert sharded != [("a", 1)]
    assert ShardedMap() == {}
    with pytest.raises(TypeError):
        hash(sharded)


def test_an_unhashable_key_is_in_no_map():
    assert [] not in ShardedMap({"a": 1})
