"""`explain`: why a task has not started, read from the core's state with a fake clock.

The counts are checked against a brute-force reading of the same state (what a full scan would say), the
bounded walks against large backlogs, and the reasons and the estimate against each thing that holds a
pool back.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.core import QUEUED, SUCCEEDED, PoolSettings, SchedulerCore, Task
from cronoq.core.explain import EXPLAIN_SCAN

EXAMPLE = PoolSettings("llm", tenant_weights={"acme": 3, "globex": 1, "acme/search": 2, "acme/ads": 1})


def submit(core: SchedulerCore, task_id: str, now: float = 0.0, pool: str = "llm", **kwargs) -> Task:
    task = Task(task_id, pool, **kwargs)
    core.submit(task, now)
    return task


def test_a_running_or_unknown_task_has_no_waiting_part():
    core = SchedulerCore([EXAMPLE])
    submit(core, "t", tenant="acme")
    core.add_worker("w", ["llm"], 1)
    core.dispatch(0.0)
    assert core.explain("t", 1.0) is None
    assert core.explain("nope", 1.0) is None


def test_the_worked_example_names_every_node_with_its_weight_and_share():
    core = SchedulerCore([EXAMPLE])
    for tenant in ("globex", "acme/ads", "acme/search"):
        for i in range(3):
            submit(core, f"{tenant}-{i}", tenant=tenant)
    core.add_worker("w", ["llm"], 1)
    w = core.explain("acme/search-2", 0.0, dispatch_rate=2.0)
    assert [(n.name, n.weight, n.share) for n in w.nodes] == [("acme", 3.0, 0.75), ("acme/search", 2.0, 2 / 3)]
    assert w.tenant_share == pytest.approx(0.5)
    assert (w.queue_ahead, w.queue_ahead_exact, w.queue_length) == (2, True, 3)
    assert (w.higher_classes_ahead, w.deadline_ahead) == (0, 0)
    # Three of search's dispatches, at half of the pool's 2 per second.
    assert w.estimate == pytest.approx(3 / (2.0 * 0.5))
    assert core.explain("globex-0", 0.0, 2.0).tenant_share == pytest.approx(0.25)


def test_a_tenant_s_own_tasks_share_with_its_sub_tenants_as_a_child_of_weight_1():
    core = SchedulerCore([EXAMPLE])
    submit(core, "own", tenant="acme")
    submit(core, "search", tenant="acme/search")
    w = core.explain("own", 0.0)
    assert [(n.name, n.own_tasks, n.weight) for n in w.nodes] == [("acme", False, 3.0), ("acme", True, 1.0)]
    assert w.nodes[1].share == pytest.approx(1 / 3)  # own tasks 1 : search 2 inside acme
    assert w.nodes[0].share == 1.0  # acme is alone at the top


def test_higher_classes_and_deadline_tasks_ahead_are_counted_from_kept_counts():
    core = SchedulerCore([EXAMPLE])
    for i in range(4):
        submit(core, f"c{i}", tenant="globex", priority=0)
    submit(core, "h", priority=1)
    for i in range(3):
        submit(core, f"d{i}", tenant="acme", deadline=100.0 + i)
    submit(core, "mine", tenant="globex")
    core.add_worker("w", ["llm"], 0)
    w = core.explain("mine", 0.0)
    assert (w.higher_classes_ahead, w.deadline_ahead, w.deadline_ahead_exact) == (5, 3, True)
    # A deadline task: only those of its class with an earlier deadline are ahead, and it is outside the share.
    d2 = core.explain("d2", 0.0, dispatch_rate=1.0)
    assert (d2.deadline_ahead, d2.tenant_share, d2.queue_ahead) == (2, None, None)
    assert d2.estimate == pytest.approx(5 + 2 + 1)


def test_a_fifo_pool_counts_its_class_queue():
    core = SchedulerCore([PoolSettings("llm")])
    core.add_worker("w", ["llm"], 0)
    for i in range(5):
        submit(core, f"t{i}", tenant=f"tenant{i}")
    core.cancel("t1", 0.0)
    w = core.explain("t4", 0.0, dispatch_rate=4.0)
    assert (w.fair, w.nodes, w.tenant_share) == (False, (), None)
    assert (w.queue_ahead, w.queue_length) == (3, 4)  # the cancelled task is not counted
    assert w.estimate == pytest.approx(4 / 4.0)


def test_long_queues_are_walked_only_so_far_and_say_at_least():
    core = SchedulerCore([PoolSettings("llm", fair_share=True)])
    n = 3 * EXPLAIN_SCAN
    for i in range(n):
        submit(core, f"t{i}", tenant="acme")
        submit(core, f"d{i}", tenant="acme", deadline=1000.0 + i)
    core.add_worker("w", ["llm"], 0)
    w = core.explain(f"t{n - 1}", 0.0, dispatch_rate=10.0)
    assert not w.queue_ahead_exact and w.queue_ahead <= n - 1 and w.queue_ahead >= EXPLAIN_SCAN - 1
    assert w.queue_length == n and w.deadline_ahead == n  # kept counts are exact whatever the size
    assert "at least" in w.estimate_note
    d = core.explain(f"d{n - 1}", 0.0)
    assert not d.deadline_ahead_exact and EXPLAIN_SCAN // 2 <= d.deadline_ahead <= n - 1
    assert core.explain(f"t{EXPLAIN_SCAN // 2}", 0.0).queue_ahead_exact


def test_what_holds_a_pool_is_said_and_leaves_the_estimate_unknown():
    core = SchedulerCore([PoolSettings("llm", fair_share=True, max_in_flight=1)])
    submit(core, "a")
    submit(core, "b")
    none_serves = core.explain("b", 0.0, dispatch_rate=5.0)
    assert (none_serves.workers, none_serves.estimate) == (0, None)
    assert "no worker serves pool 'llm'" in none_serves.estimate_note
    core.add_worker("w", ["llm"], 2)
    core.dispatch(0.0)
    at_cap = core.explain("b", 0.0, dispatch_rate=5.0)
    assert (at_cap.running, at_cap.max_in_flight, at_cap.ready_workers) == (1, 1, 1)
    core.pause("llm")
    paused = core.explain("b", 0.0, dispatch_rate=5.0)
    assert paused.paused and paused.estimate is None and "paused" in paused.estimate_note
    core.resume("llm")
    no_rate = core.explain("b", 0.0, dispatch_rate=None)
    assert no_rate.estimate is None and "no rate" in no_rate.estimate_note


def test_a_capped_tenant_shows_its_ceiling_and_since_when():
    core = SchedulerCore([PoolSettings("llm", tenant_limits={"acme": 2})])
    for i in range(4):
        submit(core, f"a{i}", tenant="acme/search")
    core.add_worker("w", ["llm"], 10)
    assert len(core.dispatch(3.0)) == 2
    w = core.explain("a3", 10.0, dispatch_rate=1.0)
    acme = w.nodes[0]
    assert (acme.ceiling.limit, acme.ceiling.running, acme.ceiling.capped) == (2, 2, True)
    assert (acme.ceiling.capped_since, acme.ceiling.capped_for) == (3.0, 7.0)
    assert acme.share == 0.0 and w.tenant_share == 0.0
    assert w.estimate is None and "acme at its ceiling" in w.estimate_note
    assert w.nodes[1].ceiling is None  # acme/search has none of its own
    core.finish("a0", 11.0, worker_id="w", attempt=1, state=SUCCEEDED)
    assert core.explain("a3", 11.0).nodes[0].ceiling.capped is False


def test_a_delayed_task_and_a_retry_back_off_say_how_long_they_have_to_go():
    core = SchedulerCore([PoolSettings("llm", fair_share=True)])
    core.add_worker("w", ["llm"], 1)
    submit(core, "later", not_before=30.0)
    w = core.explain("later", 10.0, dispatch_rate=1.0)
    assert (w.delayed_for, w.retry, w.queue_ahead, w.estimate) == (20.0, False, None, None)
    submit(core, "flaky", now=10.0)
    core.dispatch(10.0)
    core.requeue("flaky", 11.0, worker_id="w", attempt=1, not_before=15.0)
    retry = core.explain("flaky", 12.0, dispatch_rate=1.0)
    assert (retry.delayed_for, retry.retry) == (3.0, True)
    assert "retry back-off" in retry.estimate_note


def test_explaining_changes_nothing():
    core = SchedulerCore([PoolSettings("llm", tenant_limits={"acme": 1})])
    for i in range(6):
        submit(core, f"a{i}", tenant="acme", deadline=50.0 - i)
        submit(core, f"g{i}", tenant="globex")
    core.add_worker("w", ["llm"], 3)
    before = core.stats(now=1.0)
    for i in range(6):
        core.explain(f"a{i}", 1.0)
        core.explain(f"g{i}", 1.0)
    assert core.stats(now=1.0) == before
    assert [t.id for _, t in core.dispatch(1.0)] == ["a5", "g0", "g1"]


# -- the bounded deadline count against a full scan --------------------------------------------------

OPS = st.lists(
    st.tuples(st.sampled_from(["submit", "dispatch", "finish", "cancel"]), st.sampled_from(["a", "a/x", "b", None]),
              st.integers(0, 40), st.integers(0, 1)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, limits=st.sampled_from([{}, {"a": 1}, {"a/x": 1, "b": 2}]))
def test_earlier_deadlines_are_counted_as_a_full_scan_would(ops, limits):
    core = SchedulerCore([PoolSettings("p", tenant_limits=limits, fair_share=True)])
    core.add_worker("w", ["p"], 2)
    now, n = 0.0, 0
    for op, tenant, value, priority in ops:
        now += 0.5
        if op == "submit":
            n += 1
            core.submit(Task(f"t{n}", "p", tenant=tenant, priority=priority, deadline=now + value), now)
        elif op == "dispatch":
            core.expire(now)
            core.dispatch(now, 1)
        elif op == "finish":
            for task in core.worker_tasks("w")[:1]:
                core.finish(task.id, now, worker_id="w", attempt=task.attempts, state=SUCCEEDED)
                core.grant("w")
        elif n:
            core.cancel(f"t{value % n + 1}", now)
    pool = core._pools["p"]
    capped = {c.name for c in pool.ceilings.values() if c.capped}
    queued = [t for t in core.tasks() if t.state is QUEUED]
    for task in queued:
        expected = sum(
            1 for other in queued
            if other.priority == task.priority and other.deadline > now
            and (other.deadline, other._seq) < (task.deadline, task._seq)
            and not capped.intersection(other._ts.path)
        )
        w = core.explain(task.id, now)
        assert (w.deadline_ahead, w.deadline_ahead_exact) == (expected, True), task
