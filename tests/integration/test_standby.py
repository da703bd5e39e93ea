"""A standby on the primary's data_dir, and the command-line overrides that let one config serve both.

Real broker processes on 127.0.0.1 share one config file and so one data_dir; the standby gets its own
endpoints with --clients/--workers. Clients and workers are given both addresses. A handler records each run
in a file (tests/apps/counted.py), so the tests count executions instead of trusting the broker's word.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import signal
import socket
import subprocess
from pathlib import Path

import pytest

import cronoq
from tests.support import BrokerProcess, free_port, run_command, start_worker_process, until, wait_for_line, \
    write_config

WAIT = 60.0
CONCURRENCY = 4
POOLS = '[[pools]]\nname = "counted"\n'


def standby_of(config: Path, tmp_path: Path, name: str = "standby") -> BrokerProcess:
    """A `--standby` broker on `config` (so on its data_dir), on endpoints of its own; started, not yet serving."""
    clients, workers = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    standby = BrokerProcess(config, args=["--log-level", "INFO", "--standby", "--clients", clients,
                                          "--workers", workers])
    standby.start(wait=False, log=tmp_path / f"{name}.log")
    standby.clients, standby.workers = clients, workers
    wait_for_line(standby.proc, standby.log, "cronoq broker standing by")
    return standby


def primary_and_standby(brokers: list[BrokerProcess], tmp_path: Path,
                        broker_extra: str = "") -> tuple[Path, BrokerProcess, BrokerProcess]:
    """A primary serving POOLS from tmp_path's config and data_dir, and a standby of it (both stopped at teardown);
    `broker_extra`: more `[broker]` lines for both."""
    config = write_config(tmp_path / "cronoq.toml", POOLS, broker_extra=broker_extra)
    primary = BrokerProcess(config).start()
    brokers.append(primary)
    standby = standby_of(config, tmp_path)
    brokers.append(standby)
    return config, primary, standby


def refused(endpoint: str) -> bool:
    """Whether nothing listens at a tcp:// endpoint (a TCP connection to it is refused)."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def taken(endpoint: str) -> bool:
    """Whether another process has bound a tcp:// endpoint: binding it here fails."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    try:
        socket.create_server((host, int(port))).close()
    except OSError as exc:
        return exc.errno == errno.EADDRINUSE
    return False


ZMTP_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03"  # signature and major version: a ZeroMQ peer says this first


def held_silently(endpoint: str) -> bool:
    """Whether a tcp:// endpoint takes a connection but answers nothing to a ZeroMQ peer's greeting (a standby's
    held address: no handshake, so no ZeroMQ peer sends it a message)."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(ZMTP_GREETING)
        conn.settimeout(0.5)
        try:
            return conn.recv(64) == b""  # closed without a word is silent too
        except TimeoutError:
            return True


def runs_of(path: Path) -> collections.Counter[int]:
    """How many times each task (by its number) ran, from the handler's record."""
    return collections.Counter(int(line) for line in path.read_text().split()) if path.exists() else collections.Counter()


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@pytest.fixture
def brokers():
    """Broker processes a test starts itself (a primary, standbys); all are stopped at teardown."""
    started: list[BrokerProcess] = []
    yield started
    for broker in started:
        broker.kill()


# --------------------------------------------------------------------- command-line overrides


def test_flags_override_the_files_endpoints_and_data_dir(brokers, tmp_path):
    config = write_config(tmp_path / "cronoq.toml", POOLS)
    clients, workers = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    broker = BrokerProcess(config, args=["--log-level", "WARNING", "--clients", clients, "--workers", workers,
                                         "--data-dir", "elsewhere"])
    brokers.append(broker)
    broker.start()
    assert (broker.clients, broker.workers) == (clients, workers)
    # Relative to the working directory (the tests run the broker beside its config), not the file's data_dir.
    assert (tmp_path / "elsewhere" / "lock").exists() and not (tmp_path / "cronoq-data").exists()
    assert broker.stop() == 0


