"""Attacks of one tenant on another through shared names, against a real broker process over tcp.

acme and globex hold client tokens pinned to their tenants. acme tries what
the previous versions let it do: claim the idempotency keys and submission
ids globex will use, claim a schedule's ticks so globex's scheduled task
never runs, derive globex's task ids from its own, and tell from the
broker's answers which of globex's tasks exist. Raw requests go over a ZeroMQ
DEALER, as any peer may send them, so the replies are compared byte for byte.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import time

import msgspec
import pytest
import zmq

import cronoq
from cronoq.wire import protocol
from tests.support import BEATS, BrokerProcess, until, write_config

V = protocol.PROTOCOL_VERSION
TOKENS = {"T_ACME": "acme-secret", "T_GLOBEX": "globex-secret", "T_ADMIN": "admin-secret", "T_WORKER": "worker-secret"}
AUTH = """
[[auth.tokens]]
token_env = "T_ACME"
role = "client"
tenant = "acme"

[[auth.tokens]]
token_env = "T_GLOBEX"
role = "client"
tenant = "globex"

[[auth.tokens]]
token_env = "T_ADMIN"
role = "admin"

[[auth.tokens]]
token_env = "T_WORKER"
role = "worker"
"""
CONFIG = """
[[pools]]
name = "default"

[[pools]]
name = "reports"

[[schedules]]
name = "every-second"
cron = "* * * * * *"
pool = "reports"
tenant = "globex"
payload = "scheduled"
""" + AUTH


class RawClient:
    """A client that speaks the wire format by hand: one request, then its reply's raw frames."""

    def __init__(self, endpoint: str, token: str) -> None:
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._token = token.encode()

    def ask(self, request: protocol.ClientRequest, body: bytes | None = None) -> list[bytes]:
        self._sock.send_multipart([self._token, protocol.encode(request)] + ([body] if body is not None else []))
        assert self._sock.poll(10_000), f"no reply to {request!r}"
        return self._sock.recv_multipart()

    def submit(self, rid: int, **fields: object) -> protocol.Accepted:
        reply = protocol.decode_client_reply(self.ask(protocol.Submit(V, rid, **fields), msgspec.msgpack.encode(rid))[0])
        assert isinstance(reply, protocol.Accepted), reply
        return reply

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def broker(broker_factory):
    return broker_factory(CONFIG, env=TOKENS)


def serve(broker: BrokerProcess, *pools: cronoq.Pool) -> tuple[cronoq.Worker, asyncio.Task]:
    worker = cronoq.Worker(broker.workers, list(pools), token=TOKENS["T_WORKER"], **BEATS)
    return worker, asyncio.get_running_loop().create_task(worker.run())


async def echo(payload):
    return payload


async def test_keys_and_submission_ids_acme_claims_first_stay_globexs_own(broker):
    async with cronoq.connect(broker.clients, token=TOKENS["T_ACME"]) as acme, \
            cronoq.connect(broker.clients, token=TOKENS["T_GLOBEX"]) as globex, \
            cronoq.connect(broker.clients, token=TOKENS["T_ADMIN"]) as admin:
        await admin.pause("default")
        claimed = await acme.submit("acme's", key="order-1")
        # globex's submit used to fail PERMISSION_DENIED here, telling acme the key was globex's to use.
        own = await globex.submit("globex's", key="order-1")
        assert not own.duplicate and own.id != claimed.id
        assert (await globex.status(own.id)).tenant == "globex"
        # Within a tenant a key still names one task.
        assert ((again := await globex.submit("x", key="order-1")).id, again.duplicate) == (own.id, True)
        assert ((again := await acme.submit("x", key="order-1")).id, again.duplicate) == (claimed.id, True)

        raw_acme, raw_globex = RawClient(broker.clients, TOKENS["T_ACME"]), RawClient(broker.clients, TOKENS["T_GLOBEX"])
        try:
            first = raw_acme.submit(1, submission="sub-1")
            theirs = raw_globex.submit(1, submission="sub-1")
            assert not theirs.duplicate and theirs.id != first.id
            assert raw_globex.submit(2, submission="sub-1").id == theirs.id  # a re-sent submit: the same task
        finally:
            raw_acme.close()
            raw_globex.close()

        worker, running = serve(broker, cronoq.Pool("default", echo), cronoq.Pool("reports", echo))
        try:
            await admin.resume("default")
            assert await own.result(timeout=20) == "globex's"
            assert await globex.result(theirs.id, timeout=20) == 1
        finally:
            await worker.stop()
            await running


async def test_no_client_can_claim_a_schedules_ticks(broker):
    ran: list[tuple[float, str]] = []

    async def record(payload):
        ran.append((time.time(), payload))
        return payload

    worker, running = serve(broker, cronoq.Pool("reports", record))
    try:
        async with cronoq.connect(broker.clients, token=TOKENS["T_ACME"]) as acme, \
                cronoq.connect(broker.clients, token=TOKENS["T_GLOBEX"]) as globex, \
                cronoq.connect(broker.clients, token=TOKENS["T_ADMIN"]) as admin:
            now = int(time.time())
            for client in (acme, globex, admin):  # not even the schedule's own tenant or an admin: they are the broker's
                with pytest.raises(cronoq.InvalidArgument, match="reserved for the broker's own tasks"):
                    await client.submit("claim", pool="reports", key=f"cronoq:schedule:every-second:{now + 2}")
            # The names the previous versions gave ticks are acme's own keys now: claiming them stops nothing.
            for tick in range(now + 1, now + 31):
                await acme.submit("claim", pool="reports", key=f"schedule:every-second:{tick}")
        claimed = time.time()

        async def ran_twice_since() -> bool:
            return len([at for at, payload in ran if payload == "scheduled" and at > claimed + 0.5]) >= 2

        # Every tick from here to the end of the wait is one acme claimed.
        await until(ran_twice_since, "globex's schedule ran twice more", timeout=min(15.0, now + 29 - claimed))
    finally:
        await worker.stop()
        await running


