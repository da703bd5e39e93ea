"""`call`: submit a task and wait for its value in one request, against both backends, a raw socket, a
broker that dies mid-call, a cluster and the blocking client."""

from __future__ import annotations

import asyncio
import signal

import msgspec
import pytest
import zmq

import cronoq
from cronoq.wire import protocol
from tests.integration.test_cluster import Cluster
from tests.integration.test_tenancy import AUTH, TOKENS
from tests.support import BEATS, start_worker_process, until

V = protocol.PROTOCOL_VERSION
WAIT = 30.0


async def _echo(payload):
    return payload


def _failing(payload):
    raise ValueError(f"no {payload}")


async def test_a_call_returns_the_value_or_raises_what_result_raises(backend):
    attempts = 0

    async def flaky(payload):
        nonlocal attempts
        attempts += 1
        if attempts < 2:
            raise RuntimeError("first attempt fails")
        return {"echo": payload}

    pools = [cronoq.Pool("echo", _echo), cronoq.Pool("fails", _failing), cronoq.Pool("flaky", flaky)]
    async with backend.open(pools, concurrency=2) as sched:
        assert await sched.call({"n": [1, 2.5, None]}, pool="echo", tenant="acme", timeout=WAIT) == {"n": [1, 2.5, None]}
        with pytest.raises(cronoq.TaskFailed) as failed:
            await sched.call("cake", pool="fails", timeout=WAIT)
        assert (failed.value.type, failed.value.message) == ("ValueError", "no cake")
        assert await sched.call("x", pool="flaky", max_retries=1, timeout=WAIT) == {"echo": "x"}
        with pytest.raises(cronoq.InvalidArgument, match="cost must be a positive number"):
            await sched.call("x", pool="echo", cost=0)
        with pytest.raises(cronoq.NotFound):
            await sched.call("x", pool="nowhere")


async def test_a_call_past_its_timeout_raises_timeout_error_and_the_task_goes_on(backend):
    release = asyncio.Event()
    finished: list[str] = []

    async def held(payload):
        await release.wait()
        finished.append(payload)
        return payload

    async with backend.open([cronoq.Pool("held", held)]) as sched:
        with pytest.raises(TimeoutError, match="did not finish within 0.3 s"):
            await sched.call("late", pool="held", timeout=0.3)
        release.set()
        await until(lambda: _true(finished == ["late"]), "the timed-out call's task ran to its end")
        # The next call on the same connection is not confused by the late outcome of the first.
        assert await sched.call("next", pool="held", timeout=WAIT) == "next"


async def _true(value: bool) -> bool:
    return value


def _raw_dealer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _replies(sock: zmq.Socket, first_ms: int, quiet_ms: int = 300) -> list[object]:
    """The replies that come: the first within `first_ms`, then each until none has come for `quiet_ms`."""
    found = []
    wait = first_ms
    while sock.poll(wait):
        found.append(protocol.decode_client_reply(sock.recv_multipart()[0]))
        wait = quiet_ms
    return found


async def test_the_broker_answers_a_call_with_the_outcome_alone(broker_factory):
    broker = broker_factory('[[pools]]\nname = "default"\n')
    sock = _raw_dealer(broker.clients)
    body = msgspec.msgpack.encode("raw")
    try:
        async with cronoq.connect(broker.clients) as admin:
            await admin.pause("default")  # held queued: nothing can answer before the worker below
            sock.send_multipart([b"", protocol.encode(protocol.Submit(
                V, 1, submission="call-1", watch=True, outcome_only=True)), body])
            # Without `watch` there is no outcome to answer with: `accepted` comes as for any submit.
            sock.send_multipart([b"", protocol.encode(protocol.Submit(
                V, 2, submission="plain-1", outcome_only=True)), body])
            early = _replies(sock, 10_000, 500)  # accepted for rid 2, then nothing for the call
            assert [(type(r).__name__, r.rid) for r in early] == [("Accepted", 2)]
            await admin.resume("default")
            worker = cronoq.Worker(broker.workers, [cronoq.Pool("default", _echo)], **BEATS)
            running = asyncio.get_running_loop().create_task(worker.run())
            try:
                await asyncio.sleep(0)
                outcome = await asyncio.to_thread(_replies, sock, 10_000)
                assert [(type(r).__name__, r.rid, r.state) for r in outcome] == [("Outcome", 1, "succeeded")]
                # Re-sent (a client that lost the connection): the same task's outcome, again alone.
                sock.send_multipart([b"", protocol.encode(protocol.Submit(
                    V, 1, submission="call-1", watch=True, outcome_only=True)), body])
                again = await asyncio.to_thread(_replies, sock, 10_000)
                assert [(type(r).__name__, r.rid, r.id) for r in again] == [("Outcome", 1, outcome[0].id)]
                assert (await admin.stats())["pools"]["default"]["dispatched"] == 2, "two tasks, each run once"
            finally:
                await worker.stop()
                await running
    finally:
        sock.close()


