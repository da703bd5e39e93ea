"""Faults against the real broker process: kill -9, SIGTERM, frozen workers, lost replies, overload.

Every test waits on conditions with generous timeouts; none asserts speed.
The broker runs with the heartbeat of tests/support.py (a beat every 0.2 s; a
worker silent for 15 of them, 3 s, is lost) and durable state in a data_dir
beside its config.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any, Awaitable, Callable

import msgspec
import pytest
import zmq
import zmq.asyncio

import cronoq
import cronoq.wire.transport
from cronoq.store.journal.frames import HEADER_SIZE, FrameReader
from cronoq.store.journal.records import Accepted, decode_batch
from cronoq.wire import protocol
from tests.support import (BEATS, HEARTBEAT, LIVENESS, BrokerProcess, free_port, rss_kib, run_command,
                           start_worker_process, until)

WAIT = 30.0


def pool_stats(stats: dict[str, Any], pool: str) -> tuple[int, int, int]:
    p = stats["pools"][pool]
    return p["queued"], p["delayed"], p["running"]


# --------------------------------------------------------------------- kill -9 with 1,000 tasks


FAULT_POOLS = """
[[pools]]
name = "work"
[[pools]]
name = "slow"
[[pools]]
name = "held"
fair_share = true
"""


def fault_pools(ran: list[Any]) -> list[cronoq.Pool]:
    async def work(payload):
        ran.append(payload["n"])
        if payload.get("fail"):
            raise RuntimeError(f"task {payload['n']} fails on purpose")
        return {"echo": payload}

    async def slow(payload):
        ran.append(payload["n"])
        await asyncio.sleep(payload["sleep"])
        return {"echo": payload}

    return [cronoq.Pool("work", work), cronoq.Pool("slow", slow), cronoq.Pool("held", work)]


async def test_kill_9_with_a_thousand_tasks_in_every_state_loses_none(broker_factory, restarted):
    broker = broker_factory(FAULT_POOLS, name="faults.toml")
    ran: list[Any] = []
    work, slow, held = fault_pools(ran)
    loop = asyncio.get_running_loop()
    workers = [cronoq.Worker(broker.workers, [work, held], concurrency=8, **BEATS),
               cronoq.Worker(broker.workers, [slow], concurrency=4, **BEATS)]
    runs = [loop.create_task(w.run()) for w in workers]
    expected: dict[str, Any] = {}  # task id -> the value, or the exception class, its result must give
    allowed_runs: dict[int, range] = {}  # payload number -> how many times its handler may run
    counter = iter(range(10**6))

    async def submit(pool: str, outcome: Any = None, runs_allowed: range = range(1, 2), **options: Any
                     ) -> cronoq.TaskHandle:
        n = next(counter)
        payload = {"n": n, **options.pop("payload", {})}
        handle = await client.submit(payload, pool=pool, **options)
        assert handle.id not in expected
        expected[handle.id] = outcome if outcome is not None else {"echo": payload}
        allowed_runs[n] = runs_allowed
        return handle

    try:
        async with cronoq.connect(broker.clients) as client:
            # Finished before the crash: successes (some with keys) and failures.
            done_before = [await submit("work", key=f"key-{n}" if n % 15 == 0 else None) for n in range(300)]
            done_before += [await submit("work", cronoq.TaskFailed, payload={"fail": True}) for _ in range(50)]
            for handle in done_before:
                await asyncio.gather(handle.result(timeout=WAIT), return_exceptions=True)
            # In the middle of their retries (backoff 0.5 s, 1 s, 2 s) when the broker dies.
            for _ in range(20):  # 4 runs, one more if the crash interrupted one
                await submit("work", cronoq.TaskFailed, range(4, 6), payload={"fail": True}, max_retries=3)
            # Queued in a paused pool, for several tenants and classes, some with keys and deadlines.
            await client.pause("held")
            tenants, classes = ["acme", "globex", None], ["critical", "high", "normal", "low"]
            for n in range(460):
                await submit("held", tenant=tenants[n % 3], priority=classes[n % 4],
                             deadline=600 if n % 5 == 0 else None, key=f"held-{n}" if n % 7 == 0 else None)
            cancelled = [await submit("held", cronoq.Cancelled, range(0, 1)) for _ in range(20)]
            for handle in cancelled:
                assert await client.cancel(handle.id)
            # Delayed past the restart.
            for _ in range(80):
                await submit("work", delay=5.0)
            # Running on a worker when the broker dies (submitted last, so they surely still run then):
            # they run again, their attempt counted. Behind them, queued ones.
            running = [await submit("slow", None, range(2, 3), payload={"sleep": 3.0}) for _ in range(4)]
            queued_slow = [await submit("slow", payload={"sleep": 0.01}) for _ in range(16)]
            # Deadlines that pass while the broker is down.
            expiring = [await submit("held", cronoq.DeadlineExceeded, range(0, 1), deadline=1.0) for _ in range(50)]
            assert len(expected) == 1000

            async def slow_ones_running() -> bool:
                return pool_stats(await client.stats(), "slow")[2] == 4
            await until(slow_ones_running, "four slow tasks run")
            waits = [loop.create_task(client.result(task_id, timeout=120)) for task_id in expected]
            await asyncio.sleep(0.3)  # let the waits reach the broker: the restart must re-send them

            broker.kill()  # SIGKILL: no flush, no goodbye
            await asyncio.sleep(1.2)  # the deadline=1.0 tasks expire while no broker runs

            # And the workers find the broker gone before another serves: each reconnects once, then registers
            # with the restarted one. (Restarted within their liveness window instead, a worker may register on
            # its old connection and then give it up as silent, and a running task would run a third time.)
            async def both_noticed() -> bool:
                return not any(worker.registered for worker in workers)
            await until(both_noticed, "both workers notice that the broker is gone")
            broker = restarted(broker)

            stats = await client.stats()
            assert stats["pools"]["held"]["paused"], "a paused pool stays paused"

            async def held_left() -> bool:  # the 50 expire on the restarted broker's first wake-up, not before
                return pool_stats(await client.stats(), "held")[0] == 460  # the 20 cancelled stay cancelled
            await until(held_left, "460 of held's tasks are left queued: the 50 whose deadline passed expire")
            for n in range(0, 300, 15):  # keys still find their tasks
                again = await client.submit({"n": -1}, pool="work", key=f"key-{n}")
                assert again.duplicate and again.id == done_before[n].id
            await client.resume("held")

            outcomes = await asyncio.gather(*waits, return_exceptions=True)
            for task_id, outcome in zip(expected, outcomes):
                want = expected[task_id]
                if isinstance(want, type):
                    assert isinstance(outcome, want), (task_id, outcome)
                else:
                    assert outcome == want, (task_id, outcome)
            for handle in running:
                assert (await client.status(handle.id)).attempts == 2
            for handle in expiring + cancelled + queued_slow:
                assert (await client.status(handle.id)).state in ("expired", "cancelled", "succeeded")
            stats = await client.stats()
            assert all(pool_stats(stats, pool) == (0, 0, 0) for pool in ("work", "slow", "held"))
        # No duplicate: every task ran as often as it should (once, unless the crash interrupted it or it
        # was retried), and nothing ran that was not submitted.
        assert set(ran) <= set(allowed_runs)
        wrong = {n: ran.count(n) for n, allowed in allowed_runs.items() if ran.count(n) not in allowed}
        assert not wrong, f"payload number: times run {wrong}"
    finally:
        for worker in workers:
            await worker.stop()
        await asyncio.gather(*runs, return_exceptions=True)


# --------------------------------------------------------------------- writes in the journal's writer thread


@pytest.mark.parametrize("durability, payload_bytes", [("sync", 400_000), ("fsync", 100)])
async def test_what_the_writer_thread_wrote_is_acknowledged_and_survives_kill_9(
        broker_factory, restarted, durability, payload_bytes):
    """Big frames (and, with "fsync", every frame) are written off the loop: each acknowledged task is whole
    after a kill -9, and a pool of small tasks is served meanwhile."""
    broker = broker_factory('[[pools]]\nname = "big"\n[[pools]]\nname = "small"\n',
                            broker_extra=f'durability = "{durability}"', name=f"{durability}.toml")
    async with cronoq.connect(broker.clients) as client:
        await client.pause("big")
        payloads = [{"n": n, "pad": bytes([n]) * payload_bytes} for n in range(12)]
        big = await asyncio.gather(*(client.submit(p, pool="big") for p in payloads))
        async with _worker(broker, cronoq.Pool("small", _echo)):
            small = await asyncio.gather(*(client.submit(n, pool="small") for n in range(50)))
            assert [await h.result(timeout=WAIT) for h in small] == list(range(50))
        broker.kill()
        broker = restarted(broker)
        await client.resume("big")
        async with _worker(broker, cronoq.Pool("big", _echo)):
            assert [await h.result(timeout=WAIT) for h in big] == payloads


# --------------------------------------------------------------------- SIGTERM


async def test_sigterm_then_restart_carries_on_where_it_stopped(broker_factory, restarted):
    broker = broker_factory('[[pools]]\nname = "default"\n', name="term.toml")
    async with cronoq.connect(broker.clients) as client:
        await client.pause("default")
        queued = [await client.submit(n, tenant="acme", priority="high") for n in range(20)]
        later = await client.submit("later", delay=1.0)
        assert broker.stop(signal.SIGTERM) == 0
        broker = restarted(broker)
        assert (await client.stats())["pools"]["default"]["paused"]
        info = await client.status(queued[0].id)
        assert (info.state, info.tenant, info.priority) == ("queued", "acme", "high")
        await client.resume("default")
        async with _worker(broker, cronoq.Pool("default", _echo)):
            assert [await h.result(timeout=WAIT) for h in queued] == list(range(20))
            assert await later.result(timeout=WAIT) == "later"


async def test_durability_none_keeps_nothing_over_a_restart(broker_factory, restarted):
    broker = broker_factory(f'[broker]\ndurability = "none"\nheartbeat_interval = {HEARTBEAT}\nliveness = {LIVENESS}\n'
                            f'clients = "tcp://127.0.0.1:{free_port()}"\nworkers = "tcp://127.0.0.1:{free_port()}"\n',
                            name="memory.toml")
    async with cronoq.connect(broker.clients) as client:
        task = await client.submit("gone")
        broker.kill()
        broker = restarted(broker)
        with pytest.raises(cronoq.NotFound):
            await client.status(task.id)
    assert not (broker.config_path.parent / "cronoq-data").exists()


async def _echo(payload):
    return payload


class _worker:
    """An in-process worker for the length of an `async with`."""

    def __init__(self, broker: BrokerProcess, pool: cronoq.Pool, concurrency: int = 4) -> None:
        self.worker = cronoq.Worker(broker.workers, pool, concurrency=concurrency, **BEATS)

    async def __aenter__(self) -> cronoq.Worker:
        self.run = asyncio.get_running_loop().create_task(self.worker.run())
        return self.worker

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.worker.stop()
        await self.run


# --------------------------------------------------------------------- a frozen worker


async def test_a_worker_frozen_past_its_liveness_cannot_complete_its_task_again(broker_factory, tmp_path):
    broker = broker_factory('[[pools]]\nname = "default"\n[[pools]]\nname = "slow"\n', name="frozen.toml")
    frozen = start_worker_process(broker.workers, "tests.apps.echo:pools", tmp_path / "frozen.log")
    other = None
    try:
        async with cronoq.connect(broker.clients) as client:
            task = await client.submit(1.5, pool="slow")  # sleeps 1.5 s, returns the worker's pid

            def attempt_runs(n: int) -> Callable[[], Awaitable[bool]]:
                async def check() -> bool:
                    info = await client.status(task.id)
                    return (info.state, info.attempts) == ("running", n)
                return check
            await until(attempt_runs(1), "the first worker runs the task")
            frozen.send_signal(signal.SIGSTOP)
            other = start_worker_process(broker.workers, "tests.apps.echo:pools", tmp_path / "other.log")
            await until(attempt_runs(2), "the task runs again on the other worker")
            frozen.send_signal(signal.SIGCONT)  # its handler finishes and reports attempt 1, too late
            assert await task.result(timeout=WAIT) == other.pid
            info = await client.status(task.id)
            assert (info.state, info.attempts) == ("succeeded", 2)
            # The thawed worker registers again and serves; the task's outcome does not change.
            quick = [await client.submit(0, pool="slow") for _ in range(6)]
            assert {await h.result(timeout=WAIT) for h in quick} <= {frozen.pid, other.pid}
            assert await client.result(task.id, timeout=5) == other.pid
    finally:
        for proc in (frozen, other):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


# --------------------------------------------------------------------- lost replies (Lazy Pirate)


def _raw_request(endpoint: str, header: bytes, body: bytes | None = None, timeout_ms: int = 10_000) -> Any:
    """One request over a fresh DEALER; returns the decoded reply header."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", header] + ([body] if body is not None else []))
        assert sock.poll(timeout_ms), "no reply from the broker"
        return protocol.decode_client_reply(sock.recv_multipart()[0])
    finally:
        sock.close()


