"""One test per scheduling rule of docs/api.md, on the pure core with a fake clock.

The clock is just a float passed as `now`; nothing here sleeps or reads time.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cronoq.core import (
    CANCELLED,
    DELAYED,
    EXPIRED,
    FAILED,
    PRIORITIES,
    PRIORITY_CLASS,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL_STATES,
    PoolSettings,
    SchedulerCore,
    Task,
)
from cronoq.errors import InvalidArgument, NotFound
from tests.core.helpers import drain, ids, make_core, submit_many, tenants

WEIGHTED = PoolSettings("p", tenant_weights={"acme": 3, "globex": 1})
EQUAL = PoolSettings("p", fair_share=True)


# -- the task and its states ---------------------------------------------------


def test_task_defaults_and_states():
    t = Task("t1", "p")
    assert (t.tenant, t.priority, t.deadline, t.not_before, t.payload) == (None, 2, None, None, None)
    assert (t.state, t.attempts, t.worker) == (QUEUED, 0, None)
    assert not hasattr(t, "__dict__")  # slots: memory per queued task matters
    assert TERMINAL_STATES == {SUCCEEDED, FAILED, CANCELLED, EXPIRED}
    assert [PRIORITY_CLASS[name] for name in PRIORITIES] == [0, 1, 2, 3]
    assert (QUEUED, DELAYED, RUNNING) == ("queued", "delayed", "running")


# -- submit --------------------------------------------------------------------


def test_submit_to_unknown_pool_names_the_pool():
    core = make_core()
    with pytest.raises(NotFound, match="nowhere"):
        core.submit(Task("t", "nowhere"), 0.0)
    assert len(core) == 0


def test_duplicate_live_id_is_refused_but_an_ended_id_may_return():
    core = make_core()
    core.submit(Task("t", "p"), 0.0)
    with pytest.raises(InvalidArgument, match="'t'"):
        core.submit(Task("t", "p"), 0.0)
    core.cancel("t", 0.0)
    core.submit(Task("t", "p"), 0.0)
    assert core.get("t").state == QUEUED


def test_a_task_object_enters_once():
    core = make_core()
    task = Task("t", "p")
    core.submit(task, 0.0)
    core.cancel("t", 0.0)
    with pytest.raises(InvalidArgument, match="new Task"):
        core.submit(task, 0.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"priority": 4},
        {"priority": -1},
        {"priority": "high"},
        {"priority": 1.0},
        {"tenant": ""},
        {"tenant": 7},
        {"deadline": "soon"},
        {"deadline": float("nan")},
        {"not_before": [1]},
    ],
)
def test_malformed_fields_are_invalid_arguments(kwargs):
    core = make_core()
    with pytest.raises(InvalidArgument):
        core.submit(Task("t", "p", **kwargs), 0.0)
    assert len(core) == 0 and core.backlog("p") == 0


@pytest.mark.parametrize("field,value", [("id", ""), ("id", 7), ("attempts", -1), ("attempts", "1")])
def test_malformed_ids_and_attempts_are_invalid_arguments(field, value):
    core = make_core()
    task = Task("t", "p")
    setattr(task, field, value)
    with pytest.raises(InvalidArgument):
        core.submit(task, 0.0)
    assert len(core) == 0


def test_attempts_are_kept_on_submit():
    core = make_core()
    task = Task("t", "p")
    task.attempts = 3  # a task recovered after a broker restart
    core.submit(task, 0.0)
    core.add_worker("w", ["p"], 1)
    ((_, got),) = core.dispatch(0.0)
    assert got.attempts == 4


# -- 1. priority first -------------------------------------------------------------


def test_strict_priority_whatever_the_tenant_and_order():
    core = make_core(WEIGHTED)
    specs = []
    for i, prio in enumerate([3, 2, 1, 0, 3, 2, 1, 0]):
        specs.append((f"{PRIORITIES[prio]}{i}", {"priority": prio, "tenant": ["acme", "globex"][i % 2]}))
    submit_many(core, 0.0, "p", specs)
    order = [t.priority for t in drain(core, 0.0)]
    assert order == sorted(order)


def test_a_critical_task_arriving_later_overtakes_the_backlog():
    core = make_core()
    submit_many(core, 0.0, "p", [(f"n{i}", {}) for i in range(5)])
    core.add_worker("w", ["p"], 1)
    ((_, first),) = core.dispatch(0.0)
    core.submit(Task("c", "p", priority=0), 1.0)
    core.finish(first.id, 1.0, worker_id="w", attempt=1, state=SUCCEEDED)
    core.grant("w")
    ((_, nxt),) = core.dispatch(1.0)
    assert nxt.id == "c"


# -- 2. deadlines next -----------------------------------------------------------


def test_deadline_tasks_go_first_in_edf_order_ties_by_submission():
    core = make_core(EQUAL)
    submit_many(
        core,
        0.0,
        "p",
        [
            ("plain-1", {"tenant": "acme"}),
            ("plain-2", {"tenant": "globex"}),
            ("due-300", {"tenant": "acme", "deadline": 300.0}),
            ("due-100a", {"tenant": "globex", "deadline": 100.0}),
            ("due-200", {"tenant": "acme", "deadline": 200.0}),
            ("due-100b", {"tenant": "acme", "deadline": 100.0}),
        ],
    )
    assert ids(drain(core, 0.0)) == ["due-100a", "due-100b", "due-200", "due-300", "plain-1", "plain-2"]


def test_deadline_tasks_do_not_count_in_the_fair_share():
    core = make_core(EQUAL)
    # acme's deadline tasks run first but do not push its start tags back.
    submit_many(core, 0.0, "p", [(f"d{i}", {"tenant": "acme", "deadline": 50.0 + i}) for i in range(4)])
    submit_many(core, 0.0, "p", [(f"g{i}", {"tenant": "globex"}) for i in range(3)])
    submit_many(core, 0.0, "p", [(f"a{i}", {"tenant": "acme"}) for i in range(3)])
    assert tenants(drain(core, 0.0)) == "aaaa" + "gagaga"


def test_priority_beats_deadline():
    core = make_core()
    core.submit(Task("urgent-deadline", "p", priority=2, deadline=1.0), 0.0)
    core.submit(Task("critical", "p", priority=0), 0.0)
    assert ids(drain(core, 0.0)) == ["critical", "urgent-deadline"]


def test_a_task_past_its_deadline_is_never_dispatched_and_expires():
    core = make_core()
    core.add_worker("w", ["p"], 5)
    core.submit(Task("late", "p", deadline=5.0), 0.0)
    core.submit(Task("already", "p", deadline=-1.0), 0.0)  # accepted although past
    assert core.get("already").state == QUEUED
    assert core.next_wakeup() == -1.0
    # Even without expire(), dispatch never hands out a task whose deadline <= now.
    assert core.dispatch(5.0) == []
    assert core.get("late").state == QUEUED  # left for expire() to report
    expired = core.expire(5.0)
    assert sorted(ids(expired)) == ["already", "late"]
    assert all(t.state == EXPIRED and t.attempts == 0 for t in expired)
    assert core.get("late") is None and len(core) == 0
    assert core.expire(6.0) == [] and core.next_wakeup() is None


def test_a_deadline_exactly_now_is_past_for_a_single_pool_worker():
    core = make_core()
    core.add_worker("w", ["p"], 1)
    core.submit(Task("due", "p", deadline=2.0), 0.0)
    core.submit(Task("other", "p"), 0.0)
    ((_, task),) = core.dispatch(2.0)
    assert task.id == "other"
    assert ids(core.expire(2.0)) == ["due"]


def test_expiry_of_a_task_that_was_passed_over_by_dispatch_is_counted_once():
    core = make_core()
    core.add_worker("w", ["p"], 1)
    for i in range(5):
        core.submit(Task(f"d{i}", "p", deadline=1.0 + i), 0.0)
    assert ids(t for _, t in core.dispatch(3.5)) == ["d3"]
    assert sorted(ids(core.expire(3.5))) == ["d0", "d1", "d2"]
    assert core.stats()["p"]["queued"] == 1
    assert ids(core.expire(10.0)) == ["d4"]
    assert core.backlog("p") == 0


# -- delays ------------------------------------------------------------------------


def test_a_delayed_task_waits_for_its_time_then_queues():
    core = make_core()
    core.add_worker("w", ["p"], 2)
    task = Task("later", "p", not_before=10.0)
    core.submit(task, 0.0)
    assert task.state == DELAYED and core.delayed("p") == 1
    assert core.next_wakeup() == 10.0
    assert core.expire(9.9) == [] and core.dispatch(9.9) == []
    assert core.expire(10.0) == []
    assert task.state == QUEUED
    assert [t.id for _, t in core.dispatch(10.0)] == ["later"]


def test_not_before_in_the_past_queues_at_once():
    core = make_core()
    core.submit(Task("t", "p", not_before=-5.0), 0.0)
    assert core.get("t").state == QUEUED


def test_a_delayed_task_whose_deadline_comes_first_expires_without_queueing():
    core = make_core()
    core.submit(Task("t", "p", not_before=10.0, deadline=5.0), 0.0)
    assert core.next_wakeup() == 5.0
    assert ids(core.expire(5.0)) == ["t"]


def test_a_delayed_task_takes_its_place_when_it_becomes_ready():
    # Its arrival is when it becomes ready: it queues behind tasks submitted meanwhile.
    core = make_core()
    core.submit(Task("delayed", "p", not_before=5.0), 0.0)
    core.submit(Task("first", "p"), 1.0)
    core.expire(5.0)
    core.submit(Task("after", "p"), 6.0)
    assert ids(drain(core, 6.0)) == ["first", "delayed", "after"]


# -- 3. fair share ----------------------------------------------------------------


def test_weights_3_to_1_with_globex_queued_first():
    core = make_core(WEIGHTED)
    submit_many(core, 0.0, "p", [(f"g{i}", {"tenant": "globex"}) for i in range(20)])
    submit_many(core, 0.0, "p", [(f"a{i}", {"tenant": "acme"}) for i in range(60)])
    order = tenants(drain(core, 0.0))
    # Exact tags: every block of four is globex's turn then acme's three (ties go to the earlier arrival).
    assert order[:80] == "gaaa" * 20
    assert Counter(order[:40]) == {"a": 30, "g": 10}


def test_a_lone_tenant_gets_every_dispatch_in_order():
    core = make_core(WEIGHTED)
    submit_many(core, 0.0, "p", [(f"g{i}", {"tenant": "globex"}) for i in range(12)])
    assert ids(drain(core, 0.0)) == [f"g{i}" for i in range(12)]


def test_untenanted_tasks_share_as_one_tenant_of_weight_1():
    core = make_core(WEIGHTED)
    submit_many(core, 0.0, "p", [(f"n{i}", {}) for i in range(6)])
    submit_many(core, 0.0, "p", [(f"x{i}", {"tenant": "unlisted"}) for i in range(6)])
    assert tenants(drain(core, 0.0)) == "-u" * 6


def test_fair_share_gives_every_tenant_weight_1():
    core = make_core(EQUAL)
    for name in ("a", "b", "c"):
        submit_many(core, 0.0, "p", [(f"{name}{i}", {"tenant": name}) for i in range(4)])
    assert tenants(drain(core, 0.0)) == "abc" * 4


def test_an_idle_tenant_banks_no_credit():
    core = make_core(EQUAL)
    core.add_worker("w", ["p"], 1)
    submit_many(core, 0.0, "p", [(f"a{i}", {"tenant": "acme"}) for i in range(30)])
    order = []
    for _ in range(10):  # acme alone for a while: globex had nothing waiting
        ((_, t),) = core.dispatch(0.0)
        order.append(t)
        core.finish(t.id, 0.0, worker_id="w", attempt=1, state=SUCCEEDED)
        core.grant("w")
    submit_many(core, 0.0, "p", [(f"g{i}", {"tenant": "globex"}) for i in range(10)])
    rest = tenants(drain(core, 0.0))
    lead = 0
    for tenant in rest:
        lead += 1 if tenant == "g" else -1
        assert lead <= 1
    assert rest[:20].count("g") == 10


def test_new_weights_reorder_the_queued_backlog_at_once():
    core = make_core(EQUAL)
    submit_many(core, 0.0, "p", [(f"a{i}", {"tenant": "acme"}) for i in range(40)])
    submit_many(core, 0.0, "p", [(f"g{i}", {"tenant": "globex"}) for i in range(40)])
    core.add_worker("w", ["p"], 8)
    assert tenants(t for _, t in core.dispatch(0.0)) == "ag" * 4
    core.configure([WEIGHTED])
    core.grant("w", 16)
    assert tenants(t for _, t in core.dispatch(0.0)) == "aaag" * 4
    core.configure([PoolSettings("p", tenant_weights={"globex": 4})])
    core.grant("w", 15)
    # 4:1 now; on equal tags acme's older head goes first.
    assert tenants(t for _, t in core.dispatch(0.0)) == "ggga" + "gggga" * 2 + "g"


def test_a_reweight_does_not_charge_a_returning_tenant_for_its_previous_period():
    core = make_core(EQUAL)
    core.add_worker("w", ["p"], 1)
    core.submit(Task("a0", "p", tenant="acme"), 0.0)
    assert ids(drain(core, 0.0)) == ["a0"]
    submit_many(core, 0.0, "p", [(f"g{i}", {"tenant": "globex"}) for i in range(10)])
    core.add_worker("w", ["p"], 6)
    assert len(core.dispatch(0.0)) == 6  # V is now 5, globex's next tag 6
    core.submit(Task("a1", "p", tenant="acme"), 0.0)  # back after idling: tag V = 5
    core.configure([PoolSettings("p", tenant_weights={"acme": 0.1})])
    # Its tag stays 5 (it banked nothing, and owes nothing from before it was idle).
    assert ids(drain(core, 0.0))[:2] == ["a1", "g6"]


def test_a_cancelled_head_is_not_charged():
    core = make_core(EQUAL)
    submit_many(core, 0.0, "p", [("a0", {"tenant": "acme"}), ("g0", {"tenant": "globex"})])
    submit_many(core, 0.0, "p", [("a1", {"tenant": "acme"}), ("g1", {"tenant": "globex"})])
    core.cancel("a0", 0.0)
    # a1 inherits a0's tag: acme still goes first... but ties go by arrival, and g0 came before a1.
    assert ids(drain(core, 0.0)) == ["g0", "a1", "g1"]


def test_pools_without_fairness_run_in_submission_order():
    core = make_core()
    submit_many(core, 0.0, "p", [(str(i), {"tenant": "acme" if i < 8 else "globex"}) for i in range(12)])
    assert ids(drain(core, 0.0)) == [str(i) for i in range(12)]


def test_lag_follows_the_weighted_share():
    core = make_core(WEIGHTED)
    submit_many(core, 0.0, "p", [(f"g{i}", {"tenant": "globex"}) for i in range(10)])
    submit_many(core, 0.0, "p", [(f"a{i}", {"tenant": "acme"}) for i in range(30)])
    assert core.lag("p", "acme") == core.lag("p", "globex") == 0.0  # both at V: nothing taken, nothing owed
    core.add_worker("w", ["p"], 4)
    assert tenants(t for _, t in core.dispatch(0.0)) == "gaaa"
    # V is the start tag of the last dispatch (acme's third, at 2/3): globex's next tag is 1, acme's 1 as
    # well; each leads by what V has yet to catch up, in its own dispatches: globex 1/3 of one, acme one.
    assert core.lag("p", "globex") == pytest.approx(-1 / 3)
    assert core.lag("p", "acme") == pytest.approx(-1.0)
    core.grant("w", 1)
    core.dispatch(0.0)  # globex again, at V = 1: acme is due at 1 too (lag 0), globex next at 2 (lag -1)
    assert core.lag("p", "globex") == pytest.approx(-1.0)
    assert core.lag("p", "acme") == pytest.approx(0.0)
    assert core.stats()["p"]["tenants"]["globex"]["lag"] == pytest.approx(-1.0)
    assert core.lag("p", "nobody") == 0.0


# -- workers -----------------------------------------------------------------------


def test_two_idle_workers_alternate():
    core = make_core()
    core.add_worker("w1", ["p"], 10)
    core.add_worker("w2", ["p"], 10)
    submit_many(core, 0.0, "p", [(str(i), {}) for i in range(6)])
    assert [w for w, _ in core.dispatch(0.0)] == ["w1", "w2"] * 3


def test_the_least_recently_ready_worker_goes_first():
    core = make_core()
    core.add_worker("w1", ["p"], 1)
    core.add_worker("w2", ["p"], 1)
    core.submit(Task("a", "p"), 0.0)
    assert core.dispatch(0.0)[0][0] == "w1"
    core.finish("a", 0.0, worker_id="w1", attempt=1, state=SUCCEEDED)
    core.grant("w1")  # w1 is ready again, after w2
    core.submit(Task("b", "p"), 0.0)
    assert core.dispatch(0.0)[0][0] == "w2"


def test_a_worker_gets_only_pools_it_serves_and_never_more_than_its_slots():
    core = make_core(PoolSettings("p"), PoolSettings("q"))
    core.add_worker("w", ["q"], 2)
    submit_many(core, 0.0, "p", [(f"p{i}", {}) for i in range(3)])
    assert core.dispatch(0.0) == []
    submit_many(core, 0.0, "q", [(f"q{i}", {}) for i in range(3)])
    assert ids(t for _, t in core.dispatch(0.0)) == ["q0", "q1"]
    assert core.dispatch(0.0) == [] and core.free_slots("w") == 0


def test_dispatch_limit():
    core = make_core()
    core.add_worker("w", ["p"], 10)
    submit_many(core, 0.0, "p", [(str(i), {}) for i in range(5)])
    assert len(core.dispatch(0.0, limit=2)) == 2
    assert core.dispatch(0.0, limit=0) == []
    assert len(core.dispatch(0.0)) == 3


def test_add_worker_with_unknown_pool_names_it():
    core = make_core()
    with pytest.raises(NotFound, match="gpu"):
        core.add_worker("w", ["p", "gpu"], 1)
    assert core.workers() == []


def test_re_adding_a_worker_keeps_its_running_tasks():
    core = make_core(PoolSettings("p"), PoolSettings("q"))
    core.add_worker("w", ["p"], 1)
    core.submit(Task("t", "p"), 0.0)
    core.dispatch(0.0)
    core.add_worker("w", ["q"], 3)
    assert ids(core.worker_tasks("w")) == ["t"] and core.free_slots("w") == 3
    assert core.finish("t", 0.0, worker_id="w", attempt=1, state=SUCCEEDED) is not None


def test_grant_to_an_unknown_worker_is_ignored_and_finish_grants_nothing():
    core = make_core()
    core.grant("ghost", 3)
    core.add_worker("w", ["p"], 1)
    core.submit(Task("t", "p"), 0.0)
    core.dispatch(0.0)
    core.finish("t", 0.0, worker_id="w", attempt=1, state=FAILED)
    assert core.free_slots("w") == 0
    core.grant("w", 2)
    assert core.free_slots("w") == 2


def test_a_lost_worker_s_tasks_go_back_with_their_deadline_and_attempts():
    core = make_core(EQUAL)
    core.add_worker("w", ["p"], 2)
    core.submit(Task("a", "p", tenant="acme", deadline=100.0), 0.0)
    core.submit(Task("b", "p", tenant="acme"), 0.0)
    core.dispatch(0.0)
    core.submit(Task("c", "p", tenant="acme"), 1.0)
    back = core.remove_worker("w", 2.0)
    assert ids(back) == ["a", "b"]
    assert all(t.state == QUEUED and t.worker is None and t.attempts == 1 for t in back)
    assert core.get("a").deadline == 100.0
    assert core.remove_worker("w", 2.0) == []
    # "b" gets a fresh tag: it goes behind "c", which was queued while it ran.
    order = drain(core, 2.0, worker="w2")
    assert ids(order) == ["a", "c", "b"]
    assert [t.attempts for t in order] == [2, 1, 2]


def test_a_late_finish_from_a_lost_worker_is_stale():
    core = make_core()
    core.add_worker("w1", ["p"], 1)
    core.submit(Task("t", "p"), 0.0)
    core.dispatch(0.0)
    core.remove_worker("w1", 1.0)
    core.add_worker("w2", ["p"], 1)
    core.dispatch(1.0)
    assert core.finish("t", 2.0, worker_id="w1", attempt=1, state=SUCCEEDED) is None
    assert core.finish("t", 2.0, worker_id="w2", attempt=1, state=SUCCEEDED) is None
    assert core.get("t").state == RUNNING
    assert core.finish("t", 2.0, worker_id="w2", attempt=2, state=SUCCEEDED).state == SUCCEEDED


def test_finish_wants_a_final_state():
    core = make_core()
    with pytest.raises(InvalidArgument):
        core.finish("t", 0.0, worker_id="w", attempt=1, state=CANCELLED)


# -- several pools per worker ------------------------------------------------------


def test_a_worker_serving_several_pools_takes_the_best_class_then_deadline_then_turns():
    core = make_core(PoolSettings("p"), PoolSettings("q"), PoolSettings("r"))
    core.add_worker("w", ["p", "q", "r"], 1)
    core.submit(Task("p-low", "p", priority=3), 0.0)
    core.submit(Task("q-normal", "q"), 0.0)
    core.submit(Task("r-normal-due", "r", deadline=50.0), 0.0)
    core.submit(Task("q-normal-due-sooner", "q", deadline=20.0), 0.0)
    order = ids(drain(core, 0.0, pools=["p", "q", "r"]))
    assert order == ["q-normal-due-sooner", "r-normal-due", "q-normal", "p-low"]


def test_pools_of_equal_standing_take_turns():
    core = make_core(PoolSettings("p"), PoolSettings("q"))
    submit_many(core, 0.0, "p", [(f"p{i}", {}) for i in range(3)])
    submit_many(core, 0.0, "q", [(f"q{i}", {}) for i in range(3)])
    assert ids(drain(core, 0.0, pools=["p", "q"])) == ["p0", "q0", "p1", "q1", "p2", "q2"]


# -- max_in_flight and pause -------------------------------------------------------


def test_max_in_flight_counts_over_all_workers_and_blocks_nobody_else():
    core = make_core(PoolSettings("capped", max_in_flight=2), PoolSettings("free"))
    for w in ("w1", "w2", "w3"):
        core.add_worker(w, ["capped", "free"], 2)
    submit_many(core, 0.0, "capped", [(f"c{i}", {"priority": 0}) for i in range(5)])
    submit_many(core, 0.0, "free", [(f"f{i}", {}) for i in range(3)])
    got = core.dispatch(0.0)
    assert sorted(ids(t for _, t in got)) == ["c0", "c1", "f0", "f1", "f2"]
    assert core.running("capped") == 2
    core.finish("c0", 0.0, worker_id=core.get("c0").worker, attempt=1, state=SUCCEEDED)
    assert ids(t for _, t in core.dispatch(0.0)) == ["c2"]
    assert core.running("capped") == 2


def test_a_paused_pool_accepts_but_does_not_dispatch():
    core = make_core(PoolSettings("p"), PoolSettings("q"))
    core.add_worker("w", ["p", "q"], 5)
    core.pause("p")
    assert core.is_paused("p") and not core.is_paused("q")
    core.submit(Task("p1", "p", priority=0), 0.0)
    core.submit(Task("q1", "q", priority=3), 0.0)
    assert ids(t for _, t in core.dispatch(0.0)) == ["q1"]
    core.resume("p")
    assert ids(t for _, t in core.dispatch(0.0)) == ["p1"]
    with pytest.raises(NotFound, match="zz"):
        core.pause("zz")
    with pytest.raises(NotFound):
        core.resume("zz")
    with pytest.raises(NotFound):
        core.is_paused("zz")


def test_deadlines_expire_in_a_paused_pool():
    core = make_core()
    core.pause("p")
    core.submit(Task("t", "p", deadline=1.0), 0.0)
    assert ids(core.expire(1.0)) == ["t"]


# -- cancel and requeue -------------------------------------------------------------


def test_cancel_queued_delayed_running_unknown():
    core = make_core()
    core.add_worker("w", ["p"], 1)
    core.submit(Task("run", "p"), 0.0)
    core.dispatch(0.0)
    core.submit(Task("q", "p"), 0.0)
    core.submit(Task("d", "p", not_before=5.0), 0.0)
    assert core.cancel("run", 0.0) is None and core.get("run").state == RUNNING
    assert core.cancel("q", 0.0).state == CANCELLED
    assert core.cancel("d", 0.0).state == CANCELLED
    assert core.cancel("q", 0.0) is None and core.cancel("nope", 0.0) is None
    assert core.backlog("p") == 0 and len(core) == 1
    assert core.next_wakeup() is None


def test_requeue_runs_again_with_a_fresh_arrival_or_after_a_delay():
    core = make_core()
    core.add_worker("w", ["p"], 1)
    core.submit(Task("t", "p", deadline=100.0), 0.0)
    core.submit(Task("u", "p"), 0.0)
    core.dispatch(0.0)
    assert core.requeue("t", 0.0, worker_id="w", attempt=2) is None  # stale attempt
    task = core.requeue("t", 0.0, worker_id="w", attempt=1, not_before=30.0)
    assert task.state == DELAYED and task.attempts == 1 and task.deadline == 100.0
    assert core.next_wakeup() == 30.0
    core.grant("w")
    assert ids(t for _, t in core.dispatch(10.0)) == ["u"]
    core.expire(30.0)
    core.grant("w")
    ((_, again),) = core.dispatch(30.0)
    assert again.id == "t" and again.attempts == 2


def test_requeue_without_delay_goes_behind_the_tasks_queued_meanwhile():
    core = make_core()
    core.add_worker("w", ["p"], 1)
    core.submit(Task("t", "p"), 0.0)
    core.dispatch(0.0)
    core.submit(Task("u", "p"), 1.0)
    assert core.requeue("t", 2.0, worker_id="w", attempt=1).state == QUEUED
    core.grant("w")
    assert ids(drain(core, 2.0, worker="w")) == ["u", "t"]


# -- configure ---------------------------------------------------------------------


def test_new_pools_appear_and_removed_pools_drain():
    core = make_core(PoolSettings("old"))
    core.add_worker("w", ["old"], 1)
    submit_many(core, 0.0, "old", [("o1", {}), ("o2", {})])
    core.configure([PoolSettings("new")])
    assert core.pool_names() == ["new"]
    with pytest.raises(NotFound, match="draining"):
        core.submit(Task("o3", "old"), 0.0)
    with pytest.raises(NotFound):
        core.add_worker("w2", ["old"], 1)
    assert core.stats()["old"]["draining"] is True
    # The backlog still dispatches to the workers that serve it.
    ((_, t1),) = core.dispatch(0.0)
    core.finish(t1.id, 0.0, worker_id="w", attempt=1, state=SUCCEEDED)
    core.grant("w")
    ((_, t2),) = core.dispatch(0.0)
    assert "old" in core.stats()
    core.finish(t2.id, 0.0, worker_id="w", attempt=1, state=SUCCEEDED)
    assert "old" not in core.stats()
    core.submit(Task("n", "new"), 0.0)
    assert core.dispatch(0.0) == []  # w served only "old"


def test_a_draining_pool_that_comes_back_accepts_again():
    core = make_core(PoolSettings("p"))
    core.submit(Task("t", "p"), 0.0)
    core.configure([PoolSettings("q")])
    core.configure([PoolSettings("p", fair_share=True), PoolSettings("q")])
    core.submit(Task("u", "p", tenant="acme"), 0.0)
    assert core.pool_names() == ["p", "q"] and core.backlog("p") == 2
    assert ids(drain(core, 0.0)) == ["t", "u"]


def test_switching_fairness_keeps_the_backlog():
    core = make_core()
    submit_many(core, 0.0, "p", [("a1", {"tenant": "a"}), ("a2", {"tenant": "a"}), ("b1", {"tenant": "b"})])
    core.configure([EQUAL])
    assert ids(drain(core, 0.0)) == ["a1", "b1", "a2"]
    submit_many(core, 0.0, "p", [("a3", {"tenant": "a"}), ("a4", {"tenant": "a"}), ("b2", {"tenant": "b"})])
    core.configure([PoolSettings("p")])
    assert ids(drain(core, 0.0)) == ["a3", "a4", "b2"]


def test_switching_fairness_back_and_forth_loses_and_repeats_nothing():
    core = make_core()
    expected = set()
    for round_ in range(4):
        for i in range(12):
            task_id = f"r{round_}-{i}"
            core.submit(Task(task_id, "p", tenant="abc"[i % 3]), 0.0)
            expected.add(task_id)
        core.configure([EQUAL if round_ % 2 == 0 else PoolSettings("p")])
        # Cancel most of the backlog so that the queues compact themselves.
        for i in range(1, 12):
            if i % 4:
                core.cancel(f"r{round_}-{i}", 0.0)
                expected.discard(f"r{round_}-{i}")
    order = ids(drain(core, 0.0))
    assert len(order) == len(set(order)) and set(order) == expected


@pytest.mark.parametrize(
    "pools",
    [
        [PoolSettings("p"), PoolSettings("p")],
        [PoolSettings("p", tenant_weights={"a": 0})],
        [PoolSettings("p", tenant_weights={"a": -1})],
        [PoolSettings("p", tenant_weights={"a": float("inf")})],
        [PoolSettings("p", max_in_flight=0)],
        [PoolSettings("")],
    ],
)
def test_invalid_pool_lists_are_refused_and_change_nothing(pools):
    core = make_core(PoolSettings("keep"))
    with pytest.raises(InvalidArgument):
        core.configure(pools)
    assert core.pool_names() == ["keep"]


def test_irregular_weights_fall_back_to_float_tags_and_still_share():
    primes = [1009, 1013, 1019, 1021, 1031, 1033, 1039]
    weights = {f"t{p}": p / 1000 for p in primes}
    core = make_core(PoolSettings("p", tenant_weights=weights))
    for tenant in weights:
        submit_many(core, 0.0, "p", [(f"{tenant}-{i}", {"tenant": tenant}) for i in range(3)])
    assert Counter(t.tenant for t in drain(core, 0.0)) == {tenant: 3 for tenant in weights}


# -- counts and stats --------------------------------------------------------------


def test_counts_and_stats_are_plain_json():
    core = make_core(WEIGHTED, PoolSettings("q", max_in_flight=3))
    core.add_worker("w", ["p"], 1)
    core.submit(Task("a", "p", tenant="acme"), 0.0)
    core.submit(Task("b", "p", tenant="acme", priority=0), 0.0)
    core.submit(Task("c", "p", not_before=5.0), 0.0)
    core.dispatch(0.0)
    assert core.backlog("p") == 2 and core.tenant_backlog("p", "acme") == 1
    assert core.tenant_backlog("p", None) == 1 and core.tenant_backlog("p", "nobody") == 0
    assert (core.queued("p"), core.delayed("p"), core.running("p")) == (1, 1, 1)
    with pytest.raises(NotFound):
        core.backlog("zz")
    stats = core.stats()
    json.dumps(stats)
    p = stats["p"]
    assert (p["queued"], p["delayed"], p["running"], p["fair"], p["max_in_flight"]) == (1, 1, 1, True, None)
    assert p["classes"]["critical"] == {"queued": 0, "delayed": 0, "running": 1, "dispatched": 1, "virtual_time": 0.0}
    assert p["tenants"]["acme"] == {
        "weight": 3.0,
        "queued": 1,
        "delayed": 0,
        "running": 1,
        "dispatched": 1,
        "lag": 0.0,
        "weighted_share": 1.0,  # alone in the normal class, the one served now
        "own_weighted_share": 1.0,
        "own_lag": 0.0,
        "average_runtime": None,  # known only in a pool that shares by run time
    }
    assert (p["share_by"], p["share_unit"], p["rates"], p["minimums"]) == ("dispatches", "dispatches", {}, {})
    assert p["tree_nodes"] == {}
    assert p["tenants"][""]["delayed"] == 1
    assert stats["q"]["max_in_flight"] == 3 and stats["q"]["fair"] is False
    assert len(core) == 3 and "a" in core and "zz" not in core
    assert sorted(t.id for t in core.tasks()) == ["a", "b", "c"]


def test_an_idle_core_dispatches_nothing():
    core = make_core()
    assert core.dispatch(0.0) == []
    core.add_worker("w", ["p"], 1)
    assert core.dispatch(0.0) == []
    assert core.expire(0.0) == [] and core.next_wakeup() is None


def test_a_backlog_without_a_worker_for_it_does_not_stall_others():
    core = make_core(PoolSettings("p"), PoolSettings("q"))
    for i in range(50):
        core.add_worker(f"idle{i}", ["p"], 1)
    core.submit(Task("q1", "q"), 0.0)
    assert core.dispatch(0.0) == []
    core.add_worker("wq", ["q"], 1)
    assert core.dispatch(0.0) == [("wq", core.get("q1"))]


def test_core_with_no_pools_is_allowed():
    core = SchedulerCore([])
    assert core.pool_names() == [] and core.stats() == {}