async def test_a_call_in_flight_when_the_broker_dies_returns_once_it_is_back(broker_factory, restarted):
    broker = broker_factory('[[pools]]\nname = "default"\n')
    async with cronoq.connect(broker.clients) as client:
        await client.ping()
        broker.proc.send_signal(signal.SIGSTOP)  # the call reaches a broker that will never read it
        pending = asyncio.get_running_loop().create_task(client.call("once", timeout=WAIT))
        await asyncio.sleep(0.3)
        broker.kill()
        broker = restarted(broker)
        worker = cronoq.Worker(broker.workers, [cronoq.Pool("default", _echo)], **BEATS)
        running = asyncio.get_running_loop().create_task(worker.run())
        try:
            assert await pending == "once"
            assert client.reconnects >= 1
            assert (await client.stats())["pools"]["default"]["dispatched"] == 1, "the re-sent call ran one task"
        finally:
            await worker.stop()
            await running


async def test_a_call_goes_to_the_member_that_owns_the_pool(tmp_path):
    c = Cluster(tmp_path, ["b1", "b2"])
    c.write('[[pools]]\nname = "mine"\nmember = "b1"\n[[pools]]\nname = "theirs"\nmember = "b2"\n')
    try:
        c.start("b1")
        c.start("b2")
        worker = cronoq.Worker(c.workers("b2"), [cronoq.Pool("theirs", _echo)], **BEATS)
        running = asyncio.get_running_loop().create_task(worker.run())
        try:
            async with cronoq.connect(c.clients("b1")) as client:  # given b1, whose map sends `theirs` to b2
                assert await client.call("routed", pool="theirs", timeout=WAIT) == "routed"
        finally:
            await worker.stop()
            await running
    finally:
        c.stop()


def test_blocking_code_calls(broker_factory, tmp_path):
    broker = broker_factory('[[pools]]\nname = "default"\n[[pools]]\nname = "slow"\n')
    worker = start_worker_process(broker.workers, "tests.apps.echo:pools", tmp_path / "worker.log", concurrency=2)
    try:
        with cronoq.connect_sync(broker.clients) as sched:
            assert sched.call({"q": 1}, tenant="acme", timeout=WAIT)["echo"] == {"q": 1}
            with pytest.raises(cronoq.NotFound):
                sched.call(1, pool="nowhere")
    finally:
        worker.terminate()
        assert worker.wait(10) == 0


# acme and globex hold client tokens pinned to their tenants (test_tenancy.py's).
PINNED_CONFIG = '[[pools]]\nname = "default"\nfair_share = true\n' + AUTH


async def test_a_pinned_token_calls_within_its_tenant_and_a_repeated_key_gets_the_first_value(broker_factory):
    broker = broker_factory(PINNED_CONFIG, env=TOKENS)
    worker = cronoq.Worker(broker.workers, [cronoq.Pool("default", _echo)], token=TOKENS["T_WORKER"], **BEATS)
    running = asyncio.get_running_loop().create_task(worker.run())
    try:
        async with cronoq.connect(broker.clients, token=TOKENS["T_ACME"]) as acme, \
                cronoq.connect(broker.clients, token=TOKENS["T_GLOBEX"]) as globex:
            with pytest.raises(cronoq.PermissionDenied, match="pinned to tenant 'acme'"):
                await acme.call("theirs", tenant="globex", timeout=WAIT)
            assert await acme.call("own subtree", tenant="acme/search", timeout=WAIT) == "own subtree"
            # A key names one task within a tenant: the same key in another tenant is another task, and a call
            # repeating it gets the first task's value (as a submit gets the first task's handle).
            assert await acme.call("acme's", key="order-1", timeout=WAIT) == "acme's"
            assert await globex.call("globex's", key="order-1", timeout=WAIT) == "globex's"
            assert await acme.call("again", key="order-1", timeout=WAIT) == "acme's"
    finally:
        await worker.stop()
        await running
