"""Who is on the other end of each routing identity: the broker's live connections, per ROUTER socket.

A ROUTER socket names its peers by routing identity, and a peer may choose
its own. An identity alone therefore proves nothing: a peer that connects
with the identity of one that just left would receive what was meant for
it. So the broker keeps its own table of connections, fed by two facts that
libzmq gives and no peer can forge:

- the socket monitor reports every accepted connection and every
  disconnect, with the connection's file descriptor;
- every received message carries the descriptor it was read from (SRCFD).

A connection is born unauthenticated when the monitor reports it. The first
message that carries a valid token binds it to that token's principal (one
principal per connection), and only then does the broker send it anything
but an error: workers register on it, waiters of a task are kept on it.
When it disconnects, nothing more is sent to it; what it sent before going
is still read and handled (a worker's last `done`s count), and once the
socket has been drained it is gone: its worker is lost, its waiters get
nothing, and a new connection under the same identity starts from nothing.
A connection that sends nothing valid within `auth_timeout` is cut, and so
is any connection beyond `max_connections`.

What the broker holds for a connection has a byte budget (`buffer_bytes`):
replies libzmq would not take yet (its per-connection queue is full because
the peer does not read) wait in the connection's backlog; past the budget
the broker stops handling that peer's requests (they are set aside, counted
against the same budget) until the backlog drains; a peer past the budget
both ways is cut. Cutting a connection shuts its TCP socket down under
libzmq, which then reports the disconnect like any other.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
from collections import deque
from typing import Any, Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from cronoq.wire.transport import readable

log = logging.getLogger("cronoq.broker")

MONITORED_EVENTS = int(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)


# Every connection's serial number, never reused while the broker runs (a descriptor or an identity may be).
_serials = itertools.count(1)


def peer_label(identity: bytes) -> str:
    """How logs name a peer: a short digest, never the identity itself (identities are not to be handed out)."""
    return f"peer-{hash(identity) & 0xFFFFFFFF:08x}"


class Connection:
    """One live (or just ended) connection of a ROUTER socket."""

    __slots__ = ("fd", "identity", "opened_at", "principal", "alive", "said_all", "backlog", "backlog_bytes",
                 "parked", "parked_bytes", "last_refusal", "cut", "serial", "last_token")

    def __init__(self, fd: int, opened_at: float) -> None:
        self.fd = fd
        self.serial = next(_serials)
        """This connection's number, unique among the broker's connections: what a task's record keeps of who
        waits for it (cronoq.broker.clients), so that a waiter costs an int rather than a tuple."""
        self.identity: bytes | None = None
        self.opened_at = opened_at
        self.principal: Any = None
        """Who this connection speaks for, once a message carried a valid token; None until then."""
        self.last_token: Any = None
        """The last valid token a message on it carried, and its principal (cronoq.broker.auth.Authenticator)."""
        self.alive = True
        self.said_all = False
        """Disconnected, and the socket has since been read until empty: nothing more can come from it."""
        self.backlog: deque[list[bytes]] = deque()
        """Messages for the peer that libzmq would not take yet (its queue for the peer was full)."""
        self.backlog_bytes = 0
        self.parked: deque[Any] = deque()
        """The peer's own messages (frames), set aside unhandled while its backlog is over budget; first, perhaps,
        the rest of a batch a pass had no time left for (its requests, already decoded: weighed as nothing, since
        it is at most one message the peer sent, and whatever the peer sends meanwhile is parked behind it,
        weighed)."""
        self.parked_bytes = 0
        self.last_refusal = float("-inf")
        """When this unauthenticated connection was last sent an error (they are rationed)."""
        self.cut = False
        """The broker shut this connection down; its disconnect is on its way."""

    @property
    def label(self) -> str:
        return peer_label(self.identity) if self.identity is not None else f"fd-{self.fd}"


class Connections:
    """The connections of one ROUTER socket, learnt from its monitor and from each message's descriptor."""

    def __init__(self, sock: zmq.Socket, name: str, *, max_connections: int, auth_timeout: float,
                 buffer_bytes: int, on_closed: Callable[[Connection, float], None]) -> None:
        self.name = name
        self.max_connections = max_connections
        self.auth_timeout = auth_timeout
        self.buffer_bytes = buffer_bytes
        self._on_closed = on_closed
        self.monitor = sock.get_monitor_socket(MONITORED_EVENTS)
        self._by_fd: dict[int, Connection] = {}
        self._by_identity: dict[bytes, Connection] = {}
        self.backlogged: set[Connection] = set()
        """Connections with messages waiting in their backlog: the broker retries them each pass."""
        self.refused = 0
        """Connections cut because max_connections were open (the log says so now and then)."""
        self._unreported: list[Connection] = []
        self._reporting = True
        # Disconnected, with messages perhaps still to read: by (identity, descriptor), until the socket has
        # been drained once (`emptied`), then finished at the next poll.
        self._closing: dict[tuple[bytes, int], Connection] = {}
        self._drained: list[Connection] = []
        self.signalled = True
        """The monitor's FD has signalled since the broker last looked at it (the loop calls `signal`): only then
        does a pass begin by reading it. Reading it until empty re-arms the FD, so no event goes unsignalled."""

    @property
    def ending(self) -> bool:
        """Whether connections have ended that are not reported yet (the broker keeps passing until they are)."""
        return bool(self._closing or self._unreported)

    def parking(self) -> list[Connection]:
        """Connections with messages set aside."""
        return [conn for conn in self.backlogged if conn.parked]

    def __len__(self) -> int:
        return len(self._by_fd)

    def close(self) -> None:
        self.monitor.close(linger=0)

    # ----------------------------------------------------------------- lifecycle (monitor events)

    def signal(self) -> None:
        """The monitor's FD signalled: events may wait."""
        self.signalled = True

    def poll_events(self, now: float, *, report: bool = True, look: bool = True) -> None:
        """Take every connect and disconnect libzmq has reported. With `report` False the table is brought up
        to date but `on_closed` waits for the next call that reports (the broker polls so just before it
        sends, when what a lost worker's tasks become must wait for the next commit). With `look` False only
        what was taken before is reported, and the monitor is not read."""
        self._reporting = report
        if report and (self._unreported or self._drained):
            ended = self._unreported + self._drained
            self._unreported, self._drained = [], []
            for conn in ended:
                if self._closing.get((conn.identity, conn.fd)) is conn:  # type: ignore[arg-type]
                    del self._closing[(conn.identity, conn.fd)]  # type: ignore[index]
                self._on_closed(conn, now)
        if not look:
            return
        self.signalled = False
        monitor = self.monitor
        # Asking whether anything waits costs a third of a receive that finds nothing (it raises).
        if not readable(monitor):
            self._reporting = True
            return
        while True:
            try:
                frames = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                self._reporting = True
                return
            event = parse_monitor_message(frames)
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._opened(fd, now)
            else:
                old = self._by_fd.get(fd)
                if old is not None:
                    self._disconnected(old, now)

    def _opened(self, fd: int, now: float) -> None:
        stale = self._by_fd.get(fd)
        if stale is not None:  # its disconnect was never reported: the descriptor is someone else's now
            self._disconnected(stale, now)
        if len(self._by_fd) >= self.max_connections:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("%s endpoint: %d connections open (max_connections); refusing new ones (%d so far)",
                            self.name, len(self._by_fd), self.refused)
            _shut_down(fd)
            return
        self._by_fd[fd] = Connection(fd, now)

    def _disconnected(self, conn: Connection, now: float) -> None:
        """libzmq reports the connection gone: send it nothing more, and finish it once its last messages are read."""
        conn.alive = False
        if self._by_fd.get(conn.fd) is conn:
            del self._by_fd[conn.fd]
        conn.backlog.clear()
        conn.parked.clear()
        conn.backlog_bytes = conn.parked_bytes = 0
        self.backlogged.discard(conn)
        if conn.identity is None:  # it never spoke: nothing of it is left to read
            self._finish(conn, now)
            return
        if self._by_identity.get(conn.identity) is conn:
            del self._by_identity[conn.identity]
        self._closing[(conn.identity, conn.fd)] = conn

    def emptied(self) -> None:
        """The broker read the socket until it was empty: what disconnected before has said all it will."""
        for conn in self._closing.values():
            if not conn.said_all:
                conn.said_all = True
                self._drained.append(conn)

    def _finish(self, conn: Connection, now: float) -> None:
        if self._reporting:
            self._on_closed(conn, now)
        else:
            self._unreported.append(conn)

    def cut(self, conn: Connection, why: str) -> None:
        """Close a peer's connection from our side; its disconnect arrives through the monitor like any other."""
        if conn.alive and not conn.cut:  # once: its messages may go on arriving until the disconnect is seen
            conn.cut = True
            log.warning("%s endpoint: cutting %s: %s", self.name, conn.label, why)
            _shut_down(conn.fd)

    def sweep(self, now: float) -> None:
        """Cut connections that have sent nothing valid within auth_timeout."""
        limit = now - self.auth_timeout
        for conn in [c for c in self._by_fd.values() if c.principal is None and c.opened_at < limit]:
            self.cut(conn, f"nothing valid within {self.auth_timeout:g} s")

    # ----------------------------------------------------------------- messages

    def admit(self, identity: bytes, fd: int, now: float) -> Connection | None:
        """The connection a message read from descriptor `fd` under `identity` came from; None: drop the message.

        A message can only be dropped here when it was sent on a connection that has already ended (its
        descriptor was reported closed, or now serves a connection with another identity).
        """
        if fd < 0:  # inproc: no descriptor and no monitor events; the peer lives in this very process
            return self._in_process(identity, now)
        if self._closing:
            closing = self._closing.get((identity, fd))
            if closing is not None and not closing.said_all:  # read after its disconnect was reported: its last
                return closing                                # words still count
        conn = self._by_fd.get(fd)
        if conn is None or (conn.identity is not None and conn.identity != identity):
            self.poll_events(now)  # the monitor may not have told us of this connection yet
            conn = self._by_fd.get(fd)
            if conn is None or (conn.identity is not None and conn.identity != identity):
                return None
        if conn.identity is None:
            previous = self._by_identity.get(identity)
            if previous is not None and previous is not conn:  # libzmq refuses a duplicate identity while
                self._disconnected(previous, now)              # one is live, so that one has ended
            conn.identity = identity
            self._by_identity[identity] = conn
        return conn

    def _in_process(self, identity: bytes, now: float) -> Connection:
        conn = self._by_identity.get(identity)
        if conn is None:
            conn = self._by_identity[identity] = Connection(-1, now)
            conn.identity = identity
        return conn

    # ----------------------------------------------------------------- budget

    def over_budget(self, conn: Connection) -> bool:
        """Whether the broker should stop handling this peer's requests until it reads its replies."""
        return conn.backlog_bytes > self.buffer_bytes

    def park(self, conn: Connection, frames: list[bytes]) -> None:
        """Set a message aside while its sender's replies pile up; cut a sender past the budget both ways."""
        size = sum(len(frame) for frame in frames)
        if conn.parked_bytes + size > self.buffer_bytes:
            self.cut(conn, f"it does not read its replies ({conn.backlog_bytes} bytes waiting) and keeps sending")
            return
        conn.parked.append(frames)
        conn.parked_bytes += size
        self.backlogged.add(conn)  # kept in view until its parked messages are handled

    def set_aside(self, conn: Connection, rest: Any) -> None:
        """Put the rest of a batch ahead of everything else the peer sent: it is handled first, in a later pass."""
        conn.parked.appendleft(rest)
        self.backlogged.add(conn)

    def unpark(self, conn: Connection) -> Any:
        """The oldest message set aside (or rest of a batch), once the backlog is back under budget; None:
        nothing to handle now."""
        if not conn.parked or self.over_budget(conn):
            return None
        frames = conn.parked.popleft()
        if type(frames) is list:
            conn.parked_bytes -= sum(len(frame) for frame in frames)
        if not conn.parked and not conn.backlog:
            self.backlogged.discard(conn)
        return frames


def _shut_down(fd: int) -> None:
    """Shut a TCP connection down under libzmq (which keeps the descriptor and sees the peer leave)."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()
