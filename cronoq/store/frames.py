"""Checksummed frames in a file: how the journal and the snapshot are laid out on disk.

A file is a sequence of frames, each

    length (u32, little-endian) | crc32 of the body (u32, little-endian) | body (length bytes)

A write that was cut short (the process died mid-`write`, or the machine
lost power before the page cache reached the disk) leaves a frame whose
length runs past the end of the file, or whose checksum does not match, or
zeros. Reading stops at the first such frame: everything before it is
intact, because frames are only ever appended.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Iterable, Iterator

_HEADER = struct.Struct("<II")
HEADER_SIZE = _HEADER.size
MAX_FRAME = 1 << 31
"""No frame is larger: a length above it is damage, not data."""


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


class FrameReader:
    """Iterates over the intact frames of a file as (offset, body).

    After the iteration, `end` is the offset just past the last intact frame
    and `problem` says why reading stopped early (None: the file ended cleanly).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.end = 0
        self.size = 0
        self.problem: str | None = None

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        with open(self.path, "rb") as f:
            self.size = os.fstat(f.fileno()).st_size
            offset = 0
            while offset < self.size:
                header = f.read(HEADER_SIZE)
                if len(header) < HEADER_SIZE:
                    self.problem = f"a frame header cut off after {len(header)} of {HEADER_SIZE} bytes"
                    return
                length, crc = _HEADER.unpack(header)
                if length == 0 or length > MAX_FRAME:
                    self.problem = f"an impossible frame length {length}"
                    return
                if offset + HEADER_SIZE + length > self.size:
                    self.problem = f"a frame of {length} bytes cut off by the end of the file"
                    return
                body = f.read(length)
                if zlib.crc32(body) != crc:
                    self.problem = "a frame whose checksum does not match"
                    return
                yield offset, body
                offset += HEADER_SIZE + length
                self.end = offset


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
    size = 0
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        for body in bodies:
            size += append(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fsync_dir(path.parent)
    return size
