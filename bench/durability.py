"""What durability costs: the store choice, fsync on this disk, and the broker end to end.

    python -m bench.durability                 # everything (a few minutes)
    python -m bench.durability store fsync     # only some sections: fsync, store, e2e, recovery
    python -m bench.durability --quick         # a smoke run

Sections:
  fsync     cost of one commit of 4 KiB: write only, write + fdatasync, write + fsync
  store     the two candidate stores doing a task's life (accept with a 100-byte payload,
            dispatch, finish with a result), the changes of `batch` tasks per commit:
            sqlite3 in WAL mode (synchronous OFF / NORMAL / FULL) against cronoq's journal
            (cronoq.store.journal.journal, the real code: write per commit / fdatasync per commit)
  e2e       the real broker with 2 workers x 64 slots, 1,000 tasks in flight, durability
            none / sync (default) / fsync: tasks/s, and p50/p99 with one task in flight
  recovery  seconds from start to ready for a broker whose data_dir holds N queued tasks,
            after kill -9 (journal replay) and after SIGTERM + a compaction (snapshot read)

Every number is the median of `--repeat` runs (default 3), with min-max.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

from cronoq.book.records import TaskRecord
from cronoq.store.journal.journal import Journal

SECTIONS = ("fsync", "store", "e2e", "recovery")
PAYLOAD = b"\x83\xa1n\x01\xa2op\xa4noop\xa3pad\xd9N" + b"x" * 78  # ~100 bytes of msgpack


def _spread(values: list[float], fmt: str = "{:,.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


# --------------------------------------------------------------------- fsync


def fsync_section(folder: Path, repeat: int, commits: int) -> None:
    print(f"\n## One commit of 4 KiB appended to a file in {folder} (us per commit, {commits} commits)\n")
    print("| what | us per commit |\n| --- | --- |")
    for name, sync in (("write only", None), ("write + fdatasync", os.fdatasync), ("write + fsync", os.fsync)):
        runs = []
        for _ in range(repeat):
            path = folder / "fsync-probe"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
            started = time.perf_counter()
            for _ in range(commits):
                os.write(fd, b"x" * 4096)
                if sync is not None:
                    sync(fd)
            runs.append((time.perf_counter() - started) / commits * 1e6)
            os.close(fd)
            path.unlink()
        print(f"| {name} | {_spread(runs, '{:,.1f}')} |")


# --------------------------------------------------------------------- store


def journal_lifecycle(folder: Path, tasks: int, batch: int, fsync: bool) -> float:
    """us per task: cronoq's Journal told of `batch` tasks accepted, dispatched and finished, then one commit.

    The same calls the task book makes, on TaskRecords made before the clock starts: the store's own cost.
    """
    journal, _ = Journal.open(folder, fsync_each_commit=fsync)
    now = time.time()
    records = [TaskRecord(uuid.uuid4().hex, "default", "acme", 2, PAYLOAD, key=None, max_retries=0, deadline=None,
                          submitted_at=now, submission=uuid.uuid4().hex) for _ in range(tasks)]
    started = time.perf_counter()
    for first in range(0, tasks, batch):
        now = time.time()
        group = records[first:first + batch]
        for record in group:
            journal.accepted(record)
        for record in group:
            record.state, record.attempts, record.started_at = "running", 1, now
            journal.dispatched(record)
            record.state, record.finished_at, record.result, record.payload = "succeeded", now, PAYLOAD, b""
            journal.finished(record)
        journal.commit()
    elapsed = time.perf_counter() - started
    journal.close()
    return elapsed / tasks * 1e6


def sqlite_lifecycle(folder: Path, tasks: int, batch: int, synchronous: str) -> float:
    """us per task: the same three changes as rows of a WAL-mode table, one transaction per batch."""
    db = sqlite3.connect(folder / "tasks.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("CREATE TABLE tasks (id TEXT PRIMARY KEY, pool TEXT, tenant TEXT, priority INT, payload BLOB, "
               "submission TEXT, deadline REAL, not_before REAL, submitted_at REAL, state TEXT, attempts INT, "
               "started_at REAL, finished_at REAL, result BLOB, error TEXT)")
    ids = [(uuid.uuid4().hex, uuid.uuid4().hex) for _ in range(tasks)]
    started = time.perf_counter()
    for first in range(0, tasks, batch):
        now = time.time()
        group = ids[first:first + batch]
        db.execute("BEGIN")
        for task_id, submission in group:
            db.execute("INSERT INTO tasks (id, pool, tenant, priority, payload, submission, submitted_at, state, "
                       "attempts) VALUES (?, 'default', 'acme', 2, ?, ?, ?, 'queued', 0)",
                       (task_id, PAYLOAD, submission, now))
        for task_id, _ in group:
            db.execute("UPDATE tasks SET state = 'running', attempts = 1, started_at = ? WHERE id = ?", (now, task_id))
            db.execute("UPDATE tasks SET state = 'succeeded', finished_at = ?, result = ?, payload = NULL WHERE id = ?",
                       (now, PAYLOAD, task_id))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - started
    db.close()
    return elapsed / tasks * 1e6


def store_section(base: Path, repeat: int, tasks: int) -> None:
    print(f"\n## A task's life in each store (us per task, {tasks:,} tasks, `batch` tasks per commit)\n")
    print("| store | batch 1 | batch 10 | batch 100 |\n| --- | --- | --- | --- |")
    candidates: list[tuple[str, Callable[[Path, int, int], float]]] = [
        ("sqlite3 WAL, synchronous=OFF", lambda f, n, b: sqlite_lifecycle(f, n, b, "OFF")),
        ("sqlite3 WAL, synchronous=NORMAL", lambda f, n, b: sqlite_lifecycle(f, n, b, "NORMAL")),
        ("sqlite3 WAL, synchronous=FULL (fsync per commit)", lambda f, n, b: sqlite_lifecycle(f, n, b, "FULL")),
        ("journal, write per commit (durability sync)", lambda f, n, b: journal_lifecycle(f, n, b, False)),
        ("journal, fdatasync per commit (durability fsync)", lambda f, n, b: journal_lifecycle(f, n, b, True)),
    ]
    for name, measure in candidates:
        cells = []
        for batch in (1, 10, 100):
            n = tasks if batch > 1 or "sync per" not in name else max(200, tasks // 20)  # syncing 1 by 1 is slow
            runs = []
            for _ in range(repeat):
                with tempfile.TemporaryDirectory(dir=base) as tmp:
                    runs.append(measure(Path(tmp), n, batch))
            cells.append(_spread(runs))
        print(f"| {name} | {' | '.join(cells)} |")


# --------------------------------------------------------------------- end to end


def e2e_section(repeat: int, tasks: int, light: int) -> None:
    from bench.common import median_of
    from bench.load import drive_cronoq
    from bench.stacks import cronoq_stack
    import uvloop

    print(f"\n## The broker end to end: 2 workers x 64 slots, noop tasks, {tasks:,} tasks with 1,000 in flight\n")
    print("| durability | tasks/s | p50 / p99 one in flight (ms) | broker CPU us/task |\n| --- | --- | --- | --- |")
    for name, durable in (("none", False), ("sync (default)", True), ("fsync", "fsync")):
        saturated, one = [], []
        for _ in range(repeat):
            with cronoq_stack(durable=durable, tokens=False, workers=2, concurrency=64) as stack:
                uvloop.run(drive_cronoq(stack.address, min(1000, tasks), 100))  # warm-up
                before = stack.cpu()["broker"]
                run, _ = uvloop.run(drive_cronoq(stack.address, tasks, 1000))
                broker_cpu = stack.cpu()["broker"] - before
                summary = run.summary()
                summary["broker_us"] = broker_cpu / run.tasks * 1e6
                saturated.append(summary)
                one.append(uvloop.run(drive_cronoq(stack.address, light, 1))[0].summary())
        sat, lat = median_of(saturated), median_of(one)
        rates = [r["tasks_per_s"] for r in saturated]
        print(f"| {name} | {_spread(rates, '{:,.0f}')} | {lat['p50_ms']:.2f} / {lat['p99_ms']:.2f} | "
              f"{sat['broker_us']:.1f} |")


# --------------------------------------------------------------------- recovery


def recovery_section(repeat: int, queued: int) -> None:
    from bench.load import submit_many
    from bench.stacks import CronoqBroker, broker_config
    import cronoq
    import uvloop

    async def pause(address: str) -> None:
        async with cronoq.connect(address) as client:
            await client.pause("default")

    async def last_state(address: str, task_id: str) -> str:
        async with cronoq.connect(address, request_timeout=120) as client:
            return (await client.status(task_id)).state

    print(f"\n## Restart of a broker holding {queued:,} queued tasks (seconds until its ready line)\n")
    print("| after | from | seconds |\n| --- | --- | --- |")
    kill, term = [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="cronoq-bench-dur-") as tmp:
            text, clients, _ = broker_config(durable=True, tokens=False, data_dir=Path(tmp) / "data")
            broker = CronoqBroker(text, Path(tmp))
            try:
                broker.start()
                uvloop.run(pause(clients))
                ids = uvloop.run(submit_many(clients, queued, 1000, timeout=3600))
                for after, times in (("kill -9", kill), ("SIGTERM", term)):
                    broker.stop(sig=signal.SIGKILL if after == "kill -9" else signal.SIGTERM, grace=600)
                    started = time.perf_counter()
                    broker.start(timeout=600)
                    times.append(time.perf_counter() - started)
                    assert uvloop.run(last_state(clients, ids[-1])) == "queued"
            finally:
                broker.stop()
    print(f"| kill -9 | the journal, replayed | {_spread(kill)} |")
    print(f"| SIGTERM (graceful) | the journal, replayed (no compaction below 64 MiB) | {_spread(term)} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sections", nargs="*", help=f"sections to run: {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes, one run: a smoke test")
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where the store files go (default: .)")
    args = parser.parse_args(argv)
    repeat = 1 if args.quick else args.repeat
    sections = args.sections or list(SECTIONS)
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    print(f"# bench/durability.py on {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
          f"{time.strftime('%Y-%m-%d')}")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix=".cronoq-durability-") as tmp:
        base = Path(tmp)
        if "fsync" in sections:
            fsync_section(base, repeat, 50 if args.quick else 500)
        if "store" in sections:
            store_section(base, repeat, 2_000 if args.quick else 20_000)
    if "e2e" in sections:
        e2e_section(repeat, 1_000 if args.quick else 30_000, 100 if args.quick else 1_000)
    if "recovery" in sections:
        recovery_section(repeat, 2_000 if args.quick else 100_000)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
