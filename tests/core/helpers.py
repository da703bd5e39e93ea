"""Helpers for the pure core tests: a core with pools, and short ways to feed and drain it."""

from __future__ import annotations

from typing import Hashable, Iterable

from cronoq.core import PoolSettings, SchedulerCore, Task


def make_core(*pools: PoolSettings) -> SchedulerCore:
    return SchedulerCore(pools or [PoolSettings("p")])


def submit_many(core: SchedulerCore, now: float, pool: str, specs: Iterable[tuple[str, dict]]) -> list[Task]:
    """Submit tasks given as (id, Task keyword arguments)."""
    tasks = []
    for task_id, kwargs in specs:
        task = Task(task_id, pool, **kwargs)
        core.submit(task, now)
        tasks.append(task)
    return tasks


def drain(core: SchedulerCore, now: float, worker: Hashable = "w", pools: Iterable[str] = ("p",)) -> list[Task]:
    """Dispatch everything dispatchable, one task at a time, to one worker with one slot.

    Each task is finished right away and the slot granted back, so the order
    returned is the dispatch order.
    """
    pools = list(pools)
    core.add_worker(worker, pools, 1)
    order = []
    while True:
        got = core.dispatch(now)
        if not got:
            return order
        ((worker_id, task),) = got
        order.append(task)
        core.finish(task.id, now, worker_id=worker_id, attempt=task.attempts, state="succeeded")
        core.grant(worker_id)


def ids(tasks: Iterable[Task]) -> list[str]:
    return [t.id for t in tasks]


def tenants(tasks: Iterable[Task]) -> str:
    """Dispatch order as a string of tenant initials ('-' for untenanted)."""
    return "".join(t.tenant[0] if t.tenant else "-" for t in tasks)