@pytest.mark.parametrize("flags, message", [
    (["--clients", "nowhere"], "--clients: expected an endpoint such as 'tcp://127.0.0.1:5555'"),
    (["--workers", "tcp://127.0.0.1:99999"], "--workers: expected tcp://HOST:PORT with PORT 0-65535"),
    (["--clients", "tcp://127.0.0.1:7000", "--workers", "tcp://127.0.0.1:7000"],
     "the client and worker endpoints would both be 'tcp://127.0.0.1:7000'"),
    (["--data-dir", ""], "--data-dir: expected a directory"),
])
def test_bad_override_flags_are_refused_like_bad_config_keys(tmp_path, flags, message):
    config = write_config(tmp_path / "cronoq.toml", POOLS)
    result = run_command(["-m", "cronoq.broker.cli", "-c", str(config), *flags], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "cronoq-data").exists()


def test_a_standby_without_a_data_dir_is_refused(tmp_path):
    config = write_config(tmp_path / "cronoq.toml", POOLS, broker_extra='durability = "none"')
    result = run_command(["-m", "cronoq.broker.cli", "-c", str(config), "--standby"], cwd=tmp_path)
    assert result.returncode == 2
    assert "--standby takes over a data_dir" in result.stderr and "Traceback" not in result.stderr


# --------------------------------------------------------------------- standing by


def test_a_standby_holds_its_addresses_silently_while_the_primary_serves_and_stops_at_once_on_sigterm(
        brokers, tmp_path):
    _, primary, standby = primary_and_standby(brokers, tmp_path)
    assert f"data_dir {tmp_path / 'cronoq-data'}: it is in use (pid {primary.proc.pid})" in standby.log.read_text()
    # No other process can take the standby's addresses while it waits, and they answer nobody.
    assert taken(standby.clients) and taken(standby.workers)
    assert held_silently(standby.clients) and held_silently(standby.workers)
    assert not held_silently(primary.clients), "a serving broker answers the greeting"
    assert standby.proc.poll() is None and not refused(primary.clients)
    # SIGTERM stops the wait at once, cleanly, having taken nothing over: the primary serves on.
    standby.proc.send_signal(signal.SIGTERM)
    assert standby.proc.wait(timeout=10) == 0
    assert "SIGTERM while standing by: stopped" in standby.log.read_text()
    assert primary.proc.poll() is None and not refused(primary.clients)
    assert refused(standby.clients) and refused(standby.workers), "a stopped standby lets its addresses go"


def test_a_standby_never_starts_a_data_dir_afresh(brokers, tmp_path):
    config = write_config(tmp_path / "cronoq.toml", POOLS)
    standby = standby_of(config, tmp_path)
    brokers.append(standby)
    assert "holds no broker's lock file yet" in standby.log.read_text()
    assert not (tmp_path / "cronoq-data").exists() and held_silently(standby.clients)
    # Once a primary has used the directory (and gone), the standby takes it over.
    primary = BrokerProcess(config).start()
    brokers.append(primary)
    assert primary.stop() == 0
    standby.wait_ready()
    assert not refused(standby.clients)


