"""The journal, snapshots and the results store: what a task book wrote comes back after a crash.

These drive a real TaskBook, a real Journal on real files and a real
archiver process with a fake clock, in the broker's order (commit the
journal, then ship what finished); a "crash" drops the journal without
committing what was pending and kills the archiver wherever it is, exactly
what kill -9 between two passes of the broker's loop leaves behind.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

from cronoq.book.records import TaskRecord

from cronoq.book.submission import SubmitRequest

from cronoq.book.taskbook import TaskBook
from cronoq.core import PoolSettings, SchedulerCore
from cronoq.errors import NotFound
from cronoq.store.journal import frames
from cronoq.store.journal.journal import SNAPSHOT, DamagedFile, Journal, StoreError, journal_path, sync_files
from cronoq.store.journal.replay import Replay
from cronoq.store.results import database as results
from cronoq.store.results.shipping import Archive, open_store
from tests.support import peer

POOLS = [PoolSettings("a"), PoolSettings("b", tenant_weights={"acme": 3})]
TERMINAL = {"succeeded", "failed", "cancelled", "expired"}


class World:
    """A book with a journal and a results store in `data_dir`, a fake clock and one fake worker."""

    def __init__(self, data_dir: Path, now: float = 1000.0, *, ttl: float = 100.0, max_bytes: int = 1 << 30,
                 **journal_options: object) -> None:
        self.data_dir = data_dir
        self.now = now
        self.journal, replay = Journal.open(  # type: ignore[arg-type]
            data_dir, archived_through=lambda: results.peek_mark(data_dir / results.RESULTS), **journal_options)
        db, archived_through = open_store(data_dir)
        self.archive = Archive(data_dir, db, archived_through, ttl=ttl, max_bytes=max_bytes)
        # Ids must not repeat across restarts: continue after the highest one the journal or the store knows.
        known = [int(task_id[1:]) for task_id in replay.by_id]
        for (n,) in db.execute("SELECT n FROM partitions").fetchall():
            known += [int(msgspec.msgpack.decode(body, type=TaskRecord).id[1:])
                      for (body,) in db.execute(f"SELECT record FROM results_{n}").fetchall()]
        self.next_id = max(known, default=-1) + 1
        self.core = SchedulerCore(POOLS)
        self.finished: list[str] = []
        self.book = TaskBook(self.core, new_id=self._new_id, on_terminal=lambda r: self.finished.append(r.id),
                             max_deliveries=3, result_ttl=ttl, result_retention_bytes=max_bytes,
                             rng=random.Random(1), pacing_clock=time.perf_counter, journal=self.journal)
        self.book.archive = self.archive
        # As the broker does (cronoq/broker/durable.py): the book takes over the replay's map of records.
        self.recovered = self.book.recover(replay.ordered(), replay.paused, now, by_id=replay.by_id,
                                           seq_floor=max(replay.max_seq, archived_through))
        self.archive.start(now)
        self.commit()

    def _new_id(self) -> str:
        self.next_id += 1
        return f"t{self.next_id - 1}"

    def commit(self) -> None:
        """The broker's group commit: the journal first, then what finished goes to the archiver."""
        self.journal.commit()
        self.archive.exchange(self.book)

    def settle(self) -> None:
        """Wait until the archiver has stored (and, by retention, dropped) everything sent to it."""
        self.archive.forget_expired(self.now)
        self.archive.catch_up()
        self.archive.exchange(self.book, listen=True)

    def ids(self) -> list[str]:
        return [f"t{n}" for n in range(self.next_id)]

    def crash(self) -> None:
        """Like kill -9 between two passes: what was committed stays, the rest is gone."""
        self.archive.kill()
        self.archive.close()
        self.journal.abandon()

    def close(self) -> None:
        self.archive.close()
        self.journal.close()


def picture(world: World) -> dict[str, tuple]:
    """What a user can observe of every task (running ones come back queued, attempt counted)."""
    book = world.book
    out = {}
    for task_id in world.ids():
        try:
            record, info = book.get(task_id), book.info(task_id)
        except NotFound:
            continue
        state, error, payload = info.state, info.error, record.payload
        lost = info.attempts - record.retries
        if state == "running" and lost >= book.max_deliveries:
            state, payload, error = "failed", b"", lost_text(book, info)
        elif state in ("running", "delayed"):
            state = "queued"
        # How attempts ended, but for the last one of a live task (a restart ends a running one: its worker is
        # lost) or one that failed with its lost worker (which a restart may do, as above).
        ends = tuple(end for end in book.explain(task_id, world.now).history
                     if end.attempt < info.attempts or info.state in TERMINAL and error != lost_text(book, info))
        out[task_id] = (info.pool, info.tenant, info.priority, state, info.attempts, info.deadline,
                        payload, record.result, error, record.key, record.submission, record.retries, ends)
    return out


def lost_text(book: TaskBook, info) -> str:
    """The error of a task failed because its worker was lost on every one of its deliveries."""
    lost = info.attempts - book.get(info.id).retries
    return (f"WorkerLost: the task's worker was lost on {lost} of its {info.attempts} deliveries "
            f"(max_deliveries = {book.max_deliveries})")


def random_workload(world: World, rng: random.Random, steps: int, *, commit: bool = True) -> None:
    """Submissions, dispatches, outcomes, cancels, pauses, lost workers and forgetting, at random."""
    book, core = world.book, world.core
    workers = 0
    for _ in range(steps):
        world.now += rng.choice([0.0, 0.01, 0.5, 3.0])
        op = rng.random()
        if op < 0.4:
            book.submit(SubmitRequest(
                os.urandom(rng.randrange(1, 40)), pool=rng.choice("ab"), tenant=rng.choice([None, "acme", "globex"]),
                priority=rng.choice(["critical", "high", "normal", "low"]),
                deadline=rng.choice([None, None, 1.0, 50.0]), delay=rng.choice([None, None, 2.0]),
                key=rng.choice([None, None, f"k{rng.randrange(20)}"]), max_retries=rng.choice([0, 0, 2]),
                submission=rng.choice([None, f"s{rng.randrange(10**6)}"]),
            ), world.now)
        elif op < 0.5:
            workers += 1
            core.add_worker(f"w{workers}", ["a", "b"], rng.randrange(1, 4))
        elif op < 0.7:
            book.dispatch(world.now)
        elif op < 0.85:
            running = [t for t in core.tasks() if t.state == "running"]
            if running:
                task = rng.choice(running)
                book.complete(task.worker, task.id, task.attempts, world.now, ok=rng.random() < 0.6,
                              result=os.urandom(8), error_type="Boom", error_message="it broke")
                core.grant(task.worker, 1)
        elif op < 0.9:
            live = [t.id for t in core.tasks()]
            if live:
                book.cancel(rng.choice(live), world.now)
        elif op < 0.93:
            pool = rng.choice("ab")
            (book.resume if core.is_paused(pool) else book.pause)(pool)
        elif op < 0.97:
            if core.workers():
                book.lose_worker(rng.choice(core.workers()), world.now)
        elif commit:  # retention moves on with the clock, not with commits: only while committing, so that
            book.forget_expired_records(world.now)  # what a crash test compares is what was committed
        if rng.random() < 0.5 and commit:
            world.commit()
    book.dispatch(world.now)


