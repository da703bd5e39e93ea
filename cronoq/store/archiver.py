"""The archiver: a process of its own that writes finished tasks to the results store and applies retention.

The broker (cronoq.store.archive) starts it with one end of a Unix socket
pair and sends it finished records once they are in the journal. For each
batch it receives the archiver

1. inserts the rows, and sets their scopes' bits in the shared filter
   (cronoq.store.scopes);
2. drops the oldest rows while they are older than `result_ttl` or the rows
   weigh more than `result_retention_bytes` (the broker's clock: every
   message carries its time);
3. commits, fsynced (SQLite WAL, synchronous=FULL), with `archived_through`;
4. tells the broker `Stored(through)`: the broker may now let the records go
   from memory, and leave them out of its next snapshot.

Why a process and not a thread: the broker's loop holds the GIL almost all
the time under load, and SQLite's module releases and takes it back around
every row; a writer thread got a few thousand rows a second and slowed the
loop by a third (docs/durability.md has the measurements).

When the broker goes (the socket closes, or on Linux PR_SET_PDEATHSIG), the
archiver finishes its batch and exits; it ignores SIGINT, which a terminal
sends to the whole process group, so that the broker shuts it down itself.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import mmap
import os
import signal
import socket
import sqlite3
import struct
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Union

import msgspec

from cronoq.book import TaskRecord
from cronoq.store import results
from cronoq.store.scopes import ScopeFilter, log2_for

log = logging.getLogger("cronoq.archiver")

_MASK64 = (1 << 64) - 1
BATCH_RECORDS = 20_000
"""Records per transaction, at most: a backlog is written in pieces, each acknowledged."""
EVICT_ROWS = 50_000
"""Rows dropped per transaction, at most (a day's worth can expire at once)."""


# --------------------------------------------------------------------- messages


class _Message(msgspec.Struct, array_like=True):
    pass


class Put(_Message, tag="put"):
    """Finished records to store (in the order they finished); `now` is the broker's clock."""

    now: float
    records: list[TaskRecord]  # sent in their stored_form


class Tick(_Message, tag="tick"):
    """The broker's clock, for retention by age when no records come."""

    now: float


class Retention(_Message, tag="retention"):
    ttl: float
    max_bytes: int


class Stored(_Message, tag="stored"):
    """Every record numbered up to `through` is durable in the store; what it holds now; how many messages
    from the broker it has handled in all."""

    through: int
    rows: int
    bytes: int
    handled: int


class FilterReady(_Message, tag="filter"):
    """A new scope filter of 2**log2 bits, in the shared memory whose descriptor comes with this message."""

    log2: int


ToArchiver = Union[Put, Tick, Retention]
FromArchiver = Union[Stored, FilterReady]

_LENGTH = struct.Struct("<I")
encode = msgspec.msgpack.Encoder().encode


def frame(message: _Message) -> bytes:
    """A message as it crosses the socket: its length, then its msgpack encoding."""
    body = encode(message)
    return _LENGTH.pack(len(body)) + body


class FrameBuffer:
    """Bytes read from the socket, cut into message bodies."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._data
        buf += data
        bodies, at = [], 0
        while len(buf) - at >= 4:
            (length,) = _LENGTH.unpack_from(buf, at)
            if len(buf) - at - 4 < length:
                break
            bodies.append(bytes(buf[at + 4:at + 4 + length]))
            at += 4 + length
        del buf[:at]
        return bodies


# --------------------------------------------------------------------- the store's writer


class Writer:
    """Writes batches to the store and applies retention: the archiver's state, without its socket."""

    def __init__(self, path: Path, ttl: float, max_bytes: int, now: float) -> None:
        self.db = results.connect(path)
        self.db.execute("PRAGMA synchronous = FULL")  # a Stored reply lets the broker drop the journal's copy
        self.db.execute("PRAGMA journal_size_limit = 8388608")
        self.db.execute("PRAGMA cache_size = -65536")  # 64 MiB: the indexes' pages stay in memory
        self.ttl, self.max_bytes, self.now = ttl, max_bytes, now
        self.through = results.read_mark(self.db)
        self.rows, self.bytes = self.db.execute("SELECT count(*), coalesce(sum(size), 0) FROM results").fetchone()
        self.filter: ScopeFilter | None = None
        self.filter_fd = -1
        self.entries = 0  # tasks added to the filter (some since dropped)
        self.dropped = 0  # rows dropped since the filter was built (their bits stay)

    def store(self, records: list[TaskRecord]) -> None:
        """Insert (or replace: a record sent again after a restart) within the open transaction."""
        rows = [results.row(record) for record in records]
        resent = any(record.seq <= self.through for record in records)
        self.db.executemany(results.INSERT, rows)
        self.through = max(self.through, max(record.seq for record in records))
        scopes = self.filter
        if scopes is not None:
            for _, _, submission, key, _, _, _ in rows:
                if submission is not None:
                    scopes.add(submission & _MASK64)
                if key is not None:
                    scopes.add(key & _MASK64)
        self.entries += len(records)
        if resent:  # rows replaced rather than added: count again
            self.rows, self.bytes = self.db.execute("SELECT count(*), coalesce(sum(size), 0) FROM results").fetchone()
        else:
            self.rows += len(rows)
            self.bytes += sum(values[5] for values in rows)

    def evict(self) -> bool:
        """Drop the oldest rows past result_ttl or over result_retention_bytes; True if more remain to drop."""
        cutoff = self.now - self.ttl
        excess = self.bytes - self.max_bytes
        last, freed, count = None, 0, 0
        for seq, finished_at, size in self.db.execute(
                "SELECT seq, finished_at, size FROM results ORDER BY seq LIMIT ?", (EVICT_ROWS,)):
            if finished_at > cutoff and freed >= excess:
                break
            last, freed, count = seq, freed + size, count + 1
        if last is None:
            return False
        self.db.execute("DELETE FROM results WHERE seq <= ?", (last,))
        self.rows -= count
        self.bytes -= freed
        self.dropped += count
        return count == EVICT_ROWS

    def begin(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('archived_through', ?)", (self.through,))
        self.db.execute("COMMIT")

    def filter_is_stale(self) -> bool:
        """Whether the filter should be rebuilt: too full for its size, or holding as many forgotten tasks as
        stored ones."""
        if self.filter is None:
            return True
        return self.entries > self.filter.capacity or self.dropped > max(self.rows, self.filter.capacity // 8)

    def build_filter(self) -> tuple[int, int]:
        """A new filter of every row's scopes, in new shared memory; returns (its fd, log2)."""
        log2 = log2_for(2 * self.rows)
        size = 1 << (log2 - 3)
        fd = _shared_memory(size)
        bits = mmap.mmap(fd, size)
        new = ScopeFilter(bits, log2)
        rows = weight = 0
        add = new.add
        for submission, key, size in self.db.execute("SELECT submission_scope, key_scope, size FROM results"):
            if submission is not None:
                add(submission & _MASK64)
            if key is not None:
                add(key & _MASK64)
            rows, weight = rows + 1, weight + size
        self.rows, self.bytes = rows, weight  # counted afresh while at it
        old, self.filter = self.filter, new
        if old is not None:
            old.bits.close()  # type: ignore[union-attr]
        if self.filter_fd >= 0:
            os.close(self.filter_fd)
        self.filter_fd = fd
        self.entries, self.dropped = rows, 0
        return fd, log2


def _shared_memory(size: int) -> int:
    """A descriptor of `size` bytes of zeroed memory that another process can map."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("cronoq-scopes")
    else:  # not Linux: an unlinked temporary file serves
        handle, name = tempfile.mkstemp(prefix="cronoq-scopes-")
        os.unlink(name)
        fd = handle
    os.ftruncate(fd, size)
    return fd


# --------------------------------------------------------------------- the process


class Archiver:
    """The archiver's loop: read what the broker sends, write it, say what is stored."""

    def __init__(self, sock: socket.socket, writer: Writer) -> None:
        self.sock = sock
        self.writer = writer
        self._frames = FrameBuffer()
        self._decode = msgspec.msgpack.Decoder(ToArchiver).decode
        self._waiting: deque[ToArchiver] = deque()
        self._closed = False
        self._handled = 0

    def run(self) -> None:
        self._send_filter()
        more = self._round([], report=True)
        while not self._closed or self._waiting:
            batch, heard = self._take_batch(block=not more)
            more = self._round(batch, report=heard)
        self.writer.db.close()

    def _round(self, records: list[TaskRecord], *, report: bool) -> bool:
        """Store a batch and apply retention in one transaction; reply Stored if anything changed or a message
        was read (so that the broker knows when the archiver has caught up with what it sent)."""
        writer = self.writer
        writer.begin()
        if records:
            writer.store(records)
        before = writer.rows
        more = writer.evict()
        if records or writer.rows != before:
            writer.commit()
            report = True
        else:
            writer.db.execute("ROLLBACK")
        if report:
            self._send(Stored(writer.through, writer.rows, writer.bytes, self._handled))
        if writer.filter_is_stale():
            self._send_filter()
        return more

    def _take_batch(self, *, block: bool) -> tuple[list[TaskRecord], bool]:
        """Up to BATCH_RECORDS records from what the broker sent (waiting for something when `block`), and
        whether any message was read."""
        if not self._waiting and not self._closed:
            self._receive(block=block)
            self._receive(block=False)
        records: list[TaskRecord] = []
        writer = self.writer
        heard = bool(self._waiting)
        while self._waiting and len(records) < BATCH_RECORDS:
            message = self._waiting.popleft()
            self._handled += 1
            match message:
                case Put():
                    records.extend(message.records)
                    writer.now = max(writer.now, message.now)
                case Tick():
                    writer.now = max(writer.now, message.now)
                case Retention():
                    writer.ttl, writer.max_bytes = message.ttl, message.max_bytes
        return records, heard

    def _receive(self, *, block: bool) -> None:
        self.sock.setblocking(block)
        try:
            while True:
                data = self.sock.recv(1 << 20)
                if not data:
                    self._closed = True
                    return
                self._waiting.extend(self._decode(body) for body in self._frames.feed(data))
                if block:
                    return
        except BlockingIOError:
            return
        except (ConnectionResetError, BrokenPipeError):
            self._closed = True

    def _send(self, message: _Message, fd: int | None = None) -> None:
        try:
            if fd is None:
                self.sock.setblocking(True)
                self.sock.sendall(frame(message))
            else:
                self.sock.setblocking(True)
                socket.send_fds(self.sock, [frame(message)], [fd])
        except (BrokenPipeError, ConnectionResetError):
            self._closed = True

    def _send_filter(self) -> None:
        fd, log2 = self.writer.build_filter()
        self._send(FilterReady(log2), fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cronoq-archiver", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the socket to the broker")
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--now", type=float, required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != args.parent:
        return 1
    sock = socket.socket(fileno=args.fd)
    try:
        writer = Writer(args.db, args.ttl, args.max_bytes, args.now)
        Archiver(sock, writer).run()
    except sqlite3.Error as exc:
        log.error("the results store %s cannot be written: %s", args.db, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
