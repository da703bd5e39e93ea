"""Every string and collection a peer sends has a bound, checked where it enters the broker.

A peer written by someone else need not cut what it sends as cronoq's own worker does: these tests speak
the protocol over raw ZeroMQ sockets to a real broker process and check what the broker keeps and
answers (docs/security.md, "Limits").
"""

from __future__ import annotations

import asyncio
import http.client
import json
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

import cronoq
from cronoq.wire import protocol
from tests.support import free_port, until

V = protocol.PROTOCOL_VERSION
MB = 1_000_000
POOLS = '[[pools]]\nname = "default"\n'


class RawPeer:
    """A DEALER that speaks the protocol frame by frame: [token, header, body?] out, [header, body?] in."""

    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    async def send(self, header: Any, body: bytes | None = None) -> None:
        frames = [b"", msgspec.msgpack.encode(header)] + ([body] if body is not None else [])
        await self.sock.send_multipart(frames)

    async def receive(self, timeout: float = 30.0) -> list[tuple[list[Any], bytes | None]]:
        """The messages of the next thing the broker sends (a batch opened), each as its raw header array."""
        frames = await asyncio.wait_for(self.sock.recv_multipart(), timeout)
        header = msgspec.msgpack.decode(frames[0])
        if header[0] == "batch":
            return [(item, body) for item, body in header[2]]
        return [(header, frames[1] if len(frames) > 1 else None)]

    async def next_of(self, tag: str, timeout: float = 30.0) -> tuple[list[Any], bytes | None]:
        """The next message with `tag` (heartbeats and other messages before it are skipped)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            for header, body in await self.receive(max(0.1, end - loop.time())):
                if header[0] == tag:
                    return header, body

    def close(self) -> None:
        self.sock.close()


def overview(port: int) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/api/overview")
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, body[:500]
        return body
    finally:
        conn.close()


async def test_a_worker_failing_with_megabyte_error_fields_leaves_every_view_of_the_failure_bounded(broker_factory):
    port = free_port()
    broker = broker_factory(POOLS, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    worker = RawPeer(broker.workers)
    try:
        await worker.send(["ready", V, 1, ["default"], 1])
        await worker.next_of("welcome")
        async with cronoq.connect(broker.clients) as client:
            handle = await client.submit("x")
            task, _ = await worker.next_of("task")
            # What a worker that cuts nothing sends: a megabyte of error type (as much as a header frame may
            # carry, with max_payload_bytes at its default), and each other text field over its bound.
            await worker.send(["done", V, task[2], task[3], False, "E" * 1_000_000, "m" * 20_000, "t" * 40_000])
            with pytest.raises(cronoq.TaskFailed) as failed:
                await handle.result(timeout=30)
            error = failed.value
            assert len(error.type.encode()) <= protocol.MAX_ERROR_TYPE_BYTES
            assert len(error.message.encode()) <= protocol.MAX_ERROR_MESSAGE_BYTES
            assert len(error.traceback.encode()) <= protocol.MAX_TRACEBACK_BYTES
            assert error.type.startswith("EEE") and "bytes cut" in error.type
            info = await client.status(handle.id)
            # info's error is "<error_type>: <error_message>": both cut.
            bound = protocol.MAX_ERROR_TYPE_BYTES + 2 + protocol.MAX_ERROR_MESSAGE_BYTES
            assert info.state == "failed" and len((info.error or "").encode()) <= bound

            body = await asyncio.to_thread(overview, port)
            (failure,) = json.loads(body)["failures"]
            assert failure["id"] == handle.id
            assert len(body) < 64 * 1024, f"one failure made the overview {len(body)} bytes"
    finally:
        worker.close()


async def test_names_and_ids_past_their_bounds_are_refused_naming_the_field_and_no_reply_echoes_a_megabyte(
        broker_factory):
    broker = broker_factory(POOLS)
    client, worker = RawPeer(broker.clients), RawPeer(broker.workers)
    try:
        # A valid message first: a peer that never showed a valid one is answered only now and then.
        await client.send(["ping", V, 1])
        await client.next_of("ok")
        await worker.send(["heartbeat", V])
        await worker.next_of("reregister")
        long_id = "i" * (protocol.MAX_TASK_ID_CHARS + 1)
        await client.send(["status", V, 5, long_id])
        (error, _), = await client.receive()
        assert error[:4] == ["error", V, 5, "INVALID_ARGUMENT"]
        assert "`id`" in error[4] and str(protocol.MAX_TASK_ID_CHARS) in error[4], error[4]

        await worker.send(["ready", V, 6, ["p" * (protocol.MAX_NAME_CHARS + 1)], 1])
        error, _ = await worker.next_of("error")
        assert error[2:4] == [6, "INVALID_ARGUMENT"] and "`pools`" in error[4], error[4]
        await worker.send(["ready", V, 7, ["default"] * (protocol.MAX_READY_POOLS + 1), 1])
        error, _ = await worker.next_of("error")
        assert error[2:4] == [7, "INVALID_ARGUMENT"] and "`pools`" in error[4], error[4]

        # Refusals that quote what was sent quote a bounded part of it: a key of a megabyte, a settings table
        # of a megabyte.
        await client.send(["submit", V, 8, "default", None, "normal", None, None, "k" * MB], b"\xc0")
        (error, _), = await client.receive()
        assert error[2:4] == [8, "INVALID_ARGUMENT"] and "key" in error[4]
        assert len(error[4].encode()) <= protocol.MAX_ERROR_MESSAGE_BYTES
        weights = {f"tenant-{n}": 1 for n in range(40_000)}
        await worker.send(["ready", V, 9, ["default"], 1, {"default": {"tenant_weights": weights}}])
        error, _ = await worker.next_of("error")
        assert error[2:4] == [9, "FAILED_PRECONDITION"], error
        assert len(error[4].encode()) <= protocol.MAX_ERROR_MESSAGE_BYTES

        # The broker still serves, and a well-formed ready is welcome.
        await worker.send(["ready", V, 10, ["default"], 1])
        welcome, _ = await worker.next_of("welcome")
        assert welcome[2] == 10
    finally:
        client.close()
        worker.close()
