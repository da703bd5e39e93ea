"""A ZeroMQ socket on the asyncio loop, without zmq.asyncio's per-message await.

The socket's FD is watched with `loop.add_reader`. ZeroMQ's FD is edge-like:
it signals only when the socket's state changes, and a send (or a receive)
can consume the signal of a message that arrived meanwhile. So a socket is
drained until ZMQ_EVENTS says nothing waits, and every send is followed by
one more such look (bench/history/2026-11-29-hot-path-before-batching.md
measures what this buys). A channel that answers (one made with `pack`) reads one message when its FD signals
and leaves the look for the rest to its flush, which comes in the next turn
of the loop anyway: one look per message, not three.

Messages `post`ed during one turn of the loop leave together at the end of
it, packed into as few ZeroMQ messages as fit (a batch): a client whose
hundred coroutines each submit a task sends one message, not a hundred.
What a drained message starts (the tasks it wakes or creates, whose first
steps run in the next turn) is answered in that next turn too: the flush is
queued behind them, so a worker that gets tasks and finishes them at once
answers after one turn of its loop, not two.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Callable, Sequence

import zmq

from cronoq.errors import InvalidArgument

log = logging.getLogger("cronoq")

HIGH_WATER_MARK = 100_000

# pyzmq's constants are enum members: every `|` or `&` on them builds a new member (~0.8 µs), and
# its Python-level Socket.send adds a wrapper per frame. On the hot path we use plain ints and the
# Cython send underneath (1.33 -> 0.38 µs per frame; bench/history/2026-11-29-hot-path-before-batching.md).
NOBLOCK = int(zmq.NOBLOCK)
NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_send = zmq.backend.Socket.send
# Whether a message waits, asked of ZMQ_EVENTS: 1.5 µs against 3.9 µs for a receive that ends in zmq.Again
# (pyzmq builds the exception with two imports and a strerror each time); both cost libzmq the same poll().
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)
_get = zmq.backend.Socket.get
# Frames this big are handed to libzmq without a copy (it keeps a reference until it has sent them): copying
# 900 KB into a new zmq message took 650-900 µs here, mostly page faults, against 3-50 µs without. Smaller
# frames are copied, which is cheaper than the bookkeeping of a zero-copy send (pyzmq's own threshold).
ZERO_COPY_BYTES = 64 * 1024

_context: zmq.Context | None = None


def token_bytes(token: str | bytes | None) -> bytes:
    """A token as the bytes of its frame (empty for an open broker)."""
    if token is None:
        return b""
    if isinstance(token, str):
        return token.encode()
    if isinstance(token, bytes):
        return token
    raise InvalidArgument(f"token must be a str or bytes, got {type(token).__name__}")


def unset_token_hint(variable: str) -> str:
    """Why no token was sent, naming the variable `--token-env` points at (it is unset or empty): what the
    `cronoq` and `cronoq-worker` commands say when a broker refuses the empty token frame."""
    state = "is empty" if variable in os.environ else "is not set"
    return (f"this broker requires a token, and the environment variable {variable} {state} "
            f"(--token-env {variable}): export the token in it, or name another variable with --token-env")


def context() -> zmq.Context:
    """The process's one ZeroMQ context."""
    global _context
    if _context is None or _context.closed:
        _context = zmq.Context()
    return _context


def tune(sock: zmq.Socket, *, max_message_bytes: int | None = None) -> None:
    """Settings every cronoq socket shares: no linger on close, generous queues, bounded frames."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
    sock.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
    if max_message_bytes is not None:
        # libzmq drops a peer that sends a larger frame, so garbage cannot exhaust memory.
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)


def readable(sock: zmq.Socket) -> bool:
    """Whether a message waits on `sock` (ZMQ_EVENTS); asking also re-arms its FD's edge."""
    return bool(_get(sock, EVENTS) & POLLIN)


def recv_frames(sock: zmq.Socket, keep: int = 1 << 30) -> list[bytes]:
    """Receive one whole multipart message without blocking, keeping at most `keep` frames of it.

    Raises zmq.Again when nothing is waiting. Frames past `keep` are received and dropped, so a peer
    cannot make us hold an unbounded message.
    """
    frame = sock.recv(NOBLOCK, copy=False)
    frames = [frame.bytes]
    while frame.more:  # a property of the frame: cheaper than getsockopt(RCVMORE) per frame
        frame = sock.recv(NOBLOCK, copy=False)
        if len(frames) < keep:
            frames.append(frame.bytes)
    return frames


SRCFD = int(zmq.SRCFD)


def recv_routed(sock: zmq.Socket, keep: int) -> tuple[list[bytes], int]:
    """Like `recv_frames` on a ROUTER socket, with the descriptor of the connection the message came on
    (-1 for inproc). Raises zmq.Again when nothing is waiting."""
    first = sock.recv(NOBLOCK, copy=False)
    fd = first.get(SRCFD)
    frames = [first.bytes]
    frame = first
    while frame.more:
        frame = sock.recv(NOBLOCK, copy=False)
        if len(frames) < keep:
            frames.append(frame.bytes)
    return frames, fd


