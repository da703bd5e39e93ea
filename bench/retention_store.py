"""The stores measured by `python -m bench.retention store` and `... memory` (see bench/retention.py).

`compare(rows)` keeps `rows` finished tasks (noop results: a few bytes,
ids of 32 hex digits, a submission id each, as the client library sends)
in each candidate, in batches of 1,000 as the broker ships them, then
looks up 10,000 of them by id, and reports per result:

- the broker's RAM: what the broker process holds per retained result
  (SQLite: the scope filter's bits; segments: the id index), by tracemalloc;
- insert: CPU time of the writer to store a result at steady state, with
  retention dropping as much as comes in (SQLite: the archiver's own
  Writer, fsynced per batch, over the second half of the rows with a budget
  for the first half; segments: frames appended and fdatasynced per batch,
  index updated, nothing dropped);
- lookup: wall time of a lookup by id, from the broker's side;
- disk: bytes in data_dir per result.
"""

from __future__ import annotations

import os
import random
import statistics
import struct
import tempfile
import time
import tracemalloc
import zlib
from pathlib import Path

import msgspec

from cronoq.book.records import TaskRecord

BATCH = 1000
LOOKUPS = 10_000


def _records(rows: int) -> list[TaskRecord]:
    now = time.time()
    out = []
    for n in range(rows):
        record = TaskRecord(os.urandom(16).hex(), "default", None, 2, b"", now, None, None, 0, None,
                            f"{os.urandom(8).hex()}-{n:x}", "succeeded", 1, now, now, msgspec.msgpack.encode(n))
        record.seq = n + 1
        out.append(record)
    return out


def _sqlite(folder: Path, records: list[TaskRecord]) -> dict[str, float]:
    from cronoq.store.results import database as results
    from cronoq.store.results.scopes import ScopeFilter, key_scope, log2_for, submission_scope

    # A budget for half the rows: the second half is timed at steady state, each batch dropping as much as it adds.
    half = len(records) // 2
    budget = sum(results.weight(results.row(record)) for record in records[:half])
    writer = results.Writer(folder / results.RESULTS, 1e9, budget, time.time())
    bodies = [results.encoded(record) for record in records]  # as the broker sends them to the archiver
    cpu = 0.0
    for first in range(0, len(records), BATCH):
        batch = bodies[first:first + BATCH]
        started = time.process_time()
        writer.begin()
        writer.store(batch)
        writer.evict()
        writer.commit()
        if first >= half:
            cpu += time.process_time() - started
    # The broker's RAM per retained result: the scope filter's bits (shared with the archiver).
    kept = writer.rows
    tracemalloc.start()
    log2 = log2_for(2 * kept)
    scopes = ScopeFilter(bytearray(1 << (log2 - 3)), log2)
    for record in records[-kept:]:
        scopes.add(submission_scope(record.tenant, record.submission))  # type: ignore[arg-type]
        if record.key is not None:
            scopes.add(key_scope(record.pool, record.tenant, record.key))
    ram = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    reader = results.ResultsReader(results.connect(folder / results.RESULTS))
    probes = random.Random(1).sample(records[-kept:], min(LOOKUPS, kept))
    started = time.perf_counter()
    for record in probes:
        assert reader.find(record.id) is not None
    lookup = (time.perf_counter() - started) / len(probes)
    misses = [os.urandom(8).hex() for _ in range(LOOKUPS)]
    started = time.perf_counter()
    for submission in misses:
        reader.find_submission(None, submission)
    miss = (time.perf_counter() - started) / len(misses)
    reader.close()
    writer.close()
    disk = sum(p.stat().st_size for p in folder.iterdir())
    return {"ram": ram / kept, "insert_us": cpu / (len(records) - half) * 1e6, "lookup_us": lookup * 1e6,
            "submission_miss_us": miss * 1e6, "disk": disk / kept}


_FRAME = struct.Struct("<II")