@pytest.mark.parametrize("seed", range(12))
def test_a_crash_loses_nothing_committed(tmp_path, seed):
    rng = random.Random(seed)
    # One run in three crashes while the archiver may still be storing what it was sent: then nothing expires,
    # so that what it stored before it was killed cannot matter. The others crash with it caught up.
    in_flight = seed % 3 == 0
    ttl = 1e9 if in_flight else 100.0
    world = World(tmp_path, fsync_each_commit=seed % 2 == 0, ttl=ttl)
    random_workload(world, rng, 300)
    world.commit()
    if not in_flight:
        world.settle()
    crashed_at = world.now
    before = picture(world)
    paused = world.book.paused_pools()
    random_workload(world, rng, 5, commit=False)  # changes never committed: as if the broker died before writing them
    world.crash()

    after = World(tmp_path, now=crashed_at, ttl=ttl)
    after.settle()
    assert picture(after) == before
    assert after.book.paused_pools() == paused
    # Idempotency keys and submission ids still point at their tasks, each within its tenant, whether the task
    # is in memory or only in the results store.
    for task_id in before:
        record = after.book.get(task_id)
        for dedup in ({"key": record.key} if record.key else {}), {"submission": record.submission}:
            if dedup.get("key") or dedup.get("submission"):
                again, duplicate = after.book.submit(
                    SubmitRequest(b"x", pool=record.pool, tenant=record.tenant, **dedup), after.now)
                # A repeated submission id is a re-send, answered as the first send was; a key is a duplicate.
                assert again.id == record.id and duplicate == ("key" in dedup)


def test_recovery_requeues_running_tasks_and_applies_max_deliveries(tmp_path):
    world = World(tmp_path)
    core, book = world.core, world.book
    first, _ = book.submit(SubmitRequest(b"1", pool="a"), world.now)
    core.add_worker("w", ["a"], 1)
    book.dispatch(world.now)
    world.commit()
    world.crash()
    # Each restart finds it running (its worker is gone with the broker): it runs again, attempt counted.
    for attempt in (2, 3):
        world = World(tmp_path, now=world.now + 1)
        assert world.recovered["requeued"] == 1
        assert world.book.info(first.id).state == "queued"
        world.core.add_worker("w", ["a"], 1)
        assert [r.attempts for _, r, _ in world.book.dispatch(world.now)] == [attempt]
        world.commit()
        world.crash()
    world = World(tmp_path, now=world.now + 1)
    info = world.book.info(first.id)
    assert (info.state, info.attempts) == ("failed", 3) and "WorkerLost" in info.error


def test_a_delivery_lost_with_the_broker_does_not_use_up_a_retry(tmp_path):
    # max_retries counts runs whose handler raised. A dispatch the broker wrote and died before sending never
    # ran the handler: it counts as an attempt, and the task still gets every retry it asked for.
    world = World(tmp_path)
    task, _ = world.book.submit(SubmitRequest(b"x", pool="a", max_retries=1), world.now)
    world.core.add_worker("w", ["a"], 1)
    world.book.dispatch(world.now)
    world.commit()
    world.crash()
    world = World(tmp_path, now=world.now + 1)
    world.core.add_worker("w", ["a"], 1)
    for attempt, state in ((2, "delayed"), (3, "failed")):
        world.now += 60  # past any retry's backoff
        assert [(r.id, n) for _, r, n in world.book.dispatch(world.now)] == [(task.id, attempt)]
        world.book.complete("w", task.id, attempt, world.now, ok=False, error_type="Boom", error_message="no")
        world.core.grant("w", 1)
        assert world.book.info(task.id).state == state
    assert world.book.get(task.id).retries == 1


def test_max_deliveries_counts_lost_runs_not_failures(tmp_path):
    world = World(tmp_path)
    book, core = world.book, world.core
    task, _ = book.submit(SubmitRequest(b"x", pool="a", max_retries=10), world.now)
    core.add_worker("w1", ["a"], 1)
    for attempt in range(1, book.max_deliveries + 1):  # as many retries as a task may lose deliveries
        world.now += 60
        assert [n for _, _, n in book.dispatch(world.now)] == [attempt]
        book.complete("w1", task.id, attempt, world.now, ok=False, error_type="Boom", error_message="no")
        core.grant("w1", 1)
    world.now += 60
    book.dispatch(world.now)
    assert book.lose_worker("w1", world.now) == [book.get(task.id)]  # one lost run: it goes back
    assert book.info(task.id).state == "queued"


def test_deadlines_that_passed_while_down_expire_and_delays_hold(tmp_path):
    world = World(tmp_path)
    late, _ = world.book.submit(SubmitRequest(b"x", pool="a", deadline=5.0), world.now)
    later, _ = world.book.submit(SubmitRequest(b"y", pool="a", delay=60.0), world.now)
    world.commit()
    world.crash()
    world = World(tmp_path, now=world.now + 10)
    world.book.dispatch(world.now)
    assert world.book.info(late.id).state == "expired"
    assert world.book.info(later.id).state == "delayed"
    assert world.finished == [late.id]


def _committed_world(tmp_path: Path, commits: int) -> tuple[World, list[dict]]:
    world = World(tmp_path)
    pictures = [picture(world)]
    for n in range(commits):
        world.book.submit(SubmitRequest(bytes([n]) * 20, pool="a", key=f"k{n}"), world.now)
        world.commit()
        pictures.append(picture(world))
    world.crash()
    return world, pictures


