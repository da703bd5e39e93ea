"""TaskHandle, and how a terminal outcome becomes a value or an exception (the same in every mode)."""

from __future__ import annotations

from typing import Any, Protocol

from cronoq.core import CANCELLED, EXPIRED, FAILED, SUCCEEDED
from cronoq.errors import Cancelled, CronoqError, DeadlineExceeded, TaskFailed
from cronoq.protocol import decode_body


class _ResultSource(Protocol):
    async def result(self, task_id: str, timeout: float | None = None) -> Any: ...


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
    """A submitted task. `id` is a string that any client may use with `result`, `status`, `cancel`."""

    __slots__ = ("id", "_source", "duplicate")

    def __init__(self, task_id: str, source: _ResultSource, *, duplicate: bool = False) -> None:
        self.id = task_id
        self._source = source
        self.duplicate = duplicate
        """True when an earlier task with the same idempotency key was returned instead of a new one."""

    async def result(self, timeout: float | None = None) -> Any:
        """Wait for the task's value; raises TaskFailed, DeadlineExceeded, Cancelled or TimeoutError."""
        return await self._source.result(self.id, timeout=timeout)

    def __repr__(self) -> str:
        return f"TaskHandle({self.id!r})"
