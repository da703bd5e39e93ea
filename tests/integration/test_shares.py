"""share_by, tenant rates and minimums, end to end against both backends (the embedded Scheduler and a real
broker process with a real worker over tcp): what a user of `submit(cost=...)`, `tenant_rates` and
`tenant_minimums` can observe from the handlers' side."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter

import pytest

import cronoq
from cronoq.answers import explain_text
from tests.support import until


def recording_pool(name: str, *, sleep: float = 0.0, **settings) -> cronoq.Pool:
    """A pool whose handler returns [dispatch position, start time, payload] (and sleeps `sleep` seconds)."""
    order = itertools.count()

    async def record(payload):
        position, started = next(order), time.monotonic()
        if sleep:
            await asyncio.sleep(sleep)
        return [position, started, payload]

    return cronoq.Pool(name, record, **settings)


async def run_paused(sched, submissions, pool: str) -> list:
    """Submit (payload, kwargs) pairs while `pool` is paused; return [position, start, payload] in start order."""
    await sched.pause(pool)
    handles = [await sched.submit(payload, pool=pool, **kwargs) for payload, kwargs in submissions]
    await sched.resume(pool)
    results = [await handle.result(timeout=60) for handle in handles]
    return sorted(results, key=lambda r: r[0])


async def test_a_pool_that_shares_by_cost_gives_equal_summed_cost_not_equal_dispatches(backend):
    # 1 : 1, tasks of cost 20 against tasks of cost 0.2: while both are backlogged, their summed costs stay
    # within the SFQ bound (one task of each), though one tenant gets a hundred times the other's dispatches.
    costs = {"big": 20.0, "small": 0.2}
    async with backend.open([recording_pool("llm", share_by="cost", fair_share=True)]) as sched:
        submissions = [("big", {"tenant": "big", "cost": costs["big"]})] * 4 + \
                      [("small", {"tenant": "small", "cost": costs["small"]})] * 400
        order = [payload for _, _, payload in await run_paused(sched, submissions, "llm")]
    assert Counter(order) == {"big": 4, "small": 400}
    last_big = max(i for i, t in enumerate(order) if t == "big")
    summed = Counter()
    for tenant in order[:last_big + 1]:  # both backlogged until big's last dispatch
        summed[tenant] += costs[tenant]
        assert abs(summed["big"] - summed["small"]) <= costs["big"] + costs["small"] + 1e-6, dict(summed)
    # Shared by dispatches, big's four would all have gone in the first eight; by cost they are spread out.
    assert order.index("big") < 2 and last_big > 300


async def test_a_pool_that_shares_by_runtime_gives_equal_worker_time_to_slow_and_fast_tasks(backend):
    # 1 : 1, one slot, tasks of 0.2 s against tasks of 0.04 s: the scheduler's clock measures each run (dispatch to
    # outcome) and charges it, so while both are backlogged the worker time it measured stays within about a
    # second plus one run (the first runs are charged the 1 s default estimate before averages exist). Shared by
    # dispatches, slow's 15 would all start among the first 30, with 5 times fast's time by slow's last start.
    # The times summed are the ones the scheduler measured (TaskInfo's started_at..finished_at), not the sleeps
    # asked for: on a loaded machine every run takes longer than its sleep, and the short ones proportionally more.
    runs = {"slow": 0.2, "fast": 0.04}

    async def sleep_for(payload):
        await asyncio.sleep(runs[payload])
        return payload

    pool = cronoq.Pool("gpu", sleep_for, share_by="runtime", fair_share=True)
    async with backend.open([pool]) as sched:
        await sched.pause("gpu")
        handles = [await sched.submit("slow", pool="gpu", tenant="slow") for _ in range(15)]
        handles += [await sched.submit("fast", pool="gpu", tenant="fast") for _ in range(75)]
        await sched.resume("gpu")
        for h in handles:
            await h.result(timeout=60)
        runs_seen = sorted([await sched.status(h.id) for h in handles], key=lambda info: info.started_at)
    order_of = [info.tenant for info in runs_seen]
    last_slow = max(i for i, t in enumerate(order_of) if t == "slow")
    longest = max(info.finished_at - info.started_at for info in runs_seen)
    time_of = Counter()
    for info in runs_seen[:last_slow + 1]:
        time_of[info.tenant] += info.finished_at - info.started_at
        assert abs(time_of["slow"] - time_of["fast"]) <= 1.0 + longest + 1e-9, dict(time_of)
    assert last_slow > 60  # slow's runs are spread over the window, not bunched at the front


async def test_cost_is_checked_on_submit(backend):
    async with backend.open([recording_pool("llm", share_by="cost", fair_share=True)]) as sched:
        for bad in (0, -1, float("nan"), float("inf"), "3", True, 2e9):
            with pytest.raises(cronoq.InvalidArgument, match="cost must be"):
                await sched.submit("x", pool="llm", cost=bad)
        handle = await sched.submit("x", pool="llm", cost=3)
        assert (await handle.result(timeout=30))[2] == "x"


async def test_status_tells_the_cost_a_task_was_submitted_with(backend):
    # TaskInfo.cost: the cost given, also once the task has finished; None for a task given none.
    async with backend.open([recording_pool("llm", share_by="cost", fair_share=True)]) as sched:
        costly = await sched.submit("x", pool="llm", tenant="acme", cost=2.5)
        plain = await sched.submit("y", pool="llm", tenant="acme")
        await costly.result(timeout=30)
        await plain.result(timeout=30)
        assert (await sched.status(costly.id)).cost == 2.5
        assert (await sched.status(plain.id)).cost is None
        assert (await sched.explain(costly.id)).cost == 2.5


async def test_a_rate_limited_tenant_starts_at_its_rate_and_holds_no_one_back(backend):
    # acme at 5/s: a bucket of 5, then one every 0.2 s. Its 25 tasks need at least (25 - 5) / 5 = 4 s; globex,
    # unlimited, is not made to wait for acme's tokens.
    pool = recording_pool("llm", sleep=0.01, fair_share=True, tenant_rates={"acme": 5})
    async with backend.open([pool], concurrency=4) as sched:
        submissions = [("acme", {"tenant": "acme"})] * 25 + [("globex", {"tenant": "globex"})] * 40
        runs = await run_paused(sched, submissions, "llm")
    acme = [start for _, start, tenant in runs if tenant == "acme"]
    globex = [start for _, start, tenant in runs if tenant == "globex"]
    assert acme[-1] - acme[0] >= 4 * 0.9, "acme started faster than its rate allows"
    for first in acme:  # in any 3 s, at most the bucket and 3 s of refills (and a token's slack)
        assert sum(1 for t in acme if first <= t < first + 3) <= 5 + 3 * 5 + 1
    assert globex[-1] < acme[-1] - 1.0, "globex waited for acme's tokens"


async def test_a_tenant_under_its_minimum_goes_ahead_of_a_heavier_tenant(backend):
    # heavy weighs 10 to light's 1, and queued first; light is guaranteed 2 running while it has work queued.
    pool = recording_pool("llm", sleep=0.05, tenant_weights={"heavy": 10, "light": 1},
                          tenant_minimums={"light": 2})
    async with backend.open([pool], concurrency=4) as sched:
        submissions = [("heavy", {"tenant": "heavy"})] * 40 + [("light", {"tenant": "light"})] * 12
        order = [tenant for _, _, tenant in await run_paused(sched, submissions, "llm")]
    assert Counter(order[:4]) == {"light": 2, "heavy": 2}  # by weight alone light would have none of 4
    assert order[:20].count("light") >= 6  # 2 of 4 slots, not 1 in 11 dispatches


async def test_explain_says_when_a_rate_limited_tenant_starts_next(backend):
    pool = recording_pool("llm", fair_share=True, tenant_rates={"acme": 0.05})  # one start every 20 s
    async with backend.open([pool]) as sched:
        first = await sched.submit("a", pool="llm", tenant="acme")
        await first.result(timeout=30)
        second = await sched.submit("b", pool="llm", tenant="acme")
        other = await sched.submit("c", pool="llm", tenant="globex")
        assert (await other.result(timeout=30))[2] == "c"  # not held back by acme's empty bucket
        text = explain_text(await sched.explain(second.id))
        assert "rate-limited: next start in" in text, text
        assert "acme is rate-limited (0.05/s)" in text, text
        assert await sched.cancel(second.id)


def _rewrite(broker, body: str) -> None:
    text = broker.config_path.read_text()
    broker.config_path.write_text(text[: text.index("[[pools]]")] + body)


async def test_a_reload_refuses_minimums_that_cannot_fit_and_keeps_the_running_config(broker_factory):
    slow = '[[pools]]\nname = "llm"\nfair_share = true\n[pools.tenant_rates]\nacme = 0.05\n'
    broker = broker_factory(slow)
    async with cronoq.connect(broker.clients) as client:
        bad = slow.replace("fair_share = true", "fair_share = true\nmax_in_flight = 2") + \
            "[pools.tenant_minimums]\nacme = 2\nglobex = 1\n"
        _rewrite(broker, bad)
        with pytest.raises(cronoq.FailedPrecondition, match="tenant_minimums") as refused:
            await client.reload()
        assert "guarantee 3" in str(refused.value) and "max_in_flight is 2" in str(refused.value)
        assert (await client.stats())["pools"]["llm"]["rates"]["acme"]["rate"] == 0.05  # the old config stays
        _rewrite(broker, slow.replace("fair_share = true", 'share_by = "cost"') + "[pools.tenant_minimums]\nacme = 1\n")
        changes = await client.reload()
        assert changes["shares_changed"] == [
            {"pool": "llm", "setting": "share_by", "old": "dispatches", "new": "cost"},
            {"pool": "llm", "setting": "tenant_minimums", "old": {}, "new": {"acme": 1}}]
        pool = (await client.stats())["pools"]["llm"]
        assert pool["share_by"] == "cost" and pool["minimums"]["acme"]["minimum"] == 1


async def test_a_reload_that_raises_a_rate_lets_a_live_backlog_go(broker_factory):
    slow = '[[pools]]\nname = "llm"\nfair_share = true\n[pools.tenant_rates]\nacme = 0.05\n'  # one per 20 s
    broker = broker_factory(slow)
    worker = cronoq.Worker(broker.workers, [recording_pool("llm")], concurrency=2, heartbeat_interval=0.2)
    runner = asyncio.get_running_loop().create_task(worker.run())
    try:
        async with cronoq.connect(broker.clients) as client:
            handles = [await client.submit(i, pool="llm", tenant="acme") for i in range(4)]
            await handles[0].result(timeout=30)
            pool = (await client.stats())["pools"]["llm"]
            assert pool["rates"]["acme"]["limited"] and pool["queued"] == 3
            _rewrite(broker, slow.replace("acme = 0.05", "acme = 100"))
            await client.reload()
            # At 0.05/s the three left would take a minute; at 100/s they go at once.
            assert sorted([(await h.result(timeout=15))[2] for h in handles[1:]]) == [1, 2, 3]
    finally:
        await worker.stop()
        await runner


async def test_explain_marks_a_tenant_under_its_minimum_and_speaks_in_the_pool_s_unit(backend):
    release = asyncio.Event()

    async def hold(payload):
        if payload == "hold":
            await release.wait()
        return payload

    pool = cronoq.Pool("gpu", hold, share_by="cost", fair_share=True, tenant_minimums={"light": 1})
    async with backend.open([pool]) as sched:
        held = await sched.submit("hold", pool="gpu", tenant="heavy", cost=5)

        async def running() -> bool:
            return (await sched.status(held.id)).state == "running"

        await until(running, "the heavy task holds the only slot")
        waiting = await sched.submit("x", pool="gpu", tenant="light", cost=2)
        text = explain_text(await sched.explain(waiting.id))
        assert "minimum 1, under its minimum: goes first" in text, text
        assert " cost" in text.split("lag", 1)[1].splitlines()[0], text  # lag in cost units
        release.set()
        assert await waiting.result(timeout=30) == "x"
        assert await held.result(timeout=30) == "hold"


async def test_explain_tells_a_task_s_cost_and_what_a_running_one_is_charged_so_far(backend):
    release = asyncio.Event()

    async def hold(payload):
        await release.wait()
        return payload

    pool = cronoq.Pool("gpu", hold, share_by="runtime", fair_share=True)
    async with backend.open([pool]) as sched:
        held = await sched.submit("hold", pool="gpu", tenant="acme", cost=30)  # an estimate of 30 s

        async def running() -> bool:
            return (await sched.status(held.id)).state == "running"

        await until(running, "the task runs")
        explained = await sched.explain(held.id)
        assert (explained.cost, explained.charged) == (30.0, 30.0)
        assert "cost 30, charged 30.0 s of worker time so far" in explain_text(explained)
        release.set()
        assert await held.result(timeout=30) == "hold"
        assert (await sched.explain(held.id)).charged is None  # ended: its run is charged what it took
