"""Retention: how long finished tasks stay answerable, and where they are kept meanwhile.

A finished task's record answers `status`, `result` and duplicate submits
(idempotency key, submission id) until it is `result_ttl` seconds old or the
retained results pass `result_retention_bytes`, whichever comes first; the
oldest go first. Where it waits depends on the shell:

- without a data_dir (embedded Scheduler, `durability = "none"`) the task
  book keeps finished records in memory, and `FinishedRecords.expired` says
  which to drop, counting `memory_bytes` against the budget;
- with a data_dir the broker moves them to the results store
  (cronoq.store.results.shipping) as soon as they are durable there: the book keeps
  a finished record only until the store has it (`FinishedRecords.release`),
  and the store applies the same two limits to its rows.

Either way finished records leave in the order they finished, which their
`seq` numbers (1, 2, ...) record.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Iterable, Iterator, Protocol

if TYPE_CHECKING:
    from cronoq.book.records import TaskRecord

DEFAULT_RESULT_TTL = 86400.0
DEFAULT_RETENTION_BYTES = 128 << 20
"""Big enough for about a million small results, small enough for a small disk beside the journal."""

MAX_UNARCHIVED = 50_000
"""Finished records waiting in memory for the results store: past this many the broker dispatches only a trickle
(cronoq.book.taskbook.GATED_DISPATCHES a pass) until the archiver catches up, and past twice this many nothing, so that a
slow (or restarting) archiver costs throughput, never unbounded memory."""

RECORD_MEMORY = 524
"""Bytes a finished record costs in memory besides its result and error texts (the record, its id, its
entries in the book's maps): `python -m bench.retention memory` (tracemalloc over 100,000 records) gave 524 B in
each of three runs at 5b6ad28 on 2026-12-01, 516 B for the code before a record kept its attempts' ends."""


ATTEMPT_END_MEMORY = 120
"""Bytes one kept end of an attempt (cronoq.book.records.PastAttempt) costs besides its error's characters: the struct,
its place in the record's tuple, its time and its error string's own header (about 155 bytes with a 13-character
error, by tracemalloc)."""


def memory_bytes(record: TaskRecord) -> int:
    """What a finished record weighs against the retention budget when it is kept in memory."""
    result = record.result
    weight = (RECORD_MEMORY + (0 if result is None else len(result)) + len(record.error_type)
              + len(record.error_message) + len(record.traceback))
    ends = record.attempt_ends
    if ends:  # most records have none
        weight += sum(ATTEMPT_END_MEMORY + len(end.error or "") for end in ends)
    return weight


class ResultArchive(Protocol):
    """Where finished tasks go once they leave memory; the book asks it when memory has no answer.

    Each lookup returns a fresh record (or None: unknown, or no longer retained).
    """

    archived_through: int
    """Every finished record numbered up to this is stored: those may leave memory."""

    def find(self, task_id: str) -> TaskRecord | None: ...
    def find_key(self, pool: str, tenant: str | None, key: str) -> TaskRecord | None: ...
    def find_submission(self, tenant: str | None, submission: str) -> TaskRecord | None: ...
    def set_retention(self, ttl: float, max_bytes: int) -> None: ...
    def forget_expired(self, now: float) -> None: ...


class FinishedRecords:
    """The finished records a task book holds in memory, oldest first, numbered in the order they finished."""

    def __init__(self, ttl: float = DEFAULT_RESULT_TTL, max_bytes: int = DEFAULT_RETENTION_BYTES) -> None:
        self.ttl = ttl
        self.max_bytes = max_bytes
        self.bytes = 0
        """What the held records weigh (memory_bytes), while `weigh` is set."""
        self.weigh = True
        """Whether to keep `bytes`: only retention in memory needs it (not a book whose records leave for an
        archive once stored), and it costs every finished task a few calls."""
        self.next_seq = 1
        self._records: deque[TaskRecord] = deque()

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[TaskRecord]:
        return iter(self._records)

    def add(self, record: TaskRecord) -> None:
        """Number a record that just finished, and hold it."""
        record.seq = self.next_seq
        self.next_seq += 1
        self._records.append(record)
        if self.weigh:
            self.bytes += memory_bytes(record)

    def restore(self, records: Iterable[TaskRecord], seq_floor: int) -> None:
        """Hold recovered finished records. Numbers up to `seq_floor` are taken (the results store's, and
        those the records carry); a record without one (written by an older version) gets the next."""
        self.next_seq = max(self.next_seq, seq_floor + 1)
        for record in records:
            if not record.seq:
                record.seq = self.next_seq
                self.next_seq += 1
            self._records.append(record)
            if self.weigh:
                self.bytes += memory_bytes(record)
        # Numbered in finish order already, except what an older version wrote: the store relies on the order.
        self._records = deque(sorted(self._records, key=_seq))

    def expired(self, now: float) -> list[TaskRecord]:
        """Drop and return the oldest records while they are older than `ttl` or the rest weigh too much."""
        records, gone = self._records, []
        oldest = now - self.ttl
        while records and (records[0].finished_at <= oldest or self.bytes > self.max_bytes):  # type: ignore[operator]
            record = records.popleft()
            self.bytes -= memory_bytes(record)
            gone.append(record)
        return gone

    def release(self, through: int, limit: int | None = None) -> list[TaskRecord]:
        """Drop and return the oldest records up to number `through` (the results store holds them now), at
        most `limit` of them."""
        records, gone = self._records, []
        while records and records[0].seq <= through and (limit is None or len(gone) < limit):
            record = records.popleft()
            if self.weigh:
                self.bytes -= memory_bytes(record)
            gone.append(record)
        return gone


    def releasable(self, through: int) -> bool:
        """Whether the oldest record is numbered up to `through` (the store holds it: it may go)."""
        return bool(self._records) and self._records[0].seq <= through


def _seq(record: TaskRecord) -> int:
    return record.seq
