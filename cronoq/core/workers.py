"""What the core knows of a worker: the pools it serves, its free slots, its leases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Hashable

if TYPE_CHECKING:
    from cronoq.core.pool import PoolState
    from cronoq.core.task import Task


class WorkerState:
    """A worker as the dispatcher sees it (the process is a `cronoq.Worker`; the core keeps only this).

    `free` is the credit the worker has granted (its free slots); the worker
    is the source of truth and the shell relays its grants. `running` maps
    task id to the task for every lease it holds, in dispatch order.
    """

    __slots__ = ("id", "pools", "free", "running", "rr")

    def __init__(self, worker_id: Hashable) -> None:
        self.id = worker_id
        self.pools: list[PoolState] = []
        self.free = 0
        self.running: dict[str, Task] = {}
        self.rr = 0  # where the next round-robin turn between its pools starts
