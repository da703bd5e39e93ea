"""Tenant rates and minimums in the core (docs/scheduling.md, "Rates" and "Minimums").

- a rated tenant starts at most its rate per second after a burst of one second's worth, while the others
  take every slot it leaves; its refill wakes the shell; it is held back like a capped node, deadline tasks
  too; a rate on a parent holds its whole subtree; reload re-times the bucket;
- a tenant under its minimum goes ahead of the fair order of its class (not of a higher class, nor of
  deadlines), and pays for it: above its minimum it shares by weight;
- the settings' checks, and what stats() show.
"""

from __future__ import annotations

from collections import Counter

import pytest

from cronoq.core import SUCCEEDED, PoolSettings, SchedulerCore, Task
from cronoq.errors import InvalidArgument
from tests.core.simulation import Simulation


def backlog(core: SchedulerCore, pool: str, tenant: str, n: int, **kwargs) -> None:
    for i in range(n):
        core.submit(Task(f"{tenant}-{i}-{kwargs.get('priority', 2)}", pool, tenant=tenant, **kwargs), 0.0)


# -- rates -----------------------------------------------------------------------------------------------


def test_a_rated_tenant_bursts_one_second_then_keeps_its_rate_while_others_take_the_rest():
    core = SchedulerCore([PoolSettings("p", tenant_rates={"acme": 5})])
    backlog(core, "p", "acme", 500)
    backlog(core, "p", "globex", 5000)
    sim = Simulation(core, "p", workers=4, duration=lambda t: 0.05)
    run = sim.run_until(10.0)
    acme = [at for at, task in run.starts if task.tenant == "acme"]
    globex = [at for at, task in run.starts if task.tenant == "globex"]
    # A burst of 5 at once, then 5 a second: 5 + 5 * 10 at most over 10 s.
    assert len(acme) <= 5 + 5 * 10 and len(acme) >= 5 * 10
    for start in range(0, 10):
        in_window = [at for at in acme if start <= at < start + 1]
        assert len(in_window) <= 5 + (5 if start == 0 else 0)
    # globex was never held back by acme's limit: 4 workers of 0.05 s tasks are 800 starts in 10 s.
    assert len(acme) + len(globex) >= 795


def test_the_refill_is_the_next_wakeup_and_lets_the_tenant_go():
    core = SchedulerCore([PoolSettings("p", tenant_rates={"acme": 2})])
    backlog(core, "p", "acme", 5)
    core.add_worker("w", ["p"], 10)
    assert [t.tenant for _, t in core.dispatch(0.0)] == ["acme", "acme"]  # a bucket of 2
    assert core.next_wakeup() == pytest.approx(0.5)
    assert core.dispatch(0.4) == []
    core.expire(0.5)
    assert len(core.dispatch(0.5)) == 1
    stats = core.stats(now=0.5)["p"]["rates"]["acme"]
    assert stats["rate"] == 2 and stats["limited"] and stats["next_start_in"] == pytest.approx(0.5)
    assert stats["tokens"] == pytest.approx(0.0)


def test_a_rate_below_one_per_second_still_starts_one_task():
    core = SchedulerCore([PoolSettings("p", tenant_rates={"acme": 0.5})])
    backlog(core, "p", "acme", 3)
    core.add_worker("w", ["p"], 10)
    assert len(core.dispatch(0.0)) == 1
    assert core.next_wakeup() == pytest.approx(2.0)


def test_a_rate_holds_deadline_tasks_and_higher_classes_too():
    core = SchedulerCore([PoolSettings("p", tenant_rates={"acme": 1})])
    core.submit(Task("a1", "p", tenant="acme", priority=0, deadline=100.0), 0.0)
    core.submit(Task("a2", "p", tenant="acme", priority=0, deadline=50.0), 0.0)
    core.submit(Task("g1", "p", tenant="globex", priority=3), 0.0)
    core.add_worker("w", ["p"], 10)
    got = [t.id for _, t in core.dispatch(0.0)]
    assert got == ["a2", "g1"]  # acme's second deadline task waits for its token; globex is not held behind it


def test_a_rate_on_a_parent_holds_its_whole_subtree():
    core = SchedulerCore([PoolSettings("p", tenant_rates={"acme": 3, "acme/x": 100})])
    backlog(core, "p", "acme/x", 5)
    backlog(core, "p", "acme/y", 5)
    core.add_worker("w", ["p"], 10)
    assert len(core.dispatch(0.0)) == 3
    assert core.stats(now=0.0)["p"]["rates"]["acme/x"]["limited"] is False


