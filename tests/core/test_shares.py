"""What a fair dispatch charges: share_by "cost" and "runtime" in the core (docs/scheduling.md).

- cost: the shares of summed cost follow the weights, at every level of a tenant tree, and ties stay exact;
- runtime: the issue's LLM example (20 s against 0.2 s tasks at 1 : 1 gets equal worker time), a task
  charged its cost as an estimate, the first estimate, a lost worker's and a retried run's charge, a task
  that runs for hours charged while it runs, and the stated bound on worker time while tenants stay
  backlogged, over random run times (Hypothesis);
- the unit every figure is read in, and a reload that changes the unit on a live backlog.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.core import SUCCEEDED, PoolSettings, SchedulerCore, Task
from cronoq.core.core import RECHARGE_MIN
from cronoq.core.pool import FIRST_ESTIMATE
from cronoq.errors import InvalidArgument
from tests.core.helpers import drain, tenants
from tests.core.simulation import Simulation

FAST = settings(max_examples=60, deadline=None, derandomize=True)


def backlog(core: SchedulerCore, pool: str, tenant: str, n: int, start: int = 0, **kwargs) -> None:
    for i in range(start, start + n):
        core.submit(Task(f"{tenant}{i}", pool, tenant=tenant, **kwargs), 0.0)


# -- cost ------------------------------------------------------------------------------------------------


def test_cost_shares_follow_the_weights_not_the_dispatch_count():
    core = SchedulerCore([PoolSettings("p", share_by="cost", fair_share=True)])
    backlog(core, "p", "acme", 40, cost=4)
    backlog(core, "p", "globex", 40, cost=1)
    order = drain(core, 0.0)[:50]
    count = Counter(t.tenant for t in order)
    # Equal weights, equal cost: globex runs four tasks for each of acme's.
    assert count == {"acme": 10, "globex": 40}


def test_the_same_backlog_by_dispatches_alternates():
    core = SchedulerCore([PoolSettings("p", fair_share=True)])
    backlog(core, "p", "acme", 10, cost=4)
    backlog(core, "p", "globex", 10, cost=1)
    assert tenants(drain(core, 0.0)[:6]) == "agagag"


def test_cost_and_weights_combine_and_ties_stay_exact():
    # acme weighs 3 and pays 0.3 a task, globex weighs 1 and pays 0.1: the same 0.1 per unit of weight, so every
    # tag is a tie broken by arrival. Floats would drift (0.1 + 0.1 + 0.1 != 0.3); quanta do not.
    core = SchedulerCore([PoolSettings("p", share_by="cost", tenant_weights={"acme": 3})])
    for i in range(30):
        core.submit(Task(f"g{i}", "p", tenant="globex", cost=0.1), 0.0)
        core.submit(Task(f"a{i}", "p", tenant="acme", cost=0.3), 0.0)
    assert tenants(drain(core, 0.0)[:12]) == "gagagagagaga"


def test_cost_is_charged_at_every_level_of_a_tree():
    core = SchedulerCore([PoolSettings("p", share_by="cost", fair_share=True)])
    backlog(core, "p", "acme/big", 30, cost=3)
    backlog(core, "p", "acme/small", 30, cost=1)
    backlog(core, "p", "globex", 60, cost=1)
    order = drain(core, 0.0)[:60]
    cost = Counter()
    for t in order:
        top = t.tenant.split("/")[0]
        cost[top] += t.cost
        if t.tenant != top:
            cost[t.tenant] += t.cost
    assert abs(cost["acme"] - cost["globex"]) <= 3  # one task's cost each
    assert abs(cost["acme/big"] - cost["acme/small"]) <= 3


def test_a_cost_must_be_positive():
    core = SchedulerCore([PoolSettings("p", share_by="cost", fair_share=True)])
    for bad in (0, -1, float("nan"), float("inf"), "3", True):
        with pytest.raises(InvalidArgument, match="cost"):
            core.submit(Task("x", "p", cost=bad), 0.0)


def test_share_by_must_be_one_of_three():
    with pytest.raises(InvalidArgument, match="share_by must be one of 'dispatches', 'cost', 'runtime'"):
        SchedulerCore([PoolSettings("p", share_by="time")])


def test_stats_speak_in_the_pools_unit():
    for share_by, unit in (("dispatches", "dispatches"), ("cost", "cost"), ("runtime", "seconds")):
        core = SchedulerCore([PoolSettings("p", share_by=share_by, fair_share=True)])
        stats = core.stats()["p"]
        assert (stats["share_by"], stats["share_unit"]) == (share_by, unit)


def test_lag_is_in_cost_units():
    core = SchedulerCore([PoolSettings("p", share_by="cost", fair_share=True)])
    backlog(core, "p", "acme", 3, cost=5)
    backlog(core, "p", "globex", 3, cost=1)
    core.add_worker("w", ["p"], 1)
    ((_, first),) = core.dispatch(0.0)
    assert first.tenant == "acme"
    # acme just took 5 units: it leads by its task's cost, in cost units (not by one dispatch).
    assert core.lag("p", "acme") == pytest.approx(-5.0)


def test_a_reload_that_changes_the_unit_keeps_the_backlog_in_arrival_order():
    core = SchedulerCore([PoolSettings("p", fair_share=True)])
    backlog(core, "p", "acme", 10, cost=4)
    backlog(core, "p", "globex", 10, cost=1)
    core.configure([PoolSettings("p", fair_share=True, share_by="cost")])
    order = drain(core, 0.0)
    assert len(order) == 20
    assert Counter(t.tenant for t in order[:10]) == {"acme": 2, "globex": 8}


# -- runtime ---------------------------------------------------------------------------------------------


def llm_core(**extra) -> SchedulerCore:
    return SchedulerCore([PoolSettings("llm", share_by="runtime", fair_share=True, **extra)])


def test_the_llm_example_equal_weights_get_equal_worker_time():
    core = llm_core()
    backlog(core, "llm", "acme", 400)
    backlog(core, "llm", "globex", 40000)
    run_time = {"acme": 20.0, "globex": 0.2}
    sim = Simulation(core, "llm", workers=4, duration=lambda t: run_time[t.tenant])
    result = sim.run_until(2000.0)
    acme, globex = sim.time_so_far("acme"), sim.time_so_far("globex")
    # Both stayed backlogged for 2000 s of 4 workers: each had half of 8000 s, within the bound (one charge
    # each and what runs now, a few times 20 s), not a hundred times apart as by dispatches.
    assert abs(acme - globex) <= 4 * 20.0 + 2 * 20.0
    assert result.share_of_time("acme") == pytest.approx(0.5, abs=0.02)


def test_the_llm_example_by_dispatches_is_a_hundred_to_one():
    core = SchedulerCore([PoolSettings("llm", fair_share=True)])
    backlog(core, "llm", "acme", 400)
    backlog(core, "llm", "globex", 40000)
    run_time = {"acme": 20.0, "globex": 0.2}
    sim = Simulation(core, "llm", workers=4, duration=lambda t: run_time[t.tenant])
    sim.run_until(2000.0)
    assert sim.time_so_far("acme") > 50 * sim.time_so_far("globex")


def test_a_task_is_first_charged_its_cost_as_seconds_else_its_tenants_average():
    core = llm_core()
    core.add_worker("w", ["llm"], 1)
    core.submit(Task("a1", "llm", tenant="acme"), 0.0)
    ((_, task),) = core.dispatch(0.0)
    assert core.charged_for(task.id) == FIRST_ESTIMATE  # nothing known yet
    core.finish("a1", 3.0, worker_id="w", attempt=1, state=SUCCEEDED)
    assert core.stats()["llm"]["tenants"]["acme"]["average_runtime"] == 3.0
    core.grant("w")
    core.submit(Task("a2", "llm", tenant="acme"), 3.0)
    ((_, task),) = core.dispatch(3.0)
    assert core.charged_for(task.id) == 3.0  # the tenant's recent average
    core.finish("a2", 4.0, worker_id="w", attempt=1, state=SUCCEEDED, ran_for=1.0)
    assert core.stats()["llm"]["tenants"]["acme"]["average_runtime"] == pytest.approx(3.0 - 2.0 / 8)
    core.grant("w")
    core.submit(Task("b1", "llm", tenant="globex", cost=0.5), 4.0)
    ((_, task),) = core.dispatch(4.0)
    assert core.charged_for(task.id) == 0.5  # its cost, as seconds
    core.finish("b1", 4.5, worker_id="w", attempt=1, state=SUCCEEDED)
    core.grant("w")
    core.submit(Task("c1", "llm", tenant="initech"), 4.5)
    ((_, task),) = core.dispatch(4.5)
    assert 0 < core.charged_for(task.id) < 3.0  # a new tenant: the pool's average


def test_a_long_task_is_charged_while_it_runs():
    core = llm_core()
    core.add_worker("w1", ["llm"], 1)
    core.add_worker("w2", ["llm"], 1)
    core.submit(Task("long", "llm", tenant="acme", cost=1.0), 0.0)  # estimated at 1 s; runs for hours
    ((_, task),) = core.dispatch(0.0)
    backlog(core, "llm", "acme", 5, start=1, cost=1.0)
    backlog(core, "llm", "globex", 5, cost=1.0)
    # An hour later, acme has been charged for the hour: globex goes first although acme came first.
    core.expire(3600.0)
    assert core.charged_for(task.id) >= 3600
    assert core.charged_for(task.id) <= 3600 + max(RECHARGE_MIN, 3600 / 8)
    order = []
    for _ in range(3):
        ((worker, t),) = core.dispatch(3600.0)
        order.append(t.tenant)
        core.finish(t.id, 3601.0, worker_id=worker, attempt=1, state=SUCCEEDED)
        core.grant(worker)
    assert order == ["globex"] * 3


def test_a_lost_worker_and_a_retry_charge_the_time_the_slot_was_held():
    core = llm_core()
    core.add_worker("w", ["llm"], 1)
    core.submit(Task("a", "llm", tenant="acme"), 0.0)
    core.submit(Task("g", "llm", tenant="globex"), 0.0)
    ((_, a),) = core.dispatch(0.0)
    assert a.tenant == "acme"
    core.remove_worker("w", 30.0)  # lost after holding its slot 30 s
    assert core.stats()["llm"]["tenants"]["acme"]["average_runtime"] == 30.0
    assert core.lag("llm", "acme") <= -29.0  # it leads by the 30 s it held, less the 1 s estimate globex took
    core.add_worker("w", ["llm"], 1)
    ((_, g),) = core.dispatch(30.0)
    assert g.tenant == "globex"
    core.requeue("g", 35.0, worker_id="w", attempt=1, ran_for=5.0)  # a retry: its failed run counts too
    assert core.stats()["llm"]["tenants"]["globex"]["average_runtime"] == 5.0


RUN_TIMES = st.lists(st.sampled_from([0.01, 0.1, 0.5, 1.0, 3.0, 10.0]), min_size=1, max_size=6)


@FAST
@given(a_times=RUN_TIMES, b_times=RUN_TIMES, weights=st.sampled_from([(1, 1), (1, 2), (3, 1)]),
       workers=st.integers(1, 4), with_cost=st.booleans())
def test_worker_time_follows_the_weights_within_the_stated_bound(a_times, b_times, weights, workers, with_cost):
    """docs/scheduling.md, "Sharing by run time": while two tenants stay backlogged, at every dispatch
    |T_a/w_a - T_b/w_b| <= sum over both of (2 * M + R) / w, with M the largest single charge or run of that
    tenant and R what its running tasks are charged."""
    wa, wb = weights
    core = SchedulerCore([PoolSettings("p", share_by="runtime", tenant_weights={"a": wa, "b": wb})])
    times = {"a": a_times, "b": b_times}
    count = 400
    for i in range(count):
        for tenant in "ab":
            run = times[tenant][i % len(times[tenant])]
            core.submit(Task(f"{tenant}{i}", "p", tenant=tenant, cost=run * 2 if with_cost else None), 0.0)
    longest = {t: max(max(times[t]) * 2, FIRST_ESTIMATE, RECHARGE_MIN) for t in "ab"}
    def run_time(task: Task) -> float:
        mine = times[task.tenant]
        return mine[int(task.id[1:]) % len(mine)]

    sim = Simulation(core, "p", workers=workers, duration=run_time)

    def check(s: Simulation) -> None:
        stats = core.stats()["p"]["tenants"]
        if not (stats["a"]["queued"] and stats["b"]["queued"]):
            return
        charged = {t: sum(core.charged_for(x.id) or 0.0 for x in core.tasks() if x.tenant == t) for t in "ab"}
        bound = sum((2 * longest[t] + charged[t]) / w for t, w in (("a", wa), ("b", wb)))
        gap = abs(s.time_so_far("a") / wa - s.time_so_far("b") / wb)
        assert gap <= bound + 1e-6, (gap, bound, s.now)

    sim.run_until(60.0, check)


# -- run-time pools under everything else at once -----------------------------------------------------------

RUNTIME_POOLS = [
    PoolSettings("p", share_by="runtime", tenant_weights={"a": 2, "a/x": 3}),
    PoolSettings("p", share_by="runtime", fair_share=True, tenant_limits={"a": 2}, tenant_rates={"a/x": 5},
                 tenant_minimums={"b": 1}),
    PoolSettings("p", share_by="cost", fair_share=True),
    PoolSettings("p", fair_share=True, tenant_rates={"b": 1}),
]


@FAST
@given(steps=st.lists(st.tuples(st.sampled_from(["submit", "dispatch", "finish", "requeue", "lose", "reload",
                                                 "wait"]),
                                st.sampled_from([None, "a", "a/x", "a/y", "b"]),
                                st.sampled_from([0.0, 0.05, 1.0, 30.0]),
                                st.integers(0, 3)),
                      min_size=1, max_size=80))
def test_runtime_pools_keep_every_task_and_count_right_under_trees_ceilings_rates_and_reloads(steps):
    """Charging by run time touches tags on every ending run: whatever the order of events, no task is lost or
    run twice, counts agree, lag stays finite, and every task still runs once the backlog is left to drain."""
    core = SchedulerCore([RUNTIME_POOLS[0]])
    now = 0.0
    serial = 0
    workers = {"w0": 2, "w1": 1}
    for worker, slots in workers.items():
        core.add_worker(worker, ["p"], slots)
    running: dict[str, str] = {}
    live: set[str] = set()
    for op, tenant, dt, pick in steps:
        if op == "submit":
            serial += 1
            core.submit(Task(f"t{serial}", "p", tenant=tenant, cost=None if pick < 2 else dt + 0.01), now)
            live.add(f"t{serial}")
        elif op == "dispatch":
            core.expire(now)
            for worker, task in core.dispatch(now):
                assert task.id not in running
                running[task.id] = worker
        elif op in ("finish", "requeue") and running:
            task_id = sorted(running)[pick % len(running)]
            worker = running.pop(task_id)
            task = core.get(task_id)
            if op == "finish":
                core.finish(task_id, now, worker_id=worker, attempt=task.attempts, state=SUCCEEDED)
                live.discard(task_id)
            else:
                core.requeue(task_id, now, worker_id=worker, attempt=task.attempts, not_before=now + dt)
            core.grant(worker)
        elif op == "lose":
            worker = f"w{pick % 2}"
            for task in core.remove_worker(worker, now):
                running.pop(task.id)
            core.add_worker(worker, ["p"], workers[worker])
        elif op == "reload":
            core.configure([RUNTIME_POOLS[pick]], now)
        now += dt
        stats = core.stats(now=now)["p"]
        assert stats["running"] == len(running)
        assert stats["queued"] + stats["delayed"] + stats["running"] == len(live)
        assert all(abs(entry["lag"]) < 1e9 for entry in stats["tenants"].values())
    core.configure([PoolSettings("p")], now)
    for worker in list(workers):
        core.grant(worker, 100)
    for _ in range(len(live) + 5):
        now += 60.0
        core.expire(now)
        for worker, task in core.dispatch(now):
            running[task.id] = worker
        for task_id, worker in list(running.items()):
            core.finish(task_id, now, worker_id=worker, attempt=core.get(task_id).attempts, state=SUCCEEDED)
            del running[task_id]
            live.discard(task_id)
    assert not live and len(core) == 0
