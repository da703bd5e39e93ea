"""A task as the scheduling core sees it, and the states it moves through.

States are plain strings so they cross the wire and the disk unchanged. The
core is the only writer of `Task.state` once a task is submitted; it always
assigns the module constants below, which lets the hot paths compare states
by identity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Hashable

if TYPE_CHECKING:
    from cronoq.core.pool import TenantStats

from cronoq.answers import CANCELLED, DELAYED, EXPIRED, FAILED, QUEUED, RUNNING, SUCCEEDED  # noqa: F401 (the core's names)

LIVE_STATES: frozenset[str] = frozenset({QUEUED, DELAYED, RUNNING})
"""States of a task the core still holds."""

TERMINAL_STATES: frozenset[str] = frozenset({SUCCEEDED, FAILED, CANCELLED, EXPIRED})
"""States a task never leaves; the core forgets a task when it reaches one."""


class Task:
    """One unit of work: where it runs, for whom, how urgent, and where it stands.

    `priority` is the class number (0 critical .. 3 low, see PRIORITIES).
    `deadline` and `not_before` are absolute times on the caller's clock (the
    same clock as the `now` given to the core), or None. `payload` is opaque
    to the core. `state`, `attempts` and `worker` are maintained by the core:
    `attempts` counts dispatches, `worker` names the worker holding the task
    while it runs. `cost` (None: 1) is what the task charges its tenant's
    share in a pool with share_by="cost", and its run time's first estimate,
    in seconds, in one with share_by="runtime".

    A Task object enters a core once: after it ends, run it again by
    submitting a new Task (the core may still hold stale references to the
    old object in its lazily cleaned queues).
    """

    # Slots, not a dict: a queued task must cost at most a few hundred bytes.
    __slots__ = (
        "id",
        "pool",
        "tenant",
        "priority",
        "deadline",
        "not_before",
        "payload",
        "state",
        "attempts",
        "worker",
        "cost",
        # Private bookkeeping of the core:
        "_seq",  # arrival number of the current stay in the core's queues; 0 = never submitted
        "_ts",  # the TenantStats record this task is counted in
        "_next",  # the next task in its queue's chain (see fairqueue.Chain)
    )

    id: str
    pool: str
    tenant: str | None
    priority: int
    deadline: float | None
    not_before: float | None
    payload: object
    state: str
    attempts: int
    worker: Hashable | None
    cost: float | None
    _seq: int
    _ts: TenantStats | None
    _next: Task | None

    def __init__(
        self,
        id: str,
        pool: str,
        *,
        tenant: str | None = None,
        priority: int = 2,
        deadline: float | None = None,
        not_before: float | None = None,
        payload: object = None,
        cost: float | None = None,
    ) -> None:
        self.id = id
        self.pool = pool
        self.tenant = tenant
        self.priority = priority
        self.deadline = deadline
        self.not_before = not_before
        self.payload = payload
        self.state = QUEUED
        self.attempts = 0
        self.worker = None
        self.cost = cost
        self._seq = 0
        self._ts = None
        self._next = None

    def __repr__(self) -> str:
        return (
            f"Task(id={self.id!r}, pool={self.pool!r}, tenant={self.tenant!r}, "
            f"priority={self.priority}, state={self.state!r}, attempts={self.attempts})"
        )
