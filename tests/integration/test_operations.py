"""Running cronoq in production, against the real broker: metrics, reload, encryption, cron, logs."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import signal
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import cronoq
from tests.support import BEATS, BrokerProcess, free_port, run_command, until

ADMIN_ENV = {"T_ADMIN": "admin-secret", "T_OLD": "old-client-secret", "T_NEW": "new-client-secret"}


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text) for sample in family.samples
    }


async def echo(payload):
    return payload


def serve(broker: BrokerProcess, pool: cronoq.Pool, **options) -> tuple[cronoq.Worker, asyncio.Task]:
    worker = cronoq.Worker(broker.workers, pool, **BEATS, **options)
    return worker, asyncio.get_running_loop().create_task(worker.run())


async def test_the_metrics_endpoint_shows_backlog_and_counters(broker_factory):
    port = free_port()
    broker = broker_factory('[[pools]]\nname = "llm"\nfair_share = true\n', broker_extra=f'metrics = "127.0.0.1:{port}"')
    async with cronoq.connect(broker.clients) as client:
        await client.pause("llm")
        handles = [await client.submit(i, pool="llm", tenant=t) for i, t in enumerate(["acme"] * 3 + ["globex"] * 2)]
        got = await asyncio.to_thread(scrape, port)
        assert got[("cronoq_tenant_queued_tasks", (("pool", "llm"), ("tenant", "acme")))] == 3
        assert got[("cronoq_tenant_queued_tasks", (("pool", "llm"), ("tenant", "globex")))] == 2
        assert got[("cronoq_queued_tasks", (("class", "normal"), ("pool", "llm")))] == 5
        assert got[("cronoq_pool_paused", (("pool", "llm"),))] == 1
        worker, running = serve(broker, cronoq.Pool("llm", echo))
        await client.resume("llm")
        assert [await h.result(timeout=10) for h in handles] == [0, 1, 2, 3, 4]
        got = await asyncio.to_thread(scrape, port)
        await worker.stop()
        await running
    assert got[("cronoq_workers_connected", ())] == 1
    assert got[("cronoq_dispatches_total", (("pool", "llm"), ("tenant", "acme")))] == 3
    assert got[("cronoq_task_completions_total", (("outcome", "succeeded"), ("pool", "llm")))] == 5
    assert got[("cronoq_queue_wait_seconds_count", (("pool", "llm"),))] == 5
    assert got[("cronoq_run_time_seconds_count", (("pool", "llm"),))] == 5
    assert got[("cronoq_journal_commit_seconds_count", ())] > 0

    async def synced() -> bool:  # durability "sync": about once a second, in the broker's sync thread
        return (await asyncio.to_thread(scrape, port)).get(("cronoq_journal_sync_seconds_count", ()), 0) > 0

    await until(synced, "a background fdatasync of the journal")


@pytest.mark.parametrize("fork_max_rss", ["", "0"], ids=["forked", "from the files"])
async def test_each_compaction_start_is_timed_in_the_metrics(broker_factory, fork_max_rss):
    """The loop waits while a compaction's snapshot writer is started (a fork() of the broker took tens of ms
    at 10^6 queued tasks): each start is a sample of cronoq_snapshot_start_seconds. A process reading the files
    back is started by the housekeeping thread instead, and timed there too (cronoq_snapshot_spawn_seconds)."""
    port = free_port()
    broker = broker_factory('[[pools]]\nname = "default"\n',
                            env={"CRONOQ_TEST_COMPACTION": f"1,0.5,,{fork_max_rss}"},
                            broker_extra=f'metrics = "127.0.0.1:{port}"')
    before = await asyncio.to_thread(scrape, port)
    assert before[("cronoq_snapshot_start_seconds_count", ())] == 0
    async with cronoq.connect(broker.clients) as client:
        worker, running = serve(broker, cronoq.Pool("default", echo))
        handles = [await client.submit(n) for n in range(50)]
        assert [await h.result(timeout=10) for h in handles] == list(range(50))

        async def compacted() -> bool:
            return (await client.stats())["store"]["compactions"] >= 1

        await until(compacted, "a compaction")
        got = await asyncio.to_thread(scrape, port)
        await worker.stop()
        await running
    assert got[("cronoq_snapshot_start_seconds_count", ())] >= 1
    assert got[("cronoq_snapshot_start_seconds_sum", ())] > 0
    spawned = got[("cronoq_snapshot_spawn_seconds_count", ())]
    assert spawned == 0 if fork_max_rss == "" else spawned >= 1


def weighted_config(acme: int, *, extra_pool: bool = False, token_env: str = "T_OLD") -> str:
    text = (f'[[pools]]\nname = "llm"\n[pools.tenant_weights]\nacme = {acme}\nglobex = 1\n\n'
            f'[[auth.tokens]]\ntoken_env = "T_ADMIN"\nrole = "admin"\n\n'
            f'[[auth.tokens]]\ntoken_env = "{token_env}"\nrole = "client"\n')
    if extra_pool:
        text += '\n[[pools]]\nname = "batch"\n'
    return text


def rewrite(broker: BrokerProcess, body: str) -> None:
    """Replace the config's body, keeping its [broker] table (endpoints and data_dir)."""
    text = broker.config_path.read_text()
    broker.config_path.write_text(text[: text.index("[[pools]]")] + body)


