"""What a socket monitor says about a client's or worker's link to the broker, in words a user can act on.

libzmq connects, reconnects and handshakes on its own, and tells the sender
nothing: a request to a broker that is down, or that speaks CURVE with
another key, simply waits. The socket's monitor does report each step, one
event at a time. `Link` turns those events into the state of the link and,
while it fails, a sentence that names why. It does no I/O and reads no
clock: the client and the worker feed it their monitor's events with the
loop's time.

When waiting is pointless (`hopeless`):

- a mechanism mismatch (one side encrypted, the other not) at once: libzmq
  does not even try again after it;
- a handshake that fails `HANDSHAKE_FAILURES_FINAL` times in a row without
  saying why: with a CURVE key, the broker cannot read a peer holding
  another broker's public key, and waiting changes nothing. (One such
  failure is not enough to tell: a broker often drops a peer of the other
  kind, encrypted or not, before the peer reads why, and the mismatch,
  which names the mistake better, shows on a later attempt.)
- refused connections only while the link has never been up, once they
  have gone on for `REFUSED_GRACE` seconds: a broker started a moment after
  its client still gets the requests. A link that was up is taken to be
  restarting: its requests wait for the broker to come back (the client's
  request_timeout).

A settled trouble stays until a handshake succeeds: later attempts that
fail less tellingly do not blur it.

A client or worker given a broker's primary and standbys connects one
socket to every address; `Links` keeps a `Link` per address and judges the
socket by its best one.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import zmq

from cronoq.errors import InvalidArgument

REFUSED_GRACE = 1.0
"""Seconds of refused connections, on a link never up, before its requests fail instead of waiting."""

KEY_OPTION = "curve_public_key, --curve-public-key"

HANDSHAKE_FAILURES_FINAL = 10
"""Handshakes failing in a row, without a reason, that settle it (about 1.5 s of retries). Against a broker
of the other kind, about one attempt in three fails that way before the mismatch shows; ten in a row is a
chance in some ten thousand."""

EVENTS = int(zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED
             | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
             | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
"""The monitor events a Link reads."""

_CONNECTED = int(zmq.EVENT_CONNECTED)
_RETRIED = int(zmq.EVENT_CONNECT_RETRIED)
_DISCONNECTED = int(zmq.EVENT_DISCONNECTED)
_SUCCEEDED = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)
_NO_DETAIL = int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_PROTOCOL = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
_AUTH = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_MECHANISM_MISMATCH = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)


class Link:
    """The link of one DEALER (the client's, or a worker's) to the broker at `address`; `encrypted`: it was
    given the broker's CURVE public key."""

    def __init__(self, address: str, *, encrypted: bool) -> None:
        self.address = address
        self.encrypted = encrypted
        self.handshakes = 0
        """Handshakes that succeeded, over the link's life."""
        self.up = False
        """A handshake succeeded and the connection has not ended since."""
        self.trouble: str | None = None
        """Why the link is failing right now, as a sentence; None while it is up or has not failed."""
        self.trouble_since = 0.0
        self.final = False
        """The trouble is of the kind waiting cannot mend (a CURVE mistake)."""
        self._reached = False  # the current attempt's TCP connection was made
        self._refusing = False  # the trouble is refused connections, which a starting broker ends
        self._handshake_failures = 0

    def observe(self, event: int, value: int, now: float) -> None:
        """Take one monitor event (its `event` and `value` fields) that happened at `now`."""
        if event == _SUCCEEDED:
            self.handshakes += 1
            self.up = True
            self.trouble = None
            self.final = False
            self._refusing = False
            self._handshake_failures = 0
        elif event == _CONNECTED:
            self._reached = True
        elif event == _DISCONNECTED:
            self.up = False
        elif event == _RETRIED:
            # libzmq tries again after an attempt that failed or a connection that ended: only the first
            # means nobody took the connection.
            if not self._reached:
                self._fail(f"connection refused at {self.address}: is a broker running there?", now, refused=True)
            self._reached = False
        elif event == _PROTOCOL and value == _MECHANISM_MISMATCH:
            self._fail(self._mismatch(), now, final=True)
        elif event == _AUTH:
            self._fail(f"the broker at {self.address} refused the handshake (authentication status {value})",
                       now, final=True)
        elif event in (_PROTOCOL, _NO_DETAIL):
            self._handshake_failures += 1
            self._fail(self._wrong_key() if self.encrypted else self._dropped(), now,
                       final=self._handshake_failures >= HANDSHAKE_FAILURES_FINAL)

    def hopeless(self, now: float) -> str | None:
        """Why requests should fail now rather than wait (the rules at the top of this module), or None."""
        if self.trouble is None:
            return None
        if self.final or (self._refusing and self.handshakes == 0 and now - self.trouble_since >= REFUSED_GRACE):
            return self.trouble
        return None

    def silence(self, what: str) -> str:
        """Why `what` (e.g. "no reply from the broker at ADDR within 30 s") came to nothing, by the link's state."""
        if self.trouble is not None:
            return f"{what}: {self.trouble}"
        if self.up:
            return f"{what}; the connection is up: is the broker stalled or overloaded?"
        if self._reached:
            return (f"{what}: the connection was made but its ZeroMQ handshake never completed; "
                    "is a cronoq broker serving there (not a standby still waiting to take over)?")
        if self.handshakes == 0:
            return f"{what}: no connection could be made; is the address right, and reachable from here?"
        return f"{what}; is it running?"

    def _fail(self, trouble: str, now: float, *, final: bool = False, refused: bool = False) -> None:
        if self.final:
            return  # settled: kept until a handshake succeeds
        if self.trouble is None:
            self.trouble_since = now
        self.trouble = trouble
        self.final = final
        self._refusing = refused

    def _mismatch(self) -> str:
        if self.encrypted:
            return (f"the broker at {self.address} is not encrypted, but a CURVE public key was given ({KEY_OPTION}): "
                    "leave it out, or give the broker a curve_secret_key_file")
        return (f"the broker at {self.address} is encrypted (CURVE): give its public key ({KEY_OPTION}), the NAME.key "
                "file `cronoq keygen` wrote with its secret key")

    def _dropped(self) -> str:
        return (f"the broker at {self.address} dropped the connection during the handshake: if it is encrypted "
                f"(CURVE), give its public key ({KEY_OPTION}); if not, is this a cronoq broker's endpoint, with "
                "room for another connection (max_connections)?")

    def _wrong_key(self) -> str:
        return (f"CURVE handshake with {self.address} failed: the public key given ({KEY_OPTION}) is not this "
                "broker's; give the NAME.key written with its curve_secret_key_file (or leave the key out, if "
                "the broker is not encrypted)")


