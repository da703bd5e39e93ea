"""A fake-clock run of the core with workers whose tasks take given times: for the rules about worker time.

Workers run each task for the time `duration(task)` says; the clock jumps from one event (a task ending, a
bucket refilling, a deadline) to the next. Everything goes through the real SchedulerCore: expire(now), then
dispatch(now), then finish(now) when a run ends, exactly as the broker drives it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Callable

from cronoq.core import SUCCEEDED, SchedulerCore, Task


@dataclass
class Run:
    """What happened: per tenant, the worker time its runs took and the dispatches it got (with their times)."""

    worker_time: dict[str | None, float] = field(default_factory=dict)
    starts: list[tuple[float, Task]] = field(default_factory=list)

    def share_of_time(self, tenant: str) -> float:
        total = sum(self.worker_time.values())
        return self.worker_time.get(tenant, 0.0) / total if total else 0.0


class Simulation:
    """Workers of `slots` slots each serving `pool`, running tasks for `duration(task)` seconds."""

    def __init__(self, core: SchedulerCore, pool: str, workers: int, duration: Callable[[Task], float],
                 slots: int = 1) -> None:
        self.core = core
        self.pool = pool
        self.duration = duration
        self.now = 0.0
        self.ends: list[tuple[float, int, str, Task]] = []
        self.serial = 0
        self.run = Run()
        for number in range(workers):
            core.add_worker(f"w{number}", [pool], slots)
        # Tasks running, with when each started: what a test watching worker time mid-run needs.
        self.running: dict[str, float] = {}

    def step(self, until: float, after_dispatch: Callable[[Simulation], None] | None = None) -> bool:
        """Dispatch what can go now, then move the clock to the next event (not past `until`), ending the runs
        due then. False once nothing is left to happen before `until`."""
        core = self.core
        core.expire(self.now)
        for worker, task in core.dispatch(self.now):
            self.run.starts.append((self.now, task))
            self.running[task.id] = self.now
            self.serial += 1
            heappush(self.ends, (self.now + self.duration(task), self.serial, worker, task))
        if after_dispatch is not None:
            after_dispatch(self)
        wake = core.next_wakeup()
        next_end = self.ends[0][0] if self.ends else None
        times = [t for t in (wake, next_end) if t is not None and t > self.now]
        if not times or min(times) > until:
            return False
        self.now = min(times)
        while self.ends and self.ends[0][0] <= self.now:
            _end, _serial, worker, task = heappop(self.ends)
            started = self.running.pop(task.id)
            tenant = task.tenant
            self.run.worker_time[tenant] = self.run.worker_time.get(tenant, 0.0) + (self.now - started)
            core.finish(task.id, self.now, worker_id=worker, attempt=task.attempts, state=SUCCEEDED)
            core.grant(worker)
        return True

    def run_until(self, until: float, after_dispatch: Callable[[Simulation], None] | None = None) -> Run:
        """Run to `until`, calling `after_dispatch` each time the core has dispatched what it could."""
        while self.step(until, after_dispatch):
            pass
        return self.run

    def time_so_far(self, tenant: str | None) -> float:
        """Worker time `tenant` has had: its ended runs, and its running ones up to now."""
        ended = self.run.worker_time.get(tenant, 0.0)
        running = sum(self.now - started for task_id, started in self.running.items()
                      if self.core.get(task_id) is not None and self.core.get(task_id).tenant == tenant)
        return ended + running
