"""Batches: several messages in one, as clients, workers and the broker send what one loop turn made.

Driven through a real Broker object's handlers (a real journal, no sockets), like the hostile-input
tests: each request of a batch is answered as if it had come alone, and a batch that cannot be read
or authenticated is refused with one error, which the client applies to every request it sent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import zmq
import zmq.asyncio

import cronoq
from cronoq.broker import server
from cronoq.broker.config import parse_config
from cronoq.broker.server import Broker
from cronoq.wire import protocol
from tests.integration.test_hostile import NOW, V, _replies, client_says, in_process_broker, worker_says
from tests.support import peer


def _decoded(replies: list[list[bytes]]) -> list:
    return [protocol.decode_client_reply(frames[0]) for frames in replies]


def test_each_request_of_a_batch_is_answered_as_if_it_came_alone(tmp_path):
    broker = in_process_broker(tmp_path / "data")
    batch = protocol.RequestBatch(V, [
        (protocol.Submit(V, 1, "default", "acme"), msgspec.msgpack.encode("first")),
        (protocol.Submit(V, 2, "no-such-pool"), msgspec.msgpack.encode("lost")),
        (protocol.Submit(V, 3, "default"), b"\xc1"),  # not msgpack
        (protocol.Ping(V, 4), None),
        (protocol.Submit(V, 5, "default", "acme", watch=True), msgspec.msgpack.encode("second")),
    ])
    replies = _decoded(client_says(broker, b"client", batch))
    assert [(type(r).__name__, r.rid) for r in replies] == [
        ("Accepted", 1), ("Error", 2), ("Error", 3), ("Ok", 4), ("Accepted", 5)]
    assert [r.code for r in replies if isinstance(r, protocol.Error)] == ["NOT_FOUND", "INVALID_ARGUMENT"]
    assert [broker._book.get(replies[i].id).payload for i in (0, 4)] == [b"\xa5first", b"\xa6second"]

    # What the broker sends one peer in one pass goes as one batch: the welcome and both assignments.
    broker._on_worker_message(peer(b"worker"), [b"worker", b"", protocol.encode(
        protocol.Ready(V, 1, ["default"], 2, concurrency=2))], NOW)
    broker._dispatch(NOW)
    assert broker._commit()
    [(worker, [frame])] = list(broker._to_workers.messages())
    welcome, *tasks = protocol.decode_worker_command(frame).items
    assert worker.identity == b"worker" and isinstance(welcome[0], protocol.Welcome)
    assert [(task.id, body) for task, body in tasks] == [(replies[0].id, b"\xa5first"), (replies[4].id, b"\xa6second")]
    broker._to_workers.clear()

    # The worker's two `done`s in one batch finish both tasks; the watched one's outcome goes to its client.
    done = protocol.WorkerBatch(V, [(protocol.Done(V, task.id, task.attempt, True), body) for task, body in tasks])
    assert worker_says(broker, b"worker", done) == [[protocol.encode(protocol.Outcome(V, 5, replies[4].id, "succeeded")),
                                                     b"\xa6second"]]
    assert [broker._book.info(replies[i].id).state for i in (0, 4)] == ["succeeded", "succeeded"]
    broker.close()


def test_a_batch_with_a_wrong_token_is_refused_with_one_error(tmp_path):
    """However many requests it holds, a message with a bad token earns one error (the client fails every
    request it sent with that token), so a flood of bad batches cannot become a flood of replies."""
    config = parse_config({"broker": {"data_dir": str(tmp_path / "data")},
                           "auth": {"tokens": [{"token_env": "T", "role": "client"}]}},
                          source="test", base_dir=tmp_path, environ={"T": "s3cret"})
    broker = Broker(config, clock=lambda: NOW)
    broker.open()
    batch = protocol.RequestBatch(V, [(protocol.Submit(V, rid), b"\x01") for rid in (7, 8, 9)])
    broker._requests.on_message(peer(b"client"), [b"client", b"wrong", protocol.encode(batch)], NOW)
    replies = _decoded(_replies(broker))
    assert [(r.rid, r.code) for r in replies] == [(0, "UNAUTHENTICATED")]
    broker._requests.on_message(peer(b"client"), [b"client", b"s3cret", protocol.encode(batch)], NOW)
    assert [type(r).__name__ for r in _decoded(_replies(broker))] == ["Accepted"] * 3
    broker.close()


def test_a_batch_followed_by_a_body_frame_is_refused_whole(tmp_path):
    broker = in_process_broker(tmp_path / "data")
    batch = protocol.RequestBatch(V, [(protocol.Submit(V, 1), b"\x01")])
    [reply] = _decoded(client_says(broker, b"client", batch, b"\x02"))
    assert (reply.rid, reply.code) == (0, "INVALID_ARGUMENT") and "no body frame" in reply.message
    assert broker._core.stats()["default"]["queued"] == 0
    broker.close()


def test_a_batch_a_pass_has_no_time_for_is_finished_in_later_passes_in_order(tmp_path):
    """A pass handles about a millisecond of requests; a batch of hundreds would make every other client's reply
    wait for it whole. Past the pass's deadline the rest is set aside, to be handled first in the next pass."""
    broker = in_process_broker(tmp_path / "data")
    rests: list = []
    broker._requests._set_aside = lambda conn, rest: rests.append(rest)  # where the broker parks it on its conn
    client = peer(b"client")
    batch = protocol.RequestBatch(V, [(protocol.Submit(V, rid, "default"), b"\x01") for rid in range(1, 6)])
    handled = broker._requests.on_message(client, [b"client", b"", protocol.encode(batch)], NOW, until=0.0)
    assert handled == 1 and len(rests) == 1  # the deadline had passed: one request, and the rest set aside
    assert [r.rid for r in _decoded(_replies(broker))] == [1]
    assert broker._requests.on_message(client, rests.pop(), NOW) == 4  # no deadline: all that was left
    replies = _decoded(_replies(broker))
    assert [(type(r).__name__, r.rid) for r in replies] == [("Accepted", rid) for rid in range(2, 6)]
    assert broker._core.stats()["default"]["queued"] == 5 and not rests
    broker.close()


