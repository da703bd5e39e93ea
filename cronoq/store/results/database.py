"""The results store: finished tasks kept on disk until retention ends, in `data_dir/results.sqlite3`.

One row per finished task, numbered by `seq` (the order tasks finished,
which is also the order retention drops them): the task's record whole
(msgpack, without the payload), when it finished, and 64-bit hashes to find
it by: its id, its submission id's scope and its key's scope
(cronoq.store.results.scopes), indexed. SQLite (the standard library's) in WAL
mode: one process writes (the archiver, cronoq.store.results.archiver, with
`Writer`), the broker reads with a connection of its own (`ResultsReader`)
and never waits for the writer.

**Partitions.** Rows go to tables `results_<n>` of about a sixteenth of
`result_retention_bytes` each, listed in `partitions`; retention drops
whole tables, oldest first: when the rows' bytes exceed the budget, or when
a table's newest row is past `result_ttl`. Deleting rows one by one would
cost as much as inserting them (every index entry is at a random place),
and one big table's indexes spread each batch's writes over all their pages:
small tables cost a quarter of the CPU (docs/durability.md has the figures).
Readers skip rows past `result_ttl`, so that a result is never answered
longer than that; the byte budget is kept by the table, so the store holds
between 15/16 of the budget and all of it, its oldest results going first.

`meta` holds `archived_through`: every task numbered up to it that finished
was written here (some may since have been dropped by retention). The
journal's replay leaves those out; the others it hands to the archiver
again.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Union

import msgspec

from cronoq.book.records import TaskRecord, stored_form
from cronoq.store.results.scopes import key_scope, submission_scope

RESULTS = "results.sqlite3"
"""The store's file in data_dir (with SQLite's `-wal` and `-shm` beside it)."""

PARTITIONS = 16
"""Tables the byte budget is cut into: the store gives up at most one sixteenth of it early."""
MIN_PARTITION_BYTES = 4096

ROW_OVERHEAD = 100
"""Bytes a row costs in the file besides its record's encoding: the fixed fields, its three index entries,
and the slack of B-tree pages (calibrated with `python -m bench.retention store`)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS partitions (
    n INTEGER PRIMARY KEY,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    rows INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    newest REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
"""

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(TaskRecord).decode

Buffer = Union[bytes, memoryview, msgspec.Raw]
"""A record's stored encoding: bytes, or the slice of a message the archiver received (msgspec.Raw)."""


def encoded(record: TaskRecord) -> bytes:
    """A finished record as the store keeps it (and as the broker sends it to the archiver): its stored form,
    msgpack (without the payload, which a finished task no longer has)."""
    return _encode(stored_form(record))


def rows(bodies: Iterable[Buffer], after: int = 0) -> list[tuple]:
    """Finished records, each in its stored encoding, as rows of a partition: INSERT's parameters, as they are
    handed to it (a row's weight is `weight(row)`); records numbered up to `after` are left out (the store has
    them). The encoding is stored
    as it came, not encoded again: only the fields the row needs are read from it. A row is found by integer
    hashes (a B-tree of 8-byte keys costs half what one of 32-character ids does)."""
    out: list[tuple] = []
    append, decode, blake2b = out.append, _decode, hashlib.blake2b
    from_bytes, scope_hash = int.from_bytes, _scope_hash
    for body in bodies:
        record = decode(body)
        seq = record.seq
        if seq <= after:
            continue
        submission, key, tenant = record.submission, record.key, record.tenant
        append((seq, from_bytes(blake2b(record.id.encode(), digest_size=8).digest(), "little", signed=True),
                None if submission is None else scope_hash(("s", tenant, submission)),
                None if key is None else scope_hash(("k", record.pool, tenant, key)),
                record.finished_at, body))
    return out


def weight(row: tuple) -> int:
    """What a row (as `rows` gives it) counts for against result_retention_bytes."""
    return ROW_OVERHEAD + len(row[5])


def row(record: TaskRecord) -> tuple:
    """One finished record as a row (see `rows`)."""
    return rows([encoded(record)])[0]


def id_hash(task_id: str) -> int:
    return _signed(int.from_bytes(hashlib.blake2b(task_id.encode(), digest_size=8).digest(), "little"))


def _scope_hash(scope: tuple) -> int:
    """A scope's hash (cronoq.store.results.scopes) as SQLite's signed integer, in one step."""
    return int.from_bytes(hashlib.blake2b(_encode(scope), digest_size=8).digest(), "little", signed=True)


def _signed(scope: int) -> int:
    """A 64-bit hash as SQLite's (signed) integer."""
    return scope - (1 << 64) if scope >= 1 << 63 else scope


def connect(path: Path) -> sqlite3.Connection:
    """Open (creating if need be) the store in WAL mode, with its tables. Raises sqlite3.Error."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA busy_timeout = 5000")
        db.execute("PRAGMA journal_mode = WAL")
        db.executescript(_SCHEMA)
    except BaseException:
        db.close()
        raise
    return db


def peek_mark(path: Path) -> int:
    """`archived_through` as the store's main file has it, changing nothing (no lock, no -wal or -shm file
    created): at most the true value, which is always safe to use (a task numbered after it is merely sent to
    the archiver again). 0 when there is no store yet."""
    if not path.exists():
        return 0
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True)
    except sqlite3.Error:
        return 0
    try:
        return read_mark(db)
    except sqlite3.Error:  # not created in the main file yet (only in the write-ahead log)
        return 0
    finally:
        db.close()


def read_mark(db: sqlite3.Connection) -> int:
    """`archived_through`: every task numbered up to it that finished was written to the store."""
    found = db.execute("SELECT value FROM meta WHERE name = 'archived_through'").fetchall()
    return found[0][0] if found else 0


# --------------------------------------------------------------------- reading (the broker)


class ResultsReader:
    """The broker's read-only use of the store: finished tasks by id, by key and by submission id.

    Rows are found by hash and checked field by field (two different values can share a hash); rows past
    `result_ttl` (by the broker's clock, `now`) are not answered even before their table is dropped. Each
    lookup is one read transaction over the partitions, newest first.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self.ttl = float("inf")
        self.now = 0.0

    def find(self, task_id: str) -> TaskRecord | None:
        for record in self._records("id_hash", id_hash(task_id)):
            if record.id == task_id:
                return record
        return None

    def find_key(self, pool: str, tenant: str | None, key: str, scope: int | None = None) -> TaskRecord | None:
        scope = key_scope(pool, tenant, key) if scope is None else scope
        for record in self._records("key_scope", _signed(scope)):
            if record.key == key and record.pool == pool and record.tenant == tenant:
                return record
        return None

    def find_submission(self, tenant: str | None, submission: str, scope: int | None = None) -> TaskRecord | None:
        scope = submission_scope(tenant, submission) if scope is None else scope
        for record in self._records("submission_scope", _signed(scope)):
            if record.submission == submission and record.tenant == tenant:
                return record
        return None

    def close(self) -> None:
        self._db.close()

    def _records(self, column: str, value: int) -> Iterator[TaskRecord]:
        """The records whose `column` is `value`, newest first, not past result_ttl."""
        db, cutoff = self._db, self.now - self.ttl
        for _ in range(3):
            tables = tuple(n for (n,) in db.execute("SELECT n FROM partitions ORDER BY n DESC").fetchall())
            if not tables:
                return iter(())
            # One statement over every table (SQLite caches it while the tables stay the same): a table the
            # archiver drops between the two statements makes it fail, and the lookup starts again.
            query = " UNION ALL ".join(f"SELECT seq, record FROM results_{n} WHERE {column} = ?1 AND finished_at > ?2"
                                       for n in tables)
            try:
                found = db.execute(query, (value, cutoff)).fetchall()
            except sqlite3.OperationalError:
                continue
            found.sort(reverse=True)
            return (_decode(body) for _, body in found)
        return iter(())


# --------------------------------------------------------------------- writing (the archiver)


@dataclass
class Partition:
    """One table of rows, and what the archiver knows of it."""

    n: int
    first_seq: int = 0
    last_seq: int = 0
    rows: int = 0
    bytes: int = 0
    newest: float = 0.0


class Writer:
    """Writes batches of finished records to the store and applies retention (the archiver's state).

    `store` and `evict` run inside a transaction (`begin` ... `commit`).
    """

    def __init__(self, path: Path, ttl: float, max_bytes: int, now: float) -> None:
        self.db = connect(path)
        self.db.execute("PRAGMA synchronous = FULL")  # a Stored reply lets the broker drop the journal's copy
        # A checkpoint every 8,000 pages (32 MiB of log), not SQLite's 1,000: every batch rewrites most of the newest
        # table's index pages, and a checkpoint copies each page once however often it was rewritten since the
        # last. In a test run of batches of 5,600 rows: 13 % fewer page writes, half the reads (checkpoints read
        # the log back) and a third fewer fsyncs; the archiver's commits cost about 0.15 us a task less.
        self.db.execute("PRAGMA wal_autocheckpoint = 8000")
        self.db.execute("PRAGMA journal_size_limit = 67108864")
        self.db.execute("PRAGMA cache_size = -65536")  # 64 MiB: the newest tables' indexes stay in memory
        self.ttl, self.max_bytes, self.now = ttl, max_bytes, now
        self.through = read_mark(self.db)
        self.partitions = [Partition(*values) for values in self.db.execute(
            "SELECT n, first_seq, last_seq, rows, bytes, newest FROM partitions ORDER BY n")]
        found = self.db.execute("SELECT value FROM meta WHERE name = 'last_partition'").fetchall()
        self.last_n = max([found[0][0]] if found else [0] + [p.n for p in self.partitions])
        self._touched: set[int] = set()

    @property
    def rows(self) -> int:
        return sum(partition.rows for partition in self.partitions)

    @property
    def bytes(self) -> int:
        return sum(partition.bytes for partition in self.partitions)

    def store(self, bodies: Iterable[Buffer]) -> list[tuple]:
        """Insert finished records, each in its stored encoding (`encoded`), in the order they finished; returns
        their rows. A record numbered up to `through` is left out: it was stored before (and perhaps dropped
        since), and is only sent again because the broker had not heard so when its archiver was replaced."""
        new = rows(bodies, self.through)
        at = 0
        while at < len(new):
            partition = self._current()
            room = max(1, (self._partition_bytes() - partition.bytes) // weight(new[at]))
            chunk = new[at:at + room]
            # OR IGNORE: every row is numbered past `through`, so none is there already; should one come twice, the
            # stored copy is the same record and stays (a failed INSERT would stop the archiver for nothing).
            self.db.executemany(f"INSERT OR IGNORE INTO results_{partition.n} VALUES (?, ?, ?, ?, ?, ?)", chunk)
            partition.first_seq = partition.first_seq or chunk[0][0]
            partition.last_seq = max(partition.last_seq, max(values[0] for values in chunk))
            partition.rows += len(chunk)
            partition.bytes += sum(map(weight, chunk))
            partition.newest = max(partition.newest, max(values[4] for values in chunk))
            self._touched.add(partition.n)
            at += len(chunk)
        if new:
            self.through = max(self.through, max(values[0] for values in new))
        return new

    def evict(self) -> int:
        """Drop the oldest tables while all of a table's rows are past result_ttl, or the rows weigh more than
        the budget; returns how many rows went. A table much bigger than what must go (the budget was cut) loses
        only its oldest rows."""
        cutoff, dropped = self.now - self.ttl, 0
        while self.partitions:
            oldest, excess = self.partitions[0], self.bytes - self.max_bytes
            if oldest.newest > cutoff and excess <= 0:
                break
            if oldest.newest > cutoff and oldest.bytes > excess + self._partition_bytes():
                return dropped + self._trim(oldest, excess)
            self.partitions.pop(0)
            self.db.execute(f"DROP TABLE IF EXISTS results_{oldest.n}")
            self.db.execute("DELETE FROM partitions WHERE n = ?", (oldest.n,))
            self._touched.discard(oldest.n)
            dropped += oldest.rows
        return dropped

    def _trim(self, partition: Partition, excess: int) -> int:
        """Delete a table's oldest rows, weighing at least `excess`; returns how many."""
        last, freed, count = None, 0, 0
        for seq, length in self.db.execute(f"SELECT seq, length(record) FROM results_{partition.n} ORDER BY seq"):
            if freed >= excess:
                break
            last, freed, count = seq, freed + ROW_OVERHEAD + length, count + 1
        if last is not None:
            self.db.execute(f"DELETE FROM results_{partition.n} WHERE seq <= ?", (last,))
            partition.first_seq, partition.rows, partition.bytes = last + 1, partition.rows - count, partition.bytes - freed
            self._touched.add(partition.n)
        return count

    def begin(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        for partition in self.partitions:
            if partition.n in self._touched:
                self.db.execute("INSERT OR REPLACE INTO partitions VALUES (?, ?, ?, ?, ?, ?)",
                                (partition.n, partition.first_seq, partition.last_seq, partition.rows,
                                 partition.bytes, partition.newest))
        self._touched.clear()
        self.db.executemany("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)",
                            [("archived_through", self.through), ("last_partition", self.last_n)])
        self.db.execute("COMMIT")

    def rollback(self) -> None:
        """End a transaction that changed nothing (no table was created in it)."""
        self.db.execute("ROLLBACK")

    def scopes(self) -> Iterator[tuple[int]]:
        """Every row's submission scope and key scope, as stored (signed), one per 1-tuple. Read from their
        (partial) indexes, which hold exactly those, not from the tables' rows with their records."""
        for partition in list(self.partitions):
            yield from self.db.execute(f"SELECT submission_scope FROM results_{partition.n} "
                                       "WHERE submission_scope IS NOT NULL")
            yield from self.db.execute(f"SELECT key_scope FROM results_{partition.n} WHERE key_scope IS NOT NULL")

    def close(self) -> None:
        self.db.close()

    def _partition_bytes(self) -> int:
        return max(MIN_PARTITION_BYTES, self.max_bytes // PARTITIONS)

    def _current(self) -> Partition:
        """The table new rows go to: the newest, or a new one once it holds its share of the budget."""
        if self.partitions and self.partitions[-1].bytes < self._partition_bytes():
            return self.partitions[-1]
        self.last_n = n = self.last_n + 1
        self.db.execute(f"CREATE TABLE results_{n} (seq INTEGER PRIMARY KEY, id_hash INTEGER NOT NULL, "
                        "submission_scope INTEGER, key_scope INTEGER, finished_at REAL NOT NULL, record BLOB NOT NULL)")
        self.db.execute(f"CREATE INDEX results_{n}_id ON results_{n} (id_hash)")
        self.db.execute(f"CREATE INDEX results_{n}_submission ON results_{n} (submission_scope) "
                        "WHERE submission_scope IS NOT NULL")
        self.db.execute(f"CREATE INDEX results_{n}_key ON results_{n} (key_scope) WHERE key_scope IS NOT NULL")
        partition = Partition(n)
        self.partitions.append(partition)
        return partition