async def test_a_submit_resent_after_the_broker_died_mid_reply_creates_one_task(broker_factory, restarted):
    broker = broker_factory("", name="pirate.toml")
    submit = protocol.encode(protocol.Submit(protocol.PROTOCOL_VERSION, 1, submission="3f7a9c-1"))
    body = msgspec.msgpack.encode("once")
    # The broker accepted (the reply proves the task is in its journal) and then died: from its side this is
    # exactly "died before the reply left"; the client never counts on that reply and sends again.
    first = _raw_request(broker.clients, submit, body)
    broker.kill()
    broker = restarted(broker)
    again = _raw_request(broker.clients, submit, body)
    # The re-send is answered as the first send was: the same task, and no duplicate (the caller repeated no key).
    assert (again.id, again.duplicate, first.duplicate) == (first.id, False, False)

    # The real client, whose submit reaches a broker that dies before reading it: re-sent on reconnect.
    async with cronoq.connect(broker.clients) as client:
        await client.ping()
        broker.proc.send_signal(signal.SIGSTOP)
        pending = asyncio.get_running_loop().create_task(client.submit("twice?"))
        await asyncio.sleep(0.3)
        broker.kill()
        broker = restarted(broker)
        handle = await asyncio.wait_for(pending, WAIT)
        assert client.reconnects >= 1
        assert pool_stats(await client.stats(), "default") == (2, 0, 0)  # "once" and "twice?", one each
        async with _worker(broker, cronoq.Pool("default", _echo)):
            assert await handle.result(timeout=WAIT) == "twice?"
            assert await client.result(first.id, timeout=WAIT) == "once"


