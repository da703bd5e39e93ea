"""Sizes are checked where they are made: an oversized payload or result costs only its own task.

Each test runs a real broker process and a real worker over tcp. Its limit is
max_payload_bytes (1 MiB by default); libzmq drops a connection that sends a
frame over that + 64 KiB, so what cronoq's client and worker make is checked
before it is sent, and what a foreign peer sends costs only that peer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

import cronoq
from cronoq.wire import protocol
from tests.integration.test_faults import WAIT
from tests.support import BEATS, BrokerProcess, free_port, until

V = protocol.PROTOCOL_VERSION
LIMIT = 1 << 20  # the broker's default max_payload_bytes
BIG = 2 << 20  # over the limit and over the frames libzmq accepts (limit + 64 KiB)
POOLS = '[[pools]]\nname = "default"\n'


async def sized(payload: Any) -> Any:
    """A handler whose payload says what to return after how long: ["big" | "loud" | anything, seconds]."""
    kind, seconds = payload
    await asyncio.sleep(seconds)
    if kind == "big":
        return b"x" * BIG
    if kind == "loud":
        raise ValueError("y" * BIG)
    return kind


class Serving:
    """A broker process and an in-process cronoq.Worker (concurrency 4) serving `sized`."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.worker = cronoq.Worker(broker.workers, cronoq.Pool("default", sized), concurrency=4,
                                    **BEATS)
        self.run = asyncio.get_running_loop().create_task(self.worker.run())

    async def stop(self) -> None:
        await self.worker.stop()
        await self.run

    def broker_log(self) -> str:
        return self.broker.log.read_text()


async def serving(broker_factory: Any, name: str) -> Serving:
    scene = Serving(broker_factory(POOLS, name=name))

    async def registered() -> bool:
        return scene.worker.registered
    await until(registered, "the worker registered")
    return scene


async def _still_one_worker(client: cronoq.Client) -> bool:
    return (await client.stats())["workers"] == 1


async def test_an_oversized_result_fails_its_task_alone_and_the_worker_stays(broker_factory):
    scene = await serving(broker_factory, "results.toml")
    try:
        async with cronoq.connect(scene.broker.clients) as client:
            # Three of globex's tasks share the worker with acme's task whose result is too large.
            innocent = [await client.submit(["small", 0.5], tenant="globex") for _ in range(3)]
            big = await client.submit(["big", 0.1], tenant="acme")
            with pytest.raises(cronoq.TaskFailed) as failed:
                await big.result(timeout=WAIT)
            assert failed.value.type == "InvalidArgument"
            assert "the result is" in failed.value.message
            assert str(len(msgspec.msgpack.encode(b"x" * BIG))) in failed.value.message
            assert str(LIMIT) in failed.value.message
            info = await client.status(big.id)
            assert (info.state, info.attempts) == ("failed", 1)

            assert [await h.result(timeout=WAIT) for h in innocent] == ["small"] * 3
            assert [(await client.status(h.id)).attempts for h in innocent] == [1, 1, 1]
            # The same worker, on the same connection, runs the next task of the other tenant.
            after = await client.submit(["after", 0], tenant="globex")
            assert await after.result(timeout=WAIT) == "after"
            assert scene.worker.registered and await _still_one_worker(client)
            assert client.reconnects == 0
        assert "lost" not in scene.broker_log(), "no worker may have been lost"
    finally:
        await scene.stop()


async def test_an_oversized_result_is_retried_only_under_max_retries(broker_factory):
    scene = await serving(broker_factory, "retried.toml")
    try:
        async with cronoq.connect(scene.broker.clients) as client:
            big = await client.submit(["big", 0], max_retries=1)
            with pytest.raises(cronoq.TaskFailed, match="InvalidArgument: the result is"):
                await big.result(timeout=WAIT)
            assert (await client.status(big.id)).attempts == 2, "one retry, as max_retries says, then failed"
            assert scene.worker.registered and await _still_one_worker(client)
    finally:
        await scene.stop()


async def test_a_huge_exception_message_is_cut_not_sent_whole(broker_factory):
    scene = await serving(broker_factory, "loud.toml")
    try:
        async with cronoq.connect(scene.broker.clients) as client:
            loud = await client.submit(["loud", 0])
            with pytest.raises(cronoq.TaskFailed) as failed:
                await loud.result(timeout=WAIT)
            error = failed.value
            assert error.type == "ValueError"
            assert error.message.startswith("yyy") and "bytes cut" in error.message
            assert len(error.message.encode()) + len(error.traceback.encode()) < 64 * 1024
            assert error.traceback.startswith("Traceback") and "bytes cut" in error.traceback
            assert (await client.status(loud.id)).attempts == 1
            after = await client.submit(["after", 0])
            assert await after.result(timeout=WAIT) == "after"
            assert scene.worker.registered and client.reconnects == 0
        assert "lost" not in scene.broker_log()
    finally:
        await scene.stop()


