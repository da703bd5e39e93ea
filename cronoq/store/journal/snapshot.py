"""What a snapshot file holds, frame by frame: written by the broker's own `compact` and by a compaction's child.

Both write the same frames (the header naming the generation, the paused
pools, the kept records, then the count that says the file is whole), so
they are made in one place; cronoq.store.journal.reading reads them back.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from cronoq.book.records import TaskRecord, stored_form
from cronoq.store.journal.records import FORMAT, End, Header, Paused, Record, encode

SNAPSHOT_FRAME_RECORDS = 1024
"""Records per snapshot frame: big enough to encode fast, small enough to read back in pieces."""


def snapshot_frames(generation: int, kept: Iterable[TaskRecord], paused: Iterable[str]) -> Iterator[bytes]:
    """A snapshot file's frames: its header, `paused` pools and `kept` records, SNAPSHOT_FRAME_RECORDS a frame, then
    the count."""
    yield encode([Header("snapshot", FORMAT, generation)])
    count = 0
    chunk: list[Record] = [Paused(pool, True) for pool in paused]
    for record in kept:
        chunk.append(stored_form(record))  # type: ignore[arg-type]
        if len(chunk) >= SNAPSHOT_FRAME_RECORDS:
            count += len(chunk)
            yield encode(chunk)
            chunk = []
    count += len(chunk)
    if chunk:
        yield encode(chunk)
    yield encode([End(count)])