def test_a_torn_tail_is_reported_and_cut_at_every_offset(tmp_path, caplog):
    world, pictures = _committed_world(tmp_path, 3)
    path = journal_path(tmp_path, world.journal.generation)
    whole = path.read_bytes()
    last_frame_at = [offset for offset, _ in frames.FrameReader(path)][-1]
    for cut in range(last_frame_at + 1, len(whole)):
        path.write_bytes(whole[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="cronoq.store"):
            again = World(tmp_path)
        assert picture(again) == pictures[2]
        assert f"{path}: torn tail at offset {last_frame_at}" in caplog.text
        assert path.stat().st_size == last_frame_at
        again.crash()


def _journal_files(data_dir: Path) -> list[str]:
    """The names of the files in data_dir, but the results store's and the fence (cronoq.store.journal.fence)."""
    return sorted(p.name for p in data_dir.iterdir() if not p.name.startswith(results.RESULTS) and p.name != "fence")


def _files(data_dir: Path) -> dict[str, bytes]:
    """Every file in data_dir and its bytes (the lock file included; not the fence, where every start that took
    the lock records its generation before it reads anything: cronoq.store.journal.fence)."""
    return {p.name: p.read_bytes() for p in sorted(data_dir.iterdir()) if p.is_file() and p.name != "fence"}


@pytest.mark.parametrize("frame", [0, 2, 3])
def test_a_corrupt_frame_followed_by_intact_ones_refuses_to_start_and_changes_nothing(tmp_path, frame):
    world, _ = _committed_world(tmp_path, 4)
    path = journal_path(tmp_path, world.journal.generation)
    offsets = [offset for offset, _ in frames.FrameReader(path)]
    data = bytearray(path.read_bytes())
    data[offsets[frame] + frames.HEADER_SIZE + 3] ^= 0x10  # one bit inside the header frame, or a commit
    path.write_bytes(bytes(data))
    (tmp_path / "snapshot.tmp").write_bytes(b"half a snapshot")  # a leftover that a successful start removes
    before = _files(tmp_path)
    with pytest.raises(DamagedFile) as refused:
        World(tmp_path)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{path} is damaged at offset {offsets[frame]}: a frame of ")
    assert f"checksum does not match; intact frames follow at offset {offsets[frame + 1]}; refusing" in message
    assert message.endswith("run: cronoq-broker --repair")
    assert _files(tmp_path) == before
def test_compaction_keeps_the_state_and_drops_old_journals(tmp_path):
    world = World(tmp_path, compact_min_bytes=1, compact_ratio=2)
    random_workload(world, random.Random(7), 400)
    world.commit()
    assert world.journal.wants_compaction(len(world.book.records))
    world.journal.compact(world.book.kept(), world.book.paused_pools())
    random_workload(world, random.Random(8), 50)
    world.commit()
    expected = picture(world)
    world.crash()
    assert _journal_files(tmp_path) == ["journal.00000002", "lock", SNAPSHOT]
    again = World(tmp_path, now=world.now)
    assert picture(again) == expected


def _dispatch_order(world: World) -> tuple[list[str], dict[str | None, list[str]]]:
    """Every task pool a dispatches, in order; then pool b's, per tenant (a fair pool's tags start afresh after
    a restart, so only each tenant's own order is the same on both sides)."""
    book, core = world.book, world.core
    for pool in book.paused_pools():
        book.resume(pool)
    core.add_worker("order-a", ["a"], 10_000)
    in_a = [record.id for _, record, _ in book.dispatch(world.now)]
    core.add_worker("order-b", ["b"], 10_000)
    in_b: dict[str | None, list[str]] = {}
    for _, record, _ in book.dispatch(world.now):
        in_b.setdefault(record.tenant, []).append(record.id)
    return in_a, in_b


@pytest.mark.parametrize("seed", range(4))
def test_a_snapshot_keeps_every_queued_task_in_its_place(tmp_path, seed):
    # The book's map of records keeps no order: the snapshot sorts live records by when they last entered their
    # queue (retries and lost workers' tasks go to the back; delayed ones join when they become due).
    world = World(tmp_path, compact_min_bytes=1, compact_ratio=2, ttl=1e9)
    random_workload(world, random.Random(seed), 600)
    for worker in world.core.workers():  # none running: a restart would requeue those in an order of its own
        world.book.lose_worker(worker, world.now)
    world.commit()
    world.journal.compact(world.book.kept(), world.book.paused_pools())
    expected = _dispatch_order(world)  # not committed: the crash forgets these dispatches
    assert len(expected[0]) >= 5 and sum(map(len, expected[1].values())) >= 5
    world.crash()
    again = World(tmp_path, now=world.now, ttl=1e9)
    assert _dispatch_order(again) == expected


def test_a_sync_owes_the_journal_a_retired_generation_left_unsynced(tmp_path):
    """A new generation (a compaction) must not drop the fdatasync the old journal file still needs, and the
    files handed to the sync thread are all closed once synced."""
    world = World(tmp_path, compact_min_bytes=1, compact_ratio=2)
    world.journal.sync()
    random_workload(world, random.Random(7), 50)
    world.commit()
    retired = os.fstat(world.journal._fd).st_ino
    world.journal.compact(world.book.kept(), world.book.paused_pools())
    random_workload(world, random.Random(8), 10)
    world.commit()
    owed = world.journal.take_unsynced()
    assert [os.fstat(fd).st_ino for fd in owed] == [retired, os.fstat(world.journal._fd).st_ino]
    assert world.journal.take_unsynced() == []  # nothing written since: nothing owed
    sync_files(owed)
    for fd in owed:
        with pytest.raises(OSError):
            os.fstat(fd)  # closed: the sync thread owns what it is given
    world.crash()


def test_a_compaction_cut_short_leaves_a_recoverable_directory(tmp_path, monkeypatch):
    world = World(tmp_path, compact_min_bytes=1, compact_ratio=2)
    random_workload(world, random.Random(3), 200)
    world.commit()
    world.journal.compact(world.book.kept(), world.book.paused_pools())  # snapshot generation 2
    random_workload(world, random.Random(4), 100)

    def die_while_writing(path, bodies):
        path.with_name(path.name + ".tmp").write_bytes(b"half a snapshot")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(frames, "write_atomically", die_while_writing)
    with pytest.raises(OSError):
        world.journal.compact(world.book.kept(), world.book.paused_pools())
    # The old snapshot, journal 2 and the new journal 3 together still hold everything.
    random_workload(world, random.Random(5), 50)
    world.commit()
    expected = picture(world)
    world.crash()
    monkeypatch.undo()
    again = World(tmp_path, now=world.now)
    assert picture(again) == expected
    assert not list(tmp_path.glob("*.tmp"))


def test_a_data_dir_serves_one_broker_at_a_time(tmp_path):
    world = World(tmp_path)
    with pytest.raises(StoreError, match=f"data_dir {tmp_path} is in use by another broker \\(pid {os.getpid()}\\)"):
        Journal.open(tmp_path)
    world.journal.close()
    Journal.open(tmp_path)[0].close()


def test_a_damaged_snapshot_or_an_unknown_format_refuses_to_start(tmp_path):
    world = World(tmp_path, compact_min_bytes=1, compact_ratio=0)
    world.book.submit(SubmitRequest(b"x", pool="a"), world.now)
    world.journal.compact(world.book.kept(), world.book.paused_pools())
    world.journal.close()
    snapshot = tmp_path / SNAPSHOT
    whole = snapshot.read_bytes()
    snapshot.write_bytes(whole[:-3])
    before = _files(tmp_path)
    end_at = len(whole) - frames.HEADER_SIZE - 7  # the End record's frame: 7 bytes of body
    with pytest.raises(DamagedFile, match=f"^{snapshot} is damaged at offset {end_at}: a frame of 7 bytes "
                                          "cut off after 4 by the end of the file; refusing to start"):
        Journal.open(tmp_path)
    assert _files(tmp_path) == before
    snapshot.write_bytes(whole)
    journal = journal_path(tmp_path, 2)
    journal.write_bytes(b"")
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND)
    frames.append(fd, b"\x91\x94\xa6cronoq\xa7journal\x63\x02")  # [["cronoq", "journal", 99, 2]]
    os.close(fd)
    with pytest.raises(StoreError, match="format 99"):
        Journal.open(tmp_path)


