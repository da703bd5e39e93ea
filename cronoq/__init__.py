"""cronoq: a distributed task scheduler that shares workers fairly between tenants.

Workers serve `Pool`s for a broker (`cronoq-broker`); clients submit to it
with `connect` (or `connect_sync`); `Scheduler` runs the same scheduling in
one process. The reference for all of it, errors and scheduling rules
included, is docs/api.md in the repository; the README starts there.
"""

import importlib as _importlib
import typing as _typing

from cronoq.answers import AttemptEnd, Explanation, TaskInfo
from cronoq.client import Client, SyncClient, connect, connect_sync
from cronoq.errors import (
    Cancelled,
    CronoqError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    TaskFailed,
    Unauthenticated,
    Unavailable,
)
from cronoq.handles import TaskHandle
from cronoq.pool import Pool
from cronoq.worker import Worker

if _typing.TYPE_CHECKING:
    from cronoq.embedded import Scheduler

__version__ = "0.1.0"

# The embedded Scheduler drives the task book and the scheduling core in this process. A program that only
# submits tasks or serves a pool never needs them, so `cronoq.Scheduler` is imported the first time it is named.
_LAZY = {"Scheduler": "cronoq.embedded"}

__all__ = [
    "AttemptEnd", "Cancelled", "Client", "Explanation", "SyncClient", "connect_sync", "CronoqError", "DeadlineExceeded", "FailedPrecondition", "InvalidArgument",
    "NotFound", "PermissionDenied", "Pool", "ResourceExhausted", "Scheduler", "TaskFailed", "TaskHandle",
    "TaskInfo", "Unauthenticated", "Unavailable", "Worker", "connect",
]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
