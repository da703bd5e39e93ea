"""The `cronoq` command against a real broker: status, top, submit, inspect, cancel, pause, resume."""

from __future__ import annotations

import asyncio
import json

import cronoq
from tests.support import free_port, run_command, until

TWO_TENANTS = """
[[pools]]
name = "llm"
[pools.tenant_weights]
acme = 3
globex = 1

[[auth.tokens]]
token_env = "T_ADMIN"
role = "admin"

[[auth.tokens]]
token_env = "T_CLIENT"
role = "client"
"""
ENV = {"T_ADMIN": "admin-secret", "T_CLIENT": "client-secret", "CRONOQ_TOKEN": "admin-secret"}


def cli(broker, *args, env=ENV):
    return run_command(["-m", "cronoq.cli", *args, "--broker", broker.clients], env=env)


def test_status_and_top_show_a_known_backlog_of_two_tenants(broker_factory):
    broker = broker_factory(TWO_TENANTS, env=ENV)
    assert cli(broker, "pause", "llm").returncode == 0
    for tenant, count in (("acme", 3), ("globex", 5)):
        for _ in range(count):
            assert cli(broker, "submit", '{"n": 1}', "--pool", "llm", "--tenant", tenant).returncode == 0
    assert cli(broker, "submit", "x", "--pool", "llm", "--tenant", "acme", "--priority", "critical").returncode == 0

    result = cli(broker, "status", "--json")
    assert result.returncode == 0, result.stderr
    pool = json.loads(result.stdout)["pools"]["llm"]
    assert pool["paused"] and pool["queued"] == 9 and pool["running"] == 0
    assert pool["classes"]["critical"]["queued"] == 1 and pool["classes"]["normal"]["queued"] == 8
    assert {name: (t["weight"], t["queued"]) for name, t in pool["tenants"].items()} == {
        "acme": (3.0, 4), "globex": (1.0, 5)}

    text = cli(broker, "status").stdout
    assert "pool llm [paused, fair]: queued 9" in text and "(0.0/s over the last 10 s)" in text
    assert "75%" in text and "25%" in text  # the weighted shares of acme and globex

    frame = cli(broker, "top", "--once").stdout
    assert "llm (paused): queued 9" in frame
    assert "acme" in frame and "fair  75% (weight 3)" in frame and "fair  25% (weight 1)" in frame


def test_submit_inspect_cancel_and_resume(broker_factory):
    broker = broker_factory(TWO_TENANTS, env=ENV)
    cli(broker, "pause", "llm")
    task_id = cli(broker, "submit", '{"k": 2}', "--pool", "llm", "--tenant", "acme").stdout.strip()
    shown = json.loads(cli(broker, "inspect", task_id, "--json").stdout)
    assert (shown["state"], shown["tenant"], shown["pool"], shown["attempts"]) == ("queued", "acme", "llm", 0)
    assert ["state", "queued"] in [line.split() for line in cli(broker, "inspect", task_id).stdout.splitlines()]
    cancelled = cli(broker, "cancel", task_id)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    again = cli(broker, "cancel", task_id)
    assert again.returncode == 1 and "already running or finished" in again.stdout
    assert json.loads(cli(broker, "inspect", task_id, "--json").stdout)["state"] == "cancelled"
    assert cli(broker, "resume", "llm").returncode == 0
    assert json.loads(cli(broker, "status", "--json").stdout)["pools"]["llm"]["paused"] is False


def test_errors_are_one_clear_line(broker_factory):
    broker = broker_factory(TWO_TENANTS, env=ENV)
    unknown = cli(broker, "inspect", "no-such-task")
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr and "Traceback" not in unknown.stderr
    wrong = cli(broker, "status", env={**ENV, "CRONOQ_TOKEN": "nope"})
    assert wrong.returncode == 1 and "UNAUTHENTICATED" in wrong.stderr
    client_only = cli(broker, "pause", "llm", env={**ENV, "CRONOQ_TOKEN": ENV["T_CLIENT"]})
    assert client_only.returncode == 1 and "PERMISSION_DENIED" in client_only.stderr
    down = run_command(["-m", "cronoq.cli", "status", "--broker", f"tcp://127.0.0.1:{free_port()}", "--timeout", "0.5"])
    assert down.returncode == 1 and "UNAVAILABLE" in down.stderr and "Traceback" not in down.stderr


def test_common_options_go_before_or_after_the_subcommand(broker_factory):
    broker = broker_factory(TWO_TENANTS, env=ENV)
    before = run_command(["-m", "cronoq.cli", "--broker", broker.clients, "--timeout", "5", "status", "--json"], env=ENV)
    assert before.returncode == 0 and "llm" in json.loads(before.stdout)["pools"]
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    after_wins = run_command(["-m", "cronoq.cli", "--broker", broker.clients, "status", "--broker", nowhere,
                              "--timeout", "0.5"], env=ENV)
    assert after_wins.returncode == 1 and nowhere in after_wins.stderr


async def test_status_reports_the_dispatch_rate(broker_factory):
    broker = broker_factory('[[pools]]\nname = "default"\n')

    async def echo(payload):
        return payload

    worker = cronoq.Worker(broker.workers, cronoq.Pool("default", echo), heartbeat_interval=0.2)
    running = asyncio.get_running_loop().create_task(worker.run())
    try:
        async with cronoq.connect(broker.clients) as client:
            handles = [await client.submit(i) for i in range(50)]
            for handle in handles:
                await handle.result(timeout=10)

            async def rate_seen() -> bool:
                return (await client.stats())["pools"]["default"]["dispatch_rate"] > 0

            await until(rate_seen, "the broker reports a dispatch rate")
    finally:
        await worker.stop()
        await running
