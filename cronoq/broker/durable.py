"""The broker's durable state in its data_dir: recovery at start, group commits, syncs, compaction, retention.

The journal format and crash safety live in cronoq.store; this module is the
broker's use of it:

- after each group commit, the tasks that finished in the pass go to the
  results store's archiver, and the finished records it has confirmed leave
  memory (cronoq.store.results.shipping); with `results_store = false` they
  stay in memory and in the journal, within the retention limits, as without
  a data_dir;
- about once a second, a compaction is started when the journal has grown
  well past the records in memory: a child process writes the snapshot while
  the broker carries on (cronoq.store.journal.compaction), and the next ticks install
  it once the child succeeded.

Write failures of the journal surface as OSError to the broker, which stops
without confirming anything (a reply for a change that is not on disk would
be a lie); a failed compaction is only logged, as the old snapshot and
journals are still whole.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from cronoq.book.taskbook import TaskBook
from cronoq.broker.config import BrokerConfig
from cronoq.broker.metrics import BrokerMetrics
from cronoq.errors import StoreError
from cronoq.store.journal.compaction import FORK_MAX_RSS, BackgroundSnapshot, resident_bytes
from cronoq.store.journal.journal import COMPACT_MIN_BYTES, COMPACT_RATIO, Journal, sync_files
from cronoq.store.results import database
from cronoq.store.results.shipping import Archive, open_store

log = logging.getLogger("cronoq.broker")

# Seconds between fdatasyncs of the journal with durability "sync" (a power loss takes at most this much).
SYNC_INTERVAL = 1.0
# A group commit's frame of this many bytes or more is written in the writer thread, off the loop (big payloads:
# a frame of 16 tasks of 900 KB took ~20 ms of checksum and write); smaller ones cost less than the hand-off.
WRITE_IN_THREAD_BYTES = 256 * 1024
# Seconds before trying again after a compaction failed (a full disk, say).
COMPACTION_RETRY = 60.0
# For tests only: compact at a smaller journal and ratio than a broker would, retry sooner, and read the files back
# at another size, to reach the code paths quickly: "MIN_BYTES[,RATIO[,RETRY_SECONDS[,FORK_MAX_RSS]]]".
COMPACTION_ENV = "CRONOQ_TEST_COMPACTION"
# For tests only: how many finished tasks may wait for the results store before dispatching waits.
UNARCHIVED_ENV = "CRONOQ_TEST_MAX_UNARCHIVED"


class DataDir:
    """One broker's journal and results store, between `open()` and `close()`; inert without a data_dir."""

    def __init__(self, config: BrokerConfig, book: TaskBook, metrics: BrokerMetrics) -> None:
        self._config = config
        self._book = book
        self._metrics = metrics
        self.journal: Journal | None = None
        self.archive: Archive | None = None
        self._next_compaction = 0.0  # monotonic time: after a failed compaction, wait before the next try
        self.compactions = 0
        self._min_bytes, self._ratio, self._retry, self._fork_max_rss = _compaction_settings()
        # One thread for the journal's fdatasyncs and its file housekeeping (Journal.housekeeper): a sync can
        # take tens of milliseconds on a busy disk, a new file's fsync or unlinking big files milliseconds, and
        # the loop goes on serving (and appending) meanwhile. Made when first needed. It also starts a big
        # broker's compaction writer, which dies when the thread that started it ends (PR_SET_PDEATHSIG): so the
        # thread lives until `close()`, as long as the broker, and is never replaced while the broker runs.
        self._housekeeping: concurrent.futures.ThreadPoolExecutor | None = None
        # One thread for big group commits (and all of them with durability "fsync"), made on the first.
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._compaction_due = False  # a compaction waits for the writer thread to be idle

    @property
    def syncs_in_background(self) -> bool:
        """Whether the broker should call `sync()` every SYNC_INTERVAL (durability "sync")."""
        return self.journal is not None and not self.journal.fsync_each_commit

    def open(self, now: float, held_lock: int | None = None) -> dict[str, int] | None:
        """Lock data_dir (or take the lock a standby holds: its fd) and carry on from the state it holds;
        returns what recovery did (None: no data_dir).

        Raises StoreError when the directory cannot be used.
        """
        data_dir = self._config.data_dir
        if data_dir is None:
            return None
        # Recovery allocates millions of objects and frees none: the cyclic GC would scan them over and over
        # (3x the time). Afterwards they go to the permanent generation, out of every later collection's way.
        gc.disable()
        try:
            stored = self._config.results_store
            journal, replay = Journal.open(
                data_dir, fsync_each_commit=self._config.durability == "fsync", compact_min_bytes=self._min_bytes,
                compact_ratio=self._ratio, held_lock=held_lock,
                # Without the results store, every finished task the journal holds is kept: none is elsewhere.
                archived_through=(lambda: database.peek_mark(data_dir / database.RESULTS)) if stored else (lambda: 0),
            )
            self.journal = self._book.journal = journal
            journal.housekeeper = self._housekeeper()
            try:
                if stored:
                    db, archived_through = open_store(data_dir)
                    if os.environ.get(UNARCHIVED_ENV):
                        self._book.max_unarchived = int(os.environ[UNARCHIVED_ENV])
                    self.archive = self._book.archive = Archive(
                        data_dir, db, archived_through, ttl=self._config.result_ttl,
                        max_bytes=self._config.result_retention_bytes,
                    )
                else:
                    archived_through = _unread_store(data_dir)
                counts = self._book.recover(replay.ordered(), replay.paused, now, by_id=replay.by_id,
                                            seq_floor=max(replay.max_seq, archived_through))
                journal.commit()  # what recovery decided (requeued, failed) before anything else happens
                del replay
                if self.archive is not None:
                    self.archive.begin(now)
                    self.archive.exchange(self._book)
                self.compact_if_worthwhile()
            except OSError as exc:
                self.close(failed=False)
                raise StoreError(f"cannot write to data_dir {data_dir}: {exc}") from None
            except BaseException:
                self.close(failed=False)
                raise
            gc.freeze()
        finally:
            gc.enable()
        return counts

    def commit(self) -> None:
        """Group commit, here and now: what the book changed since the last commit reaches the journal; then the
        tasks that finished go to the results store. Raises OSError."""
        journal = self.journal
        if journal is not None and journal.dirty:
            started = time.perf_counter()
            journal.commit()
            self._metrics.commit_took(time.perf_counter() - started)
        if self.archive is not None:
            self.archive.exchange(self._book)

    def commit_pass(self) -> concurrent.futures.Future[float] | None:
        """A pass's group commit: like `commit`, but a big frame (or, with durability "fsync", any frame) is
        written by the writer thread. Then the future says when it is done, and `written()` must be called
        with it before the pass's replies go. None: committed already. Raises OSError for a write here.
        Unlike `commit` it ships nothing to the results store: `ship_finished()` does, once the replies are
        sent (the archiver's process would otherwise wake ahead of the client the outcome is for)."""
        journal = self.journal
        if journal is not None and self._compaction_due:  # (the caller has no write under way)
            self._start_compaction(journal, time.monotonic())  # commits what is pending, here and now
        if journal is None or not journal.dirty:
            return None
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cronoq-journal")
        started = time.perf_counter()
        writing = journal.commit_in_background(self._writer, smallest=WRITE_IN_THREAD_BYTES)
        if writing is not None:
            return writing
        self._metrics.commit_took(time.perf_counter() - started)
        return None

    def written(self, writing: concurrent.futures.Future[float]) -> None:
        """A commit the writer thread did is on disk: count it. Raises its OSError. (`ship_finished()` then
        sends what finished to the results store.)"""
        self._metrics.commit_took(writing.result())

    def ship_finished(self) -> None:
        """After a commit (`commit_pass` or `written`) and the replies it let go: send what finished to the
        results store, and read its replies (only now: the store must never hold an outcome the journal may
        lack)."""
        if self.archive is not None:
            self.archive.exchange(self._book)

    def watch(self, loop: asyncio.AbstractEventLoop, pump: Callable[[], None]) -> None:
        """Wake the broker's loop when the archiver replies: the finished tasks it stored leave memory at once,
        and dispatching that waited for it (max_unarchived) goes on."""
        if self.archive is not None:
            def on_reply() -> None:
                if self.archive is not None:
                    self.archive.exchange(self._book, listen=True, ship=self._all_written())
                    pump()

            self.archive.watch(loop, on_reply)

    @property
    def releasing(self) -> bool:
        """Whether finished records the results store holds are still in memory (they go a batch per pass)."""
        return self.archive is not None and self._book.finished.releasable(self.archive.archived_through)

    def _all_written(self) -> bool:
        """Whether every change the book reported is in the journal's file (none pending, none being written):
        only then may finished tasks go to the results store."""
        journal = self.journal
        return journal is None or not (journal.dirty or journal.writing)

    def lost(self) -> str | None:
        """Why this broker no longer holds its data_dir (cronoq.store.journal.fence), or None while it does (or has none)."""
        return None if self.journal is None else self.journal.lost()

    def sync(self) -> None:
        """fdatasync the journal, here and now. Raises OSError."""
        if self.journal is not None:
            self.journal.sync()

    def sync_in_background(self) -> asyncio.Future[None] | None:
        """fdatasync what the journal wrote until now in the sync thread; the future fails with OSError when the
        sync does. None when nothing needs a sync."""
        journal = self.journal
        if journal is None:
            return None
        owed = journal.take_unsynced()
        if not owed:
            return None
        return asyncio.get_running_loop().run_in_executor(self._housekeeper(), self._sync_files, owed)

    def _housekeeper(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._housekeeping is None:
            self._housekeeping = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cronoq-housekeeping")
        return self._housekeeping

    def _sync_files(self, fds: list[int]) -> None:
        """In the sync thread."""
        started = time.perf_counter()
        sync_files(fds)
        self._metrics.sync_took(time.perf_counter() - started)

    def compact_if_worthwhile(self) -> None:
        """The broker's tick: hear the archiver, install a finished compaction, and start one once the journal
        has grown well past the records in memory.

        Raises OSError only when the commit before a compaction fails (that is fatal; a failed snapshot is not).
        """
        journal = self.journal
        if journal is None:
            return
        if self.archive is not None:
            self.archive.exchange(self._book, listen=True, ship=self._all_written())
            if len(self._book.finished) >= self._book.max_unarchived:
                log.warning("%d finished tasks wait for the results store (%s): dispatching waits until it catches "
                            "up", len(self._book.finished), self.archive.path)
        now = time.monotonic()
        self._install_compaction(journal, now)
        if now < self._next_compaction or not journal.wants_compaction(len(self._book.records)):
            return
        if journal.writing:
            # Starting now would hold the loop until the writer thread's frame is written: the broker's next
            # commit starts it instead, when no write is under way.
            self._compaction_due = True
            return
        self._start_compaction(journal, now)

    def _start_compaction(self, journal: Journal, now: float) -> None:
        """Commit here and now, then start a compaction's snapshot writer: a fork here, or a process reading the
        files back, started by the housekeeping thread (the journal's housekeeper). Raises OSError if the commit
        fails; a writer that cannot be started is logged and tried again later."""
        self._compaction_due = False
        self.commit()
        try:
            book = self._book
            journal.start_compaction(
                book.kept, book.paused_pools(), from_files=resident_bytes() > self._fork_max_rss,
                archived_through=self.archive.archived_through if self.archive is not None else 0,
                started=self._writer_started)
        except OSError as exc:
            self._compaction_failed(exc, now)
            return
        running = journal.compacting
        assert running is not None
        self._metrics.snapshot_start_took(running.start_seconds)  # what the loop waited for
        if running.forked:
            log.info("compaction started: %d records in memory, journal %d bytes; writer pid %d forked in %.1f ms",
                     len(self._book.records), journal.bytes, running.pid, running.start_seconds * 1e3)
        else:
            log.info("compaction started: %d records in memory, journal %d bytes; a writer reading the files back "
                     "is being started (the loop waited %.2f ms)", len(self._book.records), journal.bytes,
                     running.start_seconds * 1e3)

    def _writer_started(self, running: BackgroundSnapshot) -> None:
        """A process reading the files back has started (in the housekeeping thread, which it dies with)."""
        self._metrics.snapshot_spawn_took(running.spawn_seconds)
        log.info("compaction's writer pid %d, reading the files back, started in %.1f ms", running.pid,
                 running.spawn_seconds * 1e3)

    def _install_compaction(self, journal: Journal, now: float) -> None:
        running = journal.compacting
        if running is None:
            return
        try:
            size = journal.poll_compaction()
        except OSError as exc:
            self._compaction_failed(exc, now)
            return
        if size is not None:
            self.compactions += 1
            log.info("compacted the journal: a snapshot of %d bytes, written in %.3f s while serving",
                     size, now - running.started)

    def _compaction_failed(self, exc: OSError, now: float) -> None:
        # The old snapshot and journals are still whole: carry on, try again later.
        log.error("could not compact the journal in %s: %s; trying again in %g s",
                  self._config.data_dir, exc.strerror or exc, self._retry)
        self._next_compaction = now + self._retry

    def stats(self) -> dict[str, Any]:
        """How compaction goes and what the results store holds (no `results` with `results_store = false`; empty
        without a data_dir)."""
        if self.journal is None:
            return {}
        journal = {"journal_bytes": self.journal.bytes, "compactions": self.compactions,
                   "compacting": self.journal.compacting is not None}
        return journal if self.archive is None else {"results": self.archive.stats(), **journal}

    def close(self, *, failed: bool) -> None:
        """Release data_dir: commit and fsync what is left, or, after a failure, nothing. Idempotent."""
        journal, self.journal = self.journal, None
        archive, self.archive = self.archive, None
        if journal is not None:
            # First: a start still queued for the housekeeping thread is dropped rather than run only to be killed
            # when the thread ends (a stopping broker does not wait for its snapshot).
            try:
                journal.cancel_compaction()
            except OSError as exc:
                log.error("could not stop the compaction's snapshot writer: %s", exc)
        for thread in (self._writer, self._housekeeping):
            if thread is not None:  # a write or sync under way finishes before the journal's last one
                thread.shutdown(wait=True)
        self._writer = self._housekeeping = None
        self._book.journal = None
        self._book.archive = None
        if archive is not None:
            archive.close()
        if journal is None:
            return
        try:
            if failed:
                journal.abandon()
            else:
                journal.close()
        except OSError as exc:
            log.error("could not close the journal in %s: %s", self._config.data_dir, exc)


def _compaction_settings() -> tuple[int, float, float, int]:
    """(journal bytes, journal records per record in memory) before a compaction, seconds before a retry, and
    the broker's resident bytes above which the snapshot is written from the files rather than by a fork."""
    parts = os.environ.get(COMPACTION_ENV, "").split(",")
    defaults = (COMPACT_MIN_BYTES, COMPACT_RATIO, COMPACTION_RETRY, FORK_MAX_RSS)
    values = [part or default for part, default in zip(parts + [""] * 4, defaults)]
    return int(values[0]), float(values[1]), float(values[2]), int(values[3])


def _unread_store(data_dir: Path) -> int:
    """With `results_store = false`: the `archived_through` of a results store an earlier run left in data_dir
    (0: none), so that the tasks finishing now are numbered after everything in it, and a later run with the store
    on again neither mistakes one of them for a stored task nor leaves one out. Says, once, what goes unread."""
    path = data_dir / database.RESULTS
    if not path.exists():
        return 0
    db, archived_through = open_store(data_dir)  # (its write-ahead log too: peek_mark may be behind)
    db.close()
    log.warning("results_store = false: the results store in %s (%d bytes) is left unread; the results and "
                "idempotency keys of the tasks it holds are not found until the store is turned on again",
                path, path.stat().st_size)
    return archived_through
