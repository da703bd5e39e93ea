"""What one loop pass of the broker sends, held per peer until the pass's commit is done.

Every reply and assignment of a pass waits here (group commit: nothing leaves
before the journal has it) and then goes out as one ZeroMQ message per peer,
a batch, instead of one message per reply. libzmq's send and the receiving
peer's event loop cost per message, so a busy client or worker gets the
dozens of things meant for it at once for about the price of one.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

import zmq

from cronoq import protocol
from cronoq.transport import send_frames

log = logging.getLogger("cronoq.broker")


class Outbox:
    """Messages waiting for one ROUTER socket's peers, in the order they were put, per peer."""

    def __init__(self, batch_type: type[protocol.Batch]) -> None:
        self._batch_type = batch_type
        self._peers: dict[bytes, list[tuple[Any, bytes | None]]] = {}

    def put(self, identity: bytes, message: Any, body: bytes | None = None) -> None:
        items = self._peers.get(identity)
        if items is None:
            self._peers[identity] = [(message, body)]
        else:
            items.append((message, body))

    def __bool__(self) -> bool:
        return bool(self._peers)

    def clear(self) -> None:
        self._peers.clear()

    def items(self) -> Iterator[tuple[bytes, Any, bytes | None]]:
        """(peer identity, message, body) of everything waiting, one peer after another."""
        for identity, items in self._peers.items():
            for message, body in items:
                yield identity, message, body

    def messages(self) -> Iterator[tuple[bytes, list[bytes]]]:
        """(peer identity, frames) of the ZeroMQ messages that carry everything waiting: batched per peer."""
        batch_type = self._batch_type
        for identity, items in self._peers.items():
            for frames, _ in protocol.pack(batch_type, items):
                yield identity, frames

    def send(self, sock: zmq.Socket) -> None:
        """Send everything waiting and forget it."""
        for identity, frames in self.messages():
            try:
                send_frames(sock, [identity, *frames])
            except zmq.ZMQError as exc:  # a peer's full queue must not stop the broker
                log.warning("dropped a message to a peer: %s", exc)
        self._peers.clear()
