"""What one loop pass of the broker sends, held per peer until the pass's commit is done.

Every reply and assignment of a pass waits here (group commit: nothing leaves
before the journal has it) and then goes out as one ZeroMQ message per peer,
a batch, instead of one message per reply. libzmq's send and the receiving
peer's event loop cost per message, so a busy client or worker gets the
dozens of things meant for it at once for about the price of one.

Sending never blocks and never drops silently: what libzmq will not take
for a peer yet (its queue for that peer is full: the peer is not reading)
waits in that connection's backlog, in order, where the connection's byte
budget sees it, and goes first when the peer reads again. Nothing is sent to
a connection that has ended, whoever holds its identity now.
"""

from __future__ import annotations

from typing import Any, Iterator

import zmq

from cronoq.broker.connections import Connection, Connections
from cronoq.wire import protocol
from cronoq.wire.transport import send_frames


class Outbox:
    """Messages waiting for one ROUTER socket's peers, in the order they were put, per peer."""

    def __init__(self, batch_type: type[protocol.Batch]) -> None:
        self._batch_type = batch_type
        self._peers: dict[Connection, list[tuple[Any, bytes | None]]] = {}

    def put(self, conn: Connection, message: Any, body: bytes | None = None) -> None:
        """Send `message` (and its body) to the peer on `conn` after this pass's commit, if it is still there."""
        items = self._peers.get(conn)
        if items is None:
            self._peers[conn] = [(message, body)]
        else:
            items.append((message, body))

    def __bool__(self) -> bool:
        return bool(self._peers)

    def seal(self) -> "Outbox":
        """A new outbox holding everything waiting here, to send once the commit it waits for is done (a commit
        in the journal's writer thread); this one is empty again and goes on collecting the next passes'."""
        sealed = Outbox(self._batch_type)
        sealed._peers, self._peers = self._peers, {}
        return sealed

    def clear(self) -> None:
        self._peers.clear()

    def items(self) -> Iterator[tuple[Connection, Any, bytes | None]]:
        """(connection, message, body) of everything waiting, one peer after another."""
        for conn, items in self._peers.items():
            for message, body in items:
                yield conn, message, body

    def messages(self) -> Iterator[tuple[Connection, list[bytes]]]:
        """(connection, frames) of the ZeroMQ messages that carry everything waiting: batched per peer."""
        batch_type = self._batch_type
        for conn, items in self._peers.items():
            for frames, _ in protocol.pack(batch_type, items):
                yield conn, frames

    def send(self, sock: zmq.Socket, connections: Connections) -> None:
        """Hand everything waiting to libzmq, or to its connection's backlog, and forget it here; then retry
        every backlog."""
        batch_type = self._batch_type
        for conn, items in self._peers.items():
            if not conn.alive:
                continue  # the peer has left: whoever holds its identity now is someone else
            identity = conn.identity
            messages = [frames for frames, _ in protocol.pack(batch_type, items)]
            if conn.backlog:
                _hold(connections, conn, messages)
                continue
            for index, frames in enumerate(messages):
                try:
                    send_frames(sock, [identity, *frames])  # type: ignore[list-item]
                except zmq.Again:  # the peer is not reading: keep the rest, in order, within its budget
                    _hold(connections, conn, messages[index:])
                    break
                except zmq.ZMQError:  # gone between the poll and the send (EHOSTUNREACH)
                    break
        self._peers.clear()
        for conn in list(connections.backlogged):
            _send_backlog(sock, connections, conn)


def _hold(connections: Connections, conn: Connection, messages: list[list[bytes]]) -> None:
    for frames in messages:
        conn.backlog.append(frames)
        conn.backlog_bytes += sum(len(frame) for frame in frames)
    connections.backlogged.add(conn)


def _send_backlog(sock: zmq.Socket, connections: Connections, conn: Connection) -> None:
    """Send a connection's backlog, oldest first, until libzmq's queue for it is full again."""
    backlog = conn.backlog
    identity = conn.identity
    while backlog:
        frames = backlog[0]
        try:
            send_frames(sock, [identity, *frames])  # type: ignore[list-item]
        except zmq.Again:
            return
        except zmq.ZMQError:  # the peer is gone: its disconnect will clear the rest
            return
        backlog.popleft()
        conn.backlog_bytes -= sum(len(frame) for frame in frames)
    if not conn.parked:
        connections.backlogged.discard(conn)
