"""The results store's rows and its scope filter, at the level of `results.Writer` and `ScopeFilter`.

The archiver stores each finished record's encoding as the broker sent it and reads from it only what a row
needs; these check that what it writes is what the store always held (a data_dir in the field must go on
answering), that a record sent twice is stored once, and that the filter's fast paths set the same bits.
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
from pathlib import Path

import msgspec

from cronoq.book.records import TaskRecord, stored_form
from cronoq.store.results import database as results
from cronoq.store.results.archiver import FilterKeeper
from cronoq.store.results.scopes import ScopeFilter, key_scope, submission_scope


def _record(n: int, *, tenant: str | None = None, key: str | None = None, submission: str | None = None,
            finished_at: float = 1000.0) -> TaskRecord:
    record = TaskRecord(f"task-{n:04d}", "a", tenant, 2, b"", 900.0, None, None, 0, key, submission, "succeeded",
                        1, 950.0, finished_at, msgspec.msgpack.encode({"n": n}))
    record.seq = n
    return record


def _unsigned_blake(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _as_stored(value: int) -> int:
    """A 64-bit hash as a signed SQLite integer, computed here independently of the code under test."""
    return value - (1 << 64) if value >= 1 << 63 else value


def test_a_row_holds_the_records_encoding_as_sent_and_the_hashes_the_store_has_always_used():
    records = [_record(1), _record(2, tenant="acme", key="k", submission="s-2"), _record(3, submission="s-3"),
               _record(4, tenant="globex", key="only-a-key")]
    bodies = [msgspec.msgpack.encode(stored_form(record)) for record in records]  # as the broker sends them
    rows = results.rows(bodies)
    for record, body, row in zip(records, bodies, rows):
        seq, id_hash, submission, key, finished_at, stored = row
        assert bytes(stored) == body and msgspec.msgpack.decode(stored, type=TaskRecord) == record
        assert (seq, finished_at) == (record.seq, record.finished_at)
        assert results.weight(row) == results.ROW_OVERHEAD + len(body)
        assert id_hash == _as_stored(_unsigned_blake(record.id.encode())) == results.id_hash(record.id)
        assert submission == (None if record.submission is None
                              else _as_stored(submission_scope(record.tenant, record.submission)))
        assert key == (None if record.key is None else _as_stored(key_scope(record.pool, record.tenant, record.key)))
    assert results.row(records[1]) == rows[1]


def _old_store(path: Path, records: list[TaskRecord]) -> None:
    """A store as the version before this one wrote it, by hand: partitions, one table, its three indexes, the
    record's msgpack and its hashes, `archived_through`."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.executescript("""
        CREATE TABLE partitions (n INTEGER PRIMARY KEY, first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL,
                                 rows INTEGER NOT NULL, bytes INTEGER NOT NULL, newest REAL NOT NULL);
        CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
        CREATE TABLE results_1 (seq INTEGER PRIMARY KEY, id_hash INTEGER NOT NULL, submission_scope INTEGER,
                                key_scope INTEGER, finished_at REAL NOT NULL, record BLOB NOT NULL);
        CREATE INDEX results_1_id ON results_1 (id_hash);
        CREATE INDEX results_1_submission ON results_1 (submission_scope) WHERE submission_scope IS NOT NULL;
        CREATE INDEX results_1_key ON results_1 (key_scope) WHERE key_scope IS NOT NULL;
    """)
    weight = 0
    for record in records:
        body = msgspec.msgpack.encode(("t", *msgspec.structs.astuple(record)[:20]))
        weight += 100 + len(body)
        db.execute("INSERT INTO results_1 VALUES (?, ?, ?, ?, ?, ?)", (
            record.seq, _as_stored(_unsigned_blake(record.id.encode())),
            None if record.submission is None else _as_stored(submission_scope(record.tenant, record.submission)),
            None if record.key is None else _as_stored(key_scope(record.pool, record.tenant, record.key)),
            record.finished_at, body))
    db.execute("INSERT INTO partitions VALUES (1, ?, ?, ?, ?, ?)",
               (records[0].seq, records[-1].seq, len(records), weight, records[-1].finished_at))
    db.execute("INSERT INTO meta VALUES ('archived_through', ?), ('last_partition', 1)", (records[-1].seq,))
    db.close()


def test_a_store_written_by_the_version_before_answers_and_takes_new_rows(tmp_path):
    path = tmp_path / results.RESULTS
    old = [_record(n, tenant="acme" if n % 2 else None, key=f"k{n}" if n % 3 == 0 else None, submission=f"s{n}")
           for n in range(1, 31)]
    _old_store(path, old)
    writer = results.Writer(path, 1e9, 1 << 30, 1000.0)
    assert (writer.through, writer.rows) == (30, 30)
    new = [_record(n, submission=f"s{n}") for n in range(31, 41)]
    writer.begin()
    writer.store([results.encoded(record) for record in new])
    writer.commit()
    reader = results.ResultsReader(results.connect(path))
    reader.now = 1000.0
    for record in old + new:
        assert reader.find(record.id) == record
        assert reader.find_submission(record.tenant, record.submission) == record  # type: ignore[arg-type]
        if record.key is not None:
            assert reader.find_key(record.pool, record.tenant, record.key) == record
    assert reader.find_submission(None, "s1") is None, "s1 is acme's"
    scopes = FilterKeeper()
    scopes.rebuild(writer)
    assert scopes.filter is not None
    for record in old + new:
        assert scopes.filter.might_hold(submission_scope(record.tenant, record.submission))  # type: ignore[arg-type]
        if record.key is not None:
            assert scopes.filter.might_hold(key_scope(record.pool, record.tenant, record.key))
    reader.close()
    writer.close()


def _seqs(writer: results.Writer) -> list[int]:
    found: list[int] = []
    for partition in writer.partitions:
        found += [seq for (seq,) in writer.db.execute(f"SELECT seq FROM results_{partition.n}")]
    return sorted(found)


def test_records_sent_again_are_stored_once_and_not_brought_back_once_retention_dropped_them(tmp_path):
    """A new archiver is sent every finished record the broker still holds, some of which its predecessor had
    stored (the broker had not heard so): in an older table, or dropped by retention since."""
    path = tmp_path / results.RESULTS
    records = [_record(n, submission=f"s{n}") for n in range(1, 101)]
    bodies = [results.encoded(record) for record in records]
    budget = 40 * (results.ROW_OVERHEAD + len(bodies[0]))  # tables of MIN_PARTITION_BYTES: a dozen rows each
    writer = results.Writer(path, 1e9, budget, 1000.0)
    for first in range(0, 60, 20):
        writer.begin()
        writer.store(bodies[first:first + 20])
        writer.evict()
        writer.commit()
    kept = _seqs(writer)
    assert kept and kept[0] > 1 and kept[-1] == 60 and len(writer.partitions) > 1
    writer.close()
    again = results.Writer(path, 1e9, budget, 1000.0)  # the archiver that replaced it
    again.begin()
    stored = again.store(bodies[:80])
    again.evict()
    again.commit()
    assert [row[0] for row in stored] == list(range(61, 81))
    seqs = _seqs(again)
    assert len(seqs) == len(set(seqs)), "no record twice"
    assert seqs == list(range(seqs[0], 81)) and seqs[0] >= kept[0], "none of the dropped ones came back"
    assert again.rows == len(seqs) and again.through == 80
    again.close()


def test_adding_many_sets_the_bits_adding_one_by_one_sets_whether_signed_or_not():
    rng = random.Random(5)
    scopes = [rng.getrandbits(64) for _ in range(3000)] + [0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
    one_by_one, many, signed = (ScopeFilter(bytearray(1 << 14), 17) for _ in range(3))
    for scope in scopes:
        one_by_one.add(scope)
    many.add_all(scopes)
    signed.add_all(_as_stored(scope) for scope in scopes)
    assert one_by_one.bits == many.bits == signed.bits
    assert all(many.might_hold(scope) for scope in scopes)


def test_the_filter_is_rebuilt_when_full_or_far_too_big_not_whenever_retention_drops_a_table(tmp_path):
    writer = results.Writer(tmp_path / results.RESULTS, 1e9, 1 << 30, 1000.0)
    keeper = FilterKeeper()
    assert keeper.is_stale(0)
    keeper.rebuild(writer)
    assert keeper.filter is not None
    capacity = keeper.filter.capacity
    rows = capacity // 4
    keeper.entries = 2 * rows
    keeper.dropped = rows + 1  # as many dropped as stored: still room for what comes
    assert not keeper.is_stale(rows)
    keeper.entries = capacity + 1  # as full as it was sized for
    assert keeper.is_stale(rows)
    keeper.filter.log2 += 4  # a filter built for a far bigger store (say, before the budget was cut)
    keeper.entries, keeper.dropped = keeper.filter.capacity // 2, keeper.filter.capacity // 4
    assert keeper.is_stale(rows), "most of what it held was dropped: a smaller one will do"
    writer.close()


def test_the_filter_misses_about_as_rarely_as_it_was_sized_for_and_spreads_over_all_its_words():
    """Four bits in one word of 64 per scope (a blocked filter): at 16 bits a scope, about 0.5 % of scopes never
    added pass for added; a filter that put every scope in a few words would pass nearly all of them."""
    rng = random.Random(11)
    log2 = 20
    scopes = ScopeFilter(bytearray(1 << (log2 - 3)), log2)
    added = [rng.getrandbits(64) for _ in range((1 << log2) // 16)]
    scopes.add_all(added)
    assert all(scopes.might_hold(scope) and scopes.might_hold(_as_stored(scope)) for scope in added)
    probes = [rng.getrandbits(64) for _ in range(100_000)]
    false_maybes = sum(scopes.might_hold(scope) for scope in probes) / len(probes)
    assert 0.002 < false_maybes < 0.008
    words = memoryview(scopes.bits).cast("Q")
    assert sum(1 for word in words if word) > 0.95 * len(words)


def test_a_filter_is_rebuilt_again_and_again_in_new_shared_memory(tmp_path):
    """Each rebuild unmaps the memory of the filter before it (which needs the old filter's view let go)."""
    writer = results.Writer(tmp_path / results.RESULTS, 1e9, 1 << 30, 1000.0)
    records = [_record(n, submission=f"s{n}") for n in range(1, 21)]
    writer.begin()
    writer.store([results.encoded(record) for record in records])
    writer.commit()
    keeper = FilterKeeper()
    for _ in range(3):
        keeper.rebuild(writer)
        assert keeper.filter is not None
        assert all(keeper.filter.might_hold(submission_scope(None, f"s{n}")) for n in range(1, 21))
    writer.close()
