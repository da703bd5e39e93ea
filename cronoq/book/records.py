"""A task's record: what the task book keeps of one task, and the form the store keeps it in.

The journal, the snapshot and the results store (cronoq.store) read and write
`TaskRecord`s; the task book (cronoq.book.taskbook) holds them; while a task is
live its record is also the scheduling core's task.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from cronoq.answers import KEPT_ATTEMPT_ENDS
from cronoq.core import QUEUED

ATTEMPT_ERROR_CHARS = 200
"""Characters of an ended attempt's error ("Type: message") its record keeps; a longer one is clipped."""


class PastAttempt(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One attempt that ended without ending its task, as the task's record keeps it (and stores it: snapshots
    and the results store hold it, the journal's `requeued` record says how to rebuild it)."""

    attempt: int
    ended: str
    """`retried` (the handler raised and the task was queued again) or `worker_lost` (its worker was lost, or
    the broker stopped, while it ran)."""
    at: float
    error: Union[str, None] = None
    """What the handler raised, `"Type: message"` clipped to ATTEMPT_ERROR_CHARS; None for a lost worker."""


class TaskRecord(msgspec.Struct, array_like=True, tag="t", gc=False):
    """What the book knows of one task; while it is live, also the scheduling core's task.

    The core schedules any object with the attributes of `cronoq.core.Task`:
    a record has them (`worker`, `_seq`, `_ts` and `_next` are the core's own), so a
    queued task costs one object, not two. A msgspec struct, so that the
    journal and the snapshot read records straight back into this type
    (cronoq.store.journal.records): the fields up to `submission` are what a submit
    gives (the journal's `accepted` record), those before `waiters` are what
    is stored (`stored_form`). `gc=False`: records hold no cycles (the core's
    `_next` links only run forward), and millions of them must not slow
    every collection.
    """

    id: str
    pool: str
    tenant: Union[str, None]
    priority: int
    payload: bytes = b""
    submitted_at: float = 0.0
    deadline: Union[float, None] = None
    not_before: Union[float, None] = None  # when it may run next (delay, retry backoff); kept for recovery
    max_retries: int = 0
    key: Union[str, None] = None
    submission: Union[str, None] = None
    state: str = QUEUED
    attempts: int = 0
    started_at: Union[float, None] = None
    finished_at: Union[float, None] = None
    result: Union[bytes, None] = None
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    seq: int = 0
    """The task's place in the order tasks finished (from 1; 0 while it is live): retention forgets the oldest
    first, and the results store says up to which one it holds them."""
    retries: int = 0
    """How many times it went back to its queue because its handler raised: `max_retries` bounds these.
    Attempts lost with their worker or with the broker (a dispatch that never reached a worker) count in
    `attempts` only, and `max_deliveries` bounds those."""
    attempt_ends: Union[tuple[PastAttempt, ...], None] = None
    """How its last attempts that did not end it ended (`attempt_ended`), first first; None (no cost but the
    slot) until one does."""
    cost: Union[float, None] = None
    """What the submitter declared the task costs (`submit(cost=...)`; None: 1): its charge in a pool that shares
    by cost, its first run-time estimate in seconds in one that shares by run time. Last of the stored fields, so
    records stored before it existed read back as None."""
    waiters: Any = None
    """The shell's own: who waits for this task's outcome (the broker keeps its routing there, next to
    the task, rather than in a map of its own: a watched queued task costs ~160 bytes less). Never stored."""
    worker: Any = None
    _seq: int = 0
    _ts: Any = None
    _next: Any = None


_STORED_FIELDS = TaskRecord.__struct_fields__.index("waiters")
_STORED_TAG = ("t",)
_astuple = msgspec.structs.astuple


def stored_form(record: TaskRecord) -> tuple:
    """A record as snapshots and the results store keep it: encoded, the same as a TaskRecord whose fields
    from `waiters` on (the shell's and the core's, which may hold anything) are missing, and read back as such."""
    return _STORED_TAG + _astuple(record)[:_STORED_FIELDS]  # one concatenation: every finished task is shipped


def attempt_ended(record: TaskRecord, ended: str, at: float) -> PastAttempt:
    """Note on `record` that its current attempt ended without ending it (`ended`: retried, worker_lost) at `at`,
    keeping the last KEPT_ATTEMPT_ENDS such ends; returns the one noted. A retried attempt's error is the
    record's (set before this is called). The task book calls it as it happens, a replay of the journal as it
    reads the `requeued` record: both build the same entry."""
    error = None
    if ended == "retried":
        error = f"{record.error_type}: {record.error_message}"
        if len(error) > ATTEMPT_ERROR_CHARS:
            error = error[:ATTEMPT_ERROR_CHARS - 1] + "…"
    end = PastAttempt(record.attempts, ended, at, error)
    earlier = record.attempt_ends
    record.attempt_ends = (end,) if earlier is None else (*earlier[1 - KEPT_ATTEMPT_ENDS:], end)
    return end
