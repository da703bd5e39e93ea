"""Repairing a damaged data_dir: keep a copy, recover every intact frame, and say what was lost.

`cronoq-broker [-c FILE] --repair` calls `repair(data_dir)`, which

1. locks data_dir, so that no broker uses it meanwhile;
2. reads the snapshot and the journals after it as a start does, but
   resynchronises past each damaged range instead of stopping there
   (cronoq.store.journal.frames), changing nothing. A healthy directory (a torn tail
   is healthy: the broker cuts it itself) ends here: nothing to repair;
3. copies every file to a new `data_dir/damaged-<UTC time>/` — a copy, so
   the originals stay in place until the new state is whole;
4. writes the state those frames give as a new generation, with the code a
   compaction uses: an empty journal, then a snapshot of every recovered
   record renamed over the old one, then the old journals deleted;
5. prints a report (also kept as `repair-report.txt` beside the copy): per
   file, the byte ranges skipped and the frames and records recovered; the
   tasks known to be lost — records that name a task whose `accepted`
   record went with the damage — and how many records a damaged snapshot
   counted but could not give back.

A crash during step 4 leaves the original files (the broker refuses them
again; repair again) or the repaired state. When no record at all can be
read, nothing is changed and the exit status is 1.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from cronoq.store.journal import frames
from cronoq.store.journal.journal import create_journal, install_snapshot
from cronoq.store.journal.reading import (
    LOCK,
    SNAPSHOT,
    FileRead,
    StoreError,
    claim,
    journal_generations,
    journal_path,
    lock,
    read_file,
    release,
)
from cronoq.store.journal.replay import Replay

SHOWN_IDS = 50
"""Lost task ids printed; the report file beside the copy lists them all."""


@dataclass
class Survey:
    """What a data_dir holds, read past every damaged range."""

    replay: Replay = field(default_factory=Replay)
    reads: list[FileRead] = field(default_factory=list)
    generations: list[int] = field(default_factory=list)
    snapshot_header_lost: bool = False

    @property
    def damaged(self) -> bool:
        """Whether anything is more than a journal's torn tail."""
        return any(read.damage or (read.kind == "snapshot" and not read.whole_snapshot()) for read in self.reads)

    @property
    def records(self) -> int:
        return sum(read.records for read in self.reads)


def survey(data_dir: Path) -> Survey:
    """Read the snapshot and the journals after it, skipping damaged ranges. Changes nothing.

    Raises StoreError for a file of another kind or format, or a frame that checks out but cannot be decoded:
    those are no damage a repair could undo.
    """
    found = Survey(generations=journal_generations(data_dir))
    first = 1
    snapshot = data_dir / SNAPSHOT
    if snapshot.exists():
        read = read_file(snapshot, "snapshot", found.replay, skip_damage=True)
        found.reads.append(read)
        if read.header is not None:
            first = read.header.generation
        else:  # which journals follow it is unknown: replay them all (older changes may come back; none is lost)
            found.snapshot_header_lost = True
            first = found.generations[0] if found.generations else 1
    for generation in found.generations:
        if generation >= first:
            found.reads.append(read_file(journal_path(data_dir, generation), "journal", found.replay,
                                         skip_damage=True))
    return found


def repair(data_dir: Path, out: TextIO = sys.stdout) -> int:
    """Repair `data_dir` if it is damaged, reporting to `out`; returns the exit status (0: healthy or repaired).

    Raises StoreError when it cannot: data_dir in use, a file of an unknown format, a failed copy.
    """
    if not data_dir.is_dir() or not ((data_dir / SNAPSHOT).exists() or journal_generations(data_dir)):
        print(f"{data_dir} holds no journal or snapshot: nothing to repair, nothing changed", file=out)
        return 0
    try:
        lock_fd, created = lock(data_dir)
    except StoreError as exc:
        raise StoreError(f"{str(exc).split(';')[0]}: stop it before repairing") from None
    changed = False
    try:
        found = survey(data_dir)
        lines = [line for read in found.reads for line in _describe(read)]
        if not found.damaged:
            print(f"{data_dir} is healthy: nothing to repair, nothing changed", *lines, sep="\n", file=out)
            return 0
        lines += _losses(found)
        if found.records == 0:
            print(f"{data_dir} is damaged and no record could be read from it", *lines,
                  "nothing was changed; to start the broker with no tasks, move data_dir away", sep="\n", file=out)
            return 1
        copy = _copy_originals(data_dir)
        changed = True
        generation = max([*journal_generations(data_dir), *_generations_named(found)]) + 1
        try:
            claim(lock_fd)
            _write_state(data_dir, generation, found.replay)
        except OSError as exc:
            raise StoreError(f"cannot write the repaired state in {data_dir}: {exc.strerror or exc}; the original "
                             f"files are in {copy}; run the repair again") from None
        report = [f"{data_dir} was damaged; the original files are in {copy}", *lines,
                  f"wrote a snapshot of {_count(len(found.replay.by_id), 'task record')} (generation {generation}) and an "
                  f"empty {journal_path(data_dir, generation).name}: the broker can start"]
        (copy / "repair-report.txt").write_text("\n".join(report) + "\n" + _all_lost(found))
        print(*report, sep="\n", file=out)
        return 0
    finally:
        if changed:
            os.close(lock_fd)
        else:
            release(data_dir, lock_fd, created)


