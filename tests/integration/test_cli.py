"""The `cronoq` command against a real broker: status, top, submit, inspect, cancel, pause, resume (explain:
test_explain.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time

import cronoq
from cronoq.client.cli import build_parser
from tests.support import BEATS, _env, free_port, run_command, start_worker_process, until

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
    return run_command(["-m", "cronoq.client.cli", *args, "--broker", broker.clients], env=env)


def test_status_and_top_show_a_known_backlog_of_two_tenants(broker_factory):
    broker = broker_factory(TWO_TENANTS, env=ENV)
    assert cli(broker, "pause", "llm").returncode == 0
    assert cli(broker, "submit", '{"n": 1}', "--pool", "llm", "--tenant", "acme").returncode == 0
    submit_backlog(broker, {"acme": 2, "globex": 5}, token=ENV["T_ADMIN"])  # the rest of it, without a process each
    urgent = cli(broker, "submit", '"x"', "--pool", "llm", "--tenant", "acme", "--priority", "critical")
    assert urgent.returncode == 0

    result = cli(broker, "status", "--json")
    assert result.returncode == 0, result.stderr
    pool = json.loads(result.stdout)["pools"]["llm"]
    assert pool["paused"] and pool["queued"] == 9 and pool["running"] == 0
    assert pool["classes"]["critical"]["queued"] == 1 and pool["classes"]["normal"]["queued"] == 8
    assert {name: (t["weight"], t["queued"]) for name, t in pool["tenants"].items()} == {
        "acme": (3.0, 4), "globex": (1.0, 5)}

    text = cli(broker, "status").stdout
    assert "pool llm [paused, fair]: queued 9" in text and "(0.0/s over the last 10 s)" in text
    # Classes are strict: while acme's critical task waits, the fair order served next is the critical class's.
    assert fair_shares(text) == {"acme": "100.0%", "globex": "0.0%"}
    assert cli(broker, "cancel", urgent.stdout.strip()).returncode == 0
    text = cli(broker, "status").stdout
    assert fair_shares(text) == {"acme": "75.0%", "globex": "25.0%"}  # then the weights' shares in normal

    frame = cli(broker, "top", "--once").stdout
    assert "llm (paused): queued 8" in frame
    assert "acme" in frame and "fair 75.0% (weight 3)" in frame and "fair 25.0% (weight 1)" in frame


def submit_backlog(broker, counts: dict[str, int], token: str | None = None) -> None:
    """Queue `count` tasks for each tenant in pool llm through the Python client: `cronoq submit` has its own tests
    here, and a process per task would make these the suite's slowest tests."""
    with cronoq.connect_sync(broker.clients, token=token) as client:
        for tenant, count in counts.items():
            for _ in range(count):
                client.submit(1, pool="llm", tenant=tenant)


