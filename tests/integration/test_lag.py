"""Lag on a real broker: issue #23's fair pool with a ceiling that binds, read as `cronoq status --json` does."""

from __future__ import annotations

import asyncio

import cronoq
from tests.support import start_worker_process, until

# Weights 3 : 1 : 1, initech under a ceiling of 1; the worker's 5 slots run tasks of equal length.
CAPPED_POOL = """
[[pools]]
name = "default"

[[pools]]
name = "slow"
[pools.tenant_weights]
acme = 3
globex = 1
initech = 1
[pools.tenant_limits]
initech = 1
"""
TENANTS = ("acme", "globex", "initech")
DISPATCHES = 600  # enough for the lag of before to climb past +20; the backlog keeps every tenant waiting


async def test_lag_stays_in_its_bound_on_a_fair_pool_whose_ceiling_binds(broker_factory, tmp_path):
    broker = broker_factory(CAPPED_POOL)
    async with cronoq.connect(broker.clients) as client:
        await asyncio.gather(*(client.submit(0.02, pool="slow", tenant=tenant)
                               for tenant in TENANTS for _ in range(DISPATCHES)))
        worker = start_worker_process(broker.workers, "tests.apps.echo:pools", tmp_path / "worker.log",
                                      concurrency=5)
        seen: list[dict[str, float]] = []
        try:
            async def far_enough() -> bool:
                pool = (await client.stats())["pools"]["slow"]
                tenants = pool["tenants"]
                assert all(tenants[t]["queued"] > 0 for t in TENANTS), "a tenant ran out of work: not a steady state"
                lags = {t: tenants[t]["lag"] for t in TENANTS}
                seen.append(lags)
                # Every tenant is backlogged in one class: each lag lies in [-1, 0] (docs/scheduling.md, "Lag").
                assert all(-1.0 - 1e-9 <= lag <= 1e-9 for lag in lags.values()), (len(seen), lags)
                return pool["dispatched"] >= DISPATCHES

            await until(far_enough, f"{DISPATCHES} tasks were dispatched", timeout=120)
        finally:
            worker.terminate()
            worker.wait(10)
        stats = (await client.stats())["pools"]["slow"]["tenants"]
    got = {t: stats[t]["dispatched"] for t in TENANTS}
    total = sum(got.values())
    # The shares themselves were always right; within a few dispatches of 3 : 1 : 1.
    assert abs(got["acme"] - 0.6 * total) <= 8 and abs(got["initech"] - 0.2 * total) <= 8, got
    assert len(seen) >= 2
