"""The broker's side of the results store: ship finished tasks to the archiver, let them go once stored.

The broker (cronoq.broker.durable) calls, once per pass of its loop and
after the journal commit:

- `ship(records)`: the tasks that finished in the pass, now in the journal,
  go to the archiver process (cronoq.store.results.archiver) over a Unix socket,
  without ever blocking the loop (what the socket cannot take waits here);
- `poll()`: read the archiver's replies; returns `archived_through`, up to
  which the task book may drop finished records from memory.

Lookups of tasks memory no longer holds (`find`, `find_key`,
`find_submission`) read the store directly with a connection of the
broker's own (WAL: readers never wait for the writer). Keys and submission
ids are first checked against the archiver's scope filter, shared memory
that it updates before each reply (cronoq.store.results.scopes), so that a submit
asks SQLite only when the filter says "maybe".

The archiver starts with the broker when the store holds anything (its
filter and retention are needed at once), and otherwise with the first
finished task it is sent (`begin`): a broker that never finishes a task
runs no archiver, and starts no process to find an empty store empty.

If the archiver dies, the broker starts another (at most one every
RESPAWN_INTERVAL seconds) and sends it every finished record still in
memory again: nothing is lost, since those records are in the journal and
in the next snapshot until a `Stored` reply covers them.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import msgspec

from cronoq.book.records import TaskRecord, stored_form
from cronoq.book.taskbook import TaskBook
from cronoq.errors import StoreError
from cronoq.store.lifeline import helper_environment
from cronoq.store.results import database
from cronoq.store.results.archiver import FilterReady, FrameBuffer, FromArchiver, Put, Retention, Stored, Tick, frame
from cronoq.store.results.scopes import ScopeFilter, key_scope, submission_scope

log = logging.getLogger("cronoq.store")

RESPAWN_INTERVAL = 5.0
"""Seconds between attempts to start the archiver again after it died."""
TICK_INTERVAL = 0.5
"""Seconds between the times the broker tells the archiver (result_ttl is applied that much late at most)."""
FLUSH_BYTES = 64 << 10
FLUSH_SECONDS = 0.02
"""What the broker sends the archiver waits until this many bytes are queued, or this long since the last send,
or the broker listens for its replies (each heartbeat, each reply): at full rate a pass's records are a few
kilobytes, and a send per pass (hundreds a second, each waking the archiver, which gathers for a fifth of a
second anyway: cronoq.store.results.archiver.GATHER_SECONDS) took 3.6 % of the broker's profile samples in the soak;
sent this way, 0.9 %."""
BACKLOG_WARNING = 64 << 20
"""Bytes waiting for the archiver past which the broker warns (once) that it does not keep up."""


def open_store(data_dir: Path) -> tuple[sqlite3.Connection, int]:
    """Open (or create) data_dir's results store; returns it and its `archived_through`. Raises StoreError."""
    path = data_dir / database.RESULTS
    try:
        db = database.connect(path)
        return db, database.read_mark(db)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot use the results store {path}: {exc}; if it is damaged, move it away to start "
                         "without the retained results (queued tasks are in the journal and are not affected)") \
            from None