def poll_until(condition, what: str, timeout: float = 30.0) -> None:
    """Ask until `condition()` holds; fail naming `what` after `timeout` seconds (never a speed assertion)."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out after {timeout} s waiting until {what}"
        time.sleep(0.05)


def fair_shares(status: str) -> dict[str, str]:
    """tenant row (its label, indentation dropped) -> its `fair` column, from `cronoq status`."""
    lines = status.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["tenant", "weight"])
    rows = {}
    for line in lines[header + 1:]:
        row = re.match(r"  \s*(\S+(?: \(own\))?) .*\s(\S+%)\s+\S+$", line)
        if row is None:
            break
        rows[row.group(1)] = row.group(2)
    return rows


TREE = """
[[pools]]
name = "llm"
[pools.tenant_weights]
acme = 3
"acme/search" = 2
"acme/ads" = 1
globex = 1
"""


def test_status_and_top_show_the_tenant_tree_with_its_weighted_shares(broker_factory):
    """Issue #23: with tasks for acme itself, search, ads and globex, status said 43 / 29 / 14 / 14 % as if
    the tree were flat; the tree gives acme's own tasks 3/4 * 1/4, search 3/4 * 2/4, ads 3/4 * 1/4, globex 1/4."""
    broker = broker_factory(TREE)
    plain = {"CRONOQ_TOKEN": ""}
    assert cli(broker, "pause", "llm", env=plain).returncode == 0
    submit_backlog(broker, {"acme": 3, "acme/search": 3, "acme/ads": 3, "globex": 3})
    text = cli(broker, "status", env=plain).stdout
    assert fair_shares(text) == {"acme": "75.0%", "acme (own)": "18.8%", "ads": "18.8%", "search": "37.5%",
                                 "globex": "25.0%"}, text
    rows = [line for line in text.splitlines() if line.startswith("  ") and "%" in line]
    assert [row.split()[0] for row in rows] == ["acme", "acme", "ads", "search", "globex"]  # parents first
    pool = json.loads(cli(broker, "status", "--json", env=plain).stdout)["pools"]["llm"]
    assert pool["tenants"]["acme"]["weighted_share"] == 0.75
    assert pool["tenants"]["acme"]["own_weighted_share"] == 0.1875
    frame = cli(broker, "top", "--once", env=plain).stdout
    assert "acme (own)" in frame and "fair 37.5% (weight 2)" in frame and "fair 18.8% (weight 1)" in frame


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
    assert again.returncode == 1 and again.stdout.strip() == f"not cancelled: task {task_id}: it was already cancelled"
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
    down = run_command(["-m", "cronoq.client.cli", "status", "--broker", f"tcp://127.0.0.1:{free_port()}", "--timeout", "0.5"])
    assert down.returncode == 1 and "UNAVAILABLE" in down.stderr and "Traceback" not in down.stderr


def test_common_options_go_before_or_after_the_subcommand(broker_factory):
    broker = broker_factory(TWO_TENANTS, env=ENV)
    before = run_command(["-m", "cronoq.client.cli", "--broker", broker.clients, "--timeout", "5", "status", "--json"], env=ENV)
    assert before.returncode == 0 and "llm" in json.loads(before.stdout)["pools"]
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    after_wins = run_command(["-m", "cronoq.client.cli", "--broker", broker.clients, "status", "--broker", nowhere,
                              "--timeout", "0.5"], env=ENV)
    assert after_wins.returncode == 1 and nowhere in after_wins.stderr


async def test_status_reports_the_dispatch_rate(broker_factory):
    broker = broker_factory('[[pools]]\nname = "default"\n')

    async def echo(payload):
        return payload

    worker = cronoq.Worker(broker.workers, cronoq.Pool("default", echo), **BEATS)
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


def test_an_unset_token_variable_is_named(broker_factory):
    broker = broker_factory(TWO_TENANTS, env=ENV)
    result = cli(broker, "status", "--token-env", "CRONOQ_NOPE_FOR_TEST")
    assert result.returncode == 1 and "UNAUTHENTICATED" in result.stderr
    assert "CRONOQ_NOPE_FOR_TEST is not set" in result.stderr and "CRONOQ_TOKEN" not in result.stderr
    empty = cli(broker, "status", "--token-env", "CRONOQ_EMPTY_FOR_TEST", env={**ENV, "CRONOQ_EMPTY_FOR_TEST": ""})
    assert empty.returncode == 1 and "CRONOQ_EMPTY_FOR_TEST is empty" in empty.stderr


def test_permission_refusals_read_as_sentences(broker_factory):
    broker = broker_factory(TWO_TENANTS, env=ENV)
    as_client = {**ENV, "CRONOQ_TOKEN": ENV["T_CLIENT"]}
    stats = cli(broker, "status", env=as_client)
    assert stats.returncode == 1
    assert "a client token may not ask for the broker's statistics; that takes a viewer or admin token" in stats.stderr
    pause = cli(broker, "pause", "llm", env=as_client)
    assert "a client token may not pause a pool; that takes an admin token" in pause.stderr


