"""The broker process itself: start-up, config errors, tokens and tenants, workers, and stopping."""

from __future__ import annotations

import asyncio
import signal

import pytest

import cronoq
from tests.support import BEATS, BrokerProcess, free_port, run_command, start_worker_process, write_config

TOKENS = {
    "T_ACME": "acme-client-secret",
    "T_GLOBEX": "globex-client-secret",
    "T_CLIENT": "plain-client-secret",
    "T_WORKER": "worker-secret",
    "T_ADMIN": "admin-secret",
}

AUTH_TOML = """
[[pools]]
name = "default"

[[auth.tokens]]
token_env = "T_ACME"
role = "client"
tenant = "acme"

[[auth.tokens]]
token_env = "T_GLOBEX"
role = "client"
tenant = "globex"

[[auth.tokens]]
token_env = "T_CLIENT"
role = "client"

[[auth.tokens]]
token_env = "T_WORKER"
role = "worker"

[[auth.tokens]]
token_env = "T_ADMIN"
role = "admin"
"""


async def echo(payload):
    return payload


async def test_tokens_roles_and_pinned_tenants(broker_factory):
    broker = broker_factory(AUTH_TOML, env=TOKENS)
    worker = cronoq.Worker(broker.workers, cronoq.Pool("default", echo), token=TOKENS["T_WORKER"], **BEATS)
    running = asyncio.get_running_loop().create_task(worker.run())
    try:
        async with cronoq.connect(broker.clients) as anonymous:
            with pytest.raises(cronoq.Unauthenticated):
                await anonymous.submit("x")
        async with cronoq.connect(broker.clients, token="wrong") as stranger:
            with pytest.raises(cronoq.Unauthenticated, match="unknown token"):
                await stranger.submit("x")

        async with cronoq.connect(broker.clients, token=TOKENS["T_ACME"]) as acme, \
                cronoq.connect(broker.clients, token=TOKENS["T_GLOBEX"]) as globex, \
                cronoq.connect(broker.clients, token=TOKENS["T_CLIENT"]) as plain, \
                cronoq.connect(broker.clients, token=TOKENS["T_ADMIN"]) as admin:
            # A pinned token fills in its tenant, and may not spend another tenant's share.
            mine = await acme.submit("a")
            assert await mine.result(timeout=10) == "a"
            assert (await acme.status(mine.id)).tenant == "acme"
            assert (await (await acme.submit("b", tenant="acme")).result(timeout=10)) == "b"
            with pytest.raises(cronoq.PermissionDenied, match="pinned to tenant 'acme'"):
                await acme.submit("x", tenant="globex")
            # ... nor see another tenant's tasks: to it they do not exist.
            with pytest.raises(cronoq.NotFound):
                await globex.status(mine.id)
            with pytest.raises(cronoq.NotFound):
                await globex.result(mine.id, timeout=5)
            with pytest.raises(cronoq.NotFound):
                await globex.cancel(mine.id)
            # An unpinned client names any tenant and sees any task.
            theirs = await plain.submit("g", tenant="globex")
            assert await globex.result(theirs.id, timeout=10) == "g"
            assert (await plain.status(mine.id)).state == "succeeded"
            # Clients may not administer; admins may.
            with pytest.raises(cronoq.PermissionDenied):
                await plain.pause("default")
            await admin.pause("default")
            await admin.resume("default")
            assert (await admin.stats())["pools"]["default"]["workers"] == 1

        # A worker token is not a client token, and a client token cannot serve.
        async with cronoq.connect(broker.clients, token=TOKENS["T_WORKER"]) as as_worker:
            with pytest.raises(cronoq.PermissionDenied):
                await as_worker.submit("x")
        intruder = cronoq.Worker(broker.workers, cronoq.Pool("default", echo), token=TOKENS["T_CLIENT"], **BEATS)
        with pytest.raises(cronoq.PermissionDenied):
            await asyncio.wait_for(intruder.run(), 10)
    finally:
        await worker.stop()
        await running


async def test_workers_for_unknown_pools_or_conflicting_settings_are_refused(broker_factory):
    broker = broker_factory('[[pools]]\nname = "llm"\nmax_in_flight = 4\n')
    with pytest.raises(cronoq.NotFound, match="'batch'"):
        await asyncio.wait_for(cronoq.Worker(broker.workers, cronoq.Pool("batch", echo)).run(), 10)
    conflicting = cronoq.Worker(broker.workers, cronoq.Pool("llm", echo, max_in_flight=8))
    with pytest.raises(cronoq.FailedPrecondition, match="max_in_flight"):
        await asyncio.wait_for(conflicting.run(), 10)
    # Settings left at their defaults carry no opinion; agreeing ones are fine.
    for pool in (cronoq.Pool("llm", echo), cronoq.Pool("llm", echo, max_in_flight=4)):
        worker = cronoq.Worker(broker.workers, pool, **BEATS)
        running = asyncio.get_running_loop().create_task(worker.run())
        async with cronoq.connect(broker.clients) as client:
            assert await (await client.submit(1, pool="llm")).result(timeout=10) == 1
        await worker.stop()
        await running