async def test_a_standby_takes_over_after_kill_9_under_load_losing_and_rerunning_nothing(brokers, tmp_path):
    _, primary, standby = primary_and_standby(brokers, tmp_path)
    runs = tmp_path / "runs"
    worker = start_worker_process(f"{primary.workers},{standby.workers}", "tests.apps.counted:pools",
                                  tmp_path / "worker.log", concurrency=CONCURRENCY)
    try:
        async with cronoq.connect([primary.clients, standby.clients], request_timeout=WAIT) as client:
            go = tmp_path / "go"

            def payload(n: int) -> dict:
                # Past the first 40, the tasks wait for `go`, made after the kill: the kill comes while the load
                # runs however slow or fast the machine is.
                return {"n": n, "runs": str(runs), "sleep": 0.01, **({"after": str(go)} if n >= 40 else {})}

            handles = [await client.submit(payload(n), pool="counted") for n in range(300)]
            results = [asyncio.ensure_future(handle.result(timeout=WAIT)) for handle in handles]

            async def some_finished() -> bool:
                return sum(result.done() for result in results) >= 40

            await until(some_finished, "40 tasks finished before the kill", WAIT)
            finished_before = {n for n, result in enumerate(results) if result.done()}
            assert len(finished_before) < 300, "the kill must come while the load runs"
            primary.kill()
            go.touch()
            # Submits made while no broker serves wait for the standby; the waiting results carry on.
            later = [asyncio.ensure_future(client.submit(payload(n), pool="counted")) for n in range(300, 400)]
            await asyncio.to_thread(standby.wait_ready)
            later_handles = await asyncio.gather(*later)
            results += [asyncio.ensure_future(handle.result(timeout=WAIT)) for handle in later_handles]
            values = await asyncio.gather(*results)
            assert client.reconnects >= 1
        assert values == list(range(400)), "every acknowledged task has its own result"
        counts = runs_of(runs)
        assert set(counts) == set(range(400)), "no acknowledged task was lost"
        assert all(counts[n] == 1 for n in finished_before), "a task that had finished ran again"
        again = sorted(n for n, count in counts.items() if count > 1)
        # At least once: only the tasks the worker held at the kill (at most its concurrency) may run twice.
        assert len(again) <= CONCURRENCY and all(counts[n] == 2 for n in again), again
        assert worker.poll() is None, "the worker carried on with the standby"
        assert (tmp_path / "worker.log").read_text().count("registered with") >= 2
    finally:
        stop(worker)


async def test_a_primary_stopped_with_sigterm_hands_over_to_the_standby(brokers, tmp_path):
    _, primary, standby = primary_and_standby(brokers, tmp_path)
    runs = tmp_path / "runs"
    async with cronoq.connect(f"{primary.clients},{standby.clients}", request_timeout=WAIT) as client:
        # No worker yet: the tasks wait in the primary, then in the standby that took its data_dir over.
        handles = [await client.submit({"n": n, "runs": str(runs)}, pool="counted") for n in range(50)]
        results = [asyncio.ensure_future(handle.result(timeout=WAIT)) for handle in handles]
        # Calls too: the client sends each again to the standby, which finds its task by the submission id.
        results += [asyncio.ensure_future(client.call({"n": n, "runs": str(runs)}, pool="counted", timeout=WAIT))
                    for n in range(50, 60)]

        async def all_queued() -> bool:
            return (await client.stats())["pools"]["counted"]["queued"] == 60

        await until(all_queued, "the calls reached the primary", WAIT)
        assert primary.stop() == 0
        await asyncio.to_thread(standby.wait_ready)
        assert "taking over data_dir" in standby.log.read_text()
        worker = start_worker_process(f"{primary.workers},{standby.workers}", "tests.apps.counted:pools",
                                      tmp_path / "worker.log", concurrency=CONCURRENCY)
        try:
            assert await asyncio.gather(*results) == list(range(60))
            info = await client.status(handles[0].id)
            assert info.state == "succeeded" and info.attempts == 1
            assert (await client.stats())["pools"]["counted"]["dispatched"] == 60, "a re-sent call made a task"
        finally:
            stop(worker)
    assert runs_of(runs) == collections.Counter(range(60)), "each ran exactly once"


