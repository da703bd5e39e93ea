"""What of the broker's stats a token pinned to a tenant is given (cronoq.broker.statistics.visible_stats): the
reply of `stats` to it and the dashboard's overview both start from this. A stats map as the broker builds it."""

from __future__ import annotations

import json

from cronoq.broker.auth import OPEN, Principal
from cronoq.broker.statistics import visible_stats


def tenant(queued: int, running: int = 0, dispatched: int = 0, lag: float = 1.5) -> dict:
    return {"weight": 1.0, "queued": queued, "delayed": 0, "running": running, "dispatched": dispatched, "lag": lag}


STATS = {
    "pools": {"llm": {
        "paused": False, "draining": False, "fair": True, "max_in_flight": 8, "workers": 2, "ready_workers": 1,
        "queued": 111, "delayed": 0, "running": 6, "dispatched": 1000, "dispatch_rate": 42.0,
        "classes": {"high": {"queued": 100, "delayed": 0, "running": 0, "dispatched": 0, "virtual_time": 3.0}},
        "tenants": {"acme": tenant(1, 1, 10), "acme/search": tenant(10, 2, 90), "acmex": tenant(50, 1, 300),
                    "globex": tenant(50, 2, 600), "": tenant(0)},
        "tenant_count": 5,
        "ceilings": {"acme": {"limit": 4, "running": 3, "capped": False}, "globex": {"limit": 2, "running": 2,
                                                                                  "capped": True}},
        "ceiling_count": 2,
        "share_by": "runtime", "share_unit": "seconds",
        "rates": {"acme/search": {"rate": 5.0, "tokens": 0.0, "limited": True, "next_start_in": 0.2},
                  "globex": {"rate": 1.0, "tokens": 1.0, "limited": False, "next_start_in": None}},
        "minimums": {"acmex": {"minimum": 2, "running": 1, "under": True}},
    }},
    "workers": 2,
    "schedules": {"nightly": {"tenant": "globex", "pool": "llm"},
                  "acme-report": {"tenant": "acme/search", "pool": "llm"}},
    "memory": {"records": 5000}, "store": {"bytes": 1},
}


def test_an_unpinned_token_gets_everything_as_it_is():
    assert visible_stats(STATS, OPEN) is STATS
    assert visible_stats(STATS, Principal("viewer")) is STATS


def test_a_pinned_token_gets_its_subtree_and_the_pools_settings_only():
    seen = visible_stats(STATS, Principal("viewer", "acme"))
    pool = seen["pools"]["llm"]
    assert set(pool["tenants"]) == {"acme", "acme/search"}  # not acmex: subtrees are whole path segments
    assert (pool["queued"], pool["running"], pool["dispatched"], pool["tenant_count"]) == (11, 3, 100, 2)
    assert pool["tenants"]["acme"]["lag"] == 0.0  # measured against siblings it may not see
    assert pool["tenants"]["acme/search"]["lag"] == 1.5
    assert set(pool["ceilings"]) == {"acme"} and pool["ceiling_count"] == 1
    assert set(pool["rates"]) == {"acme/search"} and pool["minimums"] == {}
    assert (pool["share_by"], pool["share_unit"]) == ("runtime", "seconds")
    assert pool["classes"] == {} and "dispatch_rate" not in pool and "ready_workers" not in pool
    assert (pool["paused"], pool["fair"], pool["max_in_flight"], pool["workers"]) == (False, True, 8, 2)
    assert set(seen["schedules"]) == {"acme-report"} and seen["memory"] == {} and seen["store"] == {}
    assert seen["tenant"] == "acme"
    text = json.dumps(seen)
    assert "globex" not in text and "acmex" not in text and "5000" not in text
    assert STATS["pools"]["llm"]["tenants"]["acme"]["lag"] == 1.5  # the shared map is left as it was


def test_a_token_pinned_below_the_top_does_not_see_its_parent():
    pool = visible_stats(STATS, Principal("admin", "acme/search"))["pools"]["llm"]
    assert set(pool["tenants"]) == {"acme/search"} and pool["ceilings"] == {} and pool["queued"] == 10


def test_weighted_shares_are_parts_of_the_pinned_nodes_and_ancestors_outside_are_dropped():
    # As the core lists a tree: weighted shares of the whole pool, ancestors without own tasks in tree_nodes.
    pool = {**STATS["pools"]["llm"], "tenants": {
        "acme/search": {**tenant(10), "weighted_share": 0.5, "own_weighted_share": 0.5, "own_lag": -0.5},
        "acme/ads": {**tenant(10), "weighted_share": 0.25, "own_weighted_share": 0.25, "own_lag": 0.0},
        "globex/x": {**tenant(10), "weighted_share": 0.25, "own_weighted_share": 0.25, "own_lag": 0.0}},
        "tree_nodes": {"acme": {"weight": 3.0, "lag": -0.7, "weighted_share": 0.75},
                       "globex": {"weight": 1.0, "lag": 0.0, "weighted_share": 0.25}}}
    seen = visible_stats({"pools": {"llm": pool}}, Principal("viewer", "acme"))["pools"]["llm"]
    assert seen["tree_nodes"] == {"acme": {"weight": 3.0, "lag": 0.0, "weighted_share": 1.0}}
    assert seen["tenants"]["acme/search"]["weighted_share"] == 2 / 3
    assert seen["tenants"]["acme/ads"]["own_weighted_share"] == 1 / 3
    assert seen["tenants"]["acme/search"]["own_lag"] == -0.5  # among its siblings inside the subtree: its own
    assert "globex" not in json.dumps(seen)
