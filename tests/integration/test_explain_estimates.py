"""`explain`'s estimate end to end, against both backends: a task starved by work that keeps arriving ahead of it
is told its start cannot be told; a task in an ordinary backlog still gets a figure."""

from __future__ import annotations

import asyncio

import cronoq
from tests.support import until


async def _served(payload):
    await asyncio.sleep(0.005)
    return payload


async def test_a_low_task_starved_by_normal_work_is_told_its_start_cannot_be_told(backend):
    async with backend.open([cronoq.Pool("llm", _served, fair_share=True)], concurrency=1) as sched:
        # Room for the feeder to fall behind: on a loaded machine it can be several ends late, and with a short
        # backlog the normal class then ran dry and low started (seen beside four engineers' builds).
        backlog = [await sched.submit(i, pool="llm", tenant="acme") for i in range(20)]
        low = await sched.submit("low", pool="llm", tenant="globex", priority="low")
        fed = asyncio.Event()

        async def feed() -> None:
            # One more normal task each time one ends, and every fourth time two: normal work arrives a quarter
            # faster than the slot serves it. Not exactly as fast: the rates are counts over a few seconds, and
            # on a loaded machine this feeder, one await behind each end, falls that few percent behind.
            n, ended = len(backlog), 0
            while not fed.is_set():
                await backlog.pop(0).result(timeout=30)
                ended += 1
                for _ in range(2 if ended % 4 == 0 else 1):
                    backlog.append(await sched.submit(n, pool="llm", tenant="acme"))
                    n += 1

        feeder = asyncio.get_running_loop().create_task(feed())
        try:
            await asyncio.sleep(3.0)  # a few of the rates' samples (one a second)
            for _ in range(3):
                why = await sched.explain(low.id)
                assert why.state == "queued"
                assert why.waiting.estimate is None, why.waiting.estimate_note
                assert why.waiting.estimate_note.startswith("cannot tell: higher-class work arrives at ")
                assert "as fast as the pool serves" in why.waiting.estimate_note
                await asyncio.sleep(0.5)
        finally:
            fed.set()
            await feeder
        assert await low.result(timeout=30) == "low"  # once the normal work stops coming, it runs


async def test_a_task_in_an_ordinary_backlog_gets_a_figure(backend):
    async def slowish(payload):
        await asyncio.sleep(0.05)
        return payload

    async with backend.open([cronoq.Pool("llm", slowish, fair_share=True)], concurrency=1) as sched:
        handles = [await sched.submit(i, pool="llm", tenant="acme" if i % 2 else "globex") for i in range(40)]
        for handle in handles[:3]:
            await handle.result(timeout=30)

        async def rated() -> bool:
            return (await sched.explain(handles[-1].id)).waiting.dispatch_rate is not None

        await until(rated, "the pool has a dispatch rate")
        why = (await sched.explain(handles[-1].id)).waiting
        assert why.estimate is not None and why.estimate > 0, why.estimate_note
        assert why.arrival_rate_ahead == 0.0 and "cannot tell" not in why.estimate_note
