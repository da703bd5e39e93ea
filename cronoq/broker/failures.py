"""The broker's memory of its most recent failures, for the web dashboard.

A ring of the last RECENT_FAILURES tasks that failed (their handler raised
on the last attempt, or their worker was lost too often), newest first. Each
entry copies what an on-call person reads first, cut to a bound: the ring
never holds more than RECENT_FAILURES * (MAX_ERROR_TYPE_CHARS +
MAX_MESSAGE_CHARS + MAX_TRACEBACK_CHARS) characters of text, however long
the broker runs and whatever its handlers raise (the broker also cuts a
worker's failure text where its `done` enters: cronoq.wire.protocol.bounded).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterator

# Failures kept; older ones drop out as new ones come.
RECENT_FAILURES = 50
# Characters of an error message and of a traceback kept per failure (the task's record keeps them whole).
MAX_ERROR_TYPE_CHARS = 200
MAX_MESSAGE_CHARS = 1000
MAX_TRACEBACK_CHARS = 8000
CUT_MARK = "\n… (cut)"


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed task, as the dashboard lists it."""

    id: str
    pool: str
    tenant: str | None
    error_type: str
    message: str
    traceback: str
    attempts: int
    finished_at: float | None


def cut(text: str, limit: int) -> str:
    """`text`, or its first characters and a mark saying the rest was cut when it is longer than `limit`."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(CUT_MARK))] + CUT_MARK


class RecentFailures:
    """The last `size` failures, newest first."""

    def __init__(self, size: int = RECENT_FAILURES) -> None:
        self._ring: deque[Failure] = deque(maxlen=size)

    @property
    def size(self) -> int:
        """How many failures the ring keeps."""
        return self._ring.maxlen or 0

    def __len__(self) -> int:
        return len(self._ring)

    def __iter__(self) -> Iterator[Failure]:
        return reversed(self._ring)

    def add(self, task_id: str, pool: str, tenant: str | None, error_type: str, message: str, traceback: str,
            attempts: int, finished_at: float | None) -> None:
        """Remember a failure (the oldest one leaves when the ring is full)."""
        self._ring.append(Failure(task_id, pool, tenant, cut(error_type, MAX_ERROR_TYPE_CHARS),
                                  cut(message, MAX_MESSAGE_CHARS), cut(traceback, MAX_TRACEBACK_CHARS), attempts,
                                  finished_at))

    def find(self, task_id: str) -> Failure | None:
        """The remembered failure of a task, or None (never failed, or it has dropped out of the ring)."""
        for failure in self._ring:
            if failure.id == task_id:
                return failure
        return None
