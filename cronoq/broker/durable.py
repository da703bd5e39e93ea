"""The broker's durable state in its data_dir: recovery at start, group commits, syncs and compaction.

The journal format and crash safety live in cronoq.store; this module is the
broker's use of it. Write failures surface as OSError to the broker, which
stops without confirming anything (a reply for a change that is not on disk
would be a lie); a failed compaction is only logged, as the old snapshot and
journals are still whole.
"""

from __future__ import annotations

import gc
import logging
import time

from cronoq.book import TaskBook
from cronoq.config import BrokerConfig
from cronoq.metrics import BrokerMetrics
from cronoq.store.journal import Journal, StoreError

log = logging.getLogger("cronoq.broker")

# Seconds between fdatasyncs of the journal with durability "sync" (a power loss takes at most this much).
SYNC_INTERVAL = 1.0
# Seconds before trying again after a compaction failed (a full disk, say).
COMPACTION_RETRY = 60.0


class DataDir:
    """One broker's journal, between `open()` and `close()`; inert when the config has no data_dir."""

    def __init__(self, config: BrokerConfig, book: TaskBook, metrics: BrokerMetrics) -> None:
        self._config = config
        self._book = book
        self._metrics = metrics
        self.journal: Journal | None = None
        self._next_compaction = 0.0  # monotonic time: after a failed compaction, wait before the next try

    @property
    def syncs_in_background(self) -> bool:
        """Whether the broker should call `sync()` every SYNC_INTERVAL (durability "sync")."""
        return self.journal is not None and not self.journal.fsync_each_commit

    def open(self, now: float) -> dict[str, int] | None:
        """Lock data_dir and carry on from the state it holds; returns what recovery did (None: no data_dir).

        Raises StoreError when the directory cannot be used.
        """
        data_dir = self._config.data_dir
        if data_dir is None:
            return None
        # Recovery allocates millions of objects and frees none: the cyclic GC would scan them over and over
        # (3x the time). Afterwards they go to the permanent generation, out of every later collection's way.
        gc.disable()
        try:
            journal, replay = Journal.open(data_dir, fsync_each_commit=self._config.durability == "fsync")
            self.journal = self._book.journal = journal
            try:
                counts = self._book.recover(replay.records.values(), replay.paused, now)
                journal.commit()  # what recovery decided (requeued, failed) before anything else happens
                del replay
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
        """Group commit: what the book changed since the last commit reaches the journal. Raises OSError."""
        journal = self.journal
        if journal is not None and journal.dirty:
            started = time.perf_counter()
            journal.commit()
            self._metrics.commit_took(time.perf_counter() - started)

    def sync(self) -> None:
        """fdatasync the journal. Raises OSError."""
        if self.journal is not None:
            self.journal.sync()

    def compact_if_worthwhile(self) -> None:
        """Snapshot the kept records and start a fresh journal once the journal has grown well past them.

        Raises OSError only when the commit before the snapshot fails (that is fatal; a failed snapshot is not).
        """
        journal = self.journal
        started = time.monotonic()
        if journal is None or started < self._next_compaction or not journal.wants_compaction(len(self._book.records)):
            return
        self.commit()
        try:
            size = journal.compact(self._book.kept(), self._book.paused_pools())
        except OSError as exc:  # the old snapshot and journals are still whole: carry on, try again later
            log.error("could not compact the journal in %s: %s; trying again in %g s",
                      self._config.data_dir, exc, COMPACTION_RETRY)
            self._next_compaction = started + COMPACTION_RETRY
            return
        log.info("compacted the journal: a snapshot of %d records (%d bytes) in %.3f s",
                 len(self._book.records), size, time.monotonic() - started)

    def close(self, *, failed: bool) -> None:
        """Release data_dir: commit and fsync what is left, or, after a failure, nothing. Idempotent."""
        journal, self.journal = self.journal, None
        self._book.journal = None
        if journal is None:
            return
        try:
            if failed:
                journal.abandon()
            else:
                journal.close()
        except OSError as exc:
            log.error("could not close the journal in %s: %s", self._config.data_dir, exc)
