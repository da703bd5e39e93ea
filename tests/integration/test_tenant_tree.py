"""Tenants inside tenants and per-tenant ceilings, end to end.

Against both backends (the embedded Scheduler and a real broker process with
a worker over tcp): the 50 / 25 / 25 example of docs/scheduling.md, and a
ceiling of 2 with a slow handler. Against the real broker: a token pinned to
a tenant covers its subtree, and nothing outside it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import pytest

import cronoq
from tests.support import until

EXAMPLE_WEIGHTS = {"acme": 3, "globex": 1, "acme/search": 2, "acme/ads": 1}


def recording_pool(name: str, **settings) -> cronoq.Pool:
    """A pool whose handler returns [dispatch position, payload]."""
    order = itertools.count()

    async def record(payload):
        return [next(order), payload]

    return cronoq.Pool(name, record, **settings)


async def test_acme_3_globex_1_search_2_ads_1_share_50_25_25(backend):
    async with backend.open([recording_pool("llm", tenant_weights=EXAMPLE_WEIGHTS)]) as sched:
        await sched.pause("llm")
        handles = []
        for tenant, n in (("globex", 20), ("acme/ads", 20), ("acme/search", 40)):
            handles += [await sched.submit(tenant, pool="llm", tenant=tenant) for _ in range(n)]
        await sched.resume("llm")
        results = [await handle.result(timeout=30) for handle in handles]
        info = await sched.status(handles[-1].id)
    assert info.tenant == "acme/search"
    order = [tenant for _, tenant in sorted(results)]
    for k in range(0, 80, 4):
        # A saturated pool: every four dispatches, two for search, one for ads, one for globex.
        assert Counter(order[k : k + 4]) == {"acme/search": 2, "acme/ads": 1, "globex": 1}, (k, order)


async def test_a_ceiling_of_2_with_a_slow_handler_holds_and_blocks_nobody(backend):
    running: Counter = Counter()  # by top-level tenant: acme counts acme/search's tasks too
    most: Counter = Counter()
    finished: list[str] = []

    async def slow(tenant):
        top = tenant.split("/")[0]
        running[top] += 1
        most[top] = max(most[top], running[top])
        await asyncio.sleep(0.3)
        running[top] -= 1
        finished.append(top)
        return tenant

    pool = cronoq.Pool("llm", slow, tenant_limits={"acme": 2}, fair_share=True)
    async with backend.open([pool], concurrency=4) as sched:
        await sched.pause("llm")
        acme = [await sched.submit(t, pool="llm", tenant=t) for t in ["acme", "acme/search"] * 4]
        globex = [await sched.submit("globex", pool="llm", tenant="globex") for _ in range(4)]
        await sched.resume("llm")
        for handle in globex:
            await handle.result(timeout=30)
        # globex never waited behind acme's capped tasks: it was done while acme still had work left.
        assert finished.count("acme") < len(acme)
        for handle in acme:
            await handle.result(timeout=60)
    # With 4 slots, acme's subtree (acme and acme/search together) ran 2 at a time, never more.
    assert most["acme"] == 2
    assert most["globex"] >= 2


# -- pinned tokens cover their subtree ---------------------------------------------

TOKENS = {"T_ACME": "acme-secret", "T_SEARCH": "search-secret", "T_WORKER": "worker-secret"}
CONFIG = """
[[pools]]
name = "default"
[pools.tenant_weights]
acme = 3
"acme/search" = 2

[[auth.tokens]]
token_env = "T_ACME"
role = "client"
tenant = "acme"

[[auth.tokens]]
token_env = "T_SEARCH"
role = "client"
tenant = "acme/search"

