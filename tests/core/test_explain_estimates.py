"""`explain`'s estimate against work that keeps arriving ahead of a task, with a fake clock.

The pool is driven step by step as a worker would drive it (dispatch, finish, grant), and its rates are measured
the way the broker measures them (cronoq.book.rates.DispatchRates, sampled once a second of fake time). A task whose
way is blocked by work that arrives as fast as the pool serves it is told that its start cannot be told, naming
both rates; a task behind work that arrives slower is given a figure that counts the new work too.
"""

from __future__ import annotations

import pytest

from cronoq.book.rates import DispatchRates
from cronoq.core import SUCCEEDED, ClassRates, PoolSettings, SchedulerCore, Task

SERVICE = 46.0  # dispatches per second of fake time: one slot, each task takes 1/46 s


class Pool:
    """One pool `llm` with one worker of one slot, and a fake clock that moves one service time per step."""

    def __init__(self, settings: PoolSettings) -> None:
        self.core = SchedulerCore([settings])
        self.core.add_worker("w", ["llm"], 1)
        self.rates = DispatchRates(self.core)
        self.now = 0.0
        self.rates.sample(self.now)
        self._next_sample = 1.0
        self._n = 0

    def submit(self, **kwargs) -> str:
        self._n += 1
        task_id = kwargs.pop("task_id", f"t{self._n}")
        self.core.submit(Task(task_id, "llm", **kwargs), self.now)
        return task_id

    def step(self) -> None:
        """One service time: the running task ends, the next one starts."""
        self.now += 1 / SERVICE
        for task in self.core.worker_tasks("w"):
            self.core.finish(task.id, self.now, worker_id="w", attempt=task.attempts, state=SUCCEEDED)
            self.core.grant("w")
        self.core.dispatch(self.now)
        if self.now >= self._next_sample:
            self.rates.sample(self.now)
            self._next_sample += 1.0

    def explain(self, task_id: str):
        return self.core.explain(task_id, self.now, *self.rates.for_explain("llm", self.now))


def test_a_low_task_behind_normal_work_arriving_as_fast_as_the_pool_serves_is_told_it_cannot_tell():
    # The case: normal work keeps arriving as fast as the one slot serves it; the low task never starts.
    pool = Pool(PoolSettings("llm", fair_share=True))
    for _ in range(18):
        pool.submit(tenant="acme")
    low = pool.submit(tenant="globex", priority=3)
    for second in range(1, 31):
        for _ in range(int(SERVICE)):
            pool.submit(tenant="acme")  # one more normal task for each one served
            pool.step()
        if second >= 3:
            why = pool.explain(low)
            assert why.estimate is None, (second, why.estimate_note)
            assert why.estimate_note.startswith("cannot tell: higher-class work arrives at ")
            assert f"as fast as the pool serves {why.dispatch_rate:.3g}/s" in why.estimate_note
            assert why.arrival_rate_ahead >= 0.95 * why.dispatch_rate
            if second > 12:  # the first seconds' backlog has left the 10 s window
                assert why.arrival_rate_ahead == pytest.approx(SERVICE, rel=0.05)
    assert pool.core.get(low).state == "queued"  # and indeed it has not started


def test_deadline_tasks_arriving_as_fast_as_the_pool_serves_outrun_a_task_without_a_deadline():
    pool = Pool(PoolSettings("llm", fair_share=True))
    mine = pool.submit(tenant="acme")
    pool.submit(tenant="globex", deadline=1e9)
    for _ in range(5 * int(SERVICE)):
        pool.submit(tenant="globex", deadline=1e9)
        pool.step()
    why = pool.explain(mine)
    assert why.estimate is None and "deadline tasks of its class" in why.estimate_note
    assert pool.core.get(mine).state == "queued"


def test_work_arriving_ahead_slower_than_the_pool_serves_is_counted_in_the_figure():
    # High work arrives at half the pool's rate: the normal class gets the other half.
    pool = Pool(PoolSettings("llm", fair_share=True))
    for _ in range(4):
        pool.submit(tenant="ops", priority=1)
    for i in range(300):
        pool.submit(tenant="acme", task_id=f"a{i}")
    for _ in range(3):
        for i in range(int(SERVICE)):
            if i % 2 == 0:
                pool.submit(tenant="ops", priority=1)
            pool.step()
    why = pool.explain("a299")
    assert why.estimate is not None and "cannot tell" not in why.estimate_note
    rate, arriving = why.dispatch_rate, why.arrival_rate_ahead
    assert arriving == pytest.approx(rate / 2, rel=0.15)
    spare = rate - arriving
    expected = why.higher_classes_ahead / spare + (why.queue_ahead + 1) / spare
    assert why.estimate == pytest.approx(expected)
    naive = (why.higher_classes_ahead + why.queue_ahead + 1) / rate
    assert why.estimate > 1.5 * naive  # what the old figure said, ignoring the high work still to come
    assert "less the" in why.estimate_note and "of new work that goes before it" in why.estimate_note
    # And it is about right: count the steps until a9 starts.
    started = pool.now
    while pool.core.get("a299").state == "queued":
        if round((pool.now - started) * SERVICE) % 2 == 0:
            pool.submit(tenant="ops", priority=1)
        pool.step()
    assert 0.5 * why.estimate <= pool.now - started <= 2 * why.estimate


def test_with_no_arrival_rates_given_the_figure_is_what_it_was():
    core = SchedulerCore([PoolSettings("llm", fair_share=True)])
    for i in range(3):
        core.submit(Task(f"c{i}", "llm", tenant="ops", priority=0), 0.0)
    core.submit(Task("mine", "llm", tenant="acme"), 0.0)
    core.add_worker("w", ["llm"], 0)
    assert core.explain("mine", 0.0, dispatch_rate=2.0).estimate == pytest.approx(3 / 2 + 1 / 2)
    quiet = [ClassRates(0.0), ClassRates(0.0), ClassRates(0.0), ClassRates(0.0)]
    assert core.explain("mine", 0.0, 2.0, quiet).estimate == pytest.approx(3 / 2 + 1 / 2)


def test_a_deadline_task_that_would_start_after_its_deadline_is_told_so():
    core = SchedulerCore([PoolSettings("llm")])
    core.add_worker("w", ["llm"], 0)
    for i in range(20):
        core.submit(Task(f"b{i}", "llm", priority=1), 0.0)
    core.submit(Task("soon", "llm", deadline=5.0), 0.0)
    why = core.explain("soon", 0.0, dispatch_rate=2.0)
    assert why.estimate == pytest.approx(21 / 2)
    assert "after its deadline" in why.estimate_note
