"""The addresses a standby holds while it waits, so that no other process can take them.

A standby binds its client and worker endpoints (tcp:// and ipc://) as plain listening sockets the moment
it starts, and keeps them until it takes over; then it hands each listening socket to its ZeroMQ ROUTER
(ZMQ_USE_FD), so the address is never free for an instant. While it waits it serves nothing on them:

- a connection is accepted and then left silent. The peer's ZeroMQ handshake never completes, so its
  socket (with ZMQ_IMMEDIATE, as every cronoq client and worker has) queues no message on it: a client or
  worker given the primary's and the standby's addresses sends its token, its requests and its results to
  the primary only, and nothing at all reaches the standby;
- at the takeover the silent connections are closed (their peers reconnect at once) and the ones still
  in the kernel's queue are accepted by the ROUTER, whose handshake then completes: the switch costs a
  client nothing but the reconnect.

A silent connection is closed as soon as its peer closes it, and at most HELD_CONNECTIONS_MAX are kept
(the oldest goes first), so peers cannot exhaust the standby's file descriptors.

inproc:// endpoints are not held: no other process can reach them.

Its HTTP addresses, `metrics` and `dashboard` ("HOST:PORT"), are held too (`hold_servers`): bound as the
broker's asyncio servers would bind them (every address the host resolves to), listening, and handed to
those servers at the takeover (`hand_over_servers`). Meanwhile a connection there is accepted and closed at
once, unanswered: a browser or a scraper learns at once that nothing serves there, and nobody else can bind
the address to collect the admin tokens a browser would send it.
"""

from __future__ import annotations

import collections
import errno
import os
import selectors
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

HELD_CONNECTIONS_MAX = 256
"""Silent connections one held address keeps at most (per address); older ones are closed first."""


class HoldError(OSError):
    """An address cannot be held now; the message names it and says why."""


class Unholdable(HoldError):
    """An address this module cannot bind the way ZeroMQ would (a host that is an interface name, which only
    ZeroMQ resolves): the broker binds it itself at the takeover, and it is not held meanwhile."""


@dataclass
class HeldAddress:
    """One listening socket held for `endpoint`, with the connections it accepted and keeps silent."""

    endpoint: str
    listener: socket.socket
    silent: collections.OrderedDict[int, socket.socket] = field(default_factory=collections.OrderedDict)

    def close(self) -> None:
        self.drop_connections()
        self.listener.close()

    def drop_connections(self) -> None:
        for conn in self.silent.values():
            conn.close()
        self.silent.clear()


def listening_socket(endpoint: str) -> socket.socket:
    """A socket bound and listening at a tcp:// or ipc:// endpoint, as ZeroMQ would bind it. Raises HoldError."""
    scheme, _, rest = endpoint.partition("://")
    try:
        if scheme == "tcp":
            sock = _tcp_listener(rest)
        elif scheme == "ipc":
            sock = _ipc_listener(rest)
        else:
            raise HoldError(f"cannot hold {endpoint}: only tcp:// and ipc:// endpoints are held")
    except HoldError:
        raise
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise HoldError(f"cannot hold {endpoint}: another process has bound it") from None
        raise HoldError(f"cannot hold {endpoint}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def _tcp_listener(rest: str) -> socket.socket:
    host, _, port_text = rest.rpartition(":")
    port = 0 if port_text == "*" else int(port_text)
    host = host.strip("[]")
    if host == "*":
        family, address = socket.AF_INET, ("0.0.0.0", port)  # ZeroMQ's '*' without ZMQ_IPV6
    else:
        try:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise Unholdable(f"cannot hold tcp://{rest} while standing by: {host!r} does not resolve here "
                             f"({exc.strerror}); if it is an interface name, ZeroMQ binds it at the takeover") from None
        info.sort(key=lambda item: item[0] != socket.AF_INET)  # ZeroMQ prefers IPv4 unless told otherwise
        family, address = info[0][0], info[0][4]

    def bind(sock: socket.socket) -> None:
        # As ZeroMQ's own listener: a restart may rebind while old connections linger in TIME_WAIT. Never
        # SO_REUSEPORT, which would let another process bind the same port beside us.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    return _listening(socket.socket(family, socket.SOCK_STREAM), bind)


def _ipc_listener(path: str) -> socket.socket:
    def bind(sock: socket.socket) -> None:
        try:
            sock.bind(path)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or not _stale_unix_socket(path):
                raise
            os.unlink(path)  # a socket file nobody listens on: what a killed broker leaves behind
            sock.bind(path)
    return _listening(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), bind)


