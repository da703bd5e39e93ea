"""Placement of pools on cluster members (cronoq.wire.clustermap): rendezvous hashing is deterministic, spreads pools,
and moves only what it must when a member comes or goes. Pure: no broker, no sockets."""

from __future__ import annotations

from collections import Counter
from types import MappingProxyType

from hypothesis import given, settings, strategies as st

from cronoq.wire.clustermap import Cluster, Member, cluster_map, member_of_task, rendezvous_owner

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=12)
member_sets = st.lists(names, min_size=1, max_size=8, unique=True)
pool_sets = st.lists(names, min_size=1, max_size=40, unique=True)


def cluster_of(members: list[str], pinned: dict[str, str] | None = None) -> Cluster:
    return Cluster(tuple(Member(n, (f"tcp://{n}:5555",), (f"tcp://{n}:5556",)) for n in members),
                   MappingProxyType(pinned or {}))


@given(member_sets, pool_sets)
def test_the_owner_is_a_member_and_does_not_depend_on_member_order(members: list[str], pools: list[str]) -> None:
    for pool in pools:
        owner = rendezvous_owner(pool, members)
        assert owner in members
        assert rendezvous_owner(pool, list(reversed(members))) == owner


@given(member_sets, names, pool_sets)
def test_adding_a_member_moves_only_the_pools_it_wins(members: list[str], new: str, pools: list[str]) -> None:
    if new in members:
        return
    for pool in pools:
        before, after = rendezvous_owner(pool, members), rendezvous_owner(pool, members + [new])
        assert after in (before, new)


@given(st.lists(names, min_size=2, max_size=8, unique=True), st.data(), pool_sets)
def test_removing_a_member_moves_only_its_own_pools(members: list[str], data: st.DataObject, pools: list[str]) -> None:
    gone = data.draw(st.sampled_from(members))
    rest = [m for m in members if m != gone]
    for pool in pools:
        before = rendezvous_owner(pool, members)
        if before != gone:
            assert rendezvous_owner(pool, rest) == before


def test_the_hash_is_stable_across_processes_and_releases() -> None:
    # Fixed here so that a change of hash, which would move pools on every upgrade, cannot go unnoticed.
    owners = [rendezvous_owner(f"pool-{i}", ["b1", "b2", "b3"]) for i in range(8)]
    assert owners == [rendezvous_owner(f"pool-{i}", ["b3", "b1", "b2"]) for i in range(8)]
    assert owners == FIXED_OWNERS


FIXED_OWNERS = ["b3", "b2", "b2", "b2", "b2", "b2", "b2", "b1"]  # blake2b-64 of "member\0pool", highest wins


def test_pools_spread_over_the_members() -> None:
    counts = Counter(rendezvous_owner(f"pool-{i}", ["b1", "b2", "b3"]) for i in range(3000))
    assert set(counts) == {"b1", "b2", "b3"}
    assert all(800 < n < 1200 for n in counts.values()), counts


@given(member_sets, pool_sets, st.data())
@settings(max_examples=50)
def test_a_pinned_pool_goes_where_it_is_pinned_and_every_pool_has_one_owner(
        members: list[str], pools: list[str], data: st.DataObject) -> None:
    pinned = {pool: data.draw(st.sampled_from(members)) for pool in pools[: len(pools) // 2]}
    cluster = cluster_of(members, pinned)
    placement = cluster.placement(pools)
    assert sorted(p for owned in placement.values() for p in owned) == sorted(pools)
    for pool, member in pinned.items():
        assert pool in placement[member]


def test_the_map_version_changes_with_placement_only() -> None:
    cluster = cluster_of(["b1", "b2"], {"a": "b1"})
    one = cluster_map(cluster, ["a", "b"], member="b1")
    assert one["version"] == cluster_map(cluster, ["a", "b"], member="b2")["version"]
    assert one["version"] == cluster_map(cluster, ["a", "b"], member="b1", draining=["z"])["version"]
    moved = cluster_map(cluster_of(["b1", "b2"], {"a": "b2"}), ["a", "b"], member="b1")
    assert moved["version"] != one["version"]


def test_a_task_id_names_its_member() -> None:
    assert member_of_task("b2:3f0c") == "b2"
    assert member_of_task("3f0c") is None
    assert member_of_task(":3f0c") is None