def test_a_rated_node_rejoins_without_banked_credit():
    core = SchedulerCore([PoolSettings("p", tenant_rates={"acme": 1})])
    backlog(core, "p", "acme", 10)
    backlog(core, "p", "globex", 10)
    core.add_worker("w", ["p"], 1)
    order = []
    now = 0.0
    for _ in range(8):
        core.expire(now)
        got = core.dispatch(now)
        if got:
            ((worker, task),) = got
            order.append(task.tenant[0])
            core.finish(task.id, now, worker_id=worker, attempt=1, state=SUCCEEDED)
            core.grant(worker)
        now += 0.25
    # Back after a second held, acme takes its turn; it is not owed the turns globex took meanwhile.
    assert "".join(order) == "agggaggg"


def test_reload_retimes_a_bucket_on_a_live_backlog():
    core = SchedulerCore([PoolSettings("p", tenant_rates={"acme": 1})])
    backlog(core, "p", "acme", 20)
    core.add_worker("w", ["p"], 20)
    assert len(core.dispatch(0.0)) == 1
    assert core.dispatch(0.1) == []
    core.configure([PoolSettings("p", tenant_rates={"acme": 10})], now=0.1)
    # The bucket keeps the one token it spent and repays it at the new rate (0.9 s of debt at 1/s is 0.09 s at
    # 10/s): nine of its ten tokens are there at once, and the next comes at 0.19 s.
    assert len(core.dispatch(0.1)) == 9
    assert core.next_wakeup() == pytest.approx(0.19)
    core.configure([PoolSettings("p")], now=0.15)
    assert len(core.dispatch(0.15)) == 10  # no rate: the rest of w's slots at once
    assert core.stats(now=0.15)["p"]["rates"] == {}


@pytest.mark.parametrize("rate", [0, -1, float("inf"), float("nan"), "5", True])
def test_a_rate_must_be_a_positive_number(rate):
    with pytest.raises(InvalidArgument, match="rate of tenant 'acme' must be a positive number"):
        SchedulerCore([PoolSettings("p", tenant_rates={"acme": rate})])


# -- minimums --------------------------------------------------------------------------------------------


def test_a_minimum_of_two_beside_a_tenant_weighted_ten_to_one():
    core = SchedulerCore([PoolSettings("p", tenant_weights={"big": 10, "small": 1},
                                       tenant_minimums={"small": 2})])
    backlog(core, "p", "big", 400)
    backlog(core, "p", "small", 400)
    running = Counter()

    def watch(s: Simulation) -> None:
        count = Counter(core.get(i).tenant for i in s.running if core.get(i) is not None)
        running["checks"] += 1
        if count["small"] < 2:
            running["under"] += 1

    sim = Simulation(core, "p", workers=8, duration=lambda t: 1.0)
    sim.run_until(20.0, watch)
    # Weighted 10 : 1 over 8 slots, small would run 8/11 of a slot; its minimum keeps 2 running throughout.
    assert running["under"] == 0
    assert sim.time_so_far("small") >= 2 * 20 - 2


def test_without_the_minimum_the_small_tenant_runs_under_two():
    core = SchedulerCore([PoolSettings("p", tenant_weights={"big": 10, "small": 1})])
    backlog(core, "p", "big", 400)
    backlog(core, "p", "small", 400)
    sim = Simulation(core, "p", workers=8, duration=lambda t: 1.0)
    sim.run_until(20.0)
    assert sim.time_so_far("small") < 2 * 20 - 2


def test_a_minimum_is_a_floor_not_extra_share():
    # Equal weights over 4 slots: each is promised 2 running; a minimum of 1 changes nothing in steady state.
    base = SchedulerCore([PoolSettings("p", fair_share=True)])
    floor = SchedulerCore([PoolSettings("p", fair_share=True, tenant_minimums={"a": 1})])
    times = {}
    for name, core in (("base", base), ("floor", floor)):
        backlog(core, "p", "a", 200)
        backlog(core, "p", "b", 200)
        sim = Simulation(core, "p", workers=4, duration=lambda t: 1.0)
        sim.run_until(30.0)
        times[name] = (sim.time_so_far("a"), sim.time_so_far("b"))
    assert abs(times["floor"][0] - times["floor"][1]) <= 2
    assert times["floor"] == times["base"]


def test_a_minimum_does_not_jump_a_higher_class_or_a_deadline():
    core = SchedulerCore([PoolSettings("p", fair_share=True, tenant_minimums={"small": 1})])
    core.submit(Task("b-high", "p", tenant="big", priority=1), 0.0)
    core.submit(Task("b-dl", "p", tenant="big", deadline=100.0), 0.0)
    core.submit(Task("b1", "p", tenant="big"), 0.0)
    core.submit(Task("s1", "p", tenant="small"), 0.0)
    core.add_worker("w", ["p"], 10)
    assert [t.id for _, t in core.dispatch(0.0, limit=3)] == ["b-high", "b-dl", "s1"]


