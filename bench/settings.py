"""The knobs of one bench run, full and `--quick`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BenchSettings:
    """Sizes of every section; `quick()` shrinks them to a smoke run."""

    repeat: int = 3                  # runs per row; the table shows medians
    tasks: int = 50_000              # tasks per saturation run (relay and cronoq)
    window: int = 1_000              # tasks in flight from the one client
    workers: int = 2                 # worker processes per system
    concurrency: int = 64            # cronoq --concurrency per worker = the relay's credit per worker
    light_tasks: int = 2_000         # one-in-flight latency runs
    peer_tasks: int = 5_000          # saturation runs of Celery and arq (they move ~1k tasks/s)
    peer_light_tasks: int = 500
    memory_tasks: int = 200_000      # tasks queued (pool paused) to measure broker RSS per task
    recovery_tasks: int = 1_000_000  # tasks queued before the restart of the recovery row
    fair_unit: int = 1_000           # the fairness run queues 3, 1 and 1 times this many tasks
    scale_backlogs: list[int] = field(default_factory=lambda: [10**3, 10**4, 10**5, 10**6])
    scale_tenants: int = 1_000       # tenants the backlog is spread over in the backlog rows
    scale_many_tenants: int = 100_000
    scale_ops: int = 50_000          # submit+dispatch+finish cycles timed at each backlog
    quick: bool = False

    @classmethod
    def quick_settings(cls) -> "BenchSettings":
        return cls(repeat=1, tasks=500, window=100, light_tasks=100, peer_tasks=200, peer_light_tasks=50,
                   memory_tasks=5_000, recovery_tasks=2_000, fair_unit=100, scale_backlogs=[10**3, 10**4],
                   scale_tenants=100, scale_many_tenants=1_000, scale_ops=5_000, quick=True)
