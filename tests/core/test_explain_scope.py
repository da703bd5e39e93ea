"""`explain` for a caller pinned to a tenant (`scope`): it learns nothing of other tenants' tasks.

Each test builds the same pool twice, with and without another tenant's work (or with that work's deadline
on either side of the caller's), and checks that what the pinned caller is told is the same either way, while
an unpinned caller sees the difference.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.core import ClassRates, PoolSettings, SchedulerCore, Task

WEIGHTS = PoolSettings("llm", tenant_weights={"acme": 3, "globex": 1, "acme/search": 2})
RATES = [ClassRates(1.0, 0.5), ClassRates(2.0, 0.0), ClassRates(5.0, 1.0), ClassRates(0.5)]


def _pool(globex: bool, settings: PoolSettings = WEIGHTS) -> SchedulerCore:
    core = SchedulerCore([settings])
    core.add_worker("w", ["llm"], 0)
    for i in range(3):
        core.submit(Task(f"acme-c{i}", "llm", tenant="acme/search", priority=0), 0.0)
    core.submit(Task("acme-d", "llm", tenant="acme", deadline=500.0), 0.0)
    for i in range(5):
        core.submit(Task(f"acme-{i}", "llm", tenant="acme/search"), 0.0)
    if globex:
        for i in range(7):
            core.submit(Task(f"globex-c{i}", "llm", tenant="globex", priority=0), 0.0)
            core.submit(Task(f"globex-h{i}", "llm", tenant="globex", priority=1, deadline=300.0 + i), 0.0)
            core.submit(Task(f"globex-d{i}", "llm", tenant="globex", deadline=400.0 + i), 0.0)
            core.submit(Task(f"globex-{i}", "llm", tenant="globex"), 0.0)
    return core


@pytest.mark.parametrize("settings", [WEIGHTS, PoolSettings("llm")], ids=["fair", "fifo"])
def test_a_pinned_caller_counts_only_its_subtree_and_sees_no_rate(settings):
    alone, crowded = _pool(False, settings), _pool(True, settings)
    mine = crowded.explain("acme-4", 1.0, 10.0, RATES, scope="acme")
    assert (mine.higher_classes_ahead, mine.deadline_ahead, mine.queue_ahead) == (3, 1, 4)
    assert mine.queue_length == 5 and mine.scope == "acme"
    assert (mine.dispatch_rate, mine.arrival_rate_ahead, mine.tenant_share) == (None, None, None)
    everything = crowded.explain("acme-4", 1.0, 10.0, RATES)
    assert (everything.higher_classes_ahead, everything.deadline_ahead) == (3 + 14, 1 + 7)
    assert everything.dispatch_rate == 10.0 and everything.scope is None
    # What the pinned caller reads does not say whether globex has anything queued, except through the
    # coarse estimate, which does move with the pool's load.
    quiet = alone.explain("acme-4", 1.0, 10.0, RATES, scope="acme")
    assert dataclasses.replace(mine, estimate=None) == dataclasses.replace(quiet, estimate=None)
    assert mine.estimate in (1, 2, 5, 10, 20, 50, 100) and "coarse" in mine.estimate_note


def test_a_pinned_caller_does_not_see_the_shares_that_compete_with_other_tenants():
    core = _pool(True)
    nodes = core.explain("acme-4", 1.0, 10.0, scope="acme").nodes
    assert [(n.name, n.hidden, n.share, n.lag) for n in nodes] == [
        ("acme", True, 0.0, 0.0), ("acme/search", False, 1.0, nodes[1].lag)]
    assert core.explain("acme-4", 1.0, 10.0).nodes[0].share == 0.75  # unpinned: acme 3 of globex's 1
    deep = core.explain("acme-4", 1.0, 10.0, scope="acme/search").nodes
    assert [(n.name, n.hidden) for n in deep] == [("acme", True), ("acme/search", True)]


def _probe(core: SchedulerCore, deadline: float, now: float = 1.0):
    core.submit(Task("probe", "llm", tenant="acme", deadline=deadline), now)
    try:
        return core.explain("probe", now, 10.0, RATES, scope="acme")
    finally:
        core.cancel("probe", now)


def test_deadline_probes_cannot_find_another_tenant_s_deadline():
    # globex's deadline tasks of the normal class fall at 400..406. A probe just before and one just after
    # must read exactly alike (their own deadlines aside, which the prober knows).
    core = _pool(True)
    before, after = _probe(core, 399.0), _probe(core, 407.0)
    assert before == after
    unpinned = []
    for deadline in (399.0, 407.0):
        core.submit(Task("probe", "llm", tenant="acme", deadline=deadline), 1.0)
        unpinned.append(core.explain("probe", 1.0, 10.0, RATES))
        core.cancel("probe", 1.0)
    assert unpinned[1].deadline_ahead - unpinned[0].deadline_ahead == 7  # what a probe used to learn
    assert unpinned[0].estimate != unpinned[1].estimate


def test_a_pinned_caller_is_told_the_pool_cannot_serve_it_without_the_rates():
    core = _pool(True)
    outrun = [ClassRates(20.0), ClassRates(0.0), ClassRates(0.0), ClassRates(0.0)]
    pinned = core.explain("acme-4", 1.0, 10.0, outrun, scope="acme")
    assert pinned.estimate is None and pinned.estimate_note.startswith("cannot tell: higher-class work arrives")
    assert "/s" not in pinned.estimate_note
    assert "20/s" in core.explain("acme-4", 1.0, 10.0, outrun).estimate_note


def test_a_pinned_caller_counts_its_own_running_tasks_only():
    core = SchedulerCore([PoolSettings("llm", fair_share=True, max_in_flight=3)])
    for n, tenant in enumerate(("acme", "globex", "acme/search", "globex")):
        core.submit(Task(f"t{n}", "llm", tenant=tenant), 0.0)
    core.add_worker("w", ["llm"], 4)
    assert len(core.dispatch(0.0)) == 3  # t0, t1, t2: acme 2, globex 1; t3 waits for max_in_flight
    mine = core.explain("t3", 0.0, 1.0, scope="globex")
    assert (mine.at_max_in_flight, mine.running, mine.max_in_flight) == (True, 1, 3)
    assert core.explain("t3", 0.0, 1.0).running == 3


SUBMITS = st.lists(
    st.tuples(st.sampled_from(["acme", "acme/x", "globex", "globex/y", None]), st.integers(0, 3),
              st.one_of(st.none(), st.integers(1, 50)), st.booleans()),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(submits=SUBMITS, fair=st.booleans())
def test_what_a_pinned_caller_reads_does_not_depend_on_other_tenants_tasks(submits, fair):
    # The same submits twice, once without anyone else's: every acme task reads the same, but for the estimate.
    settings_ = PoolSettings("llm", tenant_weights={"acme": 2} if fair else {})
    everyone, alone = SchedulerCore([settings_]), SchedulerCore([settings_])
    for core in (everyone, alone):
        core.add_worker("w", ["llm"], 0)
    mine = []
    for n, (tenant, priority, deadline, cancel) in enumerate(submits):
        ours = tenant is not None and tenant.split("/")[0] == "acme"
        for core in (everyone, alone) if ours else (everyone,):
            core.submit(Task(f"t{n}", "llm", tenant=tenant, priority=priority,
                             deadline=None if deadline is None else float(deadline)), 0.0)
            if cancel and n % 3 == 0:
                core.cancel(f"t{n}", 0.0)
        if ours and not (cancel and n % 3 == 0):
            mine.append(f"t{n}")
    for task_id in mine:
        seen = everyone.explain(task_id, 0.5, 10.0, RATES, scope="acme")
        shown = alone.explain(task_id, 0.5, 10.0, RATES, scope="acme")
        assert dataclasses.replace(seen, estimate=None, estimate_note="") == dataclasses.replace(
            shown, estimate=None, estimate_note=""), task_id
        assert seen.estimate is None or seen.estimate in {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}
