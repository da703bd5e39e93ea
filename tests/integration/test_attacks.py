"""Attacks on the real broker process with raw sockets, as a hostile peer would make them.

Each test replays one attack from the broker's threat model (docs/security.md) over tcp on 127.0.0.1
with bare DEALER sockets and hand-made msgpack, bounded in count and time, and checks the broker is
still whole afterwards: alive, serving others, nothing handed to the attacker. None asserts speed.
"""

from __future__ import annotations

import asyncio
import ctypes
import resource
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

import msgspec
import pytest
import zmq

import cronoq
from cronoq.wire import protocol
from tests.support import BEATS, rss_kib, start_worker_process, until

V = protocol.PROTOCOL_VERSION
WAIT = 30.0

TOKENS = """
[[auth.tokens]]
token_env = "T_CLIENT"
role = "client"
tenant = "acme"
[[auth.tokens]]
token_env = "T_WORKER"
role = "worker"
[[auth.tokens]]
token_env = "T_ADMIN"
role = "admin"
"""
SECRETS = {"T_CLIENT": "client-secret", "T_WORKER": "worker-secret", "T_ADMIN": "admin-secret"}


@pytest.fixture
def sockets() -> Iterator[list[zmq.Socket]]:
    """Raw sockets opened by a test; all closed at teardown."""
    opened: list[zmq.Socket] = []
    yield opened
    for sock in opened:
        sock.close(linger=0)


def dealer(opened: list[zmq.Socket], endpoint: str, *, identity: bytes | None = None,
           reconnect: bool = True, context: zmq.Context | None = None) -> zmq.Socket:
    sock = (context or zmq.Context.instance()).socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.ROUTING_ID, identity)
    if not reconnect:
        sock.setsockopt(zmq.RECONNECT_IVL, -1)
    sock.connect(endpoint)
    opened.append(sock)
    return sock


def send(sock: zmq.Socket, token: bytes, message: Any, body: bytes | None = None) -> None:
    sock.send_multipart([token, protocol.encode(message)] + ([body] if body is not None else []))


def received(sock: zmq.Socket, seconds: float, decode: Any = protocol.decode_worker_command) -> list[Any]:
    """Every message that arrives within `seconds` (batches opened), decoded."""
    out: list[Any] = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if sock.poll(int(left * 1000)):
            frames = sock.recv_multipart()
            out += [m for m, _ in protocol.unbatch(decode(frames[0]), frames[1] if len(frames) > 1 else None)]
    return out


def first_reply(sock: zmq.Socket, decode: Any = protocol.decode_worker_command, timeout: float = WAIT) -> Any:
    assert sock.poll(int(timeout * 1000)), "no reply from the broker"
    frames = sock.recv_multipart()
    return protocol.unbatch(decode(frames[0]), frames[1] if len(frames) > 1 else None)[0][0]


