"""The one DEALER a client and a worker talk to a broker through (cronoq.wire.dealer): what it is set up with,
and an address libzmq refuses, which both sides now report the same way. No broker is needed: nothing here
waits for a connection."""

from __future__ import annotations

import pytest
import zmq

import cronoq
from cronoq.wire.curve import keygen, public_key
from cronoq.wire.dealer import ZMTP_HEARTBEAT_MS, broker_dealer
from cronoq.wire.transport import HIGH_WATER_MARK


def test_the_socket_has_the_settings_both_sides_share_and_only_those_asked_for(tmp_path):
    _, key_file = keygen(tmp_path)
    sock, monitor = broker_dealer(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], server_key=public_key(key_file),
                                  zmtp_heartbeat=True)
    try:
        assert sock.type == zmq.DEALER
        assert (sock.getsockopt(zmq.LINGER), sock.getsockopt(zmq.SNDHWM)) == (0, HIGH_WATER_MARK)
        assert sock.getsockopt(zmq.IMMEDIATE) == 1, "requests queue only on a connection that completed"
        assert sock.getsockopt(zmq.HEARTBEAT_IVL) == ZMTP_HEARTBEAT_MS
        assert sock.getsockopt(zmq.MECHANISM) == zmq.CURVE, "encrypted with the broker's public key"
        assert monitor is not None and monitor.type == zmq.PAIR
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)

    plain, none = broker_dealer(["tcp://127.0.0.1:1"], server_key=None, immediate=False, monitored=False)
    try:
        assert none is None
        assert (plain.getsockopt(zmq.IMMEDIATE), plain.getsockopt(zmq.HEARTBEAT_IVL)) == (0, 0)
        assert plain.getsockopt(zmq.MECHANISM) == zmq.NULL
    finally:
        plain.close(linger=0)


def test_an_address_libzmq_refuses_is_an_invalid_argument_naming_it():
    with pytest.raises(cronoq.InvalidArgument, match="cannot connect to broker address 'tcp://nowhere'"):
        broker_dealer(["tcp://127.0.0.1:1", "tcp://nowhere"], server_key=None)


async def test_a_client_and_a_worker_given_such_an_address_both_say_so():
    with pytest.raises(cronoq.InvalidArgument, match="'tcp://nowhere'"):
        await cronoq.connect("tcp://nowhere")

    async def echo(payload: object) -> object:
        return payload

    worker = cronoq.Worker("tcp://nowhere", [cronoq.Pool("default", echo)])
    with pytest.raises(cronoq.InvalidArgument, match="'tcp://nowhere'"):
        await worker.run()
