"""A worker's own bookkeeping of its tasks: what it counts as running, and how it runs a pool's handler."""

from __future__ import annotations

import asyncio

import cronoq
from tests.support import BEATS, until

WAIT = 30.0


async def test_running_counts_the_tasks_still_running_and_none_once_they_end(broker_factory):
    broker = broker_factory('[[pools]]\nname = "default"\n')
    release = asyncio.Event()

    async def handler(payload):
        if payload == "hold":
            await release.wait()
        return payload

    worker = cronoq.Worker(broker.workers, cronoq.Pool("default", handler), concurrency=4, **BEATS)

    def running(n: int):
        async def check() -> bool:
            return worker.running == n
        return check

    serving = asyncio.get_running_loop().create_task(worker.run())
    try:
        async with cronoq.connect(broker.clients) as client:
            held = [await client.submit("hold") for _ in range(2)]
            quick = [await client.submit(i) for i in range(20)]  # through the two slots left, many messages
            assert [await handle.result(timeout=WAIT) for handle in quick] == list(range(20))
            await until(running(2), "only the two held tasks run")
            release.set()
            assert [await handle.result(timeout=WAIT) for handle in held] == ["hold", "hold"]
            await until(running(0), "no task runs")
            assert worker.finished == 22
    finally:
        await worker.stop()
        await serving


def test_a_pool_whose_handler_is_replaced_runs_the_new_one_as_its_kind_says():
    async def on_the_loop(payload):
        return payload

    def in_a_thread(payload):
        return payload

    pool = cronoq.Pool("default", on_the_loop)
    assert pool.is_async
    pool.run = in_a_thread
    assert not pool.is_async
    pool.run = on_the_loop
    assert pool.is_async
    pool.run = None
    assert not pool.is_async