def _segments(folder: Path, records: list[TaskRecord]) -> dict[str, float]:
    """The other candidate: the journal's frame format in segment files, an id -> (segment, offset) index in the
    broker's memory, a submission -> id index beside it (dedupe needs one too), a segment per 64 MiB."""
    encode = msgspec.msgpack.Encoder().encode
    decode = msgspec.msgpack.Decoder(TaskRecord).decode
    index: dict[str, tuple[int, int]] = {}
    submissions: dict[tuple[str | None, str], str] = {}
    segment, fd, size = 0, os.open(folder / "results.0", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), 0
    cpu = 0.0
    for first in range(0, len(records), BATCH):
        batch = records[first:first + BATCH]
        started = time.process_time()
        chunks = []
        for record in batch:
            body = encode(record)
            chunks.append(_FRAME.pack(len(body), zlib.crc32(body)))
            chunks.append(body)
            index[record.id] = (segment, size)
            submissions[(record.tenant, record.submission)] = record.id  # type: ignore[index]
            size += _FRAME.size + len(body)
        os.write(fd, b"".join(chunks))
        os.fdatasync(fd)
        if size > 64 << 20:
            os.close(fd)
            segment, size = segment + 1, 0
            fd = os.open(folder / f"results.{segment}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        cpu += time.process_time() - started
    os.close(fd)
    # The broker's RAM per retained result: the two indexes, built again under tracemalloc (which slows the
    # timed loop above too much to run there).
    entries = list(index.items())
    index.clear()
    submissions.clear()
    tracemalloc.start()
    for (task_id, place), record in zip(entries, records):
        index[task_id] = place
        submissions[(record.tenant, record.submission)] = task_id  # type: ignore[index]
    ram = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    readers = {n: os.open(folder / f"results.{n}", os.O_RDONLY) for n in range(segment + 1)}
    probes = random.Random(1).sample(records, min(LOOKUPS, len(records)))
    started = time.perf_counter()
    for record in probes:
        at_segment, offset = index[record.id]
        header = os.pread(readers[at_segment], _FRAME.size, offset)
        length, _ = _FRAME.unpack(header)
        assert decode(os.pread(readers[at_segment], length, offset + _FRAME.size)).id == record.id
    lookup = (time.perf_counter() - started) / len(probes)
    for reader in readers.values():
        os.close(reader)
    disk = sum(p.stat().st_size for p in folder.iterdir())
    return {"ram": ram / len(records), "insert_us": cpu / len(records) * 1e6, "lookup_us": lookup * 1e6,
            "submission_miss_us": 0.0, "disk": disk / len(records)}


def compare(rows: int, runs: int = 3) -> None:
    records = _records(rows)
    print(f"{rows:,} retained results, batches of {BATCH:,}; median of {runs} runs (min-max)")
    print("| store | broker RAM B/result | insert µs/result (writer CPU) | lookup by id µs | disk B/result |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, measure in (("SQLite (WAL, fsync per batch), scope filter in memory", _sqlite),
                          ("segment files (frames, fdatasync per batch), id index in memory", _segments)):
        found = []
        for _ in range(runs):
            with tempfile.TemporaryDirectory(prefix="cronoq-store-") as tmp:
                found.append(measure(Path(tmp), records))

        def cell(key: str, fmt: str) -> str:
            values = sorted(run[key] for run in found)
            return f"{fmt.format(statistics.median(values))} ({fmt.format(values[0])}-{fmt.format(values[-1])})"

        print(f"| {name} | {cell('ram', '{:,.0f}')} | {cell('insert_us', '{:.1f}')} | {cell('lookup_us', '{:.1f}')} "
              f"| {cell('disk', '{:,.0f}')} |")
        if name.startswith("SQLite"):
            print(f"  (SQLite, a submission id it does not hold, asked without the filter: "
                  f"{cell('submission_miss_us', '{:.1f}')} µs)")


def writer_thread(rows: int = 20_000, seconds: float = 5.0) -> None:
    """Why the archiver is a process: a SQLite writer thread beside a busy Python loop, as the broker's is under
    load. Each second alternates: the loop alone, then the loop with the writer storing 20,000 rows a second in
    batches of 2,000 (executemany, one transaction each). Reports the loop's speed with the writer against
    without, and the rows the writer managed."""
    import sqlite3
    import threading

    active, stop = threading.Event(), threading.Event()
    stored = [0]

    def writer(path: str) -> None:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("CREATE TABLE r (seq INTEGER PRIMARY KEY, id TEXT, submission TEXT, result BLOB)")
        db.execute("CREATE UNIQUE INDEX r_id ON r (id)")
        seq = 0
        while not stop.is_set():
            if not active.is_set():
                time.sleep(0.01)
                continue
            started = time.perf_counter()
            batch = [(seq + n, os.urandom(16).hex(), f"s{seq + n}", b"\x01") for n in range(rows // 10)]
            seq += len(batch)
            db.execute("BEGIN")
            db.executemany("INSERT INTO r VALUES (?, ?, ?, ?)", batch)
            db.execute("COMMIT")
            stored[0] += len(batch)
            time.sleep(max(0.0, 0.1 - (time.perf_counter() - started)))
        db.close()

    def loop(duration: float) -> int:
        count, end = 0, time.perf_counter() + duration
        while time.perf_counter() < end:
            total = 0
            for n in range(1000):
                total += n
            count += 1
        return count

    with tempfile.TemporaryDirectory(prefix="cronoq-thread-") as tmp:
        thread = threading.Thread(target=writer, args=(f"{tmp}/r.db",))
        thread.start()
        alone = together = rows_stored = 0
        for _ in range(int(seconds)):
            active.clear()
            time.sleep(0.2)
            alone += loop(1.0)
            active.set()
            before = stored[0]
            together += loop(1.0)
            rows_stored += stored[0] - before
        stop.set()
        thread.join()
    print(f"a busy loop beside a SQLite writer thread: {together / alone:.0%} of its speed alone; the writer "
          f"stored {rows_stored / seconds:,.0f} rows/s of the {rows:,} asked")


def record_memory(tasks: int) -> None:
    """Bytes a finished record costs in a task book's memory, result aside (RECORD_MEMORY)."""
    from cronoq.book.submission import SubmitRequest
    from cronoq.book.taskbook import TaskBook
    from cronoq.core import PoolSettings, SchedulerCore

    core = SchedulerCore([PoolSettings("default")])
    ids = iter(range(10**9))
    book = TaskBook(core, new_id=lambda: os.urandom(16).hex() if next(ids) >= 0 else "", on_terminal=lambda r: None,
                    result_retention_bytes=1 << 40, rng=random.Random(0), pacing_clock=time.perf_counter)
    core.add_worker("w", ["default"], tasks)
    requests = [SubmitRequest(msgspec.msgpack.encode({"n": n}), submission=f"{os.urandom(8).hex()}-{n:x}")
                for n in range(tasks)]
    results = [msgspec.msgpack.encode(n) for n in range(tasks)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for request in requests:
        book.submit(request, 1000.0)
    for _, record, attempt in book.dispatch(1000.0):
        book.complete("w", record.id, attempt, 1000.0, ok=True, result=results[0])
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    held = len(book.finished)
    result_bytes = len(results[0])
    per = (after - before) / held
    print(f"{held:,} finished records in memory: {per:,.0f} B each with a {result_bytes}-byte result "
          f"(the submission ids the requests hold are counted: they stay with the record)")


def archiver_steps(rows: int = 900_000, batch: int = 5_600, budget: int = 128 << 20) -> None:
    """Where the results store's hand-over spends its CPU, per finished task: the broker's side (the stored form
    and the message) and each step of the archiver's rounds, run in this process on the real code (the real
    Writer and FilterKeeper, fsynced commits), at the default retention once the store is full (the second half
    of `rows`). `batch`: records per round, what the archiver gathers in GATHER_SECONDS at full rate (0.2 s at
    28,000 tasks/s). A filter rebuild comes every (capacity - rows) tasks at a steady state: its share is
    given for the long run, from the time one rebuild took."""
    from cronoq.book.records import stored_form
    from cronoq.store.results import database as results
    from cronoq.store.results.archiver import FilterKeeper, Put, _Incoming, frame

    decode = msgspec.msgpack.Decoder(_Incoming).decode
    now = time.time()
    times = dict.fromkeys(("broker: stored form, message", "archiver: decode the message",
                           "archiver: read fields, hash", "SQLite insert (executemany)", "filter: set bits",
                           "retention (drop tables)", "commit (WAL, fsync)"), 0.0)
    names = list(times)
    counted = 0
    with tempfile.TemporaryDirectory(prefix="cronoq-archiver-") as tmp:
        writer = results.Writer(Path(tmp) / results.RESULTS, 1e9, budget, now)
        keeper = FilterKeeper()
        keeper.rebuild(writer)
        for first in range(0, rows, batch):
            records = _records(min(batch, rows - first))
            for n, record in enumerate(records):
                record.seq = first + n + 1
                record.finished_at = now
            steady = first >= rows // 2
            t0 = time.process_time()
            body = frame(Put(now, [stored_form(record) for record in records]))[4:]
            t1 = time.process_time()
            message = decode(body)
            t2 = time.process_time()
            results.rows(message.records, writer.through)  # timed alone, then again inside store()
            t3 = time.process_time()
            writer.begin()
            stored = writer.store(message.records)
            t4 = time.process_time()
            keeper.add(stored)
            t5 = time.process_time()
            keeper.dropped += writer.evict()
            t6 = time.process_time()
            writer.commit()
            t7 = time.process_time()
            if keeper.is_stale(writer.rows):
                keeper.rebuild(writer)
            if steady:
                counted += len(records)
                for name, took in zip(names, (t1 - t0, t2 - t1, t3 - t2, (t4 - t3) - (t3 - t2), t5 - t4, t6 - t5,
                                              t7 - t6)):
                    times[name] += took
        started = time.process_time()
        keeper.rebuild(writer)
        rebuild = time.process_time() - started
        assert keeper.filter is not None
        every = max(1, keeper.filter.capacity - writer.rows)
        kept = writer.rows
        writer.close()
    times["filter: rebuild (long-run share)"] = rebuild / every * counted
    print(f"{rows:,} finished tasks in rounds of {batch:,}, result_retention_bytes {budget >> 20} MiB "
          f"({kept:,} kept); µs of CPU per task over the second half:")
    for name, took in times.items():
        print(f"  {name:36s} {took / counted * 1e6:6.2f}")
    archiver = sum(took for name, took in times.items() if not name.startswith("broker"))
    print(f"  {'the archiver in all':36s} {archiver / counted * 1e6:6.2f}")
    print(f"  (one filter rebuild read {kept:,} rows' scopes in {rebuild * 1e3:.0f} ms; one comes every "
          f"{every:,} tasks)")