class Archive:
    """The archiver process and the broker's view of the results store (see the module's doc)."""

    def __init__(self, data_dir: Path, db: sqlite3.Connection, archived_through: int, *, ttl: float,
                 max_bytes: int) -> None:
        self.data_dir = data_dir
        self.path = data_dir / database.RESULTS
        self.archived_through = archived_through
        self.shipped_through = archived_through
        self.rows = 0
        """Rows in the store, as of the archiver's last reply."""
        self.bytes = 0
        self.ttl, self.max_bytes = ttl, max_bytes
        self.respawns = 0
        self._sent = 0  # messages sent to this archiver
        self._handled = 0  # of which it has handled (its last reply says)
        self._reader = database.ResultsReader(db)
        self._reader.ttl = ttl
        self._filter: ScopeFilter | None = None
        self._filter_map: mmap.mmap | None = None
        self._decode = msgspec.msgpack.Decoder(FromArchiver).decode
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen | None = None
        self._outgoing = bytearray()
        self._last_flush = 0.0
        self._incoming = FrameBuffer()
        self._fds: list[int] = []
        self._now = 0.0
        self._last_tick = float("-inf")
        self._next_spawn = 0.0
        self._put_off = False  # `begin` found the store empty: no archiver until the first finished task
        self._warned = False
        self.needs_resend = False
        """The archiver was started again: the book's finished records must all be shipped again."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_reply: Callable[[], None] | None = None

    # ----------------------------------------------------------------- the process

    def begin(self, now: float) -> None:
        """Start the archiver if the store holds anything; otherwise put it off until a finished task is shipped
        (`ship`). Raises OSError."""
        self._now = self._reader.now = max(self._now, now)
        if self.archived_through > 0:  # rows carry a seq: an empty mark is a store that never held one
            self.start(now)
        else:
            self._put_off = True

    def start(self, now: float) -> None:
        """Start the archiver process. Raises OSError."""
        self._now = self._reader.now = max(self._now, now)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = helper_environment()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "cronoq.store.results.archiver", "--fd", str(theirs.fileno()), "--db", str(self.path),
                 "--ttl", repr(self.ttl), "--max-bytes", str(self.max_bytes), "--now", repr(now),
                 "--parent", str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
                close_fds=True,
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        if self._loop is not None and self._on_reply is not None:
            self._loop.add_reader(ours.fileno(), self._on_reply)
        self._sent = self._handled = 0
        self._next_spawn = time.monotonic() + RESPAWN_INTERVAL

    def watch(self, loop: asyncio.AbstractEventLoop, on_reply: Callable[[], None]) -> None:
        """Call `on_reply` from `loop` whenever the archiver has something to say (and from each new one)."""
        self._loop, self._on_reply = loop, on_reply
        if self._sock is not None:
            loop.add_reader(self._sock.fileno(), on_reply)

    def unwatch(self) -> None:
        if self._loop is not None and self._sock is not None:
            self._loop.remove_reader(self._sock.fileno())
        self._loop = self._on_reply = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def close(self, timeout: float = 5.0) -> None:
        """Let the archiver finish what it was sent and exit (killed after `timeout` seconds)."""
        self.unwatch()
        sock, process = self._sock, self._process
        self._sock = self._process = None
        deadline = time.monotonic() + timeout
        if sock is not None:
            try:
                sock.setblocking(True)
                sock.settimeout(timeout)
                sock.sendall(self._outgoing)
                sock.shutdown(socket.SHUT_WR)
                # It exits once it has stored what it was sent, and its end of the socket closes with it: read
                # to that end, which wakes at once (a wait for the process polls, waking up to 50 ms late).
                while sock.recv(1 << 16):
                    sock.settimeout(max(0.0, deadline - time.monotonic()))
            except OSError:  # the timeout too: the process is killed below
                pass
            sock.close()
        if process is not None:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._drop_filter()
        self._reader.close()

    def kill(self) -> None:
        """Kill the archiver at once (tests: as a crash would)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()

    # ----------------------------------------------------------------- shipping and replies

    def exchange(self, book: TaskBook, *, listen: bool = False, ship: bool = True) -> None:
        """After a journal commit: ship what finished in `book`, and let the book drop what is stored. The
        archiver's replies are read here with `listen` (or, unwatched, while anything is outstanding); a watched
        archive's replies wake the loop, which listens then, so a pass costs no read that finds nothing. A new
        archiver gets all the book's finished records again. With `ship` False (some of the book's changes are
        not in the journal's file yet) only the replies are read: the store must never hold an outcome the
        journal may lack."""
        if ship:
            self.ship(book.take_finished())
        if not (listen or self.needs_resend or self._sock is None) and (self._on_reply is not None or not self.waiting):
            # Nothing to read here: a watched archiver's replies wake the loop (`watch`), which reads them then.
            self._flush()
            if book.finished.releasable(self.archived_through):  # what an earlier batch left
                book.release_archived(self.archived_through)
            return
        through = self.poll(flush=listen)
        if self.needs_resend and ship:
            self.needs_resend = False
            book.take_finished()
            self.ship(list(book.finished))
        book.release_archived(through)

    def ship(self, records: list[TaskRecord]) -> None:
        """Send finished records (in the order they finished; already in the journal) to the archiver."""
        if not records:
            return
        now = max(self._now, records[-1].finished_at or 0.0)
        self._now = self._reader.now = now
        if self._put_off:
            self._start_put_off()
        if self._sock is not None:
            self._send(Put(now, [stored_form(record) for record in records]))  # type: ignore[misc]
            self.shipped_through = max(self.shipped_through, records[-1].seq)

    def forget_expired(self, now: float) -> None:
        """Tell the archiver the time, so that it applies result_ttl while no task finishes: at most once a
        TICK_INTERVAL (the broker calls this every pass, and each message wakes the archiver's process)."""
        self._now = self._reader.now = max(self._now, now)
        if self._now - self._last_tick < TICK_INTERVAL:
            return
        self._last_tick = self._now
        self._send(Tick(self._now))

    def set_retention(self, ttl: float, max_bytes: int) -> None:
        self.ttl, self.max_bytes = ttl, max_bytes
        self._reader.ttl = ttl
        self._send(Retention(ttl, max_bytes))

    def catch_up(self, timeout: float = 30.0) -> int:
        """Block until the archiver has handled everything sent so far (for tests and benchmarks, never the
        loop); returns archived_through. Raises TimeoutError."""
        self._send(Tick(self._now))
        end = time.monotonic() + timeout
        while self._handled < self._sent:
            if time.monotonic() > end:
                raise TimeoutError(f"the archiver did not catch up within {timeout} s")
            self.poll(flush=True)
            time.sleep(0.002)
        return self.archived_through

    @property
    def waiting(self) -> bool:
        """Whether records were shipped that the archiver has not confirmed yet."""
        return self.shipped_through > self.archived_through or bool(self._outgoing)

    def poll(self, *, flush: bool = False) -> int:
        """Read the archiver's replies (never blocking); returns archived_through. Sends what waits for the
        archiver if `flush`, or if it is due (FLUSH_BYTES, FLUSH_SECONDS). Starts the archiver again if it died
        (then `needs_resend` is set)."""
        sock = self._sock
        if sock is None:
            self._respawn()
            return self.archived_through
        self._flush(force=flush)
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)
            except BlockingIOError:
                break
            except OSError:
                data, fds = b"", []
            self._fds.extend(fds)
            if not data:
                self._lost()
                break
            for body in self._incoming.feed(data):
                self._reply(self._decode(body))
        return self.archived_through

    def _reply(self, message: FromArchiver) -> None:
        if isinstance(message, Stored):
            self._handled = message.handled
            self.archived_through = max(self.archived_through, message.through)
            self.rows, self.bytes = message.rows, message.bytes
        elif isinstance(message, FilterReady):
            self._install_filter(self._fds.pop(0), message.log2)

    def _send(self, message: Put | Tick | Retention) -> None:
        if self._sock is None:  # no archiver now: the next one gets every finished record in memory anyway
            return
        self._outgoing += frame(message)
        self._sent += 1
        self._flush()

    def _flush(self, *, force: bool = False) -> None:
        """Send what waits for the archiver (as much as the socket takes), if `force` or it is due."""
        if not self._outgoing or self._sock is None:
            return
        now = time.monotonic()
        if not force and len(self._outgoing) < FLUSH_BYTES and now - self._last_flush < FLUSH_SECONDS:
            return
        self._last_flush = now
        try:
            sent = self._sock.send(self._outgoing)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._lost()
            return
        del self._outgoing[:sent]
        if len(self._outgoing) > BACKLOG_WARNING and not self._warned:
            self._warned = True
            log.warning("the results store's archiver falls behind: %d bytes of finished tasks wait for it "
                        "(they stay in memory meanwhile)", len(self._outgoing))

    def _lost(self) -> None:
        process = self._process
        code = None if process is None else process.poll()
        if process is not None and code is None:
            process.kill()
            code = process.wait()
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
        self._sock = self._process = None
        self._outgoing.clear()
        self._incoming = FrameBuffer()
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self._drop_filter()
        log.error("the results store's archiver process exited (status %s); starting another, which gets every "
                  "finished task still in memory", code)
        self._respawn()

    def _start_put_off(self) -> None:
        """Start the archiver `begin` put off (from the loop: a fork and exec, once in the broker's life); if it
        cannot start, `poll` tries again as after a crash."""
        self._put_off = False
        self._try_start()

    def _try_start(self) -> bool:
        try:
            self.start(self._now)
        except OSError as exc:
            log.error("cannot start the results store's archiver: %s; trying again in %g s", exc, RESPAWN_INTERVAL)
            self._next_spawn = time.monotonic() + RESPAWN_INTERVAL
            return False
        return True

    def _respawn(self) -> None:
        if self._put_off or time.monotonic() < self._next_spawn or not self._try_start():
            return
        self.respawns += 1
        self.shipped_through = self.archived_through
        self._sent = self._handled = 0
        self.needs_resend = True

    # ----------------------------------------------------------------- the scope filter

    def _install_filter(self, fd: int, log2: int) -> None:
        try:
            bits = mmap.mmap(fd, 1 << (log2 - 3), prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._drop_filter()
        self._filter_map = bits
        self._filter = ScopeFilter(memoryview(bits), log2)

    def _drop_filter(self) -> None:
        filter_, bits = self._filter, self._filter_map
        self._filter = self._filter_map = None
        if filter_ is not None:
            filter_.release()
            filter_.bits.release()  # type: ignore[union-attr]
        if bits is not None:
            bits.close()

    # ----------------------------------------------------------------- lookups

    def find(self, task_id: str) -> TaskRecord | None:
        return self._reader.find(task_id)

    def find_key(self, pool: str, tenant: str | None, key: str) -> TaskRecord | None:
        scope = key_scope(pool, tenant, key)
        if self._filter is not None and not self._filter.might_hold(scope):
            return None
        return self._reader.find_key(pool, tenant, key, scope)

    def find_submission(self, tenant: str | None, submission: str) -> TaskRecord | None:
        scope = submission_scope(tenant, submission)
        if self._filter is not None and not self._filter.might_hold(scope):
            return None
        return self._reader.find_submission(tenant, submission, scope)

    def stats(self) -> dict[str, int]:
        """What the store holds (as of the archiver's last reply) and how far it is."""
        return {"rows": self.rows, "bytes": self.bytes, "archived_through": self.archived_through,
                "shipped_through": self.shipped_through, "respawns": self.respawns}