async def test_the_default_pool_exists_only_when_none_is_declared(broker_factory):
    open_broker = broker_factory("", name="plain.toml")
    async with cronoq.connect(open_broker.clients) as client:
        await client.pause("default")
        with pytest.raises(cronoq.NotFound):
            await client.submit("x", pool="llm")
    declared = broker_factory('[[pools]]\nname = "llm"\n', name="declared.toml")
    async with cronoq.connect(declared.clients) as client:
        with pytest.raises(cronoq.NotFound, match="declared pools: llm"):
            await client.submit("x")


async def test_max_in_flight_holds_across_two_workers(broker_factory):
    broker = broker_factory('[[pools]]\nname = "capped"\nmax_in_flight = 3\n')
    running = 0
    peak = 0
    seen_workers = set()

    def pool_for(tag):
        async def slow(payload):
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            seen_workers.add(tag)
            await asyncio.sleep(0.02)
            running -= 1
            return payload
        return cronoq.Pool("capped", slow)

    workers = [cronoq.Worker(broker.workers, pool_for(i), concurrency=4, **BEATS) for i in range(2)]
    runs = [asyncio.get_running_loop().create_task(w.run()) for w in workers]
    try:
        async with cronoq.connect(broker.clients) as client:
            handles = [await client.submit(i, pool="capped") for i in range(40)]
            assert [await h.result(timeout=30) for h in handles] == list(range(40))
    finally:
        for w in workers:
            await w.stop()
        await asyncio.gather(*runs)
    assert peak == 3
    assert seen_workers == {0, 1}


def test_an_invalid_config_exits_non_zero_naming_file_and_key(tmp_path):
    path = write_config(tmp_path / "bad.toml", '[broker]\nliveness = "three"\n')
    result = run_command(["-m", "cronoq.broker.cli", "-c", str(path)])
    assert result.returncode != 0
    assert "bad.toml" in result.stderr and "liveness" in result.stderr
    assert "Traceback" not in result.stderr and "cronoq broker ready" not in result.stdout


def test_a_missing_token_variable_is_a_config_error(tmp_path):
    path = write_config(tmp_path / "auth.toml", '[[auth.tokens]]\ntoken_env = "CRONOQ_UNSET_FOR_TEST"\nrole = "client"\n')
    result = run_command(["-m", "cronoq.broker.cli", "-c", str(path)])
    assert result.returncode != 0 and "CRONOQ_UNSET_FOR_TEST" in result.stderr
    assert "Traceback" not in result.stderr


def test_sigterm_stops_the_broker_cleanly(tmp_path):
    broker = BrokerProcess(write_config(tmp_path / "c.toml", "")).start()
    assert broker.stop(signal.SIGTERM) == 0


async def test_a_command_line_worker_serves_and_a_killed_worker_loses_no_task(broker_factory, tmp_path):
    broker = broker_factory('[[pools]]\nname = "default"\n[[pools]]\nname = "slow"\n', name="w.toml")
    first = start_worker_process(broker.workers, "tests.apps.echo:pools", tmp_path / "w1.log")
    second = None
    try:
        async with cronoq.connect(broker.clients) as client:
            assert (await (await client.submit("hi")).result(timeout=10))["echo"] == "hi"
            task = await client.submit(2, pool="slow")  # sleeps 2 s, returns the pid of the worker that ran it
            for _ in range(200):
                if (await client.status(task.id)).state == "running":
                    break
                await asyncio.sleep(0.02)
            first.kill()  # SIGKILL, mid-task
            first.wait()
            second = start_worker_process(broker.workers, "tests.apps.echo:pools", tmp_path / "w2.log", concurrency=2)
            # The broker notices the silence, requeues the task, and it runs on the new worker.
            for _ in range(500):
                info = await client.status(task.id)
                if info.state == "running" and info.attempts == 2:
                    break
                await asyncio.sleep(0.02)
            assert (info.state, info.attempts) == ("running", 2)
            quick = await client.submit(0, pool="slow")
            assert await quick.result(timeout=20) == second.pid
            # The lost run's task completes elsewhere, once, with the attempt the loss cost counted.
            assert await task.result(timeout=20) == second.pid
            info = await client.status(task.id)
            assert (info.state, info.attempts) == ("succeeded", 2)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("target, problem", [
    ("tests.apps.echo", "MODULE:ATTR"),
    ("tests.apps.nope:pools", "cannot import"),
    ("tests.apps.echo:missing", "no attribute"),
    ("tests.apps.echo:not_a_pool", "cronoq.Pool"),
])
def test_worker_command_line_mistakes_are_clear(target, problem):
    result = run_command(["-m", "cronoq.worker.cli", "--broker", "tcp://127.0.0.1:1", target])
    assert result.returncode == 2 and problem in result.stderr
    assert "Traceback" not in result.stderr


