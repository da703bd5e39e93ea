"""Impostors at a cluster member's address: a worker or client follows a map only from the member whose address
it is.

A real member b1 serves; member b2 is down and a plain ZeroMQ process of this test has taken its worker
address (on another host, nothing stops it: docs/security.md). The worker, told b1's address only, probes b2
as the map says it should; the impostor answers with a forged map that claims to come from b1 and gives b1's
pools to b2. The worker must not follow it: it keeps serving b1, and b1's tasks run. A client meets the same
impostor at b2's client address, and must not let it move b1's address.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Callable

import pytest
import zmq

import cronoq
from cronoq.wire import protocol
from tests.integration.test_cluster import Cluster, cluster  # noqa: F401 - the fixture
from tests.support import BEATS, until

POOLS = '[[pools]]\nname = "mine"\nmember = "b1"\n[[pools]]\nname = "theirs"\nmember = "b2"\n'


class Impostor(threading.Thread):
    """A ROUTER at `address` that answers what `answer` returns for each message it gets (nothing for None);
    `batch` is the reply batch type of the endpoint it pretends to be. Counts the `cluster` questions."""

    def __init__(self, address: str, answer: Callable[[Any], Any], batch: type, decode: Callable[[bytes], Any]) -> None:
        super().__init__(daemon=True)
        self.answer, self.batch, self.decode = answer, batch, decode
        self.asked_for_map = 0
        self.stopping = threading.Event()
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                if not self.sock.poll(50):
                    continue
                identity, _token, header, *body = self.sock.recv_multipart()
                for item, _ in protocol.unbatch(self.decode(header), body[0] if body else None):
                    reply = self.answer(item)
                    if reply is not None:
                        for frames, _ in protocol.pack(self.batch, [(reply, None)]):
                            self.sock.send_multipart([identity, *frames])
                    if isinstance(item, protocol.ClusterRequest):
                        self.asked_for_map += 1
        finally:
            self.sock.close()


def ok(item: Any, value: Any) -> protocol.Ok:
    return protocol.Ok(protocol.PROTOCOL_VERSION, item.rid, value)


async def test_a_worker_ignores_a_map_from_a_peer_claiming_another_members_name(cluster, caplog):  # noqa: F811
    c: Cluster = cluster(["b1", "b2"])
    c.write(POOLS)
    c.start("b1")
    ran: list[Any] = []

    async def run(payload: Any) -> Any:
        ran.append(payload)
        return payload

    async with cronoq.connect(c.clients("b1"), request_timeout=30) as client:
        real = await client.cluster()
        assert real is not None and real["member"] == "b1"
        forged = {**real, "version": f"{real['version']}-forged", "member": "b1",
                  "members": [{**m, "pools": [] if m["name"] == "b1" else ["mine", "theirs"]} for m in real["members"]]}
        impostor = Impostor(c.workers("b2"),
                            lambda item: ok(item, forged) if isinstance(item, protocol.ClusterRequest) else None,
                            protocol.CommandBatch, protocol.decode_worker_message)
        impostor.start()
        worker = cronoq.Worker(c.workers("b1"), [cronoq.Pool("mine", run)], concurrency=2, **BEATS)
        serving = asyncio.ensure_future(worker.run())
        try:
            with caplog.at_level(logging.WARNING, logger="cronoq.worker"):
                await until(lambda: _true(impostor.asked_for_map >= 1), "the worker probed b2's address")
                await until(lambda: _true(worker.members == {"b1": ["mine"]}), "the worker serves b1")
                await asyncio.sleep(1.0)  # some heartbeats: time for a forged map to be acted on, had it been
                assert worker.members == {"b1": ["mine"]}, "the real member was not dropped"
                task = await client.submit("hello", pool="mine")
                assert await task.result(timeout=30) == "hello"
            assert "ignoring a cluster map from tcp://127.0.0.1:" in caplog.text
            assert "it claims to come from member 'b1', but that is member 'b2'" in caplog.text
        finally:
            await worker.stop()
            await serving
            impostor.stopping.set()
            impostor.join()


async def _true(value: bool) -> bool:
    return value


async def test_a_client_ignores_a_map_from_a_peer_claiming_another_members_name(cluster, caplog):  # noqa: F811
    """The client's connection to b2 meets the impostor, which refuses a submit naming b1 as the owner and then
    answers the client's re-read of the map with one from "b1" that moves b1's address to itself."""
    c: Cluster = cluster(["b1", "b2"])
    c.write(POOLS)
    c.start("b1")
    async with cronoq.connect(c.clients("b1"), request_timeout=10) as client:
        real = await client.cluster()
        assert real is not None
        forged = {**real, "version": f"{real['version']}-forged", "member": "b1",
                  "members": [{**m, "clients": [c.clients("b2")], "pools": ["mine", "theirs"]} if m["name"] == "b1"
                              else {**m, "pools": []} for m in real["members"]]}

        def answer(item: Any) -> Any:
            if isinstance(item, protocol.Hello):
                return ok(item, protocol.hello_value(1 << 20, "b2"))
            if isinstance(item, protocol.ClusterRequest):
                return ok(item, forged)
            rid = getattr(item, "rid", 0)
            return protocol.Error(protocol.PROTOCOL_VERSION, rid, "FAILED_PRECONDITION",
                                  "pool 'theirs' belongs to cluster member b1", {"member": "b1", "pool": "theirs"})

        impostor = Impostor(c.clients("b2"), answer, protocol.ReplyBatch, protocol.decode_client_request)
        impostor.start()
        try:
            with caplog.at_level(logging.WARNING, logger="cronoq.client"):
                with pytest.raises(cronoq.FailedPrecondition):
                    await client.submit("x", pool="theirs")  # b2's pool: to b2's address, the impostor's now
                # (Counted in the impostor's thread, which may not have got to it yet when the refusal is out.)
                await until(lambda: _true(impostor.asked_for_map >= 1), "the client re-read the map at b2's address")
                # b1's pools still go to the real b1.
                task = await client.submit("hello", pool="mine")
                assert (await client.status(task.id)).state == "queued"
            assert "ignoring a cluster map from" in caplog.text
            assert "it claims to come from member 'b1', but that is member 'b2'" in caplog.text
        finally:
            impostor.stopping.set()
            impostor.join()