# --------------------------------------------------------------------- overload


async def test_a_flood_past_max_backlog_is_refused_and_nothing_accepted_is_lost(broker_factory, restarted):
    broker = broker_factory('[[pools]]\nname = "capped"\nmax_backlog = 100\nmax_tenant_backlog = 40\n',
                            name="flood.toml")
    accepted: dict[str, list[cronoq.TaskHandle]] = {}
    async with cronoq.connect(broker.clients) as client:
        before = rss_kib(broker.proc.pid)
        for tenant in ("a", "b", "c", "d"):
            results = await asyncio.gather(*(client.submit([tenant, n], pool="capped", tenant=tenant)
                                             for n in range(2_000)), return_exceptions=True)
            refused = [r for r in results if isinstance(r, Exception)]
            assert all(isinstance(r, cronoq.ResourceExhausted) for r in refused)
            accepted[tenant] = [r for r in results if not isinstance(r, Exception)]
        assert {t: len(h) for t, h in accepted.items()} == {"a": 40, "b": 40, "c": 20, "d": 0}
        assert rss_kib(broker.proc.pid) - before < 32 * 1024, "8,000 refused submits must not grow the broker"

        broker.kill()
        broker = restarted(broker)
        with pytest.raises(cronoq.ResourceExhausted, match="max_backlog"):
            await client.submit("still full", pool="capped", tenant="e")
        async with _worker(broker, cronoq.Pool("capped", _echo), concurrency=8):
            for tenant, handles in accepted.items():
                assert [await h.result(timeout=WAIT) for h in handles] == [[tenant, n] for n in range(len(handles))]
        assert (await client.submit("room again", pool="capped", tenant="e")).id