class _Deferred(concurrent.futures.Executor):
    """Runs what it is given only when told to: the moment a writer thread gets to a frame, chosen by the test."""

    def __init__(self) -> None:
        self.waiting: list[tuple[concurrent.futures.Future, object, tuple]] = []

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.waiting.append((future, fn, args))
        return future

    def run_all(self) -> None:
        for future, fn, args in self.waiting:
            future.set_result(fn(*args))
        self.waiting.clear()


def test_a_frame_written_after_a_sync_began_is_still_owed_a_sync(tmp_path):
    world = World(tmp_path)
    random_workload(world, random.Random(3), 20)
    world.commit()
    world.journal.sync()
    world.book.submit(SubmitRequest(b"x", pool="a"), world.now)  # one change, pending
    writer = _Deferred()
    writing = world.journal.commit_in_background(writer)
    assert writing is not None and world.journal.writing
    assert world.journal.take_unsynced() == [], "nothing is on disk yet: a sync now would not cover the frame"
    writer.run_all()
    world.journal.wait_for_write()
    owed = world.journal.take_unsynced()
    assert len(owed) == 1, "the frame, written after that sync began, is owed the next one"
    sync_files(owed)
    world.crash()


async def test_a_big_frame_the_writer_thread_cannot_write_stops_the_broker_without_confirming(tmp_path):
    """A frame big enough for the journal's writer thread: the pass's replies wait for it, the loop does not,
    and when the write fails they are never sent."""
    from cronoq.wire import protocol
    from cronoq.broker.durable import WRITE_IN_THREAD_BYTES

    broker, good_fd = _broker_whose_journal_refuses_writes(tmp_path)
    body = msgspec.msgpack.encode(b"x" * WRITE_IN_THREAD_BYTES)
    broker._requests.on_message(peer(b"client"), [b"client", b"", protocol.encode(protocol.Submit(1, 7)), body],
                                1000.0)
    assert broker._commit(), "the write went to the writer thread..."
    assert broker._writing is not None and not broker._to_clients, "...with the accepted reply sealed until done"
    writing, sealed_replies, _ = broker._writing
    await asyncio.to_thread(writing.exception)  # the write is over (it failed)
    broker._on_written()
    assert broker.failure and "cannot write the journal" in broker.failure
    assert broker._writing is None
    assert sealed_replies, "the sealed reply was dropped with the write: sending would have emptied it"
    os.close(good_fd)
    broker.close()
    assert Journal.open(tmp_path / "data")[1].records == {}


def test_replay_skips_changes_of_unknown_tasks():
    from cronoq.store.journal.records import Dispatched, Finished

    replay = Replay()
    replay.apply(Dispatched("nobody", 1, 0.0))
    replay.apply(Finished("nobody", "succeeded", 0.0))
    assert replay.records == {} and replay.orphans == 2


def _broker_whose_journal_refuses_writes(tmp_path: Path):
    """An in-process broker (not serving) whose journal fails every write; returns it and the journal's own fd,
    for the test to close."""
    from cronoq.broker.server import Broker
    from cronoq.broker.config import parse_config

    config = parse_config({"broker": {"data_dir": str(tmp_path / "data")}}, source="test", base_dir=tmp_path,
                          environ={})
    broker = Broker(config, clock=lambda: 1000.0)
    broker.open()
    journal = broker._data.journal
    good_fd = journal._fd
    journal._fd = os.open(tmp_path / "data" / "lock", os.O_RDONLY)  # as if the disk refused every write
    return broker, good_fd


def test_a_journal_that_cannot_be_written_stops_the_broker_without_confirming(tmp_path):
    from cronoq.wire import protocol

    broker, good_fd = _broker_whose_journal_refuses_writes(tmp_path)
    broker._requests.on_message(peer(b"client"), [b"client", b"", protocol.encode(protocol.Submit(1, 7)), b"\xc0"], 1000.0)
    assert broker._to_clients, "an accepted reply is ready..."
    assert not broker._commit()
    assert broker.failure and "cannot write the journal" in broker.failure
    assert not broker._to_clients, "...and never sent, since the task is not on disk"
    os.close(good_fd)
    broker.close()
    assert Journal.open(tmp_path / "data")[1].records == {}


def test_the_broker_compacts_a_journal_grown_much_larger_than_its_state(tmp_path):
    from cronoq.wire import protocol
    from cronoq.broker.server import Broker
    from cronoq.broker.config import parse_config

    config = parse_config({"broker": {"data_dir": str(tmp_path / "data")}}, source="test", base_dir=tmp_path,
                          environ={})
    broker = Broker(config, clock=lambda: 1000.0)
    broker.open()
    ids = []
    for rid in range(1, 201):  # 200 tasks accepted and cancelled: 400 records, none left in memory
        broker._requests.on_message(peer(b"c"), [b"c", b"", protocol.encode(protocol.Submit(1, rid)), b"\xc0"], 1000.0)
        [(_, accepted, _)] = broker._to_clients.items()
        broker._to_clients.clear()
        ids.append(accepted.id)
        broker._requests.on_message(peer(b"c"), [b"c", b"", protocol.encode(protocol.Cancel(1, rid, accepted.id))],
                                    1000.0)
        broker._to_clients.clear()
    assert broker._commit()
    broker._to_clients.clear()
    journal = broker._data.journal
    journal.compact_min_bytes, journal.compact_ratio = 1, 1.5
    broker._compact_if_worthwhile()
    assert journal.generation == 2 and journal.compacting is not None, "a child writes the snapshot"
    while journal.compacting is not None:  # each tick looks in on the child; the one after it is done installs
        time.sleep(0.01)
        broker._compact_if_worthwhile()
    assert journal.records == 0 and broker._data.compactions == 1
    broker.close()
    # journal 3 is the next compaction's, made ahead of time (empty: harmless to recovery, which replays it too)
    assert _journal_files(tmp_path / "data") == ["journal.00000002", "journal.00000003", "lock", SNAPSHOT]
    again = Broker(config, clock=lambda: 1000.0)
    again.open()
    assert {again._book.info(task_id).state for task_id in ids} == {"cancelled"}
    again.close()


# --------------------------------------------------------------------- compaction in a forked child


def _hold_compaction(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Make the next compaction child stop after its snapshot's first frame until the returned file is gone."""
    from cronoq.store.journal.compaction import HOLD_ENV

    hold = tmp_path.parent / f"{tmp_path.name}-hold"
    monkeypatch.setenv(HOLD_ENV, str(hold))
    return hold


def _wait_for(path: Path) -> int:
    end = time.monotonic() + 30
    while not path.exists() or not path.read_text():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.01)
    return int(path.read_text())


def _busy_world(tmp_path: Path, seed: int) -> World:
    world = World(tmp_path, compact_min_bytes=1, compact_ratio=1, ttl=1e9)
    random_workload(world, random.Random(seed), 300)
    world.commit()
    return world