def test_a_worker_names_its_unset_token_variable(broker_factory):
    broker = broker_factory(AUTH_TOML, env=TOKENS)
    result = run_command(["-m", "cronoq.worker.cli", "--broker", broker.workers, "--token-env", "CRONOQ_NOPE_FOR_TEST",
                          "tests.apps.echo:default"], env=TOKENS)
    assert result.returncode == 2 and "UNAUTHENTICATED" in result.stderr
    assert "CRONOQ_NOPE_FOR_TEST is not set" in result.stderr
    assert "CRONOQ_TOKEN" not in result.stderr and "Traceback" not in result.stderr


def test_a_worker_with_a_client_token_is_told_which_role_it_needs(broker_factory):
    broker = broker_factory(AUTH_TOML, env=TOKENS)
    result = run_command(["-m", "cronoq.worker.cli", "--broker", broker.workers, "--token-env", "T_CLIENT",
                          "tests.apps.echo:default"], env=TOKENS)
    assert result.returncode == 2
    assert "a client token may not serve pools; that takes a worker or admin token" in result.stderr


@pytest.mark.parametrize("busy", ["clients", "workers", "metrics"])
def test_a_broker_that_cannot_bind_leaves_data_dir_alone(broker_factory, tmp_path, busy):
    first = broker_factory("", name="first.toml", broker_extra=f'metrics = "127.0.0.1:{free_port()}"')
    endpoints = {"clients": f"tcp://127.0.0.1:{free_port()}", "workers": f"tcp://127.0.0.1:{free_port()}",
                 "metrics": f"127.0.0.1:{free_port()}"}
    taken = {"clients": first.clients, "workers": first.workers,
             "metrics": first.config_path.read_text().split('metrics = "')[1].split('"')[0]}
    endpoints[busy] = taken[busy]
    second = tmp_path / "second.toml"
    second.write_text(f'[broker]\nclients = "{endpoints["clients"]}"\nworkers = "{endpoints["workers"]}"\n'
                      f'metrics = "{endpoints["metrics"]}"\ndata_dir = "second-data"\n')
    result = run_command(["-m", "cronoq.broker.cli", "-c", str(second), "--log-level", "INFO"])
    assert result.returncode == 1 and taken[busy] in result.stderr and "Traceback" not in result.stderr
    assert "carrying on" not in result.stderr
    assert not (tmp_path / "second-data").exists()


async def test_a_worker_that_asks_twice_to_register_keeps_its_tasks(broker_factory):
    """A worker re-sends its `ready` when the `welcome` is slow to come; by the second one the broker may
    have handed it tasks it has not seen. The repeat only gets the welcome again (it once got
    INVALID_ARGUMENT, and the worker stopped)."""
    import zmq

    from cronoq.wire import protocol

    broker = broker_factory("")
    V = protocol.PROTOCOL_VERSION
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(broker.workers)

    async def commands() -> list:
        assert await asyncio.to_thread(sock.poll, 10_000), "the broker stopped answering"
        frames = sock.recv_multipart()
        return [m for m, _ in protocol.unbatch(protocol.decode_worker_command(frames[0]),
                                               frames[1] if len(frames) > 1 else None)]

    try:
        async with cronoq.connect(broker.clients) as client:
            handles = [await client.submit(n) for n in range(3)]
            ready = protocol.encode(protocol.Ready(V, 1, ["default"], 2, concurrency=2))
            sock.send_multipart([b"", ready])
            got: list = []
            while not any(isinstance(m, protocol.Assign) for m in got):
                got += await commands()
            sock.send_multipart([b"", ready])  # the same again, as if sent before those tasks came
            while sum(isinstance(m, protocol.Welcome) for m in got) < 2 and \
                    not any(isinstance(m, protocol.Error) for m in got):
                got += await commands()
            assert not [m for m in got if isinstance(m, protocol.Error)], got
            assigned = [m for m in got if isinstance(m, protocol.Assign)]
            for _ in range(3):
                while not assigned:
                    assigned += [m for m in await commands() if isinstance(m, protocol.Assign)]
                task = assigned.pop(0)
                sock.send_multipart([b"", protocol.encode(protocol.Done(V, task.id, task.attempt, True)),
                                     protocol.encode_body("done")])
            assert [await h.result(timeout=10) for h in handles] == ["done"] * 3
    finally:
        sock.close(linger=0)
