"""The broker's durable state: an append-only journal of record changes, with snapshots.

Layout of `data_dir`:

    lock                 held (flock) by the one broker using the directory
    snapshot             every record in memory at some moment, then `End`; names generation g
    journal.<g>          the changes since that snapshot, one frame per group commit
    journal.<g+1> ...    (after a compaction was cut short: replayed in order; or made ahead of time,
                         empty, for the next compaction to switch to at once)

The task book reports each change (`accepted`, `dispatched`, ...); the journal
turns it into a record and keeps it until `commit()`, which the broker calls
once per pass of its loop, before it sends that pass's replies: all the
changes of the pass go to the file in one frame, in one `write`. So a reply
that says "accepted" is only ever sent for a task already in the file, and a
crash mid-write leaves a torn last frame that recovery cuts off (its replies
were never sent).

With `fsync_each_commit` the frame is also fdatasync'ed before the replies
(survives power loss); without it the write reaches the OS, which survives
any crash of the broker process, and the broker calls `sync()` about once a
second to bound what a power loss could take.

A big frame (or, with `fsync_each_commit`, every frame) may be written in a
thread instead (`commit_in_background`), so that its checksum, its `write` and
its fdatasync do not hold the broker's loop: the broker keeps that pass's
replies until the write is done, and the journal writes one frame at a time,
in order — any other write, rotation or close first waits for the one under
way.

Compaction, when the journal grows much larger than the records in memory:
commit, start journal g+1, write the snapshot (generation g+1) to a
temporary file and fsync it, rename it over the old one, then delete the
journals before g+1. The broker has the snapshot written by a child process
(`start_compaction`, cronoq.store.journal.compaction: a forked one walking its
memory, or, for a big broker, one reading back the files before g+1) and
renames it once the child succeeded (`poll_compaction`); `compact` does it
all at once. Either way the snapshot's frames are made by
cronoq.store.journal.snapshot. A crash at any point leaves an old snapshot with all the
journals after it, or the new snapshot with the new journal; recovery
replays whichever it finds.

Finished tasks leave the snapshot (and memory) once the results store holds
them: opening with `archived_through` leaves out those it holds.

Opening reads every file first, changing nothing (cronoq.store.journal.reading: a
torn tail is fine, damage is refused); only then does it tidy up — cut torn
tails, delete leftovers — and take the directory over.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from pathlib import Path
from typing import Callable, Iterable

from cronoq.book.records import TaskRecord
from cronoq.store.journal import frames
from cronoq.store.journal.compaction import BackgroundSnapshot, temporary_of
from cronoq.store.journal.fence import Fence, Fenced, advance, lost
from cronoq.store.journal.reading import (
    SNAPSHOT,
    DamagedFile,
    State,
    StoreError,
    claim,
    journal_generations,
    journal_path,
    lock,
    read_state,
    release,
)
from cronoq.store.journal.records import (
    FORMAT,
    AcceptedEntry,
    Change,
    Dispatched,
    Finished,
    Header,
    Paused,
    Requeued,
    encode,
)
from cronoq.store.journal.replay import Replay
from cronoq.store.journal.snapshot import snapshot_frames

__all__ = ["COMPACT_MIN_BYTES", "COMPACT_RATIO", "SNAPSHOT", "DamagedFile", "Journal", "StoreError", "journal_path"]

log = logging.getLogger("cronoq.store")

COMPACT_MIN_BYTES = 32 << 20
"""A journal smaller than this is never compacted: replaying it takes well under a second."""
COMPACT_RATIO = 4
"""Compact when the journal holds this many times more records than there are records in memory."""


class Journal:
    """Durable record changes in one data directory. Open with `Journal.open`, which also recovers."""

    def __init__(self, data_dir: Path, lock_fd: int, generation: int, fd: int, *, fsync_each_commit: bool,
                 compact_min_bytes: int, compact_ratio: float) -> None:
        self.data_dir = data_dir
        self.generation = generation
        self.fsync_each_commit = fsync_each_commit
        self.compact_min_bytes = compact_min_bytes
        self.compact_ratio = compact_ratio
        self.bytes = 0
        """Journal bytes since the last snapshot (all journal files)."""
        self.records = 0
        """Journal records since the last snapshot."""
        self.compacting: BackgroundSnapshot | None = None
        self._covered = (0, 0)  # (bytes, records) of the journals the running compaction replaces
        self._lock_fd = lock_fd
        self._fd = fd
        self._pending: list[Change] = []
        self._unsynced = False
        # Journal files retired by a new generation before their last writes were fdatasync'ed: the next sync
        # still owes them one (then closes them), or a power loss could take more than the sync interval.
        self._retired_unsynced: list[int] = []
        self._writing: concurrent.futures.Future[float] | None = None  # a frame under way in a writer thread
        self.housekeeper: concurrent.futures.Executor | None = None
        """A thread for file work that no reply waits for (making the next journal file ahead of time,
        installing a compaction's snapshot, deleting the journals it replaced): a new file's fsync, a rename's
        directory fsync and unlinking big files take milliseconds on a busy disk. None: all of it here and now."""
        self._spare: concurrent.futures.Future[int] | None = None  # journal generation+1, made ahead of time
        self._installing: concurrent.futures.Future[None] | None = None  # a snapshot's install under way
        self.fence: Fence | None = None
        """The generation this journal holds data_dir at (cronoq.store.journal.fence); every write checks it first."""

    # ----------------------------------------------------------------- opening and recovery

    @classmethod
    def open(cls, data_dir: Path, *, fsync_each_commit: bool = False, compact_min_bytes: int = COMPACT_MIN_BYTES,
             compact_ratio: float = COMPACT_RATIO, archived_through: Callable[[], int] = lambda: 0,
             held_lock: int | None = None) -> tuple["Journal", Replay]:
        """Lock `data_dir`, read back its state, and return the journal ready to append, with what it read
        (leaving out the finished tasks numbered up to `archived_through()`, asked once the directory is
        locked: the results store holds them).

        A torn tail of a journal is reported (file, offset) and cut off.
        Raises StoreError when the directory is in use or unreadable, and
        DamagedFile (a StoreError) when a file is damaged; then nothing in
        the directory has been changed but `fence`, where the next generation
        is recorded before anything is read (cronoq.store.journal.fence). `held_lock`: the fd of the lock a
        standby already took (cronoq.store.journal.reading.wait_for_lock), used (and
        on failure closed) as one taken here.
        """
        try:
            if held_lock is None:
                data_dir.mkdir(parents=True, exist_ok=True)
                lock_fd, created = lock(data_dir)
            else:
                lock_fd, created = held_lock, False
        except OSError as exc:
            raise StoreError(f"cannot use data_dir {data_dir}: {exc.strerror or exc}") from None
        try:
            # Before anything is read: a broker that held data_dir before us (its lock lost without its knowing)
            # refuses its next write from here on, so nothing it confirms later is missing from what we read.
            fence = advance(data_dir)
        except OSError as exc:
            release(data_dir, lock_fd, created)
            raise StoreError(f"cannot write to data_dir {data_dir}: {exc.strerror or exc} ({exc.filename or ''})") \
                from None
        try:
            state = read_state(data_dir, archived_through())
        except OSError as exc:
            release(data_dir, lock_fd, created)
            raise StoreError(f"cannot read data_dir {data_dir}: {exc.strerror or exc} ({exc.filename or ''})") from None
        except BaseException:
            release(data_dir, lock_fd, created)
            raise
        try:
            claim(lock_fd)
            fd = _tidy(data_dir, state)
        except OSError as exc:
            os.close(lock_fd)
            raise StoreError(f"cannot write to data_dir {data_dir}: {exc.strerror or exc} ({exc.filename or ''})") \
                from None
        except BaseException:
            os.close(lock_fd)
            raise
        journal = cls(data_dir, lock_fd, state.generation, fd, fsync_each_commit=fsync_each_commit,
                      compact_min_bytes=compact_min_bytes, compact_ratio=compact_ratio)
        journal.fence = fence
        journal.bytes = state.journal_bytes
        journal.records = state.journal_records
        return journal, state.replay

    # ----------------------------------------------------------------- changes (called by the task book)

    def accepted(self, r: TaskRecord) -> None:
        self._pending.append(AcceptedEntry(
            r.id, r.pool, r.tenant, r.priority, r.payload, r.submitted_at, r.deadline, r.not_before,
            r.max_retries, r.key, r.submission, cost=r.cost,
        ))  # not the record itself: it may change before the commit

    def dispatched(self, r: TaskRecord) -> None:
        self._pending.append(Dispatched(r.id, r.attempts, r.started_at))  # type: ignore[arg-type]

    def requeued(self, r: TaskRecord) -> None:
        # The book notes how the attempt ended before it requeues the task: the last of the record's ends.
        end = r.attempt_ends[-1] if r.attempt_ends else None
        self._pending.append(Requeued(
            r.id, r.not_before, r.error_type, r.error_message, r.traceback, r.retries,
            *(() if end is None else (end.ended, end.at)),
        ))

    def finished(self, r: TaskRecord) -> None:
        self._pending.append(Finished(
            r.id, r.state, r.finished_at, r.result, r.error_type, r.error_message, r.traceback,  # type: ignore[arg-type]
            r.seq,
        ))

    def paused(self, pool: str, paused: bool) -> None:
        self._pending.append(Paused(pool, paused))

    # ----------------------------------------------------------------- writing

    @property
    def dirty(self) -> bool:
        """Whether changes wait for `commit()`."""
        return bool(self._pending)

    def commit(self) -> None:
        """Write every change reported since the last commit as one frame, here and now (after the frame under
        way in a writer thread, if any). Raises OSError if it cannot."""
        self.wait_for_write()
        body = self._take_frame()
        if body is not None:
            self._write(self._fd, body)

    def commit_in_background(self, writer: concurrent.futures.Executor, *, smallest: int = 0
                             ) -> concurrent.futures.Future[float] | None:
        """Like `commit`, but a frame of `smallest` bytes or more is written (and with fsync_each_commit synced)
        by `writer`, one thread; its future gives the seconds the write took, or raises OSError. None when the
        frame was written here and now (a thread's hand-off costs more than a small write), or nothing was
        pending. Raises OSError, as `commit` does, for a write here.

        Only the encoding happens on the caller's thread. The caller must not confirm the changes before the
        future is done; every other use of the file waits for it."""
        self.wait_for_write()
        body = self._take_frame()
        if body is None:
            return None
        if len(body) < smallest and not self.fsync_each_commit:
            self._write(self._fd, body)
            return None
        self._writing = writer.submit(self._timed_write, self._fd, body)
        return self._writing

    @property
    def writing(self) -> bool:
        """Whether a frame is under way in a writer thread."""
        return self._writing is not None and not self._writing.done()

    def wait_for_write(self) -> None:
        """Return once no frame is under way in a writer thread. Raises the OSError that write met."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def _take_frame(self) -> bytes | None:
        """Encode what is pending as the next frame's body, and count it; None when nothing is."""
        pending = self._pending
        if not pending:
            return None
        body = encode(pending)
        self.records += len(pending)
        self._pending = []
        self.bytes += frames.HEADER_SIZE + len(body)
        return body

    def _write(self, fd: int, body: bytes) -> None:
        if self.fence is not None:
            self.fence.check()  # raises Fenced (an OSError): a later broker holds data_dir, nothing more is ours
        frames.append(fd, body)
        if self.fsync_each_commit:
            os.fdatasync(fd)
        else:
            # Only once it is written (in the writer thread, maybe): a sync taken between the encoding and the
            # write would otherwise clear the flag, and the frame would wait for the next write to be synced.
            self._unsynced = True

    def _timed_write(self, fd: int, body: bytes) -> float:
        """In the writer thread: zlib's checksum and the write (and fdatasync) let the loop's thread run."""
        started = time.perf_counter()
        self._write(fd, body)
        return time.perf_counter() - started

    def sync(self) -> None:
        """fdatasync what was written since the last sync, here and now. Raises OSError."""
        sync_files(self.take_unsynced())

    def take_unsynced(self) -> list[int]:
        """The file descriptors whose writes since the last sync still need an fdatasync: the caller owns them
        (`sync_files` syncs and closes them) and may do so in another thread, while the journal goes on
        appending — what was written before this call is durable once that sync returns."""
        owed, self._retired_unsynced = self._retired_unsynced, []
        if self._unsynced:
            self._unsynced = False
            owed.append(os.dup(self._fd))  # a duplicate: a new generation may close the journal's own meanwhile
        return owed

    def wants_compaction(self, kept: int) -> bool:
        """Whether the journal has grown much larger than the `kept` task records it describes (and no
        compaction runs)."""
        return (self.compacting is None and (self._installing is None or self._installing.done())
                and self.bytes >= self.compact_min_bytes and self.records > self.compact_ratio * max(kept, 1))

    def compact(self, kept: Iterable[TaskRecord], paused: Iterable[str]) -> int:
        """Replace the snapshot and the journals with a snapshot of `kept` and a fresh journal, here and now;
        returns the snapshot's size."""
        self._next_generation()
        size = install_snapshot(self.data_dir, self.generation, kept, paused)
        self.bytes = self.records = 0
        return size

    def start_compaction(self, kept: Callable[[], Iterable[TaskRecord]], paused: list[str], *,
                         archived_through: int = 0, from_files: bool = False,
                         started: Callable[[BackgroundSnapshot], None] | None = None) -> None:
        """Start journal g+1, and a child that writes the snapshot of generation g+1: the state exactly as
        journal g left it. A forked child writes `kept()` (run in the child, on its copy of memory: it must
        give the records as they are now) and `paused`; with `from_files`, a process reads back the snapshot
        and the journals before g+1 instead, leaving out the finished tasks numbered up to `archived_through`
        (cronoq.store.journal.compaction says when which). The journal carries on meanwhile; `poll_compaction`
        installs the snapshot once it is written. Raises OSError.

        `started` is called with the process reading back once it has started. With a housekeeper, that
        process is started in the housekeeper's thread (and `started` called there): the compaction counts as
        running from now on, and a start that fails is `poll_compaction`'s OSError, as a child that fails is.
        A fork stays on the caller's thread: the child must be a copy of memory as the caller's changes left
        it."""
        self._next_generation()
        self._covered = (self.bytes, self.records)
        generation = self.generation
        if from_files and self.housekeeper is not None:
            # The housekeeper's one thread lives as long as the broker, as the child's lifeline needs (it dies
            # when the thread that started it ends); the start waits behind any file work queued before it.
            self.compacting = BackgroundSnapshot.read_back_in(
                self.housekeeper, self.data_dir, generation, archived_through, started=started)
        elif from_files:
            self.compacting = BackgroundSnapshot.read_back(self.data_dir, generation, archived_through)
            if started is not None:
                started(self.compacting)
        else:
            self.compacting = BackgroundSnapshot.fork(
                generation, temporary_of(self.data_dir), lambda: snapshot_frames(generation, kept(), paused),
                close_in_child=[self._lock_fd, self._fd],
            )

    def poll_compaction(self) -> int | None:
        """If the running compaction's child is done: install its snapshot and delete the journals it
        replaces (in the housekeeper's thread when there is one: a crash before that is done leaves the old
        snapshot with every journal, or the new one with journals the next start deletes); returns the
        snapshot's size. None while it runs (or when none runs). Raises OSError when it failed: nothing was
        changed, and the journals since the last snapshot are all still there."""
        running = self.compacting
        if running is None:
            return None
        try:
            if not running.poll():
                return None
        except OSError:
            self.compacting = None
            raise
        self.compacting = None
        if self.fence is not None:
            self.fence.check()  # a deposed broker must not rename its snapshot over the new holder's files
        if self.housekeeper is None:
            _install_snapshot_file(running.temporary, self.data_dir, running.generation)
        else:
            # No compaction starts before this is done (wants_compaction): its child would write the same file.
            self._installing = self.housekeeper.submit(
                _install_snapshot_file, running.temporary, self.data_dir, running.generation)
            self._installing.add_done_callback(_log_failed_install)
        covered_bytes, covered_records = self._covered
        self.bytes -= covered_bytes
        self.records -= covered_records
        return running.size

    def cancel_compaction(self) -> None:
        """Stop a running compaction's child, changing nothing (a broker that stops does not wait for it)."""
        if self.compacting is not None:
            self.compacting.cancel()
            self.compacting = None

    def _next_generation(self) -> None:
        """Commit, then append to a new journal file from now on."""
        self.commit()  # waits for the writer thread: its frame belongs to the file it was given
        generation = self.generation + 1
        fd = self._take_spare(generation)
        if self._unsynced:
            self._retired_unsynced.append(self._fd)
        else:
            os.close(self._fd)
        self._fd, self.generation = fd, generation
        self._unsynced = False
        if self.housekeeper is not None:  # the next rotation finds its file ready (an empty one is harmless)
            self._spare = self.housekeeper.submit(self._create_journal, generation + 1)

    def _take_spare(self, generation: int) -> int:
        """The fd of journal `generation`: the one made ahead of time, or a new one."""
        spare, self._spare = self._spare, None
        if spare is not None:
            try:
                return spare.result()  # waits only if it is still being made
            except OSError as exc:
                log.warning("the next journal file could not be made ahead of time (%s): trying again", exc)
        return self._create_journal(generation)

    def _create_journal(self, generation: int) -> int:
        """create_journal, unless a later broker holds data_dir (Fenced): a new file truncates any of its name,
        and the later broker may have made journal `generation` already."""
        if self.fence is not None:
            self.fence.check()
        return create_journal(self.data_dir, generation)

    def lost(self) -> str | None:
        """Why this journal no longer holds data_dir (its lock gone or replaced, a later generation recorded), or
        None while it does."""
        why = lost(self.data_dir, self._lock_fd)
        if why is None and self.fence is not None:
            try:
                self.fence.check()
            except Fenced as exc:
                why = str(exc)
        return why

    def close(self) -> None:
        """Commit, make everything durable, and release the directory."""
        try:
            self.commit()
            retired, self._retired_unsynced = self._retired_unsynced, []
            sync_files(retired)
            os.fsync(self._fd)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Release the directory without writing what is pending (after a write failed; or a test's crash)."""
        self.cancel_compaction()
        self._pending = []
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.exception()  # only wait: its file must not be closed (and reused) under it
        spare, self._spare = self._spare, None
        if spare is not None and spare.exception() is None:
            os.close(spare.result())
        retired, self._retired_unsynced = self._retired_unsynced, []
        for fd in (*retired, self._fd, self._lock_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fd = self._lock_fd = -1


# --------------------------------------------------------------------- files


def sync_files(fds: list[int]) -> None:
    """fdatasync each of `fds` and close it (all of them closed, even when a sync fails). Raises OSError."""
    try:
        for fd in fds:
            os.fdatasync(fd)
    finally:
        for fd in fds:
            os.close(fd)


def _tidy(data_dir: Path, state: State) -> int:
    """After a successful read: cut torn tails, drop leftovers, create missing journals; returns the fd to append to."""
    for leftover in state.leftovers:  # a snapshot whose write was cut short
        leftover.unlink()
    for old in state.stale:  # a compaction finished but did not clean up
        old.unlink()
    if state.replay.orphans:
        log.warning("%s: %d journal records named tasks that were never recorded as accepted; they were skipped",
                    data_dir, state.replay.orphans)
    for read in state.torn:
        gap = read.gaps[0]
        log.warning("%s: torn tail at offset %d (%s): cutting off its last %d bytes, a write that a crash cut "
                    "short", read.path, gap.start, gap.what, read.size - read.end)
        frames.truncate(read.path, read.end)
    for generation in state.fresh:
        os.close(create_journal(data_dir, generation))
        state.journal_bytes += journal_path(data_dir, generation).stat().st_size
    return os.open(journal_path(data_dir, state.generation), os.O_WRONLY | os.O_APPEND)


def create_journal(data_dir: Path, generation: int) -> int:
    """A new, durable journal file holding only its header; returns its fd (append mode)."""
    path = journal_path(data_dir, generation)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    frames.append(fd, encode([Header("journal", FORMAT, generation)]))
    os.fsync(fd)
    frames.fsync_dir(data_dir)
    return fd


def install_snapshot(data_dir: Path, generation: int, kept: Iterable[TaskRecord], paused: Iterable[str]) -> int:
    """Replace the snapshot atomically with one of `kept` naming `generation`, then delete the journals before
    it (journal `generation` must exist already). Returns the snapshot's size."""
    size = frames.write_atomically(data_dir / SNAPSHOT, snapshot_frames(generation, kept, paused))
    _delete_journals_before(data_dir, generation)
    return size


def _delete_journals_before(data_dir: Path, generation: int) -> None:
    for old in journal_generations(data_dir):
        if old < generation:
            journal_path(data_dir, old).unlink()
    frames.fsync_dir(data_dir)


def _install_snapshot_file(temporary: Path, data_dir: Path, generation: int) -> None:
    """Rename a compaction's snapshot into place (durably), then delete the journals it covers."""
    frames.install(temporary, data_dir / SNAPSHOT)
    _delete_journals_before(data_dir, generation)


def _log_failed_install(installing: concurrent.futures.Future[None]) -> None:
    error = installing.exception()
    if error is not None:  # the old snapshot and every journal since are still whole: the next start replays them
        log.error("could not install the new snapshot or delete the journals it replaces: %s", error)
