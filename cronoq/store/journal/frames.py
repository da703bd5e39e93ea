"""Checksummed frames in a file, and the rule that tells a torn tail from damage.

A file is a sequence of frames, each

    length (u32, little-endian) | crc32 of the body (u32, little-endian) | body (length bytes)

appended with one `writev` on a file opened with O_APPEND. An append that
was cut short can only leave something at the end of the file:

- a process crash (kill -9, a full disk) leaves a prefix of the frame: a
  header cut off by the end of the file, or a whole header whose length
  runs past the end of the file (its body cut off);
- a power loss can also leave the file longer than what reached the disk:
  the frame's bytes, or the bytes after it, read back as zeros, and a frame
  that fits may then fail its checksum.

**The rule.** Frames are read from offset 0 while they are intact (a length
from 1 to MAX_FRAME that fits in the file, and a matching checksum). The
first frame that is not starts the *problem*. The rest of the file is a
**torn tail**, which a reader may cut off, when it is

1. fewer than 8 bytes (a header cut off), or zero bytes only; or
2. a header whose length runs past the end of the file, or a frame that
   fits but fails its checksum and is followed by nothing or by zero bytes
   only — unless its length is what is damaged: unless the bytes after its
   header, up to the start of a later intact frame (or torn tail) or up to
   the end of the file, match its checksum. A body cut short, or zeroed,
   cannot match the checksum of the whole one.

Anything else is **damage**, never to be cut off: an impossible length, a
bad checksum followed by more than zeros, a damaged length, and so a bad
first frame of a file that holds more. A flipped bit in any frame but the
last is damage; in the last one it can look exactly like a torn write and be
taken for one (its length made larger than the file), which no rule avoids.
(Two faults in one frame, its length and its body, can also pass for a torn
tail.)

Why case 2 does not simply ask "is there an intact frame anywhere after
it?": what follows the header of a torn frame is its own body, and a body
holds clients' payloads, which can contain bytes that form intact frames.
They would turn every crash during such a client's submit into a refusal to
start. The checksum tells a damaged length from a torn write instead.

**Resynchronising** past damage (to say where intact frames resume, and for
repairs) tries later offsets as the start of a frame: its length must fit,
its checksum match, and it must be followed by the end of the file, by
another intact frame, or by a torn tail. A reader can be given `candidates`,
a cheap filter naming the offsets where a body could begin (the journal's
bodies are msgpack arrays of tagged records), so that only those are
checksummed. Finding where intact frames resume may be wrong in one way: a
payload inside the damaged frame that imitates frames is taken for frames.
The cost is bounded: one pass over the bytes after the problem, plus
checksums of at most RESYNC_WORK times the file's size (and RESYNC_MIN_WORK
bytes); past that a reader gives up and treats the rest of the file as
damaged. Telling a torn tail from damage never needs more than one pass.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Union

_HEADER = struct.Struct("<II")
HEADER_SIZE = _HEADER.size
MAX_FRAME = 1 << 31
"""No frame is larger: a length above it is damage, not data."""
RESYNC_WORK = 4
"""Resynchronising checksums at most this many times the file's size (plus RESYNC_MIN_WORK bytes)."""
RESYNC_MIN_WORK = 64 << 20

Buffer = Union[bytes, mmap.mmap]
Candidates = Callable[[Buffer, int], Iterable[int]]
"""(buffer, start) -> ascending offsets >= start where a frame's body could begin."""


def append(fd: int, body: bytes) -> int:
    """Write one frame at the end of the file `fd` was opened on (O_APPEND); returns the bytes written."""
    header = _HEADER.pack(len(body), zlib.crc32(body))
    total = HEADER_SIZE + len(body)
    written = os.writev(fd, (header, body))
    if written < total:  # rare (a signal, a full disk): finish the frame, or raise OSError trying
        rest = memoryview(header + body)[written:]
        while rest:
            rest = rest[os.write(fd, rest):]
    return total


