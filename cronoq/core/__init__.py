"""The scheduling core of cronoq: a pure state machine, no I/O, no clock.

The broker, the embedded Scheduler, the tests and the benchmarks all drive
this one core; see `cronoq.core.core` for how its structures fit together
and docs/scheduling.md for the rules.
"""

from cronoq.core.core import SchedulerCore
from cronoq.core.explain import CeilingState, ClassRates, NodeState, Waiting
from cronoq.core.settings import PRIORITIES, PRIORITY_CLASS, PoolSettings
from cronoq.core.task import (
    CANCELLED,
    DELAYED,
    EXPIRED,
    FAILED,
    LIVE_STATES,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL_STATES,
    Task,
)

__all__ = [
    "CANCELLED",
    "CeilingState",
    "ClassRates",
    "DELAYED",
    "EXPIRED",
    "FAILED",
    "LIVE_STATES",
    "NodeState",
    "PRIORITIES",
    "PRIORITY_CLASS",
    "QUEUED",
    "RUNNING",
    "SUCCEEDED",
    "TERMINAL_STATES",
    "PoolSettings",
    "SchedulerCore",
    "Task",
    "Waiting",
]