def send_frames(sock: zmq.Socket, frames: Sequence[bytes]) -> None:
    """Send one multipart message without blocking; raises zmq.Again when the queue is full."""
    for frame in frames[:-1]:
        _send(sock, frame, NOBLOCK_MORE, len(frame) < ZERO_COPY_BYTES)  # the last argument: copy it
    last = frames[-1]
    _send(sock, last, NOBLOCK, len(last) < ZERO_COPY_BYTES)


Item = tuple[Any, "bytes | None"]
"""A message to post and its body frame (or None)."""


class Channel:
    """A DEALER (or any) socket whose incoming messages are handed to `on_message` on the loop.

    `pack` turns what was posted in one loop turn into the messages that carry it (each message's frames
    and how many items it carries), each sent after `prefix` (the token); `on_unsent` gets the items the
    full send queue refused.
    """

    def __init__(self, sock: zmq.Socket, on_message: Callable[[list[bytes]], None], *,
                 pack: Callable[[list[Item]], list[tuple[list[bytes], int]]] | None = None, prefix: Sequence[bytes] = (),
                 on_unsent: Callable[[list[Item]], None] | None = None) -> None:
        self.sock = sock
        self._on_message = on_message
        self._pack = pack
        self._prefix = list(prefix)
        self._on_unsent = on_unsent
        self._posted: list[Item] = []
        self._flush_queued = False  # `_flush` is on the loop's ready queue
        self._loop = asyncio.get_running_loop()
        self._fd = sock.getsockopt(zmq.FD)
        self._drain_scheduled = True
        self._owe_look = False  # a receive since the last look at ZMQ_EVENTS: the flush must look
        self._loop.add_reader(self._fd, self._drain if pack is None else self._on_readable)
        # The FD only signals changes: what arrived before it was watched is found by one first drain.
        self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        sock = self.sock
        if sock.closed:
            return
        received = False
        # A look at ZMQ_EVENTS before each receive rather than a receive until zmq.Again: cheaper by half when,
        # as a small worker's, most drains find one message.
        while _get(sock, EVENTS) & POLLIN:
            self._on_message(recv_frames(sock))
            received = True
            if sock.closed:
                return
        if received and self._pack is not None and not self._flush_queued:
            # Behind the first steps of whatever the messages started: their answers leave in the next turn.
            self._flush_queued = True
            self._loop.call_soon(self._flush)

    def _on_readable(self) -> None:
        """The FD signalled: most often a message came. Read one; the flush queued behind what it starts reads
        the rest (a small worker's messages come one at a time: each look at ZMQ_EVENTS costs it a poll())."""
        sock = self.sock
        if sock.closed:
            return
        try:
            frames = recv_frames(sock)
        except zmq.Again:  # something else changed (the peer took what we sent): libzmq has looked, nothing waits
            return
        self._on_message(frames)
        self._owe_look = True
        if not self._flush_queued and not sock.closed:  # queued behind the first steps of what it started
            self._flush_queued = True
            self._loop.call_soon(self._flush)

    def send(self, frames: Sequence[bytes]) -> None:
        """Queue a message for the peer; raises zmq.Again if the send queue is full."""
        send_frames(self.sock, frames)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def post(self, message: Any, body: bytes | None = None) -> None:
        """Send `message` (and its body) at the end of this loop turn, with whatever else is posted in it."""
        self._posted.append((message, body))
        if not self._flush_queued:
            self._flush_queued = True
            self._loop.call_soon(self._flush)

    def flush_now(self) -> None:
        """Send what was posted at once rather than at the end of this loop turn (the flush queued for then
        finds nothing left): for a message nothing else is likely to share a batch with."""
        self._flush()

    def _flush(self) -> None:
        """Send what was posted, then read what the sends or the last receive may have hidden (the FD's
        signal) at once rather than in another turn of the loop."""
        self._flush_queued = False
        if self.sock.closed:
            return
        if self._posted:
            self._send_posted()
            self._owe_look = True
        if self._owe_look and not self.sock.closed:
            self._owe_look = False
            self._drain()

    def _send_posted(self) -> None:
        posted, self._posted = self._posted, []
        if not posted or self.sock.closed:
            return
        assert self._pack is not None, "post() needs a Channel made with pack="
        sent = 0
        for frames, carried in self._pack(posted):
            try:
                send_frames(self.sock, self._prefix + frames)
            except zmq.Again:  # the peer has been gone long enough for the queue to fill: tell who posted
                if self._on_unsent is not None:
                    self._on_unsent(posted[sent:])
                else:
                    log.warning("send queue is full; dropped %d message(s)", len(posted) - sent)
                return
            sent += carried

    def close(self) -> None:
        """Close the socket, after sending what was posted (best effort: the peer may be gone)."""
        self._send_posted()
        if not self.sock.closed:
            self._loop.remove_reader(self._fd)
            self.sock.close(linger=0)