# --------------------------------------------------------------------- a damaged journal


def _files(data_dir: Path) -> dict[str, bytes]:
    """Every file of data_dir but the fence, where each start that took the lock records its generation before
    it reads anything (cronoq.store.journal.fence): that is the one write a refused start makes."""
    return {p.relative_to(data_dir).as_posix(): p.read_bytes() for p in sorted(data_dir.rglob("*"))
            if p.is_file() and p.name != "fence"}


def _flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x04
    path.write_bytes(bytes(data))


def _start_is_refused(config: Path, data_dir: Path, journal: Path, offset: int) -> None:
    """`cronoq-broker -c config` exits 1 with one line naming the file and offset, and changes nothing."""
    before = _files(data_dir)
    result = run_command(["-m", "cronoq.broker.cli", "-c", str(config)], cwd=config.parent)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"cronoq-broker: {journal} is damaged at offset {offset}: "), result.stderr
    assert result.stderr.rstrip().endswith(f"run: cronoq-broker -c {config} --repair"), result.stderr
    assert _files(data_dir) == before


async def test_a_damaged_journal_stops_the_broker_untouched_and_repair_brings_back_every_intact_task(
        broker_factory, restarted):
    broker = broker_factory('[[pools]]\nname = "held"\n', name="damage.toml")
    config, data_dir = broker.config_path, broker.config_path.parent / "damage-data"
    async with cronoq.connect(broker.clients) as client:
        await client.pause("held")  # the tasks stay queued, and so in the journal as accepted
        handles = [await client.submit(n, pool="held", tenant="acme") for n in range(60)]
        assert await client.cancel(handles[10].id)  # a later record that names task 10
    assert broker.stop() == 0
    journal = data_dir / "journal.00000001"
    offsets, frame_of = [], {}
    for n, (offset, body) in enumerate(FrameReader(journal)):
        offsets.append(offset)
        frame_of.update((r.id, n) for r in decode_batch(body) if isinstance(r, Accepted))
    original = journal.read_bytes()

    # One bit in the first frame (the journal's header): the broker used to start empty.
    _flip_bit(journal, HEADER_SIZE + 5)
    _start_is_refused(config, data_dir, journal, 0)
    # One bit mid-file: the broker used to cut everything after it. Sequential submits usually get a frame each,
    # but a busy broker may commit several in one: the frames hit below are told apart, never assumed.
    journal.write_bytes(original)
    tenth = frame_of[handles[10].id]
    middle = next(frame_of[h.id] for h in handles[30:] if frame_of[h.id] not in (0, tenth))
    _flip_bit(journal, offsets[middle] + HEADER_SIZE + 20)
    _start_is_refused(config, data_dir, journal, offsets[middle])

    # All three at once, then the repair.
    lost = {h.id for h in handles if frame_of[h.id] in (middle, tenth)}  # the cancel names only task 10 of them
    _flip_bit(journal, HEADER_SIZE + 5)
    _flip_bit(journal, offsets[tenth] + HEADER_SIZE + 20)
    damaged = journal.read_bytes()
    result = run_command(["-m", "cronoq.broker.cli", "-c", str(config), "--repair"], cwd=config.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    [copy] = data_dir.glob("damaged-*")
    assert (copy / journal.name).read_bytes() == damaged
    assert f"the original files are in {copy}" in result.stdout
    for frame in (0, middle, tenth):
        assert f"skipped bytes {offsets[frame]} to {offsets[frame + 1]} " in result.stdout
    assert f"lost: 1 task that journal records name but whose accepted record went with the damage " \
           f"(the payload is gone): {handles[10].id}" in result.stdout

    broker = restarted(broker)
    async with cronoq.connect(broker.clients) as client:
        assert (await client.stats())["pools"]["held"]["paused"]
        for handle in handles:
            if handle is handles[10]:
                # Cancelled before the damage: the results store answers if the cancel reached it before the stop
                # (it is not the journal's, so the repair never touches it); otherwise it went with the damage.
                try:
                    assert (await client.status(handle.id)).state == "cancelled"
                except cronoq.NotFound:
                    pass
            elif handle.id in lost:
                with pytest.raises(cronoq.NotFound):
                    await client.status(handle.id)
            else:
                info = await client.status(handle.id)
                assert (info.state, info.pool, info.tenant) == ("queued", "held", "acme"), handle.id
        await client.resume("held")
        async with _worker(broker, cronoq.Pool("held", _echo)):
            survivor = max(n for n, h in enumerate(handles) if h.id not in lost)
            assert await client.result(handles[survivor].id, timeout=WAIT) == survivor
    assert broker.stop() == 0
    again = run_command(["-m", "cronoq.broker.cli", "-c", str(config), "--repair"], cwd=config.parent)
    assert again.returncode == 0 and "is healthy: nothing to repair, nothing changed" in again.stdout


def test_repair_on_the_built_in_defaults_with_no_data_dir_yet_changes_nothing(tmp_path):
    result = run_command(["-m", "cronoq.broker.cli", "--repair"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"{tmp_path / 'cronoq-data'} holds no journal or snapshot: nothing to repair" in result.stdout
    assert not list(tmp_path.iterdir())


def test_a_second_broker_on_the_same_data_dir_is_refused_clearly(broker_factory, tmp_path):
    first = broker_factory("", name="first.toml")
    second = tmp_path / "second.toml"
    second.write_text(f'[broker]\nclients = "tcp://127.0.0.1:{free_port()}"\nworkers = "tcp://127.0.0.1:{free_port()}"\n'
                      f'data_dir = "{first.config_path.parent / "first-data"}"\n')
    result = run_command(["-m", "cronoq.broker.cli", "-c", str(second)])
    assert result.returncode == 1
    assert "is in use by another broker" in result.stderr and "Traceback" not in result.stderr


async def test_requests_to_an_unreachable_broker_fail_fast_once_the_send_queue_is_full(monkeypatch):
    # A small queue stands in for the default 100,000 messages, which take long to fill.
    monkeypatch.setattr(cronoq.wire.transport, "HIGH_WATER_MARK", 5)
    async with cronoq.connect(f"tcp://127.0.0.1:{free_port()}", request_timeout=60) as client:
        loop = asyncio.get_running_loop()
        pings = []
        for _ in range(20):  # one message per loop turn: each turn's posts leave as one message
            pings.append(loop.create_task(client.ping()))
            await asyncio.sleep(0)
        done, pending = await asyncio.wait(pings, timeout=WAIT, return_when=asyncio.FIRST_EXCEPTION)
        refused = [task for task in done if task.exception() is not None]
        assert refused, "a full send queue must not leave callers waiting for request_timeout"
        assert all(isinstance(task.exception(), cronoq.Unavailable) and "send queue" in str(task.exception())
                   for task in refused)
        for task in pending:
            task.cancel()


async def test_a_cancelled_request_is_forgotten_even_if_no_reply_ever_comes():
    async with cronoq.connect(f"tcp://127.0.0.1:{free_port()}", request_timeout=0.2) as client:
        pings = [asyncio.get_running_loop().create_task(client.ping()) for _ in range(3)]
        await asyncio.sleep(0.05)
        pings[0].cancel()
        results = await asyncio.gather(*pings, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        assert all(isinstance(r, cronoq.Unavailable) for r in results[1:]), "the others time out as usual"
        assert not client._connection._pending, "nothing is kept for a request whose caller is gone"


async def test_a_request_made_while_earlier_ones_wait_to_be_resent_goes_behind_them(monkeypatch):
    """libzmq may refuse a send for a moment even as a connection is up (its monitor can say so before the
    socket has attached the connection); the refused requests wait for a retry. A request made meanwhile must
    not overtake them: a caller's requests reach the broker in the order made."""
    router = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    arrived: list[tuple[str, Any]] = []

    async def broker() -> None:
        while True:
            identity, _token, header, *body = await router.recv_multipart()
            for request, _ in protocol.unbatch(protocol.decode_client_request(header), body[0] if body else None):
                tag = type(request).__struct_config__.tag
                arrived.append((tag, request.rid))
                version = protocol.PROTOCOL_VERSION
                reply: Any = protocol.Ok(version, request.rid)
                if tag == "hello":
                    reply = protocol.Ok(version, request.rid, protocol.hello_value(1 << 20))
                elif tag == "submit":
                    reply = protocol.Accepted(version, request.rid, f"task-{request.rid}")
                await router.send_multipart([identity, protocol.encode(reply)])

    refusals = [zmq.Again()]  # libzmq's answer to the next send, once armed
    send_frames = cronoq.wire.transport.send_frames

    def sometimes_refused(sock: zmq.Socket, frames: Any) -> None:
        if armed and refusals:
            raise refusals.pop()
        send_frames(sock, frames)

    armed = False
    monkeypatch.setattr(cronoq.wire.transport, "send_frames", sometimes_refused)
    serving = asyncio.get_running_loop().create_task(broker())
    try:
        async with cronoq.connect(f"tcp://127.0.0.1:{port}", request_timeout=WAIT) as client:
            await client.ping()
            assert [tag for tag, _ in arrived] == ["hello", "ping"]
            armed = True
            first = asyncio.get_running_loop().create_task(client.submit("first"))
            await asyncio.sleep(0)  # the first submit's send is refused: it waits for the retry
            assert not refusals, "the refusal was used"
            second = asyncio.get_running_loop().create_task(client.submit("second"))
            await asyncio.wait_for(asyncio.gather(first, second), WAIT)
            submits = [rid for tag, rid in arrived if tag == "submit"]
            assert submits == sorted(submits), f"the second submit overtook the first: rids {submits}"
    finally:
        serving.cancel()
        router.close()
