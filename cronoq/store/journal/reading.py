"""Reading a data_dir back, changing nothing: what each file holds, what is torn and what is damaged.

The broker (`Journal.open`) and `cronoq-broker --repair` read with the same
code. At start-up the policy is:

- a journal may end with a **torn tail** (cronoq.store.journal.frames states the
  rule): that last write was cut short, none of its changes was
  acknowledged, and the broker cuts it off (with a WARNING) once all files
  have been read;
- any **damage** to a journal, and any problem at all with a snapshot
  (snapshots are written to a temporary file, fsynced and renamed, so even a
  "torn" one means the disk lost data), is refused: `DamagedFile` names the
  file, the offset and what is wrong, and nothing in data_dir is changed
  (but the generation the start recorded in `fence`, cronoq.store.journal.fence);
- a frame whose checksum matches but which this version cannot decode, or a
  file of another kind or format, is refused too: guessing could drop tasks.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import msgspec

from cronoq.errors import DamagedFile, StoreError
from cronoq.store.journal import frames
from cronoq.store.journal.records import READABLE_FORMATS, End, Header, Record, batch_starts, decode_batch
from cronoq.store.journal.replay import Replay

SNAPSHOT = "snapshot"
LOCK = "lock"
_JOURNAL = re.compile(r"journal\.(\d{8})")


def journal_path(data_dir: Path, generation: int) -> Path:
    return data_dir / f"journal.{generation:08d}"


def journal_generations(data_dir: Path) -> list[int]:
    """The generations of the journal files in data_dir, ascending."""
    return sorted(int(m.group(1)) for p in data_dir.iterdir() if (m := _JOURNAL.fullmatch(p.name)))


# --------------------------------------------------------------------- the lock


def lock(data_dir: Path) -> tuple[int, bool]:
    """flock data_dir's lock file; returns its fd and whether it was created. Raises StoreError if it is held."""
    path = data_dir / LOCK
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StoreError(f"data_dir {data_dir} is in use by another broker (pid {holder}); "
                         "give each broker its own data_dir") from None
    return fd, created


def holder(data_dir: Path) -> str:
    """Who holds data_dir's lock, as its lock file says ("unknown" when it says nothing)."""
    try:
        with open(data_dir / LOCK, "rb") as f:
            return f.read(32).decode(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"


def wait_for_lock(data_dir: Path, stopping: Callable[[], bool], interval: float, *,
                  pause: Callable[[float], None] = time.sleep, ready: Callable[[], bool] = lambda: True) -> int | None:
    """Wait until data_dir's lock is free and take it (a standby); returns its fd, or None once `stopping()`.

    `pause(interval)` is how it waits between tries (a standby serves its held addresses meanwhile); the lock
    is only tried while `ready()` (a standby that cannot hold its addresses must not take over).

    Tries every `interval` seconds, without blocking, so that a signal stops the wait at once. Only a lock
    file a broker made is taken: a missing one (or a missing data_dir) is waited for, never created, since
    on a standby's host it most likely means the shared storage is not mounted there yet. A lock taken on a
    file that was replaced meanwhile (its inode is no longer the path's) is let go and the new one tried.
    """
    path = data_dir / LOCK
    fd: int | None = None
    try:
        while not stopping():
            if not ready():
                pause(interval)
                continue
            if fd is None:
                try:
                    fd = os.open(path, os.O_RDWR)
                except (FileNotFoundError, NotADirectoryError):
                    fd = None
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass
                else:
                    if _same_file(fd, path):
                        held, fd = fd, None
                        return held
                    os.close(fd)  # it was unlinked while we waited: the path's new file is the lock now
                    fd = None
                    continue
            pause(interval)
        return None
    finally:
        if fd is not None:
            os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def claim(lock_fd: int) -> None:
    """Write our pid into the held lock file (for the message a second broker gets): once we change things."""
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, str(os.getpid()).encode(), 0)


def release(data_dir: Path, lock_fd: int, created: bool) -> None:
    """Let go of the lock without having changed anything (a lock file we created goes again)."""
    if created:
        (data_dir / LOCK).unlink(missing_ok=True)
    os.close(lock_fd)


# --------------------------------------------------------------------- one file


@dataclass
class FileRead:
    """What reading one journal or snapshot found."""

    path: Path
    kind: str
    """"journal" or "snapshot"."""
    size: int = 0
    end: int = 0
    """Offset just past the intact frames before the first gap: where a torn tail is cut."""
    frames: int = 0
    records: int = 0
    header: Header | None = None
    expected: int | None = None
    """A snapshot's count from its End record (None: no End read)."""
    gaps: list[frames.Gap] = field(default_factory=list)

    @property
    def damage(self) -> list[frames.Gap]:
        """The gaps that are not a torn tail (for a snapshot, every gap counts: see the module header)."""
        if self.kind == "snapshot":
            return list(self.gaps)
        return [gap for gap in self.gaps if not gap.torn]

    def whole_snapshot(self) -> bool:
        """Whether a snapshot read back complete: no gap, and its End counts exactly the records read."""
        return not self.gaps and self.expected == self.records and self.header is not None


