"""The text views of `cronoq status`, `top` and `explain`, from a real core's statistics (no broker needed)."""

from __future__ import annotations

import re

from cronoq.client.text import status_text, top_frame
from cronoq.core import PoolSettings, SchedulerCore, Task


def capped_core() -> SchedulerCore:
    core = SchedulerCore([PoolSettings("llm", tenant_limits={"acme": 1, "globex": 3})])
    for tenant in ("acme", "globex"):
        for i in range(3):
            core.submit(Task(f"{tenant}{i}", "llm", tenant=tenant), 0.0)
    core.add_worker("w", ["llm"], 3)
    core.dispatch(100.0)  # acme takes one slot and is capped; globex takes two, one under its ceiling
    return core


def test_top_shows_each_capped_node_and_for_how_long():
    stats = {"pools": capped_core().stats(now=100.0 + 125.0), "workers": 1}
    frame = top_frame(stats, None, 0.0)
    assert "  at their ceilings:" in frame
    assert "    acme                 1 of 1     capped for 2 min 05 s" in frame
    assert "globex" not in frame.split("at their ceilings:")[1]  # not capped: top lists only those that are


def test_status_lists_every_ceiling_capped_first():
    text = status_text({"pools": capped_core().stats(now=112.3), "workers": 1})
    lines = text.split("  ceilings (running of limit):\n")[1].splitlines()
    assert lines[0] == "    acme                 1 of 1     capped for 12.3 s"
    assert lines[1] == "    globex               2 of 3"


def test_stats_list_at_most_limit_ceilings_the_capped_first():
    core = SchedulerCore([PoolSettings("llm", default_tenant_limit=1)])
    for i in range(50):  # the last tenant's task goes first: its ceiling is the last one met
        core.submit(Task(f"t{i}", "llm", tenant=f"tenant{i}", priority=0 if i == 49 else 2), 0.0)
    core.add_worker("w", ["llm"], 1)
    (_, first), = core.dispatch(1.0)
    assert first.tenant == "tenant49"
    pool = core.stats(limit=10, now=2.0)["llm"]
    assert pool["ceiling_count"] == 50 and len(pool["ceilings"]) == 10
    assert pool["ceilings"]["tenant49"]["capped_for"] == 1.0
    text = status_text({"pools": {"llm": pool}})
    assert "... and 40 more ceilings (the capped ones are shown first)" in text


def tree_core() -> SchedulerCore:
    """Issue #23's tree: acme 3 with its own tasks, search 2 and ads 1 beside them, against globex 1."""
    core = SchedulerCore([PoolSettings("llm", tenant_weights={"acme": 3, "acme/search": 2, "acme/ads": 1,
                                                              "globex": 1})])
    for tenant in ("acme", "acme/search", "acme/ads", "globex"):
        for i in range(50):
            core.submit(Task(f"{tenant}-{i}", "llm", tenant=tenant), 0.0)
    core.add_worker("w", ["llm"], 16)
    core.dispatch(1.0)
    return core


def _label(line: str) -> str:
    """The tenant column of a table row, its indentation kept."""
    return re.match(r"  (\s*\S+(?: \(own\))?)", line).group(1)  # type: ignore[union-attr]


def _fair_column(text: str) -> dict[str, str]:
    """tenant label -> its `fair` column, from the tenant table of `cronoq status`."""
    lines = text.split("\n")
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("tenant "))
    out = {}
    for line in lines[header + 1:]:
        if not line.startswith("  ") or line.startswith("  ceilings"):
            break
        out[_label(line).strip()] = line.split()[-2]
    return out


def test_status_shows_the_tree_with_the_tree_s_weighted_shares():
    text = status_text({"pools": tree_core().stats(), "workers": 1})
    table = text.split("queued by class: normal 184\n")[1]
    labels = [_label(line) for line in table.splitlines()[1:]]
    # Parents above their children, the parent's own tasks a row of their own, indented under it.
    assert labels == ["acme", "  acme (own)", "  ads", "  search", "globex"]
    assert _fair_column(text) == {"acme": "75.0%", "acme (own)": "18.8%", "ads": "18.8%", "search": "37.5%",
                                  "globex": "25.0%"}