async def test_sighup_reweights_the_queued_backlog_and_reload_applies_pools_and_tokens(broker_factory):
    broker = broker_factory(weighted_config(1), env=ADMIN_ENV)
    order = itertools.count()

    async def record(payload):
        return [next(order), payload]

    async with cronoq.connect(broker.clients, token=ADMIN_ENV["T_ADMIN"]) as admin:
        await admin.pause("llm")
        handles = [await admin.submit(t, pool="llm", tenant=t) for t in ["globex"] * 20 + ["acme"] * 20]

        # SIGHUP: acme now weighs 3, and the backlog already queued follows.
        rewrite(broker, weighted_config(3))
        broker.proc.send_signal(signal.SIGHUP)

        async def reweighted() -> bool:
            return (await admin.stats())["pools"]["llm"]["tenants"]["acme"]["weight"] == 3

        await until(reweighted, "the broker took the new weight")
        worker, running = serve(broker, cronoq.Pool("llm", record), concurrency=1, token=ADMIN_ENV["T_ADMIN"])
        await admin.resume("llm")
        results = sorted([await h.result(timeout=30) for h in handles])
        first = [tenant for _, tenant in results[:20]]
        assert first.count("acme") == 15 and first.count("globex") == 5

        # An invalid file is refused; the running config stays.
        broker.config_path.write_text(broker.config_path.read_text() + "\nnonsense = 1\n")
        with pytest.raises(cronoq.FailedPrecondition, match="nonsense"):
            await admin.reload()
        assert (await admin.stats())["pools"]["llm"]["tenants"]["acme"]["weight"] == 3

        # A new pool appears, a new token works and the removed one stops working, on a new connection and
        # on one it was already known on (a connection remembers its last valid token).
        known = await cronoq.connect(broker.clients, token=ADMIN_ENV["T_OLD"])
        assert (await known.status(handles[0].id)).state == "succeeded"
        rewrite(broker, weighted_config(3, extra_pool=True, token_env="T_NEW"))
        changes = await admin.reload()
        assert changes["pools_added"] == ["batch"] and changes["needs_restart"] == []
        await admin.pause("batch")
        async with cronoq.connect(broker.clients, token=ADMIN_ENV["T_NEW"]) as new_client:
            assert (await new_client.status((await new_client.submit(1, pool="batch")).id)).state == "queued"
        async with cronoq.connect(broker.clients, token=ADMIN_ENV["T_OLD"]) as old_client:
            with pytest.raises(cronoq.Unauthenticated):
                await old_client.submit(1, pool="llm")
        with pytest.raises(cronoq.Unauthenticated):
            await known.submit(1, pool="llm")
        await known.close()

        # A removed pool refuses new work but drains what it holds.
        queued = await admin.submit("last", pool="batch")
        rewrite(broker, weighted_config(3, token_env="T_NEW"))
        assert (await admin.reload())["pools_draining"] == ["batch"]
        with pytest.raises(cronoq.NotFound):
            await admin.submit("x", pool="batch")
        assert (await admin.status(queued.id)).state == "queued"
        await worker.stop()
        await running


async def test_curve_encrypts_and_refuses_clients_without_the_key(broker_factory, tmp_path):
    made = run_command(["-m", "cronoq.client.cli", "keygen", "--dir", str(tmp_path / "keys")])
    assert made.returncode == 0, made.stderr
    public_file, secret_file = tmp_path / "keys" / "broker.key", tmp_path / "keys" / "broker.key_secret"
    assert oct(secret_file.stat().st_mode & 0o777) == "0o600"
    broker = broker_factory('[[pools]]\nname = "default"\n', broker_extra=f'curve_secret_key_file = "{secret_file}"')
    worker, running = serve(broker, cronoq.Pool("default", echo), curve_public_key=public_file)
    try:
        async with cronoq.connect(broker.clients, curve_public_key=public_file) as client:
            assert await (await client.submit({"secret": "payload"})).result(timeout=10) == {"secret": "payload"}
        async with cronoq.connect(broker.clients, request_timeout=1) as plain:
            with pytest.raises(cronoq.Unavailable):
                await plain.ping()
        other_public, _ = cronoq.wire.curve.keygen(tmp_path / "other")
        async with cronoq.connect(broker.clients, request_timeout=1, curve_public_key=other_public) as wrong:
            with pytest.raises(cronoq.Unavailable):
                await wrong.ping()
        # In a thread: the in-process worker must go on heartbeating while the command runs.
        status = await asyncio.to_thread(run_command, ["-m", "cronoq.client.cli", "status", "--json", "--broker",
                                                       broker.clients, "--curve-public-key", str(public_file)])
        assert status.returncode == 0 and json.loads(status.stdout)["workers"] == 1
    finally:
        await worker.stop()
        await running


