"""The text views of `cronoq status`, `top` and `explain`, from a real core's statistics (no broker needed)."""

from __future__ import annotations

from cronoq.core import PoolSettings, SchedulerCore, Task
from cronoq.views import status_text, top_frame


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
