"""Rebuilding the task records from a snapshot and the journal records written after it.

The result is what the task book needs to carry on (`TaskBook.recover`): every
record in its last state, in the order that matters — finished records in
the order they finished (retention forgets the oldest first), live ones in
the order they last entered their queue — and the paused pools.

Finished tasks the results store already holds (numbered up to
`archived_through`) are left out: the store answers for them, and memory
only holds what is live or not stored yet.
"""

from __future__ import annotations

from operator import attrgetter

import msgspec

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


_WHOLE = {TaskRecord, Accepted}
_ID, _SEQ = attrgetter("id"), attrgetter("seq")


class Replay:
    """Applies records in the order they were written; `records` and `paused` are the outcome."""

    def __init__(self, archived_through: int = 0) -> None:
        self.records: dict[str, TaskRecord] = {}
        self.paused: set[str] = set()
        self.archived_through = archived_through
        self.max_seq = 0
        """The highest finish number read (stored or not): numbers after it are free."""
        self.applied = 0
        self.orphans = 0
        """Changes of tasks this replay never saw accepted (only after a damaged file); skipped."""
        self.orphan_ids: set[str] = set()
        """The tasks those changes named, unless later forgotten: lost with the damage."""

    def apply_batch(self, batch: list[Record]) -> None:
        """Apply one frame's records (the common case, whole task records, without a call each)."""
        records = self.records
        archived = self.archived_through
        if set(map(type, batch)) <= _WHOLE:  # a frame of accepted tasks, or of a snapshot's records
            highest = max(map(_SEQ, batch), default=0)
            if not highest or not archived:  # and none for the results store to answer: at C speed
                self.max_seq = max(self.max_seq, highest)
                records.update(zip(map(_ID, batch), batch))  # type: ignore[arg-type]
                self.applied += len(batch)
                return
        for change in batch:
            if isinstance(change, TaskRecord):  # accepted, or a snapshot's record
                self.applied += 1
                seq = change.seq
                if seq:
                    if seq > self.max_seq:
                        self.max_seq = seq
                    if seq <= archived:
                        continue
                records[change.id] = change
            else:
                self.apply(change)

    def apply(self, change: Record) -> None:
        self.applied += 1
        records = self.records
        match change:
            case TaskRecord():
                self.applied -= 1
                self.apply_batch([change])
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
                    record.traceback, record.retries = change.traceback, change.retries
                    records[change.id] = records.pop(change.id)  # it queues again behind the others
            case Finished():
                self._finished(change)
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

    def _finished(self, change: Finished) -> None:
        record = self._get(change.id)
        if record is None:
            return
        seq = change.seq
        if seq > self.max_seq:
            self.max_seq = seq
        if seq and seq <= self.archived_through:
            del self.records[change.id]  # the results store holds it
            return
        record.state = change.state
        record.finished_at = change.finished_at
        record.result = change.result
        record.error_type, record.error_message = change.error_type, change.error_message
        record.traceback = change.traceback
        record.payload = b""
        record.seq = seq
        self.records[change.id] = self.records.pop(change.id)  # finished order: forgotten oldest first

    def _get(self, task_id: str) -> TaskRecord | None:
        record = self.records.get(task_id)
        if record is None:
            self._orphan(task_id)
        return record

    def _orphan(self, task_id: str) -> None:
        self.orphans += 1
        self.orphan_ids.add(task_id)


def kept_to_record(kept: Kept) -> TaskRecord:
    """A format 1 snapshot's record as the book's TaskRecord."""
    return TaskRecord(
        kept.id, kept.pool, kept.tenant, kept.priority, kept.payload, kept.submitted_at, kept.deadline,
        kept.not_before, kept.max_retries, kept.key, kept.submission, kept.state, kept.attempts, kept.started_at,
        kept.finished_at, kept.result, kept.error_type, kept.error_message, kept.traceback,
    )


def snapshot_record(record: TaskRecord) -> TaskRecord:
    """A plain TaskRecord with a record's stored fields only (what reading its `stored_form` back gives)."""
    return TaskRecord(*msgspec.structs.astuple(record)[:_STORED_FIELDS])


_STORED_FIELDS = TaskRecord.__struct_fields__.index("waiters")