def derivable(earlier: str, later: str) -> bool:
    """Whether `later` looks computed from `earlier`: a shared head (prefix and counter) or a small step."""
    shared_head = os.path.commonprefix([earlier, later])
    step = abs(int(later, 16) - int(earlier, 16))
    differing_bits = bin(int(later, 16) ^ int(earlier, 16)).count("1")
    return len(shared_head) >= 8 or step < 2**64 or differing_bits < 32


async def test_task_ids_are_128_random_bits_with_nothing_to_derive(broker):
    async with cronoq.connect(broker.clients, token=TOKENS["T_ACME"]) as acme, \
            cronoq.connect(broker.clients, token=TOKENS["T_GLOBEX"]) as globex, \
            cronoq.connect(broker.clients, token=TOKENS["T_ADMIN"]) as admin:
        await admin.pause("default")
        ids = []
        for n in range(40):  # interleaved: acme's ids say nothing of globex's in between
            ids.append((await acme.submit(n)).id)
            ids.append((await globex.submit(n)).id)
    assert all(len(task_id) == 32 and int(task_id, 16) >= 0 for task_id in ids)
    assert len(set(ids)) == len(ids)
    assert not [(a, b) for a, b in zip(ids, ids[1:]) if derivable(a, b)]
    assert not [(a, b) for a, b in zip(ids[::2], ids[2::2]) if derivable(a, b)]  # acme's own, one after another


async def test_another_tenants_task_gets_the_answer_of_a_task_that_never_existed(broker):
    async with cronoq.connect(broker.clients, token=TOKENS["T_ACME"]) as acme, \
            cronoq.connect(broker.clients, token=TOKENS["T_GLOBEX"]) as globex, \
            cronoq.connect(broker.clients, token=TOKENS["T_ADMIN"]) as admin:
        await admin.pause("default")
        secret = (await acme.submit("acme's")).id
        never = os.urandom(len(secret) // 2).hex()  # as long as the real one: only the digits differ
        raw = RawClient(broker.clients, TOKENS["T_GLOBEX"])
        try:
            for request in (protocol.Status, protocol.Wait, protocol.Cancel):
                theirs = raw.ask(request(V, 7, secret))
                nobodys = raw.ask(request(V, 7, never))
                assert [frame.replace(secret.encode(), never.encode()) for frame in theirs] == nobodys, request
                error = protocol.decode_client_reply(nobodys[0])
                assert isinstance(error, protocol.Error) and error.code == "NOT_FOUND", error
        finally:
            raw.close()
        # The real client raises the same NotFound for both, and nothing happened to acme's task.
        for task_id in (secret, never):
            with pytest.raises(cronoq.NotFound, match=f"no task with id '{task_id}'"):
                await globex.status(task_id)
            with pytest.raises(cronoq.NotFound):
                await globex.result(task_id, timeout=5)
            with pytest.raises(cronoq.NotFound):
                await globex.cancel(task_id)
        assert (await acme.status(secret)).state == "queued"


async def test_a_tick_the_previous_version_submitted_does_not_fire_again_after_the_upgrade(tmp_path):
    """A data_dir as the previous version left it: the tick's task journaled under `schedule:<name>:<tick>`,
    schedules.json (without the format entry) not yet saying so, as after a crash between the two."""
    path = tmp_path / "upgrade.toml"
    data_dir = tmp_path / "upgrade-data"
    this_year = datetime.datetime.now(datetime.timezone.utc).year
    tick = int(datetime.datetime(this_year, 1, 1, tzinfo=datetime.timezone.utc).timestamp())
    long_ago = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc).timestamp()

    async def queued(broker: BrokerProcess) -> int:
        async with cronoq.connect(broker.clients, token=TOKENS["T_ADMIN"]) as admin:
            return (await admin.stats())["pools"]["reports"]["queued"]

    broker = BrokerProcess(write_config(path, '[[pools]]\nname = "reports"\n' + AUTH), env=TOKENS).start()
    try:
        async with cronoq.connect(broker.clients, token=TOKENS["T_ADMIN"]) as admin:
            old = await admin.submit("new year", pool="reports", tenant="acme", key=f"schedule:new-year:{tick}")
        assert broker.stop() == 0
        (data_dir / "schedules.json").write_text(json.dumps({"new-year": long_ago}))
        yearly = '[[schedules]]\nname = "new-year"\ncron = "0 0 1 1 *"\npool = "reports"\ntenant = "acme"\n'
        broker = BrokerProcess(write_config(path, '[[pools]]\nname = "reports"\n' + yearly + AUTH), env=TOKENS).start()
        assert await queued(broker) == 1  # the old task stands for the tick: no second one
        async with cronoq.connect(broker.clients, token=TOKENS["T_ADMIN"]) as admin:
            assert (await admin.status(old.id)).state == "queued"
        state = json.loads((data_dir / "schedules.json").read_text())
        assert state["new-year"] == tick and state["cronoq:format"] == 2
        assert broker.stop() == 0
        broker.start()
        assert await queued(broker) == 1
    finally:
        broker.stop()
