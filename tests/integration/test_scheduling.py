"""The scheduling rules (docs/api.md), end to end, against both backends.

Each test queues a known backlog while its pool is paused, resumes it, and
reads the dispatch order back from the handler (a counter), with one slot so
that run order is dispatch order.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import pytest

import cronoq


def recording_pool(name: str, **settings) -> cronoq.Pool:
    """A pool whose handler returns [dispatch position, payload]."""
    order = itertools.count()

    async def record(payload):
        return [next(order), payload]

    return cronoq.Pool(name, record, **settings)


async def run_paused(sched, submissions, pool: str) -> list:
    """Submit (payload, kwargs) pairs while `pool` is paused; return payloads in dispatch order."""
    await sched.pause(pool)
    handles = [await sched.submit(payload, pool=pool, **kwargs) for payload, kwargs in submissions]
    await sched.resume(pool)
    results = [await handle.result(timeout=30) for handle in handles]
    return [payload for _, payload in sorted(results, key=lambda r: r[0])]


def assert_sfq_bound(order: list, weights: dict) -> None:
    """Over every window of dispatches while both tenants stay backlogged, |W_i/w_i - W_j/w_j| <= 1/w_i + 1/w_j."""
    tenants = list(weights)
    totals = Counter(order)
    # Both tenants are backlogged until one of them has had its last dispatch.
    last = min(max(i for i, t in enumerate(order) if t == tenant) for tenant in tenants)
    busy = order[: last + 1]
    a, b = tenants
    bound = 1 / weights[a] + 1 / weights[b]
    for start in range(len(busy)):
        counts = Counter()
        for tenant in busy[start:]:
            counts[tenant] += 1
            gap = abs(counts[a] / weights[a] - counts[b] / weights[b])
            assert gap <= bound + 1e-9, f"window from {start}: {dict(counts)} breaks the SFQ bound {bound}"
    assert sum(totals.values()) == len(order)


async def test_weights_3_to_1_with_globex_queued_first(backend):
    async with backend.open([recording_pool("llm", tenant_weights={"acme": 3, "globex": 1})]) as sched:
        submissions = [("globex", {"tenant": "globex"})] * 20 + [("acme", {"tenant": "acme"})] * 60
        order = await run_paused(sched, submissions, "llm")
    assert Counter(order) == {"acme": 60, "globex": 20}
    # acme gets three dispatches for every one of globex's, although globex queued first; tags are
    # exact, so each tie (globex's next tag equal to acme's) goes to the earlier arrival, globex.
    assert order[:40] == ["globex", "acme", "acme", "acme"] * 10
    assert_sfq_bound(order, {"acme": 3, "globex": 1})


async def test_priority_goes_before_fairness(backend):
    async with backend.open([recording_pool("llm", tenant_weights={"acme": 3, "globex": 1})]) as sched:
        submissions = (
            [(("acme", "low"), {"tenant": "acme", "priority": "low"})] * 5
            + [(("acme", "normal"), {"tenant": "acme"})] * 5
            + [(("globex", "critical"), {"tenant": "globex", "priority": "critical"})] * 5
            + [(("globex", "high"), {"tenant": "globex", "priority": "high"})] * 5
        )
        order = await run_paused(sched, submissions, "llm")
    classes = [priority for _, priority in order]
    assert classes == ["critical"] * 5 + ["high"] * 5 + ["normal"] * 5 + ["low"] * 5


async def test_deadline_tasks_go_first_in_edf_order(backend):
    async with backend.open([recording_pool("llm", fair_share=True)]) as sched:
        submissions = [("plain-1", {"tenant": "acme"}), ("plain-2", {"tenant": "globex"})] + [
            (f"due-{d}", {"tenant": "acme", "deadline": d}) for d in (300, 100, 200)
        ]
        order = await run_paused(sched, submissions, "llm")
    assert order[:3] == ["due-100", "due-200", "due-300"]
    assert sorted(order[3:]) == ["plain-1", "plain-2"]


async def test_a_task_past_its_deadline_expires_and_never_runs(backend):
    async with backend.open([recording_pool("llm")]) as sched:
        await sched.pause("llm")
        handle = await sched.submit("late", pool="llm", deadline=0.3)
        with pytest.raises(cronoq.DeadlineExceeded):
            await handle.result(timeout=10)
        info = await sched.status(handle.id)
        assert info.state == "expired" and info.attempts == 0
        await sched.resume("llm")
        follow = await sched.submit("next", pool="llm")
        assert (await follow.result(timeout=10))[1] == "next"


async def test_an_idle_tenant_banks_no_credit(backend):
    async with backend.open([recording_pool("llm", fair_share=True)]) as sched:
        await sched.pause("llm")
        early = [await sched.submit("acme", pool="llm", tenant="acme") for _ in range(30)]
        await sched.resume("llm")
        for handle in early[:10]:
            await handle.result(timeout=30)
        await sched.pause("llm")
        late = [await sched.submit("globex", pool="llm", tenant="globex") for _ in range(10)]
        await sched.resume("llm")
        results = [await h.result(timeout=30) for h in early + late]
    order = [payload for _, payload in sorted(results, key=lambda r: r[0])]
    first_globex = order.index("globex")
    lead = 0
    for tenant in order[first_globex:]:
        lead += 1 if tenant == "globex" else -1
        # globex waited while acme ran, but it may never get ahead by more than one dispatch.
        assert lead <= 1, order
    assert order[first_globex: first_globex + 20].count("globex") == 10


async def test_untenanted_tasks_share_as_one_tenant(backend):
    async with backend.open([recording_pool("batch", fair_share=True)]) as sched:
        submissions = [(None, {})] * 10 + [("acme", {"tenant": "acme"})] * 10
        order = await run_paused(sched, submissions, "batch")
    assert_sfq_bound(order, {None: 1, "acme": 1})
    assert Counter(order[:10]) == {None: 5, "acme": 5}


async def test_a_lone_tenant_gets_every_dispatch_in_order(backend):
    async with backend.open([recording_pool("llm", tenant_weights={"acme": 3, "globex": 1})]) as sched:
        submissions = [(f"g{i}", {"tenant": "globex"}) for i in range(12)]
        order = await run_paused(sched, submissions, "llm")
    assert order == [f"g{i}" for i in range(12)]


async def test_an_unfair_pool_runs_in_submission_order(backend):
    async with backend.open([recording_pool("plain")]) as sched:
        submissions = [(i, {"tenant": "acme" if i < 8 else "globex"}) for i in range(12)]
        order = await run_paused(sched, submissions, "plain")
    assert order == list(range(12))


async def test_max_in_flight_caps_concurrent_tasks(backend):
    running = 0
    peak = 0

    async def slow(payload):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1
        return payload

    async with backend.open([cronoq.Pool("capped", slow, max_in_flight=2)], concurrency=5) as sched:
        handles = [await sched.submit(i, pool="capped") for i in range(20)]
        assert [await h.result(timeout=30) for h in handles] == list(range(20))
    assert peak == 2
