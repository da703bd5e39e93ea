"""The results store: finished tasks kept on disk until retention ends, in `data_dir/results.sqlite3`.

One row per finished task, numbered by `seq` (the order tasks finished,
which is also the order retention drops them): the task's record whole
(msgpack, without the payload), its size, when it finished, and 64-bit
hashes to find it by: its id, its submission id's scope and its key's scope
(cronoq.store.scopes), indexed. SQLite (the standard library's) in WAL
mode: one process writes (the archiver, cronoq.store.archiver), the broker
reads with a connection of its own and never waits for the writer.

`meta` holds `archived_through`: every task numbered up to it that finished
was written here (some may since have been dropped by retention). The
journal's replay leaves those out; the others it hands to the archiver
again.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import msgspec

from cronoq.book import TaskRecord, stored_form
from cronoq.store.scopes import key_scope, submission_scope

RESULTS = "results.sqlite3"
"""The store's file in data_dir (with SQLite's `-wal` and `-shm` beside it)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    seq INTEGER PRIMARY KEY,
    id_hash INTEGER NOT NULL,
    submission_scope INTEGER,
    key_scope INTEGER,
    finished_at REAL NOT NULL,
    size INTEGER NOT NULL,
    record BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS results_id ON results (id_hash);
CREATE INDEX IF NOT EXISTS results_submission ON results (submission_scope) WHERE submission_scope IS NOT NULL;
CREATE INDEX IF NOT EXISTS results_key ON results (key_scope) WHERE key_scope IS NOT NULL;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
"""

INSERT = "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?)"

ROW_OVERHEAD = 100
"""Bytes a row costs in the file besides its record's encoding: the fixed fields, its three index entries,
and the slack of B-tree pages (calibrated with `python -m bench.retention store`)."""

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(TaskRecord).decode


def row(record: TaskRecord) -> tuple:
    """A finished record as a row of `results` (INSERT's parameters); the record is stored whole (msgpack),
    found by integer hashes: a B-tree of 8-byte keys costs half what one of 32-character ids does."""
    body = _encode(stored_form(record))
    submission = None if record.submission is None else _signed(submission_scope(record.tenant, record.submission))
    key = None if record.key is None else _signed(key_scope(record.pool, record.tenant, record.key))
    return (record.seq, id_hash(record.id), submission, key, record.finished_at, ROW_OVERHEAD + len(body), body)


def id_hash(task_id: str) -> int:
    return _signed(int.from_bytes(hashlib.blake2b(task_id.encode(), digest_size=8).digest(), "little"))


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


class ResultsReader:
    """The broker's read-only use of the store: finished tasks by id, by key and by submission id.

    Rows are found by hash and checked field by field (two different values can share a hash). Each query
    runs to its end (fetchall), so no read transaction stays open to hold the WAL back.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def find(self, task_id: str) -> TaskRecord | None:
        for record in self._records("SELECT record FROM results WHERE id_hash = ?", id_hash(task_id)):
            if record.id == task_id:
                return record
        return None

    def find_key(self, pool: str, tenant: str | None, key: str, scope: int | None = None) -> TaskRecord | None:
        scope = key_scope(pool, tenant, key) if scope is None else scope
        for record in self._records("SELECT record FROM results WHERE key_scope = ? ORDER BY seq DESC", _signed(scope)):
            if record.key == key and record.pool == pool and record.tenant == tenant:
                return record
        return None

    def find_submission(self, tenant: str | None, submission: str, scope: int | None = None) -> TaskRecord | None:
        scope = submission_scope(tenant, submission) if scope is None else scope
        for record in self._records("SELECT record FROM results WHERE submission_scope = ? ORDER BY seq DESC",
                                    _signed(scope)):
            if record.submission == submission and record.tenant == tenant:
                return record
        return None

    def mark(self) -> int:
        return read_mark(self._db)

    def close(self) -> None:
        self._db.close()

    def _records(self, query: str, value: int) -> list[TaskRecord]:
        return [_decode(body) for (body,) in self._db.execute(query, (value,)).fetchall()]
