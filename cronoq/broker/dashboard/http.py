"""A small HTTP/1.1 server on the broker's own loop, with every cost bounded.

h11 parses and frames the HTTP (it is sans-I/O: bytes in, events out), this
module moves the bytes with asyncio streams, and a plain function turns each
`Request` into a `Response`. The broker's loop must never wait for a browser,
and no peer may lock the people with a token out:

- connections are of two kinds. One whose last request carried a viewer or
  admin token (the handler says so: `Response.authenticated`) is kept, up to
  MAX_CONNECTIONS of them. Any other, a new one included, is a guest: at most
  MAX_GUESTS_PER_PEER per peer address and MAX_GUESTS in all. A new
  connection over either bound closes the oldest guest (of that peer, then
  of all) that is waiting for a request, rather than be refused: so half-open
  connections cannot keep a new one out, and one peer's guests can only push
  out its own. Only when every guest is being answered is one more told 503;
- a request's head must arrive whole within HEAD_TIMEOUT (on a new
  connection, of its accept; on a kept-alive one, of its first byte), its
  body within BODY_TIMEOUT after that, and a kept-alive connection may wait
  IDLE_TIMEOUT for its next request; the head is at most MAX_HEAD_BYTES (h11
  refuses more) with at most MAX_HEADERS headers, the body MAX_BODY_BYTES;
- a response is written, then drained under WRITE_TIMEOUT: a browser that
  stops reading is dropped rather than buffered for. Only one response per
  connection is ever in flight (the next request is read after the last one
  left), so what is held for a slow reader is one response at most;
- a peer that resets (or closes) a connection mid-request costs a count
  (`DashboardConnections.reset`) and a DEBUG line, never a traceback; so
  does every connection the server ends early (`dropped`, by reason).

The handler runs on the loop and must be quick; the dashboard's answers are
cached snapshots (see app.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import unquote, urlsplit

import h11

from cronoq.broker.metrics import DashboardConnections

log = logging.getLogger("cronoq.dashboard")

MAX_CONNECTIONS = 64
"""Connections kept for peers whose last request carried a viewer or admin token."""
MAX_GUESTS = 32
"""Connections of any other kind (new ones included), in all."""
MAX_GUESTS_PER_PEER = 8
"""Guest connections of one peer address."""
MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 64
MAX_BODY_BYTES = 4096
HEAD_TIMEOUT = 5.0
BODY_TIMEOUT = 5.0
IDLE_TIMEOUT = 10.0
WRITE_TIMEOUT = 5.0
READ_CHUNK = 4096
# The kernel's send buffer per connection: what a peer that stops reading can hold of the machine's memory.
SEND_BUFFER_BYTES = 256 * 1024
# SO_LINGER on, 0 s: a dropped connection is reset at once, and the kernel keeps nothing of it.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)
SERVER_NAME = b"cronoq"


@dataclass(frozen=True)
class Request:
    """One HTTP request: its method, its path (percent-decoded), its headers (names lower-case), its body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""