@dataclass(frozen=True)
class Gap:
    """Bytes [start, end) of a file that hold no intact frame, and what was wrong at `start`."""

    start: int
    end: int
    what: str
    torn: bool
    """A torn tail (see the module's rule), which runs to the end of the file; else damage."""


class FrameReader:
    """Iterates over the intact frames of a file as (offset, body), classifying what it cannot read.

    By default it stops at the first problem: `problem` is then the Gap from
    there to the end of the file (or to the next intact frame, for damage),
    and `end` the offset where it starts. With `skip_damage` (for repairs) it
    resynchronises past each damaged range and carries on; `gaps` lists them.
    """

    def __init__(self, path: Path, *, candidates: Candidates | None = None, skip_damage: bool = False) -> None:
        self.path = path
        self.end = 0
        """Offset just past the last intact frame read before the first gap."""
        self.size = 0
        self.gaps: list[Gap] = []
        self._candidates = candidates or _every_offset
        self._skip_damage = skip_damage
        self._work_left = 0

    @property
    def problem(self) -> Gap | None:
        """The first gap, or None when the file ended cleanly."""
        return self.gaps[0] if self.gaps else None

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        with open(self.path, "rb") as f:
            self.size = size = os.fstat(f.fileno()).st_size
            if size == 0:
                return
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                self._work_left = RESYNC_WORK * size + RESYNC_MIN_WORK
                offset = 0
                while offset < size:
                    body = _body(buf, offset, size)
                    if body is not None:
                        yield offset, body
                        offset += HEADER_SIZE + len(body)
                        if not self.gaps:
                            self.end = offset
                        continue
                    shape, what = _problem(buf, offset, size)
                    body_end = self._real_body_end(buf, offset) if shape == _TORN_UNLESS_LENGTH else None
                    if shape != _DAMAGE and body_end is None:
                        gap = Gap(offset, size, what, torn=True)
                    elif body_end is not None:
                        length = _HEADER.unpack_from(buf, offset)[0]
                        what = (f"a frame header whose length is damaged: it says {length} bytes, but the "
                                f"{body_end - offset - HEADER_SIZE} after it match its checksum")
                        if self._skip_damage:  # only the length was lost: the frame itself can be read
                            self.gaps.append(Gap(offset, offset + HEADER_SIZE, what + " (read)", torn=False))
                            yield offset, buf[offset + HEADER_SIZE:body_end]
                            offset = body_end
                            continue
                        gap = Gap(offset, body_end, what, torn=False)
                    else:
                        resumes = self._resync(buf, offset + 1)
                        if resumes is None:
                            what += f"; gave up looking for intact frames after checksumming {self._budget_text()}"
                        gap = Gap(offset, size if resumes is None else resumes, what, torn=False)
                    self.gaps.append(gap)
                    if not self._skip_damage or gap.torn:
                        return
                    offset = gap.end

    def _real_body_end(self, buf: Buffer, offset: int) -> int | None:
        """If the frame at `offset` has a whole body and a damaged length: where the body ends (the start of a
        later intact frame or torn tail, or the end of the file, up to which the bytes after its header match
        its checksum)."""
        size = self.size
        crc = _HEADER.unpack_from(buf, offset)[1]
        running, done = 0, offset + HEADER_SIZE
        for body in self._candidates(buf, done + 1 + HEADER_SIZE):
            end = body - HEADER_SIZE
            if end >= size:
                break
            running = zlib.crc32(buf[done:end], running)
            done = end
            if running == crc and (_body(buf, end, size) is not None or _problem(buf, end, size)[0] != _DAMAGE):
                return end
        if size == offset + HEADER_SIZE:  # no body at all: a frame is never empty
            return None
        return size if zlib.crc32(buf[done:size], running) == crc else None

    def _resync(self, buf: Buffer, start: int) -> int | None:
        """Offset of the first confirmed intact frame at or after `start`; the size if none; None: gave up."""
        size = self.size
        for body in self._candidates(buf, start + HEADER_SIZE):
            offset = body - HEADER_SIZE
            if offset + HEADER_SIZE >= size:
                break
            length = _HEADER.unpack_from(buf, offset)[0]
            if not 0 < length <= size - body:
                continue
            if not self._spend(length):
                return None
            if _body(buf, offset, size) is None:
                continue
            end = body + length
            if end == size:
                return offset
            following = _HEADER.unpack_from(buf, end)[0] if size - end >= HEADER_SIZE else 0
            if 0 < following <= size - end - HEADER_SIZE:
                if not self._spend(following):
                    return None
                if _body(buf, end, size) is not None:
                    return offset
            if _problem(buf, end, size)[0] != _DAMAGE:
                return offset
        return size

    def _spend(self, nbytes: int) -> bool:
        self._work_left -= nbytes
        return self._work_left >= 0

    def _budget_text(self) -> str:
        return f"{RESYNC_WORK * self.size + RESYNC_MIN_WORK} bytes"