def test_top_shows_the_same_tree_and_shares_as_status():
    frame = top_frame({"pools": tree_core().stats(), "workers": 1}, None, 0.0)
    fair = {line.split()[0] + (" (own)" if "(own)" in line else ""): line.split("fair ")[1].split()[0]
            for line in frame.splitlines() if "of dispatches" in line}
    assert fair == {"acme": "75.0%", "acme (own)": "18.8%", "ads": "18.8%", "search": "37.5%", "globex": "25.0%"}
    assert "    acme (own)" in frame and "    search" in frame  # indented under acme


def test_an_ancestor_without_tasks_of_its_own_gets_a_row_with_its_share_and_lag():
    core = SchedulerCore([PoolSettings("llm", tenant_weights={"acme": 3})])
    for i in range(10):
        core.submit(Task(f"s{i}", "llm", tenant="acme/search"), 0.0)
        core.submit(Task(f"g{i}", "llm", tenant="globex"), 0.0)
    text = status_text({"pools": core.stats(), "workers": 0})
    assert _fair_column(text) == {"acme": "75.0%", "search": "75.0%", "globex": "25.0%"}
    assert "acme (own)" not in text


def rated_core() -> SchedulerCore:
    """acme at 1/s has spent its token; light (minimum 3) runs 1 and has 1 more queued; the pool shares by run
    time."""
    core = SchedulerCore([PoolSettings("gpu", share_by="runtime", tenant_rates={"acme": 1, "globex": 4},
                                       tenant_minimums={"light": 3})])
    for i in range(3):
        core.submit(Task(f"acme{i}", "gpu", tenant="acme"), 0.0)
    core.submit(Task("light0", "gpu", tenant="light"), 0.0)
    core.add_worker("w", ["gpu"], 2)
    core.dispatch(0.0)
    core.submit(Task("light1", "gpu", tenant="light"), 0.0)
    return core


def test_status_shows_the_unit_rates_and_minimums():
    text = status_text({"pools": rated_core().stats(now=0.25), "workers": 1})
    assert "  shares by runtime: weights share out worker time; lag in seconds" in text
    rates = text.split("  rates (starts per second):\n")[1].splitlines()
    assert rates[0] == "    acme                  1/s rate-limited: next start in 0.8 s"
    assert rates[1].startswith("    globex                4/s, 4.0 to start at once")
    minimums = text.split("  minimums (running of minimum):\n")[1].splitlines()
    assert minimums[0] == "    light                1 of 3     under its minimum: its tasks go first"


def test_top_shows_only_the_rate_limited_and_those_under_their_minimum():
    frame = top_frame({"pools": rated_core().stats(now=0.25), "workers": 1}, None, 0.0)
    assert "  rate-limited:\n    acme                  1/s rate-limited: next start in 0.8 s" in frame
    assert "globex" not in frame.split("rate-limited:")[1]
    assert "  under their minimums (go first):\n    light" in frame
    assert re.search(r"lag [+-]\d+\.\d s", frame)


def test_status_shows_each_tenant_s_average_run_in_a_run_time_pool():
    core = SchedulerCore([PoolSettings("gpu", share_by="runtime")])
    core.submit(Task("a0", "gpu", tenant="acme"), 0.0)
    core.add_worker("w", ["gpu"], 1)
    core.dispatch(0.0)
    core.finish("a0", 2.5, worker_id="w", attempt=1, state="succeeded")
    core.submit(Task("a1", "gpu", tenant="acme"), 2.5)
    text = status_text({"pools": core.stats(now=3.0), "workers": 1})
    assert "  average run (s), each tenant's next estimate: acme 2.50" in text
