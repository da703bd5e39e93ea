"""The archiver: a process of its own that writes finished tasks to the results store and applies retention.

The broker (cronoq.store.results.shipping) starts it with one end of a Unix socket
pair and sends it finished records once they are in the journal. It gathers
what comes for up to GATHER_SECONDS, then, for each batch,

1. inserts the rows (cronoq.store.results.database.Writer), and sets their scopes'
   bits in the filter it shares with the broker (cronoq.store.results.scopes);
2. drops the oldest tables while the rows weigh more than
   `result_retention_bytes`, or a table's rows are all past `result_ttl`
   (by the broker's clock: every message carries its time);
3. commits, fsynced (SQLite WAL, synchronous=FULL), with `archived_through`;
4. tells the broker `Stored(through)`: the broker may now let the records go
   from memory, and leave them out of its next snapshot.

It rebuilds the filter when retention has dropped as many tasks as it holds
(a Bloom filter cannot forget), and hands the broker each new one, in new
shared memory, with the descriptor passed over the socket.

Why a process and not a thread: the broker's loop holds the GIL almost all
the time under load, and SQLite's module releases and takes it back around
every row; a writer thread managed about half the rows asked of it and
slowed a busy loop by a sixth (`python -m bench.retention thread`).

When the broker goes (the socket closes, or on Linux PR_SET_PDEATHSIG), the
archiver finishes its batch and exits; it ignores SIGINT, which a terminal
sends to the whole process group, so that the broker shuts it down itself.
"""

from __future__ import annotations

import argparse
import logging
import mmap
import os
import select
import signal
import socket
import sqlite3
import struct
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any, Union

import msgspec

from cronoq.store.lifeline import bind_to_parent
from cronoq.store.results import database
from cronoq.store.results.scopes import ScopeFilter, log2_for

log = logging.getLogger("cronoq.archiver")

BATCH_RECORDS = 20_000
"""Records per transaction, at most: a backlog is written in pieces, each acknowledged."""
GATHER_SECONDS = 0.2
"""How long the archiver gathers what the broker sends before it writes a batch (see `Archiver._gather`)."""


# --------------------------------------------------------------------- messages


class _Message(msgspec.Struct, array_like=True):
    pass


class Put(_Message, tag="put"):
    """Finished records to store (in the order they finished); `now` is the broker's clock."""

    now: float
    records: list[Any]  # sent in their stored_form; the archiver reads each as its encoding (_Received)


class _Received(_Message, tag="put"):
    """A Put as the archiver reads it: each record's msgpack encoding as it came, which is what the store keeps
    (decoding records and encoding them again would cost a microsecond a task for the same bytes)."""

    now: float
    records: list[msgspec.Raw]


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
_Incoming = Union[_Received, Tick, Retention]
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


# --------------------------------------------------------------------- the scope filter


