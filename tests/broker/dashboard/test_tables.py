"""The dashboard's views from a real scheduling core's stats, and the failures ring: pure, no sockets."""

from __future__ import annotations

import pytest

from cronoq.broker.dashboard.tables import DispatchHistory, dispatch_counts, pool_view, tenant_rows, worker_rows
from cronoq.broker.failures import MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, RecentFailures
from cronoq.core import PoolSettings, SchedulerCore, Task


def backlogged(settings: PoolSettings, tenants: dict[str, int], dispatches: int) -> SchedulerCore:
    """A core with `tenants[t]` tasks queued per tenant, after `dispatches` dispatches to one worker."""
    core = SchedulerCore([settings])
    n = 0
    for tenant, count in tenants.items():
        for _ in range(count):
            n += 1
            core.submit(Task(f"t{n}", settings.name, tenant=tenant or None), 0.0)
    core.add_worker("w", [settings.name], dispatches)
    core.dispatch(1.0)
    return core


def rows_of(core: SchedulerCore, settings: PoolSettings, limit: int = 40) -> dict[str, dict]:
    stats = core.stats()
    pool = stats[settings.name]
    recent = dispatch_counts({"pools": stats})[settings.name]
    rows = tenant_rows(pool, recent, settings.weight, lambda node: core.lag(settings.name, node), limit)
    return {row["tenant"]: row for row in rows}


def test_weighted_shares_follow_the_weights_and_recent_shares_the_dispatches():
    settings = PoolSettings("llm", {"acme": 3, "globex": 1})
    core = backlogged(settings, {"acme": 100, "globex": 100}, 40)
    rows = rows_of(core, settings)
    assert rows["acme"]["weighted_share"] == pytest.approx(0.75)
    assert rows["globex"]["weighted_share"] == pytest.approx(0.25)
    assert rows["acme"]["share"] == pytest.approx(30 / 40)
    assert rows["acme"]["running"] == 30 and rows["acme"]["queued"] == 70
    assert rows["globex"]["weight"] == 1.0


def test_a_tenant_with_nothing_to_do_is_promised_nothing():
    settings = PoolSettings("llm", {"acme": 3, "globex": 1})
    core = backlogged(settings, {"acme": 10, "globex": 0, "initech": 10}, 0)
    rows = rows_of(core, settings)
    assert "globex" not in rows
    assert rows["acme"]["weighted_share"] == pytest.approx(0.75)
    assert rows["initech"]["weighted_share"] == pytest.approx(0.25)


def test_the_tree_shows_ancestors_indented_and_shares_every_level():
    settings = PoolSettings("llm", {"acme": 3, "globex": 1, "acme/search": 2, "acme/ads": 1})
    core = backlogged(settings, {"acme/search": 50, "acme/ads": 50, "globex": 50}, 0)
    rows = rows_of(core, settings)
    assert list(rows) == ["acme", "acme/ads", "acme/search", "globex"]  # tree order: each parent above its children
    assert [rows[t]["depth"] for t in rows] == [0, 1, 1, 0]
    assert rows["acme/search"]["label"] == "search"
    assert rows["acme"]["queued"] == 100  # its subtree's
    assert rows["acme"]["weight"] == 3.0  # from the pool's settings: acme has no tasks of its own
    assert rows["acme/search"]["weighted_share"] == pytest.approx(0.5)
    assert rows["acme/ads"]["weighted_share"] == pytest.approx(0.25)
    assert rows["globex"]["weighted_share"] == pytest.approx(0.25)


def test_a_nodes_own_tasks_share_with_its_children_as_a_child_of_weight_1():
    settings = PoolSettings("llm", {"acme/search": 3})
    core = backlogged(settings, {"acme": 10, "acme/search": 10}, 0)
    rows = rows_of(core, settings)
    assert rows["acme"]["weighted_share"] == pytest.approx(1.0)
    assert rows["acme/search"]["weighted_share"] == pytest.approx(0.75)


def test_only_the_most_active_tenants_are_listed_with_their_ancestors():
    settings = PoolSettings("llm", fair_share=True)
    tenants = {f"org{i}/team{j}": (i * 10 + j) for i in range(10) for j in range(10)}
    core = backlogged(settings, tenants, 0)
    rows = rows_of(core, settings, limit=5)
    leaves = [t for t in rows if "/" in t]
    assert leaves == ["org9/team5", "org9/team6", "org9/team7", "org9/team8", "org9/team9"]
    assert list(rows)[0] == "org9"
    view = pool_view("llm", core.stats()["llm"], {}, settings.weight, lambda node: 0.0, limit=5)
    assert view["tenant_count"] == 99  # org0/team0 has no task
    assert len(view["tenants"]) == 6


