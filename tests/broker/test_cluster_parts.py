"""The pure parts a cluster adds around the broker: a worker's split of its slots, the pools it serves on each
member, the cluster lines of `cronoq status`, and the member label on metrics."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st
from prometheus_client import generate_latest

from cronoq.broker.exposition import registry_for
from cronoq.broker.metrics import BrokerMetrics
from cronoq.client.text import status_text, top_frame
from cronoq.errors import InvalidArgument
from cronoq.worker.cluster import split_slots, wanted_pools


@given(st.integers(1, 64), st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 10), min_size=1))
def test_a_split_never_exceeds_concurrency_and_gives_every_member_a_slot(concurrency: int, owned: dict) -> None:
    if len(owned) > concurrency:
        with pytest.raises(InvalidArgument, match="at least"):
            split_slots(concurrency, owned)
        return
    shares = split_slots(concurrency, owned)
    assert set(shares) == set(owned)
    assert sum(shares.values()) == concurrency
    assert all(share >= 1 for share in shares.values())


def test_a_split_follows_the_pools_each_member_owns() -> None:
    assert split_slots(8, {"b1": 1, "b2": 3}) == {"b1": 2, "b2": 6}
    assert split_slots(3, {"b1": 1, "b2": 2}) == {"b1": 1, "b2": 2}


def test_a_worker_serves_what_each_member_owns_and_what_it_still_drains() -> None:
    value = {"members": [{"name": "b1", "pools": ["a"]}, {"name": "b2", "pools": ["b", "moved"]},
                         {"name": "b3", "pools": ["not-mine"]}]}
    assert wanted_pools(value, ["a", "b", "moved"], {"b1": ["moved"]}) == {
        "b1": (["a"], ["moved"]), "b2": (["b", "moved"], [])}


CLUSTER_STATS = {
    "cluster": "0123456789abcdef", "workers": 1,
    "members": {"b1": {"workers": 1, "pools": {"a": {"draining": False}, "old": {"draining": True}}},
                "b2": {"unreachable": "no answer within 2 s"}},
    "pools": {"a": {"member": "b1", "paused": False, "draining": False, "fair": False, "queued": 3, "delayed": 0,
                    "running": 0, "dispatched": 7, "workers": 1, "classes": {}, "tenants": {}}},
}


def test_status_names_each_member_its_pools_and_the_unreachable_ones() -> None:
    text = status_text(CLUSTER_STATS)
    assert "cluster map 0123456789abcdef: 2 members" in text
    assert "member b1: pools a, draining old; workers connected 1" in text
    assert "member b2: UNREACHABLE (no answer within 2 s)" in text
    assert "pool a [member b1]: queued 3" in text
    assert "unreachable cluster members: b2" in top_frame(CLUSTER_STATS, None, 0.0)


def test_a_lone_brokers_status_has_no_cluster_lines() -> None:
    lone = {"workers": 0, "pools": {}}
    assert "cluster" not in status_text(lone) and "member" not in status_text(lone)


def test_every_metric_of_a_member_carries_its_name() -> None:
    stats = {"workers": 2, "pools": {}}
    text = generate_latest(registry_for(lambda: stats, BrokerMetrics(), "b1")).decode()
    assert 'cronoq_workers_connected{member="b1"} 2.0' in text
    lone = generate_latest(registry_for(lambda: stats, BrokerMetrics())).decode()
    assert "cronoq_workers_connected 2.0" in lone and "member" not in lone