async def test_a_payload_that_is_not_json_is_refused_unless_sent_as_text(broker_factory):
    broker = broker_factory(TWO_TENANTS, env=ENV)
    for bad in ("{bad json", "hello"):
        refused = await asyncio.to_thread(cli, broker, "submit", bad, "--pool", "llm")
        assert refused.returncode == 2 and refused.stdout == ""
        assert "PAYLOAD is not valid JSON" in refused.stderr and "--text" in refused.stderr
        assert "Traceback" not in refused.stderr
    assert json.loads((await asyncio.to_thread(cli, broker, "status", "--json")).stdout)["pools"]["llm"]["queued"] == 0

    async def echo(payload):
        return payload

    worker = cronoq.Worker(broker.workers, cronoq.Pool("llm", echo), token=ENV["T_ADMIN"], **BEATS)
    running = asyncio.get_running_loop().create_task(worker.run())
    try:
        as_text = await asyncio.to_thread(cli, broker, "submit", "{bad json", "--text", "--pool", "llm", "--wait")
        assert as_text.returncode == 0, as_text.stderr
        assert json.loads(as_text.stdout.splitlines()[1]) == "{bad json"
        as_json = await asyncio.to_thread(cli, broker, "submit", '{"k": [1]}', "--pool", "llm", "--wait")
        assert json.loads(as_json.stdout.splitlines()[1]) == {"k": [1]}
    finally:
        await worker.stop()
        await running


def test_a_deadline_that_is_not_in_the_future_is_refused_before_sending():
    nowhere = f"tcp://127.0.0.1:{free_port()}"
    for deadline in ("0", "-5"):
        refused = run_command(["-m", "cronoq.client.cli", "submit", "1", "--deadline", deadline, "--broker", nowhere,
                               "--timeout", "0.5"])
        assert refused.returncode == 2 and "--deadline" in refused.stderr and "UNAVAILABLE" not in refused.stderr
        assert "more than 0 seconds" in refused.stderr


def test_inspect_json_shows_missing_values_as_null(broker_factory):
    broker = broker_factory(TWO_TENANTS, env=ENV)
    cli(broker, "pause", "llm")
    task_id = cli(broker, "submit", "1", "--pool", "llm").stdout.strip()
    shown = json.loads(cli(broker, "inspect", task_id, "--json").stdout)
    assert shown["tenant"] is None and shown["started_at"] is None and shown["finished_at"] is None
    assert shown["deadline"] is None and shown["last_error"] is None and shown["cost"] is None
    assert isinstance(shown["submitted_at"], str)
    assert "-" not in shown.values()


def test_keygen_refuses_to_replace_a_key_pair_without_force(tmp_path):
    keys = tmp_path / "keys"
    assert run_command(["-m", "cronoq.client.cli", "keygen", "--dir", str(keys)]).returncode == 0
    public = (keys / "broker.key").read_text()
    again = run_command(["-m", "cronoq.client.cli", "keygen", "--dir", str(keys)])
    assert again.returncode == 1 and "already exists" in again.stderr and "--force" in again.stderr
    assert "Traceback" not in again.stderr
    assert (keys / "broker.key").read_text() == public, "the old pair is untouched"
    forced = run_command(["-m", "cronoq.client.cli", "keygen", "--dir", str(keys), "--force"])
    assert forced.returncode == 0, forced.stderr
    assert (keys / "broker.key").read_text() != public


def test_top_refuses_an_interval_that_would_flood_the_broker():
    for interval in ("0", "-1", "0.01"):
        refused = run_command(["-m", "cronoq.client.cli", "top", "--interval", interval])
        assert refused.returncode == 2 and "--interval" in refused.stderr and "at least 0.1" in refused.stderr


def test_top_into_a_pipe_that_closes_ends_quietly(broker_factory):
    broker = broker_factory(TWO_TENANTS, env=ENV)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cronoq.client.cli", "top", "--interval", "0.1", "--broker", broker.clients],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(ENV), text=True,
    )
    first = proc.stdout.readline()  # like `cronoq top | head -1`
    proc.stdout.close()
    try:
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read()
    assert "cronoq top" in first and "\x1b[" not in first, "no screen control codes into a pipe"
    assert code == 0 and stderr == ""