def _start_compaction(world: World, from_files: bool) -> None:
    world.journal.start_compaction(world.book.kept, world.book.paused_pools(), from_files=from_files,
                                   archived_through=world.archive.archived_through)


WAYS = pytest.mark.parametrize("from_files", [False, True], ids=["forked", "from the files"])


@WAYS
def test_a_background_compaction_writes_while_the_book_carries_on(tmp_path, from_files):
    world = _busy_world(tmp_path, 21)
    _start_compaction(world, from_files)
    assert world.journal.compacting.forked is not from_files
    assert world.journal.generation == 2
    random_workload(world, random.Random(22), 100)  # meanwhile, into journal 2
    world.commit()
    end = time.monotonic() + 30
    while world.journal.poll_compaction() is None:
        assert time.monotonic() < end
        time.sleep(0.01)
    assert world.journal.compacting is None
    assert _journal_files(tmp_path) == ["journal.00000002", "lock", SNAPSHOT]
    expected = picture(world)
    world.crash()
    again = World(tmp_path, now=world.now, ttl=1e9)
    again.settle()
    assert picture(again) == expected


@WAYS
@pytest.mark.parametrize("when", ["child writing", "child done, not installed", "installed, old journal left"])
def test_a_crash_at_any_point_of_a_background_compaction_loses_nothing(tmp_path, monkeypatch, when, from_files):
    hold = _hold_compaction(monkeypatch, tmp_path) if when == "child writing" else None
    world = _busy_world(tmp_path, 23)
    _start_compaction(world, from_files)
    running = world.journal.compacting
    assert running is not None
    random_workload(world, random.Random(24), 50)
    world.commit()
    if hold is not None:
        _wait_for(hold)
        assert (tmp_path / "snapshot.tmp").exists()
    elif when == "child done, not installed":
        while not running.poll():  # the child is done; the broker dies before its next tick installs it
            time.sleep(0.01)
        world.journal.compacting = None
        assert (tmp_path / "snapshot.tmp").exists()
    else:
        from cronoq.store.journal import journal as journal_module

        def die(data_dir, generation):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(journal_module, "_delete_journals_before", die)
        while True:
            try:
                if world.journal.poll_compaction() is not None:
                    break
            except OSError:
                break
            time.sleep(0.01)
        assert (tmp_path / "journal.00000001").exists() and not (tmp_path / "snapshot.tmp").exists()
        monkeypatch.undo()
    expected = picture(world)
    paused = world.book.paused_pools()
    world.crash()  # like kill -9: on Linux the child dies with the broker (PR_SET_PDEATHSIG)
    if hold is not None:
        hold.unlink()
        monkeypatch.undo()
    again = World(tmp_path, now=world.now, ttl=1e9)
    again.settle()
    assert picture(again) == expected and again.book.paused_pools() == paused
    assert not (tmp_path / "snapshot.tmp").exists()


def test_a_compaction_from_the_files_refuses_a_damaged_journal_and_changes_nothing(tmp_path):
    """The files before the new journal were written whole: a child reading them back that finds a bad frame
    says where, and nothing is replaced (the broker logs it and tries again later)."""
    world = _busy_world(tmp_path, 27)
    journal = tmp_path / "journal.00000001"
    data = bytearray(journal.read_bytes())
    data[len(data) // 2] ^= 0xFF
    journal.write_bytes(bytes(data))
    before = _files(tmp_path)
    _start_compaction(world, from_files=True)
    with pytest.raises(OSError, match="journal.00000001.*damaged"):
        while world.journal.poll_compaction() is None:
            time.sleep(0.01)
    after = _files(tmp_path)
    assert not (tmp_path / "snapshot.tmp").exists() and not (tmp_path / SNAPSHOT).exists()
    assert after["journal.00000001"] == before["journal.00000001"], "the damaged journal is left as it was"


@WAYS
def test_a_killed_compaction_child_changes_nothing_and_a_later_one_succeeds(tmp_path, monkeypatch, from_files):
    hold = _hold_compaction(monkeypatch, tmp_path)
    world = _busy_world(tmp_path, 25)
    before = _files(tmp_path)
    _start_compaction(world, from_files)
    child = _wait_for(hold)
    os.kill(child, 9)
    hold.unlink()
    monkeypatch.undo()
    with pytest.raises(OSError, match="killed by signal 9"):
        while world.journal.poll_compaction() is None:
            time.sleep(0.01)
    assert not (tmp_path / "snapshot.tmp").exists()
    after = _files(tmp_path)
    assert {name: data for name, data in after.items() if name in before and name.startswith("journal")} == \
        {name: data for name, data in before.items() if name.startswith("journal")}, "the old journal is untouched"
    random_workload(world, random.Random(26), 50)
    world.commit()
    _start_compaction(world, from_files)
    while world.journal.poll_compaction() is None:
        time.sleep(0.01)
    assert _journal_files(tmp_path) == ["journal.00000003", "lock", SNAPSHOT]
    expected = picture(world)
    world.crash()
    again = World(tmp_path, now=world.now, ttl=1e9)
    again.settle()
    assert picture(again) == expected


# --------------------------------------------------------------------- a read-back started by the housekeeper


@pytest.fixture
def housekeeper():
    """The broker's housekeeping thread: one thread that lives as long as the journal using it."""
    thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="test-housekeeping")
    yield thread
    thread.shutdown(wait=True)


def _child_of_thread(thread_id: int, pid: int) -> bool:
    """Whether process `pid` was started by this process's thread `thread_id` (Linux: its children file)."""
    return str(pid) in Path(f"/proc/self/task/{thread_id}/children").read_text().split()


def _drained(thread: concurrent.futures.Executor) -> None:
    """Return once everything handed to the one thread so far is done (an install, a spare journal)."""
    thread.submit(int).result()


def test_a_read_back_started_by_the_housekeeper_runs_from_the_rotation_and_is_its_child(tmp_path, monkeypatch,
                                                                                        housekeeper):
    hold = _hold_compaction(monkeypatch, tmp_path)
    world = _busy_world(tmp_path, 31)
    world.journal.housekeeper = housekeeper
    started = []
    world.journal.start_compaction(world.book.kept, world.book.paused_pools(), from_files=True,
                                   archived_through=world.archive.archived_through, started=started.append)
    running = world.journal.compacting
    assert running is not None and not running.forked and world.journal.generation == 2
    assert not world.journal.wants_compaction(0), "no second compaction while the first one is being started"
    assert world.journal.poll_compaction() is None
    random_workload(world, random.Random(32), 100)  # meanwhile, into journal 2
    world.commit()
    child = _wait_for(hold)
    assert [s.pid for s in started] == [child]
    thread_id = housekeeper.submit(threading.get_native_id).result()
    assert thread_id != threading.get_native_id() and _child_of_thread(thread_id, child), \
        "the housekeeping thread started it (it dies when that thread ends: PR_SET_PDEATHSIG)"
    hold.unlink()
    end = time.monotonic() + 30
    while world.journal.poll_compaction() is None:
        assert time.monotonic() < end
        time.sleep(0.01)
    assert running.pid == child and running.spawn_seconds > 0
    _drained(housekeeper)
    assert _journal_files(tmp_path) == ["journal.00000002", "journal.00000003", "lock", SNAPSHOT]
    expected = picture(world)
    world.crash()
    again = World(tmp_path, now=world.now, ttl=1e9)
    again.settle()
    assert picture(again) == expected