def test_a_minimum_goes_first_only_while_under_it():
    core = SchedulerCore([PoolSettings("p", fair_share=True, tenant_minimums={"s": 2})])
    for i in range(6):
        core.submit(Task(f"b{i}", "p", tenant="b"), 0.0)
    for i in range(6):
        core.submit(Task(f"s{i}", "p", tenant="s"), 0.0)
    core.add_worker("w", ["p"], 6)
    got = "".join(t.tenant for _, t in core.dispatch(0.0))
    # s goes first twice (its floor), b then catches up on the turns s took: s paid for them.
    assert got == "ssbbbs"
    minimums = core.stats()["p"]["minimums"]
    assert minimums == {"s": {"minimum": 2, "running": 3, "under": False}}


def test_minimums_in_a_tree_and_several_under_theirs_go_by_the_fair_order():
    core = SchedulerCore([PoolSettings("p", fair_share=True, tenant_minimums={"acme/x": 1, "globex": 1})])
    core.submit(Task("other", "p", tenant="initech"), 0.0)
    core.submit(Task("x", "p", tenant="acme/x"), 0.0)
    core.submit(Task("g", "p", tenant="globex"), 0.0)
    core.add_worker("w", ["p"], 3)
    # Both needy ones first, in the fair order between them (all tags tie: by arrival), then the rest.
    assert [t.id for _, t in core.dispatch(0.0)] == ["x", "g", "other"]


def test_minimums_are_checked_against_max_in_flight_and_ceilings():
    with pytest.raises(InvalidArgument, match="guarantee 5 running tasks .* max_in_flight is 4"):
        SchedulerCore([PoolSettings("p", max_in_flight=4, tenant_minimums={"a": 3, "b": 2, "a/x": 3})])
    SchedulerCore([PoolSettings("p", max_in_flight=5, tenant_minimums={"a": 3, "b": 2, "a/x": 3})])
    with pytest.raises(InvalidArgument, match="'a/x' is guaranteed 3 running tasks but the ceiling of 'a'"):
        SchedulerCore([PoolSettings("p", tenant_limits={"a": 2}, tenant_minimums={"a/x": 3})])
    for bad in (0, -1, 1.5, "2", None):
        with pytest.raises(InvalidArgument, match="minimum of tenant 'a' must be an int >= 1"):
            SchedulerCore([PoolSettings("p", tenant_minimums={"a": bad})])


def test_a_reload_adds_and_drops_a_minimum_on_a_live_backlog():
    core = SchedulerCore([PoolSettings("p", fair_share=True)])
    for i in range(4):
        core.submit(Task(f"b{i}", "p", tenant="b"), 0.0)
        core.submit(Task(f"s{i}", "p", tenant="s"), 0.0)
    core.configure([PoolSettings("p", fair_share=True, tenant_minimums={"s": 2})])
    core.add_worker("w", ["p"], 2)
    assert [t.tenant for _, t in core.dispatch(0.0)] == ["s", "s"]


# -- what explain and stats say ---------------------------------------------------------------------------


def test_explain_says_rate_limited_and_when_it_starts_next():
    from cronoq.answers import Explanation, explain_text

    core = SchedulerCore([PoolSettings("p", tenant_rates={"acme": 2}, tenant_minimums={"globex": 1})])
    backlog(core, "p", "acme", 4)
    core.add_worker("w", ["p"], 10)
    core.dispatch(0.0)
    waiting = core.explain("acme-2-2", 0.1, dispatch_rate=10.0)
    (node,) = waiting.nodes
    assert node.rate == 2 and node.rate_limited_for == pytest.approx(0.4)
    assert waiting.estimate == pytest.approx(0.4)
    assert "rate-limited: next start in 0.4 s" in waiting.estimate_note
    text = explain_text(Explanation("acme-2-2", "p", "acme", "normal", "queued", 0, 0, 0.0, waiting=waiting))
    assert "acme is rate-limited (2/s): next start in 0.4 s" in text
    assert "rate 2/s, rate-limited: next start in 0.4 s" in text
    later = core.explain("acme-3-2", 0.1, dispatch_rate=10.0)
    assert later.estimate == pytest.approx(0.4 + 1 / 2)  # one more token ahead of it
    core.submit(Task("g", "p", tenant="globex"), 0.1)
    core.pause("p")
    (gnode,) = core.explain("g", 0.1).nodes
    assert gnode.minimum == 1 and gnode.under_minimum


def test_explain_speaks_in_the_pools_unit():
    core = SchedulerCore([PoolSettings("p", share_by="runtime", fair_share=True)])
    core.submit(Task("a", "p", tenant="acme"), 0.0)
    assert core.explain("a", 0.0).share_unit == "seconds"