class Links:
    """The links of one DEALER connected to every address of one broker: its primary and its standbys.

    Only one of them serves at a time (the one holding data_dir's lock); a waiting standby holds its
    address but completes no handshake until it takes over. So the socket is as good as its best link: it
    is up while any link is up, and waiting is hopeless only when every link is (a silent standby while its
    primary serves is no trouble at all). Monitor events name the endpoint they concern, sometimes with the host name
    resolved (``tcp://localhost:5555`` comes back as ``tcp://127.0.0.1:5555``): `observe` matches both.
    """

    def __init__(self, addresses: tuple[str, ...], *, encrypted: bool) -> None:
        self.addresses = addresses
        self.links = [Link(address, encrypted=encrypted) for address in addresses]
        self._by_endpoint = {address: link for address, link in zip(addresses, self.links)}

    @property
    def up(self) -> bool:
        """Some link's handshake succeeded and its connection has not ended since."""
        return any(link.up for link in self.links)

    @property
    def handshakes(self) -> int:
        """Handshakes that succeeded, over all links' lives."""
        return sum(link.handshakes for link in self.links)

    @property
    def trouble(self) -> str | None:
        """Why the broker cannot be reached right now (None while some link is up, or none has failed)."""
        if self.up:
            return None
        troubles = [link.trouble for link in self.links if link.trouble is not None]
        if len(troubles) < len(self.links):
            return None  # some address has not failed yet: it may be the one that answers
        return "; ".join(troubles)

    @property
    def final(self) -> bool:
        """Every link's trouble is of the kind waiting cannot mend."""
        return all(link.final for link in self.links)

    def abandoned(self) -> None:
        """Its owner closed the socket (the broker was silent too long): no link is up any more, though the
        monitor, closed with it, said nothing of it."""
        for link in self.links:
            link.up = False
            link._reached = False

    def observe(self, event: int, value: int, endpoint: bytes | str, now: float) -> None:
        """Take one monitor event for `endpoint` that happened at `now`."""
        link = self._link_for(endpoint.decode(errors="replace") if isinstance(endpoint, bytes) else endpoint)
        if link is not None:
            link.observe(event, value, now)

    def hopeless(self, now: float) -> str | None:
        """Why requests should fail now rather than wait: every link is hopeless (see `Link.hopeless`)."""
        if self.up:
            return None
        reasons = [link.hopeless(now) for link in self.links]
        if any(reason is None for reason in reasons):
            return None
        return "; ".join(reason for reason in reasons if reason is not None)

    def silence(self, what: str) -> str:
        """Why `what` came to nothing, by the state of the links (the one that is up, if any)."""
        if len(self.links) == 1:
            return self.links[0].silence(what)
        live = [link for link in self.links if link.up]
        if live:
            return live[0].silence(what)
        trouble = self.trouble
        if trouble is not None:
            return f"{what}: {trouble}"
        return f"{what}: none of {', '.join(self.addresses)} answers; is a broker (or its standby) running there?"

    def _link_for(self, endpoint: str) -> Link | None:
        link = self._by_endpoint.get(endpoint)
        if link is not None or len(self.links) == 1:
            return link or self.links[0]
        # Another spelling of one of ours: the same port with the host resolved. One link on that port: it.
        port = endpoint.rpartition(":")[2]
        same_port = [link for link in self.links if link.address.rpartition(":")[2] == port]
        if len(same_port) == 1:
            self._by_endpoint[endpoint] = same_port[0]
            return same_port[0]
        return self._resolved(endpoint)

    def _resolved(self, endpoint: str) -> Link | None:
        """The link whose address names `endpoint`'s host by name (several addresses share its port)."""
        scheme, _, rest = endpoint.partition("://")
        host, _, port = rest.rpartition(":")
        for link in self.links:
            their_scheme, _, their_rest = link.address.partition("://")
            their_host, _, their_port = their_rest.rpartition(":")
            if (their_scheme, their_port) != (scheme, port):
                continue
            try:
                resolved = {info[4][0] for info in socket.getaddrinfo(their_host.strip("[]"), None)}
            except (OSError, UnicodeError):
                continue
            if host.strip("[]") in resolved:
                self._by_endpoint[endpoint] = link
                return link
        return None


def parse_addresses(value: str | Sequence[str], what: str) -> tuple[str, ...]:
    """One broker's addresses (its primary and standbys), in order and without repeats, from a string ("A" or
    "A,B") or a list of such strings.

    Raises InvalidArgument naming `what` (e.g. "broker address") when none is given or one is no string.
    """
    items = [value] if isinstance(value, str) else value
    if isinstance(items, (bytes, bytearray)) or not isinstance(items, Sequence):
        raise InvalidArgument(f"{what} must be a string such as 'tcp://127.0.0.1:5555', or a list of them; "
                              f"got {type(value).__name__}")
    addresses: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidArgument(f"{what} must be a string, got {type(item).__name__}")
        for address in item.split(","):
            address = address.strip()
            if address and address not in addresses:
                addresses.append(address)
    if not addresses:
        raise InvalidArgument(f"{what}: expected at least one address such as 'tcp://127.0.0.1:5555', got {value!r}")
    return tuple(addresses)