def test_a_read_back_the_housekeeper_cannot_start_changes_nothing_and_a_later_one_succeeds(tmp_path, monkeypatch,
                                                                                          housekeeper):
    """A start that fails in the housekeeping thread (here: no interpreter to run) is `poll_compaction`'s
    OSError, as a child that failed is: the broker logs it and tries again later."""
    world = _busy_world(tmp_path, 33)
    world.journal.housekeeper = housekeeper
    before = _files(tmp_path)
    monkeypatch.setattr(sys, "executable", str(tmp_path.parent / "no-such-python"))
    _start_compaction(world, from_files=True)
    assert world.journal.compacting is not None
    with pytest.raises(OSError, match="no-such-python|No such file"):
        end = time.monotonic() + 30
        while world.journal.poll_compaction() is None:
            assert time.monotonic() < end
            time.sleep(0.01)
    assert world.journal.compacting is None
    _drained(housekeeper)
    after = _files(tmp_path)
    assert not (tmp_path / "snapshot.tmp").exists() and not (tmp_path / SNAPSHOT).exists()
    assert after["journal.00000001"] == before["journal.00000001"], "the old journal is untouched"
    monkeypatch.undo()
    random_workload(world, random.Random(34), 50)
    world.commit()
    _start_compaction(world, from_files=True)
    end = time.monotonic() + 30
    while world.journal.poll_compaction() is None:
        assert time.monotonic() < end
        time.sleep(0.01)
    _drained(housekeeper)
    assert "journal.00000001" not in _journal_files(tmp_path) and (tmp_path / SNAPSHOT).exists()
    expected = picture(world)
    world.crash()
    again = World(tmp_path, now=world.now, ttl=1e9)
    again.settle()
    assert picture(again) == expected


@pytest.mark.parametrize("when", ["start queued behind other file work", "child writing"])
def test_a_crash_while_the_housekeeper_starts_or_runs_a_read_back_loses_nothing(tmp_path, monkeypatch, housekeeper,
                                                                                when):
    hold = _hold_compaction(monkeypatch, tmp_path)
    world = _busy_world(tmp_path, 35)
    world.journal.housekeeper = housekeeper
    busy = threading.Event()
    if when == "start queued behind other file work":
        housekeeper.submit(busy.wait, 30)  # a slow fsync, say: the start waits behind it
    started = []
    world.journal.start_compaction(world.book.kept, world.book.paused_pools(), from_files=True,
                                   archived_through=world.archive.archived_through, started=started.append)
    random_workload(world, random.Random(36), 50)
    world.commit()
    child = _wait_for(hold) if when == "child writing" else None
    expected = picture(world)
    if child is None:
        world.journal.cancel_compaction()  # as a crash's abandon() does first: the start has not begun
        assert world.journal.compacting is None
        busy.set()  # (abandon() then waits for the spare journal, queued behind the slow work too)
    world.crash()  # stops the child the thread started, and waits for it
    _drained(housekeeper)
    if child is None:
        assert started == [], "a start that had not begun never happens"
    else:
        assert not Path(f"/proc/{child}").exists(), "the child was stopped and reaped"
    hold.unlink(missing_ok=True)
    monkeypatch.undo()
    again = World(tmp_path, now=world.now, ttl=1e9)
    again.settle()
    assert picture(again) == expected
    assert not (tmp_path / "snapshot.tmp").exists()


# --------------------------------------------------------------------- the results store and its archiver


def test_a_killed_archiver_is_replaced_and_given_everything_still_in_memory(tmp_path, monkeypatch):
    from cronoq.store.results import shipping as archive_module

    monkeypatch.setattr(archive_module, "RESPAWN_INTERVAL", 0.0)
    world = World(tmp_path, ttl=1e9)
    random_workload(world, random.Random(31), 200)
    world.commit()
    world.settle()
    assert world.archive.pid is not None
    os.kill(world.archive.pid, signal.SIGSTOP)  # it reads nothing more...
    random_workload(world, random.Random(32), 200)
    world.commit()
    unstored = [record.id for record in world.book.finished]
    assert unstored
    before = picture(world)
    world.archive.kill()  # ...and dies with those tasks sent but not stored
    random_workload(world, random.Random(33), 100)
    world.commit()
    end = time.monotonic() + 30
    while world.archive.respawns == 0:
        assert time.monotonic() < end
        world.commit()
        time.sleep(0.01)
    world.settle()
    assert len(world.book.finished) == 0, "everything finished is in the store now"
    expected = picture(world)
    assert {task_id: expected.get(task_id) for task_id in unstored} == {task_id: before[task_id] for task_id in unstored}
    world.crash()
    again = World(tmp_path, now=world.now, ttl=1e9)
    again.settle()
    assert picture(again) == expected


def test_finished_records_leave_memory_once_stored_and_answer_from_the_store(tmp_path):
    world = World(tmp_path, ttl=1e9)
    world.core.add_worker("w", ["a"], 1000)
    handles = [world.book.submit(SubmitRequest(bytes([n]), pool="a", key=f"k{n}", submission=f"s{n}"), world.now)[0]
               for n in range(100)]
    for _, record, attempt in world.book.dispatch(world.now):
        world.book.complete("w", record.id, attempt, world.now, ok=True, result=record.payload)
    world.commit()
    world.settle()
    assert world.book.records == {} and world.archive.rows == 100
    for n, record in enumerate(handles):
        stored = world.book.get(record.id)
        assert stored is not record and (stored.state, stored.result, stored.key) == ("succeeded", bytes([n]), f"k{n}")
        assert world.book.submit(SubmitRequest(b"x", pool="a", key=f"k{n}"), world.now) == (stored, True)
        again, duplicate = world.book.submit(SubmitRequest(b"x", pool="a", submission=f"s{n}"), world.now)
        assert not duplicate and again.id == record.id  # a re-send, answered as the first send was
    fresh, duplicate = world.book.submit(SubmitRequest(b"x", pool="a", key="k100"), world.now)
    assert not duplicate and fresh.id not in {r.id for r in handles}


def _finished_and_stored(tmp_path, count: int) -> World:
    world = World(tmp_path, ttl=1e9)
    world.core.add_worker("w", ["a"], 1000)
    for n in range(count):
        world.book.submit(SubmitRequest(bytes([n]), pool="a"), world.now)
    for _, record, attempt in world.book.dispatch(world.now):
        world.book.complete("w", record.id, attempt, world.now, ok=True, result=record.payload)
    world.commit()
    world.archive.catch_up()
    assert world.archive.rows == count and len(world.book.finished) == count
    return world


