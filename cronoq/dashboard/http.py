"""A small HTTP/1.1 server on the broker's own loop, with every cost bounded.

h11 parses and frames the HTTP (it is sans-I/O: bytes in, events out), this
module moves the bytes with asyncio streams, and a plain function turns each
`Request` into a `Response`. The broker's loop must never wait for a browser,
so:

- at most MAX_CONNECTIONS are open at once; one more gets a 503 and is closed;
- a request's head is at most MAX_HEAD_BYTES (h11 refuses more) with at most
  MAX_HEADERS headers, its body at most MAX_BODY_BYTES;
- a request must arrive whole within REQUEST_TIMEOUT of the connection
  being ready for it (idle keep-alive time included), or the connection ends;
- a response is written, then drained under WRITE_TIMEOUT: a browser that
  stops reading is dropped rather than buffered for. Only one response per
  connection is ever in flight (the next request is read after the last one
  left), so what is held for a slow reader is one response at most.

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

log = logging.getLogger("cronoq.dashboard")

MAX_CONNECTIONS = 64
MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 64
MAX_BODY_BYTES = 4096
REQUEST_TIMEOUT = 10.0
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
    """What to answer: status code, content type, body and extra headers."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Response]


def plain(status: int, text: str) -> Response:
    return Response(status, text.encode() + b"\n", "text/plain; charset=utf-8")


class HttpServer:
    """Serves `handler` on a host:port of the running loop; `start()` binds, `close()` ends every connection."""

    def __init__(self, handler: Handler, *, max_connections: int = MAX_CONNECTIONS,
                 request_timeout: float = REQUEST_TIMEOUT, write_timeout: float = WRITE_TIMEOUT) -> None:
        self._handler = handler
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.write_timeout = write_timeout
        self._server: asyncio.base_events.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def start(self, address: str) -> tuple[str, int]:
        """Listen on "host:port"; returns the address bound. Raises OSError when it cannot be bound."""
        host, _, port = address.rpartition(":")
        self._server = await asyncio.start_server(self._serve, host.strip("[]") or "127.0.0.1", int(port),
                                                  limit=READ_CHUNK)
        return self._server.sockets[0].getsockname()[:2]

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            _drop(writer)
        self._open.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= self.max_connections:
            # Said without waiting: a few bytes always fit the socket's buffer, and the close follows them.
            writer.write(_raw_response(503, "too many dashboard connections; try again shortly"))
            writer.close()
            return
        self._open.add(writer)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        try:
            await self._exchange(reader, writer)
        except (ConnectionError, asyncio.TimeoutError, h11.LocalProtocolError) as exc:
            log.debug("dashboard connection dropped: %r", exc)
            _drop(writer)
        else:
            writer.close()
            # A close waits for the last response to be read: a peer that stops reading now has WRITE_TIMEOUT.
            asyncio.get_running_loop().call_later(self.write_timeout, _drop, writer)
        finally:
            self._open.discard(writer)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests and responses on one connection until either side ends it."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        while True:
            try:
                request = await asyncio.wait_for(_read_request(conn, reader), self.request_timeout)
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                writer.write(_raw_response(status, f"bad request: {exc}"))
                await asyncio.wait_for(writer.drain(), self.write_timeout)
                return
            except _Refused as refusal:
                writer.write(_raw_response(refusal.status, refusal.reason))
                await asyncio.wait_for(writer.drain(), self.write_timeout)
                return
            if request is None:  # the peer closed between requests
                return
            try:
                response = self._handler(request)
            except Exception:  # a bug: it must cost this one request, never the broker
                log.exception("the dashboard failed to answer %s %s", request.method, request.path)
                response = plain(500, "the dashboard failed to answer (see the broker's log)")
            writer.write(_encode(conn, response, head_only=request.method == "HEAD"))
            await asyncio.wait_for(writer.drain(), self.write_timeout)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()


def _drop(writer: asyncio.StreamWriter) -> None:
    """End a connection now, with a reset: a peer that stalled gets nothing more, and what was buffered for it
    goes (a plain close would leave the kernel trying to deliver it). Nothing happens to one already closed."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        except OSError:
            pass  # already closed
    writer.transport.abort()


class _Refused(Exception):
    """A request this server will not read further (too many headers, too large a body)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await reader.read(READ_CHUNK))  # b"" at the end: h11 then reports the close


async def _read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> Request | None:
    """The next whole request; None when the peer closed cleanly before sending one."""
    event = await _next_event(conn, reader)
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
    while True:
        part = await _next_event(conn, reader)
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
            405: "Method Not Allowed", 409: "Conflict", 413: "Content Too Large",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


def _reason(status: int) -> bytes:
    return _REASONS.get(status, "").encode()


def _raw_response(status: int, text: str) -> bytes:
    """A whole response outside h11's state machine: for refusals, after which the connection closes."""
    body = text.encode() + b"\n"
    return (b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % (status, _reason(status), len(body))) + body
