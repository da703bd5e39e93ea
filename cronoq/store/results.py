"""The results store: finished tasks kept on disk until retention ends, in `data_dir/results.sqlite3`.

One row per finished task, numbered by `seq` (the order tasks finished,
which is also the order retention drops them), with what `status` and
`result` answer and the task's idempotency key and submission id. SQLite
(the standard library's) in WAL mode: one process writes (the archiver,
cronoq.store.archiver), the broker reads with a connection of its own and
never waits for the writer. Indexes: the task id, (pool, tenant, key) and
(tenant, submission), the last two only over rows that have one.

`meta` holds `archived_through`: every task numbered up to it that finished
was written here (some may since have been dropped by retention). The
journal's replay leaves those out; the others it hands to the archiver
again.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from cronoq.book import TaskRecord

RESULTS = "results.sqlite3"
"""The store's file in data_dir (with SQLite's `-wal` and `-shm` beside it)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    pool TEXT NOT NULL,
    tenant TEXT,
    priority INTEGER NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    submitted_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL NOT NULL,
    deadline REAL,
    key TEXT,
    submission TEXT,
    result BLOB,
    error_type TEXT NOT NULL,
    error_message TEXT NOT NULL,
    traceback TEXT NOT NULL,
    size INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS results_id ON results (id);
CREATE INDEX IF NOT EXISTS results_key ON results (pool, tenant, key) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS results_submission ON results (tenant, submission) WHERE submission IS NOT NULL;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
"""

COLUMNS = ("seq, id, pool, tenant, priority, state, attempts, submitted_at, started_at, finished_at, deadline, "
           "key, submission, result, error_type, error_message, traceback")
INSERT = f"INSERT OR REPLACE INTO results ({COLUMNS}, size) VALUES ({', '.join('?' * 18)})"

ROW_OVERHEAD = 128
"""Bytes a row costs in the file besides its variable-length fields: the fixed fields, the row's and its
index entries' headers, and the slack of B-tree pages (measured with `python -m bench.retention store`)."""


def row(record: TaskRecord) -> tuple:
    """A finished record as a row of `results` (INSERT's parameters)."""
    return (record.seq, record.id, record.pool, record.tenant, record.priority, record.state, record.attempts,
            record.submitted_at, record.started_at, record.finished_at, record.deadline, record.key,
            record.submission, record.result, record.error_type, record.error_message, record.traceback,
            row_bytes(record))


def row_bytes(record: TaskRecord) -> int:
    """What a row weighs against result_retention_bytes: about what it takes in the file (the id, tenant, key
    and submission id twice: in the row and in an index)."""
    result = record.result
    return (ROW_OVERHEAD + (0 if result is None else len(result)) + len(record.error_type)
            + len(record.error_message) + len(record.traceback) + len(record.pool)
            + 2 * (len(record.id) + len(record.tenant or "") + len(record.key or "") + len(record.submission or "")))


def _record(values: tuple) -> TaskRecord:
    (seq, task_id, pool, tenant, priority, state, attempts, submitted_at, started_at, finished_at, deadline, key,
     submission, result, error_type, error_message, traceback) = values
    return TaskRecord(task_id, pool, tenant, priority, b"", submitted_at, deadline, None, 0, key, submission, state,
                      attempts, started_at, finished_at, result, error_type, error_message, traceback, seq)


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


class ResultsReader:
    """The broker's read-only use of the store: finished tasks by id, by key and by submission id.

    Each query runs to its end (fetchall), so no read transaction stays open to hold the WAL back.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def find(self, task_id: str) -> TaskRecord | None:
        return self._one(f"SELECT {COLUMNS} FROM results WHERE id = ?", (task_id,))

    def find_key(self, pool: str, tenant: str | None, key: str) -> TaskRecord | None:
        return self._one(f"SELECT {COLUMNS} FROM results WHERE key = ? AND pool = ? AND tenant IS ? "
                         "ORDER BY seq DESC LIMIT 1", (key, pool, tenant))

    def find_submission(self, tenant: str | None, submission: str) -> TaskRecord | None:
        return self._one(f"SELECT {COLUMNS} FROM results WHERE submission = ? AND tenant IS ? "
                         "ORDER BY seq DESC LIMIT 1", (submission, tenant))

    def mark(self) -> int:
        return read_mark(self._db)

    def close(self) -> None:
        self._db.close()

    def _one(self, query: str, parameters: tuple) -> TaskRecord | None:
        found = self._db.execute(query, parameters).fetchall()
        return _record(found[0]) if found else None