async def test_without_the_results_store_the_standby_takes_over_finished_tasks_too(brokers, tmp_path):
    # With results_store = false a finished task lives in the journal alone: the standby must read it back.
    _, primary, standby = primary_and_standby(brokers, tmp_path, broker_extra="results_store = false\n")
    runs = tmp_path / "runs"
    worker = start_worker_process(f"{primary.workers},{standby.workers}", "tests.apps.counted:pools",
                                  tmp_path / "worker.log", concurrency=CONCURRENCY)
    try:
        async with cronoq.connect(f"{primary.clients},{standby.clients}", request_timeout=WAIT) as client:
            done = await client.submit({"n": 7, "runs": str(runs)}, pool="counted", key="once")
            assert await done.result(timeout=WAIT) == 7
            assert primary.stop() == 0
            await asyncio.to_thread(standby.wait_ready)
            assert await client.result(done.id, timeout=WAIT) == 7
            again = await client.submit({"n": 7, "runs": str(runs)}, pool="counted", key="once")
            assert again.id == done.id and again.duplicate, "its key still dedupes at the standby"
            assert "results" not in (await client.stats())["store"]
    finally:
        stop(worker)
    assert runs_of(runs) == collections.Counter([7]), "it ran once"


def test_a_sync_client_and_the_admin_command_take_several_addresses(brokers, tmp_path):
    _, primary, standby = primary_and_standby(brokers, tmp_path)
    with cronoq.connect_sync([standby.clients, primary.clients], request_timeout=WAIT) as client:
        task = client.submit({"n": 1, "runs": str(tmp_path / "runs")}, pool="counted")
        assert client.status(task.id).state == "queued"
    # The standby's address comes first and never completes a handshake: the command is not put off by it.
    result = run_command(["-m", "cronoq.client.cli", "status", "--broker", standby.clients, "--broker", primary.clients])
    assert result.returncode == 0, result.stderr
    assert "counted" in result.stdout


async def test_sighup_while_standing_by_rereads_the_config_it_takes_over_with(brokers, tmp_path):
    config, primary, standby = primary_and_standby(brokers, tmp_path)
    good = config.read_text()
    config.write_text(good + "[[pools]]\nname = 1\n")
    standby.proc.send_signal(signal.SIGHUP)
    wait_for_line(standby.proc, standby.log, "reload refused, standing by with the config read before")
    config.write_text(good + '[[pools]]\nname = "added"\n')
    standby.proc.send_signal(signal.SIGHUP)
    wait_for_line(standby.proc, standby.log, "while standing by: it applies at takeover")
    assert standby.proc.poll() is None and held_silently(standby.clients)
    primary.kill()
    await asyncio.to_thread(standby.wait_ready)
    async with cronoq.connect(standby.clients, request_timeout=WAIT) as client:
        assert set((await client.stats())["pools"]) == {"counted", "added"}


async def test_a_standby_whose_address_a_squatter_holds_waits_says_why_and_takes_over_once_it_is_free(
        brokers, tmp_path):
    config, primary, _ = primary_and_standby(brokers, tmp_path)
    # A plain process (here, this test) binds the address a second standby is told to serve workers on.
    workers_port, clients = free_port(), f"tcp://127.0.0.1:{free_port()}"
    squatter = socket.create_server(("127.0.0.1", workers_port))
    try:
        standby = BrokerProcess(config, args=["--log-level", "INFO", "--standby", "--clients", clients,
                                              "--workers", f"tcp://127.0.0.1:{workers_port}"])
        standby.start(wait=False, log=tmp_path / "squatted.log")
        brokers.append(standby)
        wait_for_line(standby.proc, standby.log, f"cannot hold tcp://127.0.0.1:{workers_port}: another process has bound it")
        assert "sending their tokens and tasks to whoever has it" in standby.log.read_text()
        assert taken(clients), "the address it could take it holds"
        # The primary goes: a standby that cannot serve must not take over (another standby here does).
        primary.kill()
        first_standby = brokers[1]
        await asyncio.to_thread(first_standby.wait_ready)
        assert standby.proc.poll() is None, "it keeps trying instead of exiting"
        first_standby.kill()
    finally:
        squatter.close()
    # The address is free again: the standby holds it, takes the lock and serves.
    await asyncio.to_thread(standby.wait_ready)
    errors = [line for line in standby.log.read_text().splitlines() if "level=error" in line]
    assert len(errors) == 1 and "cannot hold" in errors[0], "said once while it lasted, not every try"
    assert "holding every address now" in standby.log.read_text()
    async with cronoq.connect(clients, request_timeout=WAIT) as client:
        assert "counted" in (await client.stats())["pools"]