def test_records_the_store_confirmed_leave_memory_a_batch_per_exchange(tmp_path, monkeypatch):
    """Forgetting 10^5 confirmed records in one go held the loop: an exchange lets go of RELEASE_CHUNK at a
    time until RELEASE_BUDGET has passed (here none: one chunk), and every later exchange (each pass of the
    broker) takes the next, even with nothing new to ship."""
    monkeypatch.setattr("cronoq.book.taskbook.RELEASE_CHUNK", 30)
    monkeypatch.setattr("cronoq.book.taskbook.RELEASE_BUDGET", 0.0)
    world = _finished_and_stored(tmp_path, 100)
    left = []
    for listen in (True, False, False, False):  # then as after each commit: nothing new shipped or heard
        world.archive.exchange(world.book, listen=listen)
        left.append(len(world.book.finished))
    assert left == [70, 40, 10, 0]
    assert world.book.records == {} and not world.book.finished.releasable(world.archive.archived_through)


def test_an_exchange_lets_go_of_chunks_until_its_budget_is_spent(tmp_path, monkeypatch):
    """The bound is time, not a count (a page copied under a compaction's child makes each record cost ten
    times more): with time to spare, one exchange lets go of every confirmed record, a chunk after another."""
    monkeypatch.setattr("cronoq.book.taskbook.RELEASE_CHUNK", 30)
    monkeypatch.setattr("cronoq.book.taskbook.RELEASE_BUDGET", 3600.0)
    world = _finished_and_stored(tmp_path, 100)
    world.archive.exchange(world.book, listen=True)
    assert len(world.book.finished) == 0 and world.book.records == {}


def test_while_the_store_falls_behind_only_a_trickle_is_dispatched_and_at_twice_the_limit_none(tmp_path):
    from cronoq.book.taskbook import GATED_DISPATCHES

    world = World(tmp_path, ttl=1e9)
    world.book.max_unarchived = 20
    world.core.add_worker("w", ["a"], 1000)
    for n in range(200):
        world.book.submit(SubmitRequest(bytes([n % 256]), pool="a"), world.now)

    def finish(count: int) -> None:  # finished, and not confirmed by the store: nobody listens to it here
        for record in [r for r in world.book.records.values() if r.state == "running"][:count]:
            world.book.complete("w", record.id, record.attempts, world.now, ok=True, result=b"")

    running = world.book.dispatch(world.now)
    assert len(running) == 200  # nothing waits for the store yet: every free slot is filled
    finish(20)
    assert len(world.book.finished) == 20
    for n in range(20):
        world.book.submit(SubmitRequest(b"x", pool="a"), world.now)
    assert len(world.book.dispatch(world.now)) == GATED_DISPATCHES  # 20 wait for the store: a trickle
    finish(20)
    assert len(world.book.finished) == 40 and world.book.dispatch(world.now) == []  # twice the limit: none
    world.commit()
    world.settle()  # the store confirms them: they leave memory, and dispatching resumes
    assert len(world.book.finished) == 0 and len(world.book.dispatch(world.now)) == 20 - GATED_DISPATCHES


