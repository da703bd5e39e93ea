"""The DEALER socket a client or a worker talks to one broker through, set up in one place.

One broker may have several addresses: its primary and its standbys. One
DEALER connects to all of them; only the broker that serves completes a
handshake (a standby binds nothing until it takes over), so with
ZMQ_IMMEDIATE messages queue only on the connection that leads somewhere.

What every such socket shares: the settings of `transport.tune`, the CURVE
client keys when the broker's public key is given, and a monitor socket
made before the first connect, so that `cronoq.wire.link` sees every step
of every connection. What differs is asked for by name: ZMQ_IMMEDIATE
(a one-off question on a socket of its own must queue before its
connection completes), ZeroMQ's own heartbeat (the client has no other;
a worker heartbeats in the protocol), the monitor.

Leans on `transport` (the context, the shared settings) and `curve`.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq

from cronoq.errors import InvalidArgument
from cronoq.wire.curve import connect_encrypted
from cronoq.wire.link import EVENTS as LINK_EVENTS
from cronoq.wire.transport import context, tune

ZMTP_HEARTBEAT_MS = 1000
ZMTP_HEARTBEAT_TIMEOUT_MS = 5000
"""ZeroMQ's heartbeat on a client's connection: a broker that vanished without closing it (its host died) is
noticed within seconds, and the connection made again, which re-sends what is outstanding."""


def broker_dealer(addresses: Sequence[str], *, server_key: bytes | None, immediate: bool = True,
                  zmtp_heartbeat: bool = False, monitored: bool = True) -> tuple[zmq.Socket, zmq.Socket | None]:
    """A DEALER connecting to every one of `addresses` (one broker's primary and standbys), and its monitor
    socket (None unless `monitored`): encrypted when `server_key` (the broker's CURVE public key) is given.

    Raises InvalidArgument, with nothing left open, for an address libzmq refuses.
    """
    sock = context().socket(zmq.DEALER)
    tune(sock)
    if server_key is not None:
        connect_encrypted(sock, server_key)
    if zmtp_heartbeat:
        sock.setsockopt(zmq.HEARTBEAT_IVL, ZMTP_HEARTBEAT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, ZMTP_HEARTBEAT_TIMEOUT_MS)
    if immediate:
        # Queue only on connections whose handshake completed: with a primary and standbys listed, only the
        # broker that serves ever gets a message (a waiting standby completes no handshake until it takes over).
        sock.setsockopt(zmq.IMMEDIATE, 1)
    monitor = sock.get_monitor_socket(LINK_EVENTS) if monitored else None
    for address in addresses:
        try:
            sock.connect(address)
        except zmq.ZMQError as exc:
            if monitor is not None:
                sock.disable_monitor()
                monitor.close(linger=0)
            sock.close(linger=0)
            raise InvalidArgument(f"cannot connect to broker address {address!r}: {exc}") from None
    return sock, monitor
