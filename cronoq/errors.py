"""The one error tree of cronoq: everything a program or a command line can meet derives from `CronoqError`.

    CronoqError
      refusals of a request; the code crosses the wire, so the broker and the embedded Scheduler raise
      the same classes:
        InvalidArgument, Unauthenticated, PermissionDenied, NotFound, FailedPrecondition,
        ResourceExhausted, DeadlineExceeded, Cancelled, Unavailable, TaskFailed
      a process that cannot start as asked; raised before it serves or sends anything, never on the wire:
        ConfigError     the broker's config file         (ScheduleError: one of its schedules; a ValueError too)
        StoreError      the broker's data directory      (DamagedFile: a file of it is damaged)
        UsageError      the command line of `cronoq` or `cronoq-worker`

docs/api.md, "Errors", says when each is raised. Two exceptions the broker raises and handles inside itself
are OSErrors, as the failures they stand for are, and never reach a program or a command line:
cronoq.broker.held.HoldError (a standby cannot hold an address yet) and cronoq.store.journal.fence.Fenced
(another broker has taken the data directory over). tests/test_layout.py holds the tree to this.
"""

from __future__ import annotations

from pathlib import Path
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


# ------------------------------------------------------------- a process that cannot start as asked


class ConfigError(CronoqError):
    """The broker's config file, or a command-line value that overrides it, is unreadable or invalid; the
    message names the file, the key, what is wrong and what would be valid."""

    code = "INVALID_CONFIG"


class ScheduleError(ConfigError, ValueError):
    """A schedule's cron expression, time zone or priority is not valid (also a ValueError, as it always was)."""


class StoreError(CronoqError):
    """The data directory cannot be used (locked, unreadable, damaged, of an unknown format); the message says why."""

    code = "STORE_UNUSABLE"


class DamagedFile(StoreError):
    """A file of data_dir is damaged (more than a torn tail); `cronoq-broker --repair` recovers its intact frames."""

    def __init__(self, path: Path, offset: int, what: str) -> None:
        super().__init__(f"{path} is damaged at offset {offset}: {what}")
        self.path, self.offset, self.what = path, offset, what
        self.repair_command = "cronoq-broker --repair"
        """How to repair it: the broker's command line fills in its config file."""

    def __str__(self) -> str:
        return (f"{self.path} is damaged at offset {self.offset}: {self.what}; refusing to start, nothing was "
                f"changed. To recover every intact frame (a copy of the original is kept), run: {self.repair_command}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.offset, self.what))


class UsageError(CronoqError):
    """A mistake on a command line (`cronoq`, `cronoq-worker`) found after parsing: reported in one line, exit
    status 2."""

    code = "USAGE"


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
