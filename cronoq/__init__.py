"""cronoq: a distributed task scheduler that shares workers fairly between tenants.

Workers serve `Pool`s for a broker (`cronoq-broker`); clients submit to it
with `connect` (or `connect_sync`); `Scheduler` runs the same scheduling in
one process. The reference for all of it, errors and scheduling rules
included, is docs/api.md in the repository; the README starts there.
"""

import importlib as _importlib
import typing as _typing

from cronoq.answers import AttemptEnd, Explanation, TaskInfo
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

if _typing.TYPE_CHECKING:
    from cronoq.client import Client, SyncClient, connect, connect_sync
    from cronoq.embedded import Scheduler
    from cronoq.handles import TaskHandle
    from cronoq.pool import Pool
    from cronoq.worker import Worker

__version__ = "0.1.0"

# Each process loads only what it uses: a broker or a worker imports `cronoq.<its part>`, which runs this file
# first, and need not pay for the client's modules (nor a client for the worker's, nor either for the embedded
# Scheduler's task book and scheduling core). So the public names below are imported the first time they are
# named (`cronoq.connect`, `from cronoq import Worker`); the errors and answer types are small leaves, loaded now.
_LAZY = {
    "Client": "cronoq.client", "SyncClient": "cronoq.client", "connect": "cronoq.client",
    "connect_sync": "cronoq.client", "Worker": "cronoq.worker", "Pool": "cronoq.pool",
    "TaskHandle": "cronoq.handles", "Scheduler": "cronoq.embedded",
}

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
