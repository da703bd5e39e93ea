"""cronoq: a distributed task scheduler that shares workers fairly between tenants.

Workers serve `Pool`s for a broker (`cronoq-broker`); clients submit to it
with `connect` (or `connect_sync`); `Scheduler` runs the same scheduling in
one process. The reference for all of it, errors and scheduling rules
included, is docs/api.md in the repository; the README starts there.
"""

from cronoq.answers import AttemptEnd, Explanation, TaskInfo
from cronoq.client import Client, SyncClient, connect, connect_sync
from cronoq.embedded import Scheduler
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

__version__ = "0.1.0"

__all__ = [
    "AttemptEnd", "Cancelled", "Client", "Explanation", "SyncClient", "connect_sync", "CronoqError", "DeadlineExceeded", "FailedPrecondition", "InvalidArgument",
    "NotFound", "PermissionDenied", "Pool", "ResourceExhausted", "Scheduler", "TaskFailed", "TaskHandle",
    "TaskInfo", "Unauthenticated", "Unavailable", "Worker", "connect",
]
