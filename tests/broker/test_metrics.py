"""The Prometheus rendering of the broker's statistics, from a real core, without sockets."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cronoq.broker.exposition import browser_problem, collector_for, registry_for, render_in_steps
from cronoq.broker.metrics import BrokerMetrics, Histogram
from cronoq.core import PoolSettings, SchedulerCore, Task
from tests.support import LoopTurns


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text) for sample in family.samples
    }


def test_backlog_dispatches_completions_and_histograms_are_exposed():
    core = SchedulerCore([PoolSettings("llm", {"acme": 3})])
    for i in range(3):
        core.submit(Task(f"a{i}", "llm", tenant="acme"), 0.0)
    core.submit(Task("g", "llm", tenant="globex", priority=0), 0.0)
    core.add_worker("w", ["llm"], 1)
    core.dispatch(1.0)
    metrics = BrokerMetrics()
    metrics.task_finished("llm", "succeeded", submitted_at=0.0, started_at=0.02, finished_at=0.5)
    metrics.task_finished("llm", "expired", submitted_at=0.0, started_at=None, finished_at=None)
    metrics.commit_took(0.0003)
    metrics.pass_took(0.003, 0.0015)
    metrics.gc_paused(0, 0.0002)
    metrics.heartbeat_took(0.0003)
    metrics.gc_paused(2, 0.3)
    metrics.snapshot_start_took(0.012)
    text = generate_latest(registry_for(lambda: {"pools": core.stats(), "workers": 1, "late_results": 2},
                                        metrics)).decode()
    got = samples(text)
    assert got[("cronoq_workers_connected", ())] == 1
    assert got[("cronoq_late_results_total", ())] == 2
    assert got[("cronoq_pool_workers", (("pool", "llm"),))] == 1
    assert got[("cronoq_queued_tasks", (("class", "normal"), ("pool", "llm")))] == 3
    assert got[("cronoq_running_tasks", (("class", "critical"), ("pool", "llm")))] == 1
    assert got[("cronoq_tenant_queued_tasks", (("pool", "llm"), ("tenant", "acme")))] == 3
    assert got[("cronoq_tenant_weight", (("pool", "llm"), ("tenant", "acme")))] == 3
    assert got[("cronoq_dispatches_total", (("pool", "llm"), ("tenant", "globex")))] == 1
    assert got[("cronoq_task_completions_total", (("outcome", "succeeded"), ("pool", "llm")))] == 1
    assert got[("cronoq_task_completions_total", (("outcome", "expired"), ("pool", "llm")))] == 1
    assert got[("cronoq_queue_wait_seconds_count", (("pool", "llm"),))] == 1
    assert got[("cronoq_queue_wait_seconds_bucket", (("le", "0.025"), ("pool", "llm")))] == 1
    assert got[("cronoq_queue_wait_seconds_bucket", (("le", "0.01"), ("pool", "llm")))] == 0
    assert got[("cronoq_run_time_seconds_sum", (("pool", "llm"),))] == 0.48
    assert got[("cronoq_journal_commit_seconds_count", ())] == 1
    assert got[("cronoq_loop_pass_seconds_bucket", (("le", "0.002"),))] == 0
    assert got[("cronoq_loop_pass_seconds_bucket", (("le", "0.004"),))] == 1
    assert got[("cronoq_loop_pass_cpu_seconds_bucket", (("le", "0.002"),))] == 1
    assert got[("cronoq_gc_pause_seconds_count", (("generation", "0"),))] == 1
    assert got[("cronoq_loop_heartbeat_seconds_count", ())] == 1
    assert got[("cronoq_gc_pause_seconds_bucket", (("generation", "2"), ("le", "0.25")))] == 0
    assert got[("cronoq_gc_pause_seconds_sum", (("generation", "2"),))] == 0.3
    assert got[("cronoq_snapshot_start_seconds_bucket", (("le", "0.01"),))] == 0
    assert got[("cronoq_snapshot_start_seconds_bucket", (("le", "0.025"),))] == 1


def test_histogram_buckets_are_cumulative_and_bounds_inclusive():
    histogram = Histogram((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 3.0):
        histogram.observe(value)
    assert histogram.buckets() == [("1.0", 2), ("2.0", 3), ("+Inf", 4)]
    assert histogram.sum == 6.0


def test_each_ceiling_is_exposed_with_how_long_its_node_has_been_capped():
    core = SchedulerCore([PoolSettings("llm", tenant_limits={"acme": 2, "acme/search": 5})])
    for i in range(3):
        core.submit(Task(f"a{i}", "llm", tenant="acme/search"), 0.0)
    core.add_worker("w", ["llm"], 10)
    core.dispatch(4.0)  # two run: acme is capped from 4.0
    text = generate_latest(registry_for(lambda: {"pools": core.stats(now=10.5), "workers": 1}, BrokerMetrics()))
    got = samples(text.decode())
    acme, search = (("pool", "llm"), ("tenant", "acme")), (("pool", "llm"), ("tenant", "acme/search"))
    assert (got[("cronoq_tenant_ceiling", acme)], got[("cronoq_tenant_ceiling", search)]) == (2, 5)
    assert got[("cronoq_tenant_ceiling_running_tasks", acme)] == 2
    assert (got[("cronoq_tenant_capped", acme)], got[("cronoq_tenant_capped", search)]) == (1, 0)
    assert (got[("cronoq_tenant_capped_seconds", acme)], got[("cronoq_tenant_capped_seconds", search)]) == (6.5, 0)


def test_rates_minimums_and_lag_in_the_pool_s_unit_are_exposed():
    core = SchedulerCore([PoolSettings("gpu", share_by="cost", tenant_rates={"acme": 1},
                                       tenant_minimums={"light": 3})])
    for i in range(2):
        core.submit(Task(f"a{i}", "gpu", tenant="acme", cost=4.0), 0.0)
    core.submit(Task("l0", "gpu", tenant="light"), 0.0)
    core.add_worker("w", ["gpu"], 2)
    core.dispatch(0.0)  # light (under its minimum) and one of acme's, which spends acme's token
    core.submit(Task("l1", "gpu", tenant="light"), 0.0)
    text = generate_latest(registry_for(lambda: {"pools": core.stats(now=0.25), "workers": 1}, BrokerMetrics()))
    got = samples(text.decode())
    acme, light = (("pool", "gpu"), ("tenant", "acme")), (("pool", "gpu"), ("tenant", "light"))
    assert got[("cronoq_tenant_rate", acme)] == 1
    assert got[("cronoq_tenant_rate_limited", acme)] == 1
    assert got[("cronoq_tenant_rate_next_start_seconds", acme)] == 0.75
    assert (got[("cronoq_tenant_minimum", light)], got[("cronoq_tenant_minimum_running_tasks", light)]) == (3, 1)
    assert got[("cronoq_tenant_under_minimum", light)] == 1
    assert got[("cronoq_pool_share_by", (("pool", "gpu"), ("share_by", "cost")))] == 1
    assert ("cronoq_tenant_lag", (*acme, ("unit", "cost"))) in got
    assert ("cronoq_tenant_lag_dispatches", acme) not in got  # its lag is not in dispatches


def _busy_core() -> SchedulerCore:
    """Two pools with more tenants than a piece holds, ceilings, rates and minimums, some of it dispatched."""
    core = SchedulerCore([
        PoolSettings("llm", {"acme": 3}, tenant_limits={"acme": 2}, tenant_rates={"t1": 5.0},
                     tenant_minimums={"t2": 1}),
        PoolSettings("batch"),
    ])
    for pool in ("llm", "batch"):
        for i in range(40):
            core.submit(Task(f"{pool}-{i}", pool, tenant=f"t{i % 25}" if i % 7 else f"acme/t{i}"), 0.0)
    core.add_worker("w", ["llm", "batch"], 6)
    core.dispatch(1.0)
    return core


async def test_a_scrape_written_in_pieces_is_what_generate_latest_writes_and_lets_the_loop_run():
    core, metrics = _busy_core(), BrokerMetrics()
    metrics.task_finished("llm", "succeeded", submitted_at=0.0, started_at=0.02, finished_at=0.5)
    metrics.pass_took(0.003, 0.0015)
    stats = {"pools": core.stats(now=2.0), "workers": 1, "late_results": 2}
    for member in (None, "b1"):  # a cluster member's samples carry its name: those made piece by piece too
        whole = generate_latest(registry_for(lambda: stats, metrics, member))
        with LoopTurns() as loop:
            pieces = await render_in_steps(collector_for(lambda: stats, metrics, member), stats, chunk=7)
        assert pieces == whole  # the same bytes: no HELP or TYPE repeated, no sample lost or moved
        tenant_samples = sum(1 for line in whole.decode().splitlines() if 'tenant="' in line)
        # Between the pieces the loop ran: a piece holds 7 samples at most.
        assert loop.turns >= tenant_samples // 7 - 1, (loop.turns, tenant_samples)
        assert (member is None) == (b'member="b1"' not in pieces)


POOLS = ["a", "b", "c"]


def _broker_of_three_pools(tmp_path, tenants_each: int):
    """A real Broker object (its journal in tmp_path, no sockets) with pools a, b and c, each with a queued task of
    `tenants_each` tenants."""
    from cronoq.book.submission import SubmitRequest
    from cronoq.broker.config import parse_config
    from cronoq.broker.server import Broker

    tmp_path.mkdir(parents=True, exist_ok=True)
    config = parse_config({"broker": {"data_dir": str(tmp_path / "data")}, "pools": [{"name": n} for n in POOLS]},
                          source="test", base_dir=tmp_path, environ={})
    broker = Broker(config, clock=lambda: 100.0)
    broker.open()
    for n in POOLS:
        for t in range(tenants_each):
            broker._book.submit(SubmitRequest(b"\xc0", n, f"t{t}", "normal", None, None, None, 0, None), 100.0)
    return broker


async def test_the_stats_a_scrape_reads_are_taken_a_pool_per_turn_and_match_the_stats_at_once(tmp_path):
    broker = _broker_of_three_pools(tmp_path, 5)
    try:
        with LoopTurns() as loop:
            stepped = await broker.stats_in_steps()
        assert stepped == broker.stats()
        assert sorted(stepped["pools"]) == POOLS and loop.turns >= len(POOLS) - 1
    finally:
        broker.close()


def test_a_stats_answer_of_many_tenants_is_built_a_pool_per_pass_and_shared(tmp_path):
    from cronoq.broker.statistics import STATS_TENANTS

    small = _broker_of_three_pools(tmp_path / "small", 5)
    try:
        answers: list[dict] = []
        small._stats_replies.request(answers.append)
        assert len(answers) == 1  # a few tenants: answered at once, as always
    finally:
        small.close()
    per_pool = STATS_TENANTS // 2  # more than one step's worth in all, no pool a large one
    broker = _broker_of_three_pools(tmp_path / "large", per_pool)
    try:
        answers = []
        broker._stats_replies.request(answers.append)
        broker._stats_replies.request(answers.append)  # a second asker meanwhile shares the answer
        passes = 0
        while broker._stats_replies.searching:
            broker._stats_replies.step()
            passes += 1
        assert passes >= len(POOLS)
        assert len(answers) == 2 and answers[0] is answers[1]
        assert answers[0] == broker.stats()
        assert [len(answers[0]["pools"][n]["tenants"]) for n in POOLS] == [per_pool] * len(POOLS)
    finally:
        broker.close()


async def _http(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def test_scrapes_that_come_together_share_one_and_a_garbage_request_costs_only_its_connection():
    from cronoq.broker.exposition import MAX_HEADER_LINES, serve_metrics

    core, metrics = _busy_core(), BrokerMetrics()
    stats = {"pools": core.stats(now=2.0), "workers": 1, "late_results": 2}
    taken = 0

    async def stats_in_steps() -> dict:
        nonlocal taken
        taken += 1
        await asyncio.sleep(0)
        return stats

    servers = await serve_metrics("127.0.0.1:0", collector_for(lambda: stats, metrics), stats_in_steps)
    port = servers[0].sockets[0].getsockname()[1]
    try:
        scrape = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        answers = await asyncio.gather(*(_http(port, scrape) for _ in range(5)))
        whole = generate_latest(registry_for(lambda: stats, metrics))
        assert all(answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(whole) for answer in answers)
        assert taken < 5  # the scrapes that came while one was written got its text
        # Endless headers, or a line past the reader's limit: the connection is closed, nothing else happens.
        endless = b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: 1\r\n" * (MAX_HEADER_LINES + 5) + b"\r\n"
        assert await _http(port, endless) == b""
        assert await _http(port, b"GET /" + b"x" * 100_000 + b"\r\n\r\n") == b""
        assert (await _http(port, b"GET /metrics HTTP/1.1\r\n\r\n")).endswith(whole)
    finally:
        for server in servers:
            server.close()


def test_a_page_s_script_is_refused_and_a_scraper_s_name_is_checked_on_loopback_or_once_configured():
    # Bound to every interface, no metrics_hosts: the names scrapers use are not known; a page's script is refused.
    assert browser_problem("broker-1.internal:9464", None, "0.0.0.0") is None
    assert browser_problem("evil.example:9464", "cross-site", "0.0.0.0") is None  # a link followed: it cannot read
    assert browser_problem("broker-1.internal:9464", " Same-Origin ", "0.0.0.0")[0] == b"403 Forbidden"
    # On loopback only localhost and addresses; no Host at all (HTTP/1.0) is no browser's.
    for served in ("127.0.0.1", "[::1]", "localhost"):
        assert browser_problem("evil.example:9464", None, served)[0] == b"421 Misdirected Request", served
        assert browser_problem("localhost:9464", None, served) is None
        assert browser_problem("127.0.0.1", "none", served) is None
        assert browser_problem(None, None, served) is None
    status, reason = browser_problem("evil.example", None, "127.0.0.1")
    assert "evil.example" in reason and "metrics_hosts" in reason  # what to do if that name is a scraper's
    # With metrics_hosts, on any address: those names, addresses, localhost and the bound host; nothing else.
    configured = ["scrape-name:9464", "prom-target"]
    for served in ("0.0.0.0", "10.0.0.5", "broker-1.internal", "127.0.0.1"):
        for host in ("scrape-name:9464", "prom-target", "prom-target:80", "10.0.0.5:9464", "localhost:9464"):
            assert browser_problem(host, None, served, configured) is None, (host, served)
        for host in ("evil.example:9464", "scrape-name:9465", "prom-target.evil.example"):
            status, reason = browser_problem(host, None, served, configured)
            assert status == b"421 Misdirected Request" and "metrics_hosts" in reason, (host, served)
        assert browser_problem("prom-target", "same-origin", served, configured)[0] == b"403 Forbidden"
        assert browser_problem(None, None, served, configured) is None
    assert browser_problem("broker-1.internal:1", None, "broker-1.internal", configured) is None  # its own host
    long_name = "x" * 10_000
    status, reason = browser_problem(long_name, None, "127.0.0.1")
    assert len(reason) < 400 and "…" in reason
