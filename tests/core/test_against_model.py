"""SchedulerCore against the naive reference model, over random interleavings of every operation.

Hypothesis drives submit, dispatch, finish, requeue, cancel, expire, delays,
time, workers coming and going, pause and reload. After every step the core
and the model (tests/core/model.py) must agree on every decision and every
count, and the core's invariants must hold: no expired task dispatched,
max_in_flight respected, no task lost or dispatched twice, and every task
ends in exactly one terminal state.
"""

from __future__ import annotations

import collections
import math

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cronoq.core import (
    DELAYED,
    FAILED,
    PRIORITIES,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL_STATES,
    PoolSettings,
    SchedulerCore,
    Task,
)
from cronoq.errors import InvalidArgument, NotFound
from tests.core.model import MTask, Model, prefixes

POOL_NAMES = ["fair", "plain", "share", "limits"]
TENANTS = [None, "a", "b", "c"]
WORKERS = ["w0", "w1", "w2", "w3"]
OFFSETS = [-1.0, 0.0, 0.0, 0.5, 1.0, 2.0, 5.0]

WEIGHTS = [
    {"a": 3, "b": 1},
    {"a": 1, "b": 2, "c": 0.5},
    {"b": 4},
]


RATES = [{}, {}, {"a": 2}, {"b": 0.5, "a": 10}, {"c": 1}]
MINIMUMS = [{}, {}, {"b": 1}, {"a": 1, "c": 2}]
COSTS = [None, None, 0.5, 1, 2.5, 3, 0.001]


@st.composite
def pool_settings(draw: st.DrawFn, name: str) -> PoolSettings:
    kind = draw(st.sampled_from(["weights", "fair_share", "plain", "cost", "limits"]))
    cap = draw(st.sampled_from([None, None, 1, 2, 3]))
    if kind == "weights":
        return PoolSettings(name, tenant_weights=draw(st.sampled_from(WEIGHTS)), max_in_flight=cap)
    if kind == "cost":
        return PoolSettings(name, tenant_weights=draw(st.sampled_from(WEIGHTS)), share_by="cost",
                            tenant_rates=draw(st.sampled_from(RATES)))
    if kind == "limits":
        return PoolSettings(name, fair_share=True, tenant_rates=draw(st.sampled_from(RATES)),
                            tenant_minimums=draw(st.sampled_from(MINIMUMS)),
                            share_by=draw(st.sampled_from(["dispatches", "cost"])))
    return PoolSettings(name, fair_share=kind == "fair_share", max_in_flight=cap)


INITIAL = [
    PoolSettings("fair", tenant_weights={"a": 3, "b": 1}),
    PoolSettings("plain", max_in_flight=2),
    PoolSettings("share", fair_share=True, max_in_flight=3),
    PoolSettings("limits", share_by="cost", tenant_weights={"a": 2}, tenant_rates={"a": 2, "b": 0.5},
                 tenant_minimums={"c": 1, "b": 1}),
]


class CoreVersusModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = SchedulerCore(INITIAL)
        self.model = Model(list(INITIAL))
        self.now = 0.0
        self.next_id = 0
        self.submitted: set[str] = set()
        self.ended: dict[str, str] = {}  # id -> terminal state, recorded once
        self.dispatches: dict[str, int] = {}  # id -> times handed out
        # Start with workers so that short runs already reach the interesting decisions.
        for worker, pools, slots in (("w0", ["fair", "plain", "share", "limits"], 3), ("w1", ["fair"], 1)):
            self.core.add_worker(worker, pools, slots)
            self.model.add_worker(worker, pools, slots)

    # -- helpers -----------------------------------------------------------

    def _end(self, task: Task) -> None:
        assert task.state in TERMINAL_STATES
        assert task.id not in self.ended, f"{task.id} ended twice"
        self.ended[task.id] = task.state

    def _live_ids(self, state: str | None = None) -> list[str]:
        return sorted(i for i, t in self.model.tasks.items() if state is None or t.state == state)

    # -- rules -------------------------------------------------------------

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(
        pool=st.sampled_from(POOL_NAMES + ["nope"]),
        tenant=st.sampled_from(TENANTS),
        priority=st.sampled_from([0, 1, 2, 2, 2, 3]),
        deadline=st.none() | st.sampled_from(OFFSETS),
        delay=st.none() | st.sampled_from(OFFSETS),
        attempts=st.sampled_from([0, 0, 0, 2]),
        data=st.data(),
        cost=st.sampled_from(COSTS),
    )
    def submit(self, pool, tenant, priority, deadline, delay, attempts, data, cost) -> None:
        self._submit(pool, tenant, priority, deadline, delay, attempts, data, cost)

    @rule(pool=st.sampled_from(POOL_NAMES), tenants=st.lists(st.sampled_from(TENANTS), min_size=2, max_size=12),
          costs=st.lists(st.sampled_from(COSTS), min_size=1, max_size=3))
    def burst(self, pool, tenants, costs) -> None:
        """Several plain tasks at once: builds the backlogs that fair sharing orders."""
        for i, tenant in enumerate(tenants):
            self._submit(pool, tenant, 2, None, None, 0, None, costs[i % len(costs)])

    @rule(pool=st.sampled_from(POOL_NAMES), tenant=st.sampled_from(TENANTS), priority=st.integers(0, 3))
    def submit_due_now(self, pool, tenant, priority) -> None:
        """A task whose deadline is this very moment: it must never be dispatched."""
        self._submit(pool, tenant, priority, 0.0, None, 0, None)

    def _submit(self, pool, tenant, priority, deadline, delay, attempts, data, cost=None) -> None:
        live = self._live_ids()
        if live and data is not None and data.draw(st.integers(0, 9)) == 0:
            task_id = data.draw(st.sampled_from(live))  # a duplicate live id
        else:
            task_id = f"t{self.next_id}"
            self.next_id += 1
        dl = None if deadline is None else self.now + deadline
        nb = None if delay is None else self.now + delay
        task = Task(task_id, pool, tenant=tenant, priority=priority, deadline=dl, not_before=nb, payload=object(),
                    cost=cost)
        task.attempts = attempts
        if pool not in self.model.accepting():
            with pytest.raises(NotFound, match=pool):
                self.core.submit(task, self.now)
            return
        if task_id in self.model.tasks:
            with pytest.raises(InvalidArgument):
                self.core.submit(task, self.now)
            return
        self.core.submit(task, self.now)
        self.model.submit(MTask(task_id, pool, tenant, priority, dl, nb, attempts=attempts, cost=cost), self.now)
        self.submitted.add(task_id)

    @rule(limit=st.sampled_from([None, None, 1, 2, 3]), expire_first=st.booleans())
    def dispatch(self, limit, expire_first) -> None:
        if expire_first:
            self.expire()
        contested = sum(
            1
            for name in ("fair", "share")
            if name in self.model.pools and len(self.model._backlogged(name, 2)) >= 2
        )
        due_now = any(t.state == QUEUED and t.deadline == self.now for t in self.model.tasks.values())
        got = self.core.dispatch(self.now, limit)
        want = self.model.dispatch(self.now, limit)
        if got and contested:
            event("dispatch while tenants contend")
        if due_now:
            event("dispatch while a task is due now")
        assert [(w, t.id) for w, t in got] == [(w, t.id) for w, t in want]
        if limit is not None:
            assert len(got) <= limit
        for worker_id, task in got:
            assert task.state is RUNNING and task.worker == worker_id
            assert task.deadline is None or task.deadline > self.now, "dispatched an expired task"
            assert task.not_before is None or task.not_before <= self.now, "dispatched a delayed task"
            self.dispatches[task.id] = self.dispatches.get(task.id, 0) + 1
        for name in {t.pool for _, t in got}:
            cap = self.model.pools[name].settings.max_in_flight
            assert cap is None or self.core.running(name) <= cap, f"{name} over max_in_flight"

    @rule()
    def expire(self) -> None:
        got = self.core.expire(self.now)
        want = self.model.expire(self.now)
        assert sorted(t.id for t in got) == sorted(t.id for t in want)
        for task in got:
            assert task.deadline is not None and task.deadline <= self.now
            self._end(task)

    @rule(
        data=st.data(),
        state=st.sampled_from([SUCCEEDED, FAILED]),
        stale=st.sampled_from([None, None, "worker", "attempt"]),
        regrant=st.booleans(),
    )
    def finish(self, data, state, stale, regrant) -> None:
        running = self._live_ids(RUNNING)
        if not running:
            return
        task_id = data.draw(st.sampled_from(running))
        m = self.model.tasks[task_id]
        worker, attempt = m.worker, m.attempts
        if stale == "worker":
            worker = data.draw(st.sampled_from([w for w in WORKERS if w != worker]))
        elif stale == "attempt":
            attempt -= 1
        got = self.core.finish(task_id, self.now, worker_id=worker, attempt=attempt, state=state)
        want = self.model.finish(task_id, worker, attempt, state)
        assert (got is None) == (want is None)
        if got is not None:
            assert got.state == state
            self._end(got)
            if regrant:  # what the shell does when the worker reports the slot free
                self.core.grant(worker, 1)
                self.model.grant(worker, 1)

    @rule(data=st.data(), delay=st.none() | st.sampled_from(OFFSETS), stale=st.sampled_from([None, None, "attempt"]))
    def requeue(self, data, delay, stale) -> None:
        running = self._live_ids(RUNNING)
        if not running:
            return
        task_id = data.draw(st.sampled_from(running))
        m = self.model.tasks[task_id]
        attempt = m.attempts - (1 if stale else 0)
        nb = None if delay is None else self.now + delay
        got = self.core.requeue(task_id, self.now, worker_id=m.worker, attempt=attempt, not_before=nb)
        want = self.model.requeue(task_id, self.now, m.worker, attempt, nb)
        assert (got is None) == (want is None)
        if got is not None:
            assert got.state in (QUEUED, DELAYED)

    @rule(data=st.data())
    def cancel(self, data) -> None:
        choices = self._live_ids() + ["unknown"] + sorted(self.ended)[:3]
        task_id = data.draw(st.sampled_from(choices))
        got = self.core.cancel(task_id, self.now)
        want = self.model.cancel(task_id)
        assert (got is None) == (want is None)
        if got is not None:
            self._end(got)

    @rule(worker=st.sampled_from(WORKERS), data=st.data(), slots=st.integers(0, 3))
    def add_worker(self, worker, data, slots) -> None:
        names = data.draw(st.lists(st.sampled_from(POOL_NAMES + ["nope"]), max_size=3))
        bad = [n for n in names if n not in self.model.accepting()]
        if bad:
            with pytest.raises(NotFound, match=bad[0]):
                self.core.add_worker(worker, names, slots)
            return
        self.core.add_worker(worker, names, slots)
        self.model.add_worker(worker, names, slots)

    @rule(worker=st.sampled_from(WORKERS + ["ghost"]), slots=st.integers(0, 3))
    def grant(self, worker, slots) -> None:
        self.core.grant(worker, slots)
        self.model.grant(worker, slots)

    @rule(worker=st.sampled_from(WORKERS + ["ghost"]))
    def remove_worker(self, worker) -> None:
        got = self.core.remove_worker(worker, self.now)
        want = self.model.remove_worker(worker)
        assert [t.id for t in got] == [t.id for t in want]
        for task in got:
            assert task.state is QUEUED and task.worker is None

    @rule(pool=st.sampled_from(POOL_NAMES + ["nope"]), paused=st.booleans())
    def pause(self, pool, paused) -> None:
        if pool not in self.model.pools:
            with pytest.raises(NotFound):
                self.core.pause(pool)
            return
        (self.core.pause if paused else self.core.resume)(pool)
        self.model.pools[pool].paused = paused

    @rule(data=st.data())
    def configure(self, data) -> None:
        keep = data.draw(st.lists(st.sampled_from(POOL_NAMES), min_size=1, max_size=3, unique=True))
        pools = [data.draw(pool_settings(name)) for name in keep]
        self.core.configure(pools)
        self.model.configure(pools)

    # -- invariants --------------------------------------------------------

    @invariant()
    def same_state(self) -> None:
        core, model = self.core, self.model
        assert len(core) == len(model.tasks)
        for task_id, m in model.tasks.items():
            t = core.get(task_id)
            assert t is not None, f"{task_id} lost"
            assert (t.state, t.attempts, t.worker) == (m.state, m.attempts, m.worker), task_id
        assert core.pool_names() == model.accepting()
        assert core.next_wakeup() == model.next_wakeup()
        for worker_id, w in model.workers.items():
            assert [t.id for t in core.worker_tasks(worker_id)] == w.running
            assert core.free_slots(worker_id) == w.free

    @invariant()
    def stats_agree(self) -> None:
        # One stats() answer per step, checked by every part that reads it: stats() walks every pool and tenant,
        # and asking once per check made it most of this test's time.
        self.check_stats(self.core.stats())

    def check_stats(self, stats: dict) -> None:
        """Everything stats() says, against the model: subclasses add what their features add."""
        self.counts_agree(stats)
        self.weighted_shares_are_the_rules_own(stats)

    def counts_agree(self, stats: dict) -> None:
        assert set(stats) == set(self.model.pools)
        # The model's tasks tallied once per step, by every grouping stats() reports (a sum over all tasks for
        # each figure made this invariant most of the test's time).
        tally: collections.Counter = collections.Counter()
        for t in self.model.tasks.values():
            tally[t.pool, t.state] += 1
            tally[t.pool, "class", t.priority, t.state] += 1
            tally[t.pool, "tenant", t.tenant, t.state] += 1
            if t.deadline is not None:
                tally[t.pool, "deadline", t.priority, t.state] += 1
        for name, mp in self.model.pools.items():
            s = stats[name]

            def count(state, *group):
                return tally[(name, *group, state)]

            assert (s["queued"], s["delayed"], s["running"]) == (count(QUEUED), count(DELAYED), count(RUNNING))
            assert (s["paused"], s["draining"], s["fair"]) == (mp.paused, mp.draining, mp.settings.fair)
            assert self.core.backlog(name) == count(QUEUED) + count(DELAYED)
            for number, cname in enumerate(PRIORITIES):
                c = s["classes"][cname]
                in_class = ("class", number)
                assert (c["queued"], c["delayed"], c["running"]) == (
                    count(QUEUED, *in_class),
                    count(DELAYED, *in_class),
                    count(RUNNING, *in_class),
                )
                # `explain` counts a class's queued deadline tasks in O(1): the count must follow every move.
                assert self.core._pools[name].classes[number].deadlined == count(QUEUED, "deadline", number)
            for key, ts in s["tenants"].items():
                mine = ("tenant", key or None)
                assert (ts["queued"], ts["delayed"], ts["running"]) == (
                    count(QUEUED, *mine),
                    count(DELAYED, *mine),
                    count(RUNNING, *mine),
                )
                assert self.core.tenant_backlog(name, key or None) == count(QUEUED, *mine) + count(DELAYED, *mine)
                assert math.isfinite(ts["lag"])

    @invariant()
    def lag_is_the_rules_own_and_bounded(self) -> None:
        # The bound of docs/scheduling.md: in every class where a node has queued work its lag lies in [-1, 0]
        # (SFQ keeps V <= S <= V + 1/w), whatever happened before: ceilings, pauses, workers lost; a node that
        # a reload re-weighted while it was idle may lead by one dispatch at its old weight until its next one.
        for name, mp in self.model.pools.items():
            nodes = {node for t in self.model.tasks.values() if t.pool == name for node in prefixes(t.tenant)}
            for node in nodes:
                lag = self.core.lag(name, node)
                assert abs(lag - float(self.model.lag(name, node))) <= 1e-9, (name, node, lag)
                if not mp.settings.tenant_minimums:  # a node served ahead for its minimum leads by what it took
                    assert -float(self.model.lag_bound(name, node)) - 1e-9 <= lag <= 1e-9, (name, node, lag)

    def weighted_shares_are_the_rules_own(self, stats: dict) -> None:
        zero = (0, 0)
        for name in self.model.pools:
            promised = self.model.weighted_shares(name)
            listed = stats[name]["tenants"]
            for key, entry in listed.items():
                share, own_share = promised.get(key or None, zero)
                assert abs(entry["weighted_share"] - float(share)) <= 1e-9, (name, key)
                assert abs(entry["own_weighted_share"] - float(own_share)) <= 1e-9, (name, key)
            for key, entry in stats[name]["tree_nodes"].items():
                assert key not in listed
                assert abs(entry["weighted_share"] - float(promised.get(key, zero)[0])) <= 1e-9, key

    @invariant()
    def dispatched_once_per_attempt(self) -> None:
        # A task is handed out again only after an explicit requeue or a lost
        # worker, each of which the attempts counter records.
        for task_id, n in self.dispatches.items():
            t = self.core.get(task_id)
            if t is not None:
                assert n <= t.attempts

    def teardown(self) -> None:
        # Drive every task to an end: each submitted task ends exactly once.
        for task_id in self._live_ids():
            t = self.core.get(task_id)
            assert t is not None
            if t.state == RUNNING:
                done = self.core.finish(task_id, self.now, worker_id=t.worker, attempt=t.attempts, state=SUCCEEDED)
            else:
                done = self.core.cancel(task_id, self.now)
            assert done is not None
            self._end(done)
        assert len(self.core) == 0
        assert set(self.ended) == self.submitted
        assert self.core.next_wakeup() is None
        assert self.core.dispatch(self.now) == []


CoreVersusModel.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoreVersusModel = pytest.mark.long_running(CoreVersusModel.TestCase)
