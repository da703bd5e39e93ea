"""Rebuilding the task records from a snapshot and the journal records written after it.

The result is what the task book needs to carry on (`TaskBook.recover`): every
kept record in its last state, in the order that matters — finished records
in the order they finished (result_ttl forgets the oldest first), live ones
in the order they last entered their queue — and the paused pools.
"""

from __future__ import annotations

from cronoq.book import TaskRecord
from cronoq.core import QUEUED, RUNNING
from cronoq.store.records import (
    Accepted,
    Dispatched,
    End,
    Finished,
    Forgotten,
    Header,
    Kept,
    Paused,
    Record,
    Requeued,
)


class Replay:
    """Applies records in the order they were written; `records` and `paused` are the outcome."""

    def __init__(self) -> None:
        self.records: dict[str, TaskRecord] = {}
        self.paused: set[str] = set()
        self.applied = 0
        self.orphans = 0
        """Changes of tasks this replay never saw accepted (only after a damaged file); skipped."""
        self.orphan_ids: set[str] = set()
        """The tasks those changes named, unless later forgotten: lost with the damage."""

    def apply(self, change: Record) -> None:
        self.applied += 1
        records = self.records
        match change:
            case Accepted():
                record = TaskRecord(
                    change.id, change.pool, change.tenant, change.priority, change.payload,
                    key=change.key, max_retries=change.max_retries, deadline=change.deadline,
                    submitted_at=change.submitted_at, submission=change.submission, not_before=change.not_before,
                )
                records[record.id] = record
            case Dispatched():
                record = self._get(change.id)
                if record is not None:
                    record.state = RUNNING
                    record.attempts = change.attempt
                    record.started_at = change.started_at
            case Requeued():
                record = self._get(change.id)
                if record is not None:
                    record.state = QUEUED
                    record.not_before = change.not_before
                    record.error_type, record.error_message = change.error_type, change.error_message
                    record.traceback = change.traceback
                    records[change.id] = records.pop(change.id)  # it queues again behind the others
            case Finished():
                record = self._get(change.id)
                if record is not None:
                    record.state = change.state
                    record.finished_at = change.finished_at
                    record.result = change.result
                    record.error_type, record.error_message = change.error_type, change.error_message
                    record.traceback = change.traceback
                    record.payload = b""
                    records[change.id] = records.pop(change.id)  # finished order: forgotten oldest first
            case Forgotten():
                if records.pop(change.id, None) is None:
                    self.orphans += 1
                    self.orphan_ids.discard(change.id)  # lost, but it would be gone by now anyway
            case Paused():
                if change.paused:
                    self.paused.add(change.pool)
                else:
                    self.paused.discard(change.pool)
            case Kept():
                records[change.id] = kept_to_record(change)
            case Header() | End():
                self.applied -= 1  # framing, not a change

    def _get(self, task_id: str) -> TaskRecord | None:
        record = self.records.get(task_id)
        if record is None:
            self._orphan(task_id)
        return record

    def _orphan(self, task_id: str) -> None:
        self.orphans += 1
        self.orphan_ids.add(task_id)


def kept_to_record(kept: Kept) -> TaskRecord:
    """A snapshot's record as the book's TaskRecord."""
    record = TaskRecord(
        kept.id, kept.pool, kept.tenant, kept.priority, kept.payload, key=kept.key,
        max_retries=kept.max_retries, deadline=kept.deadline, submitted_at=kept.submitted_at,
        submission=kept.submission, not_before=kept.not_before,
    )
    record.state = kept.state
    record.attempts = kept.attempts
    record.started_at = kept.started_at
    record.finished_at = kept.finished_at
    record.result = kept.result
    record.error_type, record.error_message, record.traceback = kept.error_type, kept.error_message, kept.traceback
    return record


def record_to_kept(record: TaskRecord) -> Kept:
    """A TaskRecord as a snapshot keeps it."""
    return Kept(
        record.id, record.pool, record.tenant, record.priority, record.state, record.submitted_at,
        payload=record.payload, deadline=record.deadline, not_before=record.not_before,
        max_retries=record.max_retries, key=record.key, submission=record.submission, attempts=record.attempts,
        started_at=record.started_at, finished_at=record.finished_at, result=record.result,
        error_type=record.error_type, error_message=record.error_message, traceback=record.traceback,
    )