async def test_a_standby_that_cannot_serve_after_taking_the_lock_lets_it_go_and_tries_again(brokers, tmp_path):
    _, primary, _ = primary_and_standby(brokers, tmp_path)
    # A second standby, on the same data_dir, whose metrics address a squatter holds (that does not keep it from
    # taking the lock: the metrics address may be the primary's own on the same host).
    metrics_port = free_port()
    other = write_config(tmp_path / "other.toml", POOLS, broker_extra=f'metrics = "127.0.0.1:{metrics_port}"')
    clients, workers = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    squatter = socket.create_server(("127.0.0.1", metrics_port))
    try:
        standby = BrokerProcess(other, args=["--log-level", "INFO", "--standby", "--clients", clients, "--workers",
                                             workers, "--data-dir", str(tmp_path / "cronoq-data")])
        standby.start(wait=False, log=tmp_path / "other.log")
        brokers.append(standby)
        wait_for_line(standby.proc, standby.log, "cronoq broker standing by")
        brokers[1].kill()  # the first standby: this one is the only one left
        primary.kill()
        wait_for_line(standby.proc, standby.log, "let go of its lock untouched; standing by again")
        said = standby.log.read_text()
        assert f"cannot hold 127.0.0.1:{metrics_port}: another process has bound it" in said
        assert "level=warning" in said and "collecting the tokens of the browsers" in said
        assert standby.proc.poll() is None, "it keeps trying instead of exiting"
        assert taken(clients) and taken(workers), "it holds its addresses again meanwhile"
    finally:
        squatter.close()
    await asyncio.to_thread(standby.wait_ready)
    async with cronoq.connect(clients, request_timeout=WAIT) as client:
        assert "counted" in (await client.stats())["pools"]


async def test_a_standby_holds_its_dashboard_and_metrics_addresses_and_serves_them_after_the_takeover(
        brokers, tmp_path):
    config, primary, _ = primary_and_standby(brokers, tmp_path)
    brokers[1].kill()  # the plain standby: the one below takes over
    dashboard, metrics = free_port(), free_port()
    own = write_config(tmp_path / "own.toml", POOLS, broker_extra=f'dashboard = "127.0.0.1:{dashboard}"\n'
                                                                   f'metrics = "127.0.0.1:{metrics}"')
    clients, workers = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    standby = BrokerProcess(own, args=["--log-level", "INFO", "--standby", "--clients", clients, "--workers",
                                       workers, "--data-dir", str(tmp_path / "cronoq-data")])
    standby.start(wait=False, log=tmp_path / "own.log")
    brokers.append(standby)
    wait_for_line(standby.proc, standby.log, "cronoq broker standing by")
    # While it waits nobody else may bind them (to collect the admin tokens browsers send), and it answers nothing.
    assert taken(f"tcp://127.0.0.1:{dashboard}") and taken(f"tcp://127.0.0.1:{metrics}")
    for port in (dashboard, metrics):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"GET /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            conn.settimeout(10)
            try:
                assert conn.recv(100) == b"", "a waiting standby answered HTTP"
            except ConnectionResetError:
                pass
    primary.kill()
    await asyncio.to_thread(standby.wait_ready)

    def get(port: int, path: str) -> tuple[int, bytes]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
        return int(data.split()[1]), data

    assert (await asyncio.to_thread(get, dashboard, "/api/session"))[0] == 200
    status, body = await asyncio.to_thread(get, metrics, "/metrics")
    assert status == 200 and b"cronoq_workers_connected" in body
