"""The broker's durable state: an append-only journal of record changes, with snapshots.

Layout of `data_dir`:

    lock                 held (flock) by the one broker using the directory
    snapshot             every kept record at some moment, then `End`; names generation g
    journal.<g>          the changes since that snapshot, one frame per group commit
    journal.<g+1> ...    (only after a compaction was cut short: replayed in order)

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

Compaction, when the journal grows much larger than the live state: commit,
start journal g+1, write the snapshot (generation g+1) to a temporary file,
fsync, rename it over the old one, then delete the journals before g+1. A
crash at any point leaves an old snapshot with all the journals after it, or
the new snapshot with the new journal; recovery replays whichever it finds.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
from pathlib import Path
from typing import Iterable, Iterator

import msgspec

from cronoq.book import TaskRecord
from cronoq.store import frames
from cronoq.store.records import (
    FORMAT,
    Accepted,
    Change,
    Dispatched,
    End,
    Finished,
    Forgotten,
    Header,
    Paused,
    Record,
    Requeued,
    decode_batch,
    encode,
)
from cronoq.store.replay import Replay, record_to_kept

log = logging.getLogger("cronoq.store")

SNAPSHOT = "snapshot"
_JOURNAL = re.compile(r"journal\.(\d{8})")
SNAPSHOT_FRAME_RECORDS = 1024
"""Records per snapshot frame: big enough to encode fast, small enough to read back in pieces."""

COMPACT_MIN_BYTES = 64 << 20
"""A journal smaller than this is never compacted: replaying it takes well under a second."""
COMPACT_RATIO = 4
"""Compact when the journal holds this many times more records than there are kept tasks."""


class StoreError(Exception):
    """The data directory cannot be used (locked, unreadable, of an unknown format); the message says why."""


def journal_path(data_dir: Path, generation: int) -> Path:
    return data_dir / f"journal.{generation:08d}"


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
        self._lock_fd = lock_fd
        self._fd = fd
        self._pending: list[Change] = []
        self._unsynced = False

    # ----------------------------------------------------------------- opening and recovery

    @classmethod
    def open(cls, data_dir: Path, *, fsync_each_commit: bool = False, compact_min_bytes: int = COMPACT_MIN_BYTES,
             compact_ratio: float = COMPACT_RATIO) -> tuple["Journal", Replay]:
        """Lock `data_dir`, read back its state, and return the journal ready to append, with what it read.

        A torn or corrupt tail of a journal is reported (file, offset) and cut
        off. Raises StoreError when the directory is in use, unreadable, or
        holds a damaged snapshot or a format this version does not know.
        """
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            lock_fd = _lock(data_dir)
        except OSError as exc:
            raise StoreError(f"cannot use data_dir {data_dir}: {exc.strerror or exc}") from None
        try:
            return cls._recover(data_dir, lock_fd, fsync_each_commit, compact_min_bytes, compact_ratio)
        except BaseException:
            os.close(lock_fd)
            raise

    @classmethod
    def _recover(cls, data_dir: Path, lock_fd: int, fsync_each_commit: bool, compact_min_bytes: int,
                 compact_ratio: float) -> tuple["Journal", Replay]:
        try:
            for leftover in data_dir.glob("*.tmp"):  # a snapshot whose write was cut short
                leftover.unlink()
            replay = Replay()
            snapshot = data_dir / SNAPSHOT
            first = _read_snapshot(snapshot, replay) if snapshot.exists() else 1
            generations = sorted(int(m.group(1)) for p in data_dir.iterdir() if (m := _JOURNAL.fullmatch(p.name)))
            for old in (g for g in generations if g < first):  # a compaction finished but did not clean up
                journal_path(data_dir, old).unlink()
            live = [g for g in generations if g >= first] or [first]
            total_bytes = 0
            before = replay.applied
            for generation in live:
                total_bytes += _replay_journal(journal_path(data_dir, generation), generation, replay)
            if replay.orphans:
                log.warning("%s: %d journal records named tasks that were never recorded as accepted (after a "
                            "damaged file); they were skipped", data_dir, replay.orphans)
            current = live[-1]
            fd = os.open(journal_path(data_dir, current), os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            raise StoreError(f"cannot read data_dir {data_dir}: {exc.strerror or exc} ({exc.filename or ''})") from None
        journal = cls(data_dir, lock_fd, current, fd, fsync_each_commit=fsync_each_commit,
                      compact_min_bytes=compact_min_bytes, compact_ratio=compact_ratio)
        journal.bytes = total_bytes
        journal.records = replay.applied - before
        return journal, replay

    # ----------------------------------------------------------------- changes (called by the task book)

    def accepted(self, r: TaskRecord) -> None:
        self._pending.append(Accepted(
            r.id, r.pool, r.tenant, r.priority, r.payload, r.submitted_at, r.deadline, r.not_before,
            r.max_retries, r.key, r.submission,
        ))

    def dispatched(self, r: TaskRecord) -> None:
        self._pending.append(Dispatched(r.id, r.attempts, r.started_at))  # type: ignore[arg-type]

    def requeued(self, r: TaskRecord) -> None:
        self._pending.append(Requeued(r.id, r.not_before, r.error_type, r.error_message, r.traceback))

    def finished(self, r: TaskRecord) -> None:
        self._pending.append(Finished(
            r.id, r.state, r.finished_at, r.result, r.error_type, r.error_message, r.traceback,  # type: ignore[arg-type]
        ))

    def forgotten(self, r: TaskRecord) -> None:
        self._pending.append(Forgotten(r.id))

    def paused(self, pool: str, paused: bool) -> None:
        self._pending.append(Paused(pool, paused))

    # ----------------------------------------------------------------- writing

    @property
    def dirty(self) -> bool:
        """Whether changes wait for `commit()`."""
        return bool(self._pending)

    def commit(self) -> None:
        """Write every change reported since the last commit as one frame. Raises OSError if it cannot."""
        pending = self._pending
        if not pending:
            return
        body = encode(pending)
        self.records += len(pending)
        self._pending = []
        self.bytes += frames.append(self._fd, body)
        if self.fsync_each_commit:
            os.fdatasync(self._fd)
        else:
            self._unsynced = True

    def sync(self) -> None:
        """fdatasync what was written since the last sync (the broker calls this about once a second)."""
        if self._unsynced:
            self._unsynced = False
            os.fdatasync(self._fd)

    def wants_compaction(self, kept: int) -> bool:
        """Whether the journal has grown much larger than the `kept` task records it describes."""
        return self.bytes >= self.compact_min_bytes and self.records > self.compact_ratio * max(kept, 1)

    def compact(self, kept: Iterable[TaskRecord], paused: Iterable[str]) -> int:
        """Replace the snapshot and the journals with a snapshot of `kept` and a fresh journal; returns its size."""
        self.commit()
        generation = self.generation + 1
        fd = _create_journal(self.data_dir, generation)
        os.close(self._fd)
        self._fd, self.generation = fd, generation
        self._unsynced = False
        size = frames.write_atomically(self.data_dir / SNAPSHOT, _snapshot_frames(generation, kept, paused))
        for path in self.data_dir.iterdir():
            m = _JOURNAL.fullmatch(path.name)
            if m and int(m.group(1)) < generation:
                path.unlink()
        frames.fsync_dir(self.data_dir)
        self.bytes = self.records = 0
        return size

    def close(self) -> None:
        """Commit, make everything durable, and release the directory."""
        try:
            self.commit()
            os.fsync(self._fd)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Release the directory without writing what is pending (after a write failed; or a test's crash)."""
        self._pending = []
        for fd in (self._fd, self._lock_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fd = self._lock_fd = -1


# --------------------------------------------------------------------- files


def _lock(data_dir: Path) -> int:
    fd = os.open(data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StoreError(f"data_dir {data_dir} is in use by another broker (pid {holder}); "
                         "give each broker its own data_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _create_journal(data_dir: Path, generation: int) -> int:
    """A new, durable journal file holding only its header; returns its fd (append mode)."""
    path = journal_path(data_dir, generation)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    frames.append(fd, encode([Header("journal", FORMAT, generation)]))
    os.fsync(fd)
    frames.fsync_dir(data_dir)
    return fd


def _snapshot_frames(generation: int, kept: Iterable[TaskRecord], paused: Iterable[str]) -> Iterator[bytes]:
    yield encode([Header("snapshot", FORMAT, generation)])
    count = 0
    chunk: list[Record] = [Paused(pool, True) for pool in paused]
    for record in kept:
        chunk.append(record_to_kept(record))
        if len(chunk) >= SNAPSHOT_FRAME_RECORDS:
            count += len(chunk)
            yield encode(chunk)
            chunk = []
    count += len(chunk)
    if chunk:
        yield encode(chunk)
    yield encode([End(count)])


def _decode(path: Path, offset: int, body: bytes) -> list[Record]:
    try:
        return decode_batch(body)
    except msgspec.DecodeError as exc:
        # The checksum matched, so this is no torn write: a newer format, or a bug. Guessing could lose tasks.
        raise StoreError(f"{path}: offset {offset}: a record this version of cronoq cannot read ({exc}); "
                         "refusing to start") from None


def _check_header(path: Path, batch: list[Record], kind: str) -> Header:
    header = batch[0] if batch else None
    if not isinstance(header, Header) or header.kind != kind:
        raise StoreError(f"{path}: not a cronoq {kind} file (its first frame is no {kind} header)")
    if header.format != FORMAT:
        raise StoreError(f"{path}: format {header.format}, but this version of cronoq reads format {FORMAT}")
    return header


def _read_snapshot(path: Path, replay: Replay) -> int:
    """Apply a snapshot; returns its generation. A damaged snapshot is refused, never half-used."""
    reader = frames.FrameReader(path)
    generation = 0
    count = 0
    ended = False
    for offset, body in reader:
        batch = _decode(path, offset, body)
        if offset == 0:
            generation = _check_header(path, batch, "snapshot").generation
            batch = batch[1:]
        for record in batch:
            if isinstance(record, End):
                ended = record.count == count
            else:
                count += 1
                replay.apply(record)
    if reader.problem is not None or not ended:
        # Snapshots are written to a temporary file, fsynced, then renamed: a damaged one means the disk
        # lost data. Starting without it would silently drop tasks, so say so and stop.
        where = f"at offset {reader.end}: {reader.problem}" if reader.problem else "it ends early"
        raise StoreError(f"{path} is damaged ({where}); it cannot be trusted. Move it away to start from the "
                         "journals alone (tasks only in the snapshot are then lost)")
    return generation


def _replay_journal(path: Path, generation: int, replay: Replay) -> int:
    """Apply one journal; cut off a torn or corrupt tail (reported). Returns the intact size."""
    if not path.exists():
        os.close(_create_journal(path.parent, generation))
        return path.stat().st_size
    reader = frames.FrameReader(path)
    for offset, body in reader:
        batch = _decode(path, offset, body)
        if offset == 0:
            _check_header(path, batch, "journal")
            batch = batch[1:]
        for record in batch:
            replay.apply(record)
    if reader.problem is not None:
        log.warning("%s: torn or corrupt tail at offset %d (%s): cutting off its last %d bytes, a write that "
                    "a crash cut short", path, reader.end, reader.problem, reader.size - reader.end)
        frames.truncate(path, reader.end)
    if reader.end == 0:  # created but its header never made it: start it afresh
        os.close(_create_journal(path.parent, generation))
        return path.stat().st_size
    return reader.end
