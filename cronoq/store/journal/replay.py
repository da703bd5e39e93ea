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

from itertools import compress, count
from operator import attrgetter, eq, not_, or_

import msgspec

from cronoq.book.records import TaskRecord, attempt_ended
from cronoq.core import QUEUED, RUNNING
from cronoq.core.shards import ShardedMap
from cronoq.store.journal.records import (
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


_WHOLE, _ACCEPTED = {TaskRecord, Accepted}, {Accepted}

COMPACT_ORDER_AT = 4096
"""Stale places in the order past which, once they are half of it, the replay drops them there and then: records
that went (most of a long run's, stored in the results store) are freed as they would be from a dict, and their
memory serves the records read next."""
_ID, _SEQ, _MARK = attrgetter("id"), attrgetter("seq"), attrgetter("_seq")


class Replay:
    """Applies records in the order they were written; `ordered()`, `by_id` and `paused` are the outcome.

    The records go straight into `by_id`, a ShardedMap the task book takes
    over as its own map of records (`TaskBook.recover`): a restart with a
    million queued tasks builds that map once, not a dict and then a copy
    of it. Their order — the order of a dict in which a record moved to the
    end when it queued again or finished — is kept in a list beside it:
    each record is appended when it comes, and again when it moves. The
    earlier places of a record that moved, and the places of one that went,
    are stale; `ordered()` leaves them out. Until then, a moved record's
    `_seq` (the core's arrival number, unused until the core takes the
    record) holds its current place in that list (from 1), and a record
    that went holds -1; `ordered()` sets the moved ones' back to 0.
    """

    def __init__(self, archived_through: int = 0) -> None:
        self.by_id: ShardedMap[str, TaskRecord] = ShardedMap()
        """Every record in its last state, by task id (in no order)."""
        self.paused: set[str] = set()
        self.archived_through = archived_through
        self.max_seq = 0
        """The highest finish number read (stored or not): numbers after it are free."""
        self.applied = 0
        self.orphans = 0
        """Changes of tasks this replay never saw accepted (only after a damaged file); skipped."""
        self.orphan_ids: set[str] = set()
        """The tasks those changes named, unless later forgotten: lost with the damage."""
        self._order: list[TaskRecord] = []
        self._entered = 0
        """Records entered into `by_id` less those taken out of it: `len(by_id)` unless an id came twice."""
        self._moved: list[TaskRecord] = []
        """Records whose `_seq` holds their place (they moved), to clear in `ordered()`."""
        self._stale = 0
        """Places gone stale (a record moved, or went): `ordered()` must filter the order when there are any."""

    # A journal of a busy broker is mostly frames of mixed changes, applied one by one: the lookups in `by_id`
    # choose its shard inline (cronoq/core/shards.py), as the book's hot paths do.

    def apply_batch(self, batch: list[Record]) -> None:
        """Apply one frame's records (the common case, whole task records, without a call each)."""
        archived = self.archived_through
        kinds = set(map(type, batch))
        if kinds <= _WHOLE:  # a frame of accepted tasks, or of a snapshot's records
            # An accepted record is written without a finish number (AcceptedEntry): only a snapshot's have one.
            highest = 0 if kinds == _ACCEPTED else max(map(_SEQ, batch), default=0)
            if not highest or not archived:  # and none for the results store to answer: in bulk
                self.max_seq = max(self.max_seq, highest)
                self.by_id.put_all(list(map(_ID, batch)), batch)  # type: ignore[arg-type]
                self._order += batch  # type: ignore[arg-type]
                self._entered += len(batch)
                self.applied += len(batch)
                return
        by_id = self.by_id
        for change in batch:
            if isinstance(change, TaskRecord):  # accepted, or a snapshot's record
                self.applied += 1
                seq = change.seq
                if seq:
                    if seq > self.max_seq:
                        self.max_seq = seq
                    if seq <= archived:
                        continue
                task_id = change.id
                shard = by_id.whole or by_id.shards[hash(task_id) % by_id.count]
                if task_id in shard:
                    self._put(change)
                    continue
                shard[task_id] = change
                if len(shard) > by_id.split_at:
                    by_id.split()
                self._order.append(change)
                self._entered += 1
            else:
                self.apply(change)

    def apply(self, change: Record) -> None:
        self.applied += 1
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
            case Finished():
                self._finished(change)
            case Requeued():
                record = self._get(change.id)
                if record is not None:
                    record.state = QUEUED
                    record.not_before = change.not_before
                    record.error_type, record.error_message = change.error_type, change.error_message
                    record.traceback, record.retries = change.traceback, change.retries
                    if change.ended:  # (files written before attempts' ends were kept have none)
                        attempt_ended(record, change.ended, change.ended_at)
                    self._move(record)  # it queues again behind the others
            case Forgotten():
                by_id = self.by_id
                record = (by_id.whole or by_id.shards[hash(change.id) % by_id.count]).pop(change.id, None)
                if record is None:
                    self.orphans += 1
                    self.orphan_ids.discard(change.id)  # lost, but it would be gone by now anyway
                else:
                    self._gone(record)
            case Paused():
                if change.paused:
                    self.paused.add(change.pool)
                else:
                    self.paused.discard(change.pool)
            case Kept():
                self._put(kept_to_record(change))
            case Header() | End():
                self.applied -= 1  # framing, not a change

    def _finished(self, change: Finished) -> None:
        task_id = change.id
        by_id = self.by_id
        shard = by_id.whole or by_id.shards[hash(task_id) % by_id.count]
        record = shard.get(task_id)
        if record is None:
            self._orphan(task_id)
            return
        seq = change.seq
        if seq > self.max_seq:
            self.max_seq = seq
        if seq and seq <= self.archived_through:
            del shard[task_id]  # the results store holds it
            record._seq = -1  # _gone(record), inline: a replay after a long run does this for most tasks
            self._entered -= 1
            self._stale += 1
            if self._stale > COMPACT_ORDER_AT and 2 * self._stale > len(self._order):
                self.ordered()
            return
        record.state = change.state
        record.finished_at = change.finished_at
        record.result = change.result
        record.error_type, record.error_message = change.error_type, change.error_message
        record.traceback = change.traceback
        record.payload = b""
        record.seq = seq
        self._move(record)  # finished order: forgotten oldest first

    def _put(self, record: TaskRecord) -> None:
        """Enter one record; one it replaces (the same id again: only after damage) gives up its place."""
        former = self.by_id.get(record.id)
        self.by_id[record.id] = record
        self._order.append(record)
        if former is None:
            self._entered += 1
        elif former is not record:
            self._gone(former)
            self._entered += 1

    def _move(self, record: TaskRecord) -> None:
        """A record moves to the end of the order: its earlier place goes stale."""
        order = self._order
        order.append(record)
        if not record._seq:
            self._moved.append(record)
        record._seq = len(order)
        self._stale += 1
        if self._stale > COMPACT_ORDER_AT and 2 * self._stale > len(order):
            self.ordered()

    def _gone(self, record: TaskRecord) -> None:
        """A record left `by_id`: each of its places goes stale."""
        record._seq = -1
        self._entered -= 1
        self._stale += 1
        if self._stale > COMPACT_ORDER_AT and 2 * self._stale > len(self._order):
            self.ordered()

    def ordered(self) -> list[TaskRecord]:
        """Every record in `by_id`, in the order that matters (the module's): finished ones in the order they
        finished, live ones in the order they last entered their queue. The list is the replay's own: the
        caller may keep it, not change it. (The replay calls it too, to drop stale places as it goes.)"""
        order = self._order
        if len(self.by_id) != self._entered:  # an id came twice in one frame (damage): the later record stays
            by_id = self.by_id
            seen: set[str] = set()
            kept = []
            for record in reversed(order):
                if record._seq != -1 and record.id not in seen and by_id.get(record.id) is record:
                    seen.add(record.id)
                    kept.append(record)
            kept.reverse()
        elif self._stale:
            # A place counts where the record's mark is 0 (it never moved) or that place (1, 2, ...): at C speed.
            marks = list(map(_MARK, order))
            kept = list(compress(order, map(or_, map(not_, marks), map(eq, marks, count(1)))))
        else:
            return order
        for record in self._moved:  # (those that went are dropped: their marks do not matter)
            record._seq = 0
        self._order, self._moved, self._entered, self._stale = kept, [], len(kept), 0
        return kept

    @property
    def records(self) -> dict[str, TaskRecord]:
        """The records by id in `ordered()`'s order, as a dict (for repairs and tests: a restart takes
        `ordered()` and `by_id` as they are). Built on each call."""
        return {record.id: record for record in self.ordered()}

    def _get(self, task_id: str) -> TaskRecord | None:
        by_id = self.by_id
        record = (by_id.whole or by_id.shards[hash(task_id) % by_id.count]).get(task_id)
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