def test_every_subcommand_and_option_explains_itself():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        assert sub.description, f"`cronoq {name} --help` has no description"
        for action in sub._actions:
            assert action.help, f"`cronoq {name}` {action.option_strings or action.dest} has no help text"
    shown = run_command(["-m", "cronoq.client.cli", "submit", "--help"])
    assert shown.returncode == 0 and "--text" in shown.stdout and "idempotency" in shown.stdout


CAPPED = """
[[pools]]
name = "default"

[[pools]]
name = "slow"
[pools.tenant_limits]
acme = 1
"""


def test_status_and_top_show_a_capped_tenant_and_for_how_long(broker_factory, tmp_path):
    broker = broker_factory(CAPPED)
    worker = start_worker_process(broker.workers, "tests.apps.echo:pools", tmp_path / "worker.log", concurrency=3)
    try:
        for tenant in ("acme/search", "acme", "globex"):
            assert cli(broker, "submit", "60", "--pool", "slow", "--tenant", tenant, env={}).returncode == 0

        def acme() -> dict:
            return json.loads(cli(broker, "status", "--json", env={}).stdout)["pools"]["slow"]["ceilings"]["acme"]

        with cronoq.connect_sync(broker.clients) as client:  # polled in-process, a generous bound, no speed test
            poll_until(lambda: client.stats()["pools"]["slow"]["ceilings"]["acme"]["capped"], "acme is at its ceiling")
        first = acme()
        assert (first["limit"], first["running"], first["capped"]) == (1, 1, True)
        assert first["capped_since"] is not None and first["capped_for"] >= 0
        assert acme()["capped_for"] >= first["capped_for"]  # it grows while acme stays capped
        frame = cli(broker, "top", "--once", env={}).stdout
        assert "  at their ceilings:" in frame and "    acme                 1 of 1     capped for " in frame
        text = cli(broker, "status", env={}).stdout
        assert "  ceilings (running of limit):" in text and "capped for" in text
    finally:
        worker.kill()
        worker.wait()


def test_cancel_says_why_a_running_or_finished_task_was_not_cancelled(broker_factory, tmp_path):
    broker = broker_factory(CAPPED)
    worker = start_worker_process(broker.workers, "tests.apps.echo:pools", tmp_path / "worker.log", concurrency=2)
    try:
        running = cli(broker, "submit", "60", "--pool", "slow", env={}).stdout.strip()
        done = cli(broker, "submit", '"hi"', "--pool", "default", env={}).stdout.strip()

        with cronoq.connect_sync(broker.clients) as client:  # polled in-process, a generous bound, no speed test
            poll_until(lambda: (client.status(running).state, client.status(done).state) == ("running", "succeeded"),
                       "one task runs and the other has succeeded")
        assert json.loads(cli(broker, "inspect", running, "--json", env={}).stdout)["state"] == "running"
        for task_id, reason in ((running, "it is already running (a running task is not interrupted)"),
                                (done, "it already finished (succeeded)")):
            refused = cli(broker, "cancel", task_id, env={})
            assert refused.returncode == 1 and refused.stdout.strip() == f"not cancelled: task {task_id}: {reason}"
    finally:
        worker.kill()
        worker.wait()


def test_submit_takes_a_cost_and_refuses_a_bad_one_in_a_sentence(broker_factory):
    broker = broker_factory(TWO_TENANTS, env=ENV)
    assert cli(broker, "pause", "llm").returncode == 0
    for bad in ("0", "-2", "nan"):
        refused = cli(broker, "submit", "1", "--pool", "llm", "--cost", bad)
        assert refused.returncode == 1 and "cost must be a positive number" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    accepted = cli(broker, "submit", "1", "--pool", "llm", "--tenant", "acme", "--cost", "2.5")
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(cli(broker, "status", "--json").stdout)["pools"]["llm"]["queued"] == 1