@dataclass(frozen=True)
class Response:
    """What to answer: status code, content type, body and extra headers; `authenticated` when the request
    carried a token the handler accepted (its connection is then kept room for)."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)
    authenticated: bool = False


Handler = Callable[[Request], Response]


def plain(status: int, text: str) -> Response:
    return Response(status, text.encode() + b"\n", "text/plain; charset=utf-8")


@dataclass(eq=False)
class _Connection:
    writer: asyncio.StreamWriter
    peer: str
    waiting: bool = True
    """Waiting for a request (idle, or reading one), not being answered: a guest may then be evicted."""
    evicted: bool = False


class _PeerGone(Exception):
    """The peer closed the connection in the middle of a request."""


class HttpServer:
    """Serves `handler` on a host:port of the running loop; `start()` binds, `close()` ends every connection."""

    def __init__(self, handler: Handler, *, counts: DashboardConnections | None = None,
                 max_connections: int = MAX_CONNECTIONS, max_guests: int = MAX_GUESTS,
                 max_guests_per_peer: int = MAX_GUESTS_PER_PEER, head_timeout: float = HEAD_TIMEOUT,
                 body_timeout: float = BODY_TIMEOUT, idle_timeout: float = IDLE_TIMEOUT,
                 write_timeout: float = WRITE_TIMEOUT) -> None:
        self._handler = handler
        self.counts = counts if counts is not None else DashboardConnections()
        self.max_connections = max_connections
        self.max_guests = max_guests
        self.max_guests_per_peer = max_guests_per_peer
        self.head_timeout = head_timeout
        self.body_timeout = body_timeout
        self.idle_timeout = idle_timeout
        self.write_timeout = write_timeout
        self._servers: list[asyncio.base_events.Server] = []
        self._guests: dict[_Connection, None] = {}  # oldest first
        self._kept: set[_Connection] = set()

    @property
    def open_connections(self) -> int:
        return len(self._guests) + len(self._kept)

    async def start(self, address: str, sockets: list[socket.socket] | None = None) -> tuple[str, int]:
        """Listen on "host:port", or on `sockets` (listening already, bound to that address); returns the address
        bound. Raises OSError when it cannot be bound."""
        if sockets:
            self._servers = [await asyncio.start_server(self._serve, sock=sock, limit=READ_CHUNK) for sock in sockets]
        else:
            host, _, port = address.rpartition(":")
            self._servers = [await asyncio.start_server(self._serve, host.strip("[]") or "127.0.0.1", int(port),
                                                        limit=READ_CHUNK)]
        return self._servers[0].sockets[0].getsockname()[:2]

    def close(self) -> None:
        for server in self._servers:
            server.close()
        for conn in [*self._guests, *self._kept]:
            _drop(conn.writer)
        self._guests.clear()
        self._kept.clear()

    # ------------------------------------------------------------ who gets room

    def _admit(self, conn: _Connection) -> bool:
        """Make room for `conn` as a guest, evicting the oldest waiting guest of its peer, then of all, when it
        is over a bound; False if no room could be made."""
        own = [c for c in self._guests if c.peer == conn.peer]
        if len(own) >= self.max_guests_per_peer and not self._evict_oldest(own):
            return False
        if len(self._guests) >= self.max_guests and not self._evict_oldest(list(self._guests)):
            return False
        self._guests[conn] = None
        return True

    def _evict_oldest(self, guests: list[_Connection]) -> bool:
        for guest in guests:
            if guest.waiting:
                guest.evicted = True
                del self._guests[guest]
                self.counts.dropped["evicted"] += 1
                log.debug("dashboard: closed a waiting connection of %s to make room", guest.peer)
                _drop(guest.writer)
                return True
        return False

    def _forget(self, conn: _Connection) -> None:
        self._guests.pop(conn, None)
        self._kept.discard(conn)

    def _sort(self, conn: _Connection, authenticated: bool) -> bool:
        """Keep or demote `conn` by its last request; False if it must close (a demoted one with no room)."""
        if authenticated:
            if conn in self._guests and len(self._kept) < self.max_connections:
                del self._guests[conn]
                self._kept.add(conn)
            return True
        if conn in self._kept:
            self._kept.discard(conn)
            return self._admit(conn)
        return True

    # --------------------------------------------------------------- serving

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        conn = _Connection(writer, str(peername[0]) if isinstance(peername, tuple) else "local")
        if not self._admit(conn):
            self.counts.dropped["refused"] += 1
            # Said without waiting: a few bytes always fit the socket's buffer, and the close follows them.
            writer.write(_raw_response(503, "too many dashboard connections; try again shortly"))
            writer.close()
            _take_close_outcome(writer)
            return
        try:
            _limit_send_buffer(writer)
            await self._exchange(conn, reader)
        except asyncio.TimeoutError:
            if not conn.evicted:
                self.counts.dropped["timeout"] += 1
                log.debug("dashboard: dropped a connection of %s that was too slow", conn.peer)
            _drop(writer)
        except (_PeerGone, ConnectionError, OSError) as exc:
            if not conn.evicted:
                self.counts.reset += 1
                log.debug("dashboard: %s reset its connection mid-request: %r", conn.peer, exc)
            _drop(writer)
        except h11.LocalProtocolError as exc:
            log.debug("dashboard connection dropped: %r", exc)
            _drop(writer)
        else:
            writer.close()
            _take_close_outcome(writer)
            # A close waits for the last response to be read: a peer that stops reading now has WRITE_TIMEOUT.
            asyncio.get_running_loop().call_later(self.write_timeout, _drop, writer)
        finally:
            self._forget(conn)

    async def _exchange(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        """Requests and responses on one connection until either side ends it."""
        loop = asyncio.get_running_loop()
        incoming = _Incoming(reader)
        head_deadline: float | None = loop.time() + self.head_timeout  # a new connection's, from its accept
        while True:
            conn.waiting = True
            try:
                request = await self._read_request(incoming, head_deadline)
            except h11.RemoteProtocolError as exc:
                if incoming.closed or conn.evicted:
                    raise _PeerGone("closed before the request was whole") from None
                await self._send(conn, _raw_response(exc.error_status_hint, f"bad request: {exc}"))
                return
            except _Refused as refusal:
                await self._send(conn, _raw_response(refusal.status, refusal.reason))
                return
            if request is None or conn.evicted:  # the peer closed between requests
                return
            conn.waiting = False
            try:
                response = self._handler(request)
                if not isinstance(response, Response):  # an answer made over turns of the loop
                    response = await response
            except Exception:  # a bug: it must cost this one request, never the broker
                log.exception("the dashboard failed to answer %s %s", request.method, request.path)
                response = plain(500, "the dashboard failed to answer (see the broker's log)")
            await self._send(conn, _encode(incoming.parser, response, head_only=request.method == "HEAD"))
            if incoming.parser.our_state is h11.MUST_CLOSE or incoming.parser.their_state is not h11.DONE:
                return
            if not self._sort(conn, response.authenticated):
                return
            incoming.parser.start_next_cycle()
            head_deadline = None

    async def _read_request(self, incoming: _Incoming, head_deadline: float | None) -> Request | None:
        """The next whole request; None when the peer closed cleanly before sending one. Its head must be whole
        by `head_deadline` (None: a kept-alive connection, which may first wait IDLE_TIMEOUT for a byte of it)."""
        loop = asyncio.get_running_loop()
        if head_deadline is None:
            if not incoming.parser.trailing_data[0]:
                await incoming.receive(loop.time() + self.idle_timeout)
            head_deadline = loop.time() + self.head_timeout
        event = await incoming.next_event(head_deadline)
        if isinstance(event, h11.ConnectionClosed):
            return None
        if not isinstance(event, h11.Request):
            raise h11.RemoteProtocolError("expected a request", error_status_hint=400)
        if len(event.headers) > MAX_HEADERS:
            raise _Refused(431, f"at most {MAX_HEADERS} headers are read")
        headers: dict[str, str] = {}
        for name, value in event.headers:
            headers[name.decode("latin-1")] = value.decode("latin-1")
        length = headers.get("content-length")
        if length is not None and int(length) > MAX_BODY_BYTES:  # h11 has checked it is a number
            raise _Refused(413, f"a request body may have at most {MAX_BODY_BYTES} bytes")
        body = bytearray()
        body_deadline = loop.time() + self.body_timeout
        while True:
            part = await incoming.next_event(body_deadline)
            if isinstance(part, h11.Data):
                body += part.data
                if len(body) > MAX_BODY_BYTES:  # a chunked body says its size only as it goes
                    raise _Refused(413, f"a request body may have at most {MAX_BODY_BYTES} bytes")
            elif isinstance(part, h11.EndOfMessage):
                break
            else:
                raise h11.RemoteProtocolError("the request ended before its body", error_status_hint=400)
        target = urlsplit(event.target.decode("latin-1"))
        return Request(event.method.decode("ascii", "replace"), unquote(target.path), headers, bytes(body))

    async def _send(self, conn: _Connection, data: bytes) -> None:
        if conn.writer.transport.is_closing():
            raise _PeerGone("closed before its answer")
        conn.writer.write(data)
        await asyncio.wait_for(conn.writer.drain(), self.write_timeout)


class _Incoming:
    """h11's parser fed from one stream, each read under a deadline; `closed` once the peer has closed."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.reader = reader
        self.closed = False

    async def receive(self, deadline: float) -> None:
        left = max(0.0, deadline - asyncio.get_running_loop().time())
        data = await asyncio.wait_for(self.reader.read(READ_CHUNK), left)
        self.closed = not data
        self.parser.receive_data(data)  # b"" at the end: h11 then reports the close

    async def next_event(self, deadline: float) -> object:
        while True:
            event = self.parser.next_event()
            if event is not h11.NEED_DATA:
                return event
            await self.receive(deadline)