class FilterKeeper:
    """The shared scope filter the archiver keeps for the broker, and when it is due for a rebuild."""

    def __init__(self) -> None:
        self.filter: ScopeFilter | None = None
        self._bits: mmap.mmap | None = None
        self._fd = -1
        self.entries = 0  # tasks added (some since dropped)
        self.dropped = 0  # rows dropped since the filter was built (their bits stay)

    def add(self, rows: list[tuple]) -> None:
        """Set the bits of stored rows' scopes (as database.rows gives them)."""
        scopes = self.filter
        if scopes is not None:
            scopes.add_all([values[2] for values in rows])
            scopes.add_all([values[3] for values in rows])
        self.entries += len(rows)

    def is_stale(self, rows: int) -> bool:
        """Whether to rebuild: too full for its size (dropped tasks' bits count: a Bloom filter cannot forget), or
        much bigger than the store needs now that retention has dropped most of what it held.

        At a steady state (as many dropped as stored) a filter is rebuilt once it holds its capacity, not once
        it holds as many dropped tasks as stored ones: its false "maybe"s stay within what it was sized for
        (BITS_PER_TASK), and a rebuild, which reads every row's scopes back, comes a half to a third as often
        (a microsecond of the archiver's CPU per task before, at the default retention)."""
        if self.filter is None:
            return True
        if self.entries > self.filter.capacity:
            return True
        return self.dropped > max(rows, self.filter.capacity // 8) and log2_for(2 * rows) < self.filter.log2

    def rebuild(self, writer: database.Writer) -> tuple[int, int]:
        """A new filter of every row's scopes, in new shared memory; returns (its fd, log2)."""
        rows = writer.rows
        log2 = log2_for(2 * rows)
        size = 1 << (log2 - 3)
        fd = _shared_memory(size)
        bits = mmap.mmap(fd, size)
        new = ScopeFilter(bits, log2)
        new.add_all(scope for (scope,) in writer.scopes())
        if self.filter is not None:
            self.filter.release()  # its view of the old memory, which cannot be unmapped while one is held
        if self._bits is not None:
            self._bits.close()
        if self._fd >= 0:
            os.close(self._fd)
        self.filter, self._bits, self._fd = new, bits, fd
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

    def __init__(self, sock: socket.socket, writer: database.Writer) -> None:
        self.sock = sock
        self.writer = writer
        self.scopes = FilterKeeper()
        self._frames = FrameBuffer()
        self._decode = msgspec.msgpack.Decoder(_Incoming).decode
        self._waiting: deque[_Incoming] = deque()
        self._closed = False
        self._handled = 0

    def run(self) -> None:
        self._send_filter()
        self._round([], report=True)
        while not self._closed or self._waiting:
            batch, heard = self._take_batch()
            self._round(batch, report=heard)
        self.writer.close()

    def _round(self, records: list[msgspec.Raw], *, report: bool) -> None:
        """Store a batch and apply retention in one transaction; reply Stored if anything changed or a message
        was read (so that the broker knows when the archiver has caught up with what it sent)."""
        writer = self.writer
        writer.begin()
        if records:
            self.scopes.add(writer.store(records))
        dropped = writer.evict()
        self.scopes.dropped += dropped
        if records or dropped:
            writer.commit()
            report = True
        else:
            writer.rollback()
        if report:
            self._send(Stored(writer.through, writer.rows, writer.bytes, self._handled))
        if self.scopes.is_stale(writer.rows):
            self._send_filter()

    def _take_batch(self) -> tuple[list[msgspec.Raw], bool]:
        """Up to BATCH_RECORDS records from what the broker sent (waiting for something), and whether any
        message was read."""
        if not self._waiting and not self._closed:
            self._receive(block=True)
            self._gather()
        records: list[msgspec.Raw] = []
        writer = self.writer
        heard = bool(self._waiting)
        while self._waiting and len(records) < BATCH_RECORDS:
            message = self._waiting.popleft()
            self._handled += 1
            match message:
                case _Received():
                    records.extend(message.records)
                    writer.now = max(writer.now, message.now)
                case Tick():
                    writer.now = max(writer.now, message.now)
                case Retention():
                    writer.ttl, writer.max_bytes = message.ttl, message.max_bytes
        return records, heard

    def _gather(self) -> None:
        """Go on reading for up to GATHER_SECONDS, or until a whole batch waits: a transaction costs SQLite
        less per row the more rows it holds (16 us at 1,000 rows, 7 at 5,000 with the first schema; now, at 28,000
        tasks a second, a commit cost 1.4 us a row after 0.1 s, 1.1 after 0.2 s), and the wait costs the broker
        only the memory of a fifth of a second's finished records (about 4 MB at that rate)."""
        end = time.monotonic() + GATHER_SECONDS
        while not self._closed:
            self._receive(block=False)
            left = end - time.monotonic()
            waiting = sum(len(message.records) for message in self._waiting if isinstance(message, _Received))
            if left <= 0 or waiting >= BATCH_RECORDS:
                return
            select.select([self.sock], [], [], left)

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
        fd, log2 = self.scopes.rebuild(self.writer)
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
    if not bind_to_parent(args.parent):
        return 1
    sock = socket.socket(fileno=args.fd)
    try:
        writer = database.Writer(args.db, args.ttl, args.max_bytes, args.now)
        Archiver(sock, writer).run()
    except sqlite3.Error as exc:
        log.error("the results store %s cannot be written: %s", args.db, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
