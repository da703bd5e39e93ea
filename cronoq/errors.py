"""The one error tree of cronoq.

Every refusal a user can meet is a `CronoqError` whose `code` is one of the
strings below (docs/api.md, "Errors", says when each is raised). The same
code crosses the wire, so the broker and the embedded Scheduler raise the
same classes.
"""

from __future__ import annotations

from typing import Any


class CronoqError(Exception):
    """Base of every cronoq refusal; `code` names the kind, the message says what to do."""

    code: str = "UNKNOWN"
    details: dict[str, Any] | None = None
    """What a program can act on, beyond the message (e.g. the member that owns a pool), or None."""

    def __init__(self, message: str = "", *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if details is not None:
            self.details = details

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message,))


class InvalidArgument(CronoqError):
    """A request was malformed: a wrong type, an unknown value, an oversized payload."""

    code = "INVALID_ARGUMENT"


class Unauthenticated(CronoqError):
    """The token was missing or unknown."""

    code = "UNAUTHENTICATED"


class PermissionDenied(CronoqError):
    """The token's role or tenant does not allow this request."""

    code = "PERMISSION_DENIED"


class NotFound(CronoqError):
    """No such pool or task."""

    code = "NOT_FOUND"


class FailedPrecondition(CronoqError):
    """The request conflicts with the broker's state or config (e.g. pool settings disagree)."""

    code = "FAILED_PRECONDITION"


class ResourceExhausted(CronoqError):
    """A limit was reached (backlog, tenant backlog); nothing accepted was lost."""

    code = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(CronoqError):
    """The task was not dispatched before its deadline and will never run."""

    code = "DEADLINE_EXCEEDED"


class Cancelled(CronoqError):
    """The task was cancelled before it ran."""

    code = "CANCELLED"


class Unavailable(CronoqError):
    """The broker could not be reached, or is shutting down; retrying may help."""

    code = "UNAVAILABLE"


class TaskFailed(CronoqError):
    """The handler raised. Carries the remote exception's type, message and traceback."""

    code = "TASK_FAILED"

    def __init__(self, message: str = "", *, type: str = "", traceback: str = "") -> None:
        super().__init__(message)
        self.type = type
        self.remote_message = message
        self.traceback = traceback

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.type else self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_task_failed, (self.message, self.type, self.traceback))


def _rebuild_task_failed(message: str, type: str, traceback: str) -> TaskFailed:
    return TaskFailed(message, type=type, traceback=traceback)


ERROR_CLASSES: dict[str, type[CronoqError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        FailedPrecondition,
        ResourceExhausted,
        DeadlineExceeded,
        Cancelled,
        Unavailable,
        TaskFailed,
    )
}


def error_from_code(code: str, message: str, details: dict[str, Any] | None = None) -> CronoqError:
    """The exception for a code received over the wire (unknown codes become CronoqError)."""
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        err = CronoqError(message)
        err.code = code
    else:
        err = cls(message)
    if isinstance(details, dict):
        err.details = details
    return err