def _answered(sock: zmq.Socket, token: bytes, message: Any, timeout: float = WAIT) -> Any:
    """Send `message` until the broker answers it, and return the answer. While the broker's ROUTER still holds a
    connection under the same identity, libzmq turns a new one away, and what was sent on it is lost: a busy
    machine can take longer than one wait to let the old connection go."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        send(sock, token, message)
        if sock.poll(1000):
            return first_reply(sock)
    raise AssertionError(f"no answer from the broker within {timeout:.0f} s")


def alive(broker: Any) -> None:
    assert broker.proc.poll() is None, f"the broker died (exit {broker.proc.returncode}):\n{broker.log.read_text()}"


# --------------------------------------------------------------------- 1. claiming identities libzmq will generate


def unseeded_first_identities() -> tuple[int, int]:
    """The first routing identity an unseeded libzmq gives out on a process's first and second ROUTER socket.

    libzmq starts each ROUTER's counter at `rand() | rand() << 31` (as 32 bits); with the C library never
    seeded, rand() runs from seed 1, the same in every process.
    """
    code = ("import ctypes; c = ctypes.CDLL(None); c.srand(1); r = [c.rand() for _ in range(4)]; "
            "print(r[0] | (r[1] & 1) << 31, r[2] | (r[3] & 1) << 31)")
    first, second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                   check=True).stdout.split()
    return int(first), int(second)


def generated_identity(counter: int) -> bytes:
    return b"\x00" + (counter % (1 << 32)).to_bytes(4, "big")


async def test_claiming_the_identities_libzmq_would_generate_does_not_crash_the_broker(broker_factory, sockets):
    broker = broker_factory("")
    first_client, first_worker = unseeded_first_identities()
    window = 150
    claims = []
    for endpoint, start, message in ((broker.clients, first_client, protocol.Ping(V, 1)),
                                     (broker.workers, first_worker, protocol.Heartbeat(V))):
        for k in range(window):
            claim = dealer(sockets, endpoint, identity=generated_identity(start + k))
            send(claim, b"", message)
            claims.append(claim)
    for claim in claims:  # an answer on each means the broker's socket has taken every claimed identity
        first_reply(claim, decode=lambda header: _either(header))
    ordinary = [dealer(sockets, endpoint) for endpoint in (broker.clients, broker.workers) for _ in range(40)]
    for sock in ordinary[:40]:
        send(sock, b"", protocol.Ping(V, 2))
    for sock in ordinary[:40]:
        assert isinstance(first_reply(sock, decode=protocol.decode_client_reply), protocol.Ok)
    alive(broker)
    worker = cronoq.Worker(broker.workers, cronoq.Pool("default", _echo), **BEATS)
    runner = asyncio.get_running_loop().create_task(worker.run())
    try:
        async with cronoq.connect(broker.clients) as client:
            task = await client.submit("after the claims")
            assert await task.result(timeout=WAIT) == "after the claims"
    finally:
        await worker.stop()
        await runner
    alive(broker)


def _either(header: bytes) -> Any:
    try:
        return protocol.decode_client_reply(header)
    except cronoq.CronoqError:
        return protocol.decode_worker_command(header)


async def _echo(payload: Any) -> Any:
    return payload


# --------------------------------------------------------------------- 2. taking over a worker's identity


async def test_a_peer_reusing_a_dropped_workers_identity_gets_nothing(broker_factory, sockets):
    broker = broker_factory(TOKENS, env=SECRETS, broker_extra="liveness = 25\n")  # 5 s before silence counts
    victim = dealer(sockets, broker.workers, identity=b"victim-worker-01")
    send(victim, b"worker-secret", protocol.Ready(V, 1, ["default"], 2, concurrency=2))
    assert isinstance(first_reply(victim), protocol.Welcome)
    victim.close(linger=0)  # gone without a bye, well within its liveness window
    # A bystander takes the descriptor number the victim's connection freed in the broker, so that the
    # attacker's messages cannot be taken for the victim's last words (a narrow case docs/security.md covers).
    bystander = dealer(sockets, broker.workers)
    send(bystander, b"worker-secret", protocol.Heartbeat(V))
    assert isinstance(first_reply(bystander), protocol.Reregister)
    attacker = dealer(sockets, broker.workers, identity=b"victim-worker-01")
    assert _answered(attacker, b"", protocol.Heartbeat(V)).code == "UNAUTHENTICATED"
    async with cronoq.connect(broker.clients, token="client-secret") as client:
        tasks = [await client.submit(f"secret {n}") for n in range(3)]
        sent = [m for m in received(attacker, 1.5) if not isinstance(m, protocol.Error)]  # a late refusal aside
        assert sent == [], "the attacker was sent something"
        assert {(await client.status(t.id)).state for t in tasks} == {"queued"}
        worker = start_worker_process(broker.workers, "tests.apps.echo:default", broker.log.with_name("w.log"),
                                      env={"CRONOQ_TOKEN": "worker-secret"})
        try:
            assert [(await t.result(timeout=WAIT))["echo"] for t in tasks] == [f"secret {n}" for n in range(3)]
        finally:
            worker.terminate()
            worker.wait()


# --------------------------------------------------------------------- 3. making the broker hold replies


def _flood(sock: zmq.Socket, token: bytes, message: bytes, count: int) -> int:
    """Send up to `count` copies of a ready-made header without blocking; returns how many went."""
    sent = 0
    for _ in range(count):
        try:
            sock.send_multipart([token, message], zmq.NOBLOCK)
        except zmq.Again:
            time.sleep(0.01)
            continue
        sent += 1
    return sent


async def test_batches_of_unauthenticated_pings_cost_the_broker_a_bounded_amount(broker_factory, sockets):
    broker = broker_factory(TOKENS, env=SECRETS)
    pings = protocol.encode(protocol.RequestBatch(V, [(protocol.Ping(V, rid), None) for rid in range(1, 80_001)]))
    assert len(pings) < 1_048_576
    before = rss_kib(broker.proc.pid)
    flooders = [dealer(sockets, broker.clients) for _ in range(2)]
    async with cronoq.connect(broker.clients, token="client-secret") as client:
        for _ in range(15):
            for flooder in flooders:  # 2 x 15 x 80,000 = 2.4 million pings, never read
                _flood(flooder, b"", pings, 2)
            await client.ping()  # others are still served
        await client.ping()
    alive(broker)
    grew = rss_kib(broker.proc.pid) - before
    assert grew < 64 * 1024, f"the broker grew by {grew} KiB"


async def test_a_client_that_never_reads_its_replies_is_held_to_its_budget(broker_factory, sockets):
    broker = broker_factory(TOKENS, env=SECRETS)
    worker = start_worker_process(broker.workers, "tests.apps.echo:default", broker.log.with_name("w.log"),
                                  env={"CRONOQ_TOKEN": "worker-secret"})
    try:
        async with cronoq.connect(broker.clients, token="client-secret") as client:
            task = await client.submit("x" * 30_000)  # its outcome carries a 30 KB result
            await task.result(timeout=WAIT)
            before = rss_kib(broker.proc.pid)
            reader = dealer(sockets, broker.clients)
            waits = protocol.encode(protocol.RequestBatch(
                V, [(protocol.Wait(V, rid, task.id), None) for rid in range(1, 101)]))
            for _ in range(40):  # 4,000 waits: 120 MB of outcomes if the broker held them all
                _flood(reader, b"client-secret", waits, 1)
                await client.ping()
            await until(_still_serving(client), "the broker serves others")
            grew = rss_kib(broker.proc.pid) - before
            assert grew < 64 * 1024, f"the broker grew by {grew} KiB"
    finally:
        worker.terminate()
        worker.wait()
    alive(broker)


def _still_serving(client: Any) -> Any:
    async def check() -> bool:
        await client.ping()
        return True
    return check


# --------------------------------------------------------------------- 7. credit from replayed dones


async def test_replayed_dones_give_a_worker_no_credit(broker_factory, sockets):
    broker = broker_factory("")
    rogue = dealer(sockets, broker.workers)
    send(rogue, b"", protocol.Ready(V, 1, ["default"], 0))  # no slots, and no concurrency said
    assert isinstance(first_reply(rogue), protocol.Welcome)
    for n in range(50):
        send(rogue, b"", protocol.Done(V, f"made-up-{n}", 1, True), b"\xc0")
    send(rogue, b"", protocol.Ready(V, 2, [], 0))  # refused: its answer shows the dones before it were handled
    assert first_reply(rogue).code == "INVALID_ARGUMENT"
    async with cronoq.connect(broker.clients) as client:
        tasks = [await client.submit(n) for n in range(60)]
        assert [m for m in received(rogue, 1.0) if isinstance(m, protocol.Assign)] == []
        assert {(await client.status(t.id)).state for t in tasks} == {"queued"}


# --------------------------------------------------------------------- 8. the broker's own stall


async def test_a_stalled_broker_reads_what_waits_before_judging_workers(broker_factory, tmp_path):
    broker = broker_factory('[[pools]]\nname = "default"\n[[pools]]\nname = "slow"\n')
    workers = [start_worker_process(broker.workers, "tests.apps.echo:pools", tmp_path / f"w{n}.log", concurrency=4)
               for n in range(2)]
    try:
        async with cronoq.connect(broker.clients) as client:
            tasks = [await client.submit(0.5, pool="slow") for _ in range(8)]

            async def all_running() -> bool:
                return {(await client.status(t.id)).state for t in tasks} == {"running"}
            await until(all_running, "all 8 tasks run")
            broker.proc.send_signal(signal.SIGSTOP)  # past every liveness window, both ways
            await asyncio.sleep(5.0)
            broker.proc.send_signal(signal.SIGCONT)
            for task in tasks:
                await task.result(timeout=WAIT)
            assert [(await client.status(t.id)).attempts for t in tasks] == [1] * 8, "a finished task ran again"
    finally:
        broker.proc.send_signal(signal.SIGCONT)
        for proc in workers:
            proc.terminate()
            proc.wait()


# --------------------------------------------------------------------- 9. holding every descriptor


async def test_idle_connections_cannot_exhaust_the_brokers_descriptors(broker_factory, sockets):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 6000:
        pytest.skip(f"needs an open-file hard limit of 6000 or more (this machine: {hard})")
    broker = broker_factory(TOKENS, env=SECRETS, broker_extra="auth_timeout = 2.0\n",
                            nofile=(1024, 6000 if hard == resource.RLIM_INFINITY else min(hard, 8192)))
    many = zmq.Context()
    many.set(zmq.MAX_SOCKETS, 4096)
    idle = [dealer(sockets, endpoint, reconnect=False, context=many)
            for endpoint in (broker.clients, broker.workers) for _ in range(1_000)]
    watched = idle[0].get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sockets.append(watched)
    async with cronoq.connect(broker.clients, token="client-secret") as client:
        await client.ping()
        worker = cronoq.Worker(broker.workers, cronoq.Pool("default", _echo), token="worker-secret",
                               **BEATS)
        runner = asyncio.get_running_loop().create_task(worker.run())
        try:
            task = await client.submit("served")
            assert await task.result(timeout=WAIT) == "served"
        finally:
            await worker.stop()
            await runner
    assert watched.poll(int(WAIT * 1000)), "an idle connection that never spoke was not cut"
    alive(broker)
    for sock in sockets:
        sock.close(linger=0)
    sockets.clear()
    many.term()
