"""The shares over time (cronoq.broker.dashboard.history): bounded however long it runs and however many tenants come,
and right about a simple 3 : 1 pool. Stats maps are written as the broker's `stats` gives them."""

from __future__ import annotations

import pytest

from cronoq.broker.dashboard.history import (
    HISTORY_PINNED, HISTORY_SAMPLES, HISTORY_TENANTS, SMOOTHING_SAMPLES, ShareHistory,
)


def tenant(dispatched: int, weight: float = 1.0, queued: int = 10, weighted_share: float = 0.0) -> dict:
    # With the weighted share the core computes for the node (`weighted_share`), as the broker's stats give it.
    return {"weight": weight, "queued": queued, "delayed": 0, "running": 0, "dispatched": dispatched, "lag": 0.0,
            "weighted_share": weighted_share, "own_weighted_share": weighted_share, "own_lag": 0.0}


def stats(tenants: dict[str, dict], fair: bool = True, tree_nodes: dict[str, dict] | None = None) -> dict:
    return {"pools": {"llm": {"fair": fair, "dispatched": sum(t["dispatched"] for t in tenants.values()),
                              "tenants": tenants, "tree_nodes": tree_nodes or {}}}}


def weight_of(pool: str, node: str) -> float:
    return 1.0


def test_a_3_to_1_pool_shows_shares_of_three_quarters_and_one_quarter():
    history = ShareHistory()
    for step in range(20):
        history.sample(2.0 * step, stats({"acme": tenant(30 * step, 3.0, weighted_share=0.75),
                                          "globex": tenant(10 * step, weighted_share=0.25)}), weight_of)
    series = history.series("llm")
    assert series["fair"] and len(series["points"]) == 19
    for point in series["points"]:
        assert point["rate"] == pytest.approx(20.0)  # 40 dispatches every 2 s
        assert point["tenants"]["acme"] == {"share": 0.75, "weighted_share": 0.75}
        assert point["tenants"]["globex"] == {"share": 0.25, "weighted_share": 0.25}
    # A point measures over the SMOOTHING_SAMPLES samples before it.
    assert series["points"][-1]["dispatches"] == 40 * SMOOTHING_SAMPLES


def test_it_stays_bounded_in_samples_and_tenants_however_long_and_however_many():
    history = ShareHistory()
    for step in range(HISTORY_SAMPLES + 20):
        crowd = {f"t{n}": tenant(step + n, queued=n) for n in range(300)}  # far more than a chart follows
        history.sample(2.0 * step, stats(crowd), weight_of)
    ring = history._rings["llm"]
    assert len(ring) == HISTORY_SAMPLES
    assert all(len(sample.nodes) <= HISTORY_TENANTS for sample in ring)
    points = history.series("llm")["points"]
    assert len(points) == HISTORY_SAMPLES - 1 and all(len(p["tenants"]) <= HISTORY_TENANTS for p in points)


def test_a_tree_is_followed_by_its_top_level_nodes_with_their_subtrees_counted():
    history = ShareHistory()
    for step in range(3):
        history.sample(2.0 * step, stats({"acme/search": tenant(20 * step, weighted_share=0.25),
                                          "acme/ads": tenant(10 * step, weighted_share=0.25),
                                          "globex": tenant(10 * step, weighted_share=0.5)},
                                         tree_nodes={"acme": {"weight": 1.0, "lag": 0.0, "weighted_share": 0.5}}),
                       weight_of)
    point = history.series("llm")["points"][-1]
    assert set(point["tenants"]) == {"acme", "globex"}
    assert point["tenants"]["acme"]["share"] == 0.75 and point["tenants"]["acme"]["weighted_share"] == 0.5


def test_a_pinned_view_tells_nothing_of_the_other_tenants():
    history = ShareHistory()
    for step in range(4):
        history.sample(2.0 * step, stats({"acme": tenant(30 * step, 3.0, weighted_share=0.75),
                                          "globex": tenant(10 * step, weighted_share=0.25)}), weight_of, pins={"acme"})
    points = history.series("llm", pinned="acme")["points"]
    assert len(points) == 3
    for point in points:
        assert set(point["tenants"]) == {"acme"}
        assert point["tenants"]["acme"] == {"share": 1.0, "weighted_share": 1.0}
        assert point["rate"] == pytest.approx(15.0)  # acme's own dispatches per second, not the pool's 20