def _describe(read: FileRead) -> list[str]:
    """One file's lines of the report: what was read, then each range skipped."""
    parts = []
    if read.kind == "snapshot":
        parts.append(f"generation {read.header.generation}" if read.header else "its header frame is lost")
    parts.append(f"{_count(read.frames, 'intact frame')}, {_count(read.records, 'record')}")
    if read.kind == "snapshot" and read.header is not None:
        if read.expected is None:
            parts.append("its end record is lost: how many records it held is unknown")
        elif read.expected != read.records:
            parts.append(f"its end record counts {read.expected} records: {read.expected - read.records} lost")
    if not read.gaps and read.kind == "journal":
        parts.append("whole")
    lines = [f"  {read.path.name}: " + "; ".join(parts)]
    for gap in read.gaps:
        if gap.torn and read.kind == "journal":
            lines.append(f"    a torn tail at offset {gap.start} ({gap.what}), which a start cuts off anyway")
        else:
            lines.append(f"    skipped bytes {gap.start} to {gap.end} ({gap.end - gap.start} bytes): {gap.what}")
    return lines


def _losses(found: Survey) -> list[str]:
    """The report's lines on lost tasks."""
    lines = []
    if found.snapshot_header_lost:
        lines.append("  the snapshot's generation is lost with its header: every journal was replayed after it "
                     "(a change it already held may be applied again; none is lost for it)")
    lost = sorted(found.replay.orphan_ids)
    if lost:
        shown = ", ".join(lost[:SHOWN_IDS]) + (f", ... ({len(lost)} in all: see repair-report.txt)"
                                               if len(lost) > SHOWN_IDS else "")
        lines.append(f"lost: {_count(len(lost), 'task')} that journal records name but whose accepted record went "
                     f"with the damage (the payload is gone): {shown}")
    else:
        lines.append("lost: no task is known by id to be lost")
    lines.append("  a task whose records were read may still have lost a later change in a skipped range "
                 "(it may run again, or show an older state)")
    return lines


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def _all_lost(found: Survey) -> str:
    lost = sorted(found.replay.orphan_ids)
    return "".join(f"lost task: {task_id}\n" for task_id in lost)


def _generations_named(found: Survey) -> list[int]:
    return [read.header.generation for read in found.reads if read.header is not None]


def _copy_originals(data_dir: Path) -> Path:
    """Copy every file of data_dir (but the lock) into a new damaged-<UTC time>/ beside them; returns it."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    copy = data_dir / f"damaged-{stamp}"
    suffix = 1
    while copy.exists():
        suffix += 1
        copy = data_dir / f"damaged-{stamp}-{suffix}"
    copy.mkdir()
    try:
        for path in sorted(data_dir.iterdir()):
            if path.is_file() and path.name != LOCK:
                shutil.copy2(path, copy / path.name)
                fd = os.open(copy / path.name, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        frames.fsync_dir(copy)
        frames.fsync_dir(data_dir)
    except OSError as exc:
        shutil.rmtree(copy, ignore_errors=True)
        raise StoreError(f"cannot copy the files of {data_dir} to {copy}: {exc.strerror or exc}; "
                         "nothing was changed") from None
    return copy


def _write_state(data_dir: Path, generation: int, replay: Replay) -> None:
    """The recovered records as a new generation, the way a compaction writes one; leftovers go."""
    os.close(create_journal(data_dir, generation))
    install_snapshot(data_dir, generation, replay.ordered(), sorted(replay.paused))
    for leftover in data_dir.glob("*.tmp"):
        leftover.unlink()
    frames.fsync_dir(data_dir)
