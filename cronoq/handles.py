"""TaskHandle, and how a terminal outcome becomes a value or an exception (the same in every mode)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from cronoq.answers import CANCELLED, EXPIRED, FAILED, SUCCEEDED
from cronoq.errors import Cancelled, CronoqError, DeadlineExceeded, TaskFailed
from cronoq.wire.protocol import decode_body

if TYPE_CHECKING:
    from cronoq.answers import Explanation, TaskInfo


class _ResultSource(Protocol):
    async def result(self, task_id: str, timeout: float | None = None) -> Any: ...


class _Scheduler(_ResultSource, Protocol):
    """What a handle asks about its task: the embedded Scheduler or a broker Client."""

    async def status(self, task_id: str) -> "TaskInfo": ...
    async def cancel(self, task_id: str) -> bool: ...
    async def explain(self, task_id: str) -> "Explanation": ...


def outcome_value(task_id: str, state: str, body: bytes | None, error_type: str,
                  error_message: str, traceback: str) -> Any:
    """The handler's value for a succeeded task; raise the matching CronoqError otherwise."""
    if state == SUCCEEDED:
        return None if body is None else decode_body(body)
    if state == FAILED:
        raise TaskFailed(error_message, type=error_type, traceback=traceback)
    if state == EXPIRED:
        raise DeadlineExceeded(f"task {task_id} was not dispatched before its deadline and will never run")
    if state == CANCELLED:
        raise Cancelled(f"task {task_id} was cancelled before it ran")
    raise CronoqError(f"task {task_id} ended in unexpected state {state!r}")


class TaskHandle:
    """A submitted task. `id` is a string that any client may use with `result`, `status`, `cancel`.

    `source` answers `result`: the Scheduler or Client itself, or (for a client's own submit) the
    watch that will receive the outcome, which names its Client as `client`.
    """

    __slots__ = ("id", "_source", "duplicate")

    def __init__(self, task_id: str, source: _ResultSource, *, duplicate: bool = False) -> None:
        self.id = task_id
        self._source = source
        self.duplicate = duplicate
        """True when an earlier task with the same idempotency key was returned instead of a new one."""

    async def result(self, timeout: float | None = None) -> Any:
        """Wait for the task's value; raises TaskFailed, DeadlineExceeded, Cancelled or TimeoutError."""
        return await self._source.result(self.id, timeout=timeout)

    async def status(self) -> "TaskInfo":
        """A snapshot of the task now: state, attempts, timings (as `sched.status(id)`)."""
        return await self._scheduler().status(self.id)

    async def cancel(self) -> bool:
        """Cancel the task if it has not been dispatched; False if it already runs or has finished."""
        return await self._scheduler().cancel(self.id)

    async def explain(self) -> "Explanation":
        """Why the task is where it is (as `sched.explain(id)`)."""
        return await self._scheduler().explain(self.id)

    def _scheduler(self) -> _Scheduler:
        # A client's handle holds its submit's watch rather than the client: the watch keeps the
        # outcome for `result()` however late it is asked for. The watch knows its client.
        return getattr(self._source, "client", self._source)

    def __repr__(self) -> str:
        return f"TaskHandle({self.id!r})"