def read_file(path: Path, kind: str, replay: Replay, *, skip_damage: bool = False) -> FileRead:
    """Apply the intact frames of one file to `replay`, from its start to its first gap (or past every
    damaged range, with `skip_damage`). Raises StoreError for a file of another kind or format, or a frame
    that checks out but cannot be decoded."""
    reader = frames.FrameReader(path, candidates=batch_starts, skip_damage=skip_damage)
    read = FileRead(path, kind)
    for offset, body in reader:
        batch = _decode(path, offset, body)
        read.frames += 1
        if offset == 0:
            read.header = _check_header(path, batch, kind)
            batch = batch[1:]
        if batch and isinstance(batch[-1], End):  # a snapshot's last frame
            read.expected = batch.pop().count
        read.records += len(batch)
        replay.apply_batch(batch)
    read.size, read.end, read.gaps = reader.size, reader.end, reader.gaps
    return read


def gap_text(gap: frames.Gap, size: int) -> str:
    """What a gap is, for a message: what is wrong where it starts, and where intact frames resume."""
    if gap.end < size:
        return f"{gap.what}; intact frames follow at offset {gap.end}"
    if not gap.torn:
        return f"{gap.what}; none of the {size - gap.start} bytes from there to the end of the file is an intact frame"
    return gap.what


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
    if header.format not in READABLE_FORMATS:
        raise StoreError(f"{path}: format {header.format}, but this version of cronoq reads formats "
                         f"{', '.join(map(str, READABLE_FORMATS))}")
    return header


# --------------------------------------------------------------------- the whole directory


@dataclass
class State:
    """What a data_dir holds, read without changing it, and what the broker must tidy before appending."""

    replay: Replay
    generation: int
    """The journal to append to."""
    journal_bytes: int = 0
    journal_records: int = 0
    stale: list[Path] = field(default_factory=list)
    """Journals older than the snapshot (a compaction finished but did not clean up)."""
    leftovers: list[Path] = field(default_factory=list)
    """Temporary files of a snapshot whose write was cut short."""
    torn: list[FileRead] = field(default_factory=list)
    """Journals that end with a torn tail, to cut at their `end`."""
    fresh: list[int] = field(default_factory=list)
    """Generations whose journal is missing, or was torn before its header was whole: to create."""


def _read_snapshot(data_dir: Path, replay: Replay) -> int:
    """Read data_dir's snapshot, if there is one, into `replay`; the first journal generation after it (1
    without one). Raises DamagedFile for a snapshot with a gap or cut short."""
    snapshot = data_dir / SNAPSHOT
    if not snapshot.exists():
        return 1
    read = read_file(snapshot, "snapshot", replay)
    if read.gaps:
        raise DamagedFile(snapshot, read.gaps[0].start, gap_text(read.gaps[0], read.size))
    if not read.whole_snapshot():
        raise DamagedFile(snapshot, read.size, _short_snapshot(read))
    assert read.header is not None
    return read.header.generation


def read_state(data_dir: Path, archived_through: int = 0) -> State:
    """Read the snapshot and the journals after it, leaving out the finished tasks numbered up to
    `archived_through` (the results store holds them). Raises DamagedFile (or StoreError), changing nothing."""
    replay = Replay(archived_through)
    first = _read_snapshot(data_dir, replay)
    generations = journal_generations(data_dir)
    live = [g for g in generations if g >= first] or [first]
    state = State(replay, live[-1], stale=[journal_path(data_dir, g) for g in generations if g < first],
                  leftovers=sorted(data_dir.glob("*.tmp")))
    before = replay.applied
    for generation in live:
        path = journal_path(data_dir, generation)
        if not path.exists():
            state.fresh.append(generation)
            continue
        read = read_file(path, "journal", replay)
        if read.damage:
            gap = read.damage[0]
            raise DamagedFile(path, gap.start, gap_text(gap, read.size))
        if read.gaps:
            state.torn.append(read)
        if read.end == 0:  # created but its header never made it whole
            state.fresh.append(generation)
        state.journal_bytes += read.end
    state.journal_records = replay.applied - before
    return state


def read_before(data_dir: Path, generation: int, archived_through: int = 0) -> Replay:
    """Read the snapshot and the journals before `generation` (a compaction's: the broker appends to
    `generation` meanwhile, and those files no longer change), leaving out the finished tasks numbered up to
    `archived_through`. Any gap, even one that looks like a torn tail, is refused (DamagedFile): the broker
    wrote those journals whole before it moved on."""
    replay = Replay(archived_through)
    first = _read_snapshot(data_dir, replay)
    for older in range(first, generation):
        path = journal_path(data_dir, older)
        read = read_file(path, "journal", replay)
        if read.gaps:
            raise DamagedFile(path, read.gaps[0].start, gap_text(read.gaps[0], read.size))
    return replay


def _short_snapshot(read: FileRead) -> str:
    if read.header is None:
        return "the file is empty"
    if read.expected is None:
        return f"it ends after {read.records} records, before its end record"
    return f"its end record counts {read.expected} records but it holds {read.records}"