async def test_the_rest_of_a_batch_is_taken_up_by_the_next_pass_without_waiting_for_a_timer(tmp_path, monkeypatch):
    """A pass that sets the rest of a batch aside queues the next pass at once: the broker does not sit idle
    while requests it holds wait (a burst of submits was accepted at a third of the rate when each rest waited
    for the 5 ms backlog retry). Here the retry and the heartbeat, which also start passes, are an hour away,
    and nothing else arrives: only passes that follow one another can answer the whole batch."""
    monkeypatch.setattr(server, "BACKLOG_RETRY", 3600.0)
    config = parse_config({"broker": {"data_dir": str(tmp_path / "data"), "clients": "tcp://127.0.0.1:0",
                                      "workers": "tcp://127.0.0.1:0", "heartbeat_interval": 3600}},
                          source="test", base_dir=tmp_path, environ={})
    broker = Broker(config)
    broker.open()
    clients, _ = broker.bind()
    serving = asyncio.ensure_future(broker.serve())
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(clients)
    try:
        count = 20_000  # many passes' worth
        batch = protocol.RequestBatch(V, [(protocol.Ping(V, rid), None) for rid in range(1, count + 1)])
        await sock.send_multipart([b"", protocol.encode(batch)])
        rids: list[int] = []
        while len(rids) < count:
            frames = await asyncio.wait_for(sock.recv_multipart(), 10)
            reply = protocol.decode_client_reply(frames[0])
            rids += [r.rid for r, _ in protocol.unbatch(reply, frames[1] if len(frames) > 1 else None)]
        assert rids == list(range(1, count + 1))
    finally:
        sock.close(linger=0)
        broker.stop()
        await asyncio.wait_for(serving, 30)


async def test_a_big_batch_is_answered_whole_and_in_order_before_what_came_after_it(broker_factory):
    """Through a real broker: 20,000 pings in one message take many passes, and each is answered once, in
    order, before the ping the same connection sent after the batch."""
    broker = broker_factory("")
    context = zmq.asyncio.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(broker.clients)
    try:
        count = 20_000
        batch = protocol.RequestBatch(V, [(protocol.Ping(V, rid), None) for rid in range(1, count + 1)])
        await sock.send_multipart([b"", protocol.encode(batch)])
        await sock.send_multipart([b"", protocol.encode(protocol.Ping(V, count + 1))])
        rids: list[int] = []
        while len(rids) < count + 1:
            frames = await asyncio.wait_for(sock.recv_multipart(), 30)
            reply = protocol.decode_client_reply(frames[0])
            rids += [r.rid for r, _ in protocol.unbatch(reply, frames[1] if len(frames) > 1 else None)]
        assert rids == list(range(1, count + 2))
    finally:
        sock.close(linger=0)


async def test_a_lone_request_leaves_at_once_and_requests_made_together_share_one_message():
    """What the client sends, seen by a bare ROUTER in the broker's place: a request made while no other is
    outstanding is handed to libzmq before the loop turn that made it ends; requests made together go as
    one batch at the end of their turn."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def receive() -> tuple[bytes, Any]:
        assert router.poll(5000), "nothing came from the client"
        identity, _token, header, *_ = router.recv_multipart()
        return identity, protocol.decode_client_request(header)

    async def arrival() -> tuple[bytes, Any]:
        """What comes next, letting the client's loop run meanwhile."""
        for _ in range(500):
            if router.poll(0):
                return receive()
            await asyncio.sleep(0.01)
        raise AssertionError("nothing came from the client")

    try:
        async with cronoq.Client(f"tcp://127.0.0.1:{port}", request_timeout=30, routing=False) as client:
            identity, hello = await arrival()  # every new connection asks for the broker's rules first
            router.send_multipart([identity, protocol.encode(protocol.Ok(V, hello.rid, protocol.hello_value(1 << 20)))])
            for _ in range(100):
                if client._connection._heard_hello:
                    break
                await asyncio.sleep(0.01)

            lone = asyncio.create_task(client.ping())
            await asyncio.sleep(0)  # the ping's first step runs; this one resumes in the same turn
            # A blocking look: the loop cannot run another turn meanwhile, so only a send made in the ping's
            # own step can be found.
            _, first = receive()
            assert isinstance(first, protocol.Ping)

            together = [asyncio.create_task(client.ping()) for _ in range(2)]  # the first ping is outstanding
            _, batch = await arrival()
            assert isinstance(batch, protocol.RequestBatch) and [type(m) for m, _ in batch.items] == [protocol.Ping] * 2
            for request in (first, *(m for m, _ in batch.items)):
                router.send_multipart([identity, protocol.encode(protocol.Ok(V, request.rid, None))])
            await asyncio.wait_for(asyncio.gather(lone, *together), 10)
    finally:
        router.close(linger=0)