def _listening(sock: socket.socket, bind: Callable[[socket.socket], None]) -> socket.socket:
    """`sock` bound by `bind` and listening; closed, and the error raised, if either fails."""
    try:
        bind(sock)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def _stale_unix_socket(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False


SERVER_BACKLOG = 100
"""The listen backlog of an HTTP address, as asyncio's servers have it."""


def server_sockets(address: str) -> list[socket.socket]:
    """Sockets bound and listening at "HOST:PORT" for an HTTP server, one for each address HOST resolves to, as
    asyncio.start_server binds them (an empty HOST is 127.0.0.1, as the broker's servers read it). Raises
    HoldError naming the address."""
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise HoldError(f"cannot hold {address}: {host!r} does not resolve here ({exc.strerror})") from None
    sockets: list[socket.socket] = []
    seen = set()
    try:
        for family, kind, proto, _, sockaddr in infos:
            if (family, sockaddr) in seen:
                continue
            seen.add((family, sockaddr))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's servers; never SO_REUSEPORT
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(sockaddr)
            sock.listen(SERVER_BACKLOG)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise HoldError(f"cannot hold {address}: another process has bound it") from None
        raise HoldError(f"cannot hold {address}: {exc.strerror or exc}") from None
    return sockets


class HeldAddresses:
    """The endpoints a standby holds: `hold` binds those it lacks, `pause` keeps their connections silent,
    `hand_over` gives the listening sockets to the broker that takes over."""

    def __init__(self) -> None:
        self._held: dict[str, HeldAddress] = {}
        self._servers: dict[str, list[socket.socket]] = {}
        self._selector = selectors.DefaultSelector()
        self.unholdable: dict[str, str] = {}
        """Endpoints left to the broker's own bind at the takeover, with why (Unholdable)."""

    @property
    def endpoints(self) -> list[str]:
        return list(self._held)

    def hold(self, endpoints: list[str]) -> list[str]:
        """Hold each tcp:// and ipc:// endpoint of `endpoints` not held yet, and let go of held ones no longer in
        it; returns why each that could not be held was not (empty: all are held, or `unholdable`)."""
        for endpoint in [e for e in self._held if e not in endpoints]:
            self._release(endpoint)
        problems = []
        for endpoint in endpoints:
            if endpoint in self._held or endpoint in self.unholdable or not endpoint.startswith(("tcp://", "ipc://")):
                continue
            try:
                listener = listening_socket(endpoint)
            except Unholdable as exc:
                self.unholdable[endpoint] = str(exc)
                continue
            except HoldError as exc:
                problems.append(str(exc))
                continue
            held = HeldAddress(endpoint, listener)
            self._held[endpoint] = held
            self._selector.register(listener, selectors.EVENT_READ, held)
        return problems

    @property
    def servers(self) -> list[str]:
        return list(self._servers)

    def hold_servers(self, addresses: list[str]) -> list[str]:
        """Hold each HTTP address ("HOST:PORT") of `addresses` not held yet, and let go of held ones no longer in it;
        returns why each that could not be held was not."""
        for address in [a for a in self._servers if a not in addresses]:
            self._release_server(address)
        problems = []
        for address in addresses:
            if address in self._servers:
                continue
            try:
                sockets = server_sockets(address)
            except HoldError as exc:
                problems.append(str(exc))
                continue
            self._servers[address] = sockets
            for sock in sockets:
                self._selector.register(sock, selectors.EVENT_READ, address)
        return problems

    def hand_over_servers(self) -> dict[str, list[socket.socket]]:
        """Stop holding the HTTP addresses: their listening sockets by address, for the broker's servers."""
        servers = self._servers
        for sockets in servers.values():
            for sock in sockets:
                self._selector.unregister(sock)
        self._servers = {}
        return servers

    def _release_server(self, address: str) -> None:
        for sock in self._servers.pop(address):
            self._selector.unregister(sock)
            sock.close()

    def pause(self, seconds: float) -> None:
        """Wait `seconds`, meanwhile taking new connections (and keeping them silent) and closing those whose
        peers left."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not self._selector.get_map():
                time.sleep(left)
                return
            try:
                ready = self._selector.select(left)
            except InterruptedError:
                continue
            for key, _ in ready:
                if isinstance(key.data, str):
                    _turn_away(key.fileobj)  # type: ignore[arg-type]
                elif isinstance(key.data, HeldAddress):
                    self._accept(key.data)
                else:
                    self._check_peer(*key.data)

    def _accept(self, held: HeldAddress) -> None:
        while True:
            try:
                conn, _ = held.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # out of descriptors, say: the connection stays queued and is tried again
            conn.setblocking(False)
            if len(held.silent) >= HELD_CONNECTIONS_MAX:
                _, oldest = held.silent.popitem(last=False)
                self._selector.unregister(oldest)
                oldest.close()
            held.silent[conn.fileno()] = conn
            self._selector.register(conn, selectors.EVENT_READ, (held, conn))

    def _check_peer(self, held: HeldAddress, conn: socket.socket) -> None:
        """The peer wrote (its greeting, which is never answered) or left: read and drop, close on EOF."""
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._selector.unregister(conn)
            held.silent.pop(conn.fileno(), None)
            conn.close()

    def hand_over(self) -> dict[str, int]:
        """Stop holding: close the silent connections (their peers reconnect to the broker that serves now) and
        return each listening socket's descriptor by endpoint, for the broker's ROUTERs to adopt."""
        fds = {}
        for endpoint, held in self._held.items():
            for conn in held.silent.values():
                self._selector.unregister(conn)
            held.drop_connections()
            self._selector.unregister(held.listener)
            fds[endpoint] = held.listener.detach()
        self._held.clear()
        return fds

    def close(self) -> None:
        """Let go of every address (a standby that stops without taking over)."""
        for endpoint in list(self._held):
            self._release(endpoint)
        for address in list(self._servers):
            self._release_server(address)
        self._selector.close()

    def _release(self, endpoint: str) -> None:
        held = self._held.pop(endpoint)
        for conn in held.silent.values():
            self._selector.unregister(conn)
        self._selector.unregister(held.listener)
        held.close()
        if endpoint.startswith("ipc://"):
            try:
                os.unlink(endpoint.removeprefix("ipc://"))
            except OSError:
                pass


def _turn_away(listener: socket.socket) -> None:
    """Accept what waits at a held HTTP address and close it unanswered: nothing serves there yet."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # nothing more waits (or no descriptor is free: it stays queued and is tried again)
            return
        conn.close()