async def test_a_cron_schedule_fires_on_its_ticks(broker_factory):
    ran = []

    async def record(payload):
        ran.append(payload)
        return payload

    schedule = ('[[pools]]\nname = "reports"\n\n[[schedules]]\nname = "every-second"\ncron = "* * * * * *"\n'
                'pool = "reports"\ntenant = "acme"\npayload = {report = "daily"}\n')
    broker = broker_factory(schedule)
    worker, running = serve(broker, cronoq.Pool("reports", record))
    try:
        async def fired_twice() -> bool:
            return len(ran) >= 2

        await until(fired_twice, "the schedule fired twice")
        assert ran[:2] == [{"report": "daily"}] * 2
        async with cronoq.connect(broker.clients) as client:
            stats = await client.stats()
        assert stats["pools"]["reports"]["tenants"]["acme"]["dispatched"] >= 2
        assert stats["schedules"]["every-second"]["last_fired"] is not None
    finally:
        await worker.stop()
        await running


async def test_a_missed_tick_runs_once_across_restarts_and_crashes(broker_factory, tmp_path):
    yearly = ('[[pools]]\nname = "reports"\n\n[[schedules]]\nname = "new-year"\ncron = "0 0 1 1 *"\n'
              'pool = "reports"\ntenant = "acme"\n')
    data_dir = tmp_path / "cron-data"
    data_dir.mkdir()
    long_ago = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc).timestamp()
    (data_dir / "schedules.json").write_text(json.dumps({"new-year": long_ago}))

    async def queued(broker: BrokerProcess) -> int:
        async with cronoq.connect(broker.clients) as client:
            return (await client.stats())["pools"]["reports"]["queued"]

    broker = broker_factory(yearly, name="cron.toml")  # data_dir cron-data, beside it
    assert await queued(broker) == 1  # every missed New Year since 2020: one task, on start
    state = json.loads((data_dir / "schedules.json").read_text())
    assert state["new-year"] > long_ago
    assert broker.stop() == 0
    broker.start()
    assert await queued(broker) == 1  # a restart does not fire it again
    # A crash after the task was journaled but before the tick was remembered: its key stops a double.
    broker.kill()
    (data_dir / "schedules.json").write_text(json.dumps({"new-year": long_ago}))
    broker.start()
    assert await queued(broker) == 1


async def test_json_logs_are_one_object_per_line_and_never_show_a_token(broker_factory):
    secret = "secret-token-value"
    broker = broker_factory('[[pools]]\nname = "default"\n\n[[auth.tokens]]\ntoken_env = "T"\nrole = "admin"\n',
                            env={"T": secret}, args=["--log-level", "DEBUG", "--log-format", "json"])
    worker, running = serve(broker, cronoq.Pool("default", echo), token=secret)
    async with cronoq.connect(broker.clients, token=secret) as client:
        assert await (await client.submit("payload-marker")).result(timeout=10) == "payload-marker"
    await worker.stop()
    await running
    assert broker.stop() == 0
    text = broker.log.read_text()
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert any("ready for pools" in json.loads(line)["msg"] for line in lines), text
    for line in lines:
        fields = json.loads(line)
        assert {"ts", "level", "logger", "msg"} <= set(fields)
    assert secret not in text and "payload-marker" not in text


async def test_stats_of_a_pool_with_thousands_of_tenants_lists_the_busiest(broker_factory):
    from cronoq.broker.statistics import STATS_TENANTS

    broker = broker_factory('[[pools]]\nname = "wide"\nfair_share = true\n')
    tenants = STATS_TENANTS + 200
    async with cronoq.connect(broker.clients) as client:
        await client.pause("wide")
        await asyncio.gather(*(client.submit(i, pool="wide", tenant=f"t{i}") for i in range(tenants)))
        await asyncio.gather(*(client.submit(i, pool="wide", tenant="busiest") for i in range(3)))
        pool = (await client.stats())["pools"]["wide"]
    assert pool["queued"] == tenants + 3, "the pool's own counts cover every tenant"
    assert pool["tenant_count"] == tenants + 1
    assert len(pool["tenants"]) == STATS_TENANTS
    assert next(iter(pool["tenants"])) == "busiest" and pool["tenants"]["busiest"]["queued"] == 3
    status = run_command(["-m", "cronoq.client.cli", "status", "--broker", broker.clients])
    assert status.returncode == 0, status.stderr
    assert f"... and 201 more tenants (the {STATS_TENANTS:,} busiest are shown)" in status.stdout