async def test_an_oversized_payload_is_refused_before_it_is_sent(broker_factory):
    broker = broker_factory(POOLS, name="payloads.toml")
    # A short request_timeout: a payload that reached the broker would drop the connection and leave
    # this submit unanswered, failing Unavailable instead of InvalidArgument.
    async with cronoq.connect(broker.clients, request_timeout=5) as client:
        # At once, before the broker answered the client's hello: submit waits for the limit.
        with pytest.raises(cronoq.InvalidArgument, match=rf"{BIG + 5} bytes.*max_payload_bytes = {LIMIT}"):
            await client.submit(b"x" * BIG)
        assert client.max_payload_bytes == LIMIT
        with pytest.raises(cronoq.InvalidArgument, match="max_payload_bytes"):
            await client.submit(b"x" * LIMIT)  # its msgpack encoding is 5 bytes over
        fits = await client.submit(b"x" * (LIMIT - 5))
        assert (await client.status(fits.id)).state == "queued"
        await client.ping()
        await asyncio.sleep(0.5)  # a dropped connection would be made again within 0.1 s
        await client.ping()
        assert client.reconnects == 0, "the broker never saw the oversized payloads"
    # Without routing, nothing but the call itself waits for the hello's answer (a cluster member's connection).
    async with cronoq.Client(broker.clients, request_timeout=5, routing=False) as caller:
        # A call at once, before its client heard the broker's hello, waits for the limit as a submit does.
        with pytest.raises(cronoq.InvalidArgument, match=rf"{BIG + 5} bytes.*max_payload_bytes = {LIMIT}"):
            await caller.call(b"x" * BIG, timeout=5)
        assert caller.reconnects == 0


def test_the_blocking_client_refuses_an_oversized_payload_too(broker_factory):
    broker = broker_factory(POOLS, name="sync.toml")
    with cronoq.connect_sync(broker.clients, request_timeout=5) as sched:
        with pytest.raises(cronoq.InvalidArgument, match=f"max_payload_bytes = {LIMIT}"):
            sched.submit(b"x" * BIG)
        assert sched.status(sched.submit("fine").id).state == "queued"


async def test_a_client_learns_the_limit_again_after_the_broker_restarts_with_another(broker_factory):
    broker = broker_factory(POOLS, name="restarts.toml")
    async with cronoq.connect(broker.clients, request_timeout=10) as client:
        await client.ping()
        assert client.max_payload_bytes == LIMIT
        broker.stop()
        text = broker.config_path.read_text().replace("[broker]\n", "[broker]\nmax_payload_bytes = 4096\n")
        broker.config_path.write_text(text)
        broker.start()

        async def learned() -> bool:
            return client.max_payload_bytes == 4096
        await until(learned, "the client heard the restarted broker's limit")
        with pytest.raises(cronoq.InvalidArgument, match="max_payload_bytes = 4096"):
            await client.submit(b"x" * 5000)
        await client.submit(b"x" * 4000)


async def test_submit_does_not_guess_the_limit_of_a_broker_that_never_answers():
    async with cronoq.connect(f"tcp://127.0.0.1:{free_port()}", request_timeout=0.3) as client:
        with pytest.raises(cronoq.Unavailable, match="no reply"):
            await client.submit(b"x" * BIG)
        assert client.max_payload_bytes is None


async def test_a_broker_without_hello_gets_submits_unchecked():
    """An older broker refuses `hello` as a malformed request; the client then leaves sizes to it."""
    ctx = zmq.asyncio.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    seen: list[str] = []

    async def older_broker() -> None:
        while True:
            identity, _token, header, *body = await router.recv_multipart()
            tag = msgspec.msgpack.decode(header)[0]
            seen.append(tag)
            rid = protocol.peek_rid(header)
            if tag == "submit":
                reply = protocol.Accepted(V, rid, f"task-{rid}")
            else:
                reply = protocol.Error(V, rid, "INVALID_ARGUMENT", f"malformed client request: unknown tag {tag!r}")
            await router.send_multipart([identity, protocol.encode(reply)])

    serve = asyncio.get_running_loop().create_task(older_broker())
    try:
        async with cronoq.connect(f"tcp://127.0.0.1:{port}", request_timeout=5) as client:
            handle = await client.submit(b"x" * 5000)
            assert handle.id.startswith("task-")
            assert client.max_payload_bytes is None
            assert seen[:2] == ["hello", "submit"]
    finally:
        serve.cancel()
        router.close()