[[auth.tokens]]
token_env = "T_WORKER"
role = "worker"
"""


async def test_a_token_pinned_to_acme_submits_for_acme_search_and_sees_its_subtree(broker_factory):
    broker = broker_factory(CONFIG, env=TOKENS)

    async def echo(payload):
        return payload

    worker = cronoq.Worker(broker.workers, [cronoq.Pool("default", echo)], token=TOKENS["T_WORKER"])
    runner = asyncio.get_running_loop().create_task(worker.run())
    try:
        async with cronoq.connect(broker.clients, token=TOKENS["T_ACME"]) as acme, cronoq.connect(
            broker.clients, token=TOKENS["T_SEARCH"]
        ) as search:
            for_search = await acme.submit("s", tenant="acme/search")
            deep = await acme.submit("d", tenant="acme/search/alice")
            own = await acme.submit("a")  # the tenant is filled in: acme
            assert (await acme.status(for_search.id)).tenant == "acme/search"
            assert (await acme.status(own.id)).tenant == "acme"
            assert await for_search.result(timeout=30) == "s"
            assert await deep.result(timeout=30) == "d"
            # acme/search's token sees its subtree, acme/search/alice included...
            assert await search.result(deep.id, timeout=30) == "d"
            mine = await search.submit("m")
            assert (await search.status(mine.id)).tenant == "acme/search"
            assert (await acme.status(mine.id)).tenant == "acme/search"  # ...and acme sees all of it
            later = await search.submit("later", delay=600)
            assert await acme.cancel(later.id)  # acme may cancel its sub-tenants' tasks
            assert (await search.status(later.id)).state == "cancelled"
            # ...but nothing above or beside it: acme's own task does not exist for it.
            with pytest.raises(cronoq.NotFound):
                await search.status(own.id)
            with pytest.raises(cronoq.NotFound):
                await search.cancel(own.id)
            for outside in ("acme", "acme/ads", "acme/searchers", "globex"):
                with pytest.raises(cronoq.PermissionDenied, match="pinned to tenant 'acme/search'"):
                    await search.submit("x", tenant=outside)
            for outside in ("acmex", "globex", "globex/acme"):
                with pytest.raises(cronoq.PermissionDenied, match="sub-tenants"):
                    await acme.submit("x", tenant=outside)
            with pytest.raises(cronoq.InvalidArgument, match="empty segment"):
                await acme.submit("x", tenant="acme//search")
            await until(_done(acme, own.id), "acme's own task ran")
    finally:
        await worker.stop()
        await runner


def _done(client, task_id: str):
    async def check() -> bool:
        return (await client.status(task_id)).state == "succeeded"

    return check


async def test_a_pinned_token_cannot_pass_max_tenant_backlog_by_spreading_over_sub_tenants(broker_factory):
    config = CONFIG.replace('name = "default"\n', 'name = "default"\nmax_tenant_backlog = 5\n', 1)
    broker = broker_factory(config + '\n[[auth.tokens]]\ntoken_env = "T_GLOBEX"\nrole = "client"\n'
                            'tenant = "globex"\n', env={**TOKENS, "T_GLOBEX": "globex-secret"})
    async with cronoq.connect(broker.clients, token=TOKENS["T_ACME"]) as acme, cronoq.connect(
        broker.clients, token="globex-secret"
    ) as globex:
        spread = [await acme.submit(n, tenant=f"acme/team{n}", delay=600) for n in range(5)]
        for tenant in ("acme/team9", "acme", "acme/team0/alice"):
            with pytest.raises(cronoq.ResourceExhausted, match="tenant 'acme' .*max_tenant_backlog"):
                await acme.submit("one too many", tenant=tenant, delay=600)
        assert (await globex.submit("others still can", delay=600)).id  # its own tree, its own count
        assert await acme.cancel(spread[0].id)  # a waiting task leaves: room for one more
        await acme.submit("room again", tenant="acme/team7", delay=600)


async def test_a_worker_whose_ceilings_disagree_with_the_broker_s_is_refused(broker_factory):
    broker = broker_factory('[[pools]]\nname = "llm"\n[pools.tenant_limits]\n"acme/search" = 5\n')

    async def echo(payload):
        return payload

    agreeing = cronoq.Worker(broker.workers, cronoq.Pool("llm", echo, tenant_limits={"acme/search": 5}))
    runner = asyncio.get_running_loop().create_task(agreeing.run())
    try:
        async with cronoq.connect(broker.clients) as client:
            handle = await client.submit("ok", pool="llm", tenant="acme/search/alice")
            assert await handle.result(timeout=30) == "ok"
        conflicting = cronoq.Worker(broker.workers, cronoq.Pool("llm", echo, tenant_limits={"acme/search": 6}))
        with pytest.raises(cronoq.FailedPrecondition, match="tenant_limits"):
            await asyncio.wait_for(conflicting.run(), 10)
    finally:
        await agreeing.stop()
        await runner


async def test_tenant_paths_of_more_than_8_levels_or_with_an_empty_level_are_refused(backend):
    async with backend.open([recording_pool("llm", fair_share=True)]) as sched:
        eight = "/".join("abcdefgh")
        assert (await (await sched.submit("deep", pool="llm", tenant=eight)).result(timeout=30))[1] == "deep"
        for bad, words in (("/".join("abcdefghi"), "9 levels"), ("acme//x", "empty segment"),
                           ("acme/", "empty segment"), ("/acme", "empty segment")):
            with pytest.raises(cronoq.InvalidArgument, match=words):
                await sched.submit("x", pool="llm", tenant=bad)