def test_the_store_drops_the_oldest_past_result_ttl_and_over_the_byte_budget(tmp_path):
    world = World(tmp_path, ttl=50.0, max_bytes=1 << 30)
    world.core.add_worker("w", ["a"], 1000)
    order = []
    for step in range(100):  # one task finishes each second
        world.now += 1.0
        record, _ = world.book.submit(SubmitRequest(b"x", pool="a", key=f"k{step}"), world.now)
        [(_, dispatched, attempt)] = world.book.dispatch(world.now)
        world.book.complete("w", dispatched.id, attempt, world.now, ok=True, result=b"r" * 100)
        world.commit()
        order.append(record.id)
    world.settle()
    known = [_known(world, task_id) for task_id in order]
    assert known == [False] * 50 + [True] * 50, "exactly those older than result_ttl are gone"
    world.book.set_retention(1e9, 20 * (world.archive.bytes // world.archive.rows))  # room for about 20
    world.settle()
    known = [_known(world, task_id) for task_id in order]
    kept = sum(known)
    assert 15 <= kept <= 21 and known == [False] * (100 - kept) + [True] * kept, "the oldest go first"
    again, duplicate = world.book.submit(SubmitRequest(b"x", pool="a", key=f"k{99 - kept}"), world.now)
    assert not duplicate, "a forgotten task's key is free again"


def _known(world: World, task_id: str) -> bool:
    try:
        world.book.get(task_id)
    except NotFound:
        return False
    return True


def test_a_format_1_data_dir_is_read_and_its_finished_tasks_go_to_the_store(tmp_path):
    from cronoq.store.journal.records import Accepted, Finished, Header, Kept, Paused, encode

    fd = os.open(tmp_path / "journal.00000001", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    frames.append(fd, encode([Header("journal", 1, 1)]))
    frames.append(fd, encode([Accepted("t0", "a", "acme", 1, b"p0", 1000.0, key="k0", submission="s0"),
                              Accepted("t1", "a", None, 2, b"p1", 1000.0)]))
    frames.append(fd, encode([Finished("t0", "succeeded", 1001.0, b"r0"), Paused("b", True)]))
    os.close(fd)
    # A format 1 snapshot of generation 1 would come first; the journal alone is a valid start as well. Add one.
    snapshot = [encode([Header("snapshot", 1, 1)]),
                encode([Kept("t2", "b", "globex", 0, "queued", 999.0, payload=b"p2", submission="s2")]),
                encode([msgspec.defstruct("End", [("count", int)], tag="end", array_like=True)(1)])]
    frames.write_atomically(tmp_path / SNAPSHOT, snapshot)
    world = World(tmp_path, ttl=1e9)
    world.settle()
    assert world.book.info("t0").state == "succeeded" and world.book.get("t0").result == b"r0"
    assert world.book.info("t1").state == "queued" and world.book.info("t2").state == "queued"
    assert world.book.get("t2").payload == b"p2" and world.book.paused_pools() == ["b"]
    assert "t0" not in world.book.records, "numbered and moved to the results store"
    assert world.book.submit(SubmitRequest(b"x", pool="a", tenant="acme", key="k0"), world.now)[1]


# --------------------------------------------------------------------- how each attempt ended


def _fail(world: World, task_id: str, message: str, worker: str = "w") -> None:
    """Dispatch the task (past any backoff) and have its handler raise."""
    world.now += 120
    [(_, record, attempt)] = world.book.dispatch(world.now)
    assert record.id == task_id
    world.book.complete(worker, task_id, attempt, world.now, ok=False, error_type="ValueError",
                        error_message=message)
    world.core.grant(worker, 1)
    world.commit()


def _history(world: World, task_id: str) -> list[tuple]:
    return [(e.attempt, e.ended, e.at, e.error) for e in world.book.explain(task_id, world.now).history]


def test_a_task_keeps_its_last_16_attempt_ends_clipped_through_crashes_and_compaction(tmp_path):
    KEPT_ATTEMPT_ENDS, ATTEMPT_ERROR_CHARS = 16, 200  # as docs/api.md says

    world = World(tmp_path, compact_min_bytes=1, compact_ratio=2)
    task, _ = world.book.submit(SubmitRequest(b"x", pool="a", max_retries=100), world.now)
    world.core.add_worker("w", ["a"], 1)
    runs = KEPT_ATTEMPT_ENDS + 4
    for run in range(1, runs + 1):
        _fail(world, task.id, f"run {run} " + "!" * (run * 10))  # the later errors are too long
    before = _history(world, task.id)
    assert [end[:2] for end in before[:4]] == [(n, "unknown") for n in range(1, 5)], "only the last 16 are kept"
    assert [end[:2] for end in before[4:]] == [(n, "retried") for n in range(5, runs + 1)]
    assert before[4][3] == "ValueError: run 5 " + "!" * 50
    assert all(len(end[3]) <= ATTEMPT_ERROR_CHARS for end in before[4:]) and before[-1][3].endswith("…")
    assert before[-1][3].startswith(f"ValueError: run {runs} !!!")
    world.crash()

    world = World(tmp_path, now=world.now, compact_min_bytes=1, compact_ratio=2)  # from the journal
    assert _history(world, task.id) == before
    world.journal.compact(world.book.kept(), world.book.paused_pools())
    world.crash()
    world = World(tmp_path, now=world.now)  # from the snapshot alone
    assert world.journal.generation > 1 and _history(world, task.id) == before
    # One more failure after the snapshot: the oldest kept end gives way, in the journal as in memory.
    world.core.add_worker("w", ["a"], 1)
    _fail(world, task.id, "once more")
    expected = _history(world, task.id)
    assert expected[4][1] == "unknown" and expected[-1][1:] == ("retried", world.now, "ValueError: once more")
    world.crash()
    assert _history(World(tmp_path, now=world.now), task.id) == expected


def test_lost_deliveries_are_kept_and_the_last_is_told_by_the_failure(tmp_path):
    world = World(tmp_path)
    book, core = world.book, world.core
    task, _ = book.submit(SubmitRequest(b"x", pool="a"), world.now)
    for attempt in range(1, book.max_deliveries + 1):
        core.add_worker(f"w{attempt}", ["a"], 1)
        book.dispatch(world.now)
        world.now += 1
        book.lose_worker(f"w{attempt}", world.now)
        world.commit()
    before = _history(world, task.id)
    lost = f"WorkerLost: the task's worker was lost on 3 of its 3 deliveries (max_deliveries = 3)"
    assert before == [(1, "worker_lost", 1001.0, None), (2, "worker_lost", 1002.0, None), (3, "failed", 1003.0, lost)]
    world.crash()
    assert _history(World(tmp_path, now=world.now), task.id) == before


def test_data_files_without_attempt_ends_read_as_unknown_and_go_on_keeping_new_ones(tmp_path):
    """Files an earlier version wrote (format 2, before records kept how attempts ended): a snapshot's records
    have no `attempt_ends`, a journal's requeues no `ended`. They read as before; new ends are kept."""
    from cronoq.book.records import stored_form
    from cronoq.store.journal.records import AcceptedEntry, Dispatched, End, Header, encode

    old_requeued = msgspec.defstruct("Requeued", [("id", str), ("not_before", float), ("error_type", str),
                                                  ("error_message", str), ("traceback", str), ("retries", int)],
                                     tag="r", array_like=True)
    snapshotted = TaskRecord("t0", "a", None, 2, b"p0", 990.0, max_retries=5, attempts=2, retries=2,
                             error_type="ValueError", error_message="second", not_before=995.0)
    old_form = stored_form(snapshotted)[:TaskRecord.__struct_fields__.index("retries") + 2]  # the tag, then
    assert old_form[-1] == 2  # the stored fields up to `retries`: no attempt_ends
    frames.write_atomically(tmp_path / SNAPSHOT, [
        encode([Header("snapshot", 2, 1)]), encode([old_form]), encode([End(1)])])
    fd = os.open(journal_path(tmp_path, 1), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    frames.append(fd, encode([Header("journal", 2, 1)]))
    frames.append(fd, encode([AcceptedEntry("t1", "a", None, 2, b"p1", 995.0, max_retries=5),
                              Dispatched("t1", 1, 996.0)]))
    frames.append(fd, encode([old_requeued("t1", 997.0, "ValueError", "first", "", 1)]))
    os.close(fd)

    world = World(tmp_path, ttl=1e9)
    assert [end[:2] for end in _history(world, "t0")] == [(1, "unknown"), (2, "unknown")]
    assert _history(world, "t1") == [(1, "unknown", None, None)]
    assert world.book.info("t1").error == "ValueError: first"
    world.core.add_worker("w", ["a"], 1)
    _fail(world, "t0", "third")
    _fail(world, "t1", "second")
    world.journal.compact(world.book.kept(), world.book.paused_pools())
    expected = {task_id: _history(world, task_id) for task_id in ("t0", "t1")}
    assert [end[1] for end in expected["t0"]] == ["unknown", "unknown", "retried"]
    assert [end[1] for end in expected["t1"]] == ["unknown", "retried"]
    world.crash()
    world = World(tmp_path, now=world.now)
    assert {task_id: _history(world, task_id) for task_id in ("t0", "t1")} == expected


def test_a_task_s_cost_survives_a_crash_and_a_compaction_and_older_files_read_as_none(tmp_path):
    """`cost` is the last stored field: a journal's accepted entry carries it when given (and keeps its old bytes
    when not), a snapshot keeps it, and records written before it existed read back as None (it counts 1)."""
    from cronoq.book.records import stored_form
    from cronoq.store.journal.records import AcceptedEntry, encode

    plain = AcceptedEntry("t9", "a", None, 2, b"p", 990.0, max_retries=1)
    assert encode([plain]) == encode([AcceptedEntry("t9", "a", None, 2, b"p", 990.0, max_retries=1, cost=None)])
    world = World(tmp_path)
    costly = world.book.submit(SubmitRequest(b"x", pool="a", tenant="acme", cost=20.5), world.now)[0]
    cheap = world.book.submit(SubmitRequest(b"y", pool="a", tenant="acme"), world.now)[0]
    world.commit()
    world.crash()
    world = World(tmp_path, now=world.now)
    assert world.book.records[costly.id].cost == 20.5 and world.book.records[cheap.id].cost is None
    world.journal.compact(world.book.kept(), world.book.paused_pools())
    world.crash()
    world = World(tmp_path, now=world.now)
    assert world.book.records[costly.id].cost == 20.5 and world.book.records[cheap.id].cost is None
    old_form = stored_form(world.book.records[costly.id])[:-1]  # as stored before records had a cost
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(old_form), type=TaskRecord).cost is None
    world.close()