def tree(step: int) -> dict:
    """acme/search (alice and bob under it, 5 + 10 a step), acme/ads (20 a step) and globex (45 a step)."""
    return stats({"acme/search/alice": tenant(5 * step, weighted_share=0.1),
                  "acme/search/bob": tenant(10 * step, weighted_share=0.1),
                  "acme/ads": tenant(20 * step, weighted_share=0.3),
                  "globex": tenant(45 * step, weighted_share=0.5)},
                 tree_nodes={"acme": {"weight": 1.0, "lag": 0.0, "weighted_share": 0.5},
                             "acme/search": {"weight": 1.0, "lag": 0.0, "weighted_share": 0.2}})


def test_a_token_pinned_below_the_top_level_sees_its_subtree_over_time():
    # The top-level lines are acme and globex: a token pinned to acme/search sees neither. Its node is followed for it.
    history = ShareHistory()
    for step in range(4):
        history.sample(2.0 * step, tree(step), weight_of, pins={"acme/search", "globex"})
    points = history.series("llm", pinned="acme/search")["points"]
    assert len(points) == 3
    for point in points:
        assert set(point["tenants"]) == {"acme/search"}  # nothing of acme/ads, acme or globex
        assert point["tenants"]["acme/search"] == {"share": 1.0, "weighted_share": 1.0}
        assert point["rate"] == pytest.approx(7.5)  # alice's and bob's 15 dispatches every 2 s
    # The admin's chart is unchanged: the top-level nodes, their subtrees counted whole.
    assert set(history.series("llm")["points"][-1]["tenants"]) == {"acme", "globex"}
    # A tenant below the pinned node, or one no token is pinned to, is not followed for anyone.
    assert history.series("llm", pinned="acme/search/alice")["points"] == []


def test_a_pinned_tenant_outside_the_busiest_top_level_nodes_still_has_its_rate():
    history = ShareHistory()
    for step in range(3):
        crowd = {f"big{n}": tenant(1000 * step) for n in range(HISTORY_TENANTS)}  # busier than quiet, all of them
        history.sample(2.0 * step, stats({**crowd, "quiet": tenant(4 * step)}), weight_of, pins={"quiet"})
    assert "quiet" not in history.series("llm")["points"][-1]["tenants"]
    assert [p["rate"] for p in history.series("llm", pinned="quiet")["points"]] == [2.0, 2.0]


def test_an_idle_pinned_tenant_has_a_rate_of_zero_and_one_left_out_of_the_stats_has_no_point():
    history = ShareHistory()
    idle = stats({"globex": tenant(0)})
    history.sample(0.0, idle, weight_of, pins={"acme"})
    history.sample(2.0, idle, weight_of, pins={"acme"})  # acme has no task: the stats list every tenant, so 0
    assert [p["rate"] for p in history.series("llm", pinned="acme")["points"]] == [0.0]
    busiest_only = stats({"globex": tenant(0)})
    busiest_only["pools"]["llm"]["tenant_count"] = 5000  # only the busiest are listed: acme may be among the rest
    history.sample(4.0, busiest_only, weight_of, pins={"acme"})
    assert [p["rate"] for p in history.series("llm", pinned="acme")["points"]] == [0.0]  # no new point, no false 0


def test_pinned_nodes_followed_per_pool_are_bounded_the_most_active_first():
    history = ShareHistory()
    pins = {f"t{n}" for n in range(HISTORY_PINNED + 40)}
    for step in range(3):
        history.sample(2.0 * step, stats({f"t{n}": tenant(n * step) for n in range(HISTORY_PINNED + 40)}), weight_of,
                       pins=pins)
    followed = history._rings["llm"][-1].pinned
    assert len(followed) == HISTORY_PINNED
    assert set(followed) == {f"t{n}" for n in range(40, HISTORY_PINNED + 40)}  # the busiest


def test_a_node_not_followed_in_the_older_sample_has_no_share_rather_than_a_wrong_one():
    history = ShareHistory()
    history.sample(0.0, stats({"acme": tenant(0)}), weight_of)
    history.sample(2.0, stats({"acme": tenant(10), "globex": tenant(5000)}), weight_of)  # globex: counted before
    point = history.series("llm")["points"][-1]
    assert point["tenants"]["globex"]["share"] is None and point["tenants"]["acme"]["share"] is not None


def test_a_pool_that_left_the_config_is_forgotten():
    history = ShareHistory()
    history.sample(0.0, stats({"acme": tenant(0)}), weight_of)
    history.sample(2.0, {"pools": {}}, weight_of)
    assert history.pools() == [] and history.series("llm") is None