async def _raw_dealer(endpoint: str) -> tuple[zmq.Socket, zmq.Socket]:
    """A DEALER that is not cronoq's, and a monitor telling when its connection is up or dropped."""
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
    sock.connect(endpoint)
    return sock, monitor


async def _next_event(monitor: zmq.Socket, event: int) -> None:
    while (await recv_monitor_message(monitor))["event"] != event:
        pass


@pytest.mark.parametrize("endpoint", ["clients", "workers"])
async def test_a_frame_over_the_socket_limit_costs_only_its_sender(broker_factory, endpoint):
    scene = await serving(broker_factory, f"raw-{endpoint}.toml")
    try:
        async with cronoq.connect(scene.broker.clients) as client:
            running = [await client.submit(["small", 1.0], tenant="globex") for _ in range(3)]

            async def started() -> bool:
                return all([(await client.status(h.id)).state == "running" for h in running])
            await until(started, "globex's tasks run on the worker")

            sock, monitor = await _raw_dealer(getattr(scene.broker, endpoint))
            await asyncio.wait_for(_next_event(monitor, zmq.EVENT_HANDSHAKE_SUCCEEDED), WAIT)
            header = protocol.encode(protocol.Submit(V, 1) if endpoint == "clients" else protocol.Done(V, "x", 1, True))
            await sock.send_multipart([b"", header, b"\x00" * BIG])
            await asyncio.wait_for(_next_event(monitor, zmq.EVENT_DISCONNECTED), WAIT)
            sock.disable_monitor()
            monitor.close()
            sock.close()

            assert [await h.result(timeout=WAIT) for h in running] == ["small"] * 3
            assert [(await client.status(h.id)).attempts for h in running] == [1, 1, 1]
            after = await client.submit(["after", 0], tenant="acme")
            assert await after.result(timeout=WAIT) == "after"
            assert scene.worker.registered and await _still_one_worker(client)
            assert client.reconnects == 0
        assert "lost" not in scene.broker_log()
    finally:
        await scene.stop()


async def test_a_foreign_payload_over_the_limit_but_under_the_frame_limit_is_refused(broker_factory):
    broker = broker_factory(POOLS, name="foreign.toml")
    sock, monitor = await _raw_dealer(broker.clients)
    try:
        await sock.send_multipart([b"", protocol.encode(protocol.Submit(V, 42)), b"\x00" * (LIMIT + 1)])
        [header] = await asyncio.wait_for(sock.recv_multipart(), WAIT)
        error = protocol.decode_client_reply(header)
        assert isinstance(error, protocol.Error) and (error.rid, error.code) == (42, "INVALID_ARGUMENT")
        assert f"{LIMIT + 1} bytes, over max_payload_bytes = {LIMIT}" in error.message
        await sock.send_multipart([b"", protocol.encode(protocol.Ping(V, 43))])
        [header] = await asyncio.wait_for(sock.recv_multipart(), WAIT)
        assert protocol.decode_client_reply(header) == protocol.Ok(V, 43, V), "the connection is still served"
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()


async def test_a_name_longer_than_the_broker_takes_is_refused_before_it_is_sent(broker_factory):
    broker = broker_factory(POOLS, name="names.toml")
    async with cronoq.connect(broker.clients, request_timeout=5) as client:
        with pytest.raises(cronoq.InvalidArgument, match="key must be .* at most 200 characters, got one of 2097152"):
            await client.submit(1, key="k" * BIG)  # sent, its header frame alone would cost the connection
        with pytest.raises(cronoq.InvalidArgument, match="tenant must be"):
            await client.submit(1, tenant="t" * 201)
        await client.submit(1, tenant="t" * 200, key="k" * 200)
        assert client.reconnects == 0


async def test_a_hello_answered_in_this_turn_of_the_loop_is_not_asked_again():
    """The answer to the `hello` can be read in the very turn a first submit starts, before the callback that
    keeps it has run: the submit must take that answer, not send a second `hello` (an older broker saw two)."""
    router = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        async with cronoq.Client(f"tcp://127.0.0.1:{port}", request_timeout=5, routing=False) as client:
            connection = client._connection
            answered = asyncio.get_running_loop().create_future()
            # An older broker's refusal, just read: the future is done, its done-callback not yet run.
            answered.set_exception(cronoq.InvalidArgument("malformed client request: unknown tag 'hello'"))
            connection._hello, connection._heard_hello = answered, False
            assert await connection._payload_limit() is None  # the broker checks sizes itself
            assert connection._hello is answered, "a second hello was sent"
    finally:
        router.close()