def test_a_pool_without_fairness_promises_no_share():
    settings = PoolSettings("batch")
    core = backlogged(settings, {"acme": 3}, 1)
    assert rows_of(core, settings)["acme"]["weighted_share"] is None


def test_the_untenanted_tasks_are_a_top_level_row():
    settings = PoolSettings("llm", fair_share=True)
    core = backlogged(settings, {"": 4, "acme": 4}, 0)
    rows = rows_of(core, settings)
    assert rows[""]["label"] == "(none)"
    assert rows[""]["weighted_share"] == pytest.approx(0.5)


def test_recent_dispatches_count_from_a_baseline_about_a_window_old():
    history = DispatchHistory(window=10.0)
    recent, covers = history.recent(100.0, {"llm": {"acme": 5}})
    assert recent == {"llm": {"acme": 5}} and covers is None  # the first look: everything so far
    history.recent(105.0, {"llm": {"acme": 8}})
    recent, covers = history.recent(111.0, {"llm": {"acme": 20, "globex": 2}})
    assert recent == {"llm": {"acme": 15, "globex": 2}} and covers == 11.0
    recent, covers = history.recent(116.0, {"llm": {"acme": 21, "globex": 2}})
    assert recent == {"llm": {"acme": 13, "globex": 2}} and covers == 11.0  # the 100.0 sample has gone
    recent, _ = history.recent(117.0, {"llm": {"acme": 1}})  # forgotten by the core and back: all of it is new
    assert recent == {"llm": {"acme": 1}}


def test_the_history_keeps_a_bounded_number_of_samples():
    history = DispatchHistory(window=10.0)
    for second in range(1000):
        history.recent(float(second), {"llm": {"acme": second}})
    assert len(history._samples) <= 12


def test_worker_rows_say_how_long_ago_each_was_heard_from():
    rows = worker_rows([{"name": "b", "pools": ["llm"], "busy": 1, "concurrency": 4, "leaving": False,
                         "last_seen_at": 99.5},
                        {"name": "a", "pools": ["llm"], "busy": 0, "concurrency": 1, "leaving": True,
                         "last_seen_at": 100.5}], now=100.0, limit=1)
    assert rows == [{"name": "a", "pools": ["llm"], "busy": 0, "concurrency": 1, "leaving": True, "last_seen": 0.0}]


def test_the_failures_ring_is_bounded_and_newest_first():
    ring = RecentFailures(size=3)
    for n in range(10):
        ring.add(f"task{n}", "llm", "acme", "ValueError", "x" * 10_000, "frame\n" * 10_000, 1, float(n))
    assert [f.id for f in ring] == ["task9", "task8", "task7"]
    newest = next(iter(ring))
    assert len(newest.message) == MAX_MESSAGE_CHARS and newest.message.endswith("(cut)")
    assert len(newest.traceback) == MAX_TRACEBACK_CHARS
    assert ring.find("task8") is not None and ring.find("task1") is None


def test_rows_show_a_node_s_rate_and_minimum_and_the_pool_its_unit():
    settings = PoolSettings("gpu", share_by="cost", tenant_rates={"acme": 1}, tenant_minimums={"light": 3})
    core = backlogged(settings, {"acme": 3, "light": 1}, 2)  # light (under its minimum), then acme spends its token
    core.submit(Task("more", "gpu", tenant="light"), 1.0)
    stats = core.stats(now=1.5)
    rows = {row["tenant"]: row for row in tenant_rows(stats["gpu"], {}, settings.weight, lambda node: 0.0)}
    assert rows["acme"]["rate"] == {"rate": 1, "limited": True, "next_start_in": 0.5}
    assert rows["acme"]["minimum"] is None and rows["light"]["rate"] is None
    assert rows["light"]["minimum"] == {"minimum": 3, "running": 1, "under": True}
    view = pool_view("gpu", stats["gpu"], {}, settings.weight, lambda node: 0.0)
    assert (view["share_by"], view["share_unit"]) == ("cost", "cost")