def _body(buf: Buffer, offset: int, size: int) -> bytes | None:
    """The body of the frame at `offset` if that frame is intact, else None."""
    if size - offset < HEADER_SIZE:
        return None
    length, crc = _HEADER.unpack_from(buf, offset)
    end = offset + HEADER_SIZE + length
    if length == 0 or length > MAX_FRAME or end > size:
        return None
    body = buf[offset + HEADER_SIZE:end]
    return body if zlib.crc32(body) == crc else None


_TORN, _TORN_UNLESS_LENGTH, _DAMAGE = "torn", "torn unless its length is damaged", "damage"
"""Shapes of what follows a problem (see the rule in the module's header: cases 1, 2, and the rest)."""


def _problem(buf: Buffer, offset: int, size: int) -> tuple[str, str]:
    """The shape of the file from the (not intact) frame at `offset` on, and what is wrong there."""
    rest = size - offset
    if rest < HEADER_SIZE:
        return _TORN, f"a frame header cut off after {rest} of {HEADER_SIZE} bytes by the end of the file"
    if _zeros(buf, offset, size):
        return _TORN, f"{rest} zero bytes up to the end of the file"
    length, _ = _HEADER.unpack_from(buf, offset)
    if length == 0 or length > MAX_FRAME:
        return _DAMAGE, f"an impossible frame length {length}"
    end = offset + HEADER_SIZE + length
    if end > size:
        return _TORN_UNLESS_LENGTH, (f"a frame of {length} bytes cut off after {rest - HEADER_SIZE} by the end "
                                     "of the file")
    if end == size:
        return _TORN_UNLESS_LENGTH, "the last frame's checksum does not match"
    if _zeros(buf, end, size):
        return _TORN_UNLESS_LENGTH, (f"a frame whose checksum does not match, then {size - end} zero bytes up to "
                                     "the end of the file")
    return _DAMAGE, f"a frame of {length} bytes whose checksum does not match"


def _zeros(buf: Buffer, start: int, end: int, chunk: int = 1 << 16) -> bool:
    """Whether buf[start:end] holds only zero bytes."""
    for at in range(start, end, chunk):
        piece = buf[at:min(at + chunk, end)]
        if piece.count(0) != len(piece):
            return False
    return True


def _every_offset(buf: Buffer, start: int) -> Iterable[int]:
    return range(start, len(buf))


def truncate(path: Path, size: int) -> None:
    """Cut a file back to `size` bytes and make the cut durable."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (new, renamed or removed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, bodies: Iterable[bytes]) -> int:
    """Write frames to `path` so that a crash leaves either the old file or the whole new one.

    Writes a temporary file beside it, fsyncs it, renames it over `path` and
    fsyncs the directory. Returns the size written.
    """
    temporary = path.with_name(path.name + ".tmp")
    size = write_durably(temporary, bodies)
    install(temporary, path)
    return size


def write_durably(path: Path, bodies: Iterable[bytes]) -> int:
    """Write frames to a new file at `path` (replacing any) and fsync it; returns the size written."""
    size = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        for body in bodies:
            size += append(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    return size


def install(temporary: Path, path: Path) -> None:
    """Rename a durably written file over `path`, and make the rename durable."""
    os.replace(temporary, path)
    fsync_dir(path.parent)