def _limit_send_buffer(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        except (OSError, ValueError):
            pass  # reset already: the next read says so


def _drop(writer: asyncio.StreamWriter) -> None:
    """End a connection now, with a reset: a peer that stalled gets nothing more, and what was buffered for it
    goes (a plain close would leave the kernel trying to deliver it). Nothing happens to one already closed."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        except (OSError, ValueError):
            pass  # already closed (the loop's socket object then says ValueError: its descriptor is gone)
    writer.transport.abort()
    _take_close_outcome(writer)


def _take_close_outcome(writer: asyncio.StreamWriter) -> None:
    """Retrieve how the connection closed. asyncio hands a peer's reset to the reader (where `_serve` counts it) and
    also to the writer's close future; when the garbage collector frees that future before its protocol, it logs
    the reset as "Future exception was never retrieved", with a traceback, though nothing went wrong."""
    waiter = asyncio.ensure_future(writer.wait_closed())
    waiter.add_done_callback(lambda done: done.cancelled() or done.exception())


class _Refused(Exception):
    """A request this server will not read further (too many headers, too large a body)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def _encode(conn: h11.Connection, response: Response, *, head_only: bool) -> bytes:
    headers = [
        ("Content-Type", response.content_type),
        ("Content-Length", str(len(response.body))),
        ("Cache-Control", "no-store"),
        ("X-Content-Type-Options", "nosniff"),
        ("Referrer-Policy", "no-referrer"),
        # Nothing but our own files, no framing by other sites: the page fetches nothing from elsewhere.
        ("Content-Security-Policy",
         "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
        *response.headers,
    ]
    data = conn.send(h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status)))
    if not head_only and response.body:
        data += conn.send(h11.Data(data=response.body))  # type: ignore[operator]
    data += conn.send(h11.EndOfMessage())  # type: ignore[operator]
    return data  # type: ignore[return-value]


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 413: "Content Too Large", 421: "Misdirected Request",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


def _reason(status: int) -> bytes:
    return _REASONS.get(status, "").encode()


def _raw_response(status: int, text: str) -> bytes:
    """A whole response outside h11's state machine: for refusals, after which the connection closes."""
    body = text.encode() + b"\n"
    return (b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % (status, _reason(status), len(body))) + body
